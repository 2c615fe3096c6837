//! What the loader's consumer sees, recorded as it happens: per window and per epoch, the
//! producer's time in each phase and bytes, the time the consumer waited for data and the
//! time it spent between batches (its training step), step by step. The records are the
//! library's telemetry ([`crate::telemetry`]): kept in memory for
//! [`super::Loader::live_metrics`], written to a run's directory when asked
//! ([`super::Loader::record_telemetry`]), and summed into a heartbeat line when asked
//! ([`super::Loader::heartbeat`]).
//!
//! Nothing here is collective. A record is finished when the consumer is done with it: a
//! window when the next window is taken (or its epoch ends, or the loader is repositioned
//! or dropped), an epoch when its last step's time is known (the call after its last
//! batch). A window's record is written, and flushed, when it is finished. An epoch's
//! record is written when the next record is, when the loader is repositioned or dropped,
//! or on [`Tracker::flush`], so that [`super::Loader::set_epoch_verified`] can still mark
//! it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::Metrics;
use super::stream::Position;
use super::tuning::ConsumerClock;
pub use crate::telemetry::fraction;
use crate::telemetry::{EpochRecord, Phases, Record, WindowRecord, Writer, SCHEMA};

/// Where a rank's records go, and its heartbeat.
pub(crate) struct Tracker {
    /// The consumer's waiting and steps, which the tuner reads.
    clock: Arc<ConsumerClock>,
    rank: usize,
    ranks: usize,
    /// This rank's host, as epoch records name it.
    host: String,
    /// When the last batch was handed to the consumer: its step runs until the next call.
    handed: Option<Instant>,
    /// The window being consumed, and the epoch.
    window: Option<WindowRecord>,
    epoch: Option<EpochSoFar>,
    /// The last window and epoch finished.
    last_window: Option<WindowRecord>,
    last_epoch: Option<EpochRecord>,
    /// The last epoch's record is yet to be written.
    unwritten: bool,
    writer: Option<Writer>,
    /// Why writing stopped (the first error; the job goes on), until taken.
    write_error: Option<crate::Error>,
    heartbeat: Option<Heartbeat>,
}

/// An epoch being consumed.
struct EpochSoFar {
    epoch: u64,
    first_step: u64,
    steps: u64,
    start: Instant,
    /// Its finished windows, summed (the one being consumed is not in it).
    sum: WindowRecord,
    windows: u64,
}

/// Rank 0's periodic progress line.
pub(crate) struct Heartbeat {
    every: Duration,
    start: Instant,
    last: Instant,
    steps: u64,
    batch_size: u64,
    sink: Box<dyn FnMut(&str) + Send>,
}

impl Tracker {
    /// The tracker of rank `rank` of `ranks`; it adds the consumer's waiting and steps to
    /// `clock` too, for the tuner ([`super::tuning`]).
    pub fn new(rank: usize, ranks: usize, clock: Arc<ConsumerClock>) -> Tracker {
        Tracker {
            clock,
            rank,
            ranks,
            host: crate::transport::hosts::this_host(),
            handed: None,
            window: None,
            epoch: None,
            last_window: None,
            last_epoch: None,
            unwritten: false,
            writer: None,
            write_error: None,
            heartbeat: None,
        }
    }

    /// Writes the records from now on with `writer`.
    pub fn write_to(&mut self, writer: Writer) {
        self.writer = Some(writer);
    }

    /// Beats on rank 0 every `every` of consuming.
    pub fn beat_every(&mut self, every: Duration, batch_size: u64, sink: Box<dyn FnMut(&str) + Send>) {
        let now = Instant::now();
        self.heartbeat =
            (self.rank == 0).then_some(Heartbeat { every, start: now, last: now, steps: 0, batch_size, sink });
    }

    /// The consumer asks for the batch at `at`: the step of the batch handed before ends
    /// now (its time is the consumer's), and an epoch starts here if none is under way.
    pub fn called(&mut self, now: Instant, at: Position) {
        self.step_ended(now);
        if self.epoch.is_none() {
            self.write_epoch();
            self.epoch = Some(EpochSoFar {
                epoch: at.epoch.0,
                first_step: at.step.0,
                steps: 0,
                start: now,
                sum: WindowRecord { schema: SCHEMA, rank: self.rank, epoch: at.epoch.0, ..WindowRecord::default() },
                windows: 0,
            });
        }
    }

    /// The step of the batch handed last (if any) ended `now`: its time is the consumer's.
    fn step_ended(&mut self, now: Instant) {
        if let Some(handed) = self.handed.take() {
            let step = now.saturating_duration_since(handed);
            self.clock.computed(step);
            let step = step.as_secs_f64();
            if let Some(w) = self.window.as_mut() {
                if let Some(last) = w.step_compute_s.last_mut() {
                    *last += step;
                }
                w.compute_s += step;
            }
        }
    }

    /// The consumer takes a new window (its first step `first_step`, of `steps`), which
    /// cost `metrics` to make and which it waited `waited` for; the window before is done.
    pub fn took_window(&mut self, epoch: u64, first_step: u64, steps: u64, metrics: &Metrics, waited: Duration) {
        self.clock.waited(waited);
        self.finish_window();
        self.window = Some(WindowRecord {
            schema: SCHEMA,
            rank: self.rank,
            epoch,
            first_step,
            steps,
            rows: metrics.rows_delivered,
            phase_s: Phases::of(&metrics.phase),
            peer_wait_s: metrics.peer_wait.as_secs_f64(),
            wait_s: waited.as_secs_f64(),
            bytes_read: metrics.bytes_read,
            bytes_sent: metrics.bytes_sent,
            bytes_sent_off_host: metrics.bytes_sent_off_host,
            bytes_received: metrics.bytes_received,
            bytes_read_spill: metrics.bytes_read_spill,
            compute_s: 0.0,
            step_wait_s: Vec::new(),
            step_compute_s: Vec::new(),
            home_rows: metrics.home_rows,
            prefetch: metrics.tuned.map(|t| t.prefetch as u64),
            read_depth: metrics.tuned.map(|t| t.read_depth as u64),
        });
    }

    /// A batch is handed to the consumer, after it waited `waited` in this call (for a
    /// window); `done` is its epoch's steps done with it, of `steps`.
    pub fn handed(&mut self, now: Instant, waited: Duration, done: u64, steps: u64) {
        if let Some(w) = self.window.as_mut() {
            w.step_wait_s.push(waited.as_secs_f64());
            w.step_compute_s.push(0.0);
        }
        if let Some(e) = self.epoch.as_mut() {
            e.steps += 1;
            if let Some(h) = self.heartbeat.as_mut() {
                h.steps += 1;
                if now.saturating_duration_since(h.last) >= h.every {
                    h.last = now;
                    let elapsed = now.saturating_duration_since(h.start).as_secs_f64();
                    let (wait, compute) = self
                        .window
                        .iter()
                        .chain([&e.sum])
                        .fold((0.0, 0.0), |(a, b), w| (a + w.wait_s, b + w.compute_s));
                    let line = serde_json::json!({
                        "heartbeat": true,
                        "epoch": e.epoch,
                        "step": done,
                        "steps": steps,
                        "elapsed_s": elapsed,
                        "samples_per_s": (h.steps * h.batch_size) as f64 / elapsed.max(1e-9),
                        "wait_fraction": fraction(wait, compute),
                    });
                    (h.sink)(&line.to_string());
                }
            }
        }
        self.handed = Some(now);
    }

    /// The epoch under way ends (its last step's time is known): `samples` is what it
    /// delivered on all ranks. Also for an epoch left part way (the loader repositioned or
    /// dropped), whose record holds the steps delivered; an epoch of no step has none.
    pub fn end_epoch(&mut self, now: Instant, samples: impl FnOnce(u64, u64) -> u64) {
        self.finish_window();
        let Some(e) = self.epoch.take() else { return };
        if e.steps == 0 {
            return;
        }
        let samples = samples(e.first_step, e.first_step + e.steps);
        let seconds = now.saturating_duration_since(e.start).as_secs_f64();
        self.last_epoch = Some(self.epoch_record(&e, &e.sum, e.windows, samples, seconds));
        self.unwritten = true;
    }

    /// The loader is repositioned or dropped: the step under way ends now, and the epoch
    /// with it.
    pub fn interrupted(&mut self, now: Instant, samples: impl FnOnce(u64, u64) -> u64) {
        self.step_ended(now);
        self.end_epoch(now, samples);
        self.flush();
    }

    /// Marks the last epoch's record, not yet written, as verified or not.
    pub fn set_verified(&mut self, ok: bool) {
        if let (true, Some(e)) = (self.unwritten, self.last_epoch.as_mut()) {
            e.verified = Some(ok);
        }
    }

    /// Writes what is finished, and flushes the file.
    pub fn flush(&mut self) {
        self.write_epoch();
        self.flush_file();
    }

    /// Flushes what is written so far to the file.
    fn flush_file(&mut self) {
        if let Some(w) = self.writer.as_mut() {
            if let Err(e) = w.flush() {
                self.stop_writing(e);
            }
        }
    }

    /// In a forked child: the file and its buffer are the parent's, and must be neither
    /// written nor flushed here.
    pub fn forget(&mut self) {
        std::mem::forget(self.writer.take());
        if let Some(h) = self.heartbeat.take() {
            std::mem::forget(h);
        }
    }

    /// The first error writing the records, if any (writing stopped there).
    pub fn take_write_error(&mut self) -> Option<crate::Error> {
        self.write_error.take()
    }

    /// The last window finished, and the epoch under way so far (else the last finished).
    pub fn live(&self, samples: impl FnOnce(u64, u64) -> u64) -> (Option<WindowRecord>, Option<EpochRecord>) {
        let epoch = match &self.epoch {
            Some(e) if e.steps > 0 => {
                let mut sum = e.sum.clone();
                if let Some(w) = &self.window {
                    add(&mut sum, w);
                }
                let windows = e.windows + u64::from(self.window.is_some());
                let samples = samples(e.first_step, e.first_step + e.steps);
                Some(self.epoch_record(e, &sum, windows, samples, e.start.elapsed().as_secs_f64()))
            }
            _ => self.last_epoch.clone(),
        };
        (self.last_window.clone(), epoch)
    }

    /// The record of epoch `e`, whose windows sum to `sum`.
    fn epoch_record(
        &self,
        e: &EpochSoFar,
        sum: &WindowRecord,
        windows: u64,
        samples: u64,
        seconds: f64,
    ) -> EpochRecord {
        EpochRecord {
            schema: SCHEMA,
            rank: self.rank,
            ranks: Some(self.ranks),
            host: self.host.clone(),
            epoch: e.epoch,
            steps: e.steps,
            samples,
            seconds,
            phase_s: sum.phase_s,
            peer_wait_s: sum.peer_wait_s,
            wait_s: sum.wait_s,
            compute_s: sum.compute_s,
            bytes_read: sum.bytes_read,
            bytes_read_spill: sum.bytes_read_spill,
            bytes_sent: sum.bytes_sent,
            bytes_sent_off_host: sum.bytes_sent_off_host,
            bytes_received: sum.bytes_received,
            windows,
            peak_rss_bytes: crate::runtime::peak_rss_bytes(),
            verified: None,
            home_rows: sum.home_rows,
        }
    }

    /// The window being consumed is done: into its epoch's sum, and written.
    fn finish_window(&mut self) {
        let Some(w) = self.window.take() else { return };
        if let Some(e) = self.epoch.as_mut() {
            add(&mut e.sum, &w);
            e.windows += 1;
        }
        self.append(&Record::Window(w.clone()));
        self.last_window = Some(w);
        // On disk at once: a rank killed outright (SIGKILL after a scheduler's grace period,
        // the OOM killer) leaves the windows it finished.
        self.flush_file();
    }

    fn write_epoch(&mut self) {
        if !std::mem::take(&mut self.unwritten) {
            return;
        }
        if let Some(e) = self.last_epoch.clone() {
            self.append(&Record::Epoch(e));
        }
    }

    fn append(&mut self, record: &Record) {
        self.write_epoch();
        if let Some(w) = self.writer.as_mut() {
            if let Err(e) = w.append(record) {
                self.stop_writing(e);
            }
        }
    }

    /// Writing failed (a full disk): the job goes on without telemetry, said once on
    /// stderr and kept for [`Tracker::take_write_error`].
    fn stop_writing(&mut self, e: crate::Error) {
        self.writer = None;
        let line = format!("meshfeed: rank {}: telemetry stopped: {e}\n", self.rank);
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        self.write_error.get_or_insert(e);
    }
}

/// Adds window `w`'s figures to the sum `to`.
fn add(to: &mut WindowRecord, w: &WindowRecord) {
    let (a, b) = (&mut to.phase_s, &w.phase_s);
    a.plan += b.plan;
    a.read += b.read;
    a.fill += b.fill;
    a.exchange += b.exchange;
    a.assemble += b.assemble;
    to.steps += w.steps;
    to.rows += w.rows;
    to.peer_wait_s += w.peer_wait_s;
    to.wait_s += w.wait_s;
    to.compute_s += w.compute_s;
    to.bytes_read += w.bytes_read;
    to.bytes_read_spill += w.bytes_read_spill;
    to.bytes_sent += w.bytes_sent;
    to.bytes_sent_off_host += w.bytes_sent_off_host;
    to.bytes_received += w.bytes_received;
    to.home_rows = w.home_rows;
}
