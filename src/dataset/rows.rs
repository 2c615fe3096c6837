//! Rows read from one file, and the span logic shared by the readers.
//!
//! A [`RowChunk`] keeps the buffers a reader filled (file bytes, decoded Arrow buffers)
//! and, for each requested row and field, where that value's bytes are. The loader copies
//! values from here straight into its send buffer: one copy from read buffer to send
//! buffer (docs/design.md, "The pipeline").

use std::fs::File;
use std::io::IoSliceMut;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use arrow_buffer::Buffer;

use crate::error::{Error, Result};

/// Where one value lives inside a [`RowChunk`].
#[derive(Clone, Copy, Debug)]
struct Loc {
    buffer: u32,
    offset: usize,
    len: usize,
}

/// Values of some rows of one file, for every field.
#[derive(Debug, Default)]
pub struct RowChunk {
    buffers: Vec<Buffer>,
    /// `locs[row * fields + field]`.
    locs: Vec<Loc>,
    fields: usize,
    bytes_read: u64,
}

impl RowChunk {
    /// An empty chunk for values with `fields` fields.
    pub fn new(fields: usize) -> RowChunk {
        RowChunk { fields, ..Default::default() }
    }

    /// Adds a buffer and returns its index for [`RowChunk::push_value`].
    pub fn add_buffer(&mut self, buffer: Buffer) -> u32 {
        self.bytes_read += buffer.len() as u64;
        self.buffers.push(buffer);
        (self.buffers.len() - 1) as u32
    }

    /// Adds a buffer the reader made in memory rather than read (not counted as read).
    pub fn add_made_buffer(&mut self, buffer: Buffer) -> u32 {
        self.buffers.push(buffer);
        (self.buffers.len() - 1) as u32
    }

    /// Counts bytes a reader brought into memory for this chunk but did not keep (e.g. the
    /// offsets of variable-length values), so that [`RowChunk::bytes_read`] stays true.
    pub fn add_bytes_read(&mut self, bytes: u64) {
        self.bytes_read += bytes;
    }

    /// Records the next value (row-major over rows, then fields).
    pub fn push_value(&mut self, buffer: u32, offset: usize, len: usize) {
        debug_assert!(offset + len <= self.buffers[buffer as usize].len());
        self.locs.push(Loc { buffer, offset, len });
    }

    /// Number of fields of each row.
    pub fn fields(&self) -> usize {
        self.fields
    }

    /// Number of rows in the chunk.
    pub fn rows(&self) -> usize {
        self.locs.len().checked_div(self.fields).unwrap_or(0)
    }

    /// The bytes of one value.
    pub fn value(&self, row: usize, field: usize) -> &[u8] {
        let loc = self.locs[row * self.fields + field];
        &self.buffers[loc.buffer as usize].as_slice()[loc.offset..loc.offset + loc.len]
    }

    /// Where one value lies: its buffer's index, its offset there and its length.
    pub fn location(&self, row: usize, field: usize) -> (u32, usize, usize) {
        let loc = self.locs[row * self.fields + field];
        (loc.buffer, loc.offset, loc.len)
    }

    /// The same rows with only fields `fields` (in that order), sharing the buffers.
    pub fn project(&self, fields: &[usize]) -> RowChunk {
        let rows = self.rows();
        let mut locs = Vec::with_capacity(rows * fields.len());
        for r in 0..rows {
            locs.extend(fields.iter().map(|&f| self.locs[r * self.fields + f]));
        }
        RowChunk { buffers: self.buffers.clone(), locs, fields: fields.len(), bytes_read: self.bytes_read }
    }

    /// A chunk of one field whose row `k` is bytes `parts[k].1` of this chunk's value
    /// `(parts[k].0, field)`, sharing its buffers and its count of bytes read.
    pub fn slices(&self, field: usize, parts: &[(usize, Range<usize>)]) -> RowChunk {
        let locs = parts
            .iter()
            .map(|(row, bytes)| {
                let loc = self.locs[row * self.fields + field];
                debug_assert!(bytes.start <= bytes.end && bytes.end <= loc.len);
                Loc { buffer: loc.buffer, offset: loc.offset + bytes.start, len: bytes.end - bytes.start }
            })
            .collect();
        RowChunk { buffers: self.buffers.clone(), locs, fields: 1, bytes_read: self.bytes_read }
    }

    /// Buffers the chunk's values lie in: for readers that read into buffers of their own,
    /// the reads that brought them in.
    pub fn buffers(&self) -> usize {
        self.buffers.len()
    }

    /// Bytes the reader brought into memory for this chunk.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    /// Reorders values pushed field-major (all rows of field 0, then field 1, ...) into
    /// the row-major order [`RowChunk::value`] expects.
    pub fn transpose_from_field_major(&mut self, rows: usize) {
        let fields = self.fields;
        let old = std::mem::take(&mut self.locs);
        debug_assert_eq!(old.len(), rows * fields);
        self.locs = (0..rows * fields).map(|i| old[(i % fields) * rows + i / fields]).collect();
    }
}

/// Groups sorted rows into spans to read in one go: a gap of unneeded rows costing at
/// most `max_gap_bytes` is read through instead of starting a new read, as long as the
/// rows read through stay fewer than the rows needed so far. So a read never brings in
/// more than twice the bytes it needs (memory stays bounded by the window), while dense
/// windows still become a few large reads.
pub fn coalesce(rows: &[u64], row_bytes: u64, max_gap_bytes: u64) -> Vec<Range<u64>> {
    let max_gap_rows = max_gap_bytes / row_bytes.max(1);
    let mut spans: Vec<Range<u64>> = Vec::new();
    let (mut needed, mut extra) = (0u64, 0u64);
    for &r in rows {
        needed += 1;
        match spans.last_mut() {
            Some(s) if r >= s.end && r - s.end <= max_gap_rows && extra + (r - s.end) < needed => {
                extra += r - s.end;
                s.end = r + 1;
            }
            _ => spans.push(r..r + 1),
        }
    }
    spans
}

/// Where the records of a `.npy` or `.raw` file are and what they hold.
#[derive(Debug)]
pub struct RecordLayout {
    pub samples: u64,
    /// Byte offset of the first record.
    pub data_offset: u64,
    pub record_bytes: u64,
    pub fields: Vec<super::Field>,
    /// Byte range of each field inside a record, in field order.
    pub ranges: Vec<Range<usize>>,
}

impl RecordLayout {
    /// Opens the file for reading rows, checking that its fields are still `expected`.
    pub fn open(self, path: &Path, expected: &[super::Field]) -> Result<RecordFile> {
        if self.fields != expected {
            return Err(Error::file(path, "fields changed since the dataset was scanned"));
        }
        RecordFile::open(path, self.samples, self.data_offset, self.record_bytes, self.ranges)
    }
}

/// A file of fixed-size records after a header: `.npy` and `.raw`.
pub struct RecordFile {
    file: File,
    path: PathBuf,
    /// Records the header promises (checked against the file size when it was scanned).
    samples: u64,
    data_offset: u64,
    record_bytes: u64,
    /// Byte range of each field inside a record, in field order.
    field_ranges: Vec<Range<usize>>,
}

/// Reads exactly the bytes of `bufs` at `offset` of `file`, one after another, with
/// `preadv` (retried on short reads and interrupts); a file that ends first is an
/// `UnexpectedEof` error.
pub(crate) fn read_vectored_exact_at(file: &File, offset: u64, mut bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let mut at = offset;
    while bufs.iter().any(|b| !b.is_empty()) {
        let n = bufs.len().min(1024) as libc::c_int; // IOV_MAX
                                                     // SAFETY: IoSliceMut is ABI-compatible with iovec, and each one points at writable
                                                     // memory of its length that `bufs` borrows mutably for this call.
        let got = unsafe { libc::preadv(file.as_raw_fd(), bufs.as_ptr().cast(), n, at as libc::off_t) };
        match got {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n if n < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            n => {
                at += n as u64;
                IoSliceMut::advance_slices(&mut bufs, n as usize);
            }
        }
    }
    Ok(())
}

/// Tells the kernel that bytes `range` of `file` will be read soon (`POSIX_FADV_WILLNEED`:
/// readahead into the page cache). Best effort: the result is ignored.
pub(crate) fn advise_willneed(file: &File, range: Range<u64>) {
    fadvise(file, range, libc::POSIX_FADV_WILLNEED)
}

/// Tells the kernel that bytes `range` of `file` will not be read again soon
/// (`POSIX_FADV_DONTNEED`: their clean pages leave the page cache). Best effort.
pub(crate) fn advise_dontneed(file: &File, range: Range<u64>) {
    fadvise(file, range, libc::POSIX_FADV_DONTNEED)
}

/// Tells the kernel that `file` is read at random (`POSIX_FADV_RANDOM`: no readahead on
/// this descriptor). Best effort.
pub(crate) fn advise_random(file: &File) {
    fadvise(file, 0..0, libc::POSIX_FADV_RANDOM)
}

fn fadvise(file: &File, range: Range<u64>, advice: libc::c_int) {
    use std::os::fd::AsRawFd;
    let (start, len) = (range.start as libc::off_t, range.end.saturating_sub(range.start) as libc::off_t);
    // SAFETY: posix_fadvise reads no memory; the descriptor belongs to `file`.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), start, len, advice) };
}

/// The fraction of `range`'s pages in the page cache (`mincore` over a mapping of it).
pub(crate) fn cached_fraction(file: &File, range: Range<u64>) -> f64 {
    let page = 4096u64;
    let start = range.start / page * page;
    let len = (range.end - start) as usize;
    if len == 0 {
        return 0.0;
    }
    // SAFETY: a read-only shared mapping of a file we hold open; unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(file),
            start as libc::off_t,
        )
    };
    if addr == libc::MAP_FAILED {
        return 0.0;
    }
    let pages = len.div_ceil(page as usize);
    let mut vec = vec![0u8; pages];
    // SAFETY: `addr` maps `len` bytes; `vec` has one byte per page of it.
    let ok = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) } == 0;
    // SAFETY: unmaps the mapping made above.
    unsafe { libc::munmap(addr, len) };
    if !ok {
        return 0.0;
    }
    vec.iter().filter(|&&v| v & 1 == 1).count() as f64 / pages as f64
}

/// Gaps up to this size are read through rather than split into separate reads.
pub(crate) const RECORD_GAP_BYTES: u64 = 64 << 10;

/// Groups byte ranges (in the order given) into reads. A range joins the current read
/// when it starts inside it or at most `max_gap` bytes after its end, and the bytes read
/// through stay fewer than the bytes needed so far: a read brings in at most about twice
/// what it needs, and dense requests still become a few large reads (as
/// [`coalesce`] does for rows). Returns each read's range and how many of the
/// given ranges it serves (consecutive).
pub(crate) fn group_ranges(ranges: &[Range<u64>], max_gap: u64) -> Vec<(Range<u64>, usize)> {
    let mut groups: Vec<(Range<u64>, usize)> = Vec::new();
    let (mut needed, mut extra) = (0u64, 0u64);
    for r in ranges {
        if let Some((g, n)) = groups.last_mut() {
            if r.start >= g.start && r.start <= g.end.saturating_add(max_gap) {
                let gap = r.start.saturating_sub(g.end);
                let new = r.end.saturating_sub(r.start.max(g.end));
                if gap == 0 || extra + gap < needed + new {
                    needed += new;
                    extra += gap;
                    g.end = g.end.max(r.end);
                    *n += 1;
                    continue;
                }
            }
        }
        needed += r.end - r.start;
        groups.push((r.clone(), 1));
    }
    groups
}

/// Reads `ranges` (in file order; one that starts before the current read starts its own)
/// in the reads [`group_ranges`] makes (gaps up to [`RECORD_GAP_BYTES`] read through), each
/// into a buffer of `chunk`. `read(span, served)` reads one span, `served` being the
/// indices of the ranges it holds (for an error's words). Returns where each range landed:
/// (buffer, offset, length), in the order given.
pub(crate) fn read_grouped(
    chunk: &mut RowChunk,
    ranges: &[Range<u64>],
    mut read: impl FnMut(Range<u64>, Range<usize>) -> Result<Vec<u8>>,
) -> Result<Vec<(u32, usize, usize)>> {
    let mut places = Vec::with_capacity(ranges.len());
    let mut at = 0;
    for (g, n) in group_ranges(ranges, RECORD_GAP_BYTES) {
        let b = chunk.add_buffer(Buffer::from_vec(read(g.clone(), at..at + n)?));
        places.extend(ranges[at..at + n].iter().map(|r| (b, (r.start - g.start) as usize, (r.end - r.start) as usize)));
        at += n;
    }
    Ok(places)
}

/// The bytes `span` of `file` (at `path`), read whole: a short read is an error naming the
/// file, never zeros.
pub(crate) fn read_span(file: &File, path: &Path, span: Range<u64>) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; (span.end - span.start) as usize];
    read_vectored_exact_at(file, span.start, &mut [IoSliceMut::new(&mut buf)])
        .map_err(|e| read_error(path, e, span.start, buf.len()))?;
    Ok(buf)
}

impl RecordFile {
    /// Opens a record file whose layout was validated by the scan.
    pub fn open(
        path: &Path,
        samples: u64,
        data_offset: u64,
        record_bytes: u64,
        field_ranges: Vec<Range<usize>>,
    ) -> Result<RecordFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        Ok(RecordFile { file, path: path.to_path_buf(), samples, data_offset, record_bytes, field_ranges })
    }
}

/// A failed read of bytes `offset..offset + len` of `path`: a file that ended first is
/// named truncated.
pub(crate) fn read_error(path: &Path, e: std::io::Error, offset: u64, len: usize) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Error::file(
            path,
            format!("truncated: bytes {offset}..{} end past the end of the file", offset + len as u64),
        ),
        _ => Error::io(path, e),
    }
}

impl super::FileReader for RecordFile {
    fn value_range(&self, row: u64, field: usize) -> Option<Range<u64>> {
        let f = self.field_ranges.get(field)?;
        let start = (row < self.samples).then(|| self.data_offset + row * self.record_bytes + f.start as u64)?;
        Some(start..start + f.len() as u64)
    }

    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.file.read_exact_at(out, offset).map_err(|e| read_error(&self.path, e, offset, out.len()))
    }

    fn read_vectored_at(&mut self, offset: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<()> {
        let len = bufs.iter().map(|b| b.len()).sum();
        read_vectored_exact_at(&self.file, offset, bufs).map_err(|e| read_error(&self.path, e, offset, len))
    }

    fn advise(&self, range: Range<u64>) {
        advise_willneed(&self.file, range)
    }

    fn drop_cache(&self, range: Range<u64>) {
        advise_dontneed(&self.file, range)
    }

    fn positional(&self) -> Option<&File> {
        Some(&self.file)
    }

    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let mut chunk = RowChunk::new(self.field_ranges.len());
        // Rows past the header's count would size a read beyond the file.
        if let Some(&last) = rows.last().filter(|&&r| r >= self.samples) {
            return Err(Error::file(
                &self.path,
                format!("row {last} is past the end of the file ({} rows)", self.samples),
            ));
        }
        let mut next = rows.iter().peekable();
        for span in coalesce(rows, self.record_bytes, RECORD_GAP_BYTES) {
            let len = ((span.end - span.start) * self.record_bytes) as usize;
            let mut buf = vec![0u8; len];
            let at = self.data_offset + span.start * self.record_bytes;
            self.file.read_exact_at(&mut buf, at).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Error::file(
                    &self.path,
                    format!("truncated: rows {}..{} end past the end of the file", span.start, span.end),
                ),
                _ => Error::io(&self.path, e),
            })?;
            let b = chunk.add_buffer(Buffer::from_vec(buf));
            while let Some(&&r) = next.peek() {
                if r >= span.end {
                    break;
                }
                let base = ((r - span.start) * self.record_bytes) as usize;
                for fr in &self.field_ranges {
                    chunk.push_value(b, base + fr.start, fr.len());
                }
                next.next();
            }
        }
        Ok(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_grouped_into_reads_of_at_most_about_twice_the_need() {
        assert_eq!(group_ranges(&[], 64), vec![]);
        // Adjacent and overlapping ranges (offsets r and r + 1 of consecutive rows) join.
        assert_eq!(group_ranges(&[0..8, 4..12, 12..16], 0), vec![(0..16, 3)]);
        assert_eq!(group_ranges(&[0..8, 10..18], 0), vec![(0..8, 1), (10..18, 1)]);
        assert_eq!(group_ranges(&[0..8, 10..18], 2), vec![(0..18, 2)]);
        // A range starting before the current read (corrupt offsets) starts its own.
        assert_eq!(group_ranges(&[10..20, 0..5], 100), vec![(10..20, 1), (0..5, 1)]);
        // Sparse: gaps are read through only while the extra bytes stay below the need.
        let sparse: Vec<Range<u64>> = (0..100).map(|i| i * 40..i * 40 + 10).collect();
        let groups = group_ranges(&sparse, 1 << 20);
        let read: u64 = groups.iter().map(|(g, _)| g.end - g.start).sum();
        assert!(read < 2 * 1000 + 40, "read {read} bytes for 1000 needed");
        assert_eq!(groups.iter().map(|(_, n)| n).sum::<usize>(), 100);
        // Empty values take no bytes.
        assert_eq!(group_ranges(&[5..5, 5..9], 0), vec![(5..9, 2)]);
    }

    #[test]
    fn coalesce_merges_small_gaps_only() {
        assert_eq!(coalesce(&[], 8, 64), vec![]);
        assert_eq!(coalesce(&[0, 1, 2, 5], 8, 8), vec![0..3, 5..6]);
        assert_eq!(coalesce(&[0, 1, 2, 5], 8, 16), vec![0..6]);
        assert_eq!(coalesce(&[3, 100, 101], 1000, 0), vec![3..4, 100..102]);
        // Sparse rows: gaps are read through only while the extra rows stay fewer than
        // the needed ones, whatever the gap allowance.
        let sparse: Vec<u64> = (0..100).map(|i| i * 4).collect();
        let spans = coalesce(&sparse, 8, 1 << 20);
        let read: u64 = spans.iter().map(|s| s.end - s.start).sum();
        assert!(read < 2 * 100, "read {read} rows for 100 needed");
        assert!(spans.len() < 100, "still coalesced: {} spans", spans.len());
    }

    #[test]
    fn transpose_reorders_field_major_values() {
        let mut c = RowChunk::new(2);
        let b = c.add_buffer(Buffer::from_vec(vec![10u8, 11, 12, 20, 21, 22]));
        for off in 0..6 {
            c.push_value(b, off, 1);
        }
        c.transpose_from_field_major(3);
        assert_eq!(c.rows(), 3);
        assert_eq!((c.value(0, 0), c.value(0, 1)), (&[10u8][..], &[20u8][..]));
        assert_eq!((c.value(2, 0), c.value(2, 1)), (&[12u8][..], &[22u8][..]));
    }

    #[test]
    fn record_file_reads_requested_rows_and_reports_truncation() {
        use crate::dataset::FileReader;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.raw");
        // header of 3 bytes, then 5 records of 4 bytes: [i, i, 100 + i, 100 + i]
        let mut bytes = vec![9u8, 9, 9];
        for i in 0..5u8 {
            bytes.extend([i, i, 100 + i, 100 + i]);
        }
        std::fs::write(&p, &bytes).unwrap();
        // The header promises 6 records; the file holds 5.
        let mut f = RecordFile::open(&p, 6, 3, 4, vec![0..2, 2..4]).unwrap();
        let c = f.read_rows(&[0, 3, 4]).unwrap();
        assert_eq!(c.rows(), 3);
        assert_eq!(c.value(1, 0), &[3, 3]);
        assert_eq!(c.value(2, 1), &[104, 104]);
        let err = f.read_rows(&[5]).unwrap_err().to_string();
        assert!(err.contains("r.raw") && err.contains("truncated"), "{err}");
        let err = f.read_rows(&[1, 7]).unwrap_err().to_string();
        assert!(err.contains("r.raw") && err.contains("row 7 is past the end of the file (6 rows)"), "{err}");
        // One read scattered into several places: record 1's fields, then record 2's first.
        let (mut a, mut b, mut c) = ([0u8; 2], [0u8; 2], [0u8; 2]);
        let mut bufs = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b), IoSliceMut::new(&mut c)];
        f.read_vectored_at(f.value_range(1, 0).unwrap().start, &mut bufs).unwrap();
        assert_eq!((a, b, c), ([1, 1], [101, 101], [2, 2]));
        // Record 5 is promised but missing.
        let (mut a, mut b) = ([0u8; 2], [0u8; 2]);
        let mut bufs = [IoSliceMut::new(&mut a), IoSliceMut::new(&mut b)];
        let err = f.read_vectored_at(f.value_range(4, 1).unwrap().start, &mut bufs).unwrap_err().to_string();
        assert!(err.contains("r.raw") && err.contains("truncated: bytes 21..25"), "{err}");
    }
}
