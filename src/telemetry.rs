//! Telemetry: typed, versioned records of a run, written by the loader itself when asked
//! (`telemetry = DIR` in a job file or a Python `Loader`, `meshfeed run --telemetry DIR`:
//! [`crate::loader::Loader::record_telemetry`]) and read back by `meshfeed report` (the
//! `meshfeed-analysis` crate). A training job's files and `meshfeed run`'s are the same.
//!
//! A run's directory holds `run.json` ([`RunInfo`], rank 0's: the run's configuration and
//! its read plan) and one `rank-<r>.jsonl` per rank ([`RANK_FILE_PREFIX`]): a JSON line
//! per window ([`WindowRecord`]: its steps, time in each phase, waiting for the slowest peer
//! inside the exchange, bytes read, sent — to other hosts too — and received, and, from
//! the consumer's side, step by step, the time it waited for data and the time it spent
//! until it asked for the next batch: its training step), then one per epoch ([`EpochRecord`]:
//! its host, time in each phase, waiting for the producer and computing, its bytes, peak
//! memory, and whether it verified). An epoch left part way (a job stopped) has a record
//! of the steps it delivered.
//!
//! Every record carries the layout's version in its `schema` key ([`SCHEMA`]). Reading
//! takes every version from [`OLDEST_SCHEMA`] on — schema 1 wrote only epoch records,
//! without a `kind`, peer waiting or off-host bytes; schema 3 added the windows' steps,
//! schema 4 each rank's home range length, schema 5 a tuned loader's prefetch and reads
//! in flight; schema 6 names the phase that fills send buffers `fill`, not `pack` (older
//! records' `pack` is read as `fill`); keys added since are optional — and
//! refuses any other, naming the file (and line). A record needs only the keys the report
//! reads: its schema, rank, epoch and phase times; a window's first step, rows, peer
//! waiting and bytes read, sent and sent off the host; an epoch's samples, seconds and
//! waiting. Any other key may be absent (0; an epoch's host `?`, its ranks unsaid). A
//! record's times must be finite and non-negative and its counts non-negative integers;
//! anything else is an error naming the file, the line and the key, never a quiet zero.
//!
//! Records are plain data: nothing here runs a loader. [`crate::loader::Loader::run_info`] builds a run's
//! record from a job and its loader; the loader builds the others as its consumer takes
//! its batches.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::read_small_file;
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::plan::IoPlan;

/// The version of the records' layout this build writes.
pub const SCHEMA: u32 = 6;

/// The oldest version this build reads.
pub const OLDEST_SCHEMA: u32 = 1;

/// The run's configuration, in a run's directory.
pub const RUN_FILE: &str = "run.json";

/// Rank files are `rank-<r>.jsonl`.
pub const RANK_FILE_PREFIX: &str = "rank-";
/// See [`RANK_FILE_PREFIX`].
pub const RANK_FILE_SUFFIX: &str = ".jsonl";

/// The most a rank's file may hold (1 GiB, far beyond any real run's), and `run.json`
/// (1 MiB): longer files are refused before they are read.
pub const RANK_FILE_LIMIT: u64 = 1 << 30;
/// See [`RANK_FILE_LIMIT`].
pub const RUN_FILE_LIMIT: u64 = 1 << 20;

/// The name of rank `rank`'s file.
pub fn rank_file_name(rank: usize) -> String {
    format!("{RANK_FILE_PREFIX}{rank}{RANK_FILE_SUFFIX}")
}

/// The phases of the pipeline, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Computing window plans (permutation, placement).
    Plan,
    /// Reading samples of the home range from files.
    Read,
    /// Filling each destination's send buffer with its values (called `pack` in records
    /// before schema 6, a name that now means sequence packing only).
    Fill,
    /// The all-to-all exchange (and failure agreement).
    Exchange,
    /// Copying received values into batches.
    Assemble,
}

impl Phase {
    /// All phases.
    pub const ALL: [Phase; 5] = [Phase::Plan, Phase::Read, Phase::Fill, Phase::Exchange, Phase::Assemble];

    /// Lower-case name, as printed and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::Read => "read",
            Phase::Fill => "fill",
            Phase::Exchange => "exchange",
            Phase::Assemble => "assemble",
        }
    }
}

/// The part of `wait + compute` spent waiting (0 when both are 0).
pub fn fraction(wait: f64, compute: f64) -> f64 {
    if wait + compute > 0.0 {
        wait / (wait + compute)
    } else {
        0.0
    }
}

/// Seconds in each phase of the loader ([`Phase`]), by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    pub plan: f64,
    pub read: f64,
    #[serde(alias = "pack")]
    pub fill: f64,
    pub exchange: f64,
    pub assemble: f64,
}

impl Phases {
    /// The phases of durations indexed like [`Phase::ALL`] (the loader's metrics).
    pub fn of(d: &[Duration; 5]) -> Phases {
        let s = |p: Phase| d[p as usize].as_secs_f64();
        Phases {
            plan: s(Phase::Plan),
            read: s(Phase::Read),
            fill: s(Phase::Fill),
            exchange: s(Phase::Exchange),
            assemble: s(Phase::Assemble),
        }
    }

    /// Seconds in phase `p`.
    pub fn get(&self, p: Phase) -> f64 {
        match p {
            Phase::Plan => self.plan,
            Phase::Read => self.read,
            Phase::Fill => self.fill,
            Phase::Exchange => self.exchange,
            Phase::Assemble => self.assemble,
        }
    }

    /// A rank's own work: every phase but the exchange (which includes waiting for
    /// others).
    pub fn own(&self) -> f64 {
        self.plan + self.read + self.fill + self.assemble
    }

    /// The first phase whose time is not a finite, non-negative number of seconds.
    fn check(&self) -> std::result::Result<(), RecordError> {
        Phase::ALL.iter().try_for_each(|&p| seconds(&format!("phase_s.{}", p.name()), self.get(p)))
    }
}

/// `run.json`: the run's configuration, written by rank 0, so that records of many runs
/// join without wrapper scripts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The records' layout ([`SCHEMA`]).
    pub schema: u32,
    /// The version of meshfeed that wrote it.
    #[serde(default)]
    pub version: String,
    pub ranks: usize,
    /// The dataset's paths (or a description of it).
    #[serde(default)]
    pub data: Vec<PathBuf>,
    /// Samples in the dataset.
    pub samples: u64,
    /// Global batch size.
    pub batch_size: u64,
    pub epochs: u64,
    pub seed: u64,
    /// The sweep's shared order the run's order was derived from (`--shared-order`; not
    /// recorded before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_order: Option<String>,
    /// The device mesh (`dp=2,tp=2`).
    pub mesh: String,
    /// The exchange the loader ran (`fused`, `two-phase`, `broadcast`).
    pub exchange: String,
    pub transport: String,
    pub window_bytes: u64,
    pub prefetch: usize,
    pub steps_per_window: u64,
    /// Bytes of one sample, variable-length values at their mean size where known (since
    /// schema 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_bytes: Option<u64>,
    /// How the ranks read their home ranges, and why: the strategy, passes per epoch,
    /// spill, rows kept per rank (written since the read strategies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_plan: Option<IoPlan>,
    /// Whether same-host ranks copied each other's kept rows rather than exchange them
    /// (`--local-reads`; not recorded before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares_stores: Option<bool>,
}

impl RunInfo {
    /// Parses `run.json`'s text (`path` names it in errors): a JSON object of a known
    /// schema, every key of its type, at least one rank.
    pub fn parse(path: &Path, text: &str) -> Result<RunInfo> {
        let bad = |why: String| Error::file(path, why);
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        if !v.is_object() {
            return Err(bad(format!("not a JSON object: {v}")));
        }
        check_schema(&v).in_file(path)?;
        if v.get("ranks").is_some_and(|r| r.as_u64().is_none_or(|r| r == 0)) {
            return Err(bad(format!("ranks is {}: a number of ranks is a positive integer", v["ranks"])));
        }
        let info: RunInfo = typed(v).in_file(path)?;
        Ok(info)
    }

    /// Reads `dir`'s `run.json`: `None` where nothing is there; an error naming it where
    /// it is not a regular file, too long, or no run's configuration.
    pub fn read(dir: &Path) -> Result<Option<RunInfo>> {
        let path = dir.join(RUN_FILE);
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            _ => RunInfo::parse(&path, &read_small_file(&path, RUN_FILE_LIMIT)?).map(Some),
        }
    }
}

/// One rank's record of one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WindowRecord {
    /// The records' layout ([`SCHEMA`]).
    pub schema: u32,
    pub rank: usize,
    pub epoch: u64,
    /// The window's first step in its epoch, and its steps.
    pub first_step: u64,
    #[serde(default)]
    pub steps: u64,
    /// Rows this rank delivered from it.
    pub rows: u64,
    pub phase_s: Phases,
    /// Time in agreements (part of the exchange): waiting for the slowest peer.
    pub peer_wait_s: f64,
    /// Time the consumer waited for this window.
    #[serde(default)]
    pub wait_s: f64,
    pub bytes_read: u64,
    pub bytes_sent: u64,
    pub bytes_sent_off_host: u64,
    #[serde(default)]
    pub bytes_received: u64,
    /// Bytes read back from spill files (since schema 3).
    #[serde(default)]
    pub bytes_read_spill: u64,
    /// Time the consumer spent between taking a batch of this window and asking for the
    /// next: its training steps (since schema 3).
    #[serde(default)]
    pub compute_s: f64,
    /// Per step delivered from the window, in order: the time the consumer waited for its
    /// batch (only a window's first step waits: the window is made whole), and its
    /// training step (since schema 3; empty before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_wait_s: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_compute_s: Vec<f64>,
    /// The length of this rank's home range the window was read with: it moves between
    /// epochs where the loader balances the ranges (`--balance`; since schema 4, 0 before).
    #[serde(default)]
    pub home_rows: u64,
    /// Where the loader tunes itself (`--tune auto`; since schema 5): the windows its
    /// producer ran ahead and the reads it kept in flight when this window was assembled
    /// (its length is `steps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_depth: Option<u64>,
}

impl WindowRecord {
    /// The part of the consumer's time (waiting for data, and its steps) spent waiting.
    pub fn wait_fraction(&self) -> f64 {
        fraction(self.wait_s, self.compute_s)
    }

    fn check(&self) -> std::result::Result<(), RecordError> {
        self.phase_s.check()?;
        seconds("peer_wait_s", self.peer_wait_s)?;
        seconds("wait_s", self.wait_s)?;
        seconds("compute_s", self.compute_s)?;
        for (key, steps) in [("step_wait_s", &self.step_wait_s), ("step_compute_s", &self.step_compute_s)] {
            steps.iter().try_for_each(|&s| seconds(key, s))?;
        }
        if self.step_wait_s.len() != self.step_compute_s.len() || self.step_wait_s.len() as u64 > self.steps {
            return Err(RecordError::Steps {
                wait: self.step_wait_s.len(),
                compute: self.step_compute_s.len(),
                steps: self.steps,
            });
        }
        Ok(())
    }
}

/// One rank's record of one epoch: its own metrics, before any reduction.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The records' layout ([`SCHEMA`]).
    pub schema: u32,
    pub rank: usize,
    /// The run's ranks (`None`: the record does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<usize>,
    /// The rank's host (`?` where the record does not say).
    #[serde(default = "unknown_host")]
    pub host: String,
    pub epoch: u64,
    #[serde(default)]
    pub steps: u64,
    /// Samples the epoch delivered (all ranks together).
    pub samples: u64,
    /// The epoch's time on this rank.
    pub seconds: f64,
    pub phase_s: Phases,
    /// Time in agreements (part of the exchange; since schema 2).
    #[serde(default)]
    pub peer_wait_s: f64,
    /// Time the consumer waited for the producer, and computed (`--compute-ms`).
    pub wait_s: f64,
    #[serde(default)]
    pub compute_s: f64,
    #[serde(default)]
    pub bytes_read: u64,
    /// Bytes read back from spill files.
    #[serde(default)]
    pub bytes_read_spill: u64,
    #[serde(default)]
    pub bytes_sent: u64,
    /// Since schema 2.
    #[serde(default)]
    pub bytes_sent_off_host: u64,
    #[serde(default)]
    pub bytes_received: u64,
    #[serde(default)]
    pub windows: u64,
    #[serde(default)]
    pub peak_rss_bytes: u64,
    /// Whether the epoch verified (`None`: not checked).
    #[serde(default)]
    pub verified: Option<bool>,
    /// This rank's home range length in the epoch's last window ([`WindowRecord::home_rows`]).
    #[serde(default)]
    pub home_rows: u64,
}

/// The host of an epoch record that names none.
fn unknown_host() -> String {
    "?".to_string()
}

impl EpochRecord {
    /// The part of the consumer's time (waiting for data, and its steps) spent waiting.
    pub fn wait_fraction(&self) -> f64 {
        fraction(self.wait_s, self.compute_s)
    }

    fn check(&self) -> std::result::Result<(), RecordError> {
        seconds("seconds", self.seconds)?;
        self.phase_s.check()?;
        seconds("peer_wait_s", self.peer_wait_s)?;
        seconds("wait_s", self.wait_s)?;
        seconds("compute_s", self.compute_s)
    }
}

/// What is wrong with a telemetry record (a line of a rank's file, or `run.json`): the
/// caller names the file and the line.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A line that is not JSON.
    #[error("not a JSON record: {0}")]
    NotJson(#[source] serde_json::Error),
    /// JSON that is not an object.
    #[error("not a JSON record: {0}")]
    NotAnObject(serde_json::Value),
    /// A `schema` this build does not read (`null` where there is none).
    #[error("telemetry schema {0} (this meshfeed reads {OLDEST_SCHEMA} to {SCHEMA})")]
    Schema(serde_json::Value),
    /// A `kind` that is neither a window's nor an epoch's.
    #[error("kind is {0}: a record is a \"window\" or an \"epoch\"")]
    Kind(serde_json::Value),
    /// A count (`key`) that is not a non-negative integer.
    #[error("{key} is {value}: a count is a non-negative integer")]
    NotACount { key: String, value: serde_json::Value },
    /// A time (`key`; an element of a list of times is `key[i]`) that is not a finite,
    /// non-negative number of seconds; `value` as the record has it.
    #[error("{key} is {value}: a time is a finite, non-negative number of seconds")]
    NotATime { key: String, value: String },
    /// A window's lists of step times that disagree with each other or with its steps.
    #[error(
        "step_wait_s has {wait} steps and step_compute_s {compute}: both list the window's steps delivered (at most \
         {steps})"
    )]
    Steps { wait: usize, compute: usize, steps: u64 },
    /// An object that does not read as a record (a key missing, another type), in serde's
    /// words.
    #[error("not a telemetry record: {0}")]
    NotARecord(#[source] serde_json::Error),
}

/// A line of a rank's file.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Record {
    Window(WindowRecord),
    Epoch(EpochRecord),
}

impl Record {
    /// The rank that wrote it.
    pub fn rank(&self) -> usize {
        match self {
            Record::Window(w) => w.rank,
            Record::Epoch(e) => e.rank,
        }
    }

    /// Parses one line; the error says what is wrong (the caller names the file and line).
    pub fn parse(line: &str) -> std::result::Result<Record, RecordError> {
        let v: serde_json::Value = serde_json::from_str(line).map_err(RecordError::NotJson)?;
        if !v.is_object() {
            return Err(RecordError::NotAnObject(v));
        }
        check_schema(&v)?;
        // Schema 1 wrote epoch records only, without a kind.
        let record = match v.get("kind").map(|k| k.as_str()) {
            Some(Some("window")) => Record::Window(typed(v)?),
            None | Some(Some("epoch")) => Record::Epoch(typed(v)?),
            Some(_) => return Err(RecordError::Kind(v["kind"].clone())),
        };
        match &record {
            Record::Window(w) => w.check()?,
            Record::Epoch(e) => e.check()?,
        }
        Ok(record)
    }

    /// The record as one JSON line (without the newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("a record serialises")
    }
}

/// Reads a rank's file: its records with their (1-based) line numbers. Errors name the
/// file (and line): not a regular file, too long, a line that is no record of a known
/// schema.
pub fn read_rank_file(path: &Path) -> Result<Vec<(usize, Record)>> {
    let text = read_small_file(path, RANK_FILE_LIMIT)?;
    text.lines()
        .enumerate()
        .map(|(i, line)| Record::parse(line).map(|r| (i + 1, r)).file_context(path, format_args!("line {}", i + 1)))
        .collect()
}

/// Writes one rank's file (and, for rank 0, `run.json`).
pub struct Writer {
    path: PathBuf,
    file: BufWriter<File>,
}

impl Writer {
    /// Creates `dir` and rank `rank`'s file in it; writes `run` as `run.json` where given
    /// (rank 0).
    pub fn create(dir: &Path, rank: usize, run: Option<&RunInfo>) -> Result<Writer> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        if let Some(run) = run {
            let path = dir.join(RUN_FILE);
            let text =
                serde_json::to_string(run).context(ErrorKind::Internal, "the run's record does not serialise")?;
            std::fs::write(&path, format!("{text}\n")).map_err(|e| Error::io(&path, e))?;
        }
        let path = dir.join(rank_file_name(rank));
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        Ok(Writer { path, file: BufWriter::new(file) })
    }

    /// Appends a record.
    pub fn append(&mut self, record: &Record) -> Result<()> {
        writeln!(self.file, "{}", record.to_line()).map_err(|e| Error::io(&self.path, e))
    }

    /// Writes what is buffered to the file.
    pub fn flush(&mut self) -> Result<()> {
        self.file.flush().map_err(|e| Error::io(&self.path, e))
    }
}

/// A record's `schema`, checked: one this build reads.
fn check_schema(v: &serde_json::Value) -> std::result::Result<u32, RecordError> {
    match v.get("schema").and_then(|s| s.as_u64()) {
        Some(s) if (u64::from(OLDEST_SCHEMA)..=u64::from(SCHEMA)).contains(&s) => Ok(s as u32),
        _ => Err(RecordError::Schema(v.get("schema").cloned().unwrap_or(serde_json::Value::Null))),
    }
}

/// The typed record of `v`; where a key has the wrong type, the error names the key (a
/// count that is no non-negative integer, a time that is no number), else serde's.
fn typed<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> std::result::Result<T, RecordError> {
    serde_json::from_value::<T>(v.clone()).map_err(|e| diagnose(&v).unwrap_or(RecordError::NotARecord(e)))
}

/// The keys whose values are counts.
const COUNTS: [&str; 23] = [
    "rank",
    "home_rows",
    "prefetch",
    "read_depth",
    "ranks",
    "epoch",
    "first_step",
    "steps",
    "rows",
    "samples",
    "bytes_read",
    "bytes_read_spill",
    "bytes_sent",
    "bytes_sent_off_host",
    "bytes_received",
    "windows",
    "peak_rss_bytes",
    "batch_size",
    "epochs",
    "seed",
    "window_bytes",
    "prefetch",
    "steps_per_window",
];

/// The first key of `v` whose value is not of its kind: a count that is not a
/// non-negative integer, a time (`seconds`, `*_s`, `phase_s.*`, an element of a list of
/// times) that is not a number.
fn diagnose(v: &serde_json::Value) -> Option<RecordError> {
    let obj = v.as_object()?;
    for k in COUNTS {
        if let Some(x) = obj.get(k).filter(|x| x.as_u64().is_none()) {
            return Some(RecordError::NotACount { key: k.into(), value: x.clone() });
        }
    }
    let times = obj.iter().filter(|(k, _)| *k == "seconds" || (k.ends_with("_s") && *k != "phase_s"));
    let phases = obj.get("phase_s").and_then(|p| p.as_object()).into_iter().flatten();
    let steps = times.flat_map(|(k, x)| match x.as_array() {
        Some(list) => list.iter().enumerate().map(|(i, x)| (format!("{k}[{i}]"), x)).collect::<Vec<_>>(),
        None => vec![(k.clone(), x)],
    });
    for (k, x) in steps.chain(phases.map(|(k, x)| (format!("phase_s.{k}"), x))) {
        if x.as_f64().is_none() {
            return Some(RecordError::NotATime { key: k, value: x.to_string() });
        }
    }
    None
}

/// Refuses a time that is not a finite, non-negative number of seconds.
fn seconds(key: &str, s: f64) -> std::result::Result<(), RecordError> {
    if s.is_finite() && s >= 0.0 {
        Ok(())
    } else {
        Err(RecordError::NotATime { key: key.into(), value: s.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: &str = r#"{"bytes_read":2049000,"bytes_received":1967040,"bytes_sent":2049000,"bytes_sent_off_host":0,"epoch":0,"first_step":0,"kind":"window","peer_wait_s":0.001368556,"phase_s":{"assemble":0.000998794,"exchange":0.001836897,"pack":0.0,"plan":0.001376286,"read":0.001917066},"rank":0,"rows":120,"schema":2,"steps":1,"wait_s":0.009745586}"#;
    /// A window as schema 3 wrote it: the consumer's steps.
    const WINDOW_V3: &str = r#"{"bytes_read":2049000,"bytes_read_spill":0,"bytes_received":1967040,"bytes_sent":2049000,"bytes_sent_off_host":0,"compute_s":0.05,"epoch":0,"first_step":4,"kind":"window","peer_wait_s":0.001368556,"phase_s":{"assemble":0.000998794,"exchange":0.001836897,"pack":0.0,"plan":0.001376286,"read":0.001917066},"rank":0,"rows":120,"schema":3,"step_compute_s":[0.02,0.03],"step_wait_s":[0.009745586,0.0],"steps":2,"wait_s":0.009745586}"#;
    /// A window as schema 4 writes it: the rank's home range length.
    const WINDOW_V4: &str = r#"{"bytes_read":2049000,"bytes_read_spill":0,"bytes_received":1967040,"bytes_sent":2049000,"bytes_sent_off_host":0,"compute_s":0.05,"epoch":0,"first_step":4,"home_rows":11997,"kind":"window","peer_wait_s":0.001368556,"phase_s":{"assemble":0.000998794,"exchange":0.001836897,"pack":0.0,"plan":0.001376286,"read":0.001917066},"rank":0,"rows":120,"schema":4,"step_compute_s":[0.02,0.03],"step_wait_s":[0.009745586,0.0],"steps":2,"wait_s":0.009745586}"#;
    /// A tuned loader's window as schema 5 writes it: its prefetch and reads in flight.
    const WINDOW_V5: &str = r#"{"bytes_read":2049000,"bytes_read_spill":0,"bytes_received":1967040,"bytes_sent":2049000,"bytes_sent_off_host":0,"compute_s":0.05,"epoch":0,"first_step":4,"home_rows":11997,"kind":"window","peer_wait_s":0.001368556,"phase_s":{"assemble":0.000998794,"exchange":0.001836897,"pack":0.0,"plan":0.001376286,"read":0.001917066},"prefetch":2,"rank":0,"read_depth":32,"rows":120,"schema":5,"step_compute_s":[0.02,0.03],"step_wait_s":[0.009745586,0.0],"steps":2,"wait_s":0.009745586}"#;
    /// Schema 6: the phase that fills send buffers is `fill`.
    const WINDOW_V6: &str = r#"{"bytes_read":2049000,"bytes_read_spill":0,"bytes_received":1967040,"bytes_sent":2049000,"bytes_sent_off_host":0,"compute_s":0.05,"epoch":0,"first_step":4,"home_rows":11997,"kind":"window","peer_wait_s":0.001368556,"phase_s":{"assemble":0.000998794,"exchange":0.001836897,"fill":0.0,"plan":0.001376286,"read":0.001917066},"prefetch":2,"rank":0,"read_depth":32,"rows":120,"schema":6,"step_compute_s":[0.02,0.03],"step_wait_s":[0.009745586,0.0],"steps":2,"wait_s":0.009745586}"#;
    const EPOCH: &str = r#"{"bytes_read":196704000,"bytes_read_spill":0,"bytes_received":196704000,"bytes_sent":196704000,"bytes_sent_off_host":0,"compute_s":0.0,"epoch":0,"home_rows":12000,"host":"vm","kind":"epoch","peak_rss_bytes":32575488,"peer_wait_s":0.028216835,"phase_s":{"assemble":0.014297137,"exchange":0.03725301,"pack":0.0,"plan":0.003011975,"read":0.098461997},"rank":0,"ranks":2,"samples":24000,"schema":4,"seconds":0.172755173,"steps":100,"verified":null,"wait_s":0.171819776,"windows":100}"#;
    /// An epoch record as schema 1 wrote it: no kind, peer waiting, off-host bytes,
    /// spill or verification.
    const EPOCH_V1: &str = r#"{"schema":1,"rank":1,"ranks":2,"host":"a","epoch":3,"steps":10,"samples":100,"seconds":1.5,"phase_s":{"plan":0.1,"read":0.2,"pack":0.0,"exchange":0.3,"assemble":0.4},"wait_s":0.5,"compute_s":0.0,"bytes_read":10,"bytes_sent":20,"bytes_received":20,"windows":2,"peak_rss_bytes":1024}"#;

    #[test]
    fn records_written_today_and_by_schema_1_parse_and_round_trip() {
        let Record::Window(w) = Record::parse(WINDOW).unwrap() else { panic!("a window") };
        assert_eq!((w.rank, w.rows, w.phase_s.read, w.bytes_sent), (0, 120, 0.001917066, 2049000));
        let Record::Epoch(e) = Record::parse(EPOCH).unwrap() else { panic!("an epoch") };
        assert_eq!((e.ranks, e.host.as_str(), e.samples, e.verified), (Some(2), "vm", 24000, None));
        // What is written reads back the same, with the same keys as before but for the
        // fill phase, which records before schema 6 call `pack`.
        for line in [WINDOW_V4, WINDOW_V5, WINDOW_V6, EPOCH] {
            let r = Record::parse(line).unwrap();
            let again: serde_json::Value = serde_json::from_str(&r.to_line()).unwrap();
            let mut before = serde_json::from_str::<serde_json::Value>(line).unwrap();
            let phases = before["phase_s"].as_object_mut().unwrap();
            if let Some(fill) = phases.remove("pack") {
                phases.insert("fill".into(), fill);
            }
            assert_eq!(again, before);
            assert_eq!(Record::parse(&r.to_line()).unwrap(), r);
        }
        let Record::Window(w) = Record::parse(&WINDOW_V5.replace("\"pack\":0.0", "\"pack\":0.25")).unwrap() else {
            panic!("schema 5: a window")
        };
        assert_eq!((w.phase_s.fill, w.phase_s.get(Phase::Fill)), (0.25, 0.25), "schema 5's pack is fill");
        let written: serde_json::Value = serde_json::from_str(&Record::Window(w).to_line()).unwrap();
        assert_eq!((written["phase_s"]["fill"].as_f64(), written["phase_s"].get("pack")), (Some(0.25), None));
        let Record::Window(w) = Record::parse(WINDOW_V5).unwrap() else { panic!("schema 5: a window") };
        assert_eq!((w.prefetch, w.read_depth), (Some(2), Some(32)));
        let Record::Window(w) = Record::parse(WINDOW_V4).unwrap() else { panic!("schema 4: a window") };
        assert_eq!((w.prefetch, w.read_depth), (None, None));
        let mut bad: serde_json::Value = serde_json::from_str(WINDOW_V5).unwrap();
        bad["read_depth"] = (-1).into();
        assert_eq!(
            Record::parse(&bad.to_string()).unwrap_err().to_string(),
            "read_depth is -1: a count is a non-negative integer"
        );
        let Record::Window(w) = Record::parse(WINDOW_V3).unwrap() else { panic!("schema 3: a window") };
        assert_eq!((w.schema, w.step_compute_s.len(), w.home_rows), (3, 2, 0));
        let Record::Epoch(e) = Record::parse(EPOCH_V1).unwrap() else { panic!("schema 1: an epoch") };
        assert_eq!((e.schema, e.rank, e.epoch, e.peer_wait_s, e.bytes_sent_off_host), (1, 1, 3, 0.0, 0));
        assert!((e.phase_s.own() - 0.7).abs() < 1e-12);
    }

    #[test]
    fn unknown_schemas_kinds_and_bad_values_are_refused_saying_what_is_wrong() {
        let with = |key: &str, value: serde_json::Value| {
            let mut v: serde_json::Value = serde_json::from_str(EPOCH).unwrap();
            v[key] = value;
            Record::parse(&v.to_string()).unwrap_err().to_string()
        };
        assert_eq!(with("schema", 7.into()), "telemetry schema 7 (this meshfeed reads 1 to 6)");
        assert_eq!(with("schema", 0.into()), "telemetry schema 0 (this meshfeed reads 1 to 6)");
        assert!(with("kind", "batch".into()).starts_with("kind is \"batch\""));
        assert_eq!(with("samples", (-600).into()), "samples is -600: a count is a non-negative integer");
        assert_eq!(
            with("seconds", (-0.5).into()),
            "seconds is -0.5: a time is a finite, non-negative number of seconds"
        );
        assert!(with("wait_s", "soon".into()).starts_with("wait_s is \"soon\": a time"));
        let mut v: serde_json::Value = serde_json::from_str(WINDOW).unwrap();
        v["phase_s"]["read"] = (-0.25).into();
        assert!(Record::parse(&v.to_string()).unwrap_err().to_string().starts_with("phase_s.read is -0.25"));
        v.as_object_mut().unwrap().remove("schema");
        assert_eq!(
            Record::parse(&v.to_string()).unwrap_err().to_string(),
            "telemetry schema null (this meshfeed reads 1 to 6)"
        );
        assert!(Record::parse("1e999").unwrap_err().to_string().starts_with("not a JSON record"));
        // A window's steps: times, one of each per step delivered.
        let mut v: serde_json::Value = serde_json::from_str(WINDOW_V3).unwrap();
        v["step_compute_s"][1] = (-1.0).into();
        assert!(Record::parse(&v.to_string()).unwrap_err().to_string().starts_with("step_compute_s is -1"), "{v}");
        v["step_compute_s"][1] = "x".into();
        assert!(Record::parse(&v.to_string())
            .unwrap_err()
            .to_string()
            .starts_with("step_compute_s[1] is \"x\": a time"));
        v["step_compute_s"] = serde_json::json!([0.1]);
        let err = Record::parse(&v.to_string()).unwrap_err().to_string();
        assert!(err.starts_with("step_wait_s has 2 steps and step_compute_s 1"), "{err}");
        v["steps"] = 1.into();
        v["step_wait_s"] = serde_json::json!([0.1]);
        let Record::Window(w) = Record::parse(&v.to_string()).unwrap() else { panic!("a window") };
        assert_eq!((w.step_wait_s, w.step_compute_s, w.first_step), (vec![0.1], vec![0.1], 4));
        assert!(Record::parse(r#"{"schema":2,"kind":"window"}"#).unwrap_err().to_string().contains("missing field"));
    }

    #[test]
    fn records_need_only_the_keys_the_report_reads() {
        // A schema-1 epoch record with no host, ranks, steps, compute, bytes, windows or
        // peak memory: read as the reader before the typed records read it.
        let bare = r#"{"schema":1,"rank":1,"epoch":3,"samples":100,"seconds":1.5,"phase_s":{"plan":0.1,"read":0.2,"pack":0.0,"exchange":0.3,"assemble":0.4},"wait_s":0.5}"#;
        let Record::Epoch(e) = Record::parse(bare).unwrap() else { panic!("schema 1: an epoch") };
        assert_eq!((e.schema, e.rank, e.epoch, e.samples, e.seconds, e.wait_s), (1, 1, 3, 100, 1.5, 0.5));
        assert_eq!(
            (e.host.as_str(), e.ranks, e.steps, e.compute_s, e.windows, e.peak_rss_bytes),
            ("?", None, 0, 0.0, 0, 0)
        );
        assert_eq!((e.bytes_read, e.bytes_sent, e.bytes_received, e.verified), (0, 0, 0, None));
        // A window without its steps, the consumer's waiting or the bytes received.
        let mut v: serde_json::Value = serde_json::from_str(WINDOW).unwrap();
        for key in ["steps", "wait_s", "bytes_received"] {
            v.as_object_mut().unwrap().remove(key);
        }
        let Record::Window(w) = Record::parse(&v.to_string()).unwrap() else { panic!("a window") };
        assert_eq!((w.steps, w.wait_s, w.bytes_received, w.rows), (0, 0.0, 0, 120));
        // What the report reads is still needed.
        for key in ["samples", "seconds", "wait_s", "epoch", "phase_s"] {
            let mut v: serde_json::Value = serde_json::from_str(bare).unwrap();
            v.as_object_mut().unwrap().remove(key);
            let err = Record::parse(&v.to_string()).unwrap_err().to_string();
            assert!(err.contains(&format!("missing field `{key}`")), "{key}: {err}");
        }
        for key in ["first_step", "rows", "peer_wait_s", "bytes_read", "bytes_sent", "bytes_sent_off_host"] {
            let mut v: serde_json::Value = serde_json::from_str(WINDOW).unwrap();
            v.as_object_mut().unwrap().remove(key);
            let err = Record::parse(&v.to_string()).unwrap_err().to_string();
            assert!(err.contains(&format!("missing field `{key}`")), "{key}: {err}");
        }
    }

    #[test]
    fn run_json_parses_with_and_without_a_read_plan_and_names_the_file_when_not() {
        let path = Path::new("/x/run.json");
        let text = r#"{"batch_size":240,"data":["d"],"epochs":3,"exchange":"fused","mesh":"dp=2","prefetch":2,"ranks":2,"read_plan":{"budget":0,"prediction":{"first_epoch_s":0.07,"later_epoch_s":0.07,"later_storage_bytes":393408000.0},"reason":"why","resident":[0,0],"spill":false,"storage":{"bandwidth":5000000000.0,"iops":1000000.0},"strategy":{"strategy":"random"}},"sample_bytes":16392,"samples":24000,"schema":2,"seed":0,"steps_per_window":1,"transport":"mpi","version":"0.1.0","window_bytes":4194304}"#;
        let run = RunInfo::parse(path, text).unwrap();
        assert_eq!(run.read_plan.as_ref().unwrap().strategy, crate::plan::Strategy::Random);
        assert_eq!((run.ranks, run.sample_bytes), (2, Some(16392)));
        let again = RunInfo::parse(path, &serde_json::to_string(&run).unwrap()).unwrap();
        assert_eq!(again, run);
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        v.as_object_mut().unwrap().remove("read_plan");
        v.as_object_mut().unwrap().remove("sample_bytes");
        v["schema"] = 1.into();
        let old = RunInfo::parse(path, &v.to_string()).unwrap();
        assert_eq!((old.read_plan, old.sample_bytes), (None, None));
        v["schema"] = 7.into();
        let err = RunInfo::parse(path, &v.to_string()).unwrap_err().to_string();
        assert!(err.contains("/x/run.json: telemetry schema 7 (this meshfeed reads 1 to 6)"), "{err}");
        v["schema"] = 2.into();
        v["ranks"] = 0.into();
        let err = RunInfo::parse(path, &v.to_string()).unwrap_err().to_string();
        assert!(err.contains("/x/run.json: ranks is 0: a number of ranks is a positive integer"), "{err}");
    }

    #[test]
    fn the_writer_writes_what_the_reader_reads() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = Writer::create(dir.path(), 3, None).unwrap();
        let window = Record::parse(WINDOW).unwrap();
        let epoch = Record::parse(EPOCH).unwrap();
        w.append(&window).unwrap();
        w.append(&epoch).unwrap();
        w.flush().unwrap();
        let path = dir.path().join(rank_file_name(3));
        assert_eq!(read_rank_file(&path).unwrap(), [(1, window), (2, epoch)]);
        assert_eq!(RunInfo::read(dir.path()).unwrap(), None);
        std::fs::write(&path, format!("{EPOCH}\n{{\"schema\":9}}\n")).unwrap();
        let err = read_rank_file(&path).unwrap_err().to_string();
        assert!(err.contains("rank-3.jsonl: line 2: telemetry schema 9"), "{err}");
    }
}
