//! Delivered batches: this rank's rows of one global batch, field by field.

use std::ops::Range;

use ndarray::{ArrayViewD, IxDyn};

use crate::dataset::{DType, Field, FieldKind};
use crate::error::{Error, Result};
use crate::plan::FieldPart;
use crate::types::{Epoch, SampleId, Step};

/// Element types a tensor field can be viewed as.
pub trait Element: bytemuck::Pod {
    /// The dtype whose bytes this type reads.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => { $(impl Element for $t { const DTYPE: DType = DType::$d; })* };
}
element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64, i64 => I64, f32 => F32, f64 => F64);

/// Bytes in an 8-byte-aligned allocation, so that any element type can view them.
#[derive(Clone, Debug, Default)]
pub struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBytes {
        AlignedBytes { words: vec![0; len.div_ceil(8)], len }
    }

    /// `len` bytes of unspecified contents, for a caller that overwrites every one: a
    /// recycled buffer where one is free (see [`crate::buffers`]).
    pub(crate) fn recycled(len: usize) -> AlignedBytes {
        AlignedBytes { words: crate::buffers::words(len.div_ceil(8)), len }
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    /// The bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

impl Drop for AlignedBytes {
    /// The memory goes back to the pool for the next batches.
    fn drop(&mut self) {
        crate::buffers::give_words(std::mem::take(&mut self.words));
    }
}

/// The values of one field (or of this rank's slice of it) for the rows of a batch.
#[derive(Clone, Debug)]
pub struct FieldData {
    field: Field,
    part: FieldPart,
    rows: usize,
    data: AlignedBytes,
    /// Variable-length fields: `offsets[i]..offsets[i + 1]` are row `i`'s bytes.
    offsets: Option<Vec<usize>>,
}

impl FieldData {
    pub(crate) fn tensor(field: Field, part: FieldPart, rows: usize) -> FieldData {
        let value_bytes = part.bytes(&field).expect("tensor field");
        // Assembly writes every row's bytes.
        FieldData { field, part, rows, data: AlignedBytes::recycled(rows * value_bytes), offsets: None }
    }

    pub(crate) fn var_len(field: Field, part: FieldPart, rows: usize, values: &[&[u8]]) -> FieldData {
        let total = values.iter().map(|v| v.len()).sum();
        let mut data = AlignedBytes::recycled(total);
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        let mut at = 0;
        for v in values {
            data.as_mut_slice()[at..at + v.len()].copy_from_slice(v);
            at += v.len();
            offsets.push(at);
        }
        FieldData { field, part, rows, data, offsets: Some(offsets) }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.data.as_mut_slice()
    }

    /// The field's name and kind.
    pub fn field(&self) -> &Field {
        &self.field
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// All bytes of the field, rows back to back (C order for tensors).
    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// The bytes of row `i`.
    pub fn row(&self, i: usize) -> &[u8] {
        match &self.offsets {
            Some(o) => &self.bytes()[o[i]..o[i + 1]],
            None => {
                let n = self.bytes().len() / self.rows.max(1);
                &self.bytes()[i * n..(i + 1) * n]
            }
        }
    }

    /// Which part of each value this rank holds (whole, or a slice of the field's dims).
    pub fn part(&self) -> &FieldPart {
        &self.part
    }

    /// Ranges of each of the field's dimensions this rank holds, ascending (the whole field
    /// when unsplit; two ranges in a dimension split zigzag); with [`Batch::rows`] this is
    /// the part of the global batch array it covers.
    pub fn field_slice(&self) -> Vec<Vec<Range<usize>>> {
        match (&self.part.slice, &self.field.kind) {
            (Some(s), _) => s.clone(),
            (None, FieldKind::Tensor { shape, .. }) => shape.iter().map(|&n| vec![0..n]).collect(),
            (None, FieldKind::Bytes { .. }) => vec![],
        }
    }

    /// Shape of the local batch array, `[rows, *slice_shape]`; `None` for variable length.
    pub fn shape(&self) -> Option<Vec<usize>> {
        match &self.field.kind {
            FieldKind::Tensor { .. } => Some(std::iter::once(self.rows).chain(self.part.shape(&self.field)).collect()),
            FieldKind::Bytes { .. } => None,
        }
    }

    /// Views a tensor field as an `ndarray` array of `T`, which must match its dtype.
    pub fn array<T: Element>(&self) -> Result<ArrayViewD<'_, T>> {
        let FieldKind::Tensor { dtype, .. } = &self.field.kind else {
            return Err(Error::Config(format!("field '{}' has variable length; use row()", self.field.name)));
        };
        if *dtype != T::DTYPE {
            return Err(Error::Config(format!("field '{}' is {dtype}, not {}", self.field.name, T::DTYPE)));
        }
        let shape = self.shape().expect("tensor");
        let values: &[T] = bytemuck::cast_slice(self.bytes());
        Ok(ArrayViewD::from_shape(IxDyn(&shape), values).expect("length matches shape"))
    }
}

/// This rank's part of one global batch.
#[derive(Clone, Debug)]
pub struct Batch {
    pub(crate) coords: Vec<usize>,
    pub(crate) epoch: Epoch,
    pub(crate) step: Step,
    pub(crate) rows: Range<usize>,
    pub(crate) ids: Vec<SampleId>,
    pub(crate) fields: Vec<FieldData>,
}

impl Batch {
    /// The epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The step (global batch index) within the epoch.
    pub fn step(&self) -> Step {
        self.step
    }

    /// This rank's mesh coordinate, indexed by mesh axis (of its first device, with several
    /// devices per process).
    pub fn coords(&self) -> &[usize] {
        &self.coords
    }

    /// Rows of the global batch this rank holds (empty when it receives nothing).
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// Global sample ids of the rows, in row order.
    pub fn ids(&self) -> &[SampleId] {
        &self.ids
    }

    /// The fields this rank received, in dataset field order.
    pub fn fields(&self) -> &[FieldData] {
        &self.fields
    }

    /// A field by name.
    pub fn field(&self, name: &str) -> Option<&FieldData> {
        self.fields.iter().find(|f| f.field.name == name)
    }

    /// The fields, taken out of the batch without copying their bytes (for bindings that
    /// hand each field's buffer to another owner, such as a Python array).
    pub fn into_fields(self) -> Vec<FieldData> {
        self.fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_check_dtype_and_shape() {
        let mut f = FieldData::tensor(Field::tensor("x", DType::F32, vec![2]), FieldPart::whole(0), 3);
        for (i, v) in [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().enumerate() {
            f.bytes_mut()[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        let a = f.array::<f32>().unwrap();
        assert_eq!(a.shape(), &[3, 2]);
        assert_eq!(a[[2, 1]], 6.0);
        assert_eq!(f.row(1), &[0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40]);
        assert!(f.array::<i32>().unwrap_err().to_string().contains("is f32, not i32"));
        let t = Field { name: "t".into(), kind: FieldKind::Bytes { utf8: false, elem: None } };
        let v = FieldData::var_len(t, FieldPart::whole(0), 2, &[b"ab", b""]);
        assert_eq!((v.row(0), v.row(1)), (&b"ab"[..], &b""[..]));
        assert!(v.array::<u8>().is_err());
        // A slice of a [4, 6] field: columns 3..6.
        let part = FieldPart { field: 0, slice: Some(vec![vec![0..4], vec![3..6]]) };
        let mut s = FieldData::tensor(Field::tensor("x", DType::U8, vec![4, 6]), part, 2);
        s.bytes_mut()[23] = 9;
        assert_eq!(s.shape(), Some(vec![2, 4, 3]));
        assert_eq!(s.array::<u8>().unwrap()[[1, 3, 2]], 9);
        assert_eq!(s.field_slice(), vec![vec![0..4], vec![3..6]]);
    }
}
