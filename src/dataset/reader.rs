//! Reading rows of one file ([`FileReader`]), and the readers every dataset wraps a
//! format's reader in: the fields it delivers, and the check that the file is unchanged.

use std::sync::Arc;

use super::header::FileInfo;
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

/// [`FileReader::read_list_pieces`] by reading the rows' whole values.
/// The bytes, within a list value of `len` elements of `elem` bytes each, of its elements
/// `range` clamped to the value: what every [`FileReader::read_list_pieces`] delivers of a
/// piece, so that all formats cut pieces alike.
pub(crate) fn piece_bytes(range: &std::ops::Range<u64>, len: u64, elem: u64) -> std::ops::Range<u64> {
    let end = range.end.min(len);
    range.start.min(end) * elem..end * elem
}

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
            crate::dataset::positional::advise_random(f);
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

/// A reader of some fields of a file: field `k` is the file's field `columns[k]`.
pub(crate) struct Selected {
    pub(crate) inner: Box<dyn FileReader>,
    pub(crate) columns: Arc<[usize]>,
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
pub(crate) fn unchanged_then<T>(info: &FileInfo, result: Result<T>) -> Result<T> {
    info.check_unchanged()?;
    result
}

/// A reader that checks its file's identity after every read: one `stat` per call, and the
/// loader reads each file once per window.
pub(crate) struct CheckedReader {
    pub(crate) inner: Box<dyn FileReader>,
    pub(crate) info: FileInfo,
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
