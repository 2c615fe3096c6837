//! NumPy `.npy` files: C-order, little-endian arrays whose first axis is the sample axis.
//!
//! A plain dtype gives one field named `data` with shape `arr.shape[1:]`; a structured
//! dtype gives one field per member (with its sub-array shape), and unnamed padding
//! members (`('', '|V4')`) are skipped. Format reference:
//! <https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html>.

use std::io::Read;
use std::ops::Range;
use std::path::Path;

use super::npy_header::{parse_preamble, PreambleError, PyValue, MAX_PREAMBLE_LEN};
use super::records::{RecordFile, RecordLayout};
use super::schema::{DType, Field};
use crate::error::{Error, Result, ResultExt};

/// Reads the header: sample count and fields.
pub fn scan(path: &Path) -> Result<(u64, Vec<Field>)> {
    let l = layout(path)?;
    Ok((l.samples, l.fields))
}

/// Reads and parses the preamble: a first small read, then exactly the rest of a longer
/// header — never the data behind it (on cold shared storage a scan that read ahead into
/// the data would cost as much as the first epoch's reads).
fn read_preamble(file: std::fs::File, path: &Path) -> Result<super::npy_header::NpyPreamble> {
    const FIRST_READ: u64 = 4096;
    let mut head = Vec::new();
    let mut file = file.take(FIRST_READ);
    file.read_to_end(&mut head).map_err(|e| Error::io(path, e))?;
    let parsed = match parse_preamble(&head) {
        Err(PreambleError::Truncated { needed, .. }) if head.len() as u64 == FIRST_READ => {
            let rest = needed.min(MAX_PREAMBLE_LEN as u64) - FIRST_READ;
            let mut file = file.into_inner().take(rest);
            file.read_to_end(&mut head).map_err(|e| Error::io(path, e))?;
            parse_preamble(&head)
        }
        parsed => parsed,
    };
    parsed.in_file(path)
}

/// Opens a `.npy` file for reading rows, checking that its fields are `expected`.
pub fn open(path: &Path, expected: &[Field]) -> Result<RecordFile> {
    layout(path)?.open(path, expected)
}

fn layout(path: &Path) -> Result<RecordLayout> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let pre = read_preamble(file, path)?;
    let bad = |reason: String| Error::file(path, reason);

    if pre.shape.is_empty() {
        return Err(bad("a 0-d array has no sample axis".into()));
    }
    if pre.fortran_order && pre.shape.len() > 2 || pre.fortran_order && pre.shape.len() == 2 && pre.shape[1] > 1 {
        return Err(bad("Fortran-order arrays are not supported (save with C order)".into()));
    }
    let samples = pre.shape[0];
    let sample_shape: Vec<usize> = pre.shape[1..]
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad(format!("dimension {d} is too large"))))
        .collect::<Result<_>>()?;

    let (fields, ranges, record_bytes) = match &pre.descr {
        PyValue::Str(s) => {
            let dtype = parse_typestr(s).in_file(path)?;
            let field = Field::tensor("data", dtype, sample_shape);
            let n = field.fixed_bytes().ok_or_else(|| bad("sample size overflows".into()))?;
            (vec![field], vec![0..n], n)
        }
        PyValue::List(members) => {
            if !sample_shape.is_empty() {
                return Err(bad("structured arrays must be one-dimensional (one record per sample)".into()));
            }
            structured_fields(path, members)?
        }
        other => return Err(bad(format!("unsupported descr {other:?}"))),
    };
    let record_bytes = record_bytes as u64;
    if record_bytes == 0 {
        // Nothing bounds the sample count of zero-byte samples by the file size, and the
        // count sizes per-sample work (the permutation, the verifier's bitmap).
        return Err(bad(format!("samples of zero bytes are not supported (shape {:?})", pre.shape)));
    }
    let data_bytes = samples
        .checked_mul(record_bytes)
        .ok_or_else(|| bad(format!("{samples} samples of {record_bytes} bytes overflow")))?;
    let have = file_len.saturating_sub(pre.data_offset);
    if have < data_bytes {
        return Err(bad(format!(
            "truncated: the header promises {samples} samples of {record_bytes} bytes ({data_bytes} bytes of data) but the file holds only {have}"
        )));
    }
    Ok(RecordLayout { samples, data_offset: pre.data_offset, record_bytes, fields, ranges })
}

/// Fields, their byte ranges in a record, and the record size (padding included), of the
/// structured dtype of the file at `path` with `members`.
fn structured_fields(path: &Path, members: &[PyValue]) -> Result<(Vec<Field>, Vec<Range<usize>>, usize)> {
    let bad = |reason: String| Error::file(path, reason);
    let too_large = || bad("record too large".into());
    let mut fields = Vec::new();
    let mut ranges = Vec::new();
    let mut offset = 0usize;
    for m in members {
        let PyValue::Tuple(parts) = m else {
            return Err(bad(format!("unsupported structured member {m:?}")));
        };
        let (name, typestr) = match (parts.first(), parts.get(1)) {
            (Some(PyValue::Str(n)), Some(PyValue::Str(t))) => (n, t),
            (Some(PyValue::Str(n)), Some(PyValue::List(_))) => {
                return Err(bad(format!("nested structured member '{n}' is not supported")))
            }
            _ => return Err(bad(format!("unsupported structured member {m:?}"))),
        };
        let shape: Vec<usize> = match parts.get(2) {
            None => vec![],
            Some(PyValue::Tuple(dims)) => dims
                .iter()
                .map(|d| match d {
                    PyValue::Int(i) => usize::try_from(*i).map_err(|_| bad(format!("bad dimension {i} in '{name}'"))),
                    _ => Err(bad(format!("bad shape of '{name}'"))),
                })
                .collect::<Result<_>>()?,
            Some(PyValue::Int(i)) => {
                vec![usize::try_from(*i).map_err(|_| bad(format!("bad dimension {i} in '{name}'")))?]
            }
            Some(_) => return Err(bad(format!("bad shape of '{name}'"))),
        };
        if name.is_empty() {
            // Padding inserted by NumPy for aligned structs: skip its bytes.
            let n: usize = typestr
                .trim_start_matches('|')
                .strip_prefix('V')
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| bad(format!("unnamed member of type {typestr} is not padding")))?;
            let pad = shape.iter().try_fold(n, |a, &d| a.checked_mul(d)).ok_or_else(too_large)?;
            offset = offset.checked_add(pad).ok_or_else(too_large)?;
            continue;
        }
        let dtype = parse_typestr(typestr).file_context(path, format_args!("member '{name}'"))?;
        let field = Field::tensor(name.clone(), dtype, shape);
        let len = field.fixed_bytes().ok_or_else(|| bad(format!("member '{name}' is too large")))?;
        let end = offset.checked_add(len).ok_or_else(too_large)?;
        ranges.push(offset..end);
        offset = end;
        fields.push(field);
    }
    if fields.is_empty() {
        return Err(bad("structured dtype has no named members".into()));
    }
    Ok((fields, ranges, offset))
}

/// Why a NumPy type string names no dtype meshfeed reads; each holds the type string.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum TypestrError {
    /// A kind or size meshfeed has no dtype for (complex, strings, objects, dates...).
    #[error("unsupported dtype '{0}'")]
    Unsupported(String),
    /// A multi-byte dtype stored big-endian; `rest` is the type string past its byte order.
    #[error("big-endian dtype '{typestr}' is not supported (convert with arr.astype('<{rest}'))")]
    BigEndian { typestr: String, rest: String },
}

/// Parses a NumPy array-protocol type string such as `<f4`, `|u1`, `|b1`.
fn parse_typestr(s: &str) -> std::result::Result<DType, TypestrError> {
    let (order, rest) = match s.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (c, &s[1..]),
        _ => ('=', s),
    };
    let dtype = match rest {
        "b1" | "?" => DType::Bool,
        "u1" | "B" => DType::U8,
        "i1" | "b" => DType::I8,
        "u2" => DType::U16,
        "i2" => DType::I16,
        "u4" => DType::U32,
        "i4" => DType::I32,
        "u8" => DType::U64,
        "i8" => DType::I64,
        "f2" => DType::F16,
        "f4" => DType::F32,
        "f8" => DType::F64,
        _ => return Err(TypestrError::Unsupported(s.into())),
    };
    if order == '>' && dtype.size() > 1 {
        return Err(TypestrError::BigEndian { typestr: s.into(), rest: rest.into() });
    }
    Ok(dtype)
}

/// Writes a `.npy` header (version 1.0) for `samples` records of `fields`; the caller
/// appends the record bytes. One unnamed field `data` gives a plain array.
pub fn header(fields: &[Field], samples: u64) -> Vec<u8> {
    fn typestr(d: DType) -> String {
        let kind = match d {
            DType::Bool => "b",
            DType::U8 | DType::U16 | DType::U32 | DType::U64 => "u",
            DType::I8 | DType::I16 | DType::I32 | DType::I64 => "i",
            DType::F16 | DType::F32 | DType::F64 => "f",
        };
        let order = if d.size() == 1 { '|' } else { '<' };
        format!("{order}{kind}{}", d.size())
    }
    fn tuple(dims: impl Iterator<Item = String>) -> String {
        let dims: Vec<String> = dims.collect();
        match dims.len() {
            1 => format!("({},)", dims[0]),
            _ => format!("({})", dims.join(", ")),
        }
    }
    let plain = fields.len() == 1 && fields[0].name == "data";
    let (descr, shape) = if plain {
        let super::schema::FieldKind::Tensor { dtype, shape } = &fields[0].kind else {
            unreachable!("tensor checked by caller")
        };
        let dims = std::iter::once(samples.to_string()).chain(shape.iter().map(|d| d.to_string()));
        (format!("'{}'", typestr(*dtype)), tuple(dims))
    } else {
        let members: Vec<String> = fields
            .iter()
            .map(|f| {
                let super::schema::FieldKind::Tensor { dtype, shape } = &f.kind else {
                    unreachable!("tensor checked by caller")
                };
                if shape.is_empty() {
                    format!("('{}', '{}')", f.name, typestr(*dtype))
                } else {
                    format!("('{}', '{}', {})", f.name, typestr(*dtype), tuple(shape.iter().map(|d| d.to_string())))
                }
            })
            .collect();
        (format!("[{}]", members.join(", ")), tuple(std::iter::once(samples.to_string())))
    };
    let mut dict = format!("{{'descr': {descr}, 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so that the data starts at a multiple of 64 bytes, ending with '\n'.
    let unpadded = 10 + dict.len() + 1;
    dict.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    dict.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((dict.len() as u16).to_le_bytes());
    out.extend(dict.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::reader::FileReader;

    #[test]
    fn typestrs() {
        assert_eq!(parse_typestr("<f4"), Ok(DType::F32));
        assert_eq!(parse_typestr("|b1"), Ok(DType::Bool));
        assert_eq!(parse_typestr("|u1"), Ok(DType::U8));
        assert!(parse_typestr(">f8").unwrap_err().to_string().contains("big-endian"));
        assert!(parse_typestr("<c8").unwrap_err().to_string().contains("unsupported"));
    }

    #[test]
    fn written_header_round_trips_plain_and_structured() {
        let dir = tempfile::tempdir().unwrap();
        for fields in [
            vec![Field::tensor("data", DType::F32, vec![3, 2])],
            vec![
                Field::tensor("x", DType::F32, vec![4]),
                Field::tensor("y", DType::I64, vec![]),
                Field::tensor("z", DType::U8, vec![2, 3]),
            ],
        ] {
            let rec: usize = fields.iter().map(|f| f.fixed_bytes().unwrap()).sum();
            let p = dir.path().join("t.npy");
            let mut bytes = header(&fields, 5);
            assert_eq!(bytes.len() % 64, 0);
            bytes.extend((0..5 * rec).map(|i| i as u8));
            std::fs::write(&p, &bytes).unwrap();
            let (n, got) = scan(&p).unwrap();
            assert_eq!((n, &got), (5, &fields));
            let mut r = open(&p, &fields).unwrap();
            let c = r.read_rows(&[1, 4]).unwrap();
            let first = c.value(0, 0);
            assert_eq!(first[0] as usize, rec, "row 1 starts at byte {rec}");
            // Truncation is found at scan time.
            std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
            let err = scan(&p).unwrap_err().to_string();
            assert!(err.contains("t.npy") && err.contains("truncated"), "{err}");
        }
    }

    /// Bytes this thread has read through `read`-like calls so far.
    fn thread_rchar() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines().find_map(|l| l.strip_prefix("rchar: ")).unwrap().parse().unwrap()
    }

    #[test]
    fn a_scan_reads_the_header_and_not_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.npy");
        // A short header (one read) and one longer than the first read (two reads).
        for fields in [
            vec![Field::tensor("data", DType::U8, vec![4096])],
            (0..400).map(|i| Field::tensor(format!("field{i}"), DType::U8, vec![8])).collect(),
        ] {
            let rec: usize = fields.iter().map(|f| f.fixed_bytes().unwrap()).sum();
            let samples = (4 << 20) / rec as u64 + 1;
            let mut bytes = header(&fields, samples);
            let header_len = bytes.len() as u64;
            bytes.resize(bytes.len() + rec * samples as usize, 7);
            std::fs::write(&p, &bytes).unwrap();
            let before = thread_rchar();
            let (n, got) = scan(&p).unwrap();
            let read = thread_rchar() - before;
            assert_eq!((n, got.len()), (samples, fields.len()));
            assert!(read <= header_len.max(4096) + 4096, "a scan of a {header_len}-byte header read {read} bytes");
        }
    }

    #[test]
    fn oversized_padding_is_an_error_not_an_overflow() {
        for text in
            ["[('a', '|u1'), ('', '|V18446744073709551615', (2,))]", "[('', '|V18446744073709551615'), ('a', '|u1')]"]
        {
            let PyValue::List(members) = super::super::npy_header::parse_py_literal(text).unwrap() else {
                unreachable!()
            };
            let err = structured_fields(Path::new("t.npy"), &members).unwrap_err();
            assert!(matches!(&err, Error::File { reason, .. } if reason == "record too large"), "{text}: {err}");
        }
    }

    #[test]
    fn padding_members_are_skipped() {
        let members =
            match super::super::npy_header::parse_py_literal("[('a', '|u1'), ('', '|V3'), ('b', '<i4')]").unwrap() {
                PyValue::List(m) => m,
                _ => unreachable!(),
            };
        let (fields, ranges, record) = structured_fields(Path::new("t.npy"), &members).unwrap();
        assert_eq!(fields.len(), 2);
        assert_eq!((ranges, record), (vec![0..1, 4..8], 8));
    }
}
