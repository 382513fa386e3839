//! A tensor as the rendezvous moves it: a dtype, a shape and the bytes.
//!
//! The bytes are a [`Bytes`]: a local send hands the receiver the very buffer the producer gave
//! (no copy), and a remote transfer streams slices of it.

use bytes::Bytes;

/// The fixed-size element types TensorFlow names `DT_*`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    Float,
    Double,
    Half,
    BFloat16,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Bool,
    Complex64,
    Complex128,
}

const ALL: [(DType, &str, usize); 15] = [
    (DType::Float, "DT_FLOAT", 4),
    (DType::Double, "DT_DOUBLE", 8),
    (DType::Half, "DT_HALF", 2),
    (DType::BFloat16, "DT_BFLOAT16", 2),
    (DType::Int8, "DT_INT8", 1),
    (DType::Int16, "DT_INT16", 2),
    (DType::Int32, "DT_INT32", 4),
    (DType::Int64, "DT_INT64", 8),
    (DType::UInt8, "DT_UINT8", 1),
    (DType::UInt16, "DT_UINT16", 2),
    (DType::UInt32, "DT_UINT32", 4),
    (DType::UInt64, "DT_UINT64", 8),
    (DType::Bool, "DT_BOOL", 1),
    (DType::Complex64, "DT_COMPLEX64", 8),
    (DType::Complex128, "DT_COMPLEX128", 16),
];

impl DType {
    fn row(self) -> (DType, &'static str, usize) {
        ALL.into_iter()
            .find(|(d, _, _)| *d == self)
            .unwrap_or((self, "DT_INVALID", 0))
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        self.row().2
    }

    /// TensorFlow's name, `DT_FLOAT`.
    pub fn name(self) -> &'static str {
        self.row().1
    }

    pub fn from_name(name: &str) -> Option<Self> {
        ALL.into_iter()
            .find(|(_, n, _)| *n == name)
            .map(|(d, _, _)| d)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    dtype: DType,
    shape: Vec<i64>,
    data: Bytes,
}

/// Bytes a tensor of `dtype` and `shape` holds, or why the shape is impossible.
pub fn byte_len(dtype: DType, shape: &[i64]) -> Result<u64, String> {
    let mut elements: u64 = 1;
    for &d in shape {
        let d =
            u64::try_from(d).map_err(|_| format!("shape {shape:?} has a negative dimension"))?;
        elements = elements
            .checked_mul(d)
            .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    }
    elements
        .checked_mul(dtype.size() as u64)
        .ok_or_else(|| format!("shape {shape:?} overflows"))
}

impl Tensor {
    /// A tensor over `data`, which must hold exactly the bytes `shape` calls for.
    pub fn new(dtype: DType, shape: Vec<i64>, data: Bytes) -> Result<Self, String> {
        let want = byte_len(dtype, &shape)?;
        if want != data.len() as u64 {
            return Err(format!(
                "a {} tensor of shape {shape:?} holds {want} bytes, not {}",
                dtype.name(),
                data.len()
            ));
        }
        Ok(Self { dtype, shape, data })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    pub fn data(&self) -> &Bytes {
        &self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_bytes_must_agree() {
        let t = Tensor::new(DType::Float, vec![2, 3], Bytes::from(vec![0u8; 24])).expect("tensor");
        assert_eq!(t.shape(), &[2, 3]);
        assert!(Tensor::new(DType::Float, vec![2, 3], Bytes::from(vec![0u8; 23])).is_err());
        assert!(Tensor::new(DType::Int8, vec![-1], Bytes::new()).is_err());
        assert!(Tensor::new(DType::Int64, vec![i64::MAX, i64::MAX], Bytes::new()).is_err());
        assert_eq!(
            Tensor::new(DType::Bool, vec![], Bytes::from_static(&[1]))
                .expect("scalar")
                .data()
                .len(),
            1
        );
        for (d, name, _) in ALL {
            assert_eq!(DType::from_name(name), Some(d));
            assert_eq!(d.name(), name);
        }
        assert_eq!(DType::from_name("DT_STRING"), None);
    }
}
