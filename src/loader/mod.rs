//! The loader: turns a dataset into a stream of batches, one window of steps at a time.
//!
//! For each window every rank
//! 1. **plans** the window ([`crate::plan::WindowPlan`]): ids of every row, what it reads,
//!    sends and receives;
//! 2. **reads** the samples of its home range that the window needs, sorted by id, and
//!    agrees with the other ranks that every read succeeded;
//! 3. **packs** each destination's values into one send buffer (one copy);
//! 4. **exchanges** with one all-to-all-v over the [`Transport`];
//! 5. **assembles** the received values into [`Batch`]es (one copy).
//!
//! ```
//! use meshfeed::dataset::{gen, Dataset, DType, Field, Format};
//! use meshfeed::loader::{Loader, LoaderOptions};
//! use meshfeed::transport::LocalTransport;
//! use meshfeed::types::Epoch;
//!
//! # fn main() -> meshfeed::Result<()> {
//! let dir = tempfile::tempdir().unwrap();
//! let spec = gen::GenSpec {
//!     format: Format::Npy, samples: 10, files: 2, out: dir.path().into(), arrow_batch_rows: 4,
//!     fields: vec![Field::tensor("x", DType::F32, vec![3]), Field::tensor("y", DType::I64, vec![])],
//! };
//! for i in 0..spec.files { gen::write_file(&spec, i)?; }
//!
//! let dataset = Dataset::open_local(&[dir.path().into()], Default::default())?;
//! let options = LoaderOptions { batch_size: 4, seed: 1, ..Default::default() };
//! let mut loader = Loader::new(LocalTransport::new(), dataset, options)?;
//! assert_eq!(loader.steps_per_epoch(), 2); // 10 samples, batches of 4, tail dropped
//! for batch in loader.epoch(Epoch(0)) {
//!     let batch = batch?;
//!     let x = batch.field("x").unwrap().array::<f32>()?;
//!     assert_eq!(x.shape(), &[4, 3]);
//!     // generated contents are a function of the id: x[i][0] == id
//!     assert_eq!(x[[0, 0]], batch.ids()[0].0 as f32);
//! }
//! # Ok(()) }
//! ```

pub mod batch;
pub mod metrics;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use crate::dataset::{self, Dataset, DatasetOptions, FieldKind, FileInfo, FileReader, RowChunk};
use crate::error::{Error, Result};
use crate::plan::{steps_per_window, HomeRanges, Permutation, Placement, WindowPlan};
use crate::transport::{agree, ReduceOp, Transport};
use crate::types::{Epoch, Rank, SampleId, Step};
pub use batch::{Batch, Element, FieldData};
pub use metrics::{Metrics, Phase};

/// Assumed bytes per variable-length value when sizing windows (actual sizes are only
/// known after reading).
const VAR_LEN_ESTIMATE: u64 = 256;

/// How the loader batches and shuffles.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderOptions {
    /// Global batch size `B`.
    pub batch_size: usize,
    /// Seed of the permutation.
    pub seed: u64,
    /// Budget for bytes in flight per rank in one exchange window.
    pub window_bytes: u64,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions { batch_size: 32, seed: 0, window_bytes: 64 << 20 }
    }
}

/// Opens a dataset collectively: every rank lists the files, each file's header is read by
/// one rank (file `i` by rank `i mod P`), and the headers are shared. Failures on any rank
/// are agreed, so every rank returns the same error.
pub fn open_dataset(transport: &dyn Transport, paths: &[PathBuf], options: DatasetOptions) -> Result<Dataset> {
    let files = agree(transport, dataset::resolve_paths(paths))?;
    // Ranks must see the same files (a rank on another filesystem would disagree).
    let listing = serde_json::to_vec(&files).expect("paths serialise");
    let digest = u64::from(crc32fast::hash(&listing)) | (listing.len() as u64) << 32;
    let mut lo_hi = [digest, u64::MAX - digest];
    transport.all_reduce_u64(&mut lo_hi[..1], ReduceOp::Min)?;
    transport.all_reduce_u64(&mut lo_hi[1..], ReduceOp::Min)?;
    if lo_hi[0] != u64::MAX - lo_hi[1] {
        return Err(Error::Config("ranks see different dataset files (is the dataset on a shared filesystem?)".into()));
    }
    let (me, world) = (transport.rank().0, transport.size());
    let mine: Result<Vec<FileInfo>> = files
        .iter()
        .enumerate()
        .filter(|(i, _)| i % world == me)
        .map(|(_, (path, format))| dataset::scan_file(path, *format, &options))
        .collect();
    let mine = agree(transport, mine)?;
    let gathered = transport.all_gather(&serde_json::to_vec(&mine).expect("file infos serialise"))?;
    let mut per_rank: Vec<std::vec::IntoIter<FileInfo>> = gathered
        .iter()
        .map(|bytes| serde_json::from_slice::<Vec<FileInfo>>(bytes).map(Vec::into_iter))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Transport(format!("bad file header exchange: {e}")))?;
    let infos = (0..files.len())
        .map(|i| per_rank[i % world].next().ok_or_else(|| Error::Transport("missing file header in exchange".into())))
        .collect::<Result<Vec<_>>>()?;
    Dataset::from_files(infos, options)
}

/// A distributed loader over one dataset.
pub struct Loader<T: Transport> {
    transport: T,
    dataset: Dataset,
    options: LoaderOptions,
    home: HomeRanges,
    placement: Placement,
    steps_per_epoch: u64,
    steps_per_window: u64,
    readers: HashMap<usize, Box<dyn FileReader>>,
    metrics: Metrics,
}

impl<T: Transport> Loader<T> {
    /// Opens the dataset collectively ([`open_dataset`]) and builds the loader.
    pub fn open(
        transport: T,
        paths: &[PathBuf],
        dataset_options: DatasetOptions,
        options: LoaderOptions,
    ) -> Result<Loader<T>> {
        let dataset = open_dataset(&transport, paths, dataset_options)?;
        Loader::new(transport, dataset, options)
    }

    /// Builds a loader for a dataset every rank opened identically. Validation depends only
    /// on values all ranks share, so all ranks fail alike without communicating.
    pub fn new(transport: T, dataset: Dataset, options: LoaderOptions) -> Result<Loader<T>> {
        let (n, world, b) = (dataset.len(), transport.size(), options.batch_size);
        if n == 0 {
            return Err(Error::Config("the dataset has no samples".into()));
        }
        if world as u64 > n {
            return Err(Error::Config(format!("more ranks ({world}) than samples ({n})")));
        }
        if b == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        if b as u64 > n {
            return Err(Error::Config(format!("batch size {b} is larger than the dataset ({n} samples)")));
        }
        let placement = Placement::data_parallel(b, world, dataset.fields().len())?;
        let steps_per_epoch = n / b as u64;
        let per_step = max_bytes_per_step(&dataset, &placement);
        let steps_per_window = steps_per_window(options.window_bytes, per_step, steps_per_epoch);
        Ok(Loader {
            home: HomeRanges::new(n, world),
            transport,
            dataset,
            options,
            placement,
            steps_per_epoch,
            steps_per_window,
            readers: HashMap::new(),
            metrics: Metrics::default(),
        })
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// The options.
    pub fn options(&self) -> &LoaderOptions {
        &self.options
    }

    /// The placement of batch rows on ranks.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// This rank's home range of sample ids.
    pub fn home_range(&self) -> std::ops::Range<u64> {
        self.home.range(self.transport.rank())
    }

    /// Full global batches per epoch (the incomplete last batch is dropped).
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// Steps exchanged together in one window.
    pub fn steps_per_window(&self) -> u64 {
        self.steps_per_window
    }

    /// Metrics accumulated since the last call; resets them.
    pub fn take_metrics(&mut self) -> Metrics {
        std::mem::take(&mut self.metrics)
    }

    /// The batches of one epoch, in step order. Every rank must drive the iterator to the
    /// same point: each window is a collective.
    pub fn epoch(&mut self, epoch: Epoch) -> EpochIter<'_, T> {
        let perm = Permutation::new(self.dataset.len(), self.options.seed, epoch.0);
        EpochIter { loader: self, epoch, perm, next_step: 0, queue: VecDeque::new(), failed: false }
    }

    fn read(&mut self, ids: &[SampleId]) -> Result<ReadSet> {
        let mut chunks = Vec::new();
        let mut starts = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let (file, _) = self.dataset.locate(ids[i]);
            let end_id = self.dataset.file_start(file + 1);
            let j = i + ids[i..].partition_point(|id| id.0 < end_id);
            let rows: Vec<u64> = ids[i..j].iter().map(|id| id.0 - self.dataset.file_start(file)).collect();
            let reader = match self.readers.entry(file) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => e.insert(self.dataset.open_reader(file)?),
            };
            let chunk = reader.read_rows(&rows)?;
            if chunk.rows() != rows.len() {
                return Err(Error::file(
                    &self.dataset.files()[file].path,
                    format!("reader returned {} of {} rows", chunk.rows(), rows.len()),
                ));
            }
            self.metrics.bytes_read += chunk.bytes_read();
            starts.push(i);
            chunks.push(chunk);
            i = j;
        }
        Ok(ReadSet { ids: ids.to_vec(), starts, chunks })
    }

    fn run_window(&mut self, perm: &Permutation, epoch: Epoch, steps: std::ops::Range<u64>) -> Result<Vec<Batch>> {
        let me = self.transport.rank();
        let plan = {
            let (home, placement) = (&self.home, &self.placement);
            self.metrics.timed(Phase::Plan, || WindowPlan::new(perm, home, placement, me, steps.clone()))
        };

        let start = std::time::Instant::now();
        let read = self.read(&plan.reads);
        self.metrics.phase[Phase::Read as usize] += start.elapsed();
        let read = self.metrics.timed(Phase::Exchange, || agree(&self.transport, read))?;

        let (send, counts) = self.metrics.timed(Phase::Pack, || pack(&plan, &read, &self.placement, &self.dataset));
        self.metrics.bytes_sent += send.len() as u64;
        drop(read);
        let (recv, recv_counts) = {
            let t = &self.transport;
            self.metrics.timed(Phase::Exchange, || t.all_to_all_v(&send, &counts))?
        };
        drop(send);
        self.metrics.bytes_received += recv.len() as u64;

        let batches = {
            let (home, placement, dataset) = (&self.home, &self.placement, &self.dataset);
            self.metrics
                .timed(Phase::Assemble, || assemble(&plan, epoch, &recv, &recv_counts, home, placement, dataset, me))
        };
        let batches = self.metrics.timed(Phase::Exchange, || agree(&self.transport, batches))?;
        self.metrics.windows += 1;
        self.metrics.rows_delivered += batches.iter().map(|b| b.ids.len() as u64).sum::<u64>();
        Ok(batches)
    }
}

/// Upper bound over ranks of the bytes one rank receives per step.
fn max_bytes_per_step(dataset: &Dataset, placement: &Placement) -> u64 {
    let value_bytes = |f: usize| match &dataset.fields()[f].kind {
        FieldKind::Tensor { .. } => dataset.fields()[f].fixed_bytes().unwrap_or(0) as u64,
        FieldKind::Bytes { .. } => VAR_LEN_ESTIMATE,
    };
    placement
        .blocks()
        .iter()
        .flat_map(|b| b.receivers.iter().map(move |rc| (b.rows.len() as u64, rc)))
        .map(|(rows, rc)| rows * rc.parts.iter().map(|p| value_bytes(p.field)).sum::<u64>())
        .max()
        .unwrap_or(0)
}

/// Values read for one window: chunk `k` holds the values of `ids[starts[k]..]`.
struct ReadSet {
    ids: Vec<SampleId>,
    starts: Vec<usize>,
    chunks: Vec<RowChunk>,
}

impl ReadSet {
    fn value(&self, id: SampleId, field: usize) -> &[u8] {
        let i = self.ids.binary_search(&id).expect("planned reads cover every sent id");
        let k = self.starts.partition_point(|&s| s <= i) - 1;
        self.chunks[k].value(i - self.starts[k], field)
    }
}

/// Length prefix of a variable-length value in the send buffer.
const LEN_PREFIX: usize = 8;

/// Packs every destination's values into one send buffer: for each destination, rows in
/// window order, and for each row the parts that destination receives, in field order.
/// Variable-length values carry an 8-byte little-endian length prefix.
fn pack(plan: &WindowPlan, read: &ReadSet, placement: &Placement, dataset: &Dataset) -> (Vec<u8>, Vec<usize>) {
    let fields = dataset.fields();
    let var_len = |f: usize| matches!(fields[f].kind, FieldKind::Bytes { .. });
    // Pass 1: exact byte counts, so that values are copied once, straight into place.
    let counts: Vec<usize> = plan
        .sends
        .iter()
        .enumerate()
        .map(|(d, rows)| {
            let Some((_, rc)) = placement.receiver(Rank(d)) else {
                return 0;
            };
            rows.iter()
                .map(|&i| {
                    rc.parts
                        .iter()
                        .map(|p| read.value(plan.ids[i], p.field).len() + if var_len(p.field) { LEN_PREFIX } else { 0 })
                        .sum::<usize>()
                })
                .sum()
        })
        .collect();
    let mut send = Vec::with_capacity(counts.iter().sum());
    for (d, rows) in plan.sends.iter().enumerate() {
        let Some((_, rc)) = placement.receiver(Rank(d)) else {
            continue;
        };
        for &i in rows {
            for p in &rc.parts {
                let v = read.value(plan.ids[i], p.field);
                if var_len(p.field) {
                    send.extend_from_slice(&(v.len() as u64).to_le_bytes());
                }
                send.extend_from_slice(v);
            }
        }
    }
    debug_assert_eq!(send.len(), counts.iter().sum::<usize>());
    (send, counts)
}

/// Takes values off each source's segment of the receive buffer, in plan order.
struct Cursors<'a> {
    recv: &'a [u8],
    at: Vec<usize>,
    end: Vec<usize>,
}

impl<'a> Cursors<'a> {
    fn new(recv: &'a [u8], counts: &[usize]) -> Cursors<'a> {
        let mut at = Vec::with_capacity(counts.len());
        let mut end = Vec::with_capacity(counts.len());
        let mut o = 0;
        for &c in counts {
            at.push(o);
            o += c;
            end.push(o);
        }
        Cursors { recv, at, end }
    }

    fn take(&mut self, src: Rank, len: usize) -> Result<&'a [u8]> {
        let (at, end) = (self.at[src.0], self.end[src.0]);
        if at + len > end {
            return Err(Error::Transport(format!(
                "received segment from rank {src} is shorter than planned ({} bytes)",
                end - self.at[src.0].min(end)
            )));
        }
        self.at[src.0] += len;
        Ok(&self.recv[at..at + len])
    }

    fn take_var(&mut self, src: Rank) -> Result<&'a [u8]> {
        let len = u64::from_le_bytes(self.take(src, LEN_PREFIX)?.try_into().expect("8 bytes"));
        let len =
            usize::try_from(len).map_err(|_| Error::Transport(format!("bad value length {len} from rank {src}")))?;
        self.take(src, len)
    }

    fn check_consumed(&self) -> Result<()> {
        match (0..self.at.len()).find(|&s| self.at[s] != self.end[s]) {
            Some(s) => {
                Err(Error::Transport(format!("rank {s} sent {} bytes more than planned", self.end[s] - self.at[s])))
            }
            None => Ok(()),
        }
    }
}

/// Builds this rank's batches of the window from the received bytes.
#[allow(clippy::too_many_arguments)]
fn assemble(
    plan: &WindowPlan,
    epoch: Epoch,
    recv: &[u8],
    recv_counts: &[usize],
    home: &HomeRanges,
    placement: &Placement,
    dataset: &Dataset,
    me: Rank,
) -> Result<Vec<Batch>> {
    let fields = dataset.fields();
    let b = plan.batch_size;
    let steps = plan.steps.clone();
    let Some((block, rc)) = placement.receiver(me) else {
        // This rank receives nothing; it still steps in lockstep with empty batches.
        return Ok(steps.map(|s| Batch { epoch, step: Step(s), rows: 0..0, ids: vec![], fields: vec![] }).collect());
    };
    let rows = block.rows.len();
    let mut cursors = Cursors::new(recv, recv_counts);
    let mut out = Vec::with_capacity((steps.end - steps.start) as usize);
    for (s, step) in steps.enumerate() {
        let window_rows = &plan.recvs[s * rows..(s + 1) * rows];
        let ids: Vec<SampleId> = window_rows.iter().map(|&i| plan.ids[i]).collect();
        let mut tensors: Vec<Option<FieldData>> = rc
            .parts
            .iter()
            .map(|p| fields[p.field].fixed_bytes().map(|n| FieldData::tensor(fields[p.field].clone(), rows, n)))
            .collect();
        let mut var_values: Vec<Vec<&[u8]>> = vec![Vec::new(); rc.parts.len()];
        for (r, &id) in ids.iter().enumerate() {
            let src = home.owner(id);
            for (k, p) in rc.parts.iter().enumerate() {
                match &mut tensors[k] {
                    Some(t) => {
                        let n = fields[p.field].fixed_bytes().expect("tensor");
                        t.bytes_mut()[r * n..(r + 1) * n].copy_from_slice(cursors.take(src, n)?);
                    }
                    None => var_values[k].push(cursors.take_var(src)?),
                }
            }
        }
        let field_data = tensors
            .into_iter()
            .zip(&rc.parts)
            .zip(var_values)
            .map(|((t, p), vals)| t.unwrap_or_else(|| FieldData::var_len(fields[p.field].clone(), rows, &vals)))
            .collect();
        debug_assert!(window_rows.iter().all(|&i| i / b == s));
        out.push(Batch { epoch, step: Step(step), rows: block.rows.clone(), ids, fields: field_data });
    }
    cursors.check_consumed()?;
    Ok(out)
}

/// Iterator over the batches of one epoch.
pub struct EpochIter<'a, T: Transport> {
    loader: &'a mut Loader<T>,
    epoch: Epoch,
    perm: Permutation,
    next_step: u64,
    queue: VecDeque<Batch>,
    failed: bool,
}

impl<T: Transport> Iterator for EpochIter<'_, T> {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.failed {
            return None;
        }
        if self.queue.is_empty() {
            let total = self.loader.steps_per_epoch;
            if self.next_step >= total {
                return None;
            }
            let end = (self.next_step + self.loader.steps_per_window).min(total);
            match self.loader.run_window(&self.perm, self.epoch, self.next_step..end) {
                Ok(batches) => self.queue.extend(batches),
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
            self.next_step = end;
        }
        self.queue.pop_front().map(Ok)
    }
}
