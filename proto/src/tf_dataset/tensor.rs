//! The tensors a source dataset takes as inputs, evaluated as TF's `GraphRunner` would — for the
//! three ops that can feed them in a dataset graph: `Const` (every tensor a TF 2.21 client sends
//! is one), `Identity`, and `MatchingFiles` (`list_files` built in graph mode, through the glob
//! callback). Anything else TF would simply run; coord cannot, so it refuses, naming the op.
//!
//! Also the one tensor this module makes: the int64 scalar every split is.

use bytes::Bytes;

use super::glob::Glob;
use super::graph::Graph;
use super::refusal::Refusal;
use crate::tensorflow::{DataType, NodeDef, TensorProto, TensorShapeProto};

/// An int64 scalar exactly as TF's dispatcher puts it on the wire
/// (`Tensor::AsProtoTensorContent`): dtype, an empty (rank-0) shape, 8 little-endian bytes.
pub(super) fn int64_scalar(value: i64) -> TensorProto {
    TensorProto {
        dtype: DataType::DtInt64 as i32,
        tensor_shape: Some(TensorShapeProto::default()),
        tensor_content: Bytes::copy_from_slice(&value.to_le_bytes()),
        ..Default::default()
    }
}

/// The value of a tensor input, as far as the walk needs it.
pub(super) enum Value<'g> {
    Const(&'g TensorProto),
    /// `MatchingFiles`' output: the matches of every pattern, sorted (matching_files_op.cc sorts
    /// the concatenation), duplicates kept.
    Files(Vec<String>),
}

impl Value<'_> {
    /// The tensor's dimensions.
    pub fn dims(&self) -> Result<Vec<i64>, String> {
        match self {
            Value::Const(t) => dims(t),
            Value::Files(files) => Ok(vec![i64::try_from(files.len()).unwrap_or(i64::MAX)]),
        }
    }

    /// The value of an int64 scalar.
    pub fn int64_scalar(&self) -> Result<i64, String> {
        let Value::Const(t) = self else {
            return Err("a string vector where an int64 scalar belongs".into());
        };
        if t.dtype != DataType::DtInt64 as i32 || !dims(t)?.is_empty() {
            return Err("not an int64 scalar".into());
        }
        if t.tensor_content.is_empty() {
            // TF repeats the last value to fill the shape, and zero-fills when there is none.
            return Ok(t.int64_val.last().copied().unwrap_or(0));
        }
        let bytes: [u8; 8] = t.tensor_content[..]
            .try_into()
            .map_err(|_| "an int64 scalar not 8 bytes long")?;
        Ok(i64::from_le_bytes(bytes))
    }

    /// The values of a string scalar or vector.
    fn strings(&self) -> Result<Vec<String>, String> {
        match self {
            Value::Files(files) => Ok(files.clone()),
            Value::Const(t) => strings(t),
        }
    }
}

fn dims(t: &TensorProto) -> Result<Vec<i64>, String> {
    let Some(shape) = &t.tensor_shape else {
        return Ok(Vec::new()); // no shape: a scalar
    };
    if shape.unknown_rank || shape.dim.iter().any(|d| d.size < 0) {
        return Err("a constant without a fully known shape".into());
    }
    Ok(shape.dim.iter().map(|d| d.size).collect())
}

/// The strings of a `DT_STRING` scalar or vector: `string_val`, or `tensor_content` in TF's
/// encoding (every length as a varint, then every string).
fn strings(t: &TensorProto) -> Result<Vec<String>, String> {
    let dims = dims(t)?;
    if t.dtype != DataType::DtString as i32 || dims.len() > 1 {
        return Err("not a string scalar or vector".into());
    }
    let n = usize::try_from(dims.first().copied().unwrap_or(1)).map_err(|e| e.to_string())?;
    let raw: Vec<Bytes> = if t.tensor_content.is_empty() {
        if t.string_val.len() > n {
            return Err("more strings than the shape holds".into());
        }
        let last = t.string_val.last().cloned().unwrap_or_default();
        (0..n)
            .map(|i| t.string_val.get(i).cloned().unwrap_or_else(|| last.clone()))
            .collect()
    } else {
        decode_string_content(&t.tensor_content, n)?
    };
    raw.into_iter()
        .map(|b| String::from_utf8(b.to_vec()).map_err(|_| "a string that is not UTF-8".into()))
        .collect()
}

fn decode_string_content(content: &Bytes, n: usize) -> Result<Vec<Bytes>, String> {
    let bad = || "a malformed string tensor".to_string();
    let mut pos = 0usize;
    let mut lengths = Vec::with_capacity(n.min(content.len()));
    for _ in 0..n {
        let mut len = 0u64;
        let mut shift = 0;
        loop {
            let byte = *content.get(pos).ok_or_else(bad)?;
            pos += 1;
            len |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 28 {
                return Err(bad());
            }
        }
        lengths.push(usize::try_from(len).map_err(|_| bad())?);
    }
    let mut out = Vec::with_capacity(lengths.len());
    for len in lengths {
        let end = pos
            .checked_add(len)
            .filter(|&e| e <= content.len())
            .ok_or_else(bad)?;
        out.push(content.slice(pos..end));
        pos = end;
    }
    Ok(out)
}

/// Evaluates the input spelled `spelled` of `consumer`.
pub(super) fn evaluate<'g>(
    graph: &Graph<'g>,
    consumer: &NodeDef,
    spelled: &str,
    glob: Glob<'_>,
) -> Result<Value<'g>, Refusal> {
    // Every node evaluated spends one: more than the graph has means a cycle.
    let mut budget = graph.node_count() + 1;
    evaluate_within(graph, consumer, spelled, glob, &mut budget)
}

fn evaluate_within<'g>(
    graph: &Graph<'g>,
    consumer: &NodeDef,
    spelled: &str,
    glob: Glob<'_>,
    budget: &mut usize,
) -> Result<Value<'g>, Refusal> {
    let mut node = graph.value_input(consumer, spelled)?;
    let mut asserts = Vec::new();
    while *budget > 0 {
        *budget -= 1;
        for control in graph.control_inputs(node)? {
            if control.op != "Assert" {
                return Err(Refusal::new(
                    &control.op,
                    &control.name,
                    "a control dependency of a tensor a source dataset reads; coord evaluates \
                     none but list_files' Assert",
                ));
            }
            asserts.push(control);
        }
        let value = match node.op.as_str() {
            "Identity" => {
                node = graph.first_input(node)?;
                continue;
            }
            "Const" => match node.attr.get("value").and_then(|a| a.value.as_ref()) {
                Some(crate::tensorflow::attr_value::Value::Tensor(t)) => Value::Const(t),
                _ => {
                    return Err(Refusal::new(
                        &node.op,
                        &node.name,
                        "a Const without a value",
                    ))
                }
            },
            "MatchingFiles" => Value::Files(matching_files(graph, node, glob, budget)?),
            _ => {
                return Err(Refusal::new(
                    &node.op,
                    &node.name,
                    "a source dataset reads this op's output: coord evaluates only Const, \
                     Identity and MatchingFiles (a TF 2.21 client sends every tensor a dataset \
                     holds as a Const)",
                ))
            }
        };
        return check_asserts(value, &asserts);
    }
    Err(Refusal::new(
        &node.op,
        &node.name,
        "the tensor inputs through this node form a cycle",
    ))
}

/// `list_files` guards `MatchingFiles` with `Assert(size > 0)`: the one assertion coord knows.
fn check_asserts<'g>(value: Value<'g>, asserts: &[&NodeDef]) -> Result<Value<'g>, Refusal> {
    let Some(assert) = asserts.first() else {
        return Ok(value);
    };
    match &value {
        Value::Files(files) if files.is_empty() => Err(Refusal::new(
            &assert.op,
            &assert.name,
            "no file matches the pattern: list_files' assertion fails (TF: \"No files matched \
             pattern\")",
        )),
        Value::Files(_) => Ok(value),
        Value::Const(_) => Err(Refusal::new(
            &assert.op,
            &assert.name,
            "coord evaluates an Assert only as list_files' check on MatchingFiles",
        )),
    }
}

/// `MatchingFiles(patterns)`: every pattern's matches, concatenated, then sorted.
fn matching_files(
    graph: &Graph<'_>,
    node: &NodeDef,
    glob: Glob<'_>,
    budget: &mut usize,
) -> Result<Vec<String>, Refusal> {
    let refuse = |reason: String| Refusal::new(&node.op, &node.name, reason);
    let Some(spelled) = node.input.iter().find(|s| !s.starts_with('^')) else {
        return Err(refuse("no pattern input".into()));
    };
    let patterns = evaluate_within(graph, node, spelled, glob, budget)?
        .strings()
        .map_err(&refuse)?;
    let mut files = Vec::new();
    for pattern in patterns {
        files.extend(glob(&pattern).map_err(|e| refuse(format!("pattern \"{pattern}\": {e}")))?);
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string_tensor(dims: &[i64], content: &[u8]) -> TensorProto {
        TensorProto {
            dtype: DataType::DtString as i32,
            tensor_shape: Some(TensorShapeProto {
                dim: dims
                    .iter()
                    .map(|&size| crate::tensorflow::tensor_shape_proto::Dim {
                        size,
                        name: String::new(),
                    })
                    .collect(),
                unknown_rank: false,
            }),
            tensor_content: Bytes::copy_from_slice(content),
            ..Default::default()
        }
    }

    #[test]
    fn string_content_decodes_lengths_then_bytes() {
        let t = string_tensor(&[2], b"\x02\x03abcde");
        assert_eq!(strings(&t).unwrap(), vec!["ab", "cde"]);
        assert!(strings(&string_tensor(&[2], b"\x02\x09abcde")).is_err());
        assert!(strings(&string_tensor(&[3], b"\x02\x03abcde")).is_err());
    }

    #[test]
    fn string_val_fills_the_shape_with_its_last_value() {
        let mut t = string_tensor(&[3], b"");
        t.string_val = vec![Bytes::from_static(b"x"), Bytes::from_static(b"y")];
        assert_eq!(strings(&t).unwrap(), vec!["x", "y", "y"]);
        t.tensor_shape = None;
        assert!(strings(&t).is_err(), "two strings do not fit a scalar");
    }

    #[test]
    fn int64_scalars_read_either_encoding() {
        assert_eq!(Value::Const(&int64_scalar(-7)).int64_scalar(), Ok(-7));
        let t = TensorProto {
            dtype: DataType::DtInt64 as i32,
            int64_val: vec![42],
            ..Default::default()
        };
        assert_eq!(Value::Const(&t).int64_scalar(), Ok(42));
        let t = TensorProto {
            dtype: DataType::DtInt32 as i32,
            int_val: vec![42],
            ..Default::default()
        };
        assert!(Value::Const(&t).int64_scalar().is_err());
    }
}
