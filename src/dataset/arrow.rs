//! Arrow IPC files: each column is a field.
//!
//! Column types: primitive → scalar tensor; fixed-size list of primitive (nested lists
//! give more dimensions) → tensor; fixed-size binary → `u8` tensor; binary / utf8 (and
//! their large variants) → variable-length bytes. Nulls, dictionaries and booleans
//! (bit-packed) are rejected with a clear error.
//!
//! Only the footer and each record batch's message header are read at scan time (the
//! row count of every batch), so scanning does not read the data. Reading rows loads
//! just the record batches that hold them, through arrow-ipc's [`FileDecoder`] (explicit
//! random access, as `FileReader::set_index` would give).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{Array, RecordBatch};
use arrow_buffer::Buffer;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{Block, MetadataVersion};
use arrow_schema::{DataType, Schema};

use super::rows::RowChunk;
use super::schema::{DType, Field, FieldKind};
use crate::error::{Error, Result};

thread_local! {
    static DECODING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is inside arrow-ipc's record batch decoder. Some corrupt inputs
/// make the decoder panic (failed asserts on buffer alignment) instead of returning an
/// error; those panics are caught and turned into errors naming the file, and panic hooks
/// (which abort the MPI job) must let them pass: they check this first.
pub fn decoding_untrusted_input() -> bool {
    DECODING.with(|d| d.get())
}

/// Runs `f` (a decoder call), turning a panic into `Err(message)`.
fn decode_guarded<R>(f: impl FnOnce() -> R) -> std::result::Result<R, String> {
    DECODING.with(|d| d.set(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    DECODING.with(|d| d.set(false));
    result.map_err(|p| {
        p.downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    })
}

/// What the footer of an Arrow file says.
struct Footer {
    schema: Arc<Schema>,
    version: MetadataVersion,
    blocks: Vec<Block>,
    /// Rows of each record batch.
    batch_rows: Vec<u64>,
}

fn read_at(file: &File, path: &Path, offset: u64, len: u64, what: &str) -> Result<Vec<u8>> {
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(Error::file(
            path,
            format!("corrupt: {what} ({len} bytes at {offset}) lies past the end of the file ({file_len} bytes)"),
        ));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset).map_err(|e| Error::io(path, e))?;
    Ok(buf)
}

fn read_footer(file: &File, path: &Path) -> Result<Footer> {
    let corrupt = |r: String| Error::file(path, format!("corrupt Arrow IPC file: {r}"));
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if file_len < 18 {
        return Err(corrupt(format!("only {file_len} bytes")));
    }
    let head = read_at(file, path, 0, 6, "magic")?;
    if head != b"ARROW1" {
        return Err(Error::file(
            path,
            "not an Arrow IPC file (bad magic; streams are not supported, write the file format)",
        ));
    }
    let tail: [u8; 10] = read_at(file, path, file_len - 10, 10, "trailer")?.try_into().expect("10 bytes");
    let footer_len = arrow_ipc::reader::read_footer_length(tail).map_err(|e| corrupt(e.to_string()))? as u64;
    if footer_len > file_len - 18 {
        return Err(corrupt(format!("footer length {footer_len} exceeds the file size {file_len}")));
    }
    let fbytes = read_at(file, path, file_len - 10 - footer_len, footer_len, "footer")?;
    let footer = arrow_ipc::root_as_footer(&fbytes).map_err(|e| corrupt(format!("footer: {e}")))?;
    let schema = footer.schema().ok_or_else(|| corrupt("footer has no schema".into()))?;
    let schema = arrow_ipc::convert::try_fb_to_schema(schema).map_err(|e| corrupt(e.to_string()))?;
    if footer.dictionaries().is_some_and(|d| !d.is_empty()) {
        return Err(Error::file(path, "dictionary-encoded columns are not supported"));
    }
    let blocks: Vec<Block> = footer.recordBatches().map(|b| b.iter().copied().collect()).unwrap_or_default();
    let mut batch_rows = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let meta_len = u64::try_from(block.metaDataLength())
            .map_err(|_| corrupt(format!("batch {i}: negative metadata length")))?;
        let offset = u64::try_from(block.offset()).map_err(|_| corrupt(format!("batch {i}: negative offset")))?;
        let meta = read_at(file, path, offset, meta_len, &format!("batch {i} header"))?;
        let body = match meta.get(..4) {
            Some([0xff, 0xff, 0xff, 0xff]) => meta.get(8..),
            Some(_) => meta.get(4..),
            None => None,
        }
        .ok_or_else(|| corrupt(format!("batch {i}: header too short")))?;
        let msg = arrow_ipc::root_as_message(body).map_err(|e| corrupt(format!("batch {i} header: {e}")))?;
        let rb = msg.header_as_record_batch().ok_or_else(|| corrupt(format!("batch {i} is not a record batch")))?;
        let rows = u64::try_from(rb.length()).map_err(|_| corrupt(format!("batch {i}: negative length")))?;
        // Never trust a row count beyond what the body could hold (every column takes at
        // least one bit per row): it sizes the id space and the verifier's bitmap.
        let body =
            u64::try_from(block.bodyLength()).map_err(|_| corrupt(format!("batch {i}: negative body length")))?;
        if rows > body.saturating_mul(8).max(64) {
            return Err(corrupt(format!("batch {i} claims {rows} rows in a {body}-byte body")));
        }
        // arrow-ipc slices the body at the offsets the header gives and panics when they
        // lie outside it: check every buffer here, so a corrupt header is an error.
        for (k, buf) in rb.buffers().into_iter().flatten().enumerate() {
            let end = buf.offset().checked_add(buf.length());
            if buf.offset() < 0 || buf.length() < 0 || end.is_none_or(|e| e as u64 > body) {
                return Err(corrupt(format!(
                    "batch {i} buffer {k} ({} bytes at {}) lies outside the {body}-byte body",
                    buf.length(),
                    buf.offset()
                )));
            }
        }
        for (k, node) in rb.nodes().into_iter().flatten().enumerate() {
            // Every value takes at least one bit of the body.
            if node.length() < 0 || node.null_count() < 0 || node.length() as u64 > body.saturating_mul(8).max(64) {
                return Err(corrupt(format!("batch {i} field node {k} has a bad length {}", node.length())));
            }
        }
        batch_rows.push(rows);
    }
    Ok(Footer { schema: Arc::new(schema), version: footer.version(), blocks, batch_rows })
}

fn primitive(dt: &DataType) -> Option<DType> {
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

fn field_kind(name: &str, dt: &DataType) -> std::result::Result<FieldKind, String> {
    if let Some(d) = primitive(dt) {
        return Ok(FieldKind::Tensor { dtype: d, shape: vec![] });
    }
    match dt {
        DataType::FixedSizeList(child, n) => match field_kind(name, child.data_type())? {
            FieldKind::Tensor { dtype, mut shape } => {
                shape.insert(0, usize::try_from(*n).map_err(|_| format!("column '{name}': bad list size {n}"))?);
                Ok(FieldKind::Tensor { dtype, shape })
            }
            FieldKind::Bytes { .. } => {
                Err(format!("column '{name}': lists of variable-length values are not supported"))
            }
        },
        DataType::FixedSizeBinary(n) => Ok(FieldKind::Tensor {
            dtype: DType::U8,
            shape: vec![usize::try_from(*n).map_err(|_| format!("column '{name}': bad width {n}"))?],
        }),
        DataType::Binary | DataType::LargeBinary => Ok(FieldKind::Bytes { utf8: false }),
        DataType::Utf8 | DataType::LargeUtf8 => Ok(FieldKind::Bytes { utf8: true }),
        other => Err(format!("column '{name}' has unsupported type {other}")),
    }
}

fn fields_of(path: &Path, schema: &Schema) -> Result<Vec<Field>> {
    schema
        .fields()
        .iter()
        .map(|f| {
            field_kind(f.name(), f.data_type())
                .map(|kind| Field { name: f.name().clone(), kind })
                .map_err(|r| Error::file(path, r))
                .and_then(|field| match (&field.kind, field.fixed_bytes()) {
                    (FieldKind::Tensor { .. }, None) => {
                        Err(Error::file(path, format!("column '{}' has values too large to address", field.name)))
                    }
                    _ => Ok(field),
                })
        })
        .collect()
}

/// Reads the sample count and fields from the footer.
pub fn scan(path: &Path) -> Result<(u64, Vec<Field>)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let footer = read_footer(&file, path)?;
    let fields = fields_of(path, &footer.schema)?;
    let samples = footer.batch_rows.iter().try_fold(0u64, |a, &n| a.checked_add(n));
    Ok((samples.ok_or_else(|| Error::file(path, "row count overflows"))?, fields))
}

/// Reads rows of one Arrow IPC file, one record batch at a time.
pub struct ArrowReader {
    file: File,
    path: PathBuf,
    footer: Footer,
    decoder: FileDecoder,
    /// First row of each batch, plus the total at the end.
    starts: Vec<u64>,
}

impl ArrowReader {
    /// Opens `path`, checking that its columns are `expected`.
    pub fn open(path: &Path, expected: &[Field]) -> Result<ArrowReader> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let footer = read_footer(&file, path)?;
        if fields_of(path, &footer.schema)? != expected {
            return Err(Error::file(path, "fields changed since the dataset was scanned"));
        }
        let mut starts = vec![0u64];
        for n in &footer.batch_rows {
            starts.push(starts.last().expect("non-empty") + n);
        }
        let decoder = FileDecoder::new(footer.schema.clone(), footer.version);
        Ok(ArrowReader { file, path: path.to_path_buf(), footer, decoder, starts })
    }

    fn batch(&self, i: usize) -> Result<RecordBatch> {
        let block = &self.footer.blocks[i];
        let len = (block.metaDataLength() as i64).checked_add(block.bodyLength());
        let len = len
            .and_then(|l| u64::try_from(l).ok())
            .ok_or_else(|| Error::file(&self.path, format!("corrupt: batch {i} has a bad length")))?;
        let bytes = read_at(&self.file, &self.path, block.offset() as u64, len, &format!("batch {i}"))?;
        let buffer = Buffer::from_vec(bytes);
        let batch = decode_guarded(|| self.decoder.read_record_batch(block, &buffer))
            .map_err(|panic| {
                Error::file(&self.path, format!("corrupt record batch {i}: the decoder failed ({panic})"))
            })?
            .map_err(|e| Error::file(&self.path, format!("corrupt record batch {i}: {e}")))?
            .ok_or_else(|| Error::file(&self.path, format!("record batch {i} is empty")))?;
        if batch.num_rows() as u64 != self.footer.batch_rows[i] {
            return Err(Error::file(
                &self.path,
                format!(
                    "corrupt: batch {i} has {} rows, its header says {}",
                    batch.num_rows(),
                    self.footer.batch_rows[i]
                ),
            ));
        }
        Ok(batch)
    }
}

/// Pushes the location of `row` of `data` (an array of the given field kind) into `chunk`.
fn push_value(
    chunk: &mut RowChunk,
    buffers: &mut Vec<(usize, u32)>,
    col: usize,
    data: &arrow_data::ArrayData,
    row: usize,
) -> std::result::Result<(), String> {
    // `buffers` caches the chunk buffer index of each column's values buffer.
    let mut values_buffer = |chunk: &mut RowChunk, buf: &Buffer| -> u32 {
        if let Some(&(_, b)) = buffers.iter().find(|(c, _)| *c == col) {
            return b;
        }
        let b = chunk.add_buffer(buf.clone());
        buffers.push((col, b));
        b
    };
    // Offsets and values are read from the bytes with bounds checks: a corrupt file can
    // hold misaligned or short buffers, on which arrow's typed accessors panic.
    let offsets = |width: usize| -> std::result::Result<(usize, usize), String> {
        let raw = data.buffers().first().ok_or("missing offsets buffer")?.as_slice();
        let at = (data.offset() + row) * width;
        let read = |i: usize| -> Option<i64> {
            let b = raw.get(i..i + width)?;
            Some(if width == 4 {
                i32::from_le_bytes(b.try_into().ok()?) as i64
            } else {
                i64::from_le_bytes(b.try_into().ok()?)
            })
        };
        match (read(at), read(at + width)) {
            (Some(s), Some(e)) if 0 <= s && s <= e => Ok((s as usize, e as usize)),
            _ => Err(format!("bad offsets for row {row}")),
        }
    };
    let (buf, start, len) = match data.data_type() {
        DataType::Binary | DataType::Utf8 | DataType::LargeBinary | DataType::LargeUtf8 => {
            let width = if matches!(data.data_type(), DataType::Binary | DataType::Utf8) { 4 } else { 8 };
            let (s, e) = offsets(width)?;
            (data.buffers().get(1).ok_or("missing values buffer")?, s, e - s)
        }
        _ => {
            // Fixed width: walk down fixed-size lists to the values buffer. `first` is the
            // index of the first element at the current level, `count` the elements per row.
            let (mut d, mut first, mut count) = (data, data.offset() + row, 1usize);
            let width = loop {
                match d.data_type() {
                    DataType::FixedSizeList(_, n) => {
                        let child = d.child_data().first().ok_or("missing list values")?;
                        first = child.offset() + first * *n as usize;
                        count *= *n as usize;
                        d = child;
                    }
                    DataType::FixedSizeBinary(n) => break *n as usize,
                    dt => break primitive(dt).expect("checked at scan").size(),
                }
            };
            (d.buffers().first().ok_or("missing values buffer")?, first * width, count * width)
        }
    };
    if start.checked_add(len).is_none_or(|end| end > buf.len()) {
        return Err(format!("row {row} lies outside its values buffer"));
    }
    let b = values_buffer(chunk, buf);
    chunk.push_value(b, start, len);
    Ok(())
}

fn has_nulls(d: &arrow_data::ArrayData) -> bool {
    d.null_count() > 0 || d.child_data().iter().any(has_nulls)
}

impl super::FileReader for ArrowReader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let mut chunk = RowChunk::new(self.footer.schema.fields().len());
        let mut i = 0;
        while i < rows.len() {
            let b = self.starts.partition_point(|&s| s <= rows[i]) - 1;
            if b >= self.footer.blocks.len() {
                return Err(Error::file(&self.path, format!("row {} is past the end of the file", rows[i])));
            }
            let batch = self.batch(b)?;
            let data: Vec<arrow_data::ArrayData> = batch.columns().iter().map(|c| c.to_data()).collect();
            for (c, d) in data.iter().enumerate() {
                if has_nulls(d) {
                    return Err(Error::file(
                        &self.path,
                        format!(
                            "column '{}' has nulls in record batch {b}; nulls are not supported",
                            self.footer.schema.field(c).name()
                        ),
                    ));
                }
            }
            let mut buffers = Vec::new();
            while i < rows.len() && rows[i] < self.starts[b + 1] {
                let row = (rows[i] - self.starts[b]) as usize;
                for (c, d) in data.iter().enumerate() {
                    push_value(&mut chunk, &mut buffers, c, d, row).map_err(|r| {
                        let name = self.footer.schema.field(c).name();
                        Error::file(&self.path, format!("corrupt record batch {b}, column '{name}': {r}"))
                    })?;
                }
                i += 1;
            }
        }
        Ok(chunk)
    }
}

/// Writes an Arrow IPC file of `samples` samples in record batches of `batch_rows` rows.
pub fn write(
    path: &Path,
    fields: &[Field],
    samples: u64,
    batch_rows: u64,
    mut value: impl FnMut(u64, usize, &mut Vec<u8>),
) -> Result<()> {
    use arrow_array::builder::{BinaryBuilder, StringBuilder};
    use arrow_array::{make_array, ArrayRef};
    use arrow_schema::Field as AField;

    fn data_type(kind: &FieldKind) -> DataType {
        match kind {
            FieldKind::Bytes { utf8: false } => DataType::Binary,
            FieldKind::Bytes { utf8: true } => DataType::Utf8,
            FieldKind::Tensor { dtype, shape } => {
                let mut dt = match dtype {
                    DType::Bool | DType::U8 => DataType::UInt8,
                    DType::I8 => DataType::Int8,
                    DType::U16 => DataType::UInt16,
                    DType::I16 => DataType::Int16,
                    DType::U32 => DataType::UInt32,
                    DType::I32 => DataType::Int32,
                    DType::U64 => DataType::UInt64,
                    DType::I64 => DataType::Int64,
                    DType::F16 => DataType::Float16,
                    DType::F32 => DataType::Float32,
                    DType::F64 => DataType::Float64,
                };
                for &n in shape.iter().rev() {
                    dt = DataType::FixedSizeList(Arc::new(AField::new("item", dt, false)), n as i32);
                }
                dt
            }
        }
    }
    let err = |e: arrow_schema::ArrowError| Error::file(path, e.to_string());
    if let Some(f) = fields.iter().find(|f| matches!(f.kind, FieldKind::Tensor { dtype: DType::Bool, .. })) {
        return Err(Error::Config(format!("Arrow output does not support bool field '{}' (use u8)", f.name)));
    }
    let schema = Arc::new(Schema::new(
        fields.iter().map(|f| AField::new(f.name.clone(), data_type(&f.kind), false)).collect::<Vec<_>>(),
    ));
    let file = File::create(path).map_err(|e| Error::io(path, e))?;
    let mut writer = arrow_ipc::writer::FileWriter::try_new(std::io::BufWriter::new(file), &schema).map_err(err)?;
    let mut start = 0;
    let mut scratch = Vec::new();
    while start < samples {
        let end = (start + batch_rows.max(1)).min(samples);
        let mut columns: Vec<ArrayRef> = Vec::new();
        for (fi, f) in fields.iter().enumerate() {
            let col: ArrayRef = match &f.kind {
                FieldKind::Bytes { utf8 } => {
                    let mut values = Vec::new();
                    for id in start..end {
                        scratch.clear();
                        value(id, fi, &mut scratch);
                        values.push(scratch.clone());
                    }
                    if *utf8 {
                        let mut b = StringBuilder::new();
                        for v in values {
                            b.append_value(String::from_utf8(v).map_err(|e| Error::Config(e.to_string()))?);
                        }
                        Arc::new(b.finish())
                    } else {
                        let mut b = BinaryBuilder::new();
                        for v in values {
                            b.append_value(v);
                        }
                        Arc::new(b.finish())
                    }
                }
                FieldKind::Tensor { .. } => {
                    let mut bytes = Vec::new();
                    for id in start..end {
                        value(id, fi, &mut bytes);
                    }
                    // Build the nested fixed-size lists bottom-up around one values buffer.
                    let mut levels = vec![data_type(&f.kind)];
                    while let DataType::FixedSizeList(child, _) = levels.last().expect("non-empty").clone() {
                        levels.push(child.data_type().clone());
                    }
                    let leaf = levels.pop().expect("leaf type");
                    let mut len = bytes.len() / primitive(&leaf).expect("primitive leaf").size();
                    let mut data = arrow_data::ArrayData::builder(leaf)
                        .len(len)
                        .add_buffer(Buffer::from_vec(bytes))
                        .build()
                        .map_err(err)?;
                    for dt in levels.into_iter().rev() {
                        let DataType::FixedSizeList(_, n) = dt else { unreachable!("list level") };
                        len /= n as usize;
                        data = arrow_data::ArrayData::builder(dt).len(len).add_child_data(data).build().map_err(err)?;
                    }
                    make_array(data)
                }
            };
            columns.push(col);
        }
        let batch = RecordBatch::try_new(schema.clone(), columns).map_err(err)?;
        writer.write(&batch).map_err(err)?;
        start = end;
    }
    writer.finish().map_err(err)
}
