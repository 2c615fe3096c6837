//! The home store: this rank's home rows kept off the shared storage — a prefix of the
//! home range in memory and, with a spill directory, the rest on node-local storage —
//! filled once by streaming the home range in large sequential reads on a thread of its
//! own ([`crate::plan::io`] decides how much of each).
//!
//! Rows whose fields all have a fixed size are kept in one layout, a *record* per row
//! (the fields' values one after another), in a memory region the other ranks of the host
//! can map (a `memfd`) and in an unlinked spill file they can read: a same-host receiver
//! copies such rows straight into its batches, and they never cross the exchange. Other
//! rows (variable-length values) are kept as the readers return them, for this rank only.
//!
//! **Filling.** The filler thread reads the home range in file order, [`STREAM_READ_BYTES`]
//! at a time, and publishes how many rows are in ([`Progress`]). A window waits, before its
//! read agreement, until every row it reads from this rank — and every row a same-host
//! receiver will copy from it — is in; so after the agreement no rank ever waits on another
//! rank's store, and a filler's failure is the read agreement's failure on every rank. The
//! file pages it brought into the page cache are dropped behind it: the store holds the
//! one copy, and a cgroup's memory is not spent twice.
//!
//! **Sharing.** The region and the spill file are reached by other processes of the host
//! through `/proc/<pid>/fd/<fd>` (same user, same PID namespace); where that fails anywhere,
//! the loader agrees to exchange same-host rows instead.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;

use crate::dataset::{Dataset, FileReader, RowChunk, RowLayout};
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::plan::io::{Tier, STREAM_READ_BYTES};
use crate::runtime::shared_memory::Region;

/// How far the filler got, and how it ended.
pub(crate) struct Progress {
    state: Mutex<FillState>,
    changed: Condvar,
    /// Bytes the filler read from the files, not yet counted by a window.
    bytes_read: AtomicU64,
    stop: AtomicBool,
}

#[derive(Default)]
struct FillState {
    /// Home rows `[0, filled)` are in the store.
    filled: u64,
    failed: Option<Error>,
    /// The failure was handed to a window already.
    reported: bool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            state: Mutex::new(FillState::default()),
            changed: Condvar::new(),
            bytes_read: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    fn publish(&self, filled: u64) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).filled = filled;
        self.changed.notify_all();
    }

    fn fail(&self, e: Error) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).failed = Some(e);
        self.changed.notify_all();
    }
}

/// This rank's home store.
pub(crate) struct HomeStore {
    /// The home range (global ids).
    pub home: Range<u64>,
    /// Rows `[0, resident)` of the home range are in memory.
    pub resident: u64,
    /// Rows `[resident, home length)` are in the spill file.
    pub spill: Option<Arc<File>>,
    pub layout: Option<RowLayout>,
    memory: Memory,
    progress: Arc<Progress>,
    filler: Option<JoinHandle<()>>,
}

/// Rows in memory.
enum Memory {
    /// Whole records (fixed-size fields).
    Records(Arc<Region>),
    /// Chunks as the readers returned them (variable-length values).
    Chunks(Arc<RwLock<Chunks>>),
}

/// Chunks of rows, each with its first home row, in home-row order.
type Chunks = Vec<(u64, Arc<RowChunk>)>;

/// What a rank publishes so that the ranks of its host can read its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StoreHandle {
    pub pid: u32,
    /// The memory region's descriptor (-1: none to share).
    pub region_fd: i32,
    /// The spill file's descriptor (-1: none).
    pub spill_fd: i32,
}

impl StoreHandle {
    pub fn to_bytes(self) -> Vec<u8> {
        let mut v = self.pid.to_le_bytes().to_vec();
        v.extend(self.region_fd.to_le_bytes());
        v.extend(self.spill_fd.to_le_bytes());
        v
    }

    pub fn from_bytes(b: &[u8]) -> Option<StoreHandle> {
        let n = |i: usize| b.get(i..i + 4).map(|s| <[u8; 4]>::try_from(s).expect("4 bytes"));
        Some(StoreHandle {
            pid: u32::from_le_bytes(n(0)?),
            region_fd: i32::from_le_bytes(n(4)?),
            spill_fd: i32::from_le_bytes(n(8)?),
        })
    }
}

impl HomeStore {
    /// Creates the store of home range `home` — `resident` rows in memory, the rest in a
    /// spill file in `spill_dir` if given — and starts filling it.
    pub fn start(
        dataset: Arc<Dataset>,
        home: Range<u64>,
        resident: u64,
        spill_dir: Option<&Path>,
    ) -> Result<HomeStore> {
        let layout = RowLayout::of(dataset.fields());
        let len = home.end - home.start;
        let resident = resident.min(len);
        let memory = match &layout {
            Some(l) => {
                let bytes = usize::try_from(resident.saturating_mul(l.record as u64))
                    .map_err(|_| Error::Config("the resident rows do not fit this machine's address space".into()))?;
                let region = Region::create(c"meshfeed-home", bytes)
                    .context(ErrorKind::Config, format_args!("cannot allocate {bytes} bytes for the resident rows"))?;
                Memory::Records(Arc::new(region))
            }
            None => Memory::Chunks(Arc::new(RwLock::new(Vec::new()))),
        };
        let spill = match (spill_dir, &layout) {
            (Some(dir), Some(l)) if resident < len => {
                Some(Arc::new(spill_file(dir, (len - resident).saturating_mul(l.record as u64))?))
            }
            (Some(_), None) => {
                return Err(Error::Config("--spill-dir needs every field to have a fixed size".into()));
            }
            _ => None,
        };
        let progress = Arc::new(Progress::new());
        let fill_to = if spill.is_some() { len } else { resident };
        let filler = if fill_to > 0 {
            let fill = Filler {
                dataset,
                home: home.clone(),
                resident,
                fill_to,
                layout: layout.clone(),
                memory: memory.share(),
                spill: spill.clone(),
                progress: progress.clone(),
            };
            Some(
                std::thread::Builder::new()
                    .name("meshfeed-filler".into())
                    .spawn(move || fill.run())
                    .context(ErrorKind::Internal, "cannot start the filler thread")?,
            )
        } else {
            progress.publish(0);
            None
        };
        Ok(HomeStore { home, resident, spill, layout, memory, progress, filler })
    }

    /// What the ranks of this host need to read this store.
    pub fn handle(&self) -> StoreHandle {
        let region_fd = match &self.memory {
            Memory::Records(r) => r.fd().unwrap_or(-1),
            Memory::Chunks(_) => -1,
        };
        StoreHandle { pid: std::process::id(), region_fd, spill_fd: self.spill.as_ref().map_or(-1, |f| f.as_raw_fd()) }
    }

    /// Waits until home rows `[0, rows)` are in the store (or as far as it is filled, if
    /// less is kept), returning the filler's error if it failed.
    pub fn wait_for(&self, rows: u64) -> Result<()> {
        let limit = if self.spill.is_some() { self.home.end - self.home.start } else { self.resident };
        let rows = rows.min(limit);
        let mut state = self.progress.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(e) = state.failed.take() {
                state.reported = true;
                return Err(e);
            }
            if state.reported {
                return Err(Error::Misuse("the home range could not be read earlier".into()));
            }
            if state.filled >= rows {
                return Ok(());
            }
            state = self.progress.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether the store holds everything it keeps (without waiting; a failed filler is
    /// not filled, and its error goes to the next [`HomeStore::wait_for`]).
    pub fn is_filled(&self) -> bool {
        let limit = if self.spill.is_some() { self.home.end - self.home.start } else { self.resident };
        let state = self.progress.state.lock().unwrap_or_else(|e| e.into_inner());
        state.failed.is_none() && !state.reported && state.filled >= limit
    }

    /// Bytes the filler read since the last call.
    pub fn take_bytes_read(&self) -> u64 {
        self.progress.bytes_read.swap(0, Ordering::Relaxed)
    }

    /// A view of this store for reading rows (for this rank's own reads).
    pub fn view(&self) -> StoreView {
        StoreView {
            resident: self.resident,
            records: match &self.memory {
                Memory::Records(r) => Some(r.clone()),
                Memory::Chunks(_) => None,
            },
            chunks: match &self.memory {
                Memory::Chunks(c) => c.read().unwrap_or_else(|e| e.into_inner()).clone(),
                Memory::Records(_) => Vec::new(),
            },
            spill: self.spill.clone(),
            layout: self.layout.clone(),
        }
    }
}

impl Memory {
    fn share(&self) -> Memory {
        match self {
            Memory::Records(r) => Memory::Records(r.clone()),
            Memory::Chunks(c) => Memory::Chunks(c.clone()),
        }
    }
}

impl Drop for HomeStore {
    fn drop(&mut self) {
        self.progress.stop.store(true, Ordering::Release);
        if let Some(t) = self.filler.take() {
            let _ = t.join();
        }
    }
}

/// Creates the spill file of `bytes` bytes in `dir`, already unlinked: it disappears with
/// the last process holding it, however the job ends.
fn spill_file(dir: &Path, bytes: u64) -> Result<File> {
    let meta = std::fs::metadata(dir).file_context(dir, "spill directory")?;
    if !meta.is_dir() {
        return Err(Error::file(dir, "spill directory: not a directory"));
    }
    let path = dir.join(format!(".meshfeed-spill-{}-{:x}", std::process::id(), unique_suffix()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .file_context(&path, "cannot create the spill file")?;
    let _ = std::fs::remove_file(&path);
    // Reserve the space now, so that a full device is an error here, not mid-epoch.
    // SAFETY: fallocate on a descriptor we own.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, bytes as libc::off_t) };
    if r != 0 && r != libc::EOPNOTSUPP && r != libc::EINVAL {
        let e = std::io::Error::from_raw_os_error(r);
        return Err(Error::file_caused(
            dir,
            format!("spill directory: cannot reserve {} for the spill file: {e}", crate::plan::io::show_bytes(bytes)),
            e,
        ));
    }
    file.set_len(bytes).file_context(dir, "spill directory")?;
    // Spilled rows are read back at random, one record at a time.
    crate::dataset::positional::advise_random(&file);
    Ok(file)
}

/// A suffix that no other spill file of this process has.
fn unique_suffix() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (u64::from(nanos) << 16) ^ NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The filler thread's work.
struct Filler {
    dataset: Arc<Dataset>,
    home: Range<u64>,
    resident: u64,
    /// Rows `[0, fill_to)` are filled (the resident ones, and the spilled ones if any).
    fill_to: u64,
    layout: Option<RowLayout>,
    memory: Memory,
    spill: Option<Arc<File>>,
    progress: Arc<Progress>,
}

impl Filler {
    fn run(self) {
        // A panic must not leave a window waiting for rows that never come.
        let filled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.fill()));
        match filled {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.progress.fail(e),
            Err(_) => self.progress.fail(Error::Internal("the thread filling the home store panicked".into())),
        }
    }

    fn fill(&self) -> Result<()> {
        let ds = &*self.dataset;
        let end = self.home.start + self.fill_to;
        let sizes = crate::plan::budget::value_sizes(ds.fields(), &ds.mean_value_bytes());
        let rows_per_read = (STREAM_READ_BYTES / crate::plan::budget::sample_bytes(&sizes).max(1)).max(1);
        let record = self.layout.as_ref().map_or(0, |l| l.record as u64);
        // Spill bytes written and flushed so far.
        let mut flushed = 0u64;
        let mut id = self.home.start;
        while id < end {
            let (file, _) = ds.locate(crate::types::SampleId(id));
            let (file_start, file_end) = (ds.file_start(file), ds.file_start(file + 1).min(end));
            let mut reader = ds.open_reader(file)?;
            // Pages this stream brings into the page cache leave it behind the stream (the
            // store holds the one copy); pages cached before (a warm dataset, another job's)
            // stay.
            let cold = stream_is_cold(&*reader, id - file_start..file_end - file_start);
            while id < file_end {
                if self.progress.stop.load(Ordering::Acquire) {
                    return Ok(());
                }
                let n = rows_per_read.min(file_end - id);
                let rows = id - file_start..id - file_start + n;
                let read = self.fill_rows(&mut *reader, rows.clone(), id - self.home.start)?;
                if cold {
                    drop_behind(&*reader, rows);
                }
                self.progress.bytes_read.fetch_add(read, Ordering::Relaxed);
                id += n;
                if let Some(spill) = &self.spill {
                    let spilled = (id - self.home.start).saturating_sub(self.resident) * record;
                    if spilled - flushed >= 64 << 20 || id == end {
                        flush_spill(spill, flushed..spilled);
                        flushed = spilled;
                    }
                }
                self.progress.publish(id - self.home.start);
            }
        }
        Ok(())
    }

    /// Reads rows `rows` of a file (home rows from `at`) into the store; returns the bytes
    /// read.
    fn fill_rows(&self, reader: &mut dyn FileReader, rows: Range<u64>, at: u64) -> Result<u64> {
        let list: Vec<u64> = rows.clone().collect();
        let Some(layout) = &self.layout else {
            let chunk = reader.read_rows(&list)?;
            let bytes = chunk.bytes_read();
            if let Memory::Chunks(c) = &self.memory {
                c.write().unwrap_or_else(|e| e.into_inner()).push((at, Arc::new(chunk)));
            }
            return Ok(bytes);
        };
        let record = layout.record;
        let n = (rows.end - rows.start) as usize;
        // The rows' records where the file stores them exactly so (a .npy or raw file of
        // these fields, no padding): one read straight into place.
        let stride = |f: usize| match (reader.value_range(rows.start, f), reader.value_range(rows.start + 1, f)) {
            (Some(a), Some(b)) => b.start - a.start,
            _ => record as u64,
        };
        let in_file = reader.value_range(rows.start, 0).filter(|first| {
            layout.fields.iter().enumerate().all(|(f, want)| {
                (n < 2 || stride(f) == record as u64)
                    && reader.value_range(rows.start, f).is_some_and(|r| r.start - first.start == want.start as u64)
                    && reader
                        .value_range(rows.end - 1, f)
                        .is_some_and(|r| r.start - first.start == ((n - 1) * record + want.start) as u64)
            })
        });
        let resident = self.resident;
        // Split at the resident prefix's end: memory before, spill after.
        let split = (resident.saturating_sub(at) as usize).min(n);
        let mut bytes = 0u64;
        if let Some(first) = in_file {
            if split > 0 {
                let Memory::Records(region) = &self.memory else { unreachable!("records have a region") };
                // SAFETY: rows past the watermark, which only this filler writes and nobody
                // reads until it publishes them.
                let dst = unsafe { region.bytes_to_fill(at as usize * record..(at as usize + split) * record) };
                reader.read_at(first.start, dst)?;
                bytes += dst.len() as u64;
            }
            if split < n {
                let mut buf = vec![0u8; (n - split) * record];
                reader.read_at(first.start + (split * record) as u64, &mut buf)?;
                self.write_spill(at + split as u64, &buf)?;
                bytes += buf.len() as u64;
            }
            reader.check()?;
            return Ok(bytes);
        }
        let chunk = reader.read_rows(&list)?;
        let mut spilled = Vec::new();
        for i in 0..n {
            let dst: &mut [u8] = if i < split {
                let Memory::Records(region) = &self.memory else { unreachable!("records have a region") };
                let r = (at as usize + i) * record;
                // SAFETY: as above.
                unsafe { region.bytes_to_fill(r..r + record) }
            } else {
                let from = spilled.len();
                spilled.resize(from + record, 0);
                &mut spilled[from..]
            };
            for (f, range) in layout.fields.iter().enumerate() {
                dst[range.clone()].copy_from_slice(chunk.value(i, f));
            }
        }
        if !spilled.is_empty() {
            self.write_spill(at + split as u64, &spilled)?;
        }
        Ok(chunk.bytes_read())
    }

    /// Writes the records of home rows from `at` (past the resident prefix) to the spill file.
    fn write_spill(&self, at: u64, records: &[u8]) -> Result<()> {
        let (Some(spill), Some(layout)) = (&self.spill, &self.layout) else {
            return Err(Error::Internal("rows past the resident prefix without a spill file".into()));
        };
        let offset = (at - self.resident) * layout.record as u64;
        spill.write_all_at(records, offset).map_err(|e| Error::Io { path: PathBuf::from("(spill file)"), source: e })
    }
}

/// Writes spilled bytes `range` out and drops them from the page cache: the spill file is
/// read back from the device, and its dirty pages would count against a cgroup's memory
/// meanwhile.
fn flush_spill(spill: &File, range: Range<u64>) {
    let (start, len) = (range.start, range.end - range.start);
    let fd = spill.as_raw_fd();
    // SAFETY: sync_file_range reads no memory; the descriptor is ours.
    unsafe {
        libc::sync_file_range(
            fd,
            start as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        );
    }
    crate::dataset::positional::advise_dontneed(spill, range);
}

/// Where the values of rows `rows` lie in the file, where the reader knows (in-place
/// formats): for each field, from its value of the first row to that of the last.
fn file_ranges(reader: &dyn FileReader, rows: &Range<u64>) -> Vec<Range<u64>> {
    if rows.is_empty() {
        return Vec::new();
    }
    // Fields stored apart (HDF5 datasets, Arrow columns) give apart spans; fields inside
    // one record (npy, raw records) overlap and merge into one.
    let mut spans: Vec<Range<u64>> = (0..)
        .map_while(|f| Some(reader.value_range(rows.start, f)?.start..reader.value_range(rows.end - 1, f)?.end))
        .filter(|r| r.start < r.end)
        .collect();
    spans.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<u64>> = Vec::with_capacity(spans.len());
    for r in spans {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// Whether the file pages of rows `rows` are mostly not in the page cache: a stream over
/// them brings them in itself, and may drop them behind it ([`drop_behind`]). Decided once
/// per file before streaming — the stream's own readahead would make its next pages look
/// cached. Formats whose values' offsets are unknown (HDF5 through the library) say no.
pub(crate) fn stream_is_cold(reader: &dyn FileReader, rows: Range<u64>) -> bool {
    let Some(file) = reader.positional().map(|p| p.file) else { return false };
    let spans = file_ranges(reader, &rows);
    let bytes: u64 = spans.iter().map(|r| r.end - r.start).sum();
    let cached: f64 = spans
        .iter()
        .map(|r| crate::dataset::positional::cached_fraction(file, r.clone()) * (r.end - r.start) as f64)
        .sum();
    bytes > 0 && cached < 0.5 * bytes as f64
}

/// Drops the file pages of rows `rows` from the page cache: a store or a pass holds them
/// now, or the next pass is too far away for the page cache to keep them (advice only).
pub(crate) fn drop_behind(reader: &dyn FileReader, rows: Range<u64>) {
    // Only the spans read: the pages between them and past the last (the readahead the
    // next read will use, another field's) stay.
    for r in file_ranges(reader, &rows) {
        reader.drop_cache(r);
    }
}

/// Rows of one rank's store, for reading: this rank's own, or a same-host rank's mapped
/// read-only.
#[derive(Clone)]
pub(crate) struct StoreView {
    pub resident: u64,
    records: Option<Arc<Region>>,
    chunks: Vec<(u64, Arc<RowChunk>)>,
    pub spill: Option<Arc<File>>,
    pub layout: Option<RowLayout>,
}

impl StoreView {
    /// The view of a same-host rank's store, from the handle it published.
    pub fn open_peer(h: StoreHandle, resident: u64, layout: &RowLayout) -> std::io::Result<StoreView> {
        let len = (resident as usize).saturating_mul(layout.record);
        let records = match (h.region_fd, len) {
            (_, 0) => None,
            (-1, _) => return Err(std::io::Error::other("its resident rows are not shared")),
            (fd, len) => Some(Arc::new(Region::open_peer(h.pid, fd, len)?)),
        };
        let spill = match h.spill_fd {
            -1 => None,
            fd => {
                let f = File::open(format!("/proc/{}/fd/{fd}", h.pid))?;
                crate::dataset::positional::advise_random(&f);
                Some(Arc::new(f))
            }
        };
        Ok(StoreView { resident, records, chunks: Vec::new(), spill, layout: Some(layout.clone()) })
    }

    /// Where home row `offset` is.
    pub fn tier(&self, offset: u64) -> Tier {
        if offset < self.resident {
            Tier::Memory
        } else if self.spill.is_some() {
            Tier::Spill
        } else {
            Tier::Storage
        }
    }

    /// The record of home row `offset` (in memory, fixed-size fields).
    pub fn record(&self, offset: u64) -> &[u8] {
        let (records, layout) = (self.records.as_ref().expect("records"), self.layout.as_ref().expect("layout"));
        let at = offset as usize * layout.record;
        records.bytes(at..at + layout.record)
    }

    /// The value of field `field` of home row `offset` (in memory).
    pub fn value(&self, offset: u64, field: usize) -> &[u8] {
        if let Some(layout) = &self.layout {
            return &self.record(offset)[layout.fields[field].clone()];
        }
        let k = self.chunks.partition_point(|(first, _)| *first <= offset) - 1;
        let (first, chunk) = &self.chunks[k];
        chunk.value((offset - first) as usize, field)
    }

    /// Where field `field` of home row `offset` lies in the spill file.
    pub fn spill_range(&self, offset: u64, field: usize) -> Range<u64> {
        let layout = self.layout.as_ref().expect("spilled rows have a layout");
        let at = (offset - self.resident) * layout.record as u64;
        let f = &layout.fields[field];
        at + f.start as u64..at + f.end as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{gen, DType, Field, Format};

    fn dataset(format: Format, fields: Vec<Field>, samples: u64) -> (tempfile::TempDir, Arc<Dataset>) {
        let (dir, spec) = gen::GenSpec::write_temp(format, samples, 3, 7, fields);
        gen::write_side_files(&spec).unwrap();
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        (dir, Arc::new(ds))
    }

    /// Every value of home rows `home` through the store equals the files'.
    fn check(ds: &Dataset, store: &HomeStore, home: Range<u64>) {
        store.wait_for(home.end - home.start).unwrap();
        let view = store.view();
        for id in home.clone() {
            let (file, row) = ds.locate(crate::types::SampleId(id));
            let want = ds.open_reader(file).unwrap().read_rows(&[row]).unwrap();
            let offset = id - home.start;
            for f in 0..ds.fields().len() {
                let got = match view.tier(offset) {
                    Tier::Memory => view.value(offset, f).to_vec(),
                    Tier::Spill => {
                        let r = view.spill_range(offset, f);
                        let mut b = vec![0; (r.end - r.start) as usize];
                        view.spill.as_ref().unwrap().read_exact_at(&mut b, r.start).unwrap();
                        b
                    }
                    Tier::Storage => continue,
                };
                assert_eq!(got, want.value(0, f), "id {id} field {f}");
            }
        }
    }

    #[test]
    fn records_fill_memory_and_spill_across_files() {
        let fields = vec![Field::tensor("x", DType::F32, vec![3]), Field::tensor("y", DType::I64, vec![])];
        for format in [Format::Npy, Format::Arrow, Format::Raw] {
            let (_d, ds) = dataset(format, fields.clone(), 100);
            let spill = tempfile::tempdir().unwrap();
            // Home rows 10..90 across the three files: 30 in memory, 50 spilled.
            let store = HomeStore::start(ds.clone(), 10..90, 30, Some(spill.path())).unwrap();
            check(&ds, &store, 10..90);
            assert_eq!(store.view().tier(29), Tier::Memory);
            assert_eq!(store.view().tier(30), Tier::Spill);
            // Each row read once; Arrow's streaming reads take the record batches' span
            // whole, the messages between them included (7-row batches: up to 2×).
            let read = store.take_bytes_read();
            match format {
                Format::Arrow => assert!((80 * 20..2 * 80 * 20).contains(&read), "{format:?}: {read}"),
                _ => assert_eq!(read, 80 * 20, "{format:?}: each row read once"),
            }
            // The spill file is already unlinked.
            assert_eq!(std::fs::read_dir(spill.path()).unwrap().count(), 0);
            // Partly resident, no spill: the rest stays in storage.
            let store = HomeStore::start(ds.clone(), 0..100, 40, None).unwrap();
            check(&ds, &store, 0..100);
            assert_eq!(store.view().tier(40), Tier::Storage);
        }
    }

    #[test]
    fn the_spans_dropped_behind_a_stream_are_the_values_read() {
        let fields = vec![Field::tensor("x", DType::U8, vec![4096]), Field::tensor("y", DType::I64, vec![])];
        // HDF5 stores each field apart; npy's fields share records; Arrow's record
        // batches (7 rows here) interleave the fields' buffers, which merge into one span.
        for format in [Format::Npy, Format::Hdf5, Format::Arrow] {
            let (_d, ds) = dataset(format, fields.clone(), 300);
            let reader = ds.open_reader(0).unwrap();
            let spans = file_ranges(&*reader, &(10..50));
            let value = |row, f| reader.value_range(row, f).unwrap();
            let (x, y) = (value(10, 0).start..value(49, 0).end, value(10, 1).start..value(49, 1).end);
            match format {
                // Dropping the two spans leaves the rest of the file cached: the readahead
                // past `x`'s span, and every other row's `y`.
                Format::Hdf5 => {
                    assert_eq!(spans, vec![x, y]);
                    assert_eq!(spans.iter().map(|r| r.end - r.start).sum::<u64>(), 40 * 4104);
                }
                _ => assert_eq!(spans, vec![x.start.min(y.start)..x.end.max(y.end)], "{format:?}"),
            }
        }
    }

    #[test]
    fn variable_length_rows_are_kept_as_read() {
        let fields =
            vec![Field { name: "t".into(), kind: crate::dataset::FieldKind::Bytes { utf8: false, elem: None } }];
        let (_d, ds) = dataset(Format::Arrow, fields, 50);
        let store = HomeStore::start(ds.clone(), 5..45, 40, None).unwrap();
        check(&ds, &store, 5..45);
    }

    #[test]
    fn a_failed_read_is_the_waiting_windows_error() {
        let fields = vec![Field::tensor("x", DType::U8, vec![8])];
        let (dir, ds) = dataset(Format::Npy, fields, 30);
        // The last file shrinks after the scan.
        let last = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "npy"))
            .max()
            .unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
        f.set_len(100).unwrap();
        let store = HomeStore::start(ds, 0..30, 30, None).unwrap();
        let err = store.wait_for(30).unwrap_err().to_string();
        assert!(err.contains(last.file_name().unwrap().to_str().unwrap()) && err.contains("changed since"), "{err}");
        assert!(store.wait_for(1).unwrap_err().to_string().contains("could not be read earlier"));
    }

    #[test]
    fn a_peer_maps_the_region_read_only() {
        let fields = vec![Field::tensor("x", DType::U16, vec![5])];
        let (_d, ds) = dataset(Format::Npy, fields.clone(), 40);
        let store = HomeStore::start(ds.clone(), 0..40, 40, None).unwrap();
        store.wait_for(40).unwrap();
        let h = StoreHandle::from_bytes(&store.handle().to_bytes()).unwrap();
        assert_eq!(h, store.handle());
        let peer = StoreView::open_peer(h, 40, &RowLayout::of(&fields).unwrap()).unwrap();
        for offset in [0, 17, 39] {
            assert_eq!(peer.record(offset), store.view().record(offset));
        }
    }
}
