//! Per-rank telemetry (`meshfeed run --telemetry DIR`): the library's typed records
//! ([`meshfeed::telemetry`]) of this rank's windows and epochs, appended to
//! `DIR/rank-<r>.jsonl`, and rank 0's `DIR/run.json` (the run's configuration and read
//! plan). `meshfeed report` reads them ([`meshfeed_analysis::report`]).

use std::path::Path;

use meshfeed::config::Job;
use meshfeed::loader::{Loader, Metrics};
use meshfeed::telemetry::{Epoch, Phases, Record, RunInfo, Window, Writer, SCHEMA};
use meshfeed::Result;

use crate::report::EpochTimes;

/// One rank's telemetry file.
pub struct TelemetryWriter {
    writer: Writer,
    rank: usize,
    ranks: usize,
    host: String,
}

impl TelemetryWriter {
    /// Creates `dir` and this rank's file (rank 0 also writes `run.json`).
    pub fn create(dir: &Path, rank: usize, ranks: usize, job: &Job, loader: &Loader) -> Result<TelemetryWriter> {
        let run = (rank == 0).then(|| RunInfo::of(job, loader, ranks));
        Ok(TelemetryWriter {
            writer: Writer::create(dir, rank, run.as_ref())?,
            rank,
            ranks,
            host: meshfeed::transport::hosts::this_host(),
        })
    }

    /// Appends this rank's records of an epoch's windows (the loader keeps them:
    /// [`Loader::keep_window_records`]), then of the epoch (its own metrics, before any
    /// reduction) and, with `--verify`, whether the epoch verified (every rank learns the
    /// outcome).
    pub fn epoch(&mut self, t: &EpochTimes, m: &Metrics, verified: Option<bool>) -> Result<()> {
        for w in &m.window_records {
            self.writer.append(&Record::Window(Window::of(self.rank, w)))?;
        }
        self.writer.append(&Record::Epoch(Epoch {
            schema: SCHEMA,
            rank: self.rank,
            ranks: Some(self.ranks),
            host: self.host.clone(),
            epoch: t.epoch,
            steps: t.steps,
            samples: t.samples,
            seconds: t.seconds,
            phase_s: Phases::of(&m.phase),
            peer_wait_s: m.peer_wait.as_secs_f64(),
            wait_s: m.wait.as_secs_f64(),
            compute_s: t.compute_s,
            bytes_read: m.bytes_read,
            bytes_read_spill: m.bytes_read_spill,
            bytes_sent: m.bytes_sent,
            bytes_sent_off_host: m.bytes_sent_off_host,
            bytes_received: m.bytes_received,
            windows: m.windows,
            peak_rss_bytes: meshfeed::runtime::peak_rss_bytes(),
            verified,
        }))?;
        self.writer.flush()
    }
}
