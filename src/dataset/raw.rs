//! Raw fixed-size records: `*.raw` files of packed little-endian records, described by a
//! `schema.json` in the same directory:
//!
//! ```json
//! {"fields": [{"name": "x", "dtype": "f32", "shape": [4]}, {"name": "y", "dtype": "i64", "shape": []}]}
//! ```
//!
//! A record is the fields' bytes one after the other (C order, no padding); a file is a
//! sequence of records with no header.

use std::path::{Path, PathBuf};

use super::records::{RecordFile, RecordLayout};
use super::schema::{DType, Field};
use crate::error::{Error, Result, ResultExt};

/// Name of the schema file next to raw record files.
pub const SCHEMA_FILE: &str = "schema.json";

#[derive(serde::Deserialize, serde::Serialize)]
struct SchemaFile {
    fields: Vec<SchemaField>,
}

#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct SchemaField {
    name: String,
    dtype: String,
    #[serde(default)]
    shape: Vec<usize>,
}

fn schema_path(path: &Path) -> PathBuf {
    path.parent().unwrap_or(Path::new(".")).join(SCHEMA_FILE)
}

/// Reads the schema that applies to a raw file.
pub fn read_schema(path: &Path) -> Result<Vec<Field>> {
    let sp = schema_path(path);
    let text = std::fs::read_to_string(&sp).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::file(path, format!("raw records need a schema file {}", sp.display())),
        _ => Error::io(&sp, e),
    })?;
    let schema: SchemaFile = serde_json::from_str(&text).file_context(&sp, "invalid schema")?;
    if schema.fields.is_empty() {
        return Err(Error::file(&sp, "invalid schema: no fields"));
    }
    let mut fields: Vec<Field> = Vec::new();
    for f in schema.fields {
        let dtype = DType::parse(&f.dtype).ok_or_else(|| {
            Error::file(&sp, format!("invalid schema: field '{}' has unknown dtype '{}'", f.name, f.dtype))
        })?;
        if f.name.is_empty() || fields.iter().any(|g| g.name == f.name) {
            return Err(Error::file(&sp, format!("invalid schema: field name '{}' is empty or repeated", f.name)));
        }
        let field = Field::tensor(f.name, dtype, f.shape);
        if field.fixed_bytes().is_none() {
            return Err(Error::file(&sp, format!("invalid schema: field '{}' is too large", field.name)));
        }
        fields.push(field);
    }
    Ok(fields)
}

/// Writes the schema file for `fields` into `dir`.
pub fn write_schema(dir: &Path, fields: &[Field]) -> Result<()> {
    let schema = SchemaFile {
        fields: fields
            .iter()
            .map(|f| match &f.kind {
                super::schema::FieldKind::Tensor { dtype, shape } => {
                    Ok(SchemaField { name: f.name.clone(), dtype: dtype.name().into(), shape: shape.clone() })
                }
                super::schema::FieldKind::Bytes { .. } => {
                    Err(Error::Config(format!("raw records cannot hold variable-length field '{}'", f.name)))
                }
            })
            .collect::<Result<_>>()?,
    };
    let p = dir.join(SCHEMA_FILE);
    let text = serde_json::to_string_pretty(&schema).expect("schema serialises");
    std::fs::write(&p, text + "\n").map_err(|e| Error::io(&p, e))
}

fn layout(path: &Path) -> Result<RecordLayout> {
    let fields = read_schema(path)?;
    let mut ranges = Vec::new();
    let mut offset = 0usize;
    for f in &fields {
        let n = f.fixed_bytes().expect("checked by read_schema");
        let end = offset.checked_add(n).ok_or_else(|| Error::file(path, "record too large"))?;
        ranges.push(offset..end);
        offset = end;
    }
    let record = offset as u64;
    if record == 0 {
        return Err(Error::file(path, "records of zero bytes"));
    }
    let len = std::fs::metadata(path).map_err(|e| Error::io(path, e))?.len();
    if len % record != 0 {
        return Err(Error::file(
            path,
            format!("truncated: {len} bytes is not a whole number of {record}-byte records"),
        ));
    }
    Ok(RecordLayout { samples: len / record, data_offset: 0, record_bytes: record, fields, ranges })
}

/// Reads the sample count (file size / record size) and the fields.
pub fn scan(path: &Path) -> Result<(u64, Vec<Field>)> {
    let l = layout(path)?;
    Ok((l.samples, l.fields))
}

/// Opens a raw file for reading rows.
pub fn open(path: &Path, expected: &[Field]) -> Result<RecordFile> {
    layout(path)?.open(path, expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_and_size_checks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.raw");
        std::fs::write(&p, [0u8; 24]).unwrap();
        assert!(scan(&p).unwrap_err().to_string().contains("schema file"));
        let fields = vec![Field::tensor("x", DType::F32, vec![2]), Field::tensor("y", DType::U16, vec![])];
        write_schema(dir.path(), &fields).unwrap();
        assert!(scan(&p).unwrap_err().to_string().contains("not a whole number of 10-byte records"));
        std::fs::write(&p, [0u8; 30]).unwrap();
        assert_eq!(scan(&p).unwrap(), (3, fields));
        std::fs::write(dir.path().join(SCHEMA_FILE), r#"{"fields":[{"name":"x","dtype":"c64"}]}"#).unwrap();
        assert!(scan(&p).unwrap_err().to_string().contains("unknown dtype 'c64'"));
    }
}
