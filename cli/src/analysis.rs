//! `meshfeed report`: what the ranks' telemetry (`run --telemetry DIR`) says about each
//! run and epoch: time per phase (median and slowest rank), the skew between ranks, the
//! stragglers — the ranks and hosts whose own work took longest, and in which phase — and
//! a what-if estimate, after the what-if analysis of stragglers in large training jobs
//! (Lin et al., "Understanding Stragglers in Large Model Training Using What-if
//! Analysis"): the epoch's time had every rank's own work taken the median rank's.
//!
//! The model: windows are collective, so every window waits for its slowest rank. A
//! rank's own work is its planning, reading, packing and assembling (the exchange and
//! waiting for the producer include waiting for others, and are not its own). If the
//! slowest rank's own work had been the median's, the epoch would have been shorter by at
//! most the difference: `what-if = epoch - (own_max - own_median)`. It is an estimate: a
//! slow link shows up in every rank's exchange, not in one rank's own work.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::builder::RangedU64ValueParser;
use meshfeed::config::ByteSize;
use meshfeed::{Error, Result};
use serde::Serialize;

use crate::input::{present, read_if_present, read_small, RECORDS_LIMIT, SMALL_LIMIT};
use crate::model::{self, median, Calibration, Prediction, Scenario, Validation, WindowSample};

/// The phases of the telemetry records, in order; all but the exchange are a rank's own.
const PHASES: [&str; 5] = ["plan", "read", "pack", "exchange", "assemble"];
const OWN: [usize; 4] = [0, 1, 2, 4];

#[derive(clap::Args, Debug)]
pub struct ReportArgs {
    /// Telemetry directories (`run --telemetry DIR`), or directories of them (a sweep's
    /// results), each a run.
    #[arg(required = true, value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// Print one JSON line per run and epoch instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Draw plots into this directory, each as PNG and SVG: throughput vs nodes per
    /// loader, time per phase per run, and each rank's own work per run (skew).
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    #[command(flatten)]
    pub predict: PredictArgs,
}

/// The cost model's prediction (`--predict`) and what to predict for: by default the
/// largest measured meshfeed run's dataset, batch, window and ranks per node.
///
/// Every count, size and rate is at least 1, checked when the command line is parsed
/// (clap names the option and the value): a zero node count, batch or bandwidth is no
/// scenario, and the model would otherwise quietly predict something else.
#[derive(clap::Args, Debug, Default)]
pub struct PredictArgs {
    /// Fit the cost model to the meshfeed runs' window records and predict epoch time,
    /// throughput and scaling efficiency at these node counts (comma-separated, each 1 to
    /// 2^20) [default when given alone: 1,2,4,...,4096].
    #[arg(long, num_args = 0..=1, value_delimiter = ',', value_name = "NODES",
          default_missing_value = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096",
          value_parser = count(MAX_NODES))]
    pub predict: Option<Vec<usize>>,
    /// Ranks per node (1 to 2^16).
    #[arg(long, requires = "predict", value_parser = count(MAX_RANKS_PER_NODE))]
    pub ranks_per_node: Option<usize>,
    /// Samples in the dataset.
    #[arg(long, requires = "predict", value_parser = clap::value_parser!(u64).range(1..))]
    pub samples: Option<u64>,
    /// Bytes per sample (K/M/G).
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub sample_bytes: Option<ByteSize>,
    /// Global batch size.
    #[arg(long, requires = "predict", value_parser = clap::value_parser!(u64).range(1..))]
    pub batch_size: Option<u64>,
    /// Window budget per rank (K/M/G).
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub window_bytes: Option<ByteSize>,
    /// Ranks that receive each sample (1: data parallel; the size of the mesh axes the
    /// batch is replicated over, e.g. tp) [default: 1].
    #[arg(long, requires = "predict", default_value_t = 1, value_parser = count(u64::MAX))]
    pub replicas: usize,
    /// The storage's aggregate read bandwidth, bytes/s (K/M/G) [default: fitted, or
    /// unlimited when the runs never saturated it].
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub storage_bandwidth: Option<ByteSize>,
    /// One node's read bandwidth from the storage, bytes/s (K/M/G) [default: fitted].
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub node_read_bandwidth: Option<ByteSize>,
    /// One node's network link for the exchange, bytes/s (K/M/G) [default: fitted, or
    /// the `--exchange-costs` default when no run crossed nodes].
    #[arg(long, requires = "predict", value_name = "BYTES", value_parser = positive_bytes)]
    pub link_bandwidth: Option<ByteSize>,
}

/// The most nodes `--predict` takes, and ranks per node: their product (the world size
/// the model computes with) stays exact in a `usize` and an `f64`.
const MAX_NODES: u64 = 1 << 20;
const MAX_RANKS_PER_NODE: u64 = 1 << 16;

/// The parser of a count from 1 to `max` (clap's message names the option and the value).
fn count(max: u64) -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..=max)
}

/// The parser of a size or rate of at least 1 byte (K/M/G).
fn positive_bytes(s: &str) -> std::result::Result<ByteSize, String> {
    match s.parse::<ByteSize>() {
        Ok(ByteSize(0)) => Err("0 bytes: a size or a rate is at least 1 byte".into()),
        Ok(b) => Ok(b),
        Err(e) => Err(e.to_string()),
    }
}

/// One rank's record of one epoch.
#[derive(Clone, Debug, PartialEq)]
pub struct RankEpoch {
    pub rank: usize,
    pub host: String,
    pub epoch: u64,
    pub seconds: f64,
    /// Samples the epoch delivered (all ranks together).
    pub samples: u64,
    /// Seconds per phase, as [`PHASES`].
    pub phase: [f64; 5],
    pub wait: f64,
    /// Whether the epoch verified (`None`: not checked).
    pub verified: Option<bool>,
}

impl RankEpoch {
    /// The rank's own work: every phase but the exchange.
    fn own(&self) -> f64 {
        OWN.iter().map(|&p| self.phase[p]).sum()
    }
}

/// A rank whose own work took much longer than the median rank's.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Straggler {
    pub rank: usize,
    pub host: String,
    pub own_s: f64,
    /// The phase that made it slow (its largest excess over that phase's median).
    pub phase: &'static str,
    pub phase_s: f64,
    pub phase_median_s: f64,
}

/// What one epoch of one run looked like across its ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EpochReport {
    pub kind: &'static str,
    pub run: String,
    /// meshfeed, or the broadcast baseline.
    pub loader: String,
    pub epoch: u64,
    pub ranks: usize,
    /// Distinct hosts (nodes) of the ranks.
    pub hosts: usize,
    pub samples: u64,
    pub samples_per_s: f64,
    /// Every rank verified the epoch (`None`: not checked).
    pub verified: Option<bool>,
    /// The epoch's time: the slowest rank's.
    pub seconds: f64,
    /// The epoch's time had every rank's own work taken the median's.
    pub what_if_s: f64,
    /// Own work: slowest rank over the median rank.
    pub skew: f64,
    pub phase_median_s: Vec<(&'static str, f64)>,
    pub phase_max_s: Vec<(&'static str, f64)>,
    pub stragglers: Vec<Straggler>,
    /// Hosts of the stragglers, slowest first.
    pub slow_hosts: Vec<String>,
    /// Each rank's own work, in rank order.
    pub rank_own_s: Vec<f64>,
}

/// A rank is a straggler when its own work exceeds the median's by a quarter, and by at
/// least 2% of the epoch and 10 ms (less is noise).
fn is_straggler(own: f64, median: f64, epoch: f64) -> bool {
    own > 1.25 * median && own - median > (0.02 * epoch).max(0.01)
}

/// The report of one epoch of `loader` from its ranks' records (pure).
pub fn analyse(run: &str, loader: &str, records: &[RankEpoch]) -> EpochReport {
    let seconds = records.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let own: Vec<f64> = records.iter().map(RankEpoch::own).collect();
    let own_median = median(own.clone());
    let own_max = own.iter().copied().fold(0.0, f64::max);
    let phase_median: Vec<f64> = (0..5).map(|p| median(records.iter().map(|r| r.phase[p]).collect())).collect();
    let phase_max: Vec<f64> = (0..5).map(|p| records.iter().map(|r| r.phase[p]).fold(0.0, f64::max)).collect();
    let mut stragglers: Vec<Straggler> = records
        .iter()
        .filter(|r| is_straggler(r.own(), own_median, seconds))
        .map(|r| {
            let p = *OWN
                .iter()
                .max_by(|&&a, &&b| (r.phase[a] - phase_median[a]).total_cmp(&(r.phase[b] - phase_median[b])))
                .expect("phases");
            Straggler {
                rank: r.rank,
                host: r.host.clone(),
                own_s: r.own(),
                phase: PHASES[p],
                phase_s: r.phase[p],
                phase_median_s: phase_median[p],
            }
        })
        .collect();
    stragglers.sort_by(|a, b| b.own_s.total_cmp(&a.own_s));
    let mut slow_hosts: Vec<String> = Vec::new();
    for s in &stragglers {
        if !slow_hosts.contains(&s.host) {
            slow_hosts.push(s.host.clone());
        }
    }
    let mut hosts: Vec<&str> = records.iter().map(|r| r.host.as_str()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let samples = records.first().map_or(0, |r| r.samples);
    let verified = match records.iter().map(|r| r.verified).collect::<Option<Vec<bool>>>() {
        Some(v) if !v.is_empty() => Some(v.iter().all(|&ok| ok)),
        _ => None,
    };
    EpochReport {
        kind: "epoch",
        run: run.to_string(),
        loader: loader.to_string(),
        epoch: records.first().map_or(0, |r| r.epoch),
        ranks: records.len(),
        hosts: hosts.len(),
        samples,
        samples_per_s: samples as f64 / seconds.max(1e-9),
        verified,
        seconds,
        what_if_s: (seconds - (own_max - own_median)).max(0.0),
        skew: if own_median > 0.0 { own_max / own_median } else { 1.0 },
        phase_median_s: PHASES.iter().copied().zip(phase_median).collect(),
        phase_max_s: PHASES.iter().copied().zip(phase_max).collect(),
        stragglers,
        slow_hosts,
        rank_own_s: own,
    }
}

/// One row of the scaling table: a run's last epoch, against the run of the same loader on
/// the fewest hosts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScalingRow {
    pub kind: &'static str,
    pub loader: String,
    pub hosts: usize,
    pub ranks: usize,
    pub samples_per_s: f64,
    /// Throughput per host over the smallest run's: 1.0 is linear scaling.
    pub efficiency: f64,
    pub run: String,
    /// What the run read from the shared storage (a sweep's `storage_bytes`), in bytes and
    /// as a multiple of the dataset, over the epochs the loader ran (the PyTorch baseline's
    /// untimed one included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageRead>,
}

/// A run's reads from the shared storage.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StorageRead {
    pub bytes: u64,
    pub times_data: f64,
    pub epochs: u64,
}

/// A run's or sweep point's small JSON file (`run.json`, `point.json`, `storage.json`):
/// `None` where absent; an error naming it where it is not a regular file, is too long, or
/// is not a JSON object.
fn read_json(dir: &Path, name: &str) -> Result<Option<serde_json::Value>> {
    let path = dir.join(name);
    let Some(text) = read_if_present(&path, SMALL_LIMIT)? else { return Ok(None) };
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) if v.is_object() => Ok(Some(v)),
        Ok(v) => Err(Error::file(&path, format!("not a JSON object: {v}"))),
        Err(e) => Err(Error::file(&path, format!("not JSON: {e}"))),
    }
}

/// The last record of a PyTorch baseline's `pytorch.jsonl` (the file is read as any
/// record file: [`read_small`]).
fn pytorch_record(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join(PYTORCH);
    let text = read_small(&path, RECORDS_LIMIT)?;
    let (i, line) = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .last()
        .ok_or_else(|| Error::file(&path, "empty: no record of the PyTorch baseline"))?;
    serde_json::from_str(line).map_err(|e| Error::file(&path, format!("line {}: not a JSON record: {e}", i + 1)))
}

/// What a sweep point read from the shared storage (`storage.json`), against its dataset's
/// size and epochs (run.json, or the PyTorch baseline's record); `None` where not measured
/// or the dataset's size is not recorded. A `storage.json` without a byte count is an
/// error naming it.
fn storage_read(dir: &Path) -> Result<Option<StorageRead>> {
    let Some(storage) = read_json(dir, "storage.json")? else { return Ok(None) };
    let bytes = storage["storage_bytes"].as_u64().ok_or_else(|| {
        Error::file(
            dir.join("storage.json"),
            format!("storage_bytes is {}: a count of bytes is a non-negative integer", storage["storage_bytes"]),
        )
    })?;
    let size = |r: &serde_json::Value| Some(r["samples"].as_u64()? as f64 * r["sample_bytes"].as_u64()? as f64);
    let found = match read_json(dir, "run.json")? {
        Some(r) => size(&r).zip(r["epochs"].as_u64()),
        None => {
            let p = pytorch_record(dir)?;
            // One untimed epoch and the timed ones, for each worker count tried.
            let tried = p["epoch_s_by_workers"].as_object().map_or(1, |m| m.len() as u64);
            size(&p).zip(p["epochs"].as_u64().map(|e| e.saturating_add(1).saturating_mul(tried)))
        }
    };
    Ok(found.map(|(data, epochs)| StorageRead { bytes, times_data: bytes as f64 / data.max(1.0), epochs }))
}

/// The scaling table of the runs' last epochs, per loader, by hosts then ranks (pure).
pub fn scaling(reports: &[EpochReport]) -> Vec<ScalingRow> {
    let mut last: Vec<&EpochReport> = Vec::new();
    for r in reports {
        match last.iter_mut().find(|l| l.run == r.run) {
            Some(l) if l.epoch < r.epoch => *l = r,
            Some(_) => {}
            None => last.push(r),
        }
    }
    last.sort_by(|a, b| (&a.loader, a.hosts, a.ranks, &a.run).cmp(&(&b.loader, b.hosts, b.ranks, &b.run)));
    let mut rows = Vec::new();
    for r in &last {
        let base = last.iter().find(|b| b.loader == r.loader).expect("r itself");
        let per_host = |x: &EpochReport| x.samples_per_s / x.hosts.max(1) as f64;
        rows.push(ScalingRow {
            kind: "scaling",
            loader: r.loader.clone(),
            hosts: r.hosts,
            ranks: r.ranks,
            samples_per_s: r.samples_per_s,
            efficiency: per_host(r) / per_host(base).max(1e-12),
            run: r.run.clone(),
            storage: None,
        });
    }
    rows
}

/// The loader a run measured: a sweep's `point.json` says; else run.json's exchange (the
/// broadcast baseline, or meshfeed).
fn loader_of(dir: &Path, config: Option<&serde_json::Value>) -> Result<String> {
    if let Some(loader) = read_json(dir, "point.json")?.and_then(|p| p["loader"].as_str().map(str::to_string)) {
        return Ok(loader);
    }
    Ok(match config.and_then(|r| r["exchange"].as_str()) {
        Some("broadcast") => "broadcast".into(),
        _ => "meshfeed".into(),
    })
}

/// Whether `dir` holds a meshfeed run's telemetry: its `run.json` or rank 0's file, of
/// whatever kind (reading them says what is wrong with them).
fn is_meshfeed_run(dir: &Path) -> bool {
    present(&dir.join("run.json")) || present(&dir.join("rank-0.jsonl"))
}

/// The runs under `dir`: itself when it holds telemetry (or a PyTorch baseline's record),
/// else its subdirectories that do.
fn runs(dir: &Path) -> Result<Vec<PathBuf>> {
    let has_telemetry = |d: &Path| is_meshfeed_run(d) || present(&d.join(PYTORCH));
    if has_telemetry(dir) {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| has_telemetry(p))
        .collect();
    found.sort();
    if found.is_empty() {
        return Err(Error::file(dir, "no telemetry here (rank-0.jsonl, from `meshfeed run --telemetry DIR`)"));
    }
    Ok(found)
}

/// The PyTorch baseline's record in a sweep point (`bench/torch_loader.py --out`).
const PYTORCH: &str = "pytorch.jsonl";

/// The report of a PyTorch baseline run: its best epoch, over the point's nodes; no
/// per-rank phases (the baseline has none), no verification.
fn read_pytorch(dir: &Path) -> Result<EpochReport> {
    let path = dir.join(PYTORCH);
    let v = pytorch_record(dir)?;
    let bad = |k: &str, what: &str| Error::file(&path, format!("{k} is {}: {what}", v[k]));
    let seconds = match v["epoch_s_best"].as_f64() {
        Some(s) if s.is_finite() && s > 0.0 => s,
        _ => return Err(bad("epoch_s_best", "an epoch takes a positive, finite number of seconds")),
    };
    let samples = v["samples_per_epoch"]
        .as_u64()
        .ok_or_else(|| bad("samples_per_epoch", "a count of samples is a non-negative integer"))?;
    let ranks = match v["ranks"].as_u64() {
        Some(r @ 1..) => r as usize,
        _ => return Err(bad("ranks", "a number of ranks is a positive integer")),
    };
    let point = read_json(dir, "point.json")?.unwrap_or_default();
    Ok(EpochReport {
        kind: "epoch",
        run: dir.display().to_string(),
        loader: "pytorch".into(),
        epoch: 0,
        ranks,
        hosts: point["nodes"].as_u64().unwrap_or(1).max(1) as usize,
        samples,
        samples_per_s: samples as f64 / seconds.max(1e-9),
        verified: None,
        seconds,
        what_if_s: seconds,
        skew: 1.0,
        phase_median_s: vec![],
        phase_max_s: vec![],
        stragglers: vec![],
        slow_hosts: vec![],
        rank_own_s: vec![],
    })
}

/// A run's telemetry, checked as a whole ([`read_run`]): its configuration (`run.json`,
/// where present), every epoch record, by epoch (each epoch's records in rank order, one
/// from every rank), and every window record (schema 2).
struct Telemetry {
    config: Option<serde_json::Value>,
    epochs: Vec<Vec<RankEpoch>>,
    windows: Vec<WindowSample>,
}

/// The rank files (`rank-<r>.jsonl`) in `dir`, by rank; a name of that shape that is no
/// rank's (`rank-01.jsonl`, `rank-x.jsonl`) is an error.
fn rank_files(dir: &Path) -> Result<BTreeMap<usize, PathBuf>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let Some(digits) = name.strip_prefix("rank-").and_then(|n| n.strip_suffix(".jsonl")) else { continue };
        match digits.parse::<usize>() {
            Ok(r) if r.to_string() == digits => {
                files.insert(r, path);
            }
            _ => {
                return Err(Error::file(
                    &path,
                    "not a rank's telemetry file (those are rank-<r>.jsonl, r a rank: 0, 1, ...)",
                ))
            }
        }
    }
    Ok(files)
}

/// Reads every rank's telemetry of a run and checks that it is one whole run: a file for
/// each of the run's ranks (run.json's `ranks`; without run.json, every rank up to the
/// highest file's) and for no other, each holding its own rank's records only (not a copy
/// of another rank's file), every record's times finite and non-negative and its counts
/// non-negative integers, and every epoch recorded by every rank. Anything else is an error
/// naming the file and what is wrong: the report of part of a run, or of one rank counted
/// twice, would look like a real run's.
fn read_run(dir: &Path) -> Result<Telemetry> {
    let config = read_json(dir, "run.json")?;
    let files = rank_files(dir)?;
    let ranks = match &config {
        Some(c) => match c["ranks"].as_u64().and_then(|r| usize::try_from(r).ok()) {
            Some(r @ 1..) => r,
            _ => {
                return Err(Error::file(
                    dir.join("run.json"),
                    format!("ranks is {}: a number of ranks is a positive integer", c["ranks"]),
                ))
            }
        },
        None => files.keys().next_back().map_or(0, |r| r + 1),
    };
    let says = match config {
        Some(_) => format!("run.json says the run had {ranks} rank(s)"),
        None => format!("without run.json, the rank files say the run had {ranks} rank(s)"),
    };
    if ranks == 0 {
        return Err(Error::file(dir, "no telemetry (rank-<r>.jsonl, from `meshfeed run --telemetry DIR`)"));
    }
    let missing: Vec<String> =
        (0..ranks).filter(|r| !files.contains_key(r)).take(4).map(|r| format!("rank-{r}.jsonl")).collect();
    if !missing.is_empty() {
        let n = ranks - files.range(..ranks).count();
        let more = if n > missing.len() { format!(" and {} more", n - missing.len()) } else { String::new() };
        return Err(Error::file(
            dir,
            format!(
                "{says}, but {}{more} {} missing: not a whole run (the report needs every rank's telemetry)",
                missing.join(", "),
                if n == 1 { "is" } else { "are" }
            ),
        ));
    }
    if let Some((&r, path)) = files.range(ranks..).next() {
        return Err(Error::file(path, format!("rank {r} is not one of the run's ranks: {says}")));
    }
    let mut by_epoch: BTreeMap<u64, Vec<RankEpoch>> = BTreeMap::new();
    let mut epochs_of: Vec<BTreeSet<u64>> = Vec::with_capacity(ranks);
    let mut windows = Vec::new();
    let mut hosts: Vec<String> = Vec::new();
    // An epoch record naming another number of ranks: reported once every file's own
    // records are checked (a copied file is named as such, not the files it makes too many
    // for).
    let mut disagrees = None;
    for (&rank, path) in &files {
        let (epochs, mine, disagree) = read_rank(path, rank, ranks, &says)?;
        disagrees = disagrees.or(disagree);
        // Windows name no host: their rank's epoch records do.
        let host = epochs.last().map(|e| e.host.clone()).unwrap_or_default();
        let index = hosts.iter().position(|h| *h == host).unwrap_or_else(|| {
            hosts.push(host);
            hosts.len() - 1
        });
        windows.extend(mine.into_iter().map(|w| WindowSample { host: index, ..w }));
        epochs_of.push(epochs.iter().map(|e| e.epoch).collect());
        for e in epochs {
            by_epoch.entry(e.epoch).or_default().push(e);
        }
    }
    if let Some(e) = disagrees {
        return Err(e);
    }
    // Every epoch, from every rank (the files are ranks 0..ranks, in order).
    for (epoch, records) in &by_epoch {
        if let Some(rank) = (0..ranks).find(|&r| !epochs_of[r].contains(epoch)) {
            return Err(Error::file(
                &files[&rank],
                format!(
                    "no record of epoch {epoch}, which {} of the run's {ranks} ranks recorded: the rank stopped \
                     early, or its file was cut or comes from another run (not a whole run)",
                    records.len()
                ),
            ));
        }
    }
    Ok(Telemetry { config, epochs: by_epoch.into_values().collect(), windows })
}

/// One rank's telemetry file, every record checked ([`read_run`]; `says` is where the
/// run's `ranks` comes from, for errors): its epoch records, in the order written, its
/// window records, and the error of its first epoch record that names another number of
/// ranks than `ranks`, if any (the caller decides when to report it).
fn read_rank(
    path: &Path,
    rank: usize,
    ranks: usize,
    says: &str,
) -> Result<(Vec<RankEpoch>, Vec<WindowSample>, Option<Error>)> {
    let text = read_small(path, RECORDS_LIMIT)?;
    let mut epochs = Vec::new();
    // Each epoch's record's line, and each window with its line.
    let mut lines: BTreeMap<u64, usize> = BTreeMap::new();
    let mut windows: Vec<(usize, WindowSample)> = Vec::new();
    let mut disagree = None;
    for (i, line) in text.lines().enumerate() {
        let bad = |why: String| Error::file(path, format!("line {}: {why}", i + 1));
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(format!("not a JSON record: {e}")))?;
        if !matches!(v["schema"].as_u64(), Some(1..=crate::telemetry::SCHEMA)) {
            return Err(bad(format!(
                "telemetry schema {} (this meshfeed reads 1 to {})",
                v["schema"],
                crate::telemetry::SCHEMA
            )));
        }
        let count =
            |k: &str| v[k].as_u64().ok_or_else(|| bad(format!("{k} is {}: a count is a non-negative integer", v[k])));
        let seconds = |k: &str, x: &serde_json::Value| match x.as_f64() {
            Some(s) if s.is_finite() && s >= 0.0 => Ok(s),
            _ => Err(bad(format!("{k} is {x}: a time is a finite, non-negative number of seconds"))),
        };
        let of = count("rank")?;
        if of != rank as u64 {
            return Err(bad(format!(
                "a record of rank {of} in rank {rank}'s file: a copy of another rank's file, or one of another run"
            )));
        }
        let mut phase = [0.0; 5];
        for (p, name) in PHASES.iter().enumerate() {
            phase[p] = seconds(&format!("phase_s.{name}"), &v["phase_s"][name])?;
        }
        let epoch = count("epoch")?;
        if v["kind"].as_str() == Some("window") {
            let sample = WindowSample {
                rank,
                host: 0,
                epoch,
                first_step: count("first_step")?,
                read_s: phase[1],
                cpu_s: OWN.iter().filter(|&&p| p != 1).map(|&p| phase[p]).sum(),
                exchange_s: phase[3],
                peer_wait_s: seconds("peer_wait_s", &v["peer_wait_s"])?,
                rows: count("rows")?,
                bytes_read: count("bytes_read")?,
                bytes_sent: count("bytes_sent")?,
                bytes_sent_off_host: count("bytes_sent_off_host")?,
            };
            windows.push((i, sample));
            continue;
        }
        match v.get("ranks") {
            Some(n) if n.as_u64() != Some(ranks as u64) && disagree.is_none() => {
                disagree = Some(bad(format!("the record says the run had {n} rank(s), but {says}")));
            }
            _ => {}
        }
        if let Some(first) = lines.insert(epoch, i + 1) {
            return Err(bad(format!(
                "a second record of epoch {epoch} (line {first} is the first): records of two runs in one file?"
            )));
        }
        epochs.push(RankEpoch {
            rank,
            host: v["host"].as_str().unwrap_or("?").to_string(),
            epoch,
            seconds: seconds("seconds", &v["seconds"])?,
            samples: count("samples")?,
            phase,
            wait: seconds("wait_s", &v["wait_s"])?,
            verified: v["verified"].as_bool(),
        });
    }
    if epochs.is_empty() {
        let why = if text.trim().is_empty() { "empty" } else { "only window records" };
        return Err(Error::file(
            path,
            format!("{why}, no epoch record: the rank's telemetry of no epoch (did the run stop before one ended?)"),
        ));
    }
    // Windows are written with their epoch's record, never without.
    if let Some((i, w)) = windows.iter().find(|(_, w)| !lines.contains_key(&w.epoch)) {
        return Err(Error::file(
            path,
            format!("line {}: a window of epoch {}, which this file has no epoch record of", i + 1, w.epoch),
        ));
    }
    Ok((epochs, windows.into_iter().map(|(_, w)| w).collect(), disagree))
}

/// A meshfeed run as the cost model sees it: `run.json`'s configuration, its hosts, its
/// epochs' times and its windows. `None` for runs without window records (schema 1) or
/// configuration (run.json).
fn model_run(name: &str, t: Telemetry, reports: &[EpochReport]) -> Option<model::Run> {
    if t.windows.is_empty() {
        return None;
    }
    let run = t.config.as_ref()?;
    let mine: Vec<&EpochReport> = reports.iter().filter(|r| r.run == name).collect();
    let first = mine.first()?;
    let samples = run["samples"].as_u64()?;
    let read: u64 = t.windows.iter().filter(|w| w.epoch == first.epoch).map(|w| w.bytes_read).sum();
    Some(model::Run {
        name: name.to_string(),
        nodes: first.hosts,
        ranks: first.ranks,
        samples,
        batch_size: run["batch_size"].as_u64()?,
        window_bytes: run["window_bytes"].as_u64()?,
        prefetch: run["prefetch"].as_u64()? as usize,
        sample_bytes: run["sample_bytes"].as_f64().unwrap_or(read as f64 / first.samples.max(1) as f64),
        epoch_s: mine.iter().map(|r| (r.epoch, r.seconds)).collect(),
        consumer: t
            .epochs
            .iter()
            .flatten()
            .map(|r| {
                let rows = t.windows.iter().filter(|w| w.rank == r.rank && w.epoch == r.epoch).map(|w| w.rows).sum();
                ((r.seconds - r.wait).max(0.0), rows)
            })
            .collect(),
        windows: t.windows,
    })
}

/// The cost model fitted to `runs` and its predictions as `args` asks (`None` without
/// `--predict`).
struct Model {
    calibration: Calibration,
    validation: Vec<Validation>,
    scenario: Scenario,
    predictions: Vec<Prediction>,
}

fn fit_and_predict(args: &PredictArgs, runs: &[model::Run]) -> Result<Option<Model>> {
    let Some(nodes) = &args.predict else { return Ok(None) };
    let mut calibration = model::fit(runs).ok_or_else(|| {
        Error::Config(
            "--predict: no meshfeed run with window records to fit the cost model to (telemetry from \
             `meshfeed run --telemetry DIR`, this version)"
                .into(),
        )
    })?;
    if let Some(b) = args.storage_bandwidth {
        calibration.storage_bytes_per_s = Some(b.0 as f64);
    }
    if let Some(b) = args.node_read_bandwidth {
        calibration.node_read_bytes_per_s = b.0 as f64;
    }
    if let Some(b) = args.link_bandwidth {
        calibration.inter_bytes_per_s = Some(b.0 as f64);
    }
    let base = runs.iter().max_by_key(|r| (r.ranks, r.nodes)).expect("fitted to at least one run");
    let scenario = Scenario {
        nodes: 1,
        ranks_per_node: args.ranks_per_node.unwrap_or(base.ranks.div_ceil(base.nodes.max(1))),
        samples: args.samples.unwrap_or(base.samples),
        sample_bytes: args.sample_bytes.map_or(base.sample_bytes, |b| b.0 as f64),
        batch_size: args.batch_size.unwrap_or(base.batch_size),
        window_bytes: args.window_bytes.map_or(base.window_bytes, |b| b.0),
        prefetch: base.prefetch,
        replicas: args.replicas,
    };
    let validation = model::validate(&calibration, runs);
    let predictions = model::predict(&calibration, &scenario, nodes);
    Ok(Some(Model { calibration, validation, scenario, predictions }))
}

/// The model's part of the report, for people.
fn print_model(m: &Model) {
    let c = &m.calibration;
    let rate = |b: Option<f64>, none: &str| b.map_or(none.to_string(), |b| format!("{:.1} MB/s", b / 1e6));
    crate::report::line("");
    crate::report::line(&format!(
        "cost model, fitted to {} run(s), {} window records: read {:.2} ms + bytes at {} a node (storage: {}), \
         own work {:.2} µs a row, spread {:.0}%; consumer {:.2} µs a row + {:.2} ns a byte; exchange {:.2} ms a window + {} a peer, {} on a host, {} a node's link",
        c.runs,
        c.windows,
        c.read_latency_s * 1e3,
        rate(Some(c.node_read_bytes_per_s), "?"),
        rate(c.storage_bytes_per_s, "not saturated"),
        c.cpu_s_per_row * 1e6,
        c.cv * 100.0,
        c.consume_s_per_row * 1e6,
        c.consume_s_per_byte * 1e9,
        c.overhead_s * 1e3,
        c.latency_s.map_or("? (one world size measured; default used)".into(), |l| format!("{:.1} µs", l * 1e6)),
        rate(c.intra_bytes_per_s, "not measured"),
        rate(c.inter_bytes_per_s, "not measured (no run crossed nodes)"),
    ));
    crate::report::line(&format!("    calibrated for --exchange auto: --exchange-costs {}", c.exchange_costs()));
    crate::report::line(&format!(
        "{:<40} {:>5} {:>5} {:>11} {:>11} {:>6}",
        "model vs measured (last epoch)", "nodes", "ranks", "measured_s", "predicted_s", "ratio"
    ));
    for v in &m.validation {
        crate::report::line(&format!(
            "{:<40} {:>5} {:>5} {:>11.3} {:>11.3} {:>6.2}",
            v.run, v.nodes, v.ranks, v.measured_s, v.predicted_s, v.ratio
        ));
    }
    let s = &m.scenario;
    crate::report::line(&format!(
        "prediction: {} samples of {:.0} B, batch {}, window {} B, {} rank(s) per node, each sample to {} rank(s)",
        s.samples, s.sample_bytes, s.batch_size, s.window_bytes, s.ranks_per_node, s.replicas
    ));
    crate::report::line(&format!(
        "{:>6} {:>7} {:>8} {:>10} {:>12} {:>10} {:>9} {:>9} {:>11} {:>6} {:>10}",
        "nodes",
        "ranks",
        "windows",
        "epoch_s",
        "samples/s",
        "efficiency",
        "read_s",
        "cpu_s",
        "exchange_s",
        "skew",
        "consume_s"
    ));
    for p in &m.predictions {
        crate::report::line(&format!(
            "{:>6} {:>7} {:>8} {:>10.3} {:>12.0} {:>10.2} {:>9.4} {:>9.4} {:>11.4} {:>5.0}% {:>10.4}{}",
            p.nodes,
            p.ranks,
            p.windows,
            p.epoch_s,
            p.samples_per_s,
            p.efficiency,
            p.read_s,
            p.cpu_s,
            p.exchange_s,
            p.skew_share * 100.0,
            p.consume_s,
            if p.consumer_bound { " consumer-bound" } else { "" }
        ));
    }
    crate::report::line(
        "    (per window: read_s, cpu_s: the slowest rank's; skew: the share of a window spent waiting for it; \
         consume_s: the consumer's)",
    );
}

/// `meshfeed report`.
pub fn run(args: ReportArgs) -> Result<()> {
    let mut reports = Vec::new();
    let mut measured = Vec::new();
    for dir in &args.dirs {
        for run in runs(dir)? {
            if !is_meshfeed_run(&run) {
                reports.push(read_pytorch(&run)?);
                continue;
            }
            let name = run.display().to_string();
            let telemetry = read_run(&run)?;
            let loader = loader_of(&run, telemetry.config.as_ref())?;
            let first = reports.len();
            for records in &telemetry.epochs {
                reports.push(analyse(&name, &loader, records));
            }
            if loader == "meshfeed" {
                measured.extend(model_run(&name, telemetry, &reports[first..]));
            }
        }
    }
    let mut table = scaling(&reports);
    for row in &mut table {
        row.storage = storage_read(Path::new(&row.run))?;
    }
    let model = fit_and_predict(&args.predict, &measured)?;
    if let Some(dir) = &args.plots {
        let written = plots(dir, &reports, &table, model.as_ref())?;
        crate::report::line_err(&format!("report: {} plot file(s) in {}", written.len(), dir.display()));
    }
    if args.json {
        for r in &reports {
            crate::report::line(&json(r)?);
        }
        for row in &table {
            crate::report::line(&json(row)?);
        }
        if let Some(m) = &model {
            crate::report::line(&json(&m.calibration)?);
            for v in &m.validation {
                crate::report::line(&json(v)?);
            }
            for p in &m.predictions {
                crate::report::line(&json(p)?);
            }
        }
        return Ok(());
    }
    crate::report::line(&format!(
        "{:<40} {:>5} {:>5} {:>9} {:>9} {:>6}  {}",
        "run",
        "epoch",
        "ranks",
        "epoch_s",
        "what-if_s",
        "skew",
        "phase s, median/max: plan read pack exchange assemble"
    ));
    for r in &reports {
        let phases: Vec<String> =
            r.phase_median_s.iter().zip(&r.phase_max_s).map(|((_, m), (_, x))| format!("{m:.3}/{x:.3}")).collect();
        crate::report::line(&format!(
            "{:<40} {:>5} {:>5} {:>9.3} {:>9.3} {:>5.2}x  {}",
            r.run,
            r.epoch,
            r.ranks,
            r.seconds,
            r.what_if_s,
            r.skew,
            phases.join(" ")
        ));
        for s in r.stragglers.iter().take(3) {
            crate::report::line(&format!(
                "    straggler: rank {} on {}: own work {:.3} s, {} {:.3} s (median {:.3} s)",
                s.rank, s.host, s.own_s, s.phase, s.phase_s, s.phase_median_s
            ));
        }
        if !r.slow_hosts.is_empty() {
            crate::report::line(&format!("    slowest host(s): {}", r.slow_hosts.join(", ")));
        }
        if r.verified == Some(false) {
            crate::report::line("    NOT VERIFIED: a sample was missing, repeated, out of order or wrong");
        }
    }
    crate::report::line("");
    crate::report::line(&format!(
        "{:<10} {:>5} {:>5} {:>12} {:>10}  {}",
        "loader",
        "nodes",
        "ranks",
        "samples/s",
        "efficiency",
        "run (last epoch; efficiency: per node, against the fewest nodes)"
    ));
    for row in &table {
        crate::report::line(&format!(
            "{:<10} {:>5} {:>5} {:>12.0} {:>10.2}  {}",
            row.loader, row.hosts, row.ranks, row.samples_per_s, row.efficiency, row.run
        ));
        if let Some(s) = &row.storage {
            crate::report::line(&format!(
                "    read from the shared storage: {:.1} MB, {:.2}× the data over {} epoch(s)",
                s.bytes as f64 / 1e6,
                s.times_data,
                s.epochs
            ));
        }
    }
    if let Some(m) = &model {
        print_model(m);
    }
    Ok(())
}

/// The report's plots, as PNG and SVG in `dir`.
fn plots(dir: &Path, reports: &[EpochReport], table: &[ScalingRow], model: Option<&Model>) -> Result<Vec<PathBuf>> {
    use crate::bench::plots::{save_bars, save_lines, Bars, Lines, Series};
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    // A run's directory name; a sweep point's id (loader-nodes-batch-window-transport)
    // shortened to loader, nodes and transport.
    let short = |run: &str| {
        let name = Path::new(run).file_name().map_or(run.to_string(), |n| n.to_string_lossy().into_owned());
        let parts: Vec<&str> = name.split('-').collect();
        match parts.len() {
            5.. => format!("{} {} {}", parts[0], parts[1], parts[parts.len() - 1]),
            _ => name,
        }
    };
    let mut written = Vec::new();
    // Throughput vs nodes, per loader (the best run at each node count).
    let mut loaders: Vec<&str> = table.iter().map(|r| r.loader.as_str()).collect();
    loaders.dedup();
    let series: Vec<Series> = loaders
        .iter()
        .map(|&loader| {
            let mut best: std::collections::BTreeMap<usize, f64> = Default::default();
            for r in table.iter().filter(|r| r.loader == loader) {
                let b = best.entry(r.hosts).or_insert(0.0);
                *b = b.max(r.samples_per_s);
            }
            Series { name: loader.to_string(), points: best.into_iter().map(|(h, v)| (h as f64, v)).collect() }
        })
        .collect();
    let chart = Lines {
        title: "throughput vs nodes".into(),
        x: "nodes",
        y: "samples/s",
        log_x: false,
        log_y: false,
        series: series.clone(),
    };
    written.extend(save_lines(dir, "throughput", &chart)?);
    // The model's curve beside the measured points, on log scales.
    if let Some(m) = model {
        let mut series = series;
        series.push(Series {
            name: "meshfeed, predicted".into(),
            points: m.predictions.iter().map(|p| (p.nodes as f64, p.samples_per_s)).collect(),
        });
        let chart = Lines {
            title: format!("predicted throughput vs nodes ({} ranks per node)", m.scenario.ranks_per_node),
            x: "nodes",
            y: "samples/s",
            log_x: true,
            log_y: true,
            series,
        };
        written.extend(save_lines(dir, "prediction", &chart)?);
    }
    // Time per phase of each run's last epoch: the slowest rank's, stacked; the epoch marked.
    let last: Vec<&EpochReport> = table
        .iter()
        .filter_map(|row| reports.iter().filter(|r| r.run == row.run).max_by_key(|r| r.epoch))
        .filter(|r| !r.phase_max_s.is_empty())
        .collect();
    let bars = Bars {
        title: "time per phase (slowest rank; last epoch)".into(),
        labels: last.iter().map(|r| short(&r.run)).collect(),
        stacks: last
            .iter()
            .map(|r| (r.phase_max_s.iter().map(|(p, s)| (p.to_string(), *s)).collect(), r.seconds))
            .collect(),
    };
    written.extend(save_bars(dir, "phases", &bars)?);
    // Each rank's own work, for the most skewed runs.
    let mut skewed: Vec<&&EpochReport> = last.iter().filter(|r| r.rank_own_s.len() > 1).collect();
    skewed.sort_by(|a, b| b.skew.total_cmp(&a.skew));
    let chart = Lines {
        title: "own work per rank (plan, read, pack, assemble; last epoch)".into(),
        x: "rank",
        y: "seconds",
        log_x: false,
        log_y: false,
        series: skewed
            .iter()
            .take(8)
            .map(|r| Series {
                name: short(&r.run),
                points: r.rank_own_s.iter().enumerate().map(|(i, s)| (i as f64, *s)).collect(),
            })
            .collect(),
    };
    written.extend(save_lines(dir, "skew", &chart)?);
    Ok(written)
}

/// One JSON line.
fn json<T: Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, host: &str, read: f64, exchange: f64) -> RankEpoch {
        RankEpoch {
            rank,
            host: host.into(),
            epoch: 0,
            seconds: 10.0,
            samples: 1000,
            phase: [0.1, read, 0.2, exchange, 0.3],
            wait: 0.0,
            verified: Some(true),
        }
    }

    #[test]
    fn the_slow_readers_are_named_with_their_host_and_phase() {
        // Ranks 2 and 3 (host b) read 4 s where the others read 1 s; everyone's exchange
        // waits for them.
        let records = [rank(0, "a", 1.0, 5.0), rank(1, "a", 1.0, 5.0), rank(2, "b", 4.0, 2.0), rank(3, "b", 4.2, 2.0)];
        let r = analyse("run", "meshfeed", &records);
        assert_eq!((r.ranks, r.seconds), (4, 10.0));
        assert_eq!(r.stragglers.iter().map(|s| (s.rank, s.phase)).collect::<Vec<_>>(), [(3, "read"), (2, "read")]);
        assert_eq!(r.slow_hosts, ["b"]);
        // Own work: 1.6 (a) and 4.6, 4.8 (b); median 3.1, max 4.8: the what-if saves 1.7 s.
        assert!((r.what_if_s - 8.3).abs() < 1e-9, "{}", r.what_if_s);
        assert!((r.skew - 4.8 / 3.1).abs() < 1e-9);
        assert_eq!(r.phase_max_s[1], ("read", 4.2));
    }

    #[test]
    fn even_ranks_have_no_stragglers() {
        let records = [rank(0, "a", 1.0, 5.0), rank(1, "a", 1.05, 5.0), rank(2, "b", 0.95, 5.0)];
        let r = analyse("run", "meshfeed", &records);
        assert!(r.stragglers.is_empty() && r.slow_hosts.is_empty());
        assert!((r.what_if_s - (10.0 - 0.05)).abs() < 1e-9);
        assert_eq!(median(vec![3.0, 1.0, 2.0, 10.0]), 2.5);
        assert_eq!((r.hosts, r.samples_per_s, r.verified), (2, 100.0, Some(true)));
    }

    #[test]
    fn scaling_compares_throughput_per_host_with_the_fewest_hosts() {
        let report = |run: &str, loader: &str, hosts: usize, epoch: u64, seconds: f64| {
            let records: Vec<RankEpoch> = (0..hosts * 2)
                .map(|r| RankEpoch { host: format!("n{}", r / 2), epoch, seconds, ..rank(r, "", 1.0, 1.0) })
                .collect();
            analyse(run, loader, &records)
        };
        let reports = [
            report("a", "meshfeed", 1, 0, 10.0),
            report("b", "meshfeed", 2, 0, 9.0),
            report("b", "meshfeed", 2, 1, 6.0), // the last epoch counts
            report("c", "broadcast", 1, 0, 10.0),
            report("d", "broadcast", 2, 0, 10.0),
        ];
        let rows = scaling(&reports);
        let got: Vec<(&str, usize, f64)> = rows.iter().map(|r| (r.loader.as_str(), r.hosts, r.efficiency)).collect();
        // meshfeed: 100 samples/s on 1 host, 1000/6 on 2: 83.3 per host, 0.83; broadcast
        // does not speed up: 0.5.
        assert_eq!(got[0], ("broadcast", 1, 1.0));
        assert_eq!((got[1].0, got[1].1), ("broadcast", 2));
        assert!((got[1].2 - 0.5).abs() < 1e-9);
        assert_eq!(got[2], ("meshfeed", 1, 1.0));
        assert!((got[3].2 - (1000.0 / 6.0 / 2.0) / 100.0).abs() < 1e-9, "{got:?}");
        assert!(rows.iter().all(|r| r.kind == "scaling") && rows.len() == 4);
    }
}
