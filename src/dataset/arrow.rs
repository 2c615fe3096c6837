//! Arrow IPC files and streams: each column is a field.
//!
//! Column types: primitive → scalar tensor; fixed-size list of primitive (nested lists
//! give more dimensions) → tensor; fixed-size binary → `u8` tensor; binary / utf8 (and
//! their large variants) → variable-length bytes. Nulls, dictionaries, booleans
//! (bit-packed) and big-endian files are rejected with a clear error. Compressed batches
//! (LZ4 frame or ZSTD buffers, what `pandas.DataFrame.to_feather` writes) cannot be read
//! in place: a column's buffers are decoded as a stream and only the rows' values kept,
//! so memory follows the rows, not the batch. Their rows are checked against the
//! buffers' uncompressed lengths (read at open, each at most what its codec can expand it
//! to), not against the compressed body, which 100 000 zeros fit in 56 bytes.
//!
//! Only the footer and each record batch's message header are read to open a file (a
//! stream, which has no footer, has its messages walked once: each header, not the
//! bodies): the header gives the row count and, for every column, where its buffers lie
//! in the batch's body. Reading rows then reads only the bytes of the rows asked for, straight from the
//! file: a fixed-width column's row `r` is `width` bytes at `r·width` of its values buffer;
//! a variable-length column's row `r` is `values[offsets[r]..offsets[r+1]]`, so its two
//! offsets are read first, then the value. Rows close together are read in one go (gaps
//! are read through while the bytes read stay under twice the bytes needed, as for
//! `.npy`), so memory and I/O are proportional to the rows needed, not to the record
//! batches holding them; no record batch is ever decoded whole. Every offset, length and
//! range is checked against the batch body and the file before it is used.
//!
//! A buffer's validity bitmap is not read: a column whose field node counts nulls is
//! refused, and, as in Arrow C++, a null count of zero means every value is valid.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_buffer::Buffer;
use arrow_ipc::{Block, MetadataVersion};
use arrow_schema::{DataType, Schema};

use super::nulls::{Chosen, ColumnChoice, ColumnTypeError, NullPolicy, Source};
use super::positional::{group_ranges, push_grouped, read_error, read_grouped, Positional, RECORD_GAP_BYTES};
use super::rows::RowChunk;
use super::schema::{DType, Field, FieldKind};
use crate::error::{Error, Result, ResultExt};

/// Whether this thread is inside a decoder of untrusted Arrow data whose panics meshfeed
/// catches. Panic hooks (the runtime's, the fuzz harness's) ask this to let such panics
/// pass. meshfeed no longer runs arrow-ipc's record batch decoder on file contents (it
/// reads and bounds-checks the buffers itself), so this is always `false`; it stays for
/// the hooks that call it.
pub fn decoding_untrusted_input() -> bool {
    false
}

/// A buffer's byte range of the file, and the bytes it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileSpan {
    start: u64,
    len: u64,
    /// The bytes the buffer holds: `len` where stored as is; a compressed buffer's
    /// uncompressed length, as its first 8 bytes say (bounded by what its codec can expand
    /// `len` bytes to, and checked when it is decompressed).
    bytes: u64,
}

/// Where one column's values lie in the file, in one record batch.
#[derive(Clone, Copy, Debug)]
enum Column {
    /// `width` bytes per row: row `r` is bytes `r·width..(r+1)·width` of `values`.
    Fixed { values: FileSpan, width: u64 },
    /// Row `r` is elements `offsets[r]..offsets[r+1]` of `values`, of `elem` bytes each (1
    /// for binary and text; a list's element size); offsets are little-endian `i32` (`i64`
    /// when `wide`).
    Var { offsets: FileSpan, values: FileSpan, wide: bool, elem: u64 },
    /// Booleans, one bit per row (row `r` is bit `r % 8` of byte `r / 8` of `values`),
    /// delivered as one byte per row (0 or 1).
    Bits { values: FileSpan },
    /// Not in the file: the validity field of a masked column ([`Source::Valid`]).
    Made,
}

/// One record batch: its rows and where each column's buffers are.
#[derive(Debug)]
struct BatchLayout {
    rows: u64,
    /// Per field of [`Footer::chosen`].
    columns: Vec<Column>,
    /// Per field, its validity bitmap where the batch has nulls in it (bit `r` of row `r`:
    /// 1 present, 0 null).
    validity: Vec<Option<FileSpan>>,
    /// How the batch's buffers are compressed (`None`: not at all, values read in place).
    codec: Option<Codec>,
}

/// A buffer compression of Arrow IPC: each buffer is its uncompressed length (`i64`, -1:
/// stored uncompressed) and an LZ4 frame or a Zstandard frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Codec {
    Lz4,
    Zstd,
}

impl Codec {
    /// The most bytes one byte of this codec's data can decode to: a Zstandard RLE block
    /// is 4 bytes for 128 KiB; an LZ4 sequence extends a match by 255 bytes per byte.
    fn max_ratio(self) -> u64 {
        match self {
            Codec::Lz4 => 256,
            Codec::Zstd => 32768,
        }
    }
}

/// Why a compressed buffer could not be decoded.
enum Undecodable {
    /// Its data is not what its header says.
    Corrupt(String),
    /// The file could not be read (or ended first).
    Io(std::io::Error),
}

/// Bytes `at..end` of a file as a stream (for a decoder to pull from).
struct FileStream<'a> {
    file: &'a File,
    at: u64,
    end: u64,
}

impl std::io::Read for FileStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(usize::try_from(self.end - self.at).unwrap_or(usize::MAX));
        if n == 0 {
            return Ok(0);
        }
        let got = self.file.read_at(&mut buf[..n], self.at)?;
        if got == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.at += got as u64;
        Ok(got)
    }
}

/// The bytes `ranges` (sorted by start; they may overlap) of compressed buffer `span` of
/// `file` once decompressed, one after another, decoded as a stream: memory is what the
/// ranges hold plus the decoder's window, never the whole buffer. The buffer must decode
/// to exactly the length its first 8 bytes say (which [`uncompressed_lengths`] bounded at
/// open).
fn decompressed_ranges(
    codec: Codec,
    file: &File,
    span: FileSpan,
    ranges: &[Range<u64>],
) -> std::result::Result<Vec<u8>, Undecodable> {
    use std::io::Read;
    if span.len == 0 {
        return match ranges.iter().find(|r| r.end > 0) {
            Some(r) => Err(Undecodable::Corrupt(format!("bytes {r:?} of an empty buffer"))),
            None => Ok(vec![]),
        };
    }
    let mut head = [0u8; 8];
    file.read_exact_at(&mut head, span.start).map_err(Undecodable::Io)?;
    let data = FileStream { file, at: span.start + 8, end: span.start + span.len };
    let mut stream: Box<dyn Read + '_> = match (i64::from_le_bytes(head), codec) {
        (-1, _) => Box::new(data),
        (_, Codec::Lz4) => Box::new(lz4_flex::frame::FrameDecoder::new(std::io::BufReader::new(data))),
        (_, Codec::Zstd) => Box::new(
            ruzstd::decoding::StreamingDecoder::new(std::io::BufReader::new(data))
                .map_err(|e| Undecodable::Corrupt(format!("{codec:?} data does not decode: {e}")))?,
        ),
    };
    // Bytes `start..start + buf.len()` of the decoded stream are in `buf`.
    let (mut buf, mut start) = (Vec::new(), 0u64);
    // A file that ends first is the file's error; anything else the data's.
    let short = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Undecodable::Io(e),
        _ => Undecodable::Corrupt(format!("{codec:?} data does not decode: {e}")),
    };
    let pull = |stream: &mut Box<dyn Read + '_>, into: &mut Vec<u8>, n: u64| {
        stream.take(n).read_to_end(into).map(|got| got as u64).map_err(short)
    };
    let mut out = Vec::new();
    for r in ranges {
        if r.start > start {
            let drop = (r.start - start).min(buf.len() as u64);
            buf.drain(..drop as usize);
            start += drop;
            let skip = r.start - start;
            let skipped = std::io::copy(&mut (&mut stream).take(skip), &mut std::io::sink()).map_err(short)?;
            if skipped < skip {
                let why = format!("{codec:?} data decodes to {} bytes, byte {} is needed", start + skipped, r.end);
                return Err(Undecodable::Corrupt(why));
            }
            start = r.start;
        }
        let need = r.end.saturating_sub(start);
        if (buf.len() as u64) < need {
            let have = buf.len() as u64;
            if pull(&mut stream, &mut buf, need - have)? < need - have {
                let why =
                    format!("{codec:?} data decodes to {} bytes, byte {} is needed", start + buf.len() as u64, r.end);
                return Err(Undecodable::Corrupt(why));
            }
        }
        out.extend_from_slice(&buf[(r.start - start) as usize..(r.end - start) as usize]);
    }
    // The rest, to check the length the buffer declares (and no more).
    let so_far = start + buf.len() as u64;
    let left = (span.bytes + 1).saturating_sub(so_far);
    let total = so_far + std::io::copy(&mut (&mut stream).take(left), &mut std::io::sink()).map_err(short)?;
    if total != span.bytes {
        let got = if total > span.bytes { format!("more than {}", span.bytes) } else { total.to_string() };
        return Err(Undecodable::Corrupt(format!(
            "{codec:?} data decodes to {got} bytes, its header says {}",
            span.bytes
        )));
    }
    Ok(out)
}

/// What the footer of an Arrow file and its record batch headers say.
#[derive(Debug)]
struct Footer {
    /// The fields delivered: the columns read and the validity fields of masked ones.
    chosen: Chosen,
    batches: Vec<BatchLayout>,
}

impl Footer {
    fn fields(&self) -> &[Field] {
        &self.chosen.fields
    }
}

/// Reads `len` bytes at `offset`, which the caller has checked lie inside the file as it
/// was when opened; a short read (the file shrank since) is an error, never zeros.
fn read_exact(file: &File, path: &Path, offset: u64, len: u64, what: &str) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    let n = usize::try_from(len).map_err(|_| Error::file(path, format!("{what}: {len} bytes cannot be addressed")))?;
    buf.try_reserve_exact(n).file_context(path, format_args!("{what}: cannot allocate {len} bytes"))?;
    buf.resize(n, 0);
    file.read_exact_at(&mut buf, offset).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            Error::file(path, format!("truncated: {what} ({len} bytes at {offset}) lies past the end of the file"))
        }
        _ => Error::io(path, e),
    })?;
    Ok(buf)
}

/// Reads a range the footer gives, checking it against the file's size first (a corrupt
/// footer must not size an allocation).
fn read_at(file: &File, path: &Path, file_len: u64, offset: u64, len: u64, what: &str) -> Result<Vec<u8>> {
    if offset.checked_add(len).is_none_or(|end| end > file_len) {
        return Err(Error::file(
            path,
            format!("corrupt: {what} ({len} bytes at {offset}) lies past the end of the file ({file_len} bytes)"),
        ));
    }
    read_exact(file, path, offset, len, what)
}

/// Why a column of a record batch cannot be read.
enum ColumnError {
    Corrupt(String),
    /// Nulls inside a column's values (a list's elements), which no policy delivers.
    NestedNulls,
}

impl From<&str> for ColumnError {
    fn from(s: &str) -> ColumnError {
        ColumnError::Corrupt(s.to_string())
    }
}

/// Where the values of a column of type `dt` lie, and its validity bitmap where it has
/// nulls, consuming its field nodes and buffers (depth first, as the IPC format lays them
/// out; every buffer checked to lie inside the batch body). `rows` is how many values the
/// column must hold at this level; nulls below the top level are an error.
fn column_layout<'a>(
    dt: &DataType,
    rows: u64,
    top: bool,
    nodes: &mut impl Iterator<Item = &'a arrow_ipc::FieldNode>,
    buffers: &mut impl Iterator<Item = FileSpan>,
) -> std::result::Result<(Column, Option<FileSpan>), ColumnError> {
    let node = nodes.next().ok_or("the header lists too few field nodes")?;
    let length = u64::try_from(node.length()).map_err(|_| "a field node has a negative length")?;
    if (top && length != rows) || length < rows {
        return Err(ColumnError::Corrupt(format!("a field node holds {length} values where {rows} are needed")));
    }
    if node.null_count() != 0 && !top {
        return Err(ColumnError::NestedNulls);
    }
    let mut buffer = || -> std::result::Result<FileSpan, ColumnError> {
        Ok(buffers.next().ok_or("the header lists too few buffers")?)
    };
    let validity = buffer()?;
    let validity = (node.null_count() != 0).then_some(validity);
    let column = match dt {
        DataType::FixedSizeList(child, n) => {
            let n = u64::try_from(*n).map_err(|_| "bad list size")?;
            let inner = rows.checked_mul(n).ok_or("list values overflow")?;
            match column_layout(child.data_type(), inner, false, nodes, buffers)?.0 {
                Column::Fixed { values, width } => {
                    Column::Fixed { values, width: width.checked_mul(n).ok_or("list values overflow")? }
                }
                _ => return Err("lists of variable-length values or booleans are not supported".into()),
            }
        }
        DataType::List(child) | DataType::LargeList(child) => {
            let offsets = buffer()?;
            // The child holds every row's elements (its length is the offsets' business).
            match column_layout(child.data_type(), 0, false, nodes, buffers)?.0 {
                Column::Fixed { values, width } => {
                    Column::Var { offsets, values, wide: matches!(dt, DataType::LargeList(_)), elem: width }
                }
                _ => return Err("lists of variable-length values or booleans are not supported".into()),
            }
        }
        DataType::Boolean => Column::Bits { values: buffer()? },
        DataType::FixedSizeBinary(w) => {
            Column::Fixed { values: buffer()?, width: u64::try_from(*w).map_err(|_| "bad binary width")? }
        }
        DataType::Binary | DataType::Utf8 => {
            Column::Var { offsets: buffer()?, values: buffer()?, wide: false, elem: 1 }
        }
        DataType::LargeBinary | DataType::LargeUtf8 => {
            Column::Var { offsets: buffer()?, values: buffer()?, wide: true, elem: 1 }
        }
        dt => {
            let size = DType::of_arrow(dt).ok_or("unsupported type")?.size() as u64;
            Column::Fixed { values: buffer()?, width: size }
        }
    };
    if top {
        // The rows addressed must lie inside the buffers (compressed ones: inside what
        // they decompress to, checked again when they are).
        let (buf, need) = match column {
            Column::Fixed { values, width } => (values, rows.checked_mul(width)),
            Column::Var { offsets, wide, .. } => {
                (offsets, rows.checked_add(1).and_then(|n| n.checked_mul(width_of(wide))))
            }
            Column::Bits { values } => (values, Some(rows.div_ceil(8))),
            Column::Made => return Err("internal: a made column in a file".into()),
        };
        for (buf, need) in [(Some(buf), need), (validity, Some(rows.div_ceil(8)))] {
            let Some(buf) = buf else { continue };
            if need.is_none_or(|need| need > buf.bytes) {
                return Err(ColumnError::Corrupt(format!(
                    "a buffer of {} bytes is too short for {rows} rows",
                    buf.bytes
                )));
            }
        }
    }
    Ok((column, validity))
}

/// The field nodes and buffers a column of type `dt` takes in a record batch (as arrow-ipc's
/// reader skips a column), so that a column not read is passed over without looking at
/// its type's details; `variadic` gives the variadic buffer counts of view columns in
/// order. `None`: a type this version cannot pass over.
fn node_and_buffer_count(
    dt: &DataType,
    version: MetadataVersion,
    variadic: &mut impl Iterator<Item = i64>,
) -> Option<(usize, usize)> {
    let mut count = |nodes: usize, buffers: usize, children: &[&DataType]| {
        children.iter().try_fold((nodes, buffers), |(n, b), child| {
            let (cn, cb) = node_and_buffer_count(child, version, variadic)?;
            Some((n + cn, b + cb))
        })
    };
    match dt {
        DataType::Null => Some((1, 0)),
        DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => Some((1, 3)),
        DataType::Utf8View | DataType::BinaryView => {
            let extra = usize::try_from(variadic.next()?).ok()?;
            Some((1, extra.checked_add(2)?))
        }
        DataType::List(f) | DataType::LargeList(f) | DataType::Map(f, _) => count(1, 2, &[f.data_type()]),
        DataType::ListView(f) | DataType::LargeListView(f) => count(1, 3, &[f.data_type()]),
        DataType::FixedSizeList(f, _) => count(1, 1, &[f.data_type()]),
        DataType::Struct(fields) => count(1, 1, &fields.iter().map(|f| f.data_type()).collect::<Vec<_>>()),
        DataType::RunEndEncoded(a, b) => count(1, 0, &[a.data_type(), b.data_type()]),
        DataType::Dictionary(_, _) => Some((1, 2)),
        DataType::Union(fields, mode) => {
            let buffers =
                usize::from(version < MetadataVersion::V5) + 1 + usize::from(*mode == arrow_schema::UnionMode::Dense);
            count(1, buffers, &fields.iter().map(|(_, f)| f.data_type()).collect::<Vec<_>>())
        }
        dt if dt.is_primitive() || matches!(dt, DataType::Boolean | DataType::FixedSizeBinary(_)) => Some((1, 2)),
        _ => None,
    }
}

/// Bytes per offset.
fn width_of(wide: bool) -> u64 {
    if wide {
        8
    } else {
        4
    }
}

/// What every error of a footer or batch header that does not parse starts with.
const CORRUPT: &str = "corrupt Arrow IPC file";

fn read_footer(file: &File, path: &Path, choice: &ColumnChoice) -> Result<Footer> {
    let corrupt = |r: String| Error::file(path, format!("{CORRUPT}: {r}"));
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if file_len < 8 {
        return Err(corrupt(format!("only {file_len} bytes")));
    }
    let head = read_at(file, path, file_len, 0, 6, "magic")?;
    if head != b"ARROW1" {
        return read_stream(file, path, file_len, choice);
    }
    if file_len < 18 {
        return Err(corrupt(format!("only {file_len} bytes")));
    }
    let tail: [u8; 10] = read_at(file, path, file_len, file_len - 10, 10, "trailer")?.try_into().expect("10 bytes");
    let footer_len = arrow_ipc::reader::read_footer_length(tail).file_context(path, CORRUPT)? as u64;
    if footer_len > file_len - 18 {
        return Err(corrupt(format!("footer length {footer_len} exceeds the file size {file_len}")));
    }
    let fbytes = read_at(file, path, file_len, file_len - 10 - footer_len, footer_len, "footer")?;
    // (flatbuffers' error is not a `std::error::Error` without its `std` feature: text only)
    let footer = arrow_ipc::root_as_footer(&fbytes).map_err(|e| corrupt(format!("footer: {e}")))?;
    let fb_schema = footer.schema().ok_or_else(|| corrupt("footer has no schema".into()))?;
    let schema = check_schema(path, fb_schema, footer.version())?;
    // Dictionary-encoded columns are of a type no field has: refused where they are read,
    // their dictionaries never looked at.
    let chosen = fields_of(path, &schema, choice)?;
    let blocks: Vec<Block> = footer.recordBatches().map(|b| b.iter().copied().collect()).unwrap_or_default();
    let mut batches = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let meta_len = u64::try_from(block.metaDataLength())
            .map_err(|_| corrupt(format!("batch {i}: negative metadata length")))?;
        let offset = u64::try_from(block.offset()).map_err(|_| corrupt(format!("batch {i}: negative offset")))?;
        let meta = read_at(file, path, file_len, offset, meta_len, &format!("batch {i} header"))?;
        let msg_bytes = match meta.get(..4) {
            Some([0xff, 0xff, 0xff, 0xff]) => meta.get(8..),
            Some(_) => meta.get(4..),
            None => None,
        }
        .ok_or_else(|| corrupt(format!("batch {i}: header too short")))?;
        let msg = arrow_ipc::root_as_message(msg_bytes).map_err(|e| corrupt(format!("batch {i} header: {e}")))?;
        let rb = msg.header_as_record_batch().ok_or_else(|| corrupt(format!("batch {i} is not a record batch")))?;
        let body_len =
            u64::try_from(block.bodyLength()).map_err(|_| corrupt(format!("batch {i}: negative body length")))?;
        let body_start = offset.checked_add(meta_len);
        let version = msg.version();
        batches.push(batch_layout(file, path, file_len, (&schema, &chosen, version), i, rb, body_start, body_len)?);
    }
    Ok(Footer { chosen, batches })
}

/// Reads the layout of an Arrow IPC *stream* (what `datasets.save_to_disk` and
/// `pyarrow.ipc.new_stream` write): no footer, so its messages are walked once from the
/// start — the schema, then each record batch's header, its body skipped — to the
/// end-of-stream marker or the end of the file.
fn read_stream(file: &File, path: &Path, file_len: u64, choice: &ColumnChoice) -> Result<Footer> {
    let corrupt = |r: String| Error::file(path, format!("{CORRUPT} stream: {r}"));
    let mut schema: Option<(Schema, Chosen)> = None;
    let mut batches = Vec::new();
    let mut at = 0u64;
    while at < file_len {
        // A message: [0xFFFFFFFF] <metadata length: i32> <metadata> <body>; the
        // continuation marker is absent in streams written before Arrow 0.15.
        let prefix = read_at(file, path, file_len, at, 8.min(file_len - at), "message prefix")?;
        let (skip, len) = match prefix.as_slice() {
            [0xff, 0xff, 0xff, 0xff, a, b, c, d] => (8, i32::from_le_bytes([*a, *b, *c, *d])),
            [0xff, 0xff, 0xff, 0xff] => (4, 0),
            [a, b, c, d, ..] => (4, i32::from_le_bytes([*a, *b, *c, *d])),
            _ => return Err(corrupt(format!("{} stray bytes at its end", file_len - at))),
        };
        if len == 0 {
            break; // end of stream
        }
        let what = if schema.is_none() { "the schema" } else { "a message" };
        let len = u64::try_from(len).map_err(|_| match schema {
            None => Error::file(path, "not an Arrow IPC file or stream (neither the file magic nor a stream's schema)"),
            Some(_) => corrupt(format!("negative message length at byte {at}")),
        })?;
        if len > file_len - at - skip {
            return Err(match schema {
                None => {
                    Error::file(path, "not an Arrow IPC file or stream (neither the file magic nor a stream's schema)")
                }
                Some(_) => corrupt(format!(
                    "{what} at byte {at} ({len} bytes) lies past the end of the file ({file_len} bytes)"
                )),
            });
        }
        let meta = read_at(file, path, file_len, at + skip, len, "message header")?;
        let msg = arrow_ipc::root_as_message(&meta).map_err(|e| match schema {
            None => Error::file(path, format!("not an Arrow IPC file or stream (no schema message at its start: {e})")),
            Some(_) => corrupt(format!("message at byte {at}: {e}")),
        })?;
        let body_len = u64::try_from(msg.bodyLength())
            .map_err(|_| corrupt(format!("message at byte {at}: negative body length")))?;
        let body_start = at + skip + len;
        match (&schema, msg.header_type()) {
            (None, arrow_ipc::MessageHeader::Schema) => {
                let fb = msg.header_as_schema().ok_or_else(|| corrupt("schema message without a schema".into()))?;
                let s = check_schema(path, fb, msg.version())?;
                let chosen = fields_of(path, &s, choice)?;
                schema = Some((s, chosen));
            }
            (None, _) => {
                return Err(Error::file(path, "not an Arrow IPC file or stream (its first message is not a schema)"));
            }
            // Dictionary-encoded columns are of a type no field has: refused where they are
            // read, their dictionaries passed over.
            (Some(_), arrow_ipc::MessageHeader::DictionaryBatch) => {}
            (Some((s, chosen)), arrow_ipc::MessageHeader::RecordBatch) => {
                let rb = msg.header_as_record_batch().ok_or_else(|| corrupt("empty record batch header".into()))?;
                let i = batches.len();
                let schema = (s, chosen, msg.version());
                batches.push(batch_layout(file, path, file_len, schema, i, rb, Some(body_start), body_len)?);
            }
            (Some(_), other) => return Err(corrupt(format!("unexpected {other:?} message at byte {at}"))),
        }
        at = body_start.checked_add(body_len).filter(|&e| e <= file_len).ok_or_else(|| {
            corrupt(format!(
                "the body at byte {body_start} ({body_len} bytes) lies past the end of the file ({file_len} bytes)"
            ))
        })?;
    }
    let (_, chosen) = schema.ok_or_else(|| Error::file(path, "not an Arrow IPC file or stream (empty)"))?;
    Ok(Footer { chosen, batches })
}

/// The schema of a file or stream, once checked to be one meshfeed reads.
fn check_schema(path: &Path, fb: arrow_ipc::Schema<'_>, version: MetadataVersion) -> Result<Schema> {
    if fb.endianness() != arrow_ipc::Endianness::Little {
        return Err(Error::file(path, "big-endian Arrow files are not supported (write little-endian)"));
    }
    if version < MetadataVersion::V4 {
        return Err(Error::file(
            path,
            format!("Arrow IPC metadata version {version:?} is not supported (V4 or later)"),
        ));
    }
    arrow_ipc::convert::try_fb_to_schema(fb).file_context(path, CORRUPT)
}

/// The layout of record batch `i`, from its header `rb` and its body (`body_len` bytes
/// from `body_start`, `None` where that overflows), every range checked to lie inside it.
/// A compressed batch's buffers' first 8 bytes (their uncompressed lengths) are read here,
/// those of the columns read. `schema` is the file's schema, the columns read of it, and
/// the message's metadata version.
#[allow(clippy::too_many_arguments)]
fn batch_layout(
    file: &File,
    path: &Path,
    file_len: u64,
    (schema, chosen, version): (&Schema, &Chosen, MetadataVersion),
    i: usize,
    rb: arrow_ipc::RecordBatch<'_>,
    body_start: Option<u64>,
    body_len: u64,
) -> Result<BatchLayout> {
    let corrupt = |r: String| Error::file(path, format!("{CORRUPT}: {r}"));
    let rows = u64::try_from(rb.length()).map_err(|_| corrupt(format!("batch {i}: negative length")))?;
    let body_start = body_start.filter(|s| s.checked_add(body_len).is_some_and(|e| e <= file_len));
    let body = body_start.ok_or_else(|| {
        corrupt(format!("batch {i}: its body ({body_len} bytes) lies past the end of the file ({file_len} bytes)"))
    })?;
    let codec = match rb.compression().map(|c| c.codec()) {
        None => None,
        Some(arrow_ipc::CompressionType::LZ4_FRAME) => Some(Codec::Lz4),
        Some(arrow_ipc::CompressionType::ZSTD) => Some(Codec::Zstd),
        Some(other) => return Err(corrupt(format!("batch {i}: unknown compression {other:?}"))),
    };
    // Every buffer must lie inside the body: the reads below trust these ranges.
    let mut spans = Vec::new();
    for (k, buf) in rb.buffers().into_iter().flatten().enumerate() {
        let end = buf.offset().checked_add(buf.length());
        if buf.offset() < 0 || buf.length() < 0 || end.is_none_or(|e| e as u64 > body_len) {
            return Err(corrupt(format!(
                "batch {i} buffer {k} ({} bytes at {}) lies outside the {body_len}-byte body",
                buf.length(),
                buf.offset()
            )));
        }
        let (start, len) = (body + buf.offset() as u64, buf.length() as u64);
        spans.push(FileSpan { start, len, bytes: len });
    }
    // The nodes and buffers of each column: those of columns not read are passed over.
    let variadic: Vec<i64> = rb.variadicBufferCounts().map(|v| v.iter().collect()).unwrap_or_default();
    let mut counts = Vec::with_capacity(schema.fields().len());
    let mut variadic_left = variadic.into_iter();
    for (k, f) in schema.fields().iter().enumerate() {
        let read = chosen.field_of_column(k).is_some();
        let count = node_and_buffer_count(f.data_type(), version, &mut variadic_left);
        match count {
            Some(c) => counts.push((read, c)),
            // A column after one of a type that cannot be passed over cannot be found.
            None if chosen.sources.iter().any(|s| matches!(s, Source::Column(c) if *c > k)) => {
                return Err(Error::file(
                    path,
                    format!(
                        "column '{}' has type {}, which meshfeed cannot pass over to read the columns after it",
                        f.name(),
                        f.data_type()
                    ),
                ))
            }
            None => counts.push((read, (0, 0))),
        }
    }
    if let Some(codec) = codec {
        let mut used = vec![false; spans.len()];
        let mut at = 0;
        for &(read, (_, b)) in &counts {
            if read {
                used.iter_mut().skip(at).take(b).for_each(|u| *u = true);
            }
            at += b;
        }
        uncompressed_lengths(file, path, i, codec, &mut spans, &used)?;
    }
    // Never trust a row count beyond what the buffers could hold (every column takes at
    // least one bit per row): it sizes the id space and the verifier's bitmap. Compressed
    // buffers hold what they decompress to (a column of zeros compresses a thousandfold).
    let held = match codec {
        None => body_len,
        Some(_) => spans.iter().fold(0u64, |n, s| n.saturating_add(s.bytes)),
    };
    if rows > held.saturating_mul(8).max(64) {
        let what = if codec.is_some() { "buffers of" } else { "a body of" };
        return Err(corrupt(format!("batch {i} claims {rows} rows in {what} {held} bytes")));
    }
    let nodes_fb = rb.nodes();
    let mut nodes = nodes_fb.iter().flat_map(|v| v.iter());
    let mut buffers = spans.into_iter();
    let mut columns = vec![Column::Made; chosen.fields.len()];
    let mut validity = vec![None; chosen.fields.len()];
    for (k, (f, &(read, (n, b)))) in schema.fields().iter().zip(&counts).enumerate() {
        let Some(field) = chosen.field_of_column(k).filter(|_| read) else {
            // Not read: passed over, whatever its type and nulls.
            if nodes.by_ref().take(n).count() < n || buffers.by_ref().take(b).count() < b {
                return Err(corrupt(format!("batch {i}: the header lists too few field nodes or buffers")));
            }
            continue;
        };
        let (c, nulls) = column_layout(f.data_type(), rows, true, &mut nodes, &mut buffers).map_err(|e| match e {
            ColumnError::NestedNulls => Error::file(
                path,
                format!(
                    "column '{}' has nulls inside its values in record batch {i}; only nulls of whole values are \
                     delivered (--nulls)",
                    f.name()
                ),
            ),
            ColumnError::Corrupt(r) => corrupt(format!("batch {i}, column '{}': {r}", f.name())),
        })?;
        if nulls.is_some() && chosen.nulls[field].is_none() {
            return Err(super::nulls::refused(path, f.name(), &format!("record batch {i}")));
        }
        columns[field] = c;
        validity[field] = nulls;
    }
    Ok(BatchLayout { rows, columns, validity, codec })
}

/// Sets the bytes each buffer of compressed batch `i` holds from its first 8 bytes (its
/// uncompressed length; -1: stored as is), read in a few reads (the buffers lie one after
/// another). A length more than the codec can expand the buffer to is corrupt.
fn uncompressed_lengths(
    file: &File,
    path: &Path,
    i: usize,
    codec: Codec,
    spans: &mut [FileSpan],
    used: &[bool],
) -> Result<()> {
    let corrupt = |r: String| Error::file(path, format!("{CORRUPT}: batch {i} {r}"));
    if let Some((k, s)) = spans.iter().enumerate().find(|(k, s)| used[*k] && (1..8).contains(&s.len)) {
        return Err(corrupt(format!("buffer {k}: {} bytes, too short for a compressed buffer", s.len)));
    }
    // Empty buffers (validity bitmaps without nulls) hold nothing and have no length.
    // Only the buffers of the columns read.
    let heads: Vec<usize> = (0..spans.len()).filter(|&k| spans[k].len > 0 && used[k]).collect();
    let ranges: Vec<Range<u64>> = heads.iter().map(|&k| spans[k].start..spans[k].start + 8).collect();
    let mut at = 0;
    for (g, n) in group_ranges(&ranges, RECORD_GAP_BYTES) {
        let bytes = read_exact(file, path, g.start, g.end - g.start, &format!("batch {i} buffer lengths"))?;
        for &k in &heads[at..at + n] {
            let span = &mut spans[k];
            let from = (span.start - g.start) as usize;
            let head: [u8; 8] = bytes[from..from + 8].try_into().expect("8 bytes");
            let stored = span.len - 8;
            span.bytes = match i64::from_le_bytes(head) {
                -1 => stored,
                n => {
                    let n = u64::try_from(n).map_err(|_| corrupt(format!("buffer {k}: uncompressed length {n}")))?;
                    if n > stored.saturating_mul(codec.max_ratio()) {
                        return Err(corrupt(format!(
                            "buffer {k}: {n} bytes uncompressed from {stored} bytes of {codec:?} data, which holds at \
                             most {}",
                            stored.saturating_mul(codec.max_ratio())
                        )));
                    }
                    n
                }
            };
        }
        at += n;
    }
    Ok(())
}

/// The field a column of type `dt` is delivered as, or why it cannot be.
fn field_kind(name: &str, dt: &DataType) -> std::result::Result<FieldKind, ColumnTypeError> {
    let column = || name.to_string();
    let size = |what, n: i32| usize::try_from(n).map_err(|_| ColumnTypeError::BadSize { column: column(), what, n });
    if let Some(d) = DType::of_arrow(dt) {
        return Ok(FieldKind::Tensor { dtype: d, shape: vec![] });
    }
    match dt {
        // One byte per value (0 or 1), as numpy's and torch's bool.
        DataType::Boolean => Ok(FieldKind::Tensor { dtype: DType::Bool, shape: vec![] }),
        DataType::FixedSizeList(child, _) if child.data_type() == &DataType::Boolean => {
            Err(ColumnTypeError::BooleanLists { column: column() })
        }
        DataType::FixedSizeList(child, n) => match field_kind(name, child.data_type())? {
            FieldKind::Tensor { dtype, mut shape } => {
                shape.insert(0, size("list size", *n)?);
                Ok(FieldKind::Tensor { dtype, shape })
            }
            FieldKind::Bytes { .. } => Err(ColumnTypeError::VariableLengthLists { column: column() }),
        },
        DataType::FixedSizeBinary(n) => Ok(FieldKind::Tensor { dtype: DType::U8, shape: vec![size("width", *n)?] }),
        DataType::Binary | DataType::LargeBinary => Ok(FieldKind::Bytes { utf8: false, elem: None }),
        DataType::List(child) | DataType::LargeList(child) => match DType::of_arrow(child.data_type()) {
            Some(d) if d != DType::Bool => Ok(FieldKind::Bytes { utf8: false, elem: Some(d) }),
            _ => Err(ColumnTypeError::ListsOf { column: column(), of: child.data_type().clone() }),
        },
        DataType::Utf8 | DataType::LargeUtf8 => Ok(FieldKind::Bytes { utf8: true, elem: None }),
        other => Err(ColumnTypeError::UnsupportedType { column: column(), ty: other.clone() }),
    }
}

/// The fields of a file with `schema` under `choice`: the columns read, checked to be of
/// types meshfeed delivers, and the validity fields of masked ones ([`super::nulls::choose`]).
pub(crate) fn fields_of(path: &Path, schema: &Schema, choice: &ColumnChoice) -> Result<Chosen> {
    super::nulls::choose(path, schema, choice, field_kind)
}

/// Reads an Arrow file's or stream's headers: sample count, the fields `choice` reads, the
/// bytes of each variable-length field's values (the value buffers' lengths in the record
/// batch headers; 0 for fixed-size fields), and whether values can be read in place (no
/// batch is compressed, every field is a fixed-size or variable-length column without
/// nulls: booleans are bits, and nulls and validity fields are made by the reader).
pub fn scan(path: &Path, choice: &ColumnChoice) -> Result<(u64, Vec<Field>, Vec<u64>, bool)> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let footer = read_footer(&file, path, choice)?;
    let samples = footer.batches.iter().try_fold(0u64, |a, b| a.checked_add(b.rows));
    let mut value_bytes = vec![0u64; footer.fields().len()];
    for batch in &footer.batches {
        for (total, column) in value_bytes.iter_mut().zip(&batch.columns) {
            if let Column::Var { values, .. } = column {
                // Compressed: the values' real size, which the window budget needs.
                *total = total.saturating_add(values.bytes);
            }
        }
    }
    let in_place = footer.batches.iter().all(|b| {
        b.codec.is_none()
            && b.validity.iter().all(Option::is_none)
            && b.columns.iter().all(|c| matches!(c, Column::Fixed { .. } | Column::Var { .. }))
    });
    let samples = samples.ok_or_else(|| Error::file(path, "row count overflows"))?;
    Ok((samples, footer.chosen.fields, value_bytes, in_place))
}

/// Reads rows of one Arrow IPC file: only the byte ranges of the rows asked for.
pub struct ArrowReader {
    file: File,
    path: PathBuf,
    layout: Arc<Layout>,
}

/// Where everything of one file is: its footer and record batch headers, parsed. Reading
/// them takes one small read per record batch, each at its own offset (with the
/// readahead each brings in): on cold storage a reader opened once per pass paid that for
/// every batch every pass, so a dataset parses each file's layout once ([`LayoutCache`]).
#[derive(Debug)]
pub struct Layout {
    footer: Footer,
    /// First row of each batch, plus the total at the end.
    starts: Vec<u64>,
}

/// The layout of one file, parsed by the first reader opened on it. A file changed since
/// the scan is refused before its layout is used (the dataset's readers check the file's
/// identity at open and after every read).
pub type LayoutCache = std::sync::OnceLock<Arc<Layout>>;

/// Where one value lies in a [`RowChunk`] being filled: buffer, offset, length.
type ValueLoc = (u32, usize, usize);

/// Rows `local` of record batch `batch`, which are window rows `first..`.
#[derive(Clone, Copy)]
struct BatchRows<'a> {
    batch: usize,
    local: &'a [u64],
    first: usize,
}

impl ArrowReader {
    /// Opens `path`, checking that its columns are `expected` (every column read).
    pub fn open(path: &Path, expected: &[Field]) -> Result<ArrowReader> {
        ArrowReader::open_cached(path, expected, &LayoutCache::new(), &ColumnChoice::default())
    }

    /// Opens `path` with the layout in `cache`, parsing it (and filling the cache) if it
    /// is empty; `choice` says which columns are read (the cache holds the layout of one
    /// choice: a dataset's).
    pub fn open_cached(
        path: &Path,
        expected: &[Field],
        cache: &LayoutCache,
        choice: &ColumnChoice,
    ) -> Result<ArrowReader> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let layout = match cache.get() {
            Some(layout) => layout.clone(),
            None => {
                let footer = read_footer(&file, path, choice)?;
                let mut starts = vec![0u64];
                for b in &footer.batches {
                    let next = starts.last().expect("non-empty").checked_add(b.rows);
                    starts.push(next.ok_or_else(|| Error::file(path, "row count overflows"))?);
                }
                // Two readers may parse it at once: the first one kept serves both.
                cache.get_or_init(|| Arc::new(Layout { footer, starts })).clone()
            }
        };
        if layout.footer.fields() != expected {
            return Err(Error::file(path, "fields changed since the dataset was scanned"));
        }
        Ok(ArrowReader { file, path: path.to_path_buf(), layout })
    }

    /// The values of rows `local` (of batch `b`; window rows `first..`) of `columns`, from a
    /// compressed batch: each column's buffers are decompressed as a stream and only the
    /// rows' values kept (a variable-length column's offsets of the rows, then their
    /// values), so that a window holds its values and a decoder's window, not the columns
    /// of the batches its rows touch. Values cannot be read in place here.
    fn read_compressed(
        &self,
        chunk: &mut RowChunk,
        locs: &mut [ValueLoc],
        codec: Codec,
        rows: BatchRows,
        columns: &[usize],
    ) -> Result<()> {
        let BatchRows { batch: b, local, first } = rows;
        let batch = &self.layout.footer.batches[b];
        let fields = columns.len();
        for (c, &col) in columns.iter().enumerate() {
            let name = &self.layout.footer.fields()[col].name;
            let bad =
                |why: String| Error::file(&self.path, format!("{CORRUPT}: record batch {b}, column '{name}': {why}"));
            // The compressed bytes come from the file as the decoder pulls them.
            let fetch = |span: FileSpan, ranges: &[Range<u64>]| -> Result<Vec<u8>> {
                decompressed_ranges(codec, &self.file, span, ranges).map_err(|e| match e {
                    Undecodable::Corrupt(why) => bad(why),
                    Undecodable::Io(e) => read_error(&self.path, e, span.start, span.len as usize),
                })
            };
            match batch.columns.get(col).copied() {
                Some(Column::Fixed { values, width }) => {
                    // Inside the buffer: rows × width ≤ its uncompressed length (checked at open).
                    let ranges: Vec<Range<u64>> = local.iter().map(|&r| r * width..(r + 1) * width).collect();
                    let kept = fetch(values, &ranges)?;
                    chunk.add_bytes_read(values.len);
                    let buffer = chunk.add_made_buffer(Buffer::from_vec(kept));
                    let w = width as usize;
                    for k in 0..local.len() {
                        locs[(first + k) * fields + c] = (buffer, k * w, w);
                    }
                }
                Some(Column::Var { offsets, values, wide, elem }) => {
                    // Offsets `r` and `r + 1` of every row (inside the buffer: checked at open).
                    let w = width_of(wide);
                    let o = fetch(offsets, &local.iter().map(|&r| r * w..(r + 2) * w).collect::<Vec<_>>())?;
                    chunk.add_bytes_read(offsets.len + values.len);
                    let offset = |i: usize| -> i64 {
                        if wide {
                            i64::from_le_bytes(o[8 * i..8 * i + 8].try_into().expect("8 bytes"))
                        } else {
                            i64::from(i32::from_le_bytes(o[4 * i..4 * i + 4].try_into().expect("4 bytes")))
                        }
                    };
                    let elem = elem as i64;
                    // Each row's values, checked against the buffer, read in file order.
                    let mut wanted = Vec::with_capacity(local.len());
                    for (k, &r) in local.iter().enumerate() {
                        let (s, e) = (offset(2 * k).saturating_mul(elem), offset(2 * k + 1).saturating_mul(elem));
                        if !(0 <= s && s <= e && e as u64 <= values.bytes) {
                            return Err(bad(format!("bad offsets {s}..{e} for row {r}")));
                        }
                        wanted.push((s as u64..e as u64, k));
                    }
                    wanted.sort_by_key(|(r, _)| r.start);
                    let ranges: Vec<Range<u64>> = wanted.iter().map(|(r, _)| r.clone()).collect();
                    let kept = fetch(values, &ranges)?;
                    let buffer = chunk.add_made_buffer(Buffer::from_vec(kept));
                    let mut at = 0;
                    for (r, k) in wanted {
                        let len = (r.end - r.start) as usize;
                        locs[(first + k) * fields + c] = (buffer, at, len);
                        at += len;
                    }
                }
                // Made from bits after the values are read ([`ArrowReader::made_values`]).
                Some(Column::Bits { .. } | Column::Made) => {}
                None => return Err(Error::Internal(format!("column {col} of a batch of {}", batch.columns.len()))),
            }
        }
        Ok(())
    }

    /// Bits of bitmap `span` of record batch `b` (a validity bitmap or booleans) for rows
    /// `local` (sorted): one byte (0 or 1) per row. Only the bytes holding them are read
    /// (decoded, in a compressed batch); the bitmap holds every row (checked at open).
    fn bits(&self, chunk: &mut RowChunk, b: usize, name: &str, span: FileSpan, local: &[u64]) -> Result<Vec<u8>> {
        let mut at: Vec<u64> = local.iter().map(|r| r / 8).collect();
        at.dedup();
        let ranges: Vec<Range<u64>> = at.iter().map(|&i| i..i + 1).collect();
        let bytes = match self.layout.footer.batches[b].codec {
            Some(codec) => {
                chunk.add_bytes_read(span.len);
                decompressed_ranges(codec, &self.file, span, &ranges).map_err(|e| match e {
                    Undecodable::Corrupt(why) => {
                        Error::file(&self.path, format!("{CORRUPT}: record batch {b}, column '{name}': {why}"))
                    }
                    Undecodable::Io(e) => read_error(&self.path, e, span.start, span.len as usize),
                })?
            }
            None => {
                let mut out = Vec::with_capacity(ranges.len());
                let mut k = 0;
                for (g, n) in group_ranges(&ranges, RECORD_GAP_BYTES) {
                    let what = format!("the bits of column '{name}'");
                    let got = read_exact(&self.file, &self.path, span.start + g.start, g.end - g.start, &what)?;
                    chunk.add_bytes_read(got.len() as u64);
                    out.extend(ranges[k..k + n].iter().map(|r| got[(r.start - g.start) as usize]));
                    k += n;
                }
                out
            }
        };
        let mut k = 0;
        Ok(local
            .iter()
            .map(|&r| {
                while at[k] != r / 8 {
                    k += 1;
                }
                (bytes[k] >> (r % 8)) & 1
            })
            .collect())
    }

    /// What the values read leave to make, for rows `local` of batch `b` (window rows
    /// `first..`) of `columns`: booleans from their bits, validity fields from their
    /// columns' validity bitmaps, and the value of each null of a column with a null policy
    /// (its fill value, or zeros where it is masked).
    fn made_values(
        &self,
        chunk: &mut RowChunk,
        locs: &mut [ValueLoc],
        rows: BatchRows,
        columns: &[usize],
    ) -> Result<()> {
        let BatchRows { batch: b, local, first } = rows;
        let batch = &self.layout.footer.batches[b];
        let chosen = &self.layout.footer.chosen;
        let fields = columns.len();
        // One byte per row of field `c`.
        let put = |chunk: &mut RowChunk, locs: &mut [ValueLoc], c: usize, bytes: Vec<u8>| {
            let buffer = chunk.add_made_buffer(Buffer::from_vec(bytes));
            for k in 0..local.len() {
                locs[(first + k) * fields + c] = (buffer, k, 1);
            }
        };
        for (c, &col) in columns.iter().enumerate() {
            let name = &chosen.fields[col].name;
            match (batch.columns[col], chosen.sources[col]) {
                (Column::Bits { values }, _) => {
                    let bits = self.bits(chunk, b, name, values, local)?;
                    put(chunk, locs, c, bits);
                }
                (Column::Made, Source::Valid(of)) => {
                    let bits = match batch.validity[of] {
                        Some(span) => self.bits(chunk, b, &chosen.fields[of].name, span, local)?,
                        None => vec![1; local.len()],
                    };
                    put(chunk, locs, c, bits);
                }
                _ => {}
            }
            let (Some(span), Some(policy)) = (batch.validity[col], &chosen.nulls[col]) else { continue };
            let valid = self.bits(chunk, b, name, span, local)?;
            let null = match policy {
                NullPolicy::Fill(v) => super::nulls::fill_bytes(&chosen.fields[col], v)?,
                NullPolicy::Mask => vec![0; chosen.fields[col].fixed_bytes().unwrap_or(0)],
            };
            let len = null.len();
            let buffer = chunk.add_made_buffer(Buffer::from_vec(null));
            for (k, _) in valid.iter().enumerate().filter(|(_, v)| **v == 0) {
                locs[(first + k) * fields + c] = (buffer, 0, len);
            }
        }
        Ok(())
    }

    /// The value ranges of `rows` (local to the batch) of variable-length column `var`,
    /// read from its offsets buffer: checked to be ordered and to lie inside its values.
    fn value_ranges(&self, chunk: &mut RowChunk, context: &str, var: Column, rows: &[u64]) -> Result<Vec<Range<u64>>> {
        let Column::Var { offsets, values, wide, elem } = var else {
            return Err(Error::Internal(format!("{context}: offsets of a fixed-size column")));
        };
        let w = width_of(wide);
        // Offsets `r` and `r + 1` of every row; inside the buffer (checked at open).
        let wanted: Vec<Range<u64>> = rows.iter().map(|&r| r * w..(r + 2) * w).collect();
        let mut out = Vec::with_capacity(rows.len());
        let mut at = 0;
        for (g, n) in group_ranges(&wanted, RECORD_GAP_BYTES) {
            let bytes = read_exact(&self.file, &self.path, offsets.start + g.start, g.end - g.start, "offsets")?;
            chunk.add_bytes_read(bytes.len() as u64);
            let offset = |pos: u64| -> i64 {
                let i = (pos - g.start) as usize;
                if wide {
                    i64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"))
                } else {
                    i64::from(i32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes")))
                }
            };
            for (k, want) in wanted[at..at + n].iter().enumerate() {
                let (s, e) = (offset(want.start), offset(want.start + w));
                let (s, e) = (s.saturating_mul(elem as i64), e.saturating_mul(elem as i64));
                if !(0 <= s && s <= e && e as u64 <= values.len) {
                    return Err(Error::file(
                        &self.path,
                        format!(
                            "corrupt {context}: bad offsets {s}..{e} for row {} (values buffer of {} bytes)",
                            rows[at + k],
                            values.len
                        ),
                    ));
                }
                out.push(s as u64..e as u64);
            }
            at += n;
        }
        Ok(out)
    }
}

impl super::reader::FileReader for ArrowReader {
    /// From the offsets buffers (4 or 8 bytes a row): no value is read, except in
    /// compressed files, whose offsets are compressed with the values.
    fn list_lengths(&mut self, rows: u64, field: usize, elem: usize) -> Result<Vec<u64>> {
        let batches = &self.layout.footer.batches;
        if batches.iter().any(|b| b.codec.is_some()) {
            return super::reader::lengths_by_reading(self, rows, field, elem);
        }
        let mut lengths = Vec::with_capacity(usize::try_from(rows).unwrap_or(0));
        let mut scratch = RowChunk::new(1);
        for (b, batch) in batches.iter().enumerate() {
            let column = *batch.columns.get(field).ok_or_else(|| Error::Internal(format!("no column {field}")))?;
            let local: Vec<u64> = (0..batch.rows).collect();
            let context = format!("record batch {b}");
            let ranges = self.value_ranges(&mut scratch, &context, column, &local)?;
            lengths.extend(ranges.iter().map(|r| (r.end - r.start) / elem.max(1) as u64));
        }
        Ok(lengths)
    }

    /// Only the pieces' elements, where the batches they lie in are uncompressed: each
    /// row's two offsets, then the elements asked for. Compressed batches are decompressed
    /// a column at a time, and read as whole rows.
    fn read_list_pieces(
        &mut self,
        field: usize,
        elem: usize,
        pieces: &[(u64, Range<u64>)],
    ) -> Result<(RowChunk, Vec<u64>)> {
        let batches = &self.layout.footer.batches;
        if batches.iter().any(|b| b.codec.is_some()) {
            return super::reader::pieces_by_reading(self, field, elem, pieces);
        }
        let elem = elem.max(1) as u64;
        let mut chunk = RowChunk::new(1);
        let (mut ranges, mut lengths) = (Vec::with_capacity(pieces.len()), Vec::with_capacity(pieces.len()));
        let mut i = 0;
        while i < pieces.len() {
            let b = self.layout.starts.partition_point(|&s| s <= pieces[i].0) - 1;
            let batch = batches
                .get(b)
                .ok_or_else(|| Error::file(&self.path, format!("row {} is past the end of the file", pieces[i].0)))?;
            let j = i + pieces[i..].partition_point(|(r, _)| *r < self.layout.starts[b + 1]);
            let mut local: Vec<u64> = pieces[i..j].iter().map(|(r, _)| r - self.layout.starts[b]).collect();
            local.dedup();
            let column = *batch.columns.get(field).ok_or_else(|| Error::Internal(format!("no column {field}")))?;
            let Column::Var { values, .. } = column else {
                return Err(Error::Internal(format!("list pieces of fixed-size column {field}")));
            };
            let name = &self.layout.footer.fields()[field].name;
            let whole = self.value_ranges(&mut chunk, &format!("record batch {b}, column '{name}'"), column, &local)?;
            let mut k = 0;
            for (row, range) in &pieces[i..j] {
                while local[k] != row - self.layout.starts[b] {
                    k += 1;
                }
                let value = &whole[k];
                let len = (value.end - value.start) / elem;
                let (at, bytes) = (values.start + value.start, super::reader::piece_bytes(range, len, elem));
                ranges.push(at + bytes.start..at + bytes.end);
                lengths.push(len);
            }
            i = j;
        }
        push_grouped(&mut chunk, &ranges, |g, _| {
            read_exact(&self.file, &self.path, g.start, g.end - g.start, "list values")
        })?;
        Ok((chunk, lengths))
    }

    /// Values of fixed-size columns (primitives, fixed-size lists and binaries) sit at
    /// fixed offsets of their record batch's buffer, uncompressed and without nulls (both
    /// refused at open): they can be read in place. Variable-length values cannot.
    fn value_range(&self, row: u64, field: usize) -> Option<Range<u64>> {
        let b = self.layout.starts.partition_point(|&s| s <= row).checked_sub(1)?;
        let batch = self.layout.footer.batches.get(b).filter(|b| b.codec.is_none())?;
        match *batch.columns.get(field)? {
            // Inside the buffer: rows × width ≤ its length (checked at open).
            Column::Fixed { values, width } => {
                let start = values.start + (row - self.layout.starts[b]) * width;
                Some(start..start + width)
            }
            Column::Var { .. } | Column::Bits { .. } | Column::Made => None,
        }
    }

    fn positional(&self) -> Option<Positional<'_>> {
        Some(Positional { file: &self.file, path: &self.path })
    }

    /// Reads the values of `rows` (sorted) in as few reads as [`group_ranges`] allows
    /// across columns and record batches alike: the rows of a dense range (a pass, a run of
    /// a window) come in one read of their batches' byte span, not one read per column
    /// buffer of each batch.
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let all: Vec<usize> = (0..self.layout.footer.fields().len()).collect();
        self.read_columns(rows, &all)
    }

    /// Only the buffers of `columns` are read.
    fn read_columns(&mut self, rows: &[u64], columns: &[usize]) -> Result<RowChunk> {
        let fields = columns.len();
        let mut chunk = RowChunk::new(fields);
        // Every value wanted: its byte range in the file, its row (index into `rows`) and
        // its column.
        let mut wanted: Vec<(Range<u64>, usize, usize)> = Vec::with_capacity(rows.len() * fields);
        let mut locs: Vec<ValueLoc> = vec![(0, 0, 0); rows.len() * fields];
        // Batches (with their first window row and local rows) with values to make after
        // the reads: booleans, validity fields, nulls.
        let mut special = Vec::new();
        let mut i = 0;
        while i < rows.len() {
            let b = self.layout.starts.partition_point(|&s| s <= rows[i]) - 1;
            if b >= self.layout.footer.batches.len() {
                return Err(Error::file(&self.path, format!("row {} is past the end of the file", rows[i])));
            }
            let j = i + rows[i..].partition_point(|&r| r < self.layout.starts[b + 1]);
            let local: Vec<u64> = rows[i..j].iter().map(|r| r - self.layout.starts[b]).collect();
            let batch = &self.layout.footer.batches[b];
            let made = columns.iter().any(|&c| {
                matches!(batch.columns.get(c), Some(Column::Bits { .. } | Column::Made))
                    || batch.validity.get(c).is_some_and(Option::is_some)
            });
            if made {
                special.push((b, i, local.clone()));
            }
            if let Some(codec) = batch.codec {
                let rows = BatchRows { batch: b, local: &local, first: i };
                self.read_compressed(&mut chunk, &mut locs, codec, rows, columns)?;
                i = j;
                continue;
            }
            for (c, &column) in columns.iter().enumerate() {
                let Some(&column) = batch.columns.get(column) else {
                    return Err(Error::Internal(format!(
                        "column {column} of a file of {} columns",
                        batch.columns.len()
                    )));
                };
                match column {
                    Column::Fixed { values, width } => {
                        // Inside the buffer: rows × width ≤ its length (checked at open).
                        wanted.extend(
                            local
                                .iter()
                                .enumerate()
                                .map(|(k, &r)| (values.start + r * width..values.start + (r + 1) * width, i + k, c)),
                        );
                    }
                    Column::Var { values, .. } => {
                        let name = &self.layout.footer.fields()[columns[c]].name;
                        let context = format!("record batch {b}, column '{name}'");
                        let ranges = self.value_ranges(&mut chunk, &context, column, &local)?;
                        wanted.extend(
                            ranges
                                .into_iter()
                                .enumerate()
                                .map(|(k, r)| (values.start + r.start..values.start + r.end, i + k, c)),
                        );
                    }
                    Column::Bits { .. } | Column::Made => {}
                }
            }
            i = j;
        }
        // In file order (stable: a batch's buffers mostly are already), then grouped.
        wanted.sort_by_key(|(r, _, _)| r.start);
        let ranges: Vec<Range<u64>> = wanted.iter().map(|(r, _, _)| r.clone()).collect();
        let places = read_grouped(&mut chunk, &ranges, |g, served| {
            let mut served_columns: Vec<usize> = wanted[served].iter().map(|&(_, _, c)| c).collect();
            served_columns.sort_unstable();
            served_columns.dedup();
            let names: Vec<String> =
                served_columns.iter().map(|&c| format!("'{}'", self.layout.footer.fields()[columns[c]].name)).collect();
            let what = format!("{} {}", if names.len() == 1 { "column" } else { "columns" }, names.join(", "));
            read_exact(&self.file, &self.path, g.start, g.end - g.start, &what)
        })?;
        for (&(_, k, c), place) in wanted.iter().zip(places) {
            locs[k * fields + c] = place;
        }
        for (b, first, local) in special {
            self.made_values(&mut chunk, &mut locs, BatchRows { batch: b, local: &local, first }, columns)?;
        }
        for (buffer, offset, len) in locs {
            chunk.push_value(buffer, offset, len);
        }
        Ok(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::gen;
    use crate::dataset::reader::FileReader;

    fn written(dir: &Path, fields: Vec<Field>, samples: u64, batch_rows: u64) -> (PathBuf, Vec<Field>) {
        let spec = gen::GenSpec {
            format: crate::dataset::header::Format::Arrow,
            samples,
            files: 1,
            fields: fields.clone(),
            out: dir.into(),
            arrow_batch_rows: batch_rows,
        };
        gen::write_file(&spec, 0).unwrap();
        (spec.file_path(0), fields)
    }

    #[test]
    fn reads_bring_in_the_rows_needed_not_their_record_batches() {
        let dir = tempfile::tempdir().unwrap();
        let (path, fields) = written(
            dir.path(),
            vec![
                Field::tensor("x", DType::F32, vec![4, 8]),
                Field { name: "t".into(), kind: FieldKind::Bytes { utf8: true, elem: None } },
                Field::tensor("y", DType::I64, vec![]),
            ],
            5000,
            1000,
        );
        let mut r = ArrowReader::open(&path, &fields).unwrap();
        // One row in each of the five batches, plus a few dense ones, across batch ends.
        let rows: Vec<u64> = vec![3, 998, 999, 1000, 1001, 2500, 3999, 4000, 4999];
        let chunk = r.read_rows(&rows).unwrap();
        assert_eq!(chunk.rows(), rows.len());
        let mut want = Vec::new();
        let mut needed = 0u64;
        for (i, &id) in rows.iter().enumerate() {
            for f in 0..3 {
                want.clear();
                gen::value(&fields, id, f, &mut want);
                assert_eq!(chunk.value(i, f), &want[..], "row {id} field {f}");
                needed += want.len() as u64;
            }
        }
        // Values plus two offsets per variable-length value, never whole batches (each
        // batch holds ~180 KB here).
        let offsets = 2 * 4 * rows.len() as u64;
        assert!(chunk.bytes_read() <= 2 * needed + offsets, "{} bytes read for {needed}", chunk.bytes_read());
        // Dense reads stay few reads: every row of the file, five batches of three
        // columns, comes in one read of their span (the messages between the batches are
        // read through), not one per column buffer of each batch.
        let all: Vec<u64> = (0..5000).collect();
        let chunk = r.read_rows(&all).unwrap();
        assert_eq!(chunk.buffers(), 1, "{} reads for the whole file", chunk.buffers());
        for (i, &id) in all.iter().enumerate().step_by(97) {
            for f in 0..3 {
                want.clear();
                gen::value(&fields, id, f, &mut want);
                assert_eq!(chunk.value(i, f), &want[..], "row {id} field {f}");
            }
        }
    }

    /// An IPC stream (no footer: what `datasets.save_to_disk` writes) reads as the file
    /// with the same batches does; streams cut short or with a bad first message are
    /// errors naming what is wrong.
    #[test]
    fn streams_read_as_files_do_and_damaged_ones_are_errors() {
        use arrow_array::{Array, FixedSizeBinaryArray, Int64Array, RecordBatch};
        let dir = tempfile::tempdir().unwrap();
        let fields = vec![Field::tensor("x", DType::U8, vec![3]), Field::tensor("y", DType::I64, vec![])];
        let schema = Arc::new(Schema::new(vec![
            arrow_schema::Field::new("x", DataType::FixedSizeBinary(3), false),
            arrow_schema::Field::new("y", DataType::Int64, false),
        ]));
        let batch = |start: i64, n: i64| {
            let x: Vec<[u8; 3]> = (start..start + n).map(|i| [i as u8, 1, 2]).collect();
            let x = FixedSizeBinaryArray::try_from_iter(x.into_iter()).unwrap();
            let y = Int64Array::from_iter_values(start..start + n);
            RecordBatch::try_new(schema.clone(), vec![Arc::new(x) as Arc<dyn Array>, Arc::new(y)]).unwrap()
        };
        let path = dir.path().join("s.arrow");
        let mut w = arrow_ipc::writer::StreamWriter::try_new(File::create(&path).unwrap(), &schema).unwrap();
        for (start, n) in [(0, 10), (10, 10), (20, 5)] {
            w.write(&batch(start, n)).unwrap();
        }
        w.finish().unwrap();
        let (samples, scanned, _, _) = scan(&path, &ColumnChoice::default()).unwrap();
        assert_eq!((samples, &scanned), (25, &fields));
        let mut r = ArrowReader::open(&path, &fields).unwrap();
        let chunk = r.read_rows(&[0, 9, 10, 24]).unwrap();
        for (k, id) in [0u64, 9, 10, 24].into_iter().enumerate() {
            assert_eq!(chunk.value(k, 0), &[id as u8, 1, 2]);
            assert_eq!(chunk.value(k, 1), &(id as i64).to_le_bytes());
        }
        let bytes = std::fs::read(&path).unwrap();
        // Without its end-of-stream marker (8 bytes), a stream still reads whole.
        std::fs::write(&path, &bytes[..bytes.len() - 8]).unwrap();
        assert_eq!(scan(&path, &ColumnChoice::default()).unwrap().0, 25);
        // Cut inside the last batch's body, inside a header, or after a stray byte.
        for (cut, needle) in [(bytes.len() - 20, "lies past the end of the file"), (bytes.len() - 300, "past the end")]
        {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let e = scan(&path, &ColumnChoice::default()).unwrap_err().to_string();
            assert!(e.contains("corrupt Arrow IPC file") && e.contains(needle), "cut at {cut}: {e}");
        }
        let mut stray = bytes[..bytes.len() - 8].to_vec();
        stray.push(7);
        std::fs::write(&path, &stray).unwrap();
        assert!(scan(&path, &ColumnChoice::default()).unwrap_err().to_string().contains("1 stray bytes at its end"));
        // Not a stream either.
        let mut junk = bytes.clone();
        junk[7] ^= 0x80;
        std::fs::write(&path, &junk).unwrap();
        let e = scan(&path, &ColumnChoice::default()).unwrap_err().to_string();
        assert!(e.contains("not an Arrow IPC file or stream"), "{e}");
    }

    /// Compressed IPC buffers (LZ4 frame, ZSTD, or stored) decode as streams, only the
    /// ranges asked for kept; a length past what the codec can expand the buffer to, a
    /// length the data does not match, a range past it and data of another codec are errors.
    #[test]
    fn compressed_buffers_decode_and_bad_ones_are_errors() {
        use std::io::Write;
        let data: Vec<u8> = (0..1000u32).flat_map(|i| (i % 7).to_le_bytes()).collect();
        let mut lz = Vec::new();
        let mut e = lz4_flex::frame::FrameEncoder::new(&mut lz);
        e.write_all(&data).unwrap();
        e.finish().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        let framed = |len: i64, body: &[u8]| [len.to_le_bytes().as_slice(), body].concat();
        let decode = |codec: Codec, buf: Vec<u8>, bytes: u64, ranges: &[Range<u64>]| {
            std::fs::write(&path, &buf).unwrap();
            let span = FileSpan { start: 0, len: buf.len() as u64, bytes };
            decompressed_ranges(codec, &File::open(&path).unwrap(), span, ranges).map_err(|e| match e {
                Undecodable::Corrupt(why) => why,
                Undecodable::Io(e) => e.to_string(),
            })
        };
        assert_eq!(decode(Codec::Lz4, framed(4000, &lz), 4000, &[0..4000]).unwrap(), data);
        // Overlapping and apart, in order: the decoder runs once, through.
        let want = [&data[0..8], &data[4..12], &data[3992..4000]].concat();
        assert_eq!(decode(Codec::Lz4, framed(4000, &lz), 4000, &[0..8, 4..12, 3992..4000]).unwrap(), want);
        assert_eq!(decode(Codec::Zstd, framed(-1, b"abc"), 3, &[1..3]).unwrap(), b"bc");
        assert_eq!(decode(Codec::Lz4, vec![], 0, &[0..0]).unwrap(), Vec::<u8>::new());
        let e = decode(Codec::Lz4, framed(3000, &lz), 3000, &[0..8]).unwrap_err();
        assert!(e.contains("decodes to more than 3000 bytes, its header says 3000"), "{e}");
        let e = decode(Codec::Lz4, framed(5000, &lz), 5000, &[0..8]).unwrap_err();
        assert!(e.contains("decodes to 4000 bytes, its header says 5000"), "{e}");
        let e = decode(Codec::Lz4, framed(4000, &lz), 4000, &[3990..4010]).unwrap_err();
        assert!(e.contains("decodes to 4000 bytes, byte 4010 is needed"), "{e}");
        let e = decode(Codec::Zstd, framed(4000, &lz), 4000, &[0..8]).unwrap_err();
        assert!(e.contains("does not decode"), "{e}");
        // At open: a length past what the codec can expand the buffer to, a short buffer.
        std::fs::write(&path, framed(1 << 40, &lz)).unwrap();
        let mut spans = [FileSpan { start: 0, len: 8 + lz.len() as u64, bytes: 0 }];
        let e =
            uncompressed_lengths(&File::open(&path).unwrap(), &path, 3, Codec::Lz4, &mut spans, &[true]).unwrap_err();
        assert!(e.to_string().contains("batch 3 buffer 0: 1099511627776 bytes uncompressed from"), "{e}");
        let mut spans = [FileSpan { start: 0, len: 8 + lz.len() as u64, bytes: 0 }];
        std::fs::write(&path, framed(4000, &lz)).unwrap();
        uncompressed_lengths(&File::open(&path).unwrap(), &path, 3, Codec::Lz4, &mut spans, &[true]).unwrap();
        assert_eq!(spans[0].bytes, 4000);
        let mut spans = [FileSpan { start: 0, len: 5, bytes: 0 }];
        let e =
            uncompressed_lengths(&File::open(&path).unwrap(), &path, 3, Codec::Zstd, &mut spans, &[true]).unwrap_err();
        assert!(e.to_string().contains("buffer 0: 5 bytes, too short"), "{e}");
    }

    /// Hub-style columns beside the ones read (a struct, a list of text, a dictionary, text
    /// views, a nullable column): a choice of columns passes over the others, whatever
    /// their types and nulls, in files and streams alike; booleans are one byte a value;
    /// nulls are refused without a policy, filled or masked with one.
    #[test]
    fn only_the_columns_read_are_checked_and_booleans_and_nulls_are_delivered() {
        use arrow_array::builder::{Int32Builder, ListBuilder, StringBuilder, StructBuilder};
        use arrow_array::types::Int32Type;
        use arrow_array::{
            ArrayRef, BooleanArray, DictionaryArray, Int32Array, Int64Array, RecordBatch, StringViewArray,
        };
        let batch = |start: i64| {
            let n = 10;
            let ids = start..start + n;
            let mut st =
                StructBuilder::from_fields(vec![arrow_schema::Field::new("a", DataType::Int32, true)], n as usize);
            let mut list = ListBuilder::new(StringBuilder::new());
            for i in ids.clone() {
                st.field_builder::<Int32Builder>(0).unwrap().append_value(i as i32);
                st.append(true);
                list.values().append_value(format!("t{i}"));
                list.append(i % 2 == 0);
            }
            let dict: DictionaryArray<Int32Type> = ids.clone().map(|i| if i % 2 == 0 { "a" } else { "b" }).collect();
            RecordBatch::try_from_iter([
                ("x", Arc::new(Int64Array::from_iter_values(ids.clone())) as ArrayRef),
                ("s", Arc::new(st.finish())),
                ("flag", Arc::new(BooleanArray::from_iter(ids.clone().map(|i| Some(i % 3 == 0))))),
                ("n", Arc::new(Int32Array::from_iter(ids.clone().map(|i| (i % 4 != 1).then_some(i as i32 * 10))))),
                ("l", Arc::new(list.finish())),
                ("d", Arc::new(dict)),
                (
                    "v",
                    Arc::new(StringViewArray::from_iter_values(ids.map(|i| format!("a longer text than twelve {i}")))),
                ),
            ])
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let (b0, b1) = (batch(0), batch(10));
        let file = dir.path().join("f.arrow");
        let mut w = arrow_ipc::writer::FileWriter::try_new(File::create(&file).unwrap(), &b0.schema()).unwrap();
        w.write(&b0).unwrap();
        w.write(&b1).unwrap();
        w.finish().unwrap();
        let stream = dir.path().join("s.arrow");
        let mut w = arrow_ipc::writer::StreamWriter::try_new(File::create(&stream).unwrap(), &b0.schema()).unwrap();
        w.write(&b0).unwrap();
        w.write(&b1).unwrap();
        w.finish().unwrap();
        let choice = |names: &[&str], nulls: &[(&str, &str)]| ColumnChoice {
            names: Some(names.iter().map(|n| n.to_string()).collect()),
            nulls: nulls.iter().map(|(k, v)| (k.to_string(), v.parse().unwrap())).collect(),
        };
        for path in [&file, &stream] {
            let e = scan(path, &ColumnChoice::default()).unwrap_err().to_string();
            assert!(
                e.contains("column 's' has unsupported type Struct") && e.contains("--fields can leave it out"),
                "{e}"
            );
            // Nulls in a column not read are no error; in one read without a policy they are.
            let (rows, fields, _, in_place) = scan(path, &choice(&["x"], &[])).unwrap();
            assert_eq!((rows, fields.len(), in_place), (20, 1, true));
            let e = scan(path, &choice(&["x", "n"], &[])).unwrap_err().to_string();
            assert!(e.contains("column 'n' has nulls in record batch 0") && e.contains("--nulls n=mask"), "{e}");
            for (policy, null) in [("mask", vec![0u8; 4]), ("fill:-1", (-1i32).to_le_bytes().to_vec())] {
                let c = choice(&["n", "flag", "x"], &[("n", policy)]);
                let (_, fields, _, in_place) = scan(path, &c).unwrap();
                let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
                let mask = policy == "mask";
                assert_eq!(names, if mask { vec!["x", "flag", "n", "n_valid"] } else { vec!["x", "flag", "n"] });
                assert_eq!(fields[1], Field::tensor("flag", DType::Bool, vec![]));
                assert!(!in_place, "booleans and nulls are made, not read in place");
                let mut r = ArrowReader::open_cached(path, &fields, &LayoutCache::new(), &c).unwrap();
                let rows = [0u64, 1, 5, 9, 10, 13, 19];
                let chunk = r.read_rows(&rows).unwrap();
                for (k, &i) in rows.iter().enumerate() {
                    assert_eq!(chunk.value(k, 0), &(i as i64).to_le_bytes(), "{policy}: x of row {i}");
                    assert_eq!(chunk.value(k, 1), &[u8::from(i % 3 == 0)], "{policy}: flag of row {i}");
                    let n = if i % 4 == 1 { null.clone() } else { (i as i32 * 10).to_le_bytes().to_vec() };
                    assert_eq!(chunk.value(k, 2), &n[..], "{policy}: n of row {i}");
                    if mask {
                        assert_eq!(chunk.value(k, 3), &[u8::from(i % 4 != 1)], "row {i}: n_valid");
                    }
                }
                // A field alone, the validity field alone.
                let only = r.read_columns(&[1, 2], &[fields.len() - 1]).unwrap();
                let want: [&[u8]; 2] = if mask { [&[0], &[1]] } else { [&null, &20i32.to_le_bytes()] };
                assert_eq!((only.value(0, 0), only.value(1, 0)), (want[0], want[1]), "{policy}");
            }
        }
    }

    #[test]
    fn a_file_shorter_than_its_footer_says_is_an_error_not_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let (path, fields) = written(dir.path(), vec![Field::tensor("x", DType::U8, vec![100])], 100, 10);
        let mut r = ArrowReader::open(&path, &fields).unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len / 2).unwrap();
        let err = r.read_rows(&[99]).unwrap_err().to_string();
        assert!(err.contains("truncated") && err.contains("lies past the end of the file"), "{err}");
    }
}
