//! The loader: turns a dataset into this rank's stream of batches.
//!
//! A [`Loader`] owns everything it needs — its own duplicate of the communicator it was
//! given, the dataset, open readers — and its position is a plain value
//! ([`Position`]: the epoch and step of the next batch). It yields batches by itself
//! ([`Loader::next_batch`], or as an iterator over the current epoch), can save and
//! restore its position at any step ([`Loader::state`], [`Loader::seek`]) and is `Send`:
//! it can be moved to another thread or held by a Python object.
//!
//! Behind it, a producer runs the windows of the stream — plan, read, fill, exchange,
//! assemble ([`engine`]) — by default on a background thread up to `prefetch` windows
//! ahead, overlapping each window's exchange with reading and filling the next
//! ([`producer`], [`pipeline`]). Memory stays within `(prefetch + 1) × window_bytes`
//! ([`crate::plan::budget`]) plus the rows kept in memory, within the memory budget.
//!
//! How a rank reads its home range from storage is planned when the loader is built
//! ([`read`], [`crate::plan::io`]): streamed once into memory and kept (*resident*),
//! streamed in several passes per epoch, or kept in part and read at random where the
//! windows need it, the rest optionally spilled to node-local storage.
//!
//! This file holds the loader's face: building it and delivering batches. Its other
//! methods are grouped by job, each group an `impl Loader` of its own: where it stands and
//! moving it ([`position`]: state, seek, set_epoch), stopping ([`stop`]), watching it run
//! ([`observe`]: metrics, telemetry, heartbeat), and what it was built to deliver
//! ([`describe`]: steps, mesh, placement, read plan).
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
mod describe;
mod engine;
pub mod layout;
mod marshal;
pub mod metrics;
mod observe;
mod open;
mod pipeline;
mod position;
mod producer;
mod read;
pub mod state;
mod stop;
mod stream;
mod tracker;
mod tuning;
mod two_phase;
mod window;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Instant;

pub use crate::config::{ExchangeMode, Layout, LoaderOptions, LocalReads, TailPolicy};
use crate::dataset::{Dataset, DatasetOptions};
use crate::error::{Error, Result};
pub use crate::runtime::abandoned;
pub use crate::runtime::memory::{all_headrooms, auto_budget, MARGIN_FRACTION, MIN_MARGIN};
use crate::transport::{agree, agree_settings, Transport};
use crate::types::Step;
pub use batch::{Batch, Element, FieldData};
use engine::Engine;
pub use engine::{STOP_REQUESTED, STOP_SIGNALS};
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

    /// A loader cannot cross a `fork`: the child has none of the parent's threads, and
    /// its communicators are the parent's. Refused by process id.
    fn check_process(&self) -> Result<()> {
        let now = std::process::id();
        if now != self.pid {
            return Err(fork_error(self.pid, now));
        }
        Ok(())
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
    use crate::types::{Epoch, SampleId};

    fn dataset(samples: u64) -> (tempfile::TempDir, Dataset) {
        let (dir, spec) =
            gen::GenSpec::write_temp(Format::Raw, samples, 2, 4, vec![Field::tensor("x", DType::U16, vec![2])]);
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

    /// A loader of batches of 4 of 50 samples, `prefetch` windows ahead, that writes its
    /// telemetry to the second directory returned, as a job asking for it would; the first
    /// holds the dataset.
    fn recording_loader(prefetch: usize) -> (tempfile::TempDir, tempfile::TempDir, Loader) {
        let (dir, ds) = dataset(50);
        let out = tempfile::tempdir().unwrap();
        let mut l = loader(&ds, 4, prefetch);
        let job = crate::config::Job {
            data: vec![],
            dataset: Default::default(),
            loader: l.options().clone(),
            epochs: 2,
            transport: Default::default(),
            telemetry: Some(out.path().into()),
            heartbeat: None,
        };
        l.record_telemetry(&LocalTransport::new(), &job).unwrap();
        (dir, out, l)
    }

    /// Rank 0's records in `dir`: its windows and its epochs, in the order written, and
    /// whether the last record is an epoch's.
    fn recorded(
        dir: &std::path::Path,
    ) -> (Vec<crate::telemetry::WindowRecord>, Vec<crate::telemetry::EpochRecord>, bool) {
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
        let (_dir, out, mut l) = recording_loader(0);
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
        let (_dir, out, mut l) = recording_loader(0);
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
        let (_dir, out, mut l) = recording_loader(2);
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
        let sum = |f: fn(&crate::telemetry::WindowRecord) -> f64| windows.iter().map(|w| f(w)).sum::<f64>();
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
