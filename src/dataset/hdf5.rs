//! HDF5 files: every dataset at the file root (or under a group) is a field whose first
//! axis is the sample axis.
//!
//! Chunked and compressed (gzip) datasets written by h5py work: HDF5 itself decodes them.
//! The `hdf5` crate serialises all HDF5 calls behind one lock, so reads are issued as few,
//! large hyperslabs: needed rows are coalesced into spans (see [`super::rows::coalesce`]).
//! Readers only open files read-only; set `HDF5_USE_FILE_LOCKING=FALSE` when a writer may
//! hold a file (readers otherwise fail with "unable to lock file, errno = 11").

use std::ops::Range;
use std::path::Path;

use arrow_buffer::Buffer;
use hdf5::types::{FloatSize, IntSize, TypeDescriptor};
use hdf5::{Hyperslab, SliceOrIndex};

use super::rows::{coalesce, RowChunk};
use super::schema::{DType, Field};
use super::DatasetOptions;
use crate::error::{Error, Result};

/// Spans closer than this are read through in one hyperslab.
const HDF5_GAP_BYTES: u64 = 1 << 20;

fn dtype_of(name: &str, td: &TypeDescriptor) -> std::result::Result<DType, String> {
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
        other => return Err(format!("dataset '{name}' has unsupported type {other}")),
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
fn check_filters(name: &str, ds: &hdf5::Dataset) -> std::result::Result<(), String> {
    for filter in ds.filters() {
        let id = filter.id();
        if !(filter.is_available() && filter.decode_enabled()) {
            let named = filter_name(id).map_or_else(|| format!("filter {id}"), |n| format!("filter {id} ({n})"));
            return Err(format!(
                "dataset '{name}' is compressed with HDF5 {named}, which this HDF5 library cannot decode: \
                 install its plugin and set HDF5_PLUGIN_PATH, or rewrite the file without it \
                 (e.g. h5repack -f NONE, or gzip)"
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
    let h5err = |e: hdf5::Error| Error::file(path, e.to_string());
    let g = group_of(file, group).map_err(|e| match group {
        Some(name) => Error::file(path, format!("no group '{name}': {e}")),
        None => h5err(e),
    })?;
    let datasets = g.datasets().map_err(h5err)?;
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
        let dt = ds.dtype().map_err(h5err)?;
        let td = dt.to_descriptor().map_err(|e| Error::file(path, undescribable_type(&name, &dt, &e)))?;
        let dtype = dtype_of(&name, &td).map_err(|r| Error::file(path, r))?;
        check_filters(&name, ds).map_err(|r| Error::file(path, r))?;
        let field = Field::tensor(name, dtype, rest.to_vec());
        if field.fixed_bytes().is_none() {
            return Err(Error::file(path, format!("dataset '{}' has samples too large to address", field.name)));
        }
        fields.push(field);
    }
    Ok((samples.map_or(0, |s| s.0), fields, datasets))
}

fn open_file(path: &Path) -> Result<hdf5::File> {
    hdf5::File::open(path).map_err(|e| Error::file(path, format!("cannot open as HDF5: {e}")))
}

/// Reads the sample count and fields of an HDF5 file.
pub fn scan(path: &Path, group: Option<&str>) -> Result<(u64, Vec<Field>)> {
    let file = open_file(path)?;
    let (n, fields, _) = fields_of(path, &file, group)?;
    Ok((n, fields))
}

/// Reads rows of one HDF5 file.
pub struct Hdf5Reader {
    path: std::path::PathBuf,
    // Keeps the file open for the datasets' lifetime.
    _file: hdf5::File,
    datasets: Vec<(hdf5::Dataset, DType, usize)>,
    row_bytes: u64,
    samples: u64,
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
        let datasets = datasets
            .into_iter()
            .zip(&fields)
            .map(|(ds, f)| match &f.kind {
                super::FieldKind::Tensor { dtype, shape } => (ds, *dtype, shape.len() + 1),
                super::FieldKind::Bytes { .. } => unreachable!("HDF5 fields are tensors"),
            })
            .collect();
        Ok(Hdf5Reader { path: path.to_path_buf(), _file: file, datasets, row_bytes, samples })
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

impl super::FileReader for Hdf5Reader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let mut chunk = RowChunk::new(self.datasets.len());
        if let Some(&last) = rows.last().filter(|&&r| r >= self.samples) {
            return Err(Error::file(
                &self.path,
                format!("row {last} is past the end of the file ({} rows)", self.samples),
            ));
        }
        let spans = coalesce(rows, self.row_bytes, HDF5_GAP_BYTES);
        // Values are pushed field-major (all rows of one dataset, then the next) because
        // each dataset is read as its own hyperslab; transposed at the end.
        for (ds, dtype, ndim) in &self.datasets {
            let value_bytes = ds.size() / ds.shape()[0].max(1) * dtype.size();
            let mut next = rows.iter().peekable();
            for span in &spans {
                let buf = read_span(ds, *dtype, *ndim, span.clone())
                    .map_err(|e| Error::file(&self.path, format!("reading rows {}..{}: {e}", span.start, span.end)))?;
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
    let h5err = |e: hdf5::Error| Error::file(path, e.to_string());
    let file = hdf5::File::create(path).map_err(h5err)?;
    for (fi, f) in fields.iter().enumerate() {
        let super::FieldKind::Tensor { dtype, shape } = &f.kind else {
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
                file.new_dataset_builder().with_data(&arr).create(f.name.as_str()).map_err(h5err)?;
            }};
        }
        match dtype {
            DType::Bool => {
                let data: Vec<bool> = bytes.iter().map(|&b| b != 0).collect();
                let arr = ndarray::ArrayD::from_shape_vec(dims, data).expect("shape matches data");
                file.new_dataset_builder().with_data(&arr).create(f.name.as_str()).map_err(h5err)?;
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
