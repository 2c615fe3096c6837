//! HDF5 files: every dataset at the file root (or under a group) is a field whose first
//! axis is the sample axis.
//!
//! Chunked and compressed (gzip) datasets written by h5py work: HDF5 itself decodes them.
//! The `hdf5` crate serialises all HDF5 calls behind one lock, so reads are issued as few,
//! large hyperslabs: needed rows are coalesced into spans (see [`super::positional::coalesce`]).
//! Files whose datasets are all contiguous, unfiltered and little-endian (HDF5's default
//! layout, and what `meshfeed gen` writes) skip the library for data: their values lie at
//! fixed offsets and are read with `pread`, like `.npy` records ([`in_place_offsets`]).
//! Readers only open files read-only; set `HDF5_USE_FILE_LOCKING=FALSE` when a writer may
//! hold a file (readers otherwise fail with "unable to lock file, errno = 11").

use std::ops::Range;
use std::path::Path;

use arrow_buffer::Buffer;
use hdf5::types::{FloatSize, IntSize, TypeDescriptor};
use hdf5::{Hyperslab, SliceOrIndex};

use super::positional::{coalesce, Positional};
use super::rows::RowChunk;
use super::schema::{DType, Field};
use crate::config::DatasetOptions;
use crate::error::{Error, Result, ResultExt};

/// Spans closer than this are read through in one hyperslab.
const HDF5_GAP_BYTES: u64 = 1 << 20;

/// The dtype of dataset `name` of the file at `path`, of type `td`.
fn dtype_of(path: &Path, name: &str, td: &TypeDescriptor) -> Result<DType> {
    Ok(match td {
        TypeDescriptor::Boolean => DType::Bool,
        TypeDescriptor::Integer(IntSize::U1) => DType::I8,
        TypeDescriptor::Integer(IntSize::U2) => DType::I16,
        TypeDescriptor::Integer(IntSize::U4) => DType::I32,
        TypeDescriptor::Integer(IntSize::U8) => DType::I64,
        TypeDescriptor::Unsigned(IntSize::U1) => DType::U8,
        TypeDescriptor::Unsigned(IntSize::U2) => DType::U16,
        TypeDescriptor::Unsigned(IntSize::U4) => DType::U32,
        TypeDescriptor::Unsigned(IntSize::U8) => DType::U64,
        TypeDescriptor::Float(FloatSize::U4) => DType::F32,
        TypeDescriptor::Float(FloatSize::U8) => DType::F64,
        other => return Err(Error::file(path, format!("dataset '{name}' has unsupported type {other}"))),
    })
}

/// The message for a datatype the `hdf5` crate cannot describe (its own error says only
/// e.g. "Invalid size of float datatype"): the dataset, the type's size and the reason.
fn undescribable_type(name: &str, dt: &hdf5::Datatype, e: &hdf5::Error) -> String {
    let bytes = dt.size();
    let reason = e.to_string();
    let what = if reason.contains("float") {
        format!("{}-bit float", bytes * 8)
    } else if reason.contains("integer") {
        format!("{}-bit integer", bytes * 8)
    } else {
        format!("{bytes}-byte type")
    };
    let hint = if reason.contains("float") && bytes == 2 {
        " (float16 is not supported in HDF5 files; store float32, or use .npy or Arrow for float16)"
    } else {
        ""
    };
    format!("dataset '{name}' has unsupported type {what}{hint} ({reason})")
}

/// Well-known registered HDF5 filter ids, for messages
/// (<https://github.com/HDFGroup/hdf5_plugins/blob/master/docs/RegisteredFilterPlugins.md>).
fn filter_name(id: i32) -> Option<&'static str> {
    Some(match id {
        1 => "deflate (gzip)",
        2 => "shuffle",
        3 => "fletcher32",
        4 => "szip",
        5 => "nbit",
        6 => "scaleoffset",
        305 => "lzo",
        307 => "bzip2",
        32000 => "lzf",
        32001 => "blosc",
        32004 => "lz4",
        32008 => "bitshuffle",
        32013 => "zfp",
        32015 => "zstd",
        32017 => "sz",
        32026 => "blosc2",
        _ => return None,
    })
}

/// Checks that this HDF5 library can decode every filter of a dataset's pipeline, so that
/// a missing plugin is an error at open naming the filter, not a failed read saying
/// "can't open directory .../plugins".
fn check_filters(path: &Path, name: &str, ds: &hdf5::Dataset) -> Result<()> {
    for filter in ds.filters() {
        let id = filter.id();
        if !(filter.is_available() && filter.decode_enabled()) {
            let named = filter_name(id).map_or_else(|| format!("filter {id}"), |n| format!("filter {id} ({n})"));
            return Err(Error::file(
                path,
                format!(
                    "dataset '{name}' is compressed with HDF5 {named}, which this HDF5 library cannot decode: \
                     install its plugin and set HDF5_PLUGIN_PATH, or rewrite the file without it \
                     (e.g. h5repack -f NONE, or gzip)"
                ),
            ));
        }
    }
    Ok(())
}

fn group_of(file: &hdf5::File, group: Option<&str>) -> hdf5::Result<hdf5::Group> {
    match group {
        Some(g) => file.group(g),
        None => file.group("/"),
    }
}

/// The datasets of a group with their fields, checked to share one sample count.
fn fields_of(path: &Path, file: &hdf5::File, group: Option<&str>) -> Result<(u64, Vec<Field>, Vec<hdf5::Dataset>)> {
    let g = group_of(file, group);
    let g = match group {
        Some(name) => g.file_context(path, format_args!("no group '{name}'"))?,
        None => g.in_file(path)?,
    };
    let datasets = g.datasets().in_file(path)?;
    if datasets.is_empty() {
        return Err(Error::file(path, format!("no datasets in group '{}'", group.unwrap_or("/"))));
    }
    let mut fields = Vec::new();
    let mut samples: Option<(u64, String)> = None;
    for ds in &datasets {
        let name = ds.name().rsplit('/').next().unwrap_or_default().to_string();
        let shape = ds.shape();
        let Some((&n, rest)) = shape.split_first() else {
            return Err(Error::file(path, format!("dataset '{name}' is a scalar: it has no sample axis")));
        };
        match &samples {
            Some((m, first)) if *m != n as u64 => {
                return Err(Error::file(
                    path,
                    format!("datasets '{first}' ({m} samples) and '{name}' ({n} samples) disagree on the sample count"),
                ))
            }
            Some(_) => {}
            None => samples = Some((n as u64, name.clone())),
        }
        let dt = ds.dtype().in_file(path)?;
        let td = dt.to_descriptor().map_err(|e| Error::file_caused(path, undescribable_type(&name, &dt, &e), e))?;
        let dtype = dtype_of(path, &name, &td)?;
        check_filters(path, &name, ds)?;
        let field = Field::tensor(name, dtype, rest.to_vec());
        if field.fixed_bytes().is_none() {
            return Err(Error::file(path, format!("dataset '{}' has samples too large to address", field.name)));
        }
        fields.push(field);
    }
    Ok((samples.map_or(0, |s| s.0), fields, datasets))
}

fn open_file(path: &Path) -> Result<hdf5::File> {
    hdf5::File::open(path).file_context(path, "cannot open as HDF5")
}

/// Reads the sample count and fields of an HDF5 file, and whether its values can be read
/// in place ([`in_place_offsets`]).
pub fn scan(path: &Path, group: Option<&str>) -> Result<(u64, Vec<Field>, bool)> {
    let file = open_file(path)?;
    let (n, fields, datasets) = fields_of(path, &file, group)?;
    let in_place = in_place_offsets(&datasets, &fields).is_some();
    Ok((n, fields, in_place))
}

/// Where each dataset's values start in the file, when every one lies whole at a fixed
/// offset in the bytes this host reads them in: contiguous (not chunked or compact, so
/// unfiltered) with its storage allocated, and little-endian on a little-endian host (a
/// byte of `bool` is an HDF5 enum, read through HDF5). Such values are read with `pread`
/// like `.npy` rows, instead of one HDF5 hyperslab per span of rows.
fn in_place_offsets(datasets: &[hdf5::Dataset], fields: &[Field]) -> Option<Vec<u64>> {
    use hdf5::datatype::ByteOrder;
    datasets
        .iter()
        .zip(fields)
        .map(|(ds, f)| {
            let order = ds.dtype().ok()?.byte_order();
            let native = matches!(order, ByteOrder::LittleEndian | ByteOrder::None) && cfg!(target_endian = "little");
            let boolean = matches!(f.kind, super::schema::FieldKind::Tensor { dtype: DType::Bool, .. });
            let plain = native && !boolean && !ds.is_chunked() && ds.filters().is_empty();
            plain.then(|| ds.offset()).flatten()
        })
        .collect()
}

/// Reads rows of one HDF5 file.
pub struct Hdf5Reader {
    path: std::path::PathBuf,
    // Keeps the file open for the datasets' lifetime.
    _file: hdf5::File,
    datasets: Vec<(hdf5::Dataset, DType, usize)>,
    row_bytes: u64,
    samples: u64,
    /// With every dataset contiguous: the file, read with `pread`, and where each
    /// dataset's values start and how many bytes one sample holds.
    in_place: Option<(std::fs::File, Vec<(u64, u64)>)>,
}

impl Hdf5Reader {
    /// Opens `path`, checking that its datasets are `expected`.
    pub fn open(path: &Path, options: &DatasetOptions, expected: &[Field]) -> Result<Hdf5Reader> {
        let file = open_file(path)?;
        let (samples, fields, datasets) = fields_of(path, &file, options.hdf5_group.as_deref())?;
        if fields != expected {
            return Err(Error::file(path, "fields changed since the dataset was scanned"));
        }
        let row_bytes = fields.iter().filter_map(Field::fixed_bytes).sum::<usize>() as u64;
        let in_place = match in_place_offsets(&datasets, &fields) {
            Some(offsets) => {
                let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
                let sizes = fields.iter().map(|f| f.fixed_bytes().unwrap_or(0) as u64);
                Some((file, offsets.into_iter().zip(sizes).collect()))
            }
            None => None,
        };
        let datasets = datasets
            .into_iter()
            .zip(&fields)
            .map(|(ds, f)| match &f.kind {
                super::schema::FieldKind::Tensor { dtype, shape } => (ds, *dtype, shape.len() + 1),
                super::schema::FieldKind::Bytes { .. } => unreachable!("HDF5 fields are tensors"),
            })
            .collect();
        Ok(Hdf5Reader { path: path.to_path_buf(), _file: file, datasets, row_bytes, samples, in_place })
    }
}

fn read_span(ds: &hdf5::Dataset, dtype: DType, ndim: usize, rows: Range<u64>) -> hdf5::Result<Buffer> {
    let mut sel = vec![SliceOrIndex::from(rows.start as usize..rows.end as usize)];
    sel.extend((1..ndim).map(|_| SliceOrIndex::from(..)));
    let sel = Hyperslab::from(sel);
    macro_rules! typed {
        ($t:ty) => {{
            let a = ds.read_slice::<$t, _, ndarray::IxDyn>(sel)?;
            Buffer::from_vec(a.into_raw_vec_and_offset().0)
        }};
    }
    Ok(match dtype {
        DType::Bool => {
            let a = ds.read_slice::<bool, _, ndarray::IxDyn>(sel)?;
            Buffer::from_vec(a.iter().map(|&b| b as u8).collect::<Vec<u8>>())
        }
        DType::U8 => typed!(u8),
        DType::I8 => typed!(i8),
        DType::U16 => typed!(u16),
        DType::I16 => typed!(i16),
        DType::U32 => typed!(u32),
        DType::I32 => typed!(i32),
        DType::U64 => typed!(u64),
        DType::I64 => typed!(i64),
        DType::F32 => typed!(f32),
        DType::F64 => typed!(f64),
        DType::F16 => unreachable!("HDF5 float16 is rejected at scan time"),
    })
}

impl super::reader::FileReader for Hdf5Reader {
    fn value_range(&self, row: u64, field: usize) -> Option<Range<u64>> {
        let (offset, n) = *self.in_place.as_ref()?.1.get(field)?;
        (row < self.samples).then(|| offset + row * n..offset + (row + 1) * n)
    }

    /// Only where the datasets lie in place: the others are read through the library.
    fn positional(&self) -> Option<Positional<'_>> {
        self.in_place.as_ref().map(|(file, _)| Positional { file, path: &self.path })
    }

    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let all: Vec<usize> = (0..self.datasets.len()).collect();
        self.read_columns(rows, &all)
    }

    /// Only the datasets of `columns` are read.
    fn read_columns(&mut self, rows: &[u64], columns: &[usize]) -> Result<RowChunk> {
        let mut chunk = RowChunk::new(columns.len());
        if let Some(&last) = rows.last().filter(|&&r| r >= self.samples) {
            return Err(Error::file(
                &self.path,
                format!("row {last} is past the end of the file ({} rows)", self.samples),
            ));
        }
        let spans = coalesce(rows, self.row_bytes, HDF5_GAP_BYTES);
        // Values are pushed field-major (all rows of one dataset, then the next) because
        // each dataset is read as its own hyperslab; transposed at the end.
        for &d in columns {
            let Some((ds, dtype, ndim)) = self.datasets.get(d) else {
                return Err(Error::Internal(format!("dataset {d} of a file of {}", self.datasets.len())));
            };
            let value_bytes = ds.size() / ds.shape()[0].max(1) * dtype.size();
            let mut next = rows.iter().peekable();
            for span in &spans {
                let buf = match &self.in_place {
                    Some((file, layout)) => {
                        let (offset, n) = layout[d];
                        let at = offset + span.start * n;
                        let file = Positional { file, path: &self.path };
                        Buffer::from_vec(file.read_span(at..at + (span.end - span.start) * n)?)
                    }
                    None => read_span(ds, *dtype, *ndim, span.clone())
                        .file_context(&self.path, format_args!("reading rows {}..{}", span.start, span.end))?,
                };
                let b = chunk.add_buffer(buf);
                while let Some(&&r) = next.peek() {
                    if r >= span.end {
                        break;
                    }
                    chunk.push_value(b, (r - span.start) as usize * value_bytes, value_bytes);
                    next.next();
                }
            }
        }
        chunk.transpose_from_field_major(rows.len());
        Ok(chunk)
    }
}

/// Writes `fields` of `samples` samples to an HDF5 file, one dataset per field; `value`
/// fills the bytes of each sample's value.
pub fn write(
    path: &Path,
    fields: &[Field],
    samples: u64,
    mut value: impl FnMut(u64, usize, &mut Vec<u8>),
) -> Result<()> {
    let file = hdf5::File::create(path).in_file(path)?;
    for (fi, f) in fields.iter().enumerate() {
        let super::schema::FieldKind::Tensor { dtype, shape } = &f.kind else {
            return Err(Error::Config(format!("HDF5 output cannot hold variable-length field '{}'", f.name)));
        };
        let mut bytes = Vec::new();
        // An allocation the allocator refuses is an error here, not an abort.
        let need = f.fixed_bytes().and_then(|b| b.checked_mul(usize::try_from(samples).ok()?));
        need.and_then(|n| bytes.try_reserve_exact(n).ok()).ok_or_else(|| {
            Error::file(path, format!("cannot hold {samples} samples of field '{}' in memory to write them", f.name))
        })?;
        for id in 0..samples {
            value(id, fi, &mut bytes);
        }
        let mut dims = vec![samples as usize];
        dims.extend(shape);
        macro_rules! write_typed {
            ($t:ty) => {{
                let data: Vec<$t> = bytes
                    .chunks_exact(std::mem::size_of::<$t>())
                    .map(|c| <$t>::from_le_bytes(c.try_into().expect("exact chunk")))
                    .collect();
                let arr = ndarray::ArrayD::from_shape_vec(dims, data).expect("shape matches data");
                file.new_dataset_builder().with_data(&arr).create(f.name.as_str()).in_file(path)?;
            }};
        }
        match dtype {
            DType::Bool => {
                let data: Vec<bool> = bytes.iter().map(|&b| b != 0).collect();
                let arr = ndarray::ArrayD::from_shape_vec(dims, data).expect("shape matches data");
                file.new_dataset_builder().with_data(&arr).create(f.name.as_str()).in_file(path)?;
            }
            DType::U8 => write_typed!(u8),
            DType::I8 => write_typed!(i8),
            DType::U16 => write_typed!(u16),
            DType::I16 => write_typed!(i16),
            DType::U32 => write_typed!(u32),
            DType::I32 => write_typed!(i32),
            DType::U64 => write_typed!(u64),
            DType::I64 => write_typed!(i64),
            DType::F32 => write_typed!(f32),
            DType::F64 => write_typed!(f64),
            DType::F16 => return Err(Error::Config(format!("HDF5 output does not support f16 (field '{}')", f.name))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::reader::FileReader;

    fn fields() -> Vec<Field> {
        vec![Field::tensor("x", DType::U16, vec![3]), Field::tensor("y", DType::I64, vec![])]
    }

    /// Sample `id`'s value of field `f`: little-endian bytes that name both.
    fn value(id: u64, f: usize, out: &mut Vec<u8>) {
        match f {
            0 => (0..3).for_each(|k| out.extend((id as u16 * 10 + k).to_le_bytes())),
            _ => out.extend((-(id as i64)).to_le_bytes()),
        }
    }

    #[test]
    fn contiguous_datasets_are_read_in_place_and_agree_with_hyperslabs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.h5");
        write(&path, &fields(), 20, value).unwrap();
        let (n, f, in_place) = scan(&path, None).unwrap();
        assert_eq!((n, &f, in_place), (20, &fields(), true));
        let mut reader = Hdf5Reader::open(&path, &Default::default(), &fields()).unwrap();
        // Rows read through pread spans are the values written.
        let chunk = reader.read_rows(&[0, 7, 19]).unwrap();
        for (i, id) in [0u64, 7, 19].into_iter().enumerate() {
            for fi in 0..2 {
                let mut want = Vec::new();
                value(id, fi, &mut want);
                assert_eq!(chunk.value(i, fi), &want[..], "row {id} field {fi}");
                // And so are single values read at their offsets.
                let range = reader.value_range(id, fi).unwrap();
                let mut got = vec![0u8; (range.end - range.start) as usize];
                reader.positional().unwrap().read_at(range.start, &mut got).unwrap();
                assert_eq!(got, want, "row {id} field {fi} in place");
            }
        }
        assert_eq!(reader.value_range(20, 0), None, "past the end");
        // A file cut short is an error naming it, never zeros.
        let len = std::fs::metadata(&path).unwrap().len();
        let range = reader.value_range(19, 1).unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(range.start + 2).unwrap();
        let mut got = [0u8; 8];
        let err = reader.positional().unwrap().read_at(range.start, &mut got).unwrap_err().to_string();
        assert!(err.contains("a.h5") && err.contains("truncated"), "{err} (file of {len} bytes)");
    }

    #[test]
    fn chunked_or_boolean_datasets_are_read_through_hdf5() {
        let dir = tempfile::tempdir().unwrap();
        let chunked = dir.path().join("chunked.h5");
        {
            let file = hdf5::File::create(&chunked).unwrap();
            let data = ndarray::Array1::from_iter(0..64i64);
            file.new_dataset_builder().chunk(16).with_data(&data).create("y").unwrap();
        }
        let (n, _, in_place) = scan(&chunked, None).unwrap();
        assert_eq!((n, in_place), (64, false));
        let y = vec![Field::tensor("y", DType::I64, vec![])];
        let mut reader = Hdf5Reader::open(&chunked, &Default::default(), &y).unwrap();
        assert_eq!(reader.value_range(3, 0), None);
        assert_eq!(reader.read_rows(&[3]).unwrap().value(0, 0), &3i64.to_le_bytes());
        let boolean = dir.path().join("bool.h5");
        let b = vec![Field::tensor("b", DType::Bool, vec![])];
        write(&boolean, &b, 4, |id, _, out| out.push((id % 2) as u8)).unwrap();
        assert!(!scan(&boolean, None).unwrap().2, "HDF5 booleans are enums, converted by HDF5");
    }
}
