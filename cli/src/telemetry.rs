//! Per-rank telemetry (`meshfeed run --telemetry DIR`): every rank appends JSON lines to
//! `DIR/rank-<r>.jsonl`, one per window (`"kind": "window"`: its steps, time in each
//! phase, waiting for the slowest peer inside the exchange, waiting for the consumer,
//! bytes read, sent — to other hosts too — and received), then one per epoch
//! (`"kind": "epoch"`: its host, its time in each phase, waiting for the producer and
//! computing, its bytes and peak memory, whether the epoch verified (null without
//! `--verify`)) — and rank 0 writes `DIR/run.json`, the run's configuration (with the read
//! plan: strategy, rows kept, and why), so that records of many runs join without wrapper
//! scripts.
//! `meshfeed report` reads them ([`crate::analysis`]).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use meshfeed::config::Job;
use meshfeed::loader::{Loader, Metrics, Phase};
use meshfeed::{Error, Result};

use crate::report::EpochTimes;

/// Version of the telemetry records' layout.
pub const SCHEMA: u64 = 2;

/// Bytes of one sample (variable-length values at their mean size where known).
fn sample_bytes(loader: &Loader) -> u64 {
    use meshfeed::plan::budget;
    let d = loader.dataset();
    budget::sample_bytes(&budget::value_sizes(d.fields(), &d.mean_value_bytes()))
}

/// One rank's telemetry file.
pub struct TelemetryWriter {
    path: PathBuf,
    file: BufWriter<File>,
    rank: usize,
    ranks: usize,
    host: String,
}

impl TelemetryWriter {
    /// Creates `dir` and this rank's file (rank 0 also writes `run.json`).
    pub fn create(dir: &Path, rank: usize, ranks: usize, job: &Job, loader: &Loader) -> Result<TelemetryWriter> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        if rank == 0 {
            let run = serde_json::json!({
                "schema": SCHEMA,
                "version": env!("CARGO_PKG_VERSION"),
                "ranks": ranks,
                "data": job.data,
                "samples": loader.dataset().len(),
                "batch_size": job.loader.batch_size,
                "epochs": job.epochs,
                "seed": job.loader.seed,
                "mesh": loader.mesh().to_string(),
                "exchange": loader.exchange_mode().to_string(),
                "transport": job.transport.to_string(),
                "window_bytes": job.loader.window_bytes,
                "prefetch": job.loader.prefetch,
                "steps_per_window": loader.steps_per_window(),
                "sample_bytes": sample_bytes(loader),
                // How the ranks read their home ranges, and why (the memory budget, the
                // storage's speed): the strategy, passes per epoch, spill, rows kept per rank.
                "read_plan": loader.read_plan(),
            });
            let path = dir.join("run.json");
            std::fs::write(&path, format!("{run}\n")).map_err(|e| Error::io(&path, e))?;
        }
        let path = dir.join(format!("rank-{rank}.jsonl"));
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        Ok(TelemetryWriter {
            path,
            file: BufWriter::new(file),
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
        let phases = |d: &[std::time::Duration; 5]| -> serde_json::Map<String, serde_json::Value> {
            Phase::ALL.iter().map(|&p| (p.name().to_string(), d[p as usize].as_secs_f64().into())).collect()
        };
        for w in &m.window_records {
            let record = serde_json::json!({
                "schema": SCHEMA,
                "kind": "window",
                "rank": self.rank,
                "epoch": w.epoch,
                "first_step": w.first_step,
                "steps": w.steps,
                "rows": w.rows,
                "phase_s": phases(&w.phase),
                "peer_wait_s": w.peer_wait.as_secs_f64(),
                "wait_s": w.wait.as_secs_f64(),
                "bytes_read": w.bytes_read,
                "bytes_sent": w.bytes_sent,
                "bytes_sent_off_host": w.bytes_sent_off_host,
                "bytes_received": w.bytes_received,
            });
            writeln!(self.file, "{record}").map_err(|e| Error::io(&self.path, e))?;
        }
        let record = serde_json::json!({
            "schema": SCHEMA,
            "kind": "epoch",
            "rank": self.rank,
            "ranks": self.ranks,
            "host": self.host,
            "epoch": t.epoch,
            "steps": t.steps,
            "samples": t.samples,
            "seconds": t.seconds,
            "phase_s": phases(&m.phase),
            "peer_wait_s": m.peer_wait.as_secs_f64(),
            "wait_s": m.wait.as_secs_f64(),
            "compute_s": t.compute_s,
            "bytes_read": m.bytes_read,
            "bytes_read_spill": m.bytes_read_spill,
            "bytes_sent": m.bytes_sent,
            "bytes_sent_off_host": m.bytes_sent_off_host,
            "bytes_received": m.bytes_received,
            "windows": m.windows,
            "peak_rss_bytes": meshfeed::runtime::peak_rss_bytes(),
            "verified": verified,
        });
        writeln!(self.file, "{record}").and_then(|()| self.file.flush()).map_err(|e| Error::io(&self.path, e))
    }
}
