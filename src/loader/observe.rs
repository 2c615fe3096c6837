//! Watching a loader run: its metrics, its telemetry (a record of each window and epoch
//! the consumer took, for `meshfeed report`), the live figures and the heartbeat.

use super::metrics::Metrics;
use super::Loader;
use crate::error::{Error, Result};
use crate::transport::{agree, Transport};

/// Metrics, telemetry and the heartbeat.
impl Loader {
    /// Metrics of the windows delivered since the last call (and the time spent waiting
    /// for them); resets them.
    pub fn take_metrics(&mut self) -> Metrics {
        std::mem::take(&mut self.metrics)
    }

    /// Whether [`Metrics::window_sends`] records each window's send counts (off by
    /// default: a list that grows by one entry per window until `take_metrics`).
    pub fn keep_window_sends(&mut self, keep: bool) {
        self.keep_window_sends = keep;
    }

    /// The figures of the last window the consumer finished and of the epoch under way (or
    /// the last one, between epochs), as the telemetry records them; their
    /// `wait_fraction` is the part of the consumer's time spent waiting for data.
    pub fn live_metrics(&self) -> (Option<crate::telemetry::WindowRecord>, Option<crate::telemetry::EpochRecord>) {
        let stream = &self.stream;
        self.tracker.live(|a, b| stream.rows_in_steps(a..b))
    }

    /// On rank 0, passes `sink` a JSON line every `every` of consuming (checked as each
    /// batch is handed over): the epoch, its steps done and steps, seconds since this
    /// call, samples per second, and the part of the consumer's time this epoch spent
    /// waiting for data. Other ranks ignore it.
    pub fn heartbeat(&mut self, every: std::time::Duration, sink: impl FnMut(&str) + Send + 'static) {
        self.tracker.beat_every(every, self.stream.options.batch_size as u64, Box::new(sink));
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
}
