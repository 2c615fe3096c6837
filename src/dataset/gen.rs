//! Synthetic datasets whose contents are a function of the sample id.
//!
//! `meshfeed gen` writes them; `meshfeed run --verify` recomputes every delivered value
//! from its id and compares bytes. The function (generator `meshfeed-gen-v1`):
//!
//! * tensor field `fi` (index in field order), element `e` (C order):
//!   `(id + 7·e + 13·fi) mod M`, stored as the field's dtype, where `M` is the largest
//!   modulus the dtype holds exactly (`2` for bool, `2^bits` or `2^(bits-1)` for integers,
//!   `2^11` for f16, `2^24` for f32, `2^53` for f64);
//! * variable-length field: the ASCII text `"<id>:<fi>:"` followed by the first
//!   `(7·id + fi) mod 27` letters of the alphabet.
//!
//! A `meshfeed-gen.json` manifest next to the files records the generator, so that
//! `--verify` knows the contents can be checked.

use std::path::{Path, PathBuf};

#[cfg(feature = "hdf5")]
use super::hdf5;
use super::header::Format;
use super::schema::{DType, Field, FieldKind};
use super::{npy, raw};
use crate::error::{Error, Result, ResultExt};

/// Name of the manifest written next to generated files.
pub const MANIFEST: &str = "meshfeed-gen.json";
/// Generator version recorded in the manifest.
pub const GENERATOR: &str = "meshfeed-gen-v1";

/// Contents of the manifest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    pub generator: String,
    pub samples: u64,
    pub fields: Vec<Field>,
}

fn modulus(d: DType) -> u64 {
    match d {
        DType::Bool => 2,
        DType::U8 => 1 << 8,
        DType::I8 => 1 << 7,
        DType::U16 => 1 << 16,
        DType::I16 => 1 << 15,
        DType::U32 => 1 << 32,
        DType::I32 => 1 << 31,
        DType::U64 | DType::I64 => 1 << 63,
        DType::F16 => 1 << 11,
        DType::F32 => 1 << 24,
        DType::F64 => 1 << 53,
    }
}

/// Appends the little-endian bytes of `v` (exactly representable) as `d`.
fn push_element(d: DType, v: u64, out: &mut Vec<u8>) {
    match d {
        DType::Bool | DType::U8 | DType::I8 => out.push(v as u8),
        DType::U16 | DType::I16 => out.extend((v as u16).to_le_bytes()),
        DType::U32 | DType::I32 => out.extend((v as u32).to_le_bytes()),
        DType::U64 | DType::I64 => out.extend(v.to_le_bytes()),
        DType::F16 => out.extend(f16_bits(v as u32).to_le_bytes()),
        DType::F32 => out.extend((v as f32).to_le_bytes()),
        DType::F64 => out.extend((v as f64).to_le_bytes()),
    }
}

/// IEEE half-precision bits of an integer below 2^11 (exact).
fn f16_bits(v: u32) -> u16 {
    debug_assert!(v < 1 << 11);
    if v == 0 {
        return 0;
    }
    let exp = 31 - v.leading_zeros(); // position of the leading one
    let mantissa = (v << (10 - exp)) & 0x3ff;
    (((exp + 15) << 10) | mantissa) as u16
}

/// Appends the value of field `fi` of sample `id` to `out`.
pub fn value(fields: &[Field], id: u64, fi: usize, out: &mut Vec<u8>) {
    match &fields[fi].kind {
        FieldKind::Tensor { dtype, shape } => {
            let m = modulus(*dtype);
            let n: usize = shape.iter().product();
            for e in 0..n as u64 {
                let v = id.wrapping_add(7 * e).wrapping_add(13 * fi as u64) % m;
                push_element(*dtype, v, out);
            }
        }
        FieldKind::Bytes { .. } => {
            out.extend(format!("{id}:{fi}:").as_bytes());
            // Wrapping: ids near u64::MAX must not panic (the function is documented for
            // ids below 2^61, far beyond any dataset).
            let letters = (id.wrapping_mul(7).wrapping_add(fi as u64) % 27) as usize;
            out.extend(&b"abcdefghijklmnopqrstuvwxyz"[..letters.min(26)]);
            if letters == 26 {
                out.push(b'!');
            }
        }
    }
}

/// Parses `name:dtype[:shape]` (shape `4x8`, empty or omitted for a scalar), or
/// `name:bytes` / `name:utf8` for variable-length fields.
pub fn parse_field(s: &str) -> Result<Field> {
    let bad = |why: &str| Error::Config(format!("--field '{s}': {why} (expected name:dtype[:shape], e.g. x:f32:3x4)"));
    let mut parts = s.split(':');
    let name = parts.next().filter(|n| !n.is_empty()).ok_or_else(|| bad("missing name"))?;
    let dtype = parts.next().ok_or_else(|| bad("missing dtype"))?;
    let shape = parts.next().unwrap_or("");
    if parts.next().is_some() {
        return Err(bad("too many ':'"));
    }
    let kind = match dtype {
        "bytes" | "utf8" if shape.is_empty() => FieldKind::Bytes { utf8: dtype == "utf8", elem: None },
        "bytes" | "utf8" => return Err(bad("variable-length fields have no shape")),
        _ => {
            let dtype = DType::parse(dtype).ok_or_else(|| bad(&format!("unknown dtype '{dtype}'")))?;
            let shape = if shape.is_empty() {
                vec![]
            } else {
                shape
                    .split('x')
                    .map(|d| {
                        d.parse::<usize>().ok().filter(|&d| d > 0).ok_or_else(|| bad(&format!("bad dimension '{d}'")))
                    })
                    .collect::<Result<Vec<_>>>()?
            };
            FieldKind::Tensor { dtype, shape }
        }
    };
    Ok(Field { name: name.to_string(), kind })
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenSpec {
    pub format: Format,
    pub samples: u64,
    pub files: u64,
    pub fields: Vec<Field>,
    pub out: PathBuf,
    /// Rows per Arrow record batch.
    pub arrow_batch_rows: u64,
}

impl GenSpec {
    /// Checks the spec against what the format can hold.
    pub fn validate(&self) -> Result<()> {
        if self.fields.is_empty() {
            return Err(Error::Config("at least one --field is required".into()));
        }
        if self.files == 0 || self.files > self.samples.max(1) {
            return Err(Error::Config(format!("--files must be between 1 and --samples ({})", self.samples)));
        }
        for (i, f) in self.fields.iter().enumerate() {
            if self.fields[..i].iter().any(|g| g.name == f.name) {
                return Err(Error::Config(format!("field '{}' is given twice", f.name)));
            }
            if matches!(f.kind, FieldKind::Bytes { .. }) && self.format != Format::Arrow {
                return Err(Error::Config(format!("variable-length field '{}' needs --format arrow", f.name)));
            }
            if let FieldKind::Tensor { shape, .. } = &f.kind {
                if f.fixed_bytes().is_none() {
                    return Err(Error::Config(format!(
                        "field '{}': a sample of shape {} is too large (its size in bytes overflows)",
                        f.name,
                        shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")
                    )));
                }
                // Arrow fixed-size lists have an i32 length.
                if self.format == Format::Arrow && shape.iter().any(|&d| d > i32::MAX as usize) {
                    return Err(Error::Config(format!(
                        "field '{}': Arrow fixed-size lists hold at most {} values per dimension",
                        f.name,
                        i32::MAX
                    )));
                }
            }
        }
        // Each file is written from memory: its size must at least be addressable.
        let record = self.fields.iter().try_fold(0usize, |a, f| a.checked_add(f.fixed_bytes().unwrap_or(0)));
        let per_file = self.file_samples(0);
        match record.and_then(|r| u64::try_from(r).ok()).and_then(|r| r.checked_mul(per_file)) {
            Some(bytes) if usize::try_from(bytes).is_ok() => Ok(()),
            _ => Err(Error::Config(format!(
                "{per_file} samples per file of these fields are too large to write (the size in bytes overflows)"
            ))),
        }
    }

    /// Samples in file `i`: the remainder is spread over the first files.
    pub fn file_samples(&self, i: u64) -> u64 {
        self.samples / self.files + u64::from(i < self.samples % self.files)
    }

    /// Path of file `i`.
    pub fn file_path(&self, i: u64) -> PathBuf {
        self.out.join(format!("part-{i:05}.{}", self.format.extension()))
    }
}

#[cfg(test)]
impl GenSpec {
    /// Writes every file of a dataset of `samples` rows of `fields` in `files` files
    /// (`arrow_batch_rows` rows per Arrow record batch) into a new temporary directory,
    /// which lasts as long as the handle returned with the spec: the tests' dataset.
    pub(crate) fn write_temp(
        format: Format,
        samples: u64,
        files: u64,
        arrow_batch_rows: u64,
        fields: Vec<Field>,
    ) -> (tempfile::TempDir, GenSpec) {
        let dir = tempfile::tempdir().unwrap();
        let spec = GenSpec { format, samples, files, fields, out: dir.path().into(), arrow_batch_rows };
        for i in 0..files {
            write_file(&spec, i).unwrap();
        }
        (dir, spec)
    }
}

/// Writes file `i` of the dataset (ids continue across files).
pub fn write_file(spec: &GenSpec, i: u64) -> Result<u64> {
    let first: u64 = (0..i).map(|j| spec.file_samples(j)).sum();
    let n = spec.file_samples(i);
    let path = spec.file_path(i);
    let fields = &spec.fields;
    let value = |local: u64, fi: usize, out: &mut Vec<u8>| value(fields, first + local, fi, out);
    match spec.format {
        Format::Npy | Format::Raw => write_records(&path, spec.format, fields, n, value)?,
        #[cfg(feature = "hdf5")]
        Format::Hdf5 => hdf5::write(&path, fields, n, value)?,
        #[cfg(not(feature = "hdf5"))]
        Format::Hdf5 => return Err(super::header::hdf5_disabled(&path)),
        Format::Arrow => super::arrow_write::write(&path, fields, n, spec.arrow_batch_rows, value)?,
        Format::WebDataset | Format::Megatron | Format::Parquet => {
            return Err(Error::Config(
                "meshfeed gen writes npy, hdf5, arrow or raw files, not WebDataset, Megatron or Parquet files".into(),
            ))
        }
    }
    Ok(std::fs::metadata(&path).map_err(|e| Error::io(&path, e))?.len())
}

fn write_records(
    path: &Path,
    format: Format,
    fields: &[Field],
    n: u64,
    value: impl Fn(u64, usize, &mut Vec<u8>),
) -> Result<()> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(|e| Error::io(path, e))?;
    let mut w = std::io::BufWriter::new(file);
    let io = |e| Error::io(path, e);
    if format == Format::Npy {
        w.write_all(&npy::header(fields, n)).map_err(io)?;
    }
    let record: usize = fields.iter().filter_map(Field::fixed_bytes).sum();
    let mut rec = Vec::new();
    // An allocation the allocator refuses is an error here, not an abort.
    rec.try_reserve_exact(record).file_context(path, format_args!("cannot allocate a record of {record} bytes"))?;
    for id in 0..n {
        rec.clear();
        for fi in 0..fields.len() {
            value(id, fi, &mut rec);
        }
        w.write_all(&rec).map_err(io)?;
    }
    w.flush().map_err(io)
}

/// Writes the side files of a generated dataset: the manifest, and `schema.json` for raw.
pub fn write_side_files(spec: &GenSpec) -> Result<()> {
    if spec.format == Format::Raw {
        raw::write_schema(&spec.out, &spec.fields)?;
    }
    let m = Manifest { generator: GENERATOR.into(), samples: spec.samples, fields: spec.fields.clone() };
    let p = spec.out.join(MANIFEST);
    std::fs::write(&p, serde_json::to_string_pretty(&m).expect("manifest serialises") + "\n")
        .map_err(|e| Error::io(&p, e))
}

/// Finds the generator manifest of a dataset given as `--data` paths: the manifest in the
/// directory (or the directory of the first file), if any.
pub fn find_manifest(paths: &[PathBuf]) -> Result<Option<Manifest>> {
    let Some(first) = paths.first() else {
        return Ok(None);
    };
    let dir = if first.is_dir() { first.clone() } else { first.parent().map(Path::to_path_buf).unwrap_or_default() };
    let p = dir.join(MANIFEST);
    match std::fs::read_to_string(&p) {
        Ok(text) => {
            let m: Manifest = serde_json::from_str(&text).file_context(&p, "invalid manifest")?;
            Ok((m.generator == GENERATOR).then_some(m))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&p, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_bits_match_ieee() {
        // 1.0 = 0x3c00, 2.0 = 0x4000, 3.0 = 0x4200, 1024 = 0x6400, 2047 = 0x67ff
        assert_eq!(
            [f16_bits(1), f16_bits(2), f16_bits(3), f16_bits(1024), f16_bits(2047)],
            [0x3c00, 0x4000, 0x4200, 0x6400, 0x67ff]
        );
    }

    #[test]
    fn values_follow_the_documented_function() {
        let fields = vec![
            Field::tensor("a", DType::I32, vec![3]),
            Field::tensor("b", DType::U8, vec![]),
            Field { name: "t".into(), kind: FieldKind::Bytes { utf8: true, elem: None } },
        ];
        let mut out = Vec::new();
        value(&fields, 1000, 0, &mut out);
        let got: Vec<i32> = out.chunks(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, vec![1000, 1007, 1014]);
        out.clear();
        value(&fields, 250, 1, &mut out);
        assert_eq!(out, vec![((250 + 13) % 256) as u8]);
        out.clear();
        value(&fields, 3, 2, &mut out);
        assert_eq!(out, b"3:2:abcdefghijklmnopqrstuvw".to_vec());
    }

    #[test]
    fn field_specs() {
        assert_eq!(parse_field("x:f32:3x4").unwrap(), Field::tensor("x", DType::F32, vec![3, 4]));
        assert_eq!(parse_field("y:i64").unwrap(), Field::tensor("y", DType::I64, vec![]));
        assert_eq!(parse_field("t:bytes").unwrap().kind, FieldKind::Bytes { utf8: false, elem: None });
        for bad in ["", "x", "x:q7", "x:f32:3x0", "x:f32:3:4", "t:bytes:3"] {
            assert!(parse_field(bad).is_err(), "{bad}");
        }
    }
}
