//! Columns of Arrow IPC and Parquet files as fields: which columns a job delivers, and what it
//! delivers of their nulls (issue 42, "data as it sits on the Hub loads").
//!
//! Files from the Hugging Face Hub, pandas or Spark hold columns beside the ones a job
//! trains on: text, nested lists, structs, dictionaries, nullable numbers. A job that names
//! its fields (`--fields`) gets only those columns checked and read ([`choose`]): the others
//! may have any type, and any nulls. A delivered column with nulls is refused unless the job
//! says what to deliver for them (`--nulls FIELD=mask` or `--nulls FIELD=fill:VALUE`,
//! [`NullPolicy`]): never silently.

use std::path::Path;

use arrow_schema::{DataType, Schema};

use super::schema::{DType, Field, FieldKind};
use crate::config::DatasetOptions;
pub use crate::config::NullPolicy;
use crate::error::{Error, Result};

/// The name of the field that carries the validity of masked field `name`: `name_valid`
/// (an underscore, so that the name stays one key in TOML tables, sharding specs and
/// dumps).
pub fn valid_field(name: &str) -> String {
    format!("{name}{VALID_SUFFIX}")
}

/// What [`valid_field`] appends.
pub const VALID_SUFFIX: &str = "_valid";

crate::config::string_conversions!(NullPolicy);

/// The bytes of one value of tensor field `field` (little-endian, every element the
/// value) that `fill:VALUE` delivers in place of a null; an error naming the field where
/// the value is not one of its dtype, or the field is not a tensor.
pub fn fill_bytes(field: &Field, value: &str) -> Result<Vec<u8>> {
    let FieldKind::Tensor { dtype, shape } = &field.kind else {
        return Err(Error::Config(format!(
            "--nulls {}=fill:{value}: field '{}' is {}; fill applies to numbers and booleans (use mask)",
            field.name, field.name, field.kind
        )));
    };
    let bad = || {
        Error::Config(format!(
            "--nulls {}=fill:{value}: '{value}' is not a value of dtype {dtype} (field '{}')",
            field.name, field.name
        ))
    };
    let int = |v: &str| v.parse::<i128>().ok();
    let one: Vec<u8> = match dtype {
        DType::Bool => match value {
            "true" | "1" => vec![1],
            "false" | "0" => vec![0],
            _ => return Err(bad()),
        },
        DType::U8 => u8::try_from(int(value).ok_or_else(bad)?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::I8 => i8::try_from(int(value).ok_or_else(bad)?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::U16 => u16::try_from(int(value).ok_or_else(bad)?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::I16 => i16::try_from(int(value).ok_or_else(bad)?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::U32 => u32::try_from(int(value).ok_or_else(bad)?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::I32 => i32::try_from(int(value).ok_or_else(bad)?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::U64 => u64::try_from(int(value).ok_or_else(bad)?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::I64 => i64::try_from(int(value).ok_or_else(bad)?).map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::F16 => half_bits(value.parse::<f32>().map_err(|_| bad())?).to_le_bytes().to_vec(),
        DType::F32 => value.parse::<f32>().map_err(|_| bad())?.to_le_bytes().to_vec(),
        DType::F64 => value.parse::<f64>().map_err(|_| bad())?.to_le_bytes().to_vec(),
    };
    let n: usize = shape.iter().product();
    Ok(one.repeat(n))
}

/// IEEE half-precision bits of `v` (rounded to nearest even; out of range: infinity).
fn half_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let mant = x & 0x7f_ffff;
    if exp == 0xff {
        // Infinity or NaN (a quiet NaN keeps a mantissa bit).
        return sign | 0x7c00 | if mant != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = mant | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = m >> shift;
        let rest = m & ((1 << shift) - 1);
        let mid = 1 << (shift - 1);
        let round = u32::from(rest > mid || (rest == mid && half & 1 == 1));
        return sign | (half + round) as u16;
    }
    let half = ((e as u32) << 10) | (mant >> 13);
    let rest = mant & 0x1fff;
    let round = u32::from(rest > 0x1000 || (rest == 0x1000 && half & 1 == 1));
    sign | (half + round) as u16
}

/// Which columns of a file a dataset reads, and what it does with their nulls: from the
/// dataset's options ([`ColumnChoice::of`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColumnChoice {
    /// The columns read (`None`: every column).
    pub names: Option<Vec<String>>,
    /// Per column, what its nulls are delivered as (absent: nulls are an error).
    pub nulls: std::collections::BTreeMap<String, NullPolicy>,
}

impl ColumnChoice {
    /// The columns of Arrow and Parquet files a dataset opened with `options` reads, and
    /// their null policies: with sequence packing the token column, else the selected
    /// fields (their validity fields are made, not read), else every column.
    pub fn of(options: &DatasetOptions) -> ColumnChoice {
        let names = match (&options.pack, &options.fields) {
            (Some(spec), _) => Some(vec![spec.field.clone()]),
            (None, names) => names.clone(),
        };
        ColumnChoice { names, nulls: options.nulls.clone() }
    }
}

/// Where a field of a file comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Column `index` of the file's schema.
    Column(usize),
    /// The validity of field `of` (a masked column): one `u8` per row.
    Valid(usize),
}

/// The fields a file delivers under a [`ColumnChoice`]: the columns it reads (in file
/// order), each masked one followed by its validity field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub fields: Vec<Field>,
    pub sources: Vec<Source>,
    /// Per field, what its nulls are delivered as (`None`: refused; always `None` for a
    /// validity field).
    pub nulls: Vec<Option<NullPolicy>>,
}

impl Chosen {
    /// The field read from schema column `column`, if it is read.
    pub fn field_of_column(&self, column: usize) -> Option<usize> {
        self.sources.iter().position(|s| *s == Source::Column(column))
    }
}

/// Why a column's type is not one meshfeed delivers (what `kind_of` says to [`choose`]),
/// naming the column; the file is named by whoever reports it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ColumnTypeError {
    /// A type with no field kind at all.
    #[error("column '{column}' has unsupported type {ty}")]
    UnsupportedType { column: String, ty: DataType },
    /// A fixed-size list of booleans (a bit each in Arrow, a byte each as meshfeed delivers).
    #[error("column '{column}': fixed-size lists of booleans are not supported")]
    BooleanLists { column: String },
    /// A fixed-size list of variable-length values.
    #[error("column '{column}': lists of variable-length values are not supported")]
    VariableLengthLists { column: String },
    /// A variable-length list of something other than numbers.
    #[error("column '{column}': lists of {of} are not supported (lists of numbers are)")]
    ListsOf { column: String, of: DataType },
    /// A list size or binary width that is negative.
    #[error("column '{column}': bad {what} {n}")]
    BadSize { column: String, what: &'static str, n: i32 },
}

/// The fields file `path` with schema `schema` delivers under `choice`, the type of each
/// column read checked by `kind_of` (the format's mapping of a column type to a field). A
/// column not read is never checked. Without a selection, a column of a type meshfeed
/// cannot deliver is an error naming it and the way to leave it out; a selection naming a
/// column that does not exist is an error naming the columns that do.
pub fn choose(
    path: &Path,
    schema: &Schema,
    choice: &ColumnChoice,
    kind_of: impl Fn(&str, &DataType) -> std::result::Result<FieldKind, ColumnTypeError>,
) -> Result<Chosen> {
    let columns: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    if let Some(names) = &choice.names {
        let masked = |n: &str| {
            n.strip_suffix(VALID_SUFFIX)
                .is_some_and(|of| choice.nulls.get(of) == Some(&NullPolicy::Mask) && names.iter().any(|x| x == of))
        };
        if let Some(unknown) = names.iter().find(|n| !columns.contains(&n.as_str()) && !masked(n)) {
            return Err(Error::file(
                path,
                format!("--fields names unknown field '{unknown}' (fields: {})", columns.join(", ")),
            ));
        }
    }
    let mut chosen = Chosen { fields: Vec::new(), sources: Vec::new(), nulls: Vec::new() };
    for (i, f) in schema.fields().iter().enumerate() {
        if choice.names.as_ref().is_some_and(|names| !names.iter().any(|n| n == f.name())) {
            continue;
        }
        let kind = kind_of(f.name(), f.data_type()).map_err(|why| {
            let way_out = match &choice.names {
                None => {
                    let others: Vec<&str> = columns.iter().copied().filter(|c| *c != f.name()).collect();
                    format!("; --fields can leave it out (e.g. --fields {})", others.join(","))
                }
                Some(_) => " (it is named by --fields)".to_string(),
            };
            Error::file_caused(path, format!("{why}{way_out}"), why)
        })?;
        let field = Field { name: f.name().clone(), kind };
        if let (FieldKind::Tensor { .. }, None) = (&field.kind, field.fixed_bytes()) {
            return Err(Error::file(path, format!("column '{}' has values too large to address", field.name)));
        }
        let policy = choice.nulls.get(f.name()).cloned();
        if let Some(NullPolicy::Fill(v)) = &policy {
            fill_bytes(&field, v)?;
        }
        let at = chosen.fields.len();
        chosen.fields.push(field);
        chosen.sources.push(Source::Column(i));
        chosen.nulls.push(policy.clone());
        if policy == Some(NullPolicy::Mask) {
            chosen.fields.push(Field::tensor(valid_field(f.name()), DType::U8, vec![]));
            chosen.sources.push(Source::Valid(at));
            chosen.nulls.push(None);
        }
    }
    Ok(chosen)
}

/// The error for nulls in field `name` where the job did not say what to deliver for them:
/// `where_` is the record batch or row group; the message names the two ways out.
pub fn refused(path: &Path, name: &str, where_: &str) -> Error {
    Error::file(
        path,
        format!(
            "column '{name}' has nulls in {where_}; deliver them with --nulls {name}=mask (zeros, and a field \
             '{}' of 1 present / 0 null per row) or --nulls {name}=fill:VALUE (nulls delivered as VALUE)",
            valid_field(name)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Field as AField;

    #[test]
    fn policies_parse_and_print() {
        assert_eq!("mask".parse::<NullPolicy>().unwrap(), NullPolicy::Mask);
        assert_eq!("fill:-1".parse::<NullPolicy>().unwrap(), NullPolicy::Fill("-1".into()));
        assert_eq!(NullPolicy::Fill("nan".into()).to_string(), "fill:nan");
        for bad in ["zero", "fill:", "fill"] {
            let e = bad.parse::<NullPolicy>().unwrap_err().to_string();
            assert!(e.contains("expected mask or fill:VALUE"), "{e}");
        }
    }

    #[test]
    fn fill_values_are_checked_against_the_dtype() {
        let f = |d: DType, shape: Vec<usize>, v: &str| fill_bytes(&Field::tensor("x", d, shape), v);
        assert_eq!(f(DType::I64, vec![], "-1").unwrap(), (-1i64).to_le_bytes());
        assert_eq!(f(DType::F32, vec![2], "1.5").unwrap(), [1.5f32.to_le_bytes(), 1.5f32.to_le_bytes()].concat());
        assert_eq!(f(DType::Bool, vec![], "true").unwrap(), [1]);
        assert_eq!(f(DType::F16, vec![], "1").unwrap(), 0x3c00u16.to_le_bytes());
        assert_eq!(f(DType::F16, vec![], "-2.5").unwrap(), 0xc100u16.to_le_bytes());
        assert!(f(DType::F64, vec![], "nan").unwrap() != [0; 8]);
        for (d, v) in [(DType::U8, "256"), (DType::I32, "1.5"), (DType::Bool, "2"), (DType::F32, "x")] {
            let e = f(d, vec![], v).unwrap_err().to_string();
            assert!(e.contains(&format!("'{v}' is not a value of dtype {d} (field 'x')")), "{e}");
        }
        let text = Field { name: "t".into(), kind: FieldKind::Bytes { utf8: true, elem: None } };
        assert!(fill_bytes(&text, "0").unwrap_err().to_string().contains("fill applies to numbers and booleans"));
    }

    /// Only the columns read are checked; a mask adds the validity field after its field.
    #[test]
    fn only_the_columns_read_are_checked() {
        let schema = Schema::new(vec![
            AField::new("a", DataType::Int64, false),
            AField::new("s", DataType::Struct(Default::default()), true),
            AField::new("b", DataType::Float32, true),
        ]);
        let kind = |name: &str, dt: &DataType| match dt {
            DataType::Int64 => Ok(Field::tensor(name, DType::I64, vec![]).kind),
            DataType::Float32 => Ok(Field::tensor(name, DType::F32, vec![]).kind),
            other => Err(ColumnTypeError::UnsupportedType { column: name.into(), ty: other.clone() }),
        };
        let p = Path::new("/d/x.arrow");
        let choice = |names: Option<&[&str]>, nulls: &[(&str, &str)]| ColumnChoice {
            names: names.map(|n| n.iter().map(|s| s.to_string()).collect()),
            nulls: nulls.iter().map(|(k, v)| (k.to_string(), v.parse().unwrap())).collect(),
        };
        let e = choose(p, &schema, &choice(None, &[]), kind).unwrap_err().to_string();
        assert!(e.contains("/d/x.arrow") && e.contains("column 's' has unsupported type"), "{e}");
        assert!(e.contains("--fields can leave it out (e.g. --fields a,b)"), "{e}");
        let cause = choose(p, &schema, &choice(None, &[]), kind).unwrap_err();
        assert!(std::error::Error::source(&cause).is_some_and(|c| c.is::<ColumnTypeError>()), "{cause:?}");
        let c = choose(p, &schema, &choice(Some(&["b", "a"]), &[("b", "mask")]), kind).unwrap();
        let names: Vec<&str> = c.fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "b_valid"]);
        assert_eq!(c.sources, [Source::Column(0), Source::Column(2), Source::Valid(1)]);
        assert_eq!(c.nulls[1], Some(NullPolicy::Mask));
        let e = choose(p, &schema, &choice(Some(&["a", "s"]), &[]), kind).unwrap_err().to_string();
        assert!(e.contains("column 's' has unsupported type") && e.contains("named by --fields"), "{e}");
        let e = choose(p, &schema, &choice(Some(&["a", "zz"]), &[]), kind).unwrap_err().to_string();
        assert!(e.contains("/d/x.arrow") && e.contains("unknown field 'zz' (fields: a, s, b)"), "{e}");
        let e = choose(p, &schema, &choice(Some(&["a"]), &[("a", "fill:x")]), kind).unwrap_err().to_string();
        assert!(e.contains("'x' is not a value of dtype i64"), "{e}");
    }
}
