//! Fields, dtypes and schemas: what one sample of a dataset looks like.
//!
//! A sample has named fields. A field is either a fixed-shape tensor (dtype + shape,
//! stored little-endian in C order) or a variable-length byte string.

use std::fmt;
use std::ops::Range;

/// Element type of a tensor field. Values are little-endian in files and in batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    F32,
    F64,
}

impl DType {
    /// The element type of an Arrow primitive type, where meshfeed has one.
    pub fn of_arrow(dt: &arrow_schema::DataType) -> Option<DType> {
        use arrow_schema::DataType;
        Some(match dt {
            DataType::Int8 => DType::I8,
            DataType::Int16 => DType::I16,
            DataType::Int32 => DType::I32,
            DataType::Int64 => DType::I64,
            DataType::UInt8 => DType::U8,
            DataType::UInt16 => DType::U16,
            DataType::UInt32 => DType::U32,
            DataType::UInt64 => DType::U64,
            DataType::Float16 => DType::F16,
            DataType::Float32 => DType::F32,
            DataType::Float64 => DType::F64,
            _ => return None,
        })
    }

    /// All dtypes, for parsing and tests.
    pub const ALL: [DType; 12] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::U32,
        DType::I32,
        DType::U64,
        DType::I64,
        DType::F16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::U16 | DType::I16 | DType::F16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 => 8,
        }
    }

    /// Short name, as used on the command line and in raw schema files (`f32`, `u8`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::U32 => "u32",
            DType::I32 => "i32",
            DType::U64 => "u64",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }

    /// Parses a short name (`f32`) or a NumPy name (`float32`, `uint8`, `bool`).
    pub fn parse(s: &str) -> Option<DType> {
        let numpy = [
            ("bool_", DType::Bool),
            ("uint8", DType::U8),
            ("int8", DType::I8),
            ("uint16", DType::U16),
            ("int16", DType::I16),
            ("uint32", DType::U32),
            ("int32", DType::I32),
            ("uint64", DType::U64),
            ("int64", DType::I64),
            ("float16", DType::F16),
            ("float32", DType::F32),
            ("float64", DType::F64),
        ];
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .or_else(|| numpy.iter().find(|(n, _)| *n == s).map(|(_, d)| *d))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one value of a field is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FieldKind {
    /// A fixed-shape tensor; `shape` excludes the sample axis (`[]` is a scalar).
    Tensor { dtype: DType, shape: Vec<usize> },
    /// Variable-length bytes (Arrow binary); `utf8` marks text (Arrow utf8). With `elem`,
    /// a variable-length list of numbers of that type (Arrow `List`/`LargeList` of a
    /// primitive, e.g. token ids): the bytes are the elements, little-endian.
    Bytes {
        utf8: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        elem: Option<DType>,
    },
}

/// A named field of a sample.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Field {
    pub name: String,
    pub kind: FieldKind,
}

impl Field {
    /// A tensor field.
    pub fn tensor(name: impl Into<String>, dtype: DType, shape: Vec<usize>) -> Field {
        Field { name: name.into(), kind: FieldKind::Tensor { dtype, shape } }
    }

    /// Bytes per sample for a tensor field; `None` for variable length, or when the size
    /// does not fit a `usize` (readers reject such fields when they scan a file).
    pub fn fixed_bytes(&self) -> Option<usize> {
        match &self.kind {
            FieldKind::Tensor { dtype, shape } => shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d)),
            FieldKind::Bytes { .. } => None,
        }
    }
}

impl fmt::Display for FieldKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldKind::Tensor { dtype, shape } => {
                let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
                write!(f, "{dtype}[{}]", dims.join(","))
            }
            FieldKind::Bytes { utf8: false, elem: None } => f.write_str("bytes (variable length)"),
            FieldKind::Bytes { utf8: true, elem: None } => f.write_str("utf8 (variable length)"),
            FieldKind::Bytes { elem: Some(t), .. } => write!(f, "{} list (variable length)", t.name()),
        }
    }
}

/// Names the first field name that occurs twice, if any. Fields are found by name (sharding
/// specs, stages, `Batch::field`), so a file with two columns, members or datasets of one
/// name is refused, whatever its format allows.
pub fn duplicate_name(fields: &[Field]) -> Option<String> {
    let mut seen = std::collections::HashMap::new();
    for (i, f) in fields.iter().enumerate() {
        if let Some(first) = seen.insert(f.name.as_str(), i) {
            return Some(format!(
                "two fields are named '{}' (fields {first} and {i}); field names must be unique",
                f.name
            ));
        }
    }
    None
}

/// Describes why two field lists differ, naming the field; `None` when they are equal.
pub fn describe_mismatch(a: &[Field], b: &[Field]) -> Option<String> {
    for fa in a {
        match b.iter().find(|fb| fb.name == fa.name) {
            None => return Some(format!("field '{}' is missing in the second file", fa.name)),
            Some(fb) if fb.kind != fa.kind => {
                return Some(format!(
                    "field '{}' is {} in the first file but {} in the second",
                    fa.name, fa.kind, fb.kind
                ))
            }
            Some(_) => {}
        }
    }
    if let Some(fb) = b.iter().find(|fb| !a.iter().any(|fa| fa.name == fb.name)) {
        return Some(format!("field '{}' is only in the second file", fb.name));
    }
    let names_a: Vec<&str> = a.iter().map(|f| f.name.as_str()).collect();
    let names_b: Vec<&str> = b.iter().map(|f| f.name.as_str()).collect();
    (names_a != names_b).then(|| format!("fields are in a different order: {names_a:?} vs {names_b:?}"))
}

/// Where each fixed-size field lies in a row's record: how a row of fixed-size fields is
/// kept in memory or a spill file (not a file format's layout).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowLayout {
    /// Bytes of one row.
    pub record: usize,
    /// Each field's bytes inside a row, in field order.
    pub fields: Vec<Range<usize>>,
}

impl RowLayout {
    /// The layout of rows of `fields`, if every field has a fixed size.
    pub fn of(fields: &[Field]) -> Option<RowLayout> {
        let mut at = 0;
        let mut ranges = Vec::with_capacity(fields.len());
        for f in fields {
            let n = f.fixed_bytes()?;
            ranges.push(at..at + n);
            at += n;
        }
        Some(RowLayout { record: at, fields: ranges })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
        }
        assert_eq!(DType::parse("float32"), Some(DType::F32));
        assert_eq!(DType::parse("uint8"), Some(DType::U8));
        assert_eq!(DType::parse("complex64"), None);
    }

    #[test]
    fn duplicate_names_are_found() {
        let x = Field::tensor("x", DType::F32, vec![4]);
        let y = Field::tensor("y", DType::I64, vec![]);
        assert_eq!(duplicate_name(&[x.clone(), y.clone()]), None);
        let m = duplicate_name(&[x.clone(), y, Field::tensor("x", DType::U8, vec![])]).unwrap();
        assert!(m.contains("'x'") && m.contains("fields 0 and 2") && m.contains("unique"), "{m}");
    }

    #[test]
    fn mismatch_names_the_field() {
        let a = vec![Field::tensor("x", DType::F32, vec![4]), Field::tensor("y", DType::I64, vec![])];
        let mut b = a.clone();
        assert_eq!(describe_mismatch(&a, &b), None);
        b[0] = Field::tensor("x", DType::F32, vec![5]);
        let m = describe_mismatch(&a, &b).unwrap();
        assert!(m.contains("'x'") && m.contains("f32[4]") && m.contains("f32[5]"), "{m}");
        b = vec![a[0].clone()];
        assert!(describe_mismatch(&a, &b).unwrap().contains("'y' is missing"));
        assert!(describe_mismatch(&b, &a).unwrap().contains("'y' is only in the second"));
        b = vec![a[1].clone(), a[0].clone()];
        assert!(describe_mismatch(&a, &b).unwrap().contains("different order"));
    }
}
