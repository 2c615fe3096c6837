//! Reading a window's samples: from this rank's home store (memory, spill) or pass
//! buffer where they are kept, from the files where they are not; and the rows same-host
//! receivers take straight from their owners' stores or files.
//!
//! Where each home row is — its *tier* — is a pure function of the stream's read plan
//! ([`crate::plan::io::IoPlan`]: how many rows each rank keeps in memory, whether the rest
//! is spilled), so an owner and a receiver always agree on it.

use std::collections::HashMap;
use std::io::IoSliceMut;
use std::sync::Arc;

use super::passes::PassBuffer;
use super::queue::{self, ReadOp};
use super::store::{HomeStore, StoreView};
use crate::dataset::{FileReader, RowChunk};
use crate::error::{Error, Result};
use crate::loader::batch::Batch;
use crate::loader::marshal::{LocalRow, ValueSource};
use crate::loader::metrics::Metrics;
use crate::loader::stream::Stream;
use crate::plan::io::Tier;
use crate::plan::FieldPart;
use crate::types::{Rank, SampleId};

/// The readers a producer keeps open, the home store, the stores of same-host ranks, and
/// the current pass.
pub(crate) struct Reads {
    readers: OpenReaders,
    /// This rank's home store, if it keeps or spills anything.
    pub store: Option<HomeStore>,
    /// By rank: the stores this rank reads rows from (its own, and those of same-host ranks
    /// whose stores it mapped).
    pub views: Vec<Option<StoreView>>,
    /// The pass the current windows read from (the passes strategy).
    pub pass: Option<Arc<PassBuffer>>,
    /// Reads in flight when reading at random.
    pub queue_depth: usize,
    /// The epoch whose files were last checked against their scan.
    checked_epoch: Option<u64>,
}

impl Reads {
    /// Reads with no store (every row from the files).
    pub fn new(ranks: usize, queue_depth: usize) -> Reads {
        Reads {
            readers: OpenReaders::new(open_reader_limit()),
            store: None,
            views: vec![None; ranks],
            pass: None,
            queue_depth,
            checked_epoch: None,
        }
    }

    /// Before a window's reads: waits until this rank's store holds every home row of
    /// `ids` (the rows it reads or that same-host receivers read from it), counts what
    /// the store's filler read since, and, once per epoch after the store is filled,
    /// checks that the files it holds rows of are still the ones scanned (rows kept in
    /// memory are never read again, so a file changed under the job is found here).
    pub fn wait_for_store(
        &mut self,
        stream: &Stream,
        epoch: u64,
        ids: &[SampleId],
        metrics: &mut Metrics,
    ) -> Result<()> {
        let Some(store) = &self.store else { return Ok(()) };
        let home = &store.home;
        let last = ids.iter().filter(|id| home.contains(&id.0)).map(|id| id.0 - home.start + 1).max().unwrap_or(0);
        let waited = store.wait_for(last);
        metrics.bytes_read += store.take_bytes_read();
        waited?;
        // Rows kept as read (variable-length values) are found through the view: it must
        // know the chunks filled so far.
        self.views[stream.rank.0] = Some(store.view());
        if self.checked_epoch != Some(epoch) && store.wait_for(0).is_ok() {
            self.checked_epoch = Some(epoch);
            let kept = store.resident + store.spill.as_ref().map_or(0, |_| home.end - home.start - store.resident);
            let ds = &stream.dataset;
            if kept > 0 {
                let (first, _) = ds.locate(SampleId(home.start));
                let (last, _) = ds.locate(SampleId(home.start + kept - 1));
                for info in &ds.files()[first..=last] {
                    info.check_unchanged()?;
                }
            }
        }
        Ok(())
    }

    /// The value sources of a window's rows this rank sends, for filling: ids `ids`
    /// (sorted, unique) from the home store, the pass, the spill file, or read from the
    /// files (a broadcast baseline's rank 0 reads ids of every home range, from the files).
    pub fn read(&mut self, stream: &Stream, ids: &[SampleId], metrics: &mut Metrics) -> Result<ReadSet> {
        let own = self.views.get(stream.rank.0).cloned().flatten();
        let home = stream.home.range(stream.rank);
        let in_memory = |id: SampleId| {
            home.contains(&id.0) && own.as_ref().is_some_and(|v| v.tier(id.0 - home.start) == Tier::Memory)
                || self.pass.as_ref().is_some_and(|p| p.holds(id))
        };
        let spilled: Vec<u64> = match &own {
            Some(v) if v.spill.is_some() => ids
                .iter()
                .filter(|&&id| home.contains(&id.0) && v.tier(id.0 - home.start) == Tier::Spill && !in_memory(id))
                .map(|id| id.0)
                .collect(),
            _ => Vec::new(),
        };
        let stored: Vec<SampleId> =
            ids.iter().copied().filter(|&id| !in_memory(id) && spilled.binary_search(&id.0).is_err()).collect();
        let spill = match (&own, spilled.is_empty()) {
            (Some(v), false) => Some(self.read_spilled(v, home.start, spilled, metrics)?),
            _ => None,
        };
        let (starts, chunks) = self.read_files(stream, &stored, metrics)?;
        Ok(ReadSet { home: home.clone(), own, pass: self.pass.clone(), spill, ids: stored, starts, chunks })
    }

    /// Reads the records of spilled home rows `ids` (sorted) from this rank's spill file.
    fn read_spilled(&self, view: &StoreView, home_start: u64, ids: Vec<u64>, metrics: &mut Metrics) -> Result<Spilled> {
        let record = view.layout.as_ref().expect("spilled rows have a layout").record;
        let file = view.spill.as_deref().expect("a spill file");
        let mut records = vec![0u8; ids.len() * record];
        let ops: Vec<ReadOp<'_>> = records
            .chunks_exact_mut(record)
            .zip(&ids)
            .map(|(dst, &id)| ReadOp {
                source: 0,
                file,
                offset: view.spill_range(id - home_start, 0).start,
                bufs: vec![IoSliceMut::new(dst)],
            })
            .collect();
        let n = queue::run(queue::merge(ops), self.queue_depth).map_err(spill_error)?;
        metrics.bytes_read_spill += n;
        metrics.bytes_copied += n;
        Ok(Spilled { ids, records, record, fields: view.layout.clone().expect("layout").fields })
    }

    /// Reads rows of the files: `ids` sorted; per file, the chunk of its rows.
    fn read_files(
        &mut self,
        stream: &Stream,
        ids: &[SampleId],
        metrics: &mut Metrics,
    ) -> Result<(Vec<usize>, Vec<Arc<RowChunk>>)> {
        let dataset = &stream.dataset;
        let (mut starts, mut chunks) = (Vec::new(), Vec::new());
        let mut i = 0;
        while i < ids.len() {
            let (file, _) = dataset.locate(ids[i]);
            let end_id = dataset.file_start(file + 1);
            let j = i + ids[i..].partition_point(|id| id.0 < end_id);
            let file_start = dataset.file_start(file);
            starts.push(i);
            let rows: Vec<u64> = ids[i..j].iter().map(|id| id.0 - file_start).collect();
            chunks.push(Arc::new(self.read_file_rows(stream, file, &rows, metrics)?));
            i = j;
        }
        Ok((starts, chunks))
    }

    /// Fills a window's send buffer straight from where each value is: memory (copied),
    /// the spill file or the data files (read into place, up to the queue depth in
    /// flight), in the layout [`crate::loader::marshal::fill`] makes. Only for streams whose
    /// values all sit whole at fixed offsets ([`Stream::direct_reads`]): `parts` are whole
    /// tensor fields. `ids[i]` is the id of window row `i`.
    pub fn fill_direct(
        &mut self,
        stream: &Stream,
        sends: &[Vec<usize>],
        parts: &[Option<&[FieldPart]>],
        ids: &[SampleId],
        metrics: &mut Metrics,
    ) -> Result<(Vec<u8>, Vec<usize>)> {
        let fields = stream.dataset.fields();
        let row_bytes = |parts: &[FieldPart]| parts.iter().filter_map(|p| p.bytes(&fields[p.field])).sum::<usize>();
        let counts: Vec<usize> =
            sends.iter().zip(parts).map(|(rows, p)| p.map_or(0, |p| rows.len() * row_bytes(p))).collect();
        let mut send = crate::buffers::bytes(counts.iter().sum());
        // Every value's place in the send buffer, in order.
        let mut places = Vec::new();
        let mut rest = &mut send[..];
        for (rows, parts) in sends.iter().zip(parts) {
            let Some(parts) = parts else { continue };
            for &i in rows {
                for p in parts.iter() {
                    let (dst, r) =
                        std::mem::take(&mut rest).split_at_mut(fields[p.field].fixed_bytes().expect("tensor"));
                    rest = r;
                    places.push(Place { rank: stream.rank.0, id: ids[i], field: p.field, dst });
                }
            }
        }
        debug_assert!(rest.is_empty());
        self.fill_places(stream, places, metrics)?;
        Ok((send, counts))
    }

    /// Reads the values of rows that did not cross the exchange (their owners share this
    /// rank's host: [`Stream::reads_locally`]) into their places in `batches`: copied
    /// from the owner's memory, or read from its spill file or the data files (sorted by
    /// file and offset; adjacent values in one read). Every part is a whole tensor field.
    pub fn read_local(
        &mut self,
        stream: &Stream,
        batches: &mut [Batch],
        rows: &[LocalRow],
        metrics: &mut Metrics,
    ) -> Result<()> {
        let mut places = Vec::with_capacity(rows.len() * batches.first().map_or(0, |b| b.fields.len()));
        let field_of: Vec<Vec<usize>> =
            batches.iter().map(|b| b.fields.iter().map(|f| f.part().field).collect()).collect();
        // Every row's place in every batch tensor.
        let mut slots: Vec<Vec<Vec<&mut [u8]>>> = batches
            .iter_mut()
            .map(|b| {
                let rows = b.ids.len();
                b.fields
                    .iter_mut()
                    .map(|f| match f.bytes_mut() {
                        [] => (0..rows).map(|_| <&mut [u8]>::default()).collect(),
                        bytes => bytes.chunks_exact_mut(bytes.len() / rows).collect(),
                    })
                    .collect()
            })
            .collect();
        for r in rows {
            let owner = stream.home.owner(r.id).0;
            for (k, slot) in slots[r.batch].iter_mut().enumerate() {
                let field = field_of[r.batch][k];
                places.push(Place { rank: owner, id: r.id, field, dst: std::mem::take(&mut slot[r.row]) });
            }
        }
        self.fill_places(stream, places, metrics)
    }

    /// Fills each place with its value: from memory at once, from files with reads in flight.
    fn fill_places(&mut self, stream: &Stream, places: Vec<Place<'_>>, metrics: &mut Metrics) -> Result<()> {
        let dataset = &stream.dataset;
        let mut copied = 0u64;
        // Reads: from spill files (by rank) and data files (by index).
        let mut spill_reads: Vec<(usize, u64, &mut [u8])> = Vec::new();
        let mut file_reads: Vec<(usize, u64, usize, &mut [u8])> = Vec::new();
        for p in places {
            // A pass (of this rank's own rows) holds them whatever their tier.
            if let Some(v) = self.pass.as_ref().and_then(|pass| pass.value(p.id, p.field)) {
                p.dst.copy_from_slice(v);
                copied += p.dst.len() as u64;
                continue;
            }
            let home = stream.home.range(Rank(p.rank));
            let view = self.views.get(p.rank).and_then(Option::as_ref).filter(|_| home.contains(&p.id.0));
            let tier = view.map_or(Tier::Storage, |v| v.tier(p.id.0 - home.start));
            match (tier, view) {
                (Tier::Memory, Some(v)) => {
                    p.dst.copy_from_slice(v.value(p.id.0 - home.start, p.field));
                    copied += p.dst.len() as u64;
                }
                (Tier::Spill, Some(v)) => {
                    spill_reads.push((p.rank, v.spill_range(p.id.0 - home.start, p.field).start, p.dst));
                }
                _ => {
                    let (file, row) = dataset.locate(p.id);
                    file_reads.push((file, row, p.field, p.dst));
                }
            }
        }
        metrics.bytes_copied += copied;
        // Spill files: one source per rank.
        if !spill_reads.is_empty() {
            let ops = spill_reads
                .into_iter()
                .map(|(rank, offset, dst)| ReadOp {
                    source: rank,
                    file: self.views[rank].as_ref().and_then(|v| v.spill.as_deref()).expect("a spill file"),
                    offset,
                    bufs: vec![IoSliceMut::new(dst)],
                })
                .collect();
            let n = queue::run(queue::merge(ops), self.queue_depth).map_err(spill_error)?;
            metrics.bytes_read_spill += n;
            metrics.bytes_copied += n;
        }
        if dataset.row_source().is_some() {
            // A feeder's rows have no offsets in a local file: asked for whole.
            return self.fill_from_rows(stream, file_reads, metrics);
        }
        // Data files, a reader-limit's worth of files at a time.
        file_reads.sort_unstable_by_key(|r| r.0);
        let limit = self.readers.capacity;
        // Each group is drained from the front.
        let at = 0;
        while at < file_reads.len() {
            let mut files: Vec<usize> = Vec::new();
            let mut end = at;
            while end < file_reads.len() && (files.len() < limit || files.last() == Some(&file_reads[end].0)) {
                if files.last() != Some(&file_reads[end].0) {
                    files.push(file_reads[end].0);
                }
                end += 1;
            }
            for &f in &files {
                self.readers.get(f, || dataset.open_reader(f))?;
            }
            let readers = &self.readers;
            let mut ops = Vec::with_capacity(end - at);
            for (file, row, field, dst) in file_reads.drain(at..end) {
                let reader = readers.peek(file).expect("opened above");
                let range = reader.value_range(row, field).ok_or_else(|| past_end(stream, file, row))?;
                debug_assert_eq!(range.end - range.start, dst.len() as u64);
                let Some(f) = reader.positional().map(|p| p.file) else {
                    return Err(Error::Internal(format!(
                        "{}: read in place, but the reader has no file",
                        dataset.files()[file].path.display()
                    )));
                };
                ops.push(ReadOp { source: file, file: f, offset: range.start, bufs: vec![IoSliceMut::new(dst)] });
            }
            let read = queue::run(queue::merge(ops), self.queue_depth);
            // The file checks that read_rows makes after each read, once per window; a
            // file that changed is the cause of a failed read.
            for &f in &files {
                readers.peek(f).expect("opened above").check()?;
            }
            let n = read.map_err(|e| {
                crate::dataset::positional::read_error(&dataset.files()[e.source].path, e.error, e.offset, e.len)
            })?;
            metrics.bytes_read += n;
            metrics.bytes_copied += n;
        }
        Ok(())
    }

    /// Readahead, by the owner, of its rows that receivers on its host read from the files
    /// themselves ([`Reads::read_local`]): the spans of the files they lie in, in file
    /// order, so that a cold page cache is filled by sorted reads rather than by the
    /// receivers' scattered ones. `rows` are window rows of this rank's home range.
    pub fn advise(&mut self, stream: &Stream, rows: impl Iterator<Item = usize>, ids: &[SampleId]) -> Result<()> {
        let dataset = &stream.dataset;
        let fields = dataset.fields().len();
        let home = stream.home.range(stream.rank);
        let own = self.views.get(stream.rank.0).cloned().flatten();
        let mut spans = Vec::new();
        for i in rows {
            if own.as_ref().is_some_and(|v| v.tier(ids[i].0 - home.start) != Tier::Storage) {
                continue;
            }
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
                Some(m) if m.0 == file && start <= m.2 + crate::dataset::positional::RECORD_GAP_BYTES => {
                    m.2 = m.2.max(end)
                }
                _ => merged.push((file, start, end)),
            }
        }
        for (file, start, end) in merged {
            self.readers.get(file, || dataset.open_reader(file))?.advise(start..end);
        }
        Ok(())
    }

    /// Fills each place (file, row, field, where) with its value from the rows read
    /// through the files' readers: one read of the rows it needs a file.
    fn fill_from_rows(
        &mut self,
        stream: &Stream,
        mut places: Vec<(usize, u64, usize, &mut [u8])>,
        metrics: &mut Metrics,
    ) -> Result<()> {
        places.sort_unstable_by_key(|p| (p.0, p.1));
        while let Some(&(file, ..)) = places.first() {
            let end = places.partition_point(|p| p.0 == file);
            let mut rows: Vec<u64> = places[..end].iter().map(|p| p.1).collect();
            rows.dedup();
            let chunk = self.read_file_rows(stream, file, &rows, metrics)?;
            for (_, row, field, dst) in places.drain(..end) {
                let value = chunk.value(rows.binary_search(&row).expect("read above"), field);
                if value.len() != dst.len() {
                    let why = format!("row {row}: a value of {} bytes, where {} were expected", value.len(), dst.len());
                    return Err(Error::file(&stream.dataset.files()[file].path, why));
                }
                dst.copy_from_slice(value);
            }
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

/// Where one value goes: field `field` of sample `id`, owned by rank `rank`.
struct Place<'a> {
    rank: usize,
    id: SampleId,
    field: usize,
    dst: &'a mut [u8],
}

fn spill_error(e: queue::ReadFailure) -> Error {
    Error::Io { path: "(spill file)".into(), source: e.error }
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
    open: HashMap<usize, (Box<dyn FileReader>, u64)>,
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
        open: impl FnOnce() -> Result<Box<dyn FileReader>>,
    ) -> Result<&mut Box<dyn FileReader>> {
        self.tick += 1;
        if !self.open.contains_key(&file) {
            if self.open.len() >= self.capacity {
                // O(capacity) per eviction; evictions cost a reopen (syscalls) anyway.
                if let Some(&lru) = self.open.iter().min_by_key(|(_, (_, t))| *t).map(|(f, _)| f) {
                    self.open.remove(&lru);
                }
            }
            let reader = open()?;
            // The windows' reads are scattered over the home range (and readahead that the
            // loader wants is asked for explicitly: `advise`).
            reader.random_access();
            self.open.insert(file, (reader, 0));
        }
        let entry = self.open.get_mut(&file).expect("inserted above");
        entry.1 = self.tick;
        Ok(&mut entry.0)
    }

    /// The reader of file `file`, if it is open.
    fn peek(&self, file: usize) -> Option<&dyn FileReader> {
        self.open.get(&file).map(|(r, _)| &**r)
    }
}

fn past_end(stream: &Stream, file: usize, row: u64) -> Error {
    Error::file(&stream.dataset.files()[file].path, format!("row {row} is past the end of the file"))
}

/// Values for one window's sends: from the home store's memory, the pass, records read
/// from the spill file, or chunks read from the files (chunk `k` holds the values of
/// `ids[starts[k]..]`).
pub(crate) struct ReadSet {
    home: std::ops::Range<u64>,
    own: Option<StoreView>,
    pass: Option<Arc<PassBuffer>>,
    spill: Option<Spilled>,
    ids: Vec<SampleId>,
    starts: Vec<usize>,
    chunks: Vec<Arc<RowChunk>>,
}

/// Records read from the spill file for one window.
struct Spilled {
    ids: Vec<u64>,
    records: Vec<u8>,
    record: usize,
    fields: Vec<std::ops::Range<usize>>,
}

impl ReadSet {
    /// The bytes of one value of a sample that was read.
    pub fn value(&self, id: SampleId, field: usize) -> &[u8] {
        if self.home.contains(&id.0) {
            if let Some(v) = self.own.as_ref().filter(|v| v.tier(id.0 - self.home.start) == Tier::Memory) {
                return v.value(id.0 - self.home.start, field);
            }
        }
        if let Some(v) = self.pass.as_ref().and_then(|p| p.value(id, field)) {
            return v;
        }
        if let Some(s) = &self.spill {
            if let Ok(i) = s.ids.binary_search(&id.0) {
                return &s.records[i * s.record..][s.fields[field].clone()];
            }
        }
        let i = self.ids.binary_search(&id).expect("planned reads cover every sent id");
        let k = self.starts.partition_point(|&s| s <= i) - 1;
        self.chunks[k].value(i - self.starts[k], field)
    }
}

/// Values for filling send buffers straight from the rows this rank read: window row `row` is sample
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
