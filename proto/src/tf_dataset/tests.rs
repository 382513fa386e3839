//! This module held up against TensorFlow 2.21's own answers: the DatasetDefs its client sent and
//! the splits its dispatcher handed out for them (`proto/tests/fixtures/tf_datasets/`, made by
//! `tests/tfdata/capture_split_fixtures.py`), then hand-built graphs TF never gets from a client.

use std::collections::HashMap;
use std::path::PathBuf;

use bytes::Bytes;
use prost::Message;
use serde_json::Value as Json;

use super::*;
use crate::tensorflow::attr_value;
use crate::tensorflow::{AttrValue, DataType, GraphDef, NodeDef, TensorProto, TensorShapeProto};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tf_datasets")
}

fn read_json(name: &str) -> Json {
    let text = std::fs::read_to_string(fixtures().join(name)).expect("fixture present");
    serde_json::from_str(&text).expect("fixture is JSON")
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect()
}

/// Pipelines TF 2.21 accepts and coord refuses on purpose, with the op coord names.
const DELIBERATE: &[(&str, &str)] = &[
    // TF's counter wraps around past int64 (signed overflow): negative "splits" forever.
    ("range_overflow", "RangeDataset"),
    // TF runs any op in the graph; coord evaluates only constants (what clients send).
    ("graph_slices_random", "RandomUniform"),
];

/// The op coord names where TF's message does not say "dataset of type X".
const REFUSED_OP: &[(&str, &str)] = &[
    ("range_snapshot", "SnapshotDatasetV2"),
    ("graph_list_files_no_match", "Assert"),
    ("graph_no_retval", "_Retval"),
];

#[test]
fn splits_are_tf_2_21s_answers() {
    let all = read_json("splits.json");
    assert!(all["tf_version"].as_str().unwrap().starts_with("2.21"));
    let scenarios = all["scenarios"].as_array().unwrap();
    assert!(scenarios.len() >= 50, "the fixture lost scenarios");
    let (mut served, mut refused) = (0, 0);
    for sc in scenarios {
        let name = sc["name"].as_str().unwrap();
        let bytes = std::fs::read(fixtures().join(sc["def"].as_str().unwrap())).unwrap();
        let def = DatasetDef::decode(bytes.as_slice()).unwrap();
        // MatchingFiles sees what TF's saw (recorded); nothing else touches a filesystem.
        let globs: HashMap<String, Vec<String>> =
            serde_json::from_value(sc.get("glob").cloned().unwrap_or(Json::Null))
                .unwrap_or_default();
        let glob = |p: &str| {
            globs
                .get(p)
                .cloned()
                .ok_or_else(|| format!("no recorded glob {p}"))
        };
        let ours = split_sources(&def, &glob);
        if let Some(&(_, op)) = DELIBERATE.iter().find(|(n, _)| *n == name) {
            let refusal = ours.expect_err(name);
            assert_eq!(refusal.op, op, "{name}: {refusal}");
            refused += 1;
            continue;
        }
        if let Some(tf_refusal) = sc.get("refused") {
            let message = tf_refusal["message"].as_str().unwrap();
            let refusal = ours.expect_err(name);
            let expected = match message.split_once("dataset of type ") {
                Some((_, rest)) => rest.split(',').next().unwrap().to_owned(),
                None => REFUSED_OP
                    .iter()
                    .find(|(n, _)| *n == name)
                    .expect(name)
                    .1
                    .to_owned(),
            };
            assert_eq!(
                refusal.op, expected,
                "{name}: ours: {refusal}; TF: {message}"
            );
            assert!(refusal.to_string().contains(&expected));
            refused += 1;
            continue;
        }
        let ours = ours.unwrap_or_else(|r| panic!("{name}: {r}"));
        let providers = sc["providers"].as_array().unwrap();
        assert_eq!(
            ours.len() as u64,
            sc["num_split_providers"].as_u64().unwrap(),
            "{name}"
        );
        assert_eq!(ours.len(), providers.len(), "{name}");
        for (index, (source, tf)) in ours.iter().zip(providers).enumerate() {
            let splits = tf["splits"].as_array().unwrap();
            for (i, hex) in splits.iter().enumerate() {
                let theirs = TensorProto::decode(unhex(hex.as_str().unwrap()).as_slice()).unwrap();
                assert_eq!(
                    source.split(i as u64),
                    Some(theirs),
                    "{name}[{index}] split {i}"
                );
                // The very bytes, not just an equal message.
                let ours = source.split(i as u64).unwrap().encode_to_vec();
                assert_eq!(
                    ours,
                    unhex(hex.as_str().unwrap()),
                    "{name}[{index}] split {i}"
                );
            }
            let read = splits.len() as u64;
            if tf["truncated"].as_bool().unwrap() {
                assert!(
                    source.count() > read,
                    "{name}[{index}]: TF had more than {read}"
                );
            } else {
                assert_eq!(source.count(), read, "{name}[{index}]");
                assert_eq!(source.split(read), None, "{name}[{index}]: past the end");
            }
        }
        served += 1;
    }
    assert!(
        served >= 40 && refused >= 8,
        "served {served}, refused {refused}"
    );
}

#[test]
fn local_glob_is_tf_matching_files() {
    let fixture = read_json("glob.json");
    let root = TempTree::new();
    for rel in fixture["tree"].as_array().unwrap() {
        let path = root.0.join(rel.as_str().unwrap());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"x").unwrap();
    }
    let prefix = format!("{}/", root.0.display());
    for case in fixture["cases"].as_array().unwrap() {
        let pattern = case["pattern"].as_str().unwrap();
        let got = local_matching_paths(&format!("{prefix}{pattern}")).unwrap();
        let got: Vec<&str> = got
            .iter()
            .map(|p| p.strip_prefix(&prefix).unwrap())
            .collect();
        let want: Vec<&str> = case["matches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap())
            .collect();
        assert_eq!(got, want, "pattern {pattern}");
    }
    assert_eq!(local_matching_paths(""), Ok(vec![]));
    assert!(local_matching_paths("gs://bucket/*").is_err());
}

/// A directory of its own under the system's temp dir, removed even when the test fails.
struct TempTree(PathBuf);

impl TempTree {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("coord-tf-glob-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempTree(dir)
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// --- Hand-built graphs: what a hostile or odd client could send. ---------------------------

fn node(name: &str, op: &str, inputs: &[&str]) -> NodeDef {
    NodeDef {
        name: name.into(),
        op: op.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn int64_const(name: &str, v: i64) -> NodeDef {
    let mut n = node(name, "Const", &[]);
    let value = AttrValue {
        value: Some(attr_value::Value::Tensor(tensor::int64_scalar(v))),
    };
    n.attr.insert("value".into(), value);
    n
}

fn def(nodes: Vec<NodeDef>) -> DatasetDef {
    DatasetDef {
        graph: Some(GraphDef {
            node: nodes,
            ..Default::default()
        }),
    }
}

fn range_graph(start: i64, stop: i64, step: i64, extra: Vec<NodeDef>, root: &str) -> DatasetDef {
    let mut nodes = vec![
        int64_const("a", start),
        int64_const("b", stop),
        int64_const("c", step),
        node("r", "RangeDataset", &["a", "b:0", "c", "^a"]),
    ];
    nodes.extend(extra);
    nodes.push(node("ret", "_Retval", &[root]));
    def(nodes)
}

fn no_glob(p: &str) -> Result<Vec<String>, String> {
    Err(format!("no filesystem here ({p})"))
}

#[test]
fn ranges_count_and_split_as_tf() {
    let r = SplitSource::Range {
        start: 10,
        stop: -5,
        step: -3,
    };
    assert_eq!(r.count(), 5);
    assert_eq!(r.split(4), Some(tensor::int64_scalar(-2)));
    assert_eq!(r.split(5), None);
    let r = SplitSource::Range {
        start: i64::MIN,
        stop: i64::MAX,
        step: 1,
    };
    assert_eq!(r.count(), u64::MAX);
    assert_eq!(
        r.split(u64::MAX - 1),
        Some(tensor::int64_scalar(i64::MAX - 1))
    );
    assert_eq!(
        SplitSource::Range {
            start: 5,
            stop: 0,
            step: 1
        }
        .count(),
        0
    );
    let sources = split_sources(&range_graph(0, 7, 3, vec![], "r"), &no_glob).unwrap();
    assert_eq!(
        sources,
        vec![SplitSource::Range {
            start: 0,
            stop: 7,
            step: 3
        }]
    );
    let refusal = split_sources(&range_graph(0, 7, 0, vec![], "r"), &no_glob).unwrap_err();
    assert_eq!(
        (refusal.op.as_str(), refusal.node.as_str()),
        ("RangeDataset", "r")
    );
    // Past the last value, TF's counter would wrap around: refused.
    let near_max = range_graph(i64::MAX - 3, i64::MAX, 2, vec![], "r");
    assert!(split_sources(&near_max, &no_glob).is_err());
    let to_max = range_graph(i64::MAX - 3, i64::MAX, 1, vec![], "r");
    assert_eq!(split_sources(&to_max, &no_glob).unwrap()[0].count(), 3);
}

#[test]
fn odd_graphs_are_refused_naming_the_op() {
    let cases = [
        // A cycle of unary datasets.
        (
            range_graph(
                0,
                3,
                1,
                vec![
                    node("m", "MapDataset", &["m2"]),
                    node("m2", "MapDataset", &["m"]),
                ],
                "m",
            ),
            "MapDataset",
        ),
        // A dataset input that is no node.
        (
            range_graph(0, 3, 1, vec![node("m", "MapDataset", &["nowhere"])], "m"),
            "MapDataset",
        ),
        // An op nobody listed.
        (
            range_graph(0, 3, 1, vec![node("x", "FancyNewDataset", &["r"])], "x"),
            "FancyNewDataset",
        ),
        // A second output of a dataset.
        (
            range_graph(0, 3, 1, vec![node("m", "MapDataset", &["r:1"])], "m"),
            "MapDataset",
        ),
        // A zip of a dataset and a constant.
        (
            range_graph(0, 3, 1, vec![node("z", "ZipDataset", &["r", "a"])], "z"),
            "Const",
        ),
        // Two nodes named alike.
        (
            range_graph(0, 3, 1, vec![int64_const("a", 1)], "r"),
            "Const",
        ),
    ];
    for (graph, op) in cases {
        let refusal = split_sources(&graph, &no_glob).unwrap_err();
        assert_eq!(refusal.op, op, "{refusal}");
        assert!(refusal.to_string().contains(op));
    }
    assert_eq!(
        split_sources(&DatasetDef::default(), &no_glob)
            .unwrap_err()
            .op,
        "_Retval"
    );
}

#[test]
fn zips_of_one_node_twice_get_two_providers() {
    // TF walks inputs, not nodes: zip(ds, ds) makes the provider twice.
    let graph = range_graph(0, 3, 1, vec![node("z", "ZipDataset", &["r", "r"])], "z");
    assert_eq!(split_sources(&graph, &no_glob).unwrap().len(), 2);
}

#[test]
fn matching_files_goes_through_the_glob() {
    let mut pattern = node("p", "Const", &[]);
    let tensor = TensorProto {
        dtype: DataType::DtString as i32,
        string_val: vec![Bytes::from_static(b"/d/*"), Bytes::from_static(b"/e/*")],
        tensor_shape: Some(TensorShapeProto {
            dim: vec![crate::tensorflow::tensor_shape_proto::Dim {
                size: 2,
                name: String::new(),
            }],
            unknown_rank: false,
        }),
        ..Default::default()
    };
    pattern.attr.insert(
        "value".into(),
        AttrValue {
            value: Some(attr_value::Value::Tensor(tensor)),
        },
    );
    let graph = def(vec![
        pattern,
        node("m", "MatchingFiles", &["p"]),
        node("check", "Assert", &[]),
        node("i", "Identity", &["m", "^check"]),
        node("s", "TensorSliceDataset", &["i"]),
        node("ret", "_Retval", &["s"]),
    ]);
    let glob = |p: &str| {
        Ok(if p == "/d/*" {
            vec!["/d/b".into(), "/d/a".into()]
        } else {
            vec![]
        })
    };
    assert_eq!(
        split_sources(&graph, &glob).unwrap(),
        vec![SplitSource::Index { n: 2 }]
    );
    let empty = |_: &str| Ok(vec![]);
    assert_eq!(split_sources(&graph, &empty).unwrap_err().op, "Assert");
    let refusal = split_sources(&graph, &no_glob).unwrap_err();
    assert_eq!(refusal.op, "MatchingFiles");
    assert!(refusal.reason.contains("no filesystem here"), "{refusal}");
    // Patterns that are the files themselves: a cycle, refused, not a stack overflow.
    let cycle = def(vec![
        node("m", "MatchingFiles", &["i"]),
        node("i", "Identity", &["m"]),
        node("s", "TensorSliceDataset", &["i"]),
        node("ret", "_Retval", &["s"]),
    ]);
    assert!(split_sources(&cycle, &glob).is_err());
}
