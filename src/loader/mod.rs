//! The loader: turns a dataset into this rank's stream of batches.
//!
//! A [`Loader`] owns everything it needs — its own duplicate of the communicator it was
//! given, the dataset, open readers — and its position is a plain value
//! ([`Position`]: the epoch and step of the next batch). It yields batches by itself
//! ([`Loader::next_batch`], or as an iterator over the current epoch), can save and
//! restore its position at any step ([`Loader::state`], [`Loader::seek`]) and is `Send`:
//! it can be moved to another thread or held by a Python object.
//!
//! Behind it, a producer runs the windows of the stream — plan, read, pack, exchange,
//! assemble ([`engine`]) — by default on a background thread up to `prefetch` windows
//! ahead, overlapping each window's exchange with reading and packing the next
//! ([`producer`], [`pipeline`]). Memory stays within `(prefetch + 1) × window_bytes`
//! ([`crate::plan::budget`]) plus the rows kept in memory, within the memory budget.
//!
//! How a rank reads its home range from storage is planned when the loader is built
//! ([`read`], [`crate::plan::io`]): streamed once into memory and kept (*resident*),
//! streamed in several passes per epoch, or kept in part and read at random where the
//! windows need it, the rest optionally spilled to node-local storage.
//!
//! Every rank must consume the same sequence of batches: the windows are collectives, and
//! seeking, setting the epoch and dropping the loader must happen at the same point on
//! every rank.
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
//! let mut loader = Loader::new(&LocalTransport::new(), dataset, options)?;
//! assert_eq!(loader.steps_per_epoch(), 2); // 10 samples, batches of 4, tail dropped
//! for batch in loader.epoch(Epoch(0)) {
//!     let batch = batch?;
//!     let x = batch.field("x").unwrap().array::<f32>()?;
//!     assert_eq!(x.shape(), &[4, 3]);
//!     // generated contents are a function of the id: x[i][0] == id
//!     assert_eq!(x[[0, 0]], batch.ids()[0].0 as f32);
//! }
//! // The epoch ended; the loader now stands at the start of the next one.
//! assert_eq!((loader.state().epoch, loader.state().step), (1, 0));
//! # Ok(()) }
//! ```

mod balance;
pub mod batch;
mod broadcast;
mod engine;
mod exchange;
pub mod layout;
pub mod metrics;
mod open;
mod pipeline;
mod producer;
mod read;
pub mod state;
mod stream;
mod tracker;
mod tuning;
mod two_phase;
mod window;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use crate::config::{ExchangeMode, Layout, LoaderOptions, LocalReads, TailPolicy};
use crate::dataset::{Dataset, DatasetOptions};
use crate::error::{Error, Result};
use crate::plan::{IoPlan, Mesh, Placement, WindowBudget};
pub use crate::runtime::abandoned;
pub use crate::runtime::memory::{all_headrooms, auto_budget, MARGIN_FRACTION, MIN_MARGIN};
use crate::transport::{agree, agree_settings, Transport};
use crate::types::{Epoch, Step};
pub use batch::{Batch, Element, FieldData};
use engine::Engine;
pub use engine::STOP_REQUESTED;
pub use metrics::{Metrics, MetricsSummary, Phase};
pub use open::open_dataset;
use pipeline::Pipeline;
pub use state::{check_epoch, epoch_out_of_range, Fingerprint, LoaderState, MAX_EPOCH};
use stream::Stream;
pub use stream::{Position, WindowSpec};
pub use tracker::fraction as wait_fraction;
use tracker::Tracker;

/// A distributed loader over one dataset: this rank's batches of every global batch.
pub struct Loader {
    stream: Arc<Stream>,
    pipeline: Pipeline,
    /// The next batch to deliver.
    position: Position,
    /// The last batch of an epoch was delivered: the next call ends the epoch.
    epoch_ended: bool,
    /// The rest of the window being delivered.
    window: VecDeque<Batch>,
    /// Metrics of the windows delivered since the last `take_metrics`.
    metrics: Metrics,
    /// Whether they keep each window's send counts ([`Loader::keep_window_sends`]).
    keep_window_sends: bool,
    /// The consumer's view of each window and epoch: telemetry, heartbeat.
    tracker: Tracker,
    /// Why the loader stopped working, once it has.
    failed: Option<String>,
    /// An error for the iterator to yield first ([`Loader::epoch`] with a bad epoch).
    deferred: Option<Error>,
    /// Asked while the loader waits ([`Loader::interrupt_with`]).
    interrupt: Option<Box<dyn FnMut() -> bool + Send>>,
    /// The process the loader was made in (a forked child must not use it).
    pid: u32,
    /// A rank that expects this one at the next window's position agreement (this rank's
    /// last stop was not everyone's): the next window meets it, or closing says where
    /// this rank went instead ([`pipeline`]).
    expected_by: Option<usize>,
    /// This rank's stop requests (a signal number, or [`STOP_REQUESTED`]; 0: none), which
    /// the producer carries into every window's agreement.
    stop: Arc<AtomicUsize>,
    /// The stop agreed with the window the last batch came from.
    stop_agreed: Option<i32>,
    /// The handlers [`Loader::stop_requested`] installed (removed when the loader is dropped).
    stop_handlers: Option<crate::runtime::StopHandlers>,
    /// Windows the producer runs ahead: as given, or as tuned.
    prefetch: usize,
}

/// The signals [`Loader::stop_requested`] catches: SIGTERM (what Slurm, Kubernetes and most
/// schedulers send before they preempt a job) and SIGUSR1 (what `sbatch --signal` sends).
pub const STOP_SIGNALS: [i32; 2] = [libc::SIGTERM, libc::SIGUSR1];

// A loader can be moved to another thread, or held by a Python object.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Loader>();
};

impl Loader {
    /// Opens the dataset collectively ([`open_dataset`]) and builds the loader.
    pub fn open(
        comm: &dyn Transport,
        paths: &[PathBuf],
        dataset_options: DatasetOptions,
        options: LoaderOptions,
    ) -> Result<Loader> {
        let dataset = open_dataset(comm, paths, dataset_options)?;
        Loader::new(comm, dataset, options)
    }

    /// Builds a loader for a dataset every rank opened identically. Collective over
    /// `comm`: the ranks check that they were all given the same options (a difference
    /// fails every rank, naming the option and the ranks), the options are validated
    /// against the dataset and the world and the outcome agreed, then the loader takes a
    /// duplicate of `comm` for its own collectives, which therefore never interleave with
    /// the caller's on `comm`.
    pub fn new(comm: &dyn Transport, dataset: Dataset, options: LoaderOptions) -> Result<Loader> {
        // Ranks given different options would wait in collectives the others never join,
        // or exchange what the others did not plan: name the difference instead.
        agree_settings(comm, &options.settings())?;
        let hosts = crate::transport::hosts::host_groups(comm)?;
        // How each rank will read its home range: memory budgets, the storage's speed
        // where the choice depends on it, the strategy (collective).
        let io = read::plan(comm, &dataset, &options, &hosts)?;
        let built = Stream::build(comm.rank(), comm.size(), hosts, Arc::new(dataset), options, io).and_then(|s| {
            if s.options.prefetch > 0 && !comm.concurrent() {
                return Err(Error::Config(
                    "the loader's background producer needs MPI initialised with MPI_THREAD_MULTIPLE (mpi4py \
                     and meshfeed's runtime ask for it); with a lower thread level set prefetch = 0"
                        .into(),
                ));
            }
            Ok(s)
        });
        let stream = agree(comm, built)?;
        // The home stores start streaming now, while the program gets ready.
        let (reads, shared) = read::start_stores(comm, &stream)?;
        let stream = Arc::new(stream.share_stores(shared));
        let stop = Arc::new(AtomicUsize::new(0));
        let clock = Arc::new(tuning::ConsumerClock::default());
        let engine = Engine::new(stream.clone(), comm.dup()?, reads, stop.clone(), clock.clone());
        let prefetch = stream.options.prefetch;
        Ok(Loader {
            stream,
            pipeline: Pipeline::Idle(engine),
            position: Position::default(),
            epoch_ended: false,
            window: VecDeque::new(),
            metrics: Metrics::default(),
            keep_window_sends: false,
            tracker: Tracker::new(comm.rank().0, comm.size(), clock),
            failed: None,
            deferred: None,
            interrupt: None,
            pid: std::process::id(),
            expected_by: None,
            stop,
            stop_agreed: None,
            stop_handlers: None,
            prefetch,
        })
    }

    /// Whether the job was asked to stop, as every rank agreed it: after the same step,
    /// every rank gets the same answer. `Some(signal)` once any rank received SIGTERM or
    /// SIGUSR1 ([`STOP_SIGNALS`]) or called [`Loader::request_stop`] ([`STOP_REQUESTED`]).
    /// A training loop asks after each step and, when told to, saves its model and
    /// [`Loader::state`] and exits (75, [`crate::runtime::EXIT_STOPPED`], where its
    /// scheduler requeues on it).
    ///
    /// The first call installs the signal handlers (so a program that never asks keeps
    /// the signals' usual effect); they record the signal, chain to any handler the
    /// program installed before, and are removed when the loader is dropped. The request
    /// travels to the other ranks in the agreement every window already makes (no
    /// collective of its own), so the answer turns true at the first step of a window
    /// assembled after the signal: up to `prefetch + 1` windows later.
    pub fn stop_requested(&mut self) -> Result<Option<i32>> {
        if self.stop_handlers.is_none() {
            self.stop_handlers = Some(crate::runtime::StopHandlers::install(&STOP_SIGNALS, self.stop.clone())?);
        }
        Ok(self.stop_agreed)
    }

    /// Asks every rank to stop, as a stop signal would ([`Loader::stop_requested`] then
    /// reports [`STOP_REQUESTED`] on every rank, after the same step). For programs that
    /// handle signals themselves: call it from the handler.
    pub fn request_stop(&self) {
        let _ = self.stop.compare_exchange(0, STOP_REQUESTED as usize, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The next batch of the current epoch, or `None` once the epoch has ended; the loader
    /// then stands at the start of the next epoch, whose batches the following calls
    /// deliver. After an error the loader cannot continue: every later call fails.
    pub fn next_batch(&mut self) -> Result<Option<Batch>> {
        self.check_process()?;
        if let Some(why) = &self.failed {
            return Err(Error::Misuse(format!("the loader failed earlier and cannot continue: {why}")));
        }
        let called = Instant::now();
        self.tracker.called(called, self.position);
        if self.epoch_ended {
            self.epoch_ended = false;
            let stream = &self.stream;
            self.tracker.end_epoch(called, |a, b| stream.rows_in_steps(a..b));
            return Ok(None);
        }
        let mut waited = std::time::Duration::ZERO;
        if self.window.is_empty() {
            let start = Instant::now();
            // The window's position agreement meets whoever expects this rank.
            self.expected_by = None;
            let window = self.pipeline.next_window(self.position, self.prefetch, self.interrupt.as_deref_mut());
            waited = start.elapsed();
            self.metrics.wait += waited;
            let window = window.and_then(|w| {
                let at = Position { epoch: w.spec.epoch, step: Step(w.spec.steps.start) };
                if at != self.position || w.batches.is_empty() {
                    return Err(Error::Internal(format!(
                        "the producer delivered window {:?} of epoch {} at {:?}",
                        w.spec.steps, w.spec.epoch, self.position
                    )));
                }
                Ok(w)
            });
            match window {
                Ok(mut w) => {
                    if !self.keep_window_sends {
                        w.metrics.window_sends = Vec::new();
                    }
                    let steps = w.spec.steps.clone();
                    self.tracker.took_window(w.spec.epoch.0, steps.start, steps.end - steps.start, &w.metrics, waited);
                    self.metrics.add(&w.metrics);
                    self.stop_agreed = w.stop;
                    self.window.extend(w.batches);
                    // Every rank's tuner asked for a producer thread at this window: windows
                    // made on this thread stop here, and one runs ahead from the next.
                    if let Some(tuned) = w.tuned.filter(|t| t.prefetch != self.prefetch) {
                        self.prefetch = tuned.prefetch;
                        self.pipeline.stop(None, false)?;
                    }
                }
                Err(e) => {
                    // An error is agreed: the producer (if any) has ended. Interrupted, it
                    // was left where it was. Read on where others repositioned: they
                    // expect this rank at their next window, and learn it read on.
                    let e = match self.pipeline.stop(None, false) {
                        Ok(Some(rank)) => self
                            .pipeline
                            .agree_gone(&format!("read on past where rank {rank} repositioned"))
                            .err()
                            .unwrap_or(e),
                        _ => e,
                    };
                    self.failed = Some(e.to_string());
                    return Err(e);
                }
            }
        }
        let batch = self.window.pop_front().expect("a window holds at least one batch");
        self.position = self.stream.advance(self.position);
        self.epoch_ended = self.position.step == Step(0);
        let done = if self.epoch_ended { self.stream.steps_per_epoch } else { self.position.step.0 };
        self.tracker.handed(Instant::now(), waited, done, self.stream.steps_per_epoch);
        Ok(Some(batch))
    }

    /// Positions the loader at the start of `epoch` (like `DistributedSampler.set_epoch`).
    /// Where the loader already stands there, nothing changes (a producer running ahead
    /// keeps its work); otherwise the producer is stopped collectively and restarts there
    /// at the next batch. Every rank must call it at the same point: where a rank
    /// repositions alone, every rank fails at its next window, naming each rank's position
    /// (or that it read on), instead of waiting. An epoch beyond [`MAX_EPOCH`] is refused.
    pub fn set_epoch(&mut self, epoch: Epoch) -> Result<()> {
        check_epoch(epoch.0)?;
        self.reposition(Position { epoch, step: Step(0) })
    }

    /// [`Loader::set_epoch`], then the loader as an iterator over that epoch's batches (an
    /// error setting the epoch is the iterator's first item).
    pub fn epoch(&mut self, epoch: Epoch) -> &mut Loader {
        if let Err(e) = self.set_epoch(epoch) {
            self.deferred = Some(e);
        }
        self
    }

    /// Continues the stream where `state` says (saved by [`Loader::state`], possibly by a
    /// job with another number of ranks or mesh). Refuses a state of another stream
    /// (dataset, seed, batch size or tail policy changed), naming what changed, and a
    /// step beyond the epoch. Every rank must call it at the same point.
    pub fn seek(&mut self, state: &LoaderState) -> Result<()> {
        let at = self.resume_point(state)?;
        self.reposition(at)
    }

    fn reposition(&mut self, at: Position) -> Result<()> {
        self.check_process()?;
        if at == self.position && self.failed.is_none() {
            self.epoch_ended = false;
            return Ok(());
        }
        let stream = &self.stream;
        self.tracker.interrupted(Instant::now(), |a, b| stream.rows_in_steps(a..b));
        let stopped = self.pipeline.stop(self.interrupt.as_deref_mut(), false);
        self.window.clear();
        self.position = at;
        self.epoch_ended = false;
        match stopped {
            Ok(expected_by) => {
                self.expected_by = self.expected_by.or(expected_by);
                Ok(())
            }
            Err(e) => {
                self.failed = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Makes the loader's waits interruptible: while it waits for a window or for the
    /// other ranks (at `next_batch`, `set_epoch`, `seek`, drop), `check` is called about
    /// every 100 ms, and when it returns `true` the wait is given up with a
    /// [`Error::Misuse`] error. The loader cannot continue after that: its producer is left
    /// where it was (perhaps in a collective the other ranks never join), the runtime does
    /// not finalise MPI at exit ([`crate::runtime::abandoned`]), and the process should end. The Python
    /// package checks for signals here, so that Ctrl-C and SIGTERM reach a training loop
    /// that waits for a slow or absent peer.
    pub fn interrupt_with(&mut self, check: impl FnMut() -> bool + Send + 'static) {
        self.interrupt = Some(Box::new(check));
    }

    /// A loader cannot cross a `fork`: the child has none of the parent's threads, and
    /// its communicators are the parent's. Refused by process id.
    fn check_process(&self) -> Result<()> {
        let now = std::process::id();
        if now != self.pid {
            return Err(fork_error(self.pid, now));
        }
        Ok(())
    }

    /// Where the loader stands: the next batch it delivers.
    pub fn position(&self) -> Position {
        self.position
    }

    /// The state to save: the next batch to deliver, and what defines the stream. After
    /// the last batch of an epoch it is the start of the next epoch.
    pub fn state(&self) -> LoaderState {
        self.state_at(self.position)
    }

    /// The state of position `at` of this loader's stream (a step equal to
    /// [`Loader::steps_per_epoch`] means the start of the next epoch).
    pub fn state_at(&self, at: Position) -> LoaderState {
        let (epoch, step) = if at.step.0 >= self.stream.steps_per_epoch {
            (at.epoch.0.saturating_add(1), 0)
        } else {
            (at.epoch.0, at.step.0)
        };
        LoaderState { seed: self.stream.options.seed, epoch, step, fingerprint: self.fingerprint() }
    }

    /// Checks that `state` belongs to this loader's stream (same dataset, seed, batch size
    /// and tail policy; the ranks and mesh may differ) and returns where it resumes.
    pub fn resume_point(&self, state: &LoaderState) -> Result<Position> {
        if state.seed != state.fingerprint.seed {
            return Err(Error::Config(format!(
                "cannot resume: the state contradicts itself: seed {}, but its fingerprint says seed {} (an edited \
                 state?)",
                state.seed, state.fingerprint.seed
            )));
        }
        if let Some(what) = state.fingerprint.differences(&self.fingerprint()) {
            return Err(Error::Config(format!("cannot resume: the stream changed since the state was saved: {what}")));
        }
        check_epoch(state.epoch)?;
        if state.step >= self.stream.steps_per_epoch {
            return Err(Error::Config(format!(
                "cannot resume at epoch {} step {}: an epoch has {} steps",
                state.epoch, state.step, self.stream.steps_per_epoch
            )));
        }
        Ok(Position::new(state.epoch, state.step))
    }

    /// What defines this loader's stream.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.stream.dataset, &self.stream.options)
    }

    /// Whether [`Metrics::window_sends`] records each window's send counts (off by
    /// default: a list that grows by one entry per window until `take_metrics`).
    pub fn keep_window_sends(&mut self, keep: bool) {
        self.keep_window_sends = keep;
    }

    /// The record of a run of `job` by this loader on `ranks` ranks, as its telemetry
    /// writes it (`run.json`).
    pub fn run_info(&self, job: &crate::config::Job, ranks: usize) -> crate::telemetry::RunInfo {
        use crate::plan::budget;
        let d = self.dataset();
        crate::telemetry::RunInfo {
            schema: crate::telemetry::SCHEMA,
            version: env!("CARGO_PKG_VERSION").into(),
            ranks,
            data: job.data.clone(),
            samples: d.len(),
            batch_size: job.loader.batch_size as u64,
            epochs: job.epochs,
            seed: job.loader.seed,
            shared_order: job.loader.shared_order.map(|o| o.to_string()),
            mesh: self.mesh().to_string(),
            exchange: self.exchange_mode().to_string(),
            transport: job.transport.to_string(),
            window_bytes: job.loader.window_bytes,
            prefetch: job.loader.prefetch,
            steps_per_window: self.steps_per_window(),
            sample_bytes: Some(budget::sample_bytes(&budget::value_sizes(d.fields(), &d.mean_value_bytes()))),
            read_plan: Some(self.read_plan().clone()),
            shares_stores: Some(self.shares_stores()),
        }
    }

    /// Writes this rank's telemetry ([`crate::telemetry`]) from now on to `job.telemetry`,
    /// where the job asks for it: a record of each window and epoch the consumer takes,
    /// with its waiting and its steps' times, in `DIR/rank-<r>.jsonl`, and rank 0's
    /// `DIR/run.json` (the job's configuration and read plan), for `meshfeed report`.
    /// Collective over `comm` (the communicator the loader was made with): a directory a
    /// rank cannot write fails every rank, naming it. Where writing fails later (a full
    /// disk) the job goes on: the rank says so once on stderr, stops writing, and
    /// [`Loader::take_telemetry_error`] tells.
    pub fn record_telemetry(&mut self, comm: &dyn Transport, job: &crate::config::Job) -> Result<()> {
        let Some(dir) = &job.telemetry else { return Ok(()) };
        let rank = comm.rank().0;
        let run = (rank == 0).then(|| self.run_info(job, comm.size()));
        let writer = agree(comm, crate::telemetry::Writer::create(dir, rank, run.as_ref()))?;
        self.tracker.write_to(writer);
        Ok(())
    }

    /// On rank 0, passes `sink` a JSON line every `every` of consuming (checked as each
    /// batch is handed over): the epoch, its steps done and steps, seconds since this
    /// call, samples per second, and the part of the consumer's time this epoch spent
    /// waiting for data. Other ranks ignore it.
    pub fn heartbeat(&mut self, every: std::time::Duration, sink: impl FnMut(&str) + Send + 'static) {
        self.tracker.beat_every(every, self.stream.options.batch_size as u64, Box::new(sink));
    }

    /// The figures of the last window the consumer finished and of the epoch under way (or
    /// the last one, between epochs), as the telemetry records them; their
    /// `wait_fraction` is the part of the consumer's time spent waiting for data.
    pub fn live_metrics(&self) -> (Option<crate::telemetry::Window>, Option<crate::telemetry::Epoch>) {
        let stream = &self.stream;
        self.tracker.live(|a, b| stream.rows_in_steps(a..b))
    }

    /// Marks the record of the epoch that just ended (not yet written: it is written with
    /// the next record, or when the loader is repositioned or dropped) as verified or not.
    pub fn set_epoch_verified(&mut self, ok: bool) {
        self.tracker.set_verified(ok);
    }

    /// Writes the telemetry finished so far (an epoch that ended included) to its file.
    pub fn flush_telemetry(&mut self) {
        self.tracker.flush();
    }

    /// Why this rank stopped writing telemetry, if it did (once).
    pub fn take_telemetry_error(&mut self) -> Option<Error> {
        self.tracker.take_write_error()
    }

    /// Metrics of the windows delivered since the last call (and the time spent waiting
    /// for them); resets them.
    pub fn take_metrics(&mut self) -> Metrics {
        std::mem::take(&mut self.metrics)
    }

    /// Global batches (steps) per epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        self.stream.steps_per_epoch
    }

    /// Steps exchanged together in one window.
    pub fn steps_per_window(&self) -> u64 {
        self.stream.steps_per_window
    }

    /// The window budget (and the memory bound it gives).
    pub fn budget(&self) -> WindowBudget {
        self.stream.budget
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.stream.dataset
    }

    /// The options.
    pub fn options(&self) -> &LoaderOptions {
        &self.stream.options
    }

    /// This rank, in the loader's world.
    pub fn rank(&self) -> crate::types::Rank {
        self.stream.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.stream.world
    }

    /// The device mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.stream.mesh
    }

    /// This rank's mesh coordinate (of its first device, with several devices per process).
    pub fn coords(&self) -> &[usize] {
        &self.stream.coords
    }

    /// Each field's sharding over the mesh's axes, in field order (defaults resolved).
    pub fn sharding(&self) -> &[crate::plan::sharding::FieldSharding] {
        &self.stream.sharding
    }

    /// This rank's index among the ranks on its host, and their number (hosts as
    /// `MESHFEED_HOST` or the host name tells).
    pub fn local_rank(&self) -> (usize, usize) {
        let hosts = &self.stream.hosts;
        let mine = hosts[self.stream.rank.0];
        let before = hosts[..self.stream.rank.0].iter().filter(|&&h| h == mine).count();
        (before, hosts.iter().filter(|&&h| h == mine).count())
    }

    /// The placement of batch rows and slices on ranks.
    pub fn placement(&self) -> &Placement {
        &self.stream.placement
    }

    /// The placement of step `step` (the last step of a `partial` epoch has its own).
    pub fn placement_for_step(&self, step: Step) -> &Placement {
        self.stream.placement_for_step(step)
    }

    /// The placement of the partial last batch, if the tail policy makes one.
    pub fn tail_placement(&self) -> Option<&Placement> {
        self.stream.tail_placement.as_ref()
    }

    /// Rows of the global batches of steps `steps`.
    pub fn rows_in_steps(&self, steps: std::ops::Range<u64>) -> u64 {
        self.stream.rows_in_steps(steps)
    }

    /// Samples per epoch that no batch delivers (tail policy `drop`).
    pub fn dropped_per_epoch(&self) -> u64 {
        self.dataset().len().saturating_sub(self.rows_in_steps(0..self.steps_per_epoch()))
    }

    /// The exchange in use (`Auto` resolved).
    pub fn exchange_mode(&self) -> ExchangeMode {
        self.stream.mode
    }

    /// This rank's home range of sample ids, as the loader started (a balanced stream's
    /// ranges move between epochs: each window's telemetry names its length).
    pub fn home_range(&self) -> std::ops::Range<u64> {
        self.stream.home.range(self.stream.rank)
    }

    /// Every rank's home range, as the loader started (any split of the ids into ranges
    /// serves [`crate::verify`]'s exactly-once check).
    pub fn home_ranges(&self) -> &crate::plan::HomeRanges {
        &self.stream.home
    }

    /// How the ranks read their home ranges: the strategy, what each rank keeps in
    /// memory, whether the rest is spilled, and why.
    pub fn read_plan(&self) -> &IoPlan {
        &self.stream.io
    }

    /// Whether same-host ranks copy each other's kept rows (else they are exchanged).
    pub fn shares_stores(&self) -> bool {
        self.stream.shared_stores
    }
}

/// The loader is an iterator over the batches of its current epoch; it ends with the
/// epoch (and the next `next` starts the following epoch), or after yielding an error.
impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if let Some(e) = self.deferred.take() {
            return Some(Err(e));
        }
        if self.failed.is_some() {
            return None;
        }
        self.next_batch().transpose()
    }
}

impl Drop for Loader {
    /// Stops the producer collectively (see [`pipeline`]): every rank drops its loader at
    /// the same point, and none is left waiting. In a forked child nothing is stopped or
    /// freed (the producer and the communicators are the parent's).
    fn drop(&mut self) {
        drop(self.stop_handlers.take());
        if self.check_process().is_err() {
            self.pipeline.forget();
            self.tracker.forget();
            return;
        }
        let stream = &self.stream;
        self.tracker.interrupted(Instant::now(), |a, b| stream.rows_in_steps(a..b));
        // Closed where others expect this rank at their next window: they learn it closed.
        if let Ok(expected_by) = self.pipeline.stop(self.interrupt.as_deref_mut(), true) {
            if expected_by.or(self.expected_by).is_some() {
                let _ = self.pipeline.agree_gone("closed its loader");
            }
        }
    }
}

/// The error of a loader used in a process it was not made in (`made_in`), e.g. a
/// forked child (`used_in`).
pub fn fork_error(made_in: u32, used_in: u32) -> Error {
    Error::Misuse(format!(
        "this loader was made in process {made_in} and cannot be used in process {used_in}: a loader cannot cross a \
         fork (os.fork, multiprocessing's fork start method, DataLoader workers); make one loader per training \
         process and iterate it there"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{gen, DType, Field, Format};
    use crate::transport::LocalTransport;
    use crate::types::SampleId;

    fn dataset(samples: u64) -> (tempfile::TempDir, Dataset) {
        let dir = tempfile::tempdir().unwrap();
        let spec = gen::GenSpec {
            format: Format::Raw,
            samples,
            files: 2,
            out: dir.path().into(),
            arrow_batch_rows: 4,
            fields: vec![Field::tensor("x", DType::U16, vec![2])],
        };
        for i in 0..2 {
            gen::write_file(&spec, i).unwrap();
        }
        gen::write_side_files(&spec).unwrap();
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        (dir, ds)
    }

    fn loader(ds: &Dataset, batch_size: usize, prefetch: usize) -> Loader {
        let options = LoaderOptions { batch_size, seed: 7, window_bytes: 64, prefetch, ..Default::default() };
        Loader::new(&LocalTransport::new(), ds.clone(), options).unwrap()
    }

    fn ids(batches: impl Iterator<Item = Result<Batch>>) -> Vec<Vec<SampleId>> {
        batches.map(|b| b.unwrap().ids.clone()).collect()
    }

    #[test]
    fn saved_state_resumes_the_same_batches_with_and_without_a_producer_thread() {
        let (_dir, ds) = dataset(50);
        for prefetch in [0, 1, 3] {
            let mut a = loader(&ds, 4, prefetch);
            let all = ids(a.epoch(Epoch(1)));
            assert_eq!(all.len(), 12);
            let state = LoaderState::from_json(&a.state_at(Position::new(1, 5)).to_json()).unwrap();
            let mut b = loader(&ds, 4, prefetch);
            b.seek(&state).unwrap();
            assert_eq!(ids(b.by_ref()), all[5..].to_vec(), "prefetch {prefetch}");
            // The end of an epoch is the start of the next.
            assert_eq!((b.state().epoch, b.state().step), (2, 0));
            // Another batch size is another stream.
            let c = loader(&ds, 5, prefetch);
            let err = c.seek_err(&state);
            assert!(err.contains("batch size 4 → 5"), "{err}");
        }
    }

    impl Loader {
        fn seek_err(mut self, state: &LoaderState) -> String {
            self.seek(state).unwrap_err().to_string()
        }
    }

    #[test]
    fn epochs_follow_each_other_and_seeks_restart_anywhere() {
        let (_dir, ds) = dataset(50);
        let reference: Vec<Vec<Vec<SampleId>>> = {
            let mut l = loader(&ds, 4, 0);
            (0..3).map(|e| ids(l.epoch(Epoch(e)))).collect()
        };
        let mut l = loader(&ds, 4, 2);
        // Iterating without set_epoch moves on to the next epoch.
        assert_eq!(ids(l.by_ref()), reference[0]);
        assert_eq!(ids(l.by_ref()), reference[1]);
        // Stop mid-epoch and jump back: the producer (running ahead) is restarted.
        let first_two: Vec<_> = l.by_ref().take(2).map(|b| b.unwrap().ids.clone()).collect();
        assert_eq!(first_two, reference[2][..2].to_vec());
        assert_eq!(l.position(), Position::new(2, 2));
        l.set_epoch(Epoch(0)).unwrap();
        assert_eq!(ids(l.by_ref()), reference[0]);
        // set_epoch where the loader already stands keeps the running producer's work.
        l.set_epoch(Epoch(1)).unwrap();
        assert_eq!(ids(l.by_ref()), reference[1]);
        let s = l.state_at(Position::new(2, 7));
        l.seek(&s).unwrap();
        assert_eq!(ids(l.by_ref()), reference[2][7..].to_vec());
        // Out of range.
        let bad = LoaderState { step: 12, ..l.state() };
        assert!(l.seek(&bad).unwrap_err().to_string().contains("an epoch has 12 steps"));
    }

    #[test]
    fn a_loader_moves_to_another_thread() {
        let (_dir, ds) = dataset(50);
        let mut l = loader(&ds, 5, 2);
        let first = l.next_batch().unwrap().unwrap().ids.clone();
        let rest = std::thread::spawn(move || {
            let rest = ids(l.by_ref());
            (l, rest)
        });
        let (l, rest) = rest.join().unwrap();
        assert_eq!(rest.len(), 9);
        assert!(!rest.contains(&first));
        drop(l); // stops the producer without hanging
    }

    #[test]
    fn metrics_count_delivered_windows_and_waiting() {
        let (_dir, ds) = dataset(50);
        let mut l = loader(&ds, 4, 2);
        let n = l.by_ref().count();
        let m = l.take_metrics();
        assert_eq!(m.rows_delivered, 4 * n as u64);
        assert_eq!(m.windows, 12u64.div_ceil(l.steps_per_window()));
        assert!(m.bytes_read >= 48 * 4, "{m:?}");
        // Per-window send counts only when asked for (they grow with the run).
        assert!(m.window_sends.is_empty());
        l.keep_window_sends(true);
        l.set_epoch(Epoch(1)).unwrap();
        let n = l.by_ref().count();
        let m = l.take_metrics();
        assert_eq!(m.window_sends.len() as u64, m.windows);
        let sent: usize = m.window_sends.iter().flatten().sum();
        assert_eq!((sent as u64, m.rows_delivered), (m.bytes_sent, 4 * n as u64));
        // One rank, one host: nothing is sent off the host.
        assert_eq!(m.bytes_sent_off_host, 0);
        // The figures of the epoch that just ended.
        let (_, last) = l.live_metrics();
        assert_eq!(last.map(|e| (e.epoch, e.steps, e.windows)), Some((1, 12, m.windows)));
    }

    /// Has `l` write its telemetry to `dir`, as a job asking for it would.
    fn record_telemetry(l: &mut Loader, dir: &std::path::Path) {
        let job = crate::config::Job {
            data: vec![],
            dataset: Default::default(),
            loader: l.options().clone(),
            epochs: 2,
            transport: Default::default(),
            telemetry: Some(dir.into()),
            heartbeat: None,
        };
        l.record_telemetry(&LocalTransport::new(), &job).unwrap();
    }

    /// Rank 0's records in `dir`: its windows and its epochs, in the order written, and
    /// whether the last record is an epoch's.
    fn recorded(dir: &std::path::Path) -> (Vec<crate::telemetry::Window>, Vec<crate::telemetry::Epoch>, bool) {
        use crate::telemetry::{read_rank_file, Record};
        let records = read_rank_file(&dir.join("rank-0.jsonl")).unwrap();
        let last_is_epoch = matches!(records.last(), Some((_, Record::Epoch(_))));
        let (mut windows, mut epochs) = (Vec::new(), Vec::new());
        for (_, r) in records {
            match r {
                Record::Window(w) => windows.push(w),
                Record::Epoch(e) => epochs.push(e),
            }
        }
        (windows, epochs, last_is_epoch)
    }

    /// A loader dropped in a forked child leaves the parent's telemetry alone: the records
    /// buffered at the fork are written once, by the parent.
    #[test]
    fn a_forked_child_does_not_write_the_parents_telemetry() {
        let (_dir, ds) = dataset(50);
        let out = tempfile::tempdir().unwrap();
        let mut l = loader(&ds, 4, 0);
        record_telemetry(&mut l, out.path());
        // Epoch 0's record is buffered, not yet written (its windows are).
        l.by_ref().count();
        l.next_batch().unwrap().unwrap();
        // SAFETY: the child only drops the loader (no producer thread: prefetch 0) and exits.
        match unsafe { libc::fork() } {
            0 => {
                drop(l);
                unsafe { libc::_exit(0) }
            }
            pid => {
                let mut status = 0;
                assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            }
        }
        drop(l);
        let epochs: Vec<u64> = recorded(out.path()).1.iter().map(|e| e.epoch).collect();
        assert_eq!(epochs, [0, 1]);
    }

    /// A rank killed outright (never dropped) leaves the records of the windows it
    /// finished in its file.
    #[test]
    fn each_finished_window_is_on_disk_at_once() {
        let (_dir, ds) = dataset(50);
        let out = tempfile::tempdir().unwrap();
        let mut l = loader(&ds, 4, 0);
        record_telemetry(&mut l, out.path());
        let windows = l.steps_per_epoch().div_ceil(l.steps_per_window());
        assert!(windows > 1, "{windows}");
        l.by_ref().count();
        // As if killed: no drop, no flush.
        std::mem::forget(l);
        let (written, epochs, _) = recorded(out.path());
        assert_eq!((written.len() as u64, epochs.len()), (windows, 0));
    }

    /// With a telemetry directory, each window the consumer took gets a record with its
    /// steps' waiting and training time, and each epoch one that sums them; the records
    /// are what `meshfeed report` reads, and an epoch left part way has one of its steps.
    #[test]
    fn the_loader_writes_a_record_of_each_window_and_epoch_it_delivered() {
        use crate::telemetry::RunInfo;
        let (_dir, ds) = dataset(50);
        let out = tempfile::tempdir().unwrap();
        let mut l = loader(&ds, 4, 2);
        record_telemetry(&mut l, out.path());
        let beats = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = beats.clone();
        l.heartbeat(std::time::Duration::ZERO, move |line| sink.lock().unwrap().push(line.to_string()));
        let mut steps = 0;
        while let Some(b) = l.next_batch().unwrap() {
            drop(b);
            std::thread::sleep(std::time::Duration::from_millis(2));
            steps += 1;
        }
        l.set_epoch_verified(true);
        let (window, epoch) = l.live_metrics();
        let (window, epoch) = (window.unwrap(), epoch.unwrap());
        assert_eq!((epoch.epoch, epoch.steps, epoch.samples), (0, 12, 48));
        assert!(epoch.compute_s >= 0.024 && epoch.wait_fraction() < 1.0, "{epoch:?}");
        assert_eq!(window.step_compute_s.len() as u64, window.steps);
        // Part of the next epoch, then the loader is dropped.
        for _ in 0..3 {
            l.next_batch().unwrap().unwrap();
        }
        let per_window = l.steps_per_window();
        drop(l);
        assert_eq!(beats.lock().unwrap().len(), 15);
        let beat: serde_json::Value = serde_json::from_str(&beats.lock().unwrap()[11]).unwrap();
        assert_eq!(
            (beat["epoch"].as_u64(), beat["step"].as_u64(), beat["steps"].as_u64()),
            (Some(0), Some(12), Some(12))
        );
        let run = RunInfo::read(out.path()).unwrap().unwrap();
        assert_eq!((run.ranks, run.samples, run.batch_size, run.epochs), (1, 50, 4, 2));
        let (all_windows, epochs, last_is_epoch) = recorded(out.path());
        let windows: Vec<_> = all_windows.iter().filter(|w| w.epoch == 0).collect();
        let epochs: Vec<_> = epochs.iter().collect();
        assert_eq!(steps, 12);
        let firsts: Vec<u64> = windows.iter().map(|w| w.first_step).collect();
        assert_eq!(firsts, (0..12).step_by(per_window as usize).collect::<Vec<_>>());
        assert!(windows
            .iter()
            .all(|w| w.step_compute_s.len() as u64 == w.steps && w.step_wait_s.len() as u64 == w.steps));
        // Only a window's first step waits: the window comes whole.
        assert!(windows.iter().all(|w| w.step_wait_s[1..].iter().all(|&s| s == 0.0) && w.step_wait_s[0] == w.wait_s));
        assert!(windows.iter().flat_map(|w| &w.step_compute_s).all(|&s| s >= 0.002), "{windows:?}");
        let e0 = epochs[0];
        assert_eq!(
            (e0.epoch, e0.steps, e0.samples, e0.windows, e0.verified),
            (0, 12, 48, windows.len() as u64, Some(true))
        );
        let sum = |f: fn(&crate::telemetry::Window) -> f64| windows.iter().map(|w| f(w)).sum::<f64>();
        assert!((sum(|w| w.compute_s) - e0.compute_s).abs() < 1e-9 && (sum(|w| w.wait_s) - e0.wait_s).abs() < 1e-9);
        assert_eq!(windows.iter().map(|w| w.rows).sum::<u64>(), 48);
        assert_eq!(windows.iter().map(|w| w.bytes_received).sum::<u64>(), e0.bytes_received);
        assert!(e0.seconds >= e0.compute_s + e0.wait_s - 1e-9, "{e0:?}");
        // The epoch left after 3 steps: its record holds them.
        assert_eq!(epochs.len(), 2);
        assert_eq!((epochs[1].epoch, epochs[1].steps, epochs[1].samples, epochs[1].verified), (1, 3, 12, None));
        assert!(last_is_epoch);
    }
}
