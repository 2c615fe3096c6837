//! Reading rows of one file ([`FileReader`]): what a format writes, what follows from it
//! (reads in place, the kernel's advice), and the reader a dataset wraps a format's reader
//! in ([`Opened`]: the fields it delivers, and the check that the file is unchanged).

use std::sync::Arc;

use super::header::FileInfo;
use super::positional::{advise_dontneed, advise_random, advise_willneed, Positional};
use super::rows::RowChunk;
use crate::error::{Error, Result};

/// [`FileReader::list_lengths`] by reading the values, a thousand rows at a time.
pub(crate) fn lengths_by_reading<R: FileReader + ?Sized>(
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

/// The bytes, within a list value of `len` elements of `elem` bytes each, of its elements
/// `range` clamped to the value: what every [`FileReader::read_list_pieces`] delivers of a
/// piece, so that all formats cut pieces alike.
pub(crate) fn piece_bytes(range: &std::ops::Range<u64>, len: u64, elem: u64) -> std::ops::Range<u64> {
    let end = range.end.min(len);
    range.start.min(end) * elem..end * elem
}

/// [`FileReader::read_list_pieces`] by reading the rows' whole values.
pub(crate) fn pieces_by_reading<R: FileReader + ?Sized>(
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
///
/// A format writes [`FileReader::read_rows`]; every other method has a default, which a
/// format overrides where it does better: reading only some fields
/// ([`FileReader::read_columns`]), answering list lengths or pieces from an index, or
/// saying where its values lie in an open file ([`FileReader::value_range`] and
/// [`FileReader::positional`]). Reads in place and the kernel's advice follow from those
/// two (the methods of `dyn FileReader` below): no format writes them.
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
    /// values whole and uncompressed at known offsets (`.npy`, raw records, contiguous
    /// HDF5, Arrow's fixed-size columns, tar members, Megatron sequences): such values can
    /// be read straight into their destination from [`FileReader::positional`]'s file.
    /// `None` (the default, and for a row past the end): read rows instead.
    fn value_range(&self, row: u64, field: usize) -> Option<std::ops::Range<u64>> {
        let _ = (row, field);
        None
    }

    /// The open file this reader reads by position, and its path: ranges from
    /// [`FileReader::value_range`] are read from it, on several threads at once where the
    /// caller likes (`pread` on a shared descriptor; the caller checks the file with
    /// [`FileReader::check`] afterwards), and the kernel's advice about this reader's reads
    /// is given on it. `None` (the default): rows only, and no advice.
    fn positional(&self) -> Option<Positional<'_>> {
        None
    }

    /// Checks that the file is still the one scanned (a caller of reads in place checks
    /// once after a window's reads, as [`FileReader::read_rows`] does by itself).
    fn check(&self) -> Result<()> {
        Ok(())
    }
}

/// What every reader can do from [`FileReader::value_range`] and
/// [`FileReader::positional`]: derived here, written by no format nor wrapper.
impl dyn FileReader + '_ {
    /// Reads exactly `out.len()` bytes at `offset` of the file (a range from
    /// [`FileReader::value_range`]); a file that ends first is an error. A failed read of a
    /// file that changed reports the change (the cause; the failed read is its symptom).
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let read = match self.positional() {
            Some(file) => file.read_at(offset, out),
            None => Err(Error::Config("internal: this reader reads rows, not byte ranges".into())),
        };
        if read.is_err() {
            self.check()?;
        }
        read
    }

    /// Tells the kernel that bytes `range` of the file will be read soon (readahead into
    /// the page cache; for readers with [`FileReader::value_range`]). Advice only: it
    /// changes no result, and failing to give it is no error.
    pub fn advise(&self, range: std::ops::Range<u64>) {
        if let Some(p) = self.positional() {
            advise_willneed(p.file, range)
        }
    }

    /// Tells the kernel that bytes `range` of the file will not be read again soon (they
    /// leave the page cache). Advice only, like `advise`.
    pub fn drop_cache(&self, range: std::ops::Range<u64>) {
        if let Some(p) = self.positional() {
            advise_dontneed(p.file, range)
        }
    }

    /// Tells the kernel that this reader reads at random (`POSIX_FADV_RANDOM`: no
    /// readahead): a 16 KiB value then costs one 16 KiB read, not a 64 KiB readahead
    /// window. Advice only.
    pub fn random_access(&self) {
        if let Some(p) = self.positional() {
            advise_random(p.file)
        }
    }
}

/// A format's reader as a dataset opens it: only some of its fields (field `k` is the
/// file's field `columns[k]`), and checked after every read that the file is unchanged
/// (one `stat` per call; the loader reads each file once per window). A dataset wraps a
/// reader where it selects fields or reads a local file.
pub(crate) struct Opened {
    pub(crate) inner: Box<dyn FileReader>,
    pub(crate) columns: Option<Arc<[usize]>>,
    pub(crate) info: Option<FileInfo>,
}

impl Opened {
    /// The file's field of delivered field `field`.
    fn field(&self, field: usize) -> usize {
        self.columns.as_ref().map_or(field, |c| c[field])
    }

    /// `result`, unless the file is checked and changed: then that is the error.
    fn checked<T>(&self, result: Result<T>) -> Result<T> {
        match &self.info {
            Some(info) => unchanged_then(info, result),
            None => result,
        }
    }
}

impl FileReader for Opened {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let chunk = match &self.columns {
            Some(columns) => self.inner.read_columns(rows, columns),
            None => self.inner.read_rows(rows),
        };
        self.checked(chunk)
    }

    fn read_columns(&mut self, rows: &[u64], columns: &[usize]) -> Result<RowChunk> {
        let mapped: Vec<usize> = columns.iter().map(|&c| self.field(c)).collect();
        let chunk = self.inner.read_columns(rows, &mapped);
        self.checked(chunk)
    }

    fn list_lengths(&mut self, rows: u64, field: usize, elem: usize) -> Result<Vec<u64>> {
        let lengths = self.inner.list_lengths(rows, self.field(field), elem);
        self.checked(lengths)
    }

    fn read_list_pieces(
        &mut self,
        field: usize,
        elem: usize,
        pieces: &[(u64, std::ops::Range<u64>)],
    ) -> Result<(RowChunk, Vec<u64>)> {
        let read = self.inner.read_list_pieces(self.field(field), elem, pieces);
        self.checked(read)
    }

    fn value_range(&self, row: u64, field: usize) -> Option<std::ops::Range<u64>> {
        let field = match &self.columns {
            Some(columns) => *columns.get(field)?,
            None => field,
        };
        self.inner.value_range(row, field)
    }

    fn positional(&self) -> Option<Positional<'_>> {
        self.inner.positional()
    }

    fn check(&self) -> Result<()> {
        match &self.info {
            Some(info) => info.check_unchanged(),
            None => self.inner.check(),
        }
    }
}

/// `result`, unless the file changed since it was scanned: then that is the error (it is
/// the cause; a failed read of a changed file is its symptom).
pub(crate) fn unchanged_then<T>(info: &FileInfo, result: Result<T>) -> Result<T> {
    info.check_unchanged()?;
    result
}
