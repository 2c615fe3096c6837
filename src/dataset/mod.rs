//! Datasets: an ordered list of files whose samples form the global id space `[0, N)`.
//!
//! Global sample ids run in file order, then row order (docs/design.md, "Dataset"). This module
//! knows how to find the files of a dataset ([`resolve_paths`]), how to read the header of
//! one file ([`scan_file`]: sample count and fields, without reading the data), and how to
//! read rows of a file ([`FileReader`]). It has no communication in it: the collective
//! open, where each header is scanned by one rank and the results are shared, lives in
//! [`crate::loader`].
//!
//! Formats: NumPy `.npy` ([`npy`]), HDF5 `.h5`/`.hdf5` (`hdf5`, with the feature of that name), Arrow IPC files
//! `.arrow`/`.feather`/`.ipc` ([`arrow`]) and raw fixed-size records `.raw` with a
//! `schema.json` beside them ([`raw`]).

pub mod arrow;
pub mod gen;
#[cfg(feature = "hdf5")]
pub mod hdf5;
pub mod megatron;
pub mod npy;
pub mod npy_header;
pub mod nulls;
pub mod pack;
pub mod parquet;
mod parquet_pages;
pub mod raw;
pub mod rows;
pub mod schema;
pub mod wds;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::types::SampleId;
pub use rows::RowChunk;
pub use schema::{DType, Field, FieldKind};

/// A file format meshfeed can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Npy,
    Hdf5,
    Arrow,
    Raw,
    /// WebDataset tar shards.
    #[serde(rename = "tar")]
    WebDataset,
    /// Megatron-LM indexed datasets (the `.idx`; the tokens in the `.bin` beside it).
    #[serde(rename = "idx")]
    Megatron,
    Parquet,
}

impl Format {
    /// The format a file name implies, from its extension.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "npy" => Some(Format::Npy),
            "h5" | "hdf5" => Some(Format::Hdf5),
            "arrow" | "feather" | "ipc" => Some(Format::Arrow),
            "raw" => Some(Format::Raw),
            "tar" => Some(Format::WebDataset),
            "idx" => Some(Format::Megatron),
            "parquet" | "pq" => Some(Format::Parquet),
            _ => None,
        }
    }

    /// Parses a format name as given to `meshfeed gen --format`.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "npy" => Some(Format::Npy),
            "hdf5" | "h5" => Some(Format::Hdf5),
            "arrow" => Some(Format::Arrow),
            "raw" => Some(Format::Raw),
            _ => None,
        }
    }

    /// File extension used when writing.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Npy => "npy",
            Format::Hdf5 => "h5",
            Format::Arrow => "arrow",
            Format::Raw => "raw",
            Format::WebDataset => "tar",
            Format::Megatron => "idx",
            Format::Parquet => "parquet",
        }
    }
}

/// Options that change how files are interpreted.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DatasetOptions {
    /// HDF5 group holding the datasets (default: the file root).
    pub hdf5_group: Option<String>,
    /// The fields delivered, in this order (default: every field of the files, in their
    /// order). Readers of formats that store fields apart read only these.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    /// Sequence packing of a token field ([`pack`]): the samples are then the packed ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<pack::PackSpec>,
    /// The most bytes a reader decodes at once where it cannot decode less than a whole
    /// unit of the file (a Parquet page): a larger unit is refused, so that memory follows
    /// the window, not the file. A job sets it to its window budget (`--window-bytes`);
    /// `None`: [`crate::config::DEFAULT_WINDOW_BYTES`]. Never less than
    /// [`MIN_DECODE_LIMIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_limit: Option<u64>,
    /// Per field of an Arrow or Parquet file, what its nulls are delivered as
    /// ([`nulls::NullPolicy`]); a delivered field with nulls and no policy is an error.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub nulls: std::collections::BTreeMap<String, nulls::NullPolicy>,
}

/// The least [`DatasetOptions::decode_limit`]: 1 MiB, the data page size Parquet writers
/// aim at by default (pyarrow, Spark's parquet-mr, arrow-rs), so that files written with
/// the defaults read at any window budget (a window holds one step at least, whatever its
/// budget, and a small one is exceeded by it anyway).
pub const MIN_DECODE_LIMIT: u64 = 1 << 20;

impl DatasetOptions {
    /// The columns of Arrow and Parquet files a dataset reads, and their null policies:
    /// with sequence packing the token column, else the selected fields (their validity
    /// fields are made, not read), else every column.
    pub fn columns(&self) -> nulls::ColumnChoice {
        let names = match (&self.pack, &self.fields) {
            (Some(spec), _) => Some(vec![spec.field.clone()]),
            (None, names) => names.clone(),
        };
        nulls::ColumnChoice { names, nulls: self.nulls.clone() }
    }

    /// [`DatasetOptions::decode_limit`], or its default; at least [`MIN_DECODE_LIMIT`].
    pub fn decode_limit(&self) -> u64 {
        self.decode_limit.unwrap_or(crate::config::DEFAULT_WINDOW_BYTES).max(MIN_DECODE_LIMIT)
    }
}

/// What the header of one file says.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileInfo {
    pub path: PathBuf,
    pub format: Format,
    pub samples: u64,
    pub fields: Vec<Field>,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// Which file this was when it was scanned, besides its size: readers check the file
    /// against it ([`FileInfo::check_unchanged`]).
    pub stamp: FileStamp,
    /// Per field, the bytes of the file's variable-length values (0 for fixed-size
    /// fields), where the format tells them without reading the data (Arrow: the value
    /// buffers' lengths in its record batch headers); empty where it does not. The window
    /// budget sizes windows by them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub value_bytes: Vec<u64>,
    /// Whether every fixed-size value lies whole, uncompressed and in the host's byte order
    /// at a fixed offset of the file, so that it can be read in place
    /// ([`FileReader::value_range`]): `.npy`, raw records and Arrow IPC always (their
    /// readers refuse anything else), HDF5 where every dataset is contiguous, unfiltered
    /// and little-endian.
    #[serde(default)]
    pub in_place: bool,
    /// With sequence packing: the tokens of the file's packed stream (its documents' tokens
    /// and end-of-document tokens), which give its packed sample count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack_tokens: Option<u64>,
}

/// The identity of a file besides its size: its last modification time and inode number.
/// With the size, it tells whether a file was truncated, rewritten or replaced since it
/// was scanned. Neither is part of the stream's fingerprint: a copy of a dataset resumes
/// the same stream.
///
/// The scan of a file happens on one rank and its stamp is checked on others, maybe on
/// other hosts of one shared filesystem. The modification time is the same on every
/// client; the device number is not, and the inode number is on NFS, Lustre and GPFS but
/// not on every filesystem (sshfs numbers inodes per mount): the inode is compared only
/// on the host that scanned the file (`host`, a hash of its name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileStamp {
    /// Last modification time, nanoseconds since the Unix epoch.
    pub modified_ns: i64,
    pub inode: u64,
    /// CRC-32 of the name of the host that took the stamp (0: unknown).
    #[serde(default)]
    pub host: u32,
}

impl FileStamp {
    /// The stamp of a file's metadata, taken on this host.
    pub fn of(meta: &std::fs::Metadata) -> FileStamp {
        let ns = meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec());
        FileStamp { modified_ns: ns, inode: meta.ino(), host: this_host_hash() }
    }
}

/// [`FileStamp::host`] of this process's host.
fn this_host_hash() -> u32 {
    static HASH: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *HASH.get_or_init(|| crc32fast::hash(crate::transport::hosts::this_host().as_bytes()).max(1))
}

/// `secs.nanos` of a time in nanoseconds since the epoch, for messages.
fn show_time(ns: i64) -> String {
    format!("{}.{:09}", ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

impl FileInfo {
    /// How the file at `meta` differs from this scanned file, if it does: its size, its
    /// modification time or, on the host that scanned it, its inode (the path now names
    /// another file).
    pub fn describe_change(&self, meta: &std::fs::Metadata) -> Option<String> {
        let stamp = FileStamp::of(meta);
        let mut changes = Vec::new();
        if meta.len() != self.bytes {
            changes.push(format!("{} → {} bytes", self.bytes, meta.len()));
        }
        if stamp.inode != self.stamp.inode && stamp.host == self.stamp.host {
            changes.push(format!("replaced by another file (inode {} → {})", self.stamp.inode, stamp.inode));
        }
        if stamp.modified_ns != self.stamp.modified_ns {
            changes.push(format!(
                "modified (mtime {} → {} s since the epoch)",
                show_time(self.stamp.modified_ns),
                show_time(stamp.modified_ns)
            ));
        }
        (!changes.is_empty()).then(|| format!("changed since the dataset was opened: {}", changes.join(", ")))
    }

    /// Checks that the file at this path is still the one that was scanned: same size,
    /// modification time and inode (one `stat`). Readers do this after every read, so
    /// bytes of a file truncated or rewritten under a running job are never delivered —
    /// including where a format library hides short reads (HDF5 fills them with zeros).
    pub fn check_unchanged(&self) -> Result<()> {
        let meta = std::fs::metadata(&self.path).map_err(|e| {
            let reason = format!("changed since the dataset was opened: it can no longer be read ({e})");
            Error::file_caused(&self.path, reason, e)
        })?;
        match self.describe_change(&meta) {
            Some(change) => Err(Error::file(&self.path, change)),
            None => Ok(()),
        }
    }
}

/// Expands `--data` arguments into the ordered list of files.
///
/// A directory contributes every file with a supported extension in it and in its
/// subdirectories, in lexicographic order of their paths below it (each directory's entries
/// in name order, a subdirectory's files where its name comes); hidden subdirectories (a
/// name starting with `.`) are not walked. A file is taken as given. Entries of other
/// extensions are ignored. A missing path, a directory tree without dataset files, a file
/// of unknown format, a directory reached twice (a symbolic link back into the tree: its
/// files would be read twice), and anything that is not a regular file (a dangling or
/// looping symbolic link, a directory named `x.npy`, a FIFO, a socket or a device — given
/// directly or found in a directory) is an error naming the path: a listed file the job
/// cannot use must not silently shrink the dataset, and a FIFO would block every rank that
/// opens it.
pub fn resolve_paths(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Format)>> {
    if paths.is_empty() {
        return Err(Error::Config("no dataset given (--data PATH...)".into()));
    }
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| unusable(path, e))?;
        if meta.is_dir() {
            let mut found: Vec<(PathBuf, Format)> = Vec::new();
            walk(path, &mut Vec::new(), &mut found)?;
            if found.is_empty() {
                return Err(Error::file(
                    path,
                    "directory holds no .npy, .h5, .arrow, .parquet, .raw, .tar or .idx files (nor do its subdirectories)",
                ));
            }
            files.extend(found);
        } else {
            regular_file(path, &meta)?;
            let format = Format::from_path(path).ok_or_else(|| {
                Error::file(
                    path,
                    "unknown format (expected .npy, .h5/.hdf5, .arrow/.feather/.ipc, .parquet, .raw, .tar or .idx)",
                )
            })?;
            files.push((path.clone(), format));
        }
    }
    Ok(files)
}

/// Appends the dataset files under directory `dir` to `found`, in the order
/// [`resolve_paths`] gives. `seen` holds the directories walked (device, inode).
fn walk(dir: &Path, seen: &mut Vec<(u64, u64)>, found: &mut Vec<(PathBuf, Format)>) -> Result<()> {
    let meta = std::fs::metadata(dir).map_err(|e| unusable(dir, e))?;
    if seen.contains(&(meta.dev(), meta.ino())) {
        return Err(Error::file(
            dir,
            "directory reached twice (a symbolic link back into the dataset): its files would be read twice",
        ));
    }
    seen.push((meta.dev(), meta.ino()));
    let mut entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<PathBuf>>>()
        .map_err(|e| Error::io(dir, e))?;
    entries.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    for p in entries {
        if let Some(format) = Format::from_path(&p) {
            let meta = std::fs::metadata(&p).map_err(|e| unusable(&p, e))?;
            regular_file(&p, &meta)?;
            found.push((p, format));
        } else if p.file_name().is_some_and(|n| !n.as_encoded_bytes().starts_with(b".")) && p.is_dir() {
            walk(&p, seen, found)?;
        }
    }
    Ok(())
}

/// Why `path` cannot be used, from the error of `stat` (which follows symbolic links): the
/// OS's error, kept as the cause and in the text, after what it means for a link.
fn unusable(path: &Path, e: std::io::Error) -> Error {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let link = match e.kind() {
        std::io::ErrorKind::NotFound if is_link => "dangling symbolic link (its target does not exist)",
        _ if e.raw_os_error() == Some(libc::ELOOP) => "symbolic link loop",
        _ => return Error::io(path, e),
    };
    Error::file_caused(path, format!("{link}: {e}"), e)
}

/// Refuses anything but a regular file (after following symbolic links), naming what it is.
fn regular_file(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let t = meta.file_type();
    let what = if t.is_file() {
        return Ok(());
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "not a regular file"
    };
    Err(Error::file(path, format!("is {what}, not a regular file: only regular files can be dataset files")))
}

/// Without the `hdf5` feature, an HDF5 file is a clear error naming it.
#[cfg(not(feature = "hdf5"))]
pub(crate) fn hdf5_disabled(path: &Path) -> Error {
    Error::feature_disabled("hdf5", format!("HDF5 file {}", path.display()))
}

/// Reads the header of one file: its sample count and fields.
pub fn scan_file(path: &Path, format: Format, options: &DatasetOptions) -> Result<FileInfo> {
    // The stamp is taken before the header is read: a change after this point (also one
    // during the scan) is found by the first read.
    let meta = std::fs::metadata(path).map_err(|e| unusable(path, e))?;
    regular_file(path, &meta)?;
    let (bytes, stamp) = (meta.len(), FileStamp::of(&meta));
    // Variable-length value sizes (Arrow), and whether values can be read in place.
    let (samples, fields, value_bytes, in_place) = match format {
        Format::Npy => {
            let (samples, fields) = npy::scan(path)?;
            (samples, fields, Vec::new(), true)
        }
        #[cfg(feature = "hdf5")]
        Format::Hdf5 => {
            let (samples, fields, contiguous) = hdf5::scan(path, options.hdf5_group.as_deref())?;
            (samples, fields, Vec::new(), contiguous)
        }
        #[cfg(not(feature = "hdf5"))]
        Format::Hdf5 => {
            let _ = options; // only HDF5 files have options (the group)
            return Err(hdf5_disabled(path));
        }
        Format::Arrow => arrow::scan(path, &options.columns())?,
        Format::Raw => {
            let (samples, fields) = raw::scan(path)?;
            (samples, fields, Vec::new(), true)
        }
        Format::WebDataset => {
            let (samples, fields, values) = wds::scan(path)?;
            (samples, fields, values, true)
        }
        Format::Megatron => {
            let (samples, fields, values) = megatron::scan(path)?;
            (samples, fields, values, true)
        }
        Format::Parquet => {
            let (samples, fields, values) = parquet::scan(path, &options.columns())?;
            (samples, fields, values, false)
        }
    };
    if let Some(reason) = schema::duplicate_name(&fields) {
        return Err(Error::file(path, reason));
    }
    let mut info = FileInfo {
        path: path.to_path_buf(),
        format,
        samples,
        fields,
        bytes,
        stamp,
        value_bytes,
        in_place,
        pack_tokens: None,
    };
    if let Some(spec) = &options.pack {
        // The documents' lengths, once, here; each reader's rank plans from them again.
        let packing = pack::Packing::resolve(spec, &info.fields)?;
        let mut reader = open_format(&info, options, &info.fields, &Parsed::default())?;
        let lengths = reader.list_lengths(info.samples, packing.column, packing.dtype.size())?;
        info.pack_tokens = Some(packing.stream_tokens(&lengths));
    }
    Ok(info)
}

/// Opens a reader of `info`'s file in its format, expecting `fields`.
fn open_format(
    info: &FileInfo,
    options: &DatasetOptions,
    fields: &[Field],
    parsed: &Parsed,
) -> Result<Box<dyn FileReader>> {
    Ok(match info.format {
        Format::Npy => Box::new(npy::open(&info.path, fields)?) as Box<dyn FileReader>,
        Format::Raw => Box::new(raw::open(&info.path, fields)?),
        #[cfg(feature = "hdf5")]
        Format::Hdf5 => Box::new(hdf5::Hdf5Reader::open(&info.path, options, fields)?),
        #[cfg(not(feature = "hdf5"))]
        Format::Hdf5 => {
            let _ = options;
            return Err(hdf5_disabled(&info.path));
        }
        Format::Arrow => {
            Box::new(arrow::ArrowReader::open_cached(&info.path, fields, &parsed.arrow, &options.columns())?)
        }
        Format::WebDataset => Box::new(wds::WdsReader::open_cached(&info.path, fields, &parsed.tar)?),
        Format::Megatron => Box::new(megatron::MegatronReader::open_cached(&info.path, fields, &parsed.megatron)?),
        Format::Parquet => {
            let limit = options.decode_limit();
            Box::new(parquet::ParquetReader::open_cached(
                &info.path,
                fields,
                &parsed.parquet,
                limit,
                &options.columns(),
            )?)
        }
    })
}

/// [`FileReader::list_lengths`] by reading the values, a thousand rows at a time.
fn lengths_by_reading<R: FileReader + ?Sized>(
    reader: &mut R,
    rows: u64,
    field: usize,
    elem: usize,
) -> Result<Vec<u64>> {
    let mut lengths = Vec::with_capacity(usize::try_from(rows).unwrap_or(0));
    let mut start = 0;
    while start < rows {
        let ids: Vec<u64> = (start..rows.min(start + 1024)).collect();
        let chunk = reader.read_columns(&ids, &[field])?;
        lengths.extend((0..chunk.rows()).map(|r| (chunk.value(r, 0).len() / elem.max(1)) as u64));
        start += ids.len() as u64;
    }
    Ok(lengths)
}

/// [`FileReader::read_list_pieces`] by reading the rows' whole values.
/// The bytes, within a list value of `len` elements of `elem` bytes each, of its elements
/// `range` clamped to the value: what every [`FileReader::read_list_pieces`] delivers of a
/// piece, so that all formats cut pieces alike.
pub(crate) fn piece_bytes(range: &std::ops::Range<u64>, len: u64, elem: u64) -> std::ops::Range<u64> {
    let end = range.end.min(len);
    range.start.min(end) * elem..end * elem
}

fn pieces_by_reading<R: FileReader + ?Sized>(
    reader: &mut R,
    field: usize,
    elem: usize,
    pieces: &[(u64, std::ops::Range<u64>)],
) -> Result<(RowChunk, Vec<u64>)> {
    let mut rows: Vec<u64> = pieces.iter().map(|(r, _)| *r).collect();
    rows.dedup();
    let whole = reader.read_columns(&rows, &[field])?;
    let elem = elem.max(1);
    let (mut parts, mut lengths) = (Vec::with_capacity(pieces.len()), Vec::with_capacity(pieces.len()));
    let mut k = 0;
    for (row, range) in pieces {
        k += rows[k..]
            .iter()
            .position(|r| r == row)
            .ok_or_else(|| Error::Internal(format!("list pieces not sorted by row (row {row})")))?;
        let len = (whole.value(k, 0).len() / elem) as u64;
        lengths.push(len);
        // Within a value held in memory: the bounds fit a usize.
        let bytes = piece_bytes(range, len, elem as u64);
        parts.push((k, bytes.start as usize..bytes.end as usize));
    }
    Ok((whole.slices(0, &parts), lengths))
}

/// Reads rows of one file.
pub trait FileReader: Send {
    /// Reads the given rows of this file: local row indices, sorted ascending, unique.
    /// The returned chunk holds them in the same order.
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk>;

    /// As [`FileReader::read_rows`], for only the fields `columns` (indices into the
    /// file's fields): the chunk's field `k` is the file's field `columns[k]`. Formats
    /// that store fields apart (HDF5, Arrow) read only those; the default reads whole rows.
    fn read_columns(&mut self, rows: &[u64], columns: &[usize]) -> Result<RowChunk> {
        Ok(self.read_rows(rows)?.project(columns))
    }

    /// Per row of the file's `rows` rows, the number of elements of list field `field`
    /// (elements of `elem` bytes): what sequence packing plans with. The default reads the
    /// field's values, a thousand rows at a time; formats that keep the lengths apart
    /// (Megatron's index) answer without reading values.
    fn list_lengths(&mut self, rows: u64, field: usize, elem: usize) -> Result<Vec<u64>> {
        lengths_by_reading(self, rows, field, elem)
    }

    /// Parts of list values: for each `(row, range)` of `pieces` (sorted by row, then by
    /// the start of the range), elements `range` of the value of list field `field` of that
    /// row (elements of `elem` bytes), clamped to the value, as the one field of row `k` of
    /// the chunk; and per piece, how many elements its row's whole value has (for the
    /// caller to check against what it expects). What sequence packing reads, so that a
    /// packed sample of a long document reads its own tokens, not the document. The
    /// default reads the rows' whole values; formats that know where each element lies
    /// (Megatron's `.bin`, uncompressed Arrow) read only the pieces.
    fn read_list_pieces(
        &mut self,
        field: usize,
        elem: usize,
        pieces: &[(u64, std::ops::Range<u64>)],
    ) -> Result<(RowChunk, Vec<u64>)> {
        pieces_by_reading(self, field, elem, pieces)
    }

    /// Where field `field` of local row `row` lies in the file, for formats that store
    /// values whole and uncompressed at fixed offsets (`.npy`, raw records): such values
    /// can be read straight into their destination with [`FileReader::read_at`]. `None`
    /// (the default, and for a row past the end): read rows instead.
    fn value_range(&self, row: u64, field: usize) -> Option<std::ops::Range<u64>> {
        let _ = (row, field);
        None
    }

    /// Reads exactly `out.len()` bytes at `offset` of the file (a range from
    /// [`FileReader::value_range`]); a file that ends first is an error.
    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        let _ = (offset, out);
        Err(Error::Config("internal: this reader reads rows, not byte ranges".into()))
    }

    /// Reads the bytes at `offset` of the file into `bufs`, one after another, as one
    /// read (`preadv`): a contiguous range of the file scattered into several places.
    fn read_vectored_at(&mut self, offset: u64, bufs: &mut [std::io::IoSliceMut<'_>]) -> Result<()> {
        let mut at = offset;
        for buf in bufs {
            self.read_at(at, buf)?;
            at += buf.len() as u64;
        }
        Ok(())
    }

    /// Checks that the file is still the one scanned (a caller of [`FileReader::read_at`]
    /// checks once after a window's reads, as [`FileReader::read_rows`] does by itself).
    fn check(&self) -> Result<()> {
        Ok(())
    }

    /// Tells the kernel that bytes `range` of the file will be read soon (readahead into
    /// the page cache; for readers with [`FileReader::value_range`]). Advice only: it
    /// changes no result, and failing to give it is no error.
    fn advise(&self, range: std::ops::Range<u64>) {
        let _ = range;
    }

    /// Tells the kernel that bytes `range` of the file will not be read again soon (they
    /// leave the page cache). Advice only, like [`FileReader::advise`].
    fn drop_cache(&self, range: std::ops::Range<u64>) {
        let _ = range;
    }

    /// Tells the kernel that this reader reads at random (`POSIX_FADV_RANDOM`: no
    /// readahead): a 16 KiB value then costs one 16 KiB read, not a 64 KiB readahead
    /// window. Advice only.
    fn random_access(&self) {
        if let Some(f) = self.positional() {
            crate::dataset::rows::advise_random(f);
        }
    }

    /// The open file, for readers whose values lie at [`FileReader::value_range`]: reads
    /// of such ranges may then run on several threads at once (`pread` on a shared
    /// descriptor). A caller checks the file with [`FileReader::check`] afterwards, as after
    /// [`FileReader::read_at`].
    fn positional(&self) -> Option<&std::fs::File> {
        None
    }
}

/// What the first reader of a file parsed of it (footer, headers, index), by format: the
/// readers opened after it (each pass reopens the files) take it from here instead of
/// reading it again.
#[derive(Debug, Default)]
struct Parsed {
    arrow: arrow::LayoutCache,
    tar: wds::IndexCache,
    megatron: megatron::IndexCache,
    parquet: parquet::MetaCache,
    plan: pack::PlanCache,
}

/// An ordered list of files with identical fields.
#[derive(Clone, Debug)]
pub struct Dataset {
    files: Vec<FileInfo>,
    /// Every field of the files (`fields` is what is delivered of them).
    file_fields: Vec<Field>,
    /// The file field of each delivered field, where a selection leaves some out.
    columns: Option<Arc<[usize]>>,
    /// What each file's reader parsed of it, kept for the readers after it (shared by clones).
    parsed: Arc<[Parsed]>,
    /// With sequence packing, how the files' documents are packed (`fields` are then the
    /// packed fields and `starts` count packed samples).
    packing: Option<Arc<pack::Packing>>,
    fields: Vec<Field>,
    /// `starts[i]` is the global id of the first sample of file `i`; `starts[len]` is N.
    starts: Vec<u64>,
    options: DatasetOptions,
    /// The feeder the rows come from, where they are not read from the files here: the
    /// address of the feeder rank that serves each file, and this process's connections.
    feeder: Option<Arc<crate::feed::client::Feed>>,
}

impl Dataset {
    /// Builds a dataset from scanned file headers, checking that all files have the
    /// fields of the first one.
    pub fn from_files(mut files: Vec<FileInfo>, options: DatasetOptions) -> Result<Dataset> {
        let first = files.first().ok_or_else(|| Error::Config("the dataset has no files".into()))?;
        // `scan_file` refuses these already; headers built by hand come through here.
        if let Some(reason) = schema::duplicate_name(&first.fields) {
            return Err(Error::file(&first.path, reason));
        }
        for other in &files[1..] {
            if let Some(reason) = schema::describe_mismatch(&first.fields, &other.fields) {
                return Err(Error::SchemaMismatch { first: first.path.clone(), second: other.path.clone(), reason });
            }
        }
        let packing = options.pack.as_ref().map(|spec| pack::Packing::resolve(spec, &first.fields)).transpose()?;
        let mut starts = Vec::with_capacity(files.len() + 1);
        let mut total = 0u64;
        for f in &files {
            starts.push(total);
            let samples = match &packing {
                None => f.samples,
                Some(p) => p.samples(f.pack_tokens.ok_or_else(|| {
                    Error::Internal(format!("{} was scanned without the pack spec", f.path.display()))
                })?),
            };
            total = total.checked_add(samples).ok_or_else(|| Error::file(&f.path, "sample count overflows u64"))?;
        }
        starts.push(total);
        let file_fields = first.fields.clone();
        let delivered = packing.as_ref().map_or(&file_fields, |p| &p.fields);
        // A masked field's validity field comes with it, right after it.
        let names = options.fields.as_ref().map(|names| {
            let mut with = Vec::with_capacity(names.len());
            for n in names {
                with.push(n.clone());
                let valid = nulls::valid_field(n);
                if options.nulls.get(n) == Some(&nulls::NullPolicy::Mask) && !names.contains(&valid) {
                    with.push(valid);
                }
            }
            with
        });
        let columns = select(delivered, names.as_deref())?;
        let fields: Vec<Field> = match &columns {
            Some(c) => c.iter().map(|&i| delivered[i].clone()).collect(),
            None => delivered.clone(),
        };
        check_null_policies(&files, &options, &fields)?;
        // Packed values are made from documents, never read in place.
        if packing.is_some() {
            files.iter_mut().for_each(|f| f.in_place = false);
        }
        let parsed = files.iter().map(|_| Parsed::default()).collect();
        let packing = packing.map(Arc::new);
        Ok(Dataset { fields, file_fields, columns, files, parsed, packing, starts, options, feeder: None })
    }

    /// The same dataset, its rows read from the feeder `source` ([`crate::feed`]) rather
    /// than from its files (which need not exist here): nothing is read in place.
    pub fn served_by(
        mut self,
        source: crate::feed::Source,
        owners: Vec<String>,
        manifest: Option<gen::Manifest>,
    ) -> Result<Dataset> {
        // (A packed dataset cannot be served: its files' headers carry no token counts, so
        // `from_files` refused it before; `open_dataset` says why.)
        if owners.len() != self.files.len() {
            return Err(Error::Internal(format!("{}: an address for each file", source.url())));
        }
        self.files.iter_mut().for_each(|f| f.in_place = false);
        self.feeder = Some(Arc::new(crate::feed::client::Feed::new(source, owners, manifest)));
        Ok(self)
    }

    /// The feeder the rows come from, if any.
    pub fn feeder(&self) -> Option<&crate::feed::Source> {
        self.feeder.as_deref().map(|feed| &feed.source)
    }

    /// The generator's manifest a feeder sent, where the rows come from a feeder serving
    /// `meshfeed gen`'s files.
    pub fn feeder_manifest(&self) -> Option<&gen::Manifest> {
        self.feeder.as_deref().and_then(|feed| feed.manifest.as_ref())
    }

    /// Resolves and scans every file in this process (no communication).
    pub fn open_local(paths: &[PathBuf], options: DatasetOptions) -> Result<Dataset> {
        let files =
            resolve_paths(paths)?.into_iter().map(|(p, f)| scan_file(&p, f, &options)).collect::<Result<Vec<_>>>()?;
        Dataset::from_files(files, options)
    }

    /// Number of samples `N`.
    pub fn len(&self) -> u64 {
        *self.starts.last().expect("starts has len + 1 entries")
    }

    /// Whether the dataset has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Per field, the mean bytes of a variable-length value where every file tells its
    /// values' size ([`FileInfo::value_bytes`]); `None` for fixed-size fields and where a
    /// file does not say.
    pub fn mean_value_bytes(&self) -> Vec<Option<u64>> {
        (0..self.fields.len())
            .map(|f| {
                if self.fields[f].fixed_bytes().is_some() || self.is_empty() {
                    return None;
                }
                if let Some(p) = &self.packing {
                    // cu_seqlens, the one variable-length packed field.
                    let documents = self.files.iter().map(|f| f.samples).sum();
                    return Some(p.mean_cu_seqlens_bytes(documents, self.len()));
                }
                let column = self.columns.as_ref().map_or(f, |c| c[f]);
                let total = self.files.iter().try_fold(0u64, |sum, file| {
                    let bytes = *file.value_bytes.get(column)?;
                    sum.checked_add(bytes)
                })?;
                Some(total.div_ceil(self.len()))
            })
            .collect()
    }

    /// The fields of every sample.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The files, in id order.
    pub fn files(&self) -> &[FileInfo] {
        &self.files
    }

    /// The options the dataset was opened with.
    pub fn options(&self) -> &DatasetOptions {
        &self.options
    }

    /// Global id of the first sample of file `i` (`i == files().len()` gives N).
    pub fn file_start(&self, i: usize) -> u64 {
        self.starts[i]
    }

    /// The file holding a sample and the row within it.
    pub fn locate(&self, id: SampleId) -> (usize, u64) {
        debug_assert!(id.0 < self.len());
        // `starts` is sorted; the file is the last one starting at or before `id`
        // (empty files share a start with their successor and are skipped).
        let file = self.starts.partition_point(|&s| s <= id.0) - 1;
        (file, id.0 - self.starts[file])
    }

    /// Opens file `i` for reading rows. The reader checks after opening and after every
    /// read that the file is still the one scanned ([`FileInfo::check_unchanged`]): a file
    /// that changes under a running job is an error naming what changed, never stale or
    /// zero-filled rows.
    pub fn open_reader(&self, i: usize) -> Result<Box<dyn FileReader>> {
        let info = &self.files[i];
        // A feeder's reader checks nothing here: the file is the feeder's.
        let (inner, local) = match &self.feeder {
            Some(feed) => (Box::new(feed.reader(i, info)?) as Box<dyn FileReader>, false),
            None => (unchanged_then(info, self.open_file(i))?, true),
        };
        let inner = match &self.columns {
            Some(columns) => Box::new(Selected { inner, columns: columns.clone() }),
            None => inner,
        };
        Ok(if local { Box::new(CheckedReader { inner, info: info.clone() }) } else { inner })
    }

    /// A reader of local file `i` in its format, packed where the dataset packs.
    fn open_file(&self, i: usize) -> Result<Box<dyn FileReader>> {
        let info = &self.files[i];
        let reader = open_format(info, &self.options, &self.file_fields, &self.parsed[i])?;
        let Some(packing) = &self.packing else { return Ok(reader) };
        let tokens = info.pack_tokens.ok_or_else(|| Error::Internal("a packed file without its token count".into()))?;
        let packed =
            pack::PackedReader::open(reader, &info.path, info.samples, packing.clone(), tokens, &self.parsed[i].plan)?;
        Ok(Box::new(packed))
    }
}

/// Refuses a null policy (`--nulls`) naming a field that is not delivered, one of packed
/// fields, or one of a file format without nulls: a policy must never be silently unused.
fn check_null_policies(files: &[FileInfo], options: &DatasetOptions, fields: &[Field]) -> Result<()> {
    let Some(name) = options.nulls.keys().next() else { return Ok(()) };
    if options.pack.is_some() {
        return Err(Error::Config(format!("--nulls {name}=...: null policies do not apply to packed fields (--pack)")));
    }
    for name in options.nulls.keys() {
        if !fields.iter().any(|f| &f.name == name) {
            let all: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
            return Err(Error::Config(format!(
                "--nulls names field '{name}', which is not delivered (fields: {})",
                all.join(", ")
            )));
        }
    }
    if let Some(f) = files.iter().find(|f| !matches!(f.format, Format::Arrow | Format::Parquet)) {
        return Err(Error::file(
            &f.path,
            format!("--nulls {name}=...: only Arrow and Parquet columns have nulls; this file is {:?}", f.format),
        ));
    }
    Ok(())
}

/// The file field of each field `names` selects, or `None` for every field in file order.
/// An unknown or repeated name, or an empty list, is an error.
fn select(fields: &[Field], names: Option<&[String]>) -> Result<Option<Arc<[usize]>>> {
    let Some(names) = names else { return Ok(None) };
    if names.is_empty() {
        return Err(Error::Config("--fields selects no field".into()));
    }
    let mut columns = Vec::with_capacity(names.len());
    for name in names {
        let i = fields.iter().position(|f| &f.name == name).ok_or_else(|| {
            let all: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
            Error::Config(format!("--fields names unknown field '{name}' (fields: {})", all.join(", ")))
        })?;
        if columns.contains(&i) {
            return Err(Error::Config(format!("--fields names '{name}' twice")));
        }
        columns.push(i);
    }
    Ok(Some(columns.into()))
}

/// A reader of some fields of a file: field `k` is the file's field `columns[k]`.
struct Selected {
    inner: Box<dyn FileReader>,
    columns: Arc<[usize]>,
}

impl FileReader for Selected {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        self.inner.read_columns(rows, &self.columns)
    }

    fn read_columns(&mut self, rows: &[u64], columns: &[usize]) -> Result<RowChunk> {
        let mapped: Vec<usize> = columns.iter().map(|&c| self.columns[c]).collect();
        self.inner.read_columns(rows, &mapped)
    }

    fn value_range(&self, row: u64, field: usize) -> Option<std::ops::Range<u64>> {
        self.inner.value_range(row, *self.columns.get(field)?)
    }

    fn list_lengths(&mut self, rows: u64, field: usize, elem: usize) -> Result<Vec<u64>> {
        self.inner.list_lengths(rows, self.columns[field], elem)
    }

    fn read_list_pieces(
        &mut self,
        field: usize,
        elem: usize,
        pieces: &[(u64, std::ops::Range<u64>)],
    ) -> Result<(RowChunk, Vec<u64>)> {
        self.inner.read_list_pieces(self.columns[field], elem, pieces)
    }

    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.inner.read_at(offset, out)
    }

    fn read_vectored_at(&mut self, offset: u64, bufs: &mut [std::io::IoSliceMut<'_>]) -> Result<()> {
        self.inner.read_vectored_at(offset, bufs)
    }

    fn check(&self) -> Result<()> {
        self.inner.check()
    }

    fn advise(&self, range: std::ops::Range<u64>) {
        self.inner.advise(range)
    }

    fn drop_cache(&self, range: std::ops::Range<u64>) {
        self.inner.drop_cache(range)
    }

    fn positional(&self) -> Option<&std::fs::File> {
        self.inner.positional()
    }

    fn random_access(&self) {
        self.inner.random_access()
    }
}

/// `result`, unless the file changed since it was scanned: then that is the error (it is
/// the cause; a failed read of a changed file is its symptom).
fn unchanged_then<T>(info: &FileInfo, result: Result<T>) -> Result<T> {
    info.check_unchanged()?;
    result
}

/// A reader that checks its file's identity after every read: one `stat` per call, and the
/// loader reads each file once per window.
struct CheckedReader {
    inner: Box<dyn FileReader>,
    info: FileInfo,
}

impl FileReader for CheckedReader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let chunk = self.inner.read_rows(rows);
        unchanged_then(&self.info, chunk)
    }

    fn read_columns(&mut self, rows: &[u64], columns: &[usize]) -> Result<RowChunk> {
        let chunk = self.inner.read_columns(rows, columns);
        unchanged_then(&self.info, chunk)
    }

    fn list_lengths(&mut self, rows: u64, field: usize, elem: usize) -> Result<Vec<u64>> {
        let lengths = self.inner.list_lengths(rows, field, elem);
        unchanged_then(&self.info, lengths)
    }

    fn read_list_pieces(
        &mut self,
        field: usize,
        elem: usize,
        pieces: &[(u64, std::ops::Range<u64>)],
    ) -> Result<(RowChunk, Vec<u64>)> {
        let read = self.inner.read_list_pieces(field, elem, pieces);
        unchanged_then(&self.info, read)
    }

    fn value_range(&self, row: u64, field: usize) -> Option<std::ops::Range<u64>> {
        self.inner.value_range(row, field)
    }

    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        // A short read of a file that changed reports the change (the cause).
        let read = self.inner.read_at(offset, out);
        if read.is_err() {
            return unchanged_then(&self.info, read);
        }
        read
    }

    fn read_vectored_at(&mut self, offset: u64, bufs: &mut [std::io::IoSliceMut<'_>]) -> Result<()> {
        let read = self.inner.read_vectored_at(offset, bufs);
        if read.is_err() {
            return unchanged_then(&self.info, read);
        }
        read
    }

    fn check(&self) -> Result<()> {
        self.info.check_unchanged()
    }

    fn advise(&self, range: std::ops::Range<u64>) {
        self.inner.advise(range)
    }

    fn drop_cache(&self, range: std::ops::Range<u64>) {
        self.inner.drop_cache(range)
    }

    fn positional(&self) -> Option<&std::fs::File> {
        self.inner.positional()
    }

    fn random_access(&self) {
        self.inner.random_access()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, samples: u64) -> FileInfo {
        FileInfo {
            path: name.into(),
            format: Format::Npy,
            samples,
            fields: vec![Field::tensor("data", DType::F32, vec![2])],
            bytes: 0,
            stamp: FileStamp::default(),
            value_bytes: vec![],
            in_place: true,
            pack_tokens: None,
        }
    }

    #[test]
    fn locate_maps_ids_to_files_skipping_empty_ones() {
        let ds = Dataset::from_files(vec![info("a", 3), info("b", 0), info("c", 2)], Default::default()).unwrap();
        assert_eq!(ds.len(), 5);
        let got: Vec<_> = (0..5).map(|i| ds.locate(SampleId(i))).collect();
        assert_eq!(got, vec![(0, 0), (0, 1), (0, 2), (2, 0), (2, 1)]);
    }

    #[test]
    fn schema_mismatch_names_both_files() {
        let mut b = info("b.npy", 2);
        b.fields[0] = Field::tensor("data", DType::I32, vec![2]);
        let err = Dataset::from_files(vec![info("a.npy", 1), b], Default::default()).unwrap_err().to_string();
        assert!(err.contains("a.npy") && err.contains("b.npy") && err.contains("'data'"), "{err}");
    }

    #[test]
    fn missing_path_and_unknown_format_are_errors() {
        let err = resolve_paths(&["/nonexistent/meshfeed".into()]).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/meshfeed: No such file or directory (os error 2)"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("x.csv");
        std::fs::write(&odd, "1").unwrap();
        assert!(resolve_paths(&[odd]).unwrap_err().to_string().contains("unknown format"));
        assert!(resolve_paths(&[dir.path().into()]).unwrap_err().to_string().contains("holds no"));
    }

    #[test]
    fn unusable_directory_entries_and_special_files_are_errors() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.npy"), "").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "").unwrap();
        // Entries of unsupported extensions stay ignored, also unusable ones.
        std::os::unix::fs::symlink("missing", dir.path().join("z.txt")).unwrap();
        assert_eq!(resolve_paths(&[dir.path().into()]).unwrap().len(), 1);
        let fails = |setup: &dyn Fn(&Path) -> PathBuf, needle: &str| {
            let d = tempfile::tempdir().unwrap();
            std::fs::write(d.path().join("a.npy"), "").unwrap();
            let bad = setup(d.path());
            let err = resolve_paths(&[d.path().into()]).unwrap_err().to_string();
            assert!(err.contains(bad.to_str().unwrap()) && err.contains(needle), "{err}");
            if !bad.is_dir() {
                // Given directly, the same path is the same error.
                let err = resolve_paths(std::slice::from_ref(&bad)).unwrap_err().to_string();
                assert!(err.contains(bad.to_str().unwrap()) && err.contains(needle), "{err}");
            }
        };
        fails(
            &|d| {
                let p = d.join("b.npy");
                std::os::unix::fs::symlink(d.join("gone.npy"), &p).unwrap();
                p
            },
            "dangling symbolic link",
        );
        fails(
            &|d| {
                let p = d.join("loop.arrow");
                std::os::unix::fs::symlink(&p, &p).unwrap();
                p
            },
            "symbolic link loop",
        );
        fails(
            &|d| {
                let p = d.join("sub.npy");
                std::fs::create_dir(&p).unwrap();
                p
            },
            "is a directory, not a regular file",
        );
        fails(
            &|d| {
                let p = d.join("pipe.h5");
                let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
                // SAFETY: a valid NUL-terminated path; mkfifo only reads it.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
                p
            },
            "is a FIFO (named pipe)",
        );
        fails(
            &|d| {
                let p = d.join("sock.raw");
                let listener = std::os::unix::net::UnixListener::bind(&p).unwrap();
                std::mem::forget(listener);
                p
            },
            "is a socket",
        );
        let err = resolve_paths(&["/dev/null".into()]).unwrap_err().to_string();
        assert!(err.contains("/dev/null") && err.contains("character device"), "{err}");
    }

    #[test]
    fn a_file_that_changes_after_its_scan_is_an_error_naming_the_change() {
        let dir = tempfile::tempdir().unwrap();
        let spec = gen::GenSpec {
            format: Format::Npy,
            samples: 100,
            files: 1,
            fields: vec![Field::tensor("x", DType::U8, vec![10])],
            out: dir.path().into(),
            arrow_batch_rows: 16,
        };
        gen::write_file(&spec, 0).unwrap();
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        let info = &ds.files()[0];
        info.check_unchanged().unwrap();
        let mut reader = ds.open_reader(0).unwrap();
        reader.read_rows(&[0, 50, 99]).unwrap();
        // Past the file system's timestamp granularity (a clock tick), so that the
        // rewrite below gets another modification time.
        std::thread::sleep(std::time::Duration::from_millis(50));
        // Truncated in place: the size differs (rows still inside the file read fine,
        // and are refused all the same).
        let file = std::fs::OpenOptions::new().write(true).open(&info.path).unwrap();
        file.set_len(info.bytes - 100).unwrap();
        for err in [
            reader.read_rows(&[0]).unwrap_err(),
            reader.read_rows(&[99]).unwrap_err(),
            ds.open_reader(0).err().unwrap(),
        ] {
            let err = err.to_string();
            let want = format!("changed since the dataset was opened: {} → {} bytes", info.bytes, info.bytes - 100);
            assert!(err.contains(info.path.to_str().unwrap()) && err.contains(&want), "{err}");
        }
        // Same size, rewritten: the modification time differs.
        file.set_len(info.bytes).unwrap();
        let err = reader.read_rows(&[0]).unwrap_err().to_string();
        assert!(err.contains("changed since the dataset was opened: modified (mtime"), "{err}");
        // Replaced by another file of the same size and time: the inode differs.
        let other = dir.path().join("other");
        std::fs::copy(&info.path, &other).unwrap();
        std::fs::rename(&other, &info.path).unwrap();
        let mut moved = info.clone();
        moved.stamp.modified_ns = FileStamp::of(&std::fs::metadata(&info.path).unwrap()).modified_ns;
        let err = moved.check_unchanged().unwrap_err().to_string();
        assert!(err.contains("replaced by another file (inode"), "{err}");
        // Scanned on another host, whose inode numbers may differ from this one's (sshfs):
        // the inode is not compared there.
        let mut elsewhere = moved.clone();
        elsewhere.stamp.host ^= 1;
        elsewhere.check_unchanged().unwrap();
        // Removed.
        std::fs::remove_file(&info.path).unwrap();
        let err = info.check_unchanged().unwrap_err().to_string();
        assert!(err.contains("can no longer be read"), "{err}");
    }

    #[test]
    fn duplicate_field_names_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // A structured .npy whose header repeats a member name (numpy refuses to write one).
        let p = dir.path().join("dup.npy");
        let mut bytes = npy::header(&[Field::tensor("a", DType::U8, vec![]), Field::tensor("b", DType::U8, vec![])], 3);
        let at = bytes.windows(5).position(|w| w == b"('b',").unwrap();
        bytes[at + 2] = b'a';
        bytes.extend([0u8; 6]);
        std::fs::write(&p, &bytes).unwrap();
        let err = scan_file(&p, Format::Npy, &Default::default()).unwrap_err().to_string();
        assert!(err.contains("dup.npy") && err.contains("two fields are named 'a'"), "{err}");
        // Headers built by hand are checked too.
        let mut i = info("hand.npy", 2);
        i.fields.push(i.fields[0].clone());
        let err = Dataset::from_files(vec![i], Default::default()).unwrap_err().to_string();
        assert!(err.contains("hand.npy") && err.contains("'data'"), "{err}");
    }

    #[test]
    fn directories_are_listed_in_name_order() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["b.npy", "a.npy", "c.txt", "10.npy"] {
            std::fs::write(dir.path().join(n), "").unwrap();
        }
        let got: Vec<String> = resolve_paths(&[dir.path().into()])
            .unwrap()
            .into_iter()
            .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(got, vec!["10.npy", "a.npy", "b.npy"]);
    }

    /// An Arrow file's footer and batch headers are parsed by its first reader and shared
    /// by the later ones (a pass reopens each file; a header is one small read per batch).
    #[test]
    fn arrow_layouts_are_parsed_once_per_dataset() {
        let dir = tempfile::tempdir().unwrap();
        let spec = gen::GenSpec {
            format: Format::Arrow,
            samples: 100,
            files: 2,
            out: dir.path().into(),
            arrow_batch_rows: 10,
            fields: vec![Field::tensor("x", DType::U8, vec![4])],
        };
        for i in 0..2 {
            gen::write_file(&spec, i).unwrap();
        }
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        assert!(ds.parsed.iter().all(|p| p.arrow.get().is_none()));
        let mut a = ds.open_reader(1).unwrap();
        let layout = ds.parsed[1].arrow.get().expect("parsed by the first reader").clone();
        let mut b = ds.clone().open_reader(1).unwrap();
        // The cache, the test's handle and the two readers.
        assert_eq!(Arc::strong_count(&layout), 4);
        assert!(ds.parsed[0].arrow.get().is_none());
        assert_eq!(a.read_rows(&[7, 42]).unwrap().value(1, 0), b.read_rows(&[42]).unwrap().value(0, 0));
    }

    /// `fields` delivers those fields in the order given; HDF5 and Arrow read only their
    /// bytes, npy the whole records; value ranges follow the selection.
    #[test]
    fn a_field_selection_reads_and_delivers_only_those_fields() {
        let fields = vec![
            Field::tensor("a", DType::U8, vec![1000]),
            Field::tensor("b", DType::I64, vec![]),
            Field::tensor("c", DType::U16, vec![3]),
        ];
        for format in [Format::Npy, Format::Hdf5, Format::Arrow] {
            let dir = tempfile::tempdir().unwrap();
            let spec = gen::GenSpec {
                format,
                samples: 50,
                files: 1,
                out: dir.path().into(),
                arrow_batch_rows: 10,
                fields: fields.clone(),
            };
            gen::write_file(&spec, 0).unwrap();
            let open = |names: Option<Vec<&str>>| {
                let options = DatasetOptions {
                    fields: names.map(|n| n.into_iter().map(String::from).collect()),
                    ..Default::default()
                };
                Dataset::open_local(&[dir.path().into()], options)
            };
            let all = open(None).unwrap();
            let ds = open(Some(vec!["c", "b"])).unwrap();
            assert_eq!(ds.fields(), &[fields[2].clone(), fields[1].clone()], "{format:?}");
            let rows = [3u64, 4, 30];
            let whole = all.open_reader(0).unwrap().read_rows(&rows).unwrap();
            let mut r = ds.open_reader(0).unwrap();
            let some = r.read_rows(&rows).unwrap();
            for k in 0..rows.len() {
                assert_eq!(some.value(k, 0), whole.value(k, 2), "{format:?}");
                assert_eq!(some.value(k, 1), whole.value(k, 1), "{format:?}");
            }
            if format != Format::Npy {
                // Not the 1000-byte values of `a`.
                assert!(some.bytes_read() < 1000, "{format:?}: {} bytes", some.bytes_read());
            }
            let full = all.open_reader(0).unwrap();
            if let Some(v) = full.value_range(4, 2) {
                assert_eq!(r.value_range(4, 0), Some(v), "{format:?}");
            }
            assert_eq!(r.value_range(4, 2), None, "{format:?}: no third field");
            for (names, needle) in [
                (vec!["d"], "unknown field 'd' (fields: a, b, c)"),
                (vec!["a", "a"], "names 'a' twice"),
                (vec![], "selects no field"),
            ] {
                let e = open(Some(names)).unwrap_err().to_string();
                assert!(e.contains(needle), "{e}");
            }
        }
    }

    /// Subdirectories are walked where their names come, at any depth, hidden ones not;
    /// a symbolic link back into the tree is an error, not the same files twice.
    #[test]
    fn subdirectories_are_walked_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["b/deep", "c", ".cache", "empty"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        for n in ["a.npy", "b/x.npy", "b/deep/y.npy", "b/z.npy", "c/a.npy", "d.npy", ".cache/hidden.npy", "b/notes.txt"]
        {
            std::fs::write(d.join(n), "").unwrap();
        }
        let got: Vec<String> = resolve_paths(&[d.into()])
            .unwrap()
            .into_iter()
            .map(|(p, _)| p.strip_prefix(d).unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(got, vec!["a.npy", "b/deep/y.npy", "b/x.npy", "b/z.npy", "c/a.npy", "d.npy"]);
        // A tree whose only dataset files are deep inside is a dataset; one with none is not.
        assert_eq!(resolve_paths(&[d.join("b")]).unwrap().len(), 3);
        let err = resolve_paths(&[d.join("empty")]).unwrap_err().to_string();
        assert!(err.contains("holds no") && err.contains("empty"), "{err}");
        // A link back up: named, never followed round.
        std::os::unix::fs::symlink(d, d.join("c/loop")).unwrap();
        let err = resolve_paths(&[d.into()]).unwrap_err().to_string();
        assert!(err.contains("c/loop") && err.contains("reached twice"), "{err}");
    }
}
