//! Reading a window's samples from this rank's home range: open readers, the optional
//! home-range cache, and the [`ReadSet`] that packing copies values out of.

use std::collections::{HashMap, HashSet};
use std::io::IoSliceMut;
use std::ops::Range;
use std::sync::Arc;

use super::batch::Batch;
use super::exchange::ValueSource;
use super::metrics::Metrics;
use super::stream::Stream;
use crate::dataset::RowChunk;
use crate::error::{Error, Result};
use crate::plan::FieldPart;
use crate::types::SampleId;

/// The readers a producer keeps open, and the home-range cache.
pub(crate) struct Reads {
    readers: OpenReaders,
    /// With the home-range cache: per file, this rank's home rows of it, once read.
    cache: HashMap<usize, Arc<RowChunk>>,
}

impl Default for Reads {
    fn default() -> Reads {
        Reads { readers: OpenReaders::new(open_reader_limit()), cache: HashMap::new() }
    }
}

/// How many file readers a loader keeps open: a quarter of the soft limit on open files
/// (`RLIMIT_NOFILE`), leaving the rest to MPI or UCX (sockets, shared-memory segments),
/// HDF5 and the program; at least 4, at most 1024 (a reader holds one file descriptor, and
/// a reader of an HDF5 file also its chunk cache). A home range touching more files than
/// this reopens them on demand.
pub(crate) fn open_reader_limit() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given, which lives on this stack frame.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
    let soft = if ok { limit.rlim_cur } else { 1024 };
    usize::try_from(soft / 4).unwrap_or(usize::MAX).clamp(4, 1024)
}

/// Open readers by file index, at most `capacity` of them: opening one more closes the
/// least recently used. Bounded so that a dataset of many files never runs the process out
/// of file descriptors ("Too many open files").
struct OpenReaders {
    capacity: usize,
    /// File index → (reader, the tick it was last used at).
    open: HashMap<usize, (Box<dyn crate::dataset::FileReader>, u64)>,
    tick: u64,
}

impl OpenReaders {
    fn new(capacity: usize) -> OpenReaders {
        OpenReaders { capacity: capacity.max(1), open: HashMap::new(), tick: 0 }
    }

    /// The reader of file `file`, opened with `open` if it is not open.
    fn get(
        &mut self,
        file: usize,
        open: impl FnOnce() -> Result<Box<dyn crate::dataset::FileReader>>,
    ) -> Result<&mut Box<dyn crate::dataset::FileReader>> {
        self.tick += 1;
        if !self.open.contains_key(&file) {
            if self.open.len() >= self.capacity {
                // O(capacity) per eviction; evictions cost a reopen (syscalls) anyway.
                if let Some(&lru) = self.open.iter().min_by_key(|(_, (_, t))| *t).map(|(f, _)| f) {
                    self.open.remove(&lru);
                }
            }
            let reader = open()?;
            self.open.insert(file, (reader, 0));
        }
        let entry = self.open.get_mut(&file).expect("inserted above");
        entry.1 = self.tick;
        Ok(&mut entry.0)
    }
}

impl Reads {
    /// Reads the values of `ids` (sorted, all in this rank's home range).
    pub fn read(&mut self, stream: &Stream, ids: &[SampleId], metrics: &mut Metrics) -> Result<ReadSet> {
        let dataset = &stream.dataset;
        let mut chunks = Vec::new();
        let mut starts = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let (file, _) = dataset.locate(ids[i]);
            let end_id = dataset.file_start(file + 1);
            let j = i + ids[i..].partition_point(|id| id.0 < end_id);
            let file_start = dataset.file_start(file);
            starts.push(i);
            if stream.cache_home_range {
                // Serve from (or fill) the cache of this file's home rows.
                let home = stream.home.range(stream.rank);
                let first = home.start.max(file_start);
                if !self.cache.contains_key(&file) {
                    let rows: Vec<u64> = (first..home.end.min(end_id)).map(|id| id - file_start).collect();
                    let chunk = self.read_file_rows(stream, file, &rows, metrics)?;
                    self.cache.insert(file, Arc::new(chunk));
                }
                chunks.push(ReadChunk { chunk: self.cache[&file].clone(), first_id: Some(first) });
            } else {
                let rows: Vec<u64> = ids[i..j].iter().map(|id| id.0 - file_start).collect();
                let chunk = self.read_file_rows(stream, file, &rows, metrics)?;
                chunks.push(ReadChunk { chunk: Arc::new(chunk), first_id: None });
            }
            i = j;
        }
        Ok(ReadSet { ids: ids.to_vec(), starts, chunks })
    }

    /// Packs a window's send buffer straight from the files: each value is read from the
    /// page cache into its place (one copy, no read buffers, exactly the bytes needed), in
    /// the layout [`super::exchange::pack`] makes. Only for streams whose values all sit
    /// whole at fixed offsets ([`Stream::direct_reads`]): `parts` are whole tensor fields.
    /// `ids[i]` is the id of window row `i`.
    pub fn pack_direct(
        &mut self,
        stream: &Stream,
        sends: &[Vec<usize>],
        parts: &[Option<&[FieldPart]>],
        ids: &[SampleId],
        metrics: &mut Metrics,
    ) -> Result<(Vec<u8>, Vec<usize>)> {
        let dataset = &stream.dataset;
        let fields = dataset.fields();
        let row_bytes = |parts: &[FieldPart]| parts.iter().filter_map(|p| p.bytes(&fields[p.field])).sum::<usize>();
        let counts: Vec<usize> =
            sends.iter().zip(parts).map(|(rows, p)| p.map_or(0, |p| rows.len() * row_bytes(p))).collect();
        let total = counts.iter().sum();
        let mut send = crate::buffers::bytes(total);
        let mut at = 0;
        let mut touched = HashSet::new();
        for (rows, parts) in sends.iter().zip(parts) {
            let Some(parts) = parts else { continue };
            for &i in rows {
                let (file, row) = dataset.locate(ids[i]);
                let reader = self.readers.get(file, || dataset.open_reader(file))?;
                touched.insert(file);
                // Values adjacent in the file and in the buffer are read at once.
                let mut run: Option<(u64, Range<usize>)> = None;
                for p in parts.iter() {
                    let r = reader.value_range(row, p.field).ok_or_else(|| past_end(stream, file, row))?;
                    let len = (r.end - r.start) as usize;
                    match &mut run {
                        Some((offset, dst)) if *offset + dst.len() as u64 == r.start => dst.end += len,
                        _ => {
                            if let Some((offset, dst)) = run.take() {
                                reader.read_at(offset, &mut send[dst])?;
                            }
                            run = Some((r.start, at..at + len));
                        }
                    }
                    at += len;
                }
                if let Some((offset, dst)) = run {
                    reader.read_at(offset, &mut send[dst])?;
                }
            }
        }
        debug_assert_eq!(at, total);
        // The file checks that read_rows makes after each read, once per window.
        for file in touched {
            self.readers.get(file, || dataset.open_reader(file))?.check()?;
        }
        metrics.bytes_read += total as u64;
        metrics.bytes_copied += total as u64;
        Ok((send, counts))
    }

    /// Reads the values of rows that did not cross the exchange (their owners share this
    /// rank's host: [`Stream::reads_locally_with`]) straight from the files into their places
    /// in `batches`: one copy, from the page cache the owners filled. The reads of a window
    /// go in file and offset order. Only for streams with direct reads: every part is a
    /// whole tensor field, so a part's bytes are the field's value.
    pub fn read_local(
        &mut self,
        stream: &Stream,
        batches: &mut [Batch],
        rows: &[LocalRow],
        metrics: &mut Metrics,
    ) -> Result<()> {
        let dataset = &stream.dataset;
        // (file, offset, length, batch, part, row in batch), sorted by file and offset.
        let mut reads = Vec::with_capacity(rows.len() * batches.first().map_or(0, |b| b.fields.len()));
        for r in rows {
            let (file, row) = dataset.locate(r.id);
            let reader = self.readers.get(file, || dataset.open_reader(file))?;
            for (k, part) in batches[r.batch].fields.iter().enumerate() {
                let range = reader.value_range(row, part.part().field).ok_or_else(|| past_end(stream, file, row))?;
                reads.push((file, range.start, (range.end - range.start) as usize, r.batch, k, r.row));
            }
        }
        reads.sort_unstable();
        // Every row's place in every batch tensor, taken out as it is read into.
        let mut places: Vec<Vec<Vec<&mut [u8]>>> = batches
            .iter_mut()
            .map(|b| {
                let rows = b.ids.len();
                b.fields
                    .iter_mut()
                    .map(|f| match f.bytes_mut() {
                        bytes if bytes.is_empty() => (0..rows).map(|_| <&mut [u8]>::default()).collect(),
                        bytes => bytes.chunks_exact_mut(bytes.len() / rows).collect(),
                    })
                    .collect()
            })
            .collect();
        let mut total = 0u64;
        for same_file in reads.chunk_by(|a, b| a.0 == b.0) {
            let file = same_file[0].0;
            let reader = self.readers.get(file, || dataset.open_reader(file))?;
            // Values that follow each other in the file (the fields of a record, adjacent
            // records) are one read, scattered into their places.
            for run in same_file.chunk_by(|a, b| a.1 + a.2 as u64 == b.1) {
                let mut bufs: Vec<IoSliceMut<'_>> = run
                    .iter()
                    .map(|&(_, _, _, b, k, i)| IoSliceMut::new(std::mem::take(&mut places[b][k][i])))
                    .collect();
                reader.read_vectored_at(run[0].1, &mut bufs)?;
                total += run.iter().map(|r| r.2 as u64).sum::<u64>();
            }
            reader.check()?;
        }
        metrics.bytes_read += total;
        metrics.bytes_copied += total;
        Ok(())
    }

    /// Readahead, by the owner, of its rows that receivers on its host read themselves
    /// ([`Reads::read_local`]): the spans of the files they lie in, in file order, so
    /// that a cold page cache is filled by sorted reads rather than by the receivers'
    /// scattered ones. `rows` are window rows of this rank's home range.
    pub fn advise(&mut self, stream: &Stream, rows: impl Iterator<Item = usize>, ids: &[SampleId]) -> Result<()> {
        let dataset = &stream.dataset;
        let fields = dataset.fields().len();
        let mut spans = Vec::new();
        for i in rows {
            let (file, row) = dataset.locate(ids[i]);
            let reader = self.readers.get(file, || dataset.open_reader(file))?;
            let mut ranges = (0..fields).filter_map(|f| reader.value_range(row, f));
            if let Some(first) = ranges.next() {
                let (start, end) = ranges.fold((first.start, first.end), |(s, e), r| (s.min(r.start), e.max(r.end)));
                spans.push((file, start, end));
            }
        }
        spans.sort_unstable();
        let mut merged: Vec<(usize, u64, u64)> = Vec::with_capacity(spans.len());
        for (file, start, end) in spans {
            match merged.last_mut() {
                Some(m) if m.0 == file && start <= m.2 + crate::dataset::rows::RECORD_GAP_BYTES => m.2 = m.2.max(end),
                _ => merged.push((file, start, end)),
            }
        }
        for (file, start, end) in merged {
            self.readers.get(file, || dataset.open_reader(file))?.advise(start..end);
        }
        Ok(())
    }

    /// Reads rows (sorted, local to the file) of file `file`.
    fn read_file_rows(
        &mut self,
        stream: &Stream,
        file: usize,
        rows: &[u64],
        metrics: &mut Metrics,
    ) -> Result<RowChunk> {
        let reader = self.readers.get(file, || stream.dataset.open_reader(file))?;
        let chunk = reader.read_rows(rows)?;
        if chunk.rows() != rows.len() {
            return Err(Error::file(
                &stream.dataset.files()[file].path,
                format!("reader returned {} of {} rows", chunk.rows(), rows.len()),
            ));
        }
        metrics.bytes_read += chunk.bytes_read();
        metrics.bytes_copied += chunk.bytes_read();
        Ok(chunk)
    }
}

/// A row of a window's batches whose values this rank reads itself: row `row` of
/// `batches[batch]`, sample `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalRow {
    pub batch: usize,
    pub row: usize,
    pub id: SampleId,
}

fn past_end(stream: &Stream, file: usize, row: u64) -> Error {
    Error::file(&stream.dataset.files()[file].path, format!("row {row} is past the end of the file"))
}

/// Values read for one window: chunk `k` holds the values of `ids[starts[k]..]`.
pub(crate) struct ReadSet {
    ids: Vec<SampleId>,
    starts: Vec<usize>,
    chunks: Vec<ReadChunk>,
}

/// Rows read for a window: exactly the ids asked for, or (from the home-range cache) all
/// home rows of a file starting at global id `first_id`.
struct ReadChunk {
    chunk: Arc<RowChunk>,
    first_id: Option<u64>,
}

impl ReadSet {
    /// The bytes of one value of a sample that was read.
    pub fn value(&self, id: SampleId, field: usize) -> &[u8] {
        let i = self.ids.binary_search(&id).expect("planned reads cover every sent id");
        let k = self.starts.partition_point(|&s| s <= i) - 1;
        let c = &self.chunks[k];
        match c.first_id {
            Some(first) => c.chunk.value((id.0 - first) as usize, field),
            None => c.chunk.value(i - self.starts[k], field),
        }
    }
}

/// Values for packing straight from the rows this rank read: window row `row` is sample
/// `ids[row]`.
pub(crate) struct FromReads<'a> {
    pub ids: &'a [SampleId],
    pub read: &'a ReadSet,
}

impl ValueSource for FromReads<'_> {
    fn value(&self, row: usize, field: usize) -> &[u8] {
        self.read.value(self.ids[row], field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::FileReader;

    struct Counted(Arc<std::sync::atomic::AtomicUsize>);

    impl FileReader for Counted {
        fn read_rows(&mut self, _: &[u64]) -> Result<RowChunk> {
            Ok(RowChunk::new(1))
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn open_readers_stay_bounded_and_evict_the_least_recently_used() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let live = Arc::new(AtomicUsize::new(0));
        let opened = std::cell::RefCell::new(Vec::new());
        let mut readers = OpenReaders::new(3);
        let mut use_file = |f: usize| {
            readers
                .get(f, || {
                    live.fetch_add(1, Ordering::SeqCst);
                    opened.borrow_mut().push(f);
                    Ok(Box::new(Counted(live.clone())) as Box<dyn FileReader>)
                })
                .unwrap()
                .read_rows(&[])
                .unwrap();
        };
        for f in [0, 1, 2, 0, 3, 0, 1, 4] {
            use_file(f);
            assert!(live.load(Ordering::SeqCst) <= 3);
        }
        // 3 evicts 1 (0 was used since), 1 evicts 2, 4 evicts 3.
        assert_eq!(*opened.borrow(), vec![0, 1, 2, 3, 1, 4]);
    }

    #[test]
    fn the_reader_limit_follows_rlimit_nofile() {
        let n = open_reader_limit();
        assert!((4..=1024).contains(&n), "{n}");
    }
}
