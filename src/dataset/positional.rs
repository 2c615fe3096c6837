//! Positional reads shared by the readers: which spans of a file to read for some rows or
//! byte ranges (reading small gaps through), exact vectored reads at an offset, the
//! kernel's read-ahead advice, and the error a short read is.

use std::fs::File;
use std::io::IoSliceMut;
use std::ops::Range;
use std::path::Path;

use arrow_buffer::Buffer;

use super::rows::RowChunk;
use crate::error::{Error, Result};

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

/// The open file a reader reads by position (`pread` on a descriptor it shares), with its
/// path for errors: what a format whose values lie at known offsets describes of itself
/// ([`super::reader::FileReader::positional`]), and all that reads in place and the
/// kernel's advice need of it, so that no format writes them again.
#[derive(Clone, Copy, Debug)]
pub struct Positional<'a> {
    pub file: &'a File,
    pub path: &'a Path,
}

impl Positional<'_> {
    /// Reads exactly `out.len()` bytes at `offset`; a file that ends first is an error
    /// naming the file ([`read_error`]), never zeros.
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read_vectored_at(offset, &mut [IoSliceMut::new(out)])
    }

    /// Reads the bytes at `offset` into `bufs`, one after another, as one read (`preadv`):
    /// a contiguous range of the file scattered into several places.
    pub fn read_vectored_at(&self, offset: u64, bufs: &mut [IoSliceMut<'_>]) -> Result<()> {
        let len = bufs.iter().map(|b| b.len()).sum();
        read_vectored_exact_at(self.file, offset, bufs).map_err(|e| read_error(self.path, e, offset, len))
    }

    /// The bytes `span`, read whole ([`read_span`]).
    pub fn read_span(&self, span: Range<u64>) -> Result<Vec<u8>> {
        read_span(self.file, self.path, span)
    }
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

/// Reads `ranges` as [`read_grouped`] does, and pushes each as the next value of `chunk`
/// (a chunk of one field: one range a row), in the order given.
pub(crate) fn push_grouped(
    chunk: &mut RowChunk,
    ranges: &[Range<u64>],
    read: impl FnMut(Range<u64>, Range<usize>) -> Result<Vec<u8>>,
) -> Result<()> {
    for (b, offset, len) in read_grouped(chunk, ranges, read)? {
        chunk.push_value(b, offset, len);
    }
    Ok(())
}

/// The bytes `span` of `file` (at `path`), read whole: a short read is an error naming the
/// file, never zeros.
pub(crate) fn read_span(file: &File, path: &Path, span: Range<u64>) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; (span.end - span.start) as usize];
    read_vectored_exact_at(file, span.start, &mut [IoSliceMut::new(&mut buf)])
        .map_err(|e| read_error(path, e, span.start, buf.len()))?;
    Ok(buf)
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
}
