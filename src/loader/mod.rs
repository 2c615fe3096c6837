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
mod exchange;
pub mod layout;
pub mod metrics;
pub mod state;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;

use crate::dataset::{self, Dataset, DatasetOptions, FileInfo, FileReader, RowChunk};
use crate::error::{Error, Result};
use crate::plan::{steps_per_window, FieldPart, HomeRanges, Mesh, Permutation, Placement, WindowPlan};
use crate::transport::{agree, ReduceOp, Transport};
use crate::types::{Epoch, Rank, SampleId, Step};
pub use batch::{Batch, Element, FieldData};
use exchange::{assemble, pack, Receipt, ValueSource};
pub use layout::{ExchangeMode, Layout};
pub use metrics::{Metrics, Phase};
pub use state::{Fingerprint, LoaderState};

/// How the loader batches, shuffles and places data.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderOptions {
    /// Global batch size `B`.
    pub batch_size: usize,
    /// Seed of the permutation.
    pub seed: u64,
    /// Budget for bytes in flight per rank in one exchange window.
    pub window_bytes: u64,
    /// Device mesh, sharding specs and pipeline stages (default: data parallel).
    pub layout: Layout,
    /// What happens to the last, incomplete batch of an epoch.
    pub tail: TailPolicy,
    /// Keep this rank's home range in memory when it fits in this many bytes (0: off), so
    /// that epochs after the first read nothing from disk.
    pub cache_bytes: u64,
}

/// What happens to the last batch of an epoch when `B` does not divide `N`. Every rank
/// derives the same steps from `N` and `B`, so no rank waits for a batch others skip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TailPolicy {
    /// Drop the incomplete batch: `⌊N/B⌋` steps.
    #[default]
    Drop,
    /// Complete it with the first samples of the epoch's order (positions `N, N+1, ...`
    /// wrap to `0, 1, ...`): `⌈N/B⌉` full steps; those samples appear twice in the epoch.
    Pad,
    /// Deliver a short last batch of `N mod B` rows, split over the batch blocks as evenly
    /// as the mesh allows (block sizes differ by at most one; some may be empty).
    Partial,
}

impl TailPolicy {
    /// Parses `drop`, `pad` or `partial`.
    pub fn parse(s: &str) -> Option<TailPolicy> {
        match s {
            "drop" => Some(TailPolicy::Drop),
            "pad" => Some(TailPolicy::Pad),
            "partial" => Some(TailPolicy::Partial),
            _ => None,
        }
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 32,
            seed: 0,
            window_bytes: 64 << 20,
            layout: Layout::default(),
            tail: TailPolicy::Drop,
            cache_bytes: 0,
        }
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
    agree(transport, Dataset::from_files(infos, options))
}

/// The two-phase exchange's state: the leaders' placement and this rank's group.
struct TwoPhase {
    leaders: Placement,
    /// This rank's row-block group (created at the first window; a collective).
    group: Option<Box<dyn Transport>>,
    /// World ranks of this rank's group members that receive something, in group order.
    members: Vec<Rank>,
}

/// A distributed loader over one dataset.
pub struct Loader<T: Transport> {
    transport: T,
    dataset: Dataset,
    options: LoaderOptions,
    home: HomeRanges,
    mesh: Mesh,
    coords: Vec<usize>,
    placement: Placement,
    /// The placement of a partial last batch (tail policy `partial`).
    tail_placement: Option<Placement>,
    mode: ExchangeMode,
    two_phase: Option<TwoPhase>,
    steps_per_epoch: u64,
    steps_per_window: u64,
    readers: HashMap<usize, Box<dyn FileReader>>,
    /// With the home-range cache: per file, this rank's home rows of it, once read.
    cache: Option<HashMap<usize, std::rc::Rc<RowChunk>>>,
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
        let mesh = options.layout.mesh(world)?;
        let placement = options.layout.placement(&mesh, dataset.fields(), b)?;
        let mode = layout::choose(options.layout.exchange, &placement, dataset.fields())?;
        let me = transport.rank();
        let two_phase = match mode {
            ExchangeMode::TwoPhase => {
                let members = placement
                    .receiver(me)
                    .map(|(block, _)| block.receivers.iter().filter(|r| !r.parts.is_empty()).map(|r| r.rank).collect())
                    .unwrap_or_default();
                Some(TwoPhase { leaders: layout::leader_placement(&placement)?, group: None, members })
            }
            _ => None,
        };
        let remainder = (n % b as u64) as usize;
        let steps_per_epoch = match options.tail {
            TailPolicy::Drop => n / b as u64,
            TailPolicy::Pad | TailPolicy::Partial => n.div_ceil(b as u64),
        };
        let tail_placement = match (options.tail, remainder) {
            (TailPolicy::Partial, r) if r > 0 => Some(Placement::from_mesh(
                r,
                &mesh,
                dataset.fields(),
                &options.layout.sharding(&mesh, dataset.fields(), b)?,
            )?),
            _ => None,
        };
        // The busiest rank's receive buffer per step; two-phase leaders hold whole rows.
        let per_step =
            layout::recv_bytes_per_step(two_phase.as_ref().map_or(&placement, |t| &t.leaders), dataset.fields())
                .into_iter()
                .chain(layout::recv_bytes_per_step(&placement, dataset.fields()))
                .max()
                .unwrap_or(0);
        let steps_per_window = steps_per_window(options.window_bytes, per_step, steps_per_epoch);
        Ok(Loader {
            home: HomeRanges::new(n, world),
            coords: mesh.coords(me),
            mesh,
            transport,
            dataset,
            options,
            placement,
            tail_placement,
            mode,
            two_phase,
            steps_per_epoch,
            steps_per_window,
            readers: HashMap::new(),
            cache: None,
            metrics: Metrics::default(),
        }
        .with_cache())
    }

    /// Turns the home-range cache on when the home range fits in `cache_bytes`
    /// (variable-length values counted at an estimate); otherwise it stays off and memory
    /// stays bounded by the window.
    fn with_cache(mut self) -> Self {
        let range = self.home_range();
        let per_sample: u64 =
            self.dataset.fields().iter().map(|f| f.fixed_bytes().map_or(layout::VAR_LEN_ESTIMATE, |b| b as u64)).sum();
        let need = (range.end - range.start).saturating_mul(per_sample);
        if self.options.cache_bytes > 0 && need <= self.options.cache_bytes {
            self.cache = Some(HashMap::new());
        }
        self
    }

    /// Whether this rank keeps its home range in memory.
    pub fn caches_home_range(&self) -> bool {
        self.cache.is_some()
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

    /// The device mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// This rank's mesh coordinate.
    pub fn coords(&self) -> &[usize] {
        &self.coords
    }

    /// The placement of batch rows and slices on ranks.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The placement of step `step` (the last step of a `partial` epoch has its own).
    pub fn placement_for_step(&self, step: Step) -> &Placement {
        match &self.tail_placement {
            Some(t) if step.0 + 1 == self.steps_per_epoch => t,
            _ => &self.placement,
        }
    }

    /// The placement of the partial last batch, if the tail policy makes one.
    pub fn tail_placement(&self) -> Option<&Placement> {
        self.tail_placement.as_ref()
    }

    /// Rows of the global batches of steps `steps`.
    pub fn rows_in_steps(&self, steps: std::ops::Range<u64>) -> u64 {
        steps.map(|k| self.placement_for_step(Step(k)).batch_size() as u64).sum()
    }

    /// Samples per epoch that no batch delivers (tail policy `drop`).
    pub fn dropped_per_epoch(&self) -> u64 {
        self.dataset.len().saturating_sub(self.rows_in_steps(0..self.steps_per_epoch))
    }

    /// The exchange in use (`Auto` resolved).
    pub fn exchange_mode(&self) -> ExchangeMode {
        self.mode
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
        self.epoch_from(epoch, Step(0))
    }

    /// The batches of one epoch from step `first` on: exactly the batches `epoch` would
    /// give from that step, on any number of ranks and any mesh.
    pub fn epoch_from(&mut self, epoch: Epoch, first: Step) -> EpochIter<'_, T> {
        let perm = Permutation::new(self.dataset.len(), self.options.seed, epoch.0);
        EpochIter { loader: self, epoch, perm, next_step: first.0, queue: VecDeque::new(), failed: false }
    }

    /// What defines this loader's stream.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.dataset, self.options.batch_size, self.options.seed, self.options.tail)
    }

    /// The state to resume from before step `step` of `epoch` (a step equal to
    /// [`Loader::steps_per_epoch`] means the start of the next epoch).
    pub fn state(&self, epoch: Epoch, step: Step) -> LoaderState {
        let (epoch, step) = if step.0 >= self.steps_per_epoch { (epoch.0 + 1, 0) } else { (epoch.0, step.0) };
        LoaderState { seed: self.options.seed, epoch, step, fingerprint: self.fingerprint() }
    }

    /// Checks that `state` belongs to this loader's stream (same dataset, seed and batch
    /// size; the ranks and mesh may differ) and returns where to resume.
    pub fn resume_point(&self, state: &LoaderState) -> Result<(Epoch, Step)> {
        if let Some(what) = state.fingerprint.differences(&self.fingerprint()) {
            return Err(Error::Config(format!("cannot resume: the stream changed since the state was saved: {what}")));
        }
        if state.step >= self.steps_per_epoch {
            return Err(Error::Config(format!(
                "cannot resume at step {}: an epoch has {} steps",
                state.step, self.steps_per_epoch
            )));
        }
        Ok((Epoch(state.epoch), Step(state.step)))
    }

    fn read(&mut self, ids: &[SampleId]) -> Result<ReadSet> {
        let mut chunks = Vec::new();
        let mut starts = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let (file, _) = self.dataset.locate(ids[i]);
            let end_id = self.dataset.file_start(file + 1);
            let j = i + ids[i..].partition_point(|id| id.0 < end_id);
            let file_start = self.dataset.file_start(file);
            if self.cache.is_some() {
                // Serve from (or fill) the cache of this file's home rows.
                let home = self.home_range();
                let first = home.start.max(file_start);
                if !self.cache.as_ref().is_some_and(|c| c.contains_key(&file)) {
                    let rows: Vec<u64> = (first..home.end.min(end_id)).map(|id| id - file_start).collect();
                    let chunk = self.read_file_rows(file, &rows)?;
                    self.cache.as_mut().expect("cache on").insert(file, std::rc::Rc::new(chunk));
                }
                let chunk = self.cache.as_ref().expect("cache on")[&file].clone();
                starts.push(i);
                chunks.push(ReadChunk { chunk, first_id: Some(first) });
                i = j;
                continue;
            }
            let rows: Vec<u64> = ids[i..j].iter().map(|id| id.0 - file_start).collect();
            let chunk = self.read_file_rows(file, &rows)?;
            starts.push(i);
            chunks.push(ReadChunk { chunk: std::rc::Rc::new(chunk), first_id: None });
            i = j;
        }
        Ok(ReadSet { ids: ids.to_vec(), starts, chunks })
    }

    /// Reads rows (sorted, local to the file) of file `file`.
    fn read_file_rows(&mut self, file: usize, rows: &[u64]) -> Result<RowChunk> {
        let reader = match self.readers.entry(file) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.dataset.open_reader(file)?),
        };
        let chunk = reader.read_rows(rows)?;
        if chunk.rows() != rows.len() {
            return Err(Error::file(
                &self.dataset.files()[file].path,
                format!("reader returned {} of {} rows", chunk.rows(), rows.len()),
            ));
        }
        self.metrics.bytes_read += chunk.bytes_read();
        Ok(chunk)
    }

    /// Plans, reads, packs and exchanges one window under `placement` over the world;
    /// returns the plan and the received bytes.
    fn shuffle(
        &mut self,
        perm: &Permutation,
        placement: &Placement,
        steps: std::ops::Range<u64>,
    ) -> Result<(WindowPlan, Vec<u8>, Vec<usize>)> {
        let me = self.transport.rank();
        let home = &self.home;
        let stride = self.options.batch_size;
        let plan = self.metrics.timed(Phase::Plan, || WindowPlan::new(perm, home, placement, me, steps, stride));

        let start = std::time::Instant::now();
        let read = self.read(&plan.reads);
        self.metrics.phase[Phase::Read as usize] += start.elapsed();
        let read = self.metrics.timed(Phase::Exchange, || agree(&self.transport, read))?;

        let parts: Vec<Option<&[FieldPart]>> =
            (0..placement.world()).map(|d| placement.receiver(Rank(d)).map(|(_, rc)| &rc.parts[..])).collect();
        let source = FromReads { ids: &plan.ids, read: &read };
        let (send, counts) =
            self.metrics.timed(Phase::Pack, || pack(&plan.sends, &parts, self.dataset.fields(), &source));
        drop(read);
        self.metrics.bytes_sent += send.len() as u64;
        let t = &self.transport;
        let (recv, recv_counts) = self.metrics.timed(Phase::Exchange, || t.all_to_all_v(send, &counts))?;
        self.metrics.bytes_received += recv.len() as u64;
        Ok((plan, recv, recv_counts))
    }

    fn run_window(&mut self, perm: &Permutation, epoch: Epoch, steps: std::ops::Range<u64>) -> Result<Vec<Batch>> {
        // A partial last batch is its own window, always exchanged fused.
        let batches = match (&self.tail_placement, self.mode) {
            (Some(tail), _) if steps.end == self.steps_per_epoch => {
                debug_assert_eq!(steps.end - steps.start, 1);
                self.run_fused(perm, epoch, steps, tail.clone())
            }
            (_, ExchangeMode::TwoPhase) => self.run_two_phase(perm, epoch, steps),
            _ => self.run_fused(perm, epoch, steps, self.placement.clone()),
        };
        let batches = self.metrics.timed(Phase::Exchange, || agree(&self.transport, batches))?;
        self.metrics.windows += 1;
        self.metrics.rows_delivered += batches.iter().map(|b| b.ids.len() as u64).sum::<u64>();
        Ok(batches)
    }

    /// One fused exchange: home ranks send every needed slice straight to its receivers.
    fn run_fused(
        &mut self,
        perm: &Permutation,
        epoch: Epoch,
        steps: std::ops::Range<u64>,
        placement: Placement,
    ) -> Result<Vec<Batch>> {
        let (plan, recv, recv_counts) = self.shuffle(perm, &placement, steps.clone())?;
        let me = self.transport.rank();
        let (rows, parts) = match placement.receiver(me) {
            Some((block, rc)) => (block.rows.clone(), &rc.parts[..]),
            None => (0..0, &[][..]),
        };
        let receipt =
            Receipt { epoch, steps, batch_size: plan.batch_size, ids: &plan.ids, rows, parts, coords: &self.coords };
        let home = &self.home;
        let fields = self.dataset.fields();
        self.metrics.timed(Phase::Assemble, || assemble(&receipt, fields, &recv, &recv_counts, |id| home.owner(id).0))
    }

    /// Two-phase: shuffle whole rows to each row block's leader, then the leader scatters
    /// every member's slices within the block's group.
    fn run_two_phase(&mut self, perm: &Permutation, epoch: Epoch, steps: std::ops::Range<u64>) -> Result<Vec<Batch>> {
        let me = self.transport.rank();
        let mut state = self.two_phase.take().expect("two-phase state");
        let result = (|| {
            let (plan, recv, recv_counts) = self.shuffle(perm, &state.leaders, steps.clone())?;
            // Phase one: the leader assembles whole rows.
            let (lrows, lparts) = match state.leaders.receiver(me) {
                Some((block, rc)) => (block.rows.clone(), &rc.parts[..]),
                None => (0..0, &[][..]),
            };
            let leader_receipt = Receipt {
                epoch,
                steps: steps.clone(),
                batch_size: plan.batch_size,
                ids: &plan.ids,
                rows: lrows.clone(),
                parts: lparts,
                coords: &self.coords,
            };
            let (home, fields) = (&self.home, self.dataset.fields());
            let full = self.metrics.timed(Phase::Assemble, || {
                assemble(&leader_receipt, fields, &recv, &recv_counts, |id| home.owner(id).0)
            });
            let full = self.metrics.timed(Phase::Exchange, || agree(&self.transport, full))?;

            // Phase two, inside the row block's group (color: block index; ranks that
            // receive nothing form one more group and exchange nothing).
            if state.group.is_none() {
                let color = match self.placement.receiver(me) {
                    Some((block, _)) => {
                        self.placement.blocks().iter().position(|b| b.rows == block.rows).expect("own block")
                    }
                    None => self.placement.blocks().len(),
                };
                state.group = Some(self.transport.split(color)?);
            }
            let group = state.group.as_ref().expect("group");
            let b = plan.batch_size;
            let nsteps = (steps.end - steps.start) as usize;
            let (rows, parts) = match self.placement.receiver(me) {
                Some((block, rc)) => (block.rows.clone(), &rc.parts[..]),
                None => (0..0, &[][..]),
            };
            // The leader is the group's first member (lowest rank that receives anything).
            let i_lead = !lparts.is_empty();
            let window_rows: Vec<usize> = (0..nsteps).flat_map(|s| rows.clone().map(move |r| s * b + r)).collect();
            let mut sends = vec![Vec::new(); group.size()];
            let mut member_parts: Vec<Option<&[FieldPart]>> = vec![None; group.size()];
            if i_lead {
                for (g, m) in state.members.iter().enumerate() {
                    sends[g] = window_rows.clone();
                    member_parts[g] = self.placement.receiver(*m).map(|(_, rc)| &rc.parts[..]);
                }
            }
            let source = FromLeader { batches: &full, batch_size: b, first_row: lrows.start, fields: lparts };
            let (send, counts) = self.metrics.timed(Phase::Pack, || pack(&sends, &member_parts, fields, &source));
            self.metrics.bytes_sent += send.len() as u64;
            let (recv, recv_counts) = self.metrics.timed(Phase::Exchange, || group.all_to_all_v(send, &counts))?;
            self.metrics.bytes_received += recv.len() as u64;
            let receipt = Receipt { epoch, steps, batch_size: b, ids: &plan.ids, rows, parts, coords: &self.coords };
            self.metrics.timed(Phase::Assemble, || assemble(&receipt, fields, &recv, &recv_counts, |_| 0))
        })();
        self.two_phase = Some(state);
        result
    }
}

impl<T: Transport> Loader<T> {
    /// The benchmarks' baseline, the common single-loader design: rank 0 reads every row
    /// of each window and broadcasts whole batches to every rank (an all-gather to which
    /// only rank 0 contributes); each rank then copies out its own rows and slices. Gives
    /// `consume` the same batches as [`Loader::epoch`], at `P`× the traffic.
    pub fn naive_epoch(&mut self, epoch: Epoch, mut consume: impl FnMut(Batch)) -> Result<()> {
        if self.tail_placement.is_some() {
            return Err(Error::Config("the naive baseline supports the drop and pad tail policies only".into()));
        }
        let n = self.dataset.len();
        let perm = Permutation::new(self.dataset.len(), self.options.seed, epoch.0);
        let (b, world, me) = (self.options.batch_size, self.transport.size(), self.transport.rank());
        let all_parts: Vec<FieldPart> = (0..self.dataset.fields().len()).map(FieldPart::whole).collect();
        let mut step = 0;
        while step < self.steps_per_epoch {
            let steps = step..(step + self.steps_per_window).min(self.steps_per_epoch);
            step = steps.end;
            let ids: Vec<SampleId> = self.metrics.timed(Phase::Plan, || {
                (steps.start * b as u64..steps.end * b as u64).map(|p| SampleId(perm.apply(p % n))).collect()
            });
            let mut buf = Vec::new();
            if me.0 == 0 {
                let mut sorted = ids.clone();
                sorted.sort_unstable();
                let start = std::time::Instant::now();
                let read = self.read(&sorted);
                self.metrics.phase[Phase::Read as usize] += start.elapsed();
                let read = agree(&self.transport, read)?;
                let source = FromReads { ids: &ids, read: &read };
                let rows: Vec<usize> = (0..ids.len()).collect();
                let fields = self.dataset.fields();
                buf = self.metrics.timed(Phase::Pack, || pack(&[rows], &[Some(&all_parts[..])], fields, &source)).0;
                self.metrics.bytes_sent += (buf.len() * (world - 1)) as u64;
            } else {
                agree(&self.transport, Ok(()))?;
            }
            let t = &self.transport;
            let mut all = self.metrics.timed(Phase::Exchange, || t.all_gather(&buf))?;
            let data = std::mem::take(&mut all[0]);
            if me.0 != 0 {
                self.metrics.bytes_received += data.len() as u64;
            }
            let receipt =
                Receipt { epoch, steps, batch_size: b, ids: &ids, rows: 0..b, parts: &all_parts, coords: &self.coords };
            let fields = self.dataset.fields();
            let (placement, coords) = (&self.placement, &self.coords);
            let batches = self.metrics.timed(Phase::Assemble, || -> Result<Vec<Batch>> {
                let full = assemble(&receipt, fields, &data, &[data.len()], |_| 0)?;
                Ok(full.iter().map(|f| cut(f, placement, me, fields, coords)).collect())
            });
            let batches = agree(&self.transport, batches)?;
            self.metrics.windows += 1;
            batches.into_iter().for_each(&mut consume);
        }
        Ok(())
    }
}

/// This rank's rows and slices of a whole batch.
fn cut(full: &Batch, placement: &Placement, me: Rank, fields: &[dataset::Field], coords: &[usize]) -> Batch {
    let Some((block, rc)) = placement.receiver(me) else {
        return Batch {
            coords: coords.to_vec(),
            epoch: full.epoch,
            step: full.step,
            rows: 0..0,
            ids: vec![],
            fields: vec![],
        };
    };
    let n = block.rows.len();
    let field_data = rc
        .parts
        .iter()
        .map(|p| {
            let f = &fields[p.field];
            let whole = &full.fields[p.field];
            match p.bytes(f) {
                Some(len) => {
                    let mut out = FieldData::tensor(f.clone(), p.clone(), n);
                    let mut tmp = Vec::with_capacity(len);
                    for (i, row) in block.rows.clone().enumerate() {
                        tmp.clear();
                        p.copy(f, whole.row(row), &mut tmp);
                        out.bytes_mut()[i * len..(i + 1) * len].copy_from_slice(&tmp);
                    }
                    out
                }
                None => {
                    let values: Vec<&[u8]> = block.rows.clone().map(|r| whole.row(r)).collect();
                    FieldData::var_len(f.clone(), p.clone(), n, &values)
                }
            }
        })
        .collect();
    Batch {
        coords: coords.to_vec(),
        epoch: full.epoch,
        step: full.step,
        rows: block.rows.clone(),
        ids: full.ids[block.rows.clone()].to_vec(),
        fields: field_data,
    }
}

/// Values for packing straight from the rows this rank read.
struct FromReads<'a> {
    ids: &'a [SampleId],
    read: &'a ReadSet,
}

impl ValueSource for FromReads<'_> {
    fn value(&self, row: usize, field: usize) -> &[u8] {
        self.read.value(self.ids[row], field)
    }
}

/// Values for the two-phase scatter: the leader's whole-row batches of the window.
struct FromLeader<'a> {
    batches: &'a [Batch],
    batch_size: usize,
    first_row: usize,
    /// The fields the leader holds, in its batches' field order.
    fields: &'a [FieldPart],
}

impl ValueSource for FromLeader<'_> {
    fn value(&self, row: usize, field: usize) -> &[u8] {
        let batch = &self.batches[row / self.batch_size];
        let k = self.fields.iter().position(|p| p.field == field).expect("leader holds every field its group needs");
        batch.fields[k].row(row % self.batch_size - self.first_row)
    }
}

/// Values read for one window: chunk `k` holds the values of `ids[starts[k]..]`.
struct ReadSet {
    ids: Vec<SampleId>,
    starts: Vec<usize>,
    chunks: Vec<ReadChunk>,
}

/// Rows read for a window: exactly the ids asked for, or (from the home-range cache) all
/// home rows of a file starting at global id `first_id`.
struct ReadChunk {
    chunk: std::rc::Rc<RowChunk>,
    first_id: Option<u64>,
}

impl ReadSet {
    fn value(&self, id: SampleId, field: usize) -> &[u8] {
        let i = self.ids.binary_search(&id).expect("planned reads cover every sent id");
        let k = self.starts.partition_point(|&s| s <= i) - 1;
        let c = &self.chunks[k];
        match c.first_id {
            Some(first) => c.chunk.value((id.0 - first) as usize, field),
            None => c.chunk.value(i - self.starts[k], field),
        }
    }
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

impl<T: Transport> EpochIter<'_, T> {
    /// The step the next batch will have.
    pub fn next_step(&self) -> Step {
        Step(self.next_step - self.queue.len() as u64)
    }

    /// Collective: whether any rank asks to stop (e.g. it received SIGTERM). Every rank
    /// must call this at the same step; all then stop there together.
    pub fn any_rank_stops(&mut self, stop: bool) -> Result<bool> {
        let mut flag = [u64::from(stop)];
        self.loader.transport.all_reduce_u64(&mut flag, ReduceOp::Max)?;
        Ok(flag[0] != 0)
    }
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
            let mut end = (self.next_step + self.loader.steps_per_window).min(total);
            if self.loader.tail_placement.is_some() && end == total && self.next_step + 1 < total {
                end = total - 1; // the partial last batch gets a window of its own
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{gen, DType, Field, Format};
    use crate::transport::LocalTransport;

    fn loader(dir: &std::path::Path, batch_size: usize) -> Loader<LocalTransport> {
        let dataset = Dataset::open_local(&[dir.into()], Default::default()).unwrap();
        let options = LoaderOptions { batch_size, seed: 7, window_bytes: 64, ..Default::default() };
        Loader::new(LocalTransport::new(), dataset, options).unwrap()
    }

    #[test]
    fn saved_state_resumes_the_same_batches() {
        let dir = tempfile::tempdir().unwrap();
        let spec = gen::GenSpec {
            format: Format::Raw,
            samples: 50,
            files: 2,
            out: dir.path().into(),
            arrow_batch_rows: 4,
            fields: vec![Field::tensor("x", DType::U16, vec![2])],
        };
        for i in 0..2 {
            gen::write_file(&spec, i).unwrap();
        }
        gen::write_side_files(&spec).unwrap();
        let mut a = loader(dir.path(), 4);
        let all: Vec<Vec<SampleId>> = a.epoch(Epoch(1)).map(|b| b.unwrap().ids.clone()).collect();
        assert_eq!(all.len(), 12);
        let state = LoaderState::from_json(&a.state(Epoch(1), Step(5)).to_json()).unwrap();
        let mut b = loader(dir.path(), 4);
        let (e, k) = b.resume_point(&state).unwrap();
        let rest: Vec<Vec<SampleId>> = b.epoch_from(e, k).map(|b| b.unwrap().ids.clone()).collect();
        assert_eq!(rest, all[5..].to_vec());
        // The end of an epoch is the start of the next.
        assert_eq!((a.state(Epoch(1), Step(12)).epoch, a.state(Epoch(1), Step(12)).step), (2, 0));
        // Another batch size is another stream.
        let c = loader(dir.path(), 5);
        let err = c.resume_point(&state).unwrap_err().to_string();
        assert!(err.contains("batch size 4 → 5"), "{err}");
    }
}
