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
//!
//! Reading checks that the records are one whole run ([`report`]); the cost model
//! ([`crate::model`]) is fitted to the meshfeed runs' windows. Nothing here prints: the
//! command line presents the [`Report`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use meshfeed::loader::Phase;
use meshfeed::telemetry::{self, EpochRecord, Record, RunInfo};
use meshfeed::{Error, Result};
use serde::Serialize;

use crate::input::{present, read_if_present, read_small, RECORDS_LIMIT, SMALL_LIMIT};
use crate::median;
use crate::model::{self, Calibration, Prediction, ReadPlan, Scenario, Validation, WindowSample};

/// The phases a rank's own work is made of: all but the exchange.
const OWN: [Phase; 4] = [Phase::Plan, Phase::Read, Phase::Fill, Phase::Assemble];

/// What to predict for (`meshfeed report --predict`): node counts, and where given, the
/// scenario and the machine's rates that replace those of the largest measured meshfeed
/// run and of the fit. Every count, size and rate is at least 1 (the command line checks).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PredictOptions {
    /// Node counts to predict at.
    pub nodes: Vec<usize>,
    pub ranks_per_node: Option<usize>,
    pub samples: Option<u64>,
    pub sample_bytes: Option<u64>,
    pub batch_size: Option<u64>,
    pub window_bytes: Option<u64>,
    /// Ranks that receive each sample (1: data parallel).
    pub replicas: usize,
    /// The storage's aggregate read bandwidth, one node's, and one node's network link,
    /// bytes/s.
    pub storage_bandwidth: Option<u64>,
    pub node_read_bandwidth: Option<u64>,
    pub link_bandwidth: Option<u64>,
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
    /// The epoch replayed step by step, where every rank recorded its steps (telemetry
    /// schema 3: a training job's loader, or `meshfeed run`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<crate::steps::StepReplay>,
}

/// A rank is a straggler when its own work exceeds the median's by a quarter, and by at
/// least 2% of the epoch and 10 ms (less is noise).
fn is_straggler(own: f64, median: f64, epoch: f64) -> bool {
    own > 1.25 * median && own - median > (0.02 * epoch).max(0.01)
}

/// The report of one epoch of `loader` from its ranks' records (pure).
pub fn analyse(run: &str, loader: &str, records: &[EpochRecord]) -> EpochReport {
    let seconds = records.iter().map(|r| r.seconds).fold(0.0, f64::max);
    let own: Vec<f64> = records.iter().map(|r| r.phase_s.own()).collect();
    let own_median = median(own.clone());
    let own_max = own.iter().copied().fold(0.0, f64::max);
    let phase_median: Vec<f64> =
        Phase::ALL.iter().map(|&p| median(records.iter().map(|r| r.phase_s.get(p)).collect())).collect();
    let phase_max: Vec<f64> =
        Phase::ALL.iter().map(|&p| records.iter().map(|r| r.phase_s.get(p)).fold(0.0, f64::max)).collect();
    let mut stragglers: Vec<Straggler> = records
        .iter()
        .filter(|r| is_straggler(r.phase_s.own(), own_median, seconds))
        .map(|r| {
            let excess = |p: Phase| r.phase_s.get(p) - phase_median[p as usize];
            let p = *OWN.iter().max_by(|&&a, &&b| excess(a).total_cmp(&excess(b))).expect("phases");
            Straggler {
                rank: r.rank,
                host: r.host.clone(),
                own_s: r.phase_s.own(),
                phase: p.name(),
                phase_s: r.phase_s.get(p),
                phase_median_s: phase_median[p as usize],
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
        phase_median_s: Phase::ALL.iter().map(|p| p.name()).zip(phase_median).collect(),
        phase_max_s: Phase::ALL.iter().map(|p| p.name()).zip(phase_max).collect(),
        stragglers,
        slow_hosts,
        rank_own_s: own,
        steps: None,
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
    let found = match RunInfo::read(dir)? {
        Some(r) => r.sample_bytes.map(|b| (r.samples as f64 * b as f64, r.epochs)),
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
fn loader_of(dir: &Path, config: Option<&RunInfo>) -> Result<String> {
    if let Some(loader) = read_json(dir, "point.json")?.and_then(|p| p["loader"].as_str().map(str::to_string)) {
        return Ok(loader);
    }
    Ok(match config.map(|r| r.exchange.as_str()) {
        Some("broadcast") => "broadcast".into(),
        _ => "meshfeed".into(),
    })
}

/// Whether `dir` holds a meshfeed run's telemetry: its `run.json` or rank 0's file, of
/// whatever kind (reading them says what is wrong with them).
fn is_meshfeed_run(dir: &Path) -> bool {
    present(&dir.join(telemetry::RUN_FILE)) || present(&dir.join(telemetry::rank_file_name(0)))
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
        steps: None,
    })
}

/// A run's telemetry, checked as a whole ([`read_run`]): its configuration (`run.json`,
/// where present), every epoch record, by epoch (each epoch's records in rank order, one
/// from every rank), and every window record (schema 2).
struct Telemetry {
    config: Option<RunInfo>,
    epochs: Vec<Vec<EpochRecord>>,
    windows: Vec<WindowSample>,
    /// The window records that list their steps (schema 3), by epoch and rank.
    step_windows: BTreeMap<(u64, usize), Vec<telemetry::WindowRecord>>,
}

/// The rank files (`rank-<r>.jsonl`) in `dir`, by rank; a name of that shape that is no
/// rank's (`rank-01.jsonl`, `rank-x.jsonl`) is an error.
fn rank_files(dir: &Path) -> Result<BTreeMap<usize, PathBuf>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let Some(digits) =
            name.strip_prefix(telemetry::RANK_FILE_PREFIX).and_then(|n| n.strip_suffix(telemetry::RANK_FILE_SUFFIX))
        else {
            continue;
        };
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
/// of another rank's file), every record of a schema this build reads, its times finite
/// and non-negative and its counts non-negative integers ([`Record::parse`]), and every
/// epoch recorded by every rank. Anything else is an error naming the file and what is
/// wrong: the report of part of a run, or of one rank counted twice, would look like a
/// real run's. An epoch the training loop ran again (it broke out of it, or sought back)
/// counts once, as its last run; the epoch a killed rank was in, whose finished windows
/// are on disk but whose record is not, is left out ([`read_rank`]).
fn read_run(dir: &Path) -> Result<Telemetry> {
    let config = RunInfo::read(dir)?;
    let files = rank_files(dir)?;
    let ranks = match &config {
        Some(c) => c.ranks,
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
        (0..ranks).filter(|r| !files.contains_key(r)).take(4).map(telemetry::rank_file_name).collect();
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
    let mut by_epoch: BTreeMap<u64, Vec<EpochRecord>> = BTreeMap::new();
    let mut epochs_of: Vec<BTreeSet<u64>> = Vec::with_capacity(ranks);
    let mut windows = Vec::new();
    let mut step_windows: BTreeMap<(u64, usize), Vec<telemetry::WindowRecord>> = BTreeMap::new();
    let mut hosts: Vec<String> = Vec::new();
    // An epoch record naming another number of ranks: reported once every file's own
    // records are checked (a copied file is named as such, not the files it makes too many
    // for).
    let mut disagrees = None;
    for (&rank, path) in &files {
        let (epochs, mine, stepped, disagree) = read_rank(path, rank, ranks, &says)?;
        for w in stepped {
            step_windows.entry((w.epoch, w.rank)).or_default().push(w);
        }
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
    Ok(Telemetry { config, epochs: by_epoch.into_values().collect(), windows, step_windows })
}

/// One rank's telemetry file, every record checked ([`read_run`]; `says` is where the
/// run's `ranks` comes from, for errors): its epoch records, in the order written, its
/// windows, those of its windows that list their steps, and the error of its first epoch
/// record that names another number of ranks than `ranks`, if any (the caller decides
/// when to report it).
fn read_rank(
    path: &Path,
    rank: usize,
    ranks: usize,
    says: &str,
) -> Result<(Vec<EpochRecord>, Vec<WindowSample>, Vec<telemetry::WindowRecord>, Option<Error>)> {
    let records = telemetry::read_rank_file(path)?;
    let empty = records.is_empty();
    let mut epochs = Vec::new();
    // Each epoch's record's line, and each window with its line.
    let mut lines: BTreeMap<u64, usize> = BTreeMap::new();
    let mut windows: Vec<(usize, WindowSample)> = Vec::new();
    let mut stepped = Vec::new();
    let mut disagree = None;
    for (line, record) in records {
        let bad = |why: String| Error::file(path, format!("line {line}: {why}"));
        let of = record.rank();
        if of != rank {
            return Err(bad(format!(
                "a record of rank {of} in rank {rank}'s file: a copy of another rank's file, or one of another run"
            )));
        }
        let e = match record {
            Record::Window(w) => {
                windows.push((line, WindowSample::of(&w)));
                if !w.step_compute_s.is_empty() {
                    stepped.push((line, w));
                }
                continue;
            }
            Record::Epoch(e) => e,
        };
        // A record that does not say (schema 1 could leave it out) disagrees with nothing.
        match e.ranks {
            Some(n) if n != ranks && disagree.is_none() => {
                disagree = Some(bad(format!("the record says the run had {n} rank(s), but {says}")));
            }
            _ => {}
        }
        if let Some(first) = lines.insert(e.epoch, line) {
            // The loop went back and ran the epoch again (it broke out of it, or sought
            // back): the last run of it counts, and the record and windows of the one
            // before are left out (its windows came before its record).
            epochs.retain(|x: &EpochRecord| x.epoch != e.epoch);
            windows.retain(|(l, w)| w.epoch != e.epoch || *l > first);
            stepped.retain(|(l, w)| w.epoch != e.epoch || *l > first);
        }
        epochs.push(e);
    }
    if epochs.is_empty() {
        let why = if empty { "empty" } else { "only window records" };
        return Err(Error::file(
            path,
            format!("{why}, no epoch record: the rank's telemetry of no epoch (did the run stop before one ended?)"),
        ));
    }
    // Each window is written when it is finished and its epoch's record once the epoch
    // ends: windows after the last epoch record without one of their own are of an epoch
    // the rank never finished (it was killed), and are left out with it. Anywhere else a
    // window needs its epoch's record.
    let last = lines.values().copied().max().unwrap_or(0);
    let cut = |line: usize, epoch: u64| line > last && !lines.contains_key(&epoch);
    if let Some((line, w)) = windows.iter().find(|(line, w)| !lines.contains_key(&w.epoch) && !cut(*line, w.epoch)) {
        return Err(Error::file(
            path,
            format!("line {line}: a window of epoch {}, which this file has no epoch record of", w.epoch),
        ));
    }
    let windows = windows.into_iter().filter(|(line, w)| !cut(*line, w.epoch)).map(|(_, w)| w).collect();
    let stepped = stepped.into_iter().filter(|(_, w)| lines.contains_key(&w.epoch)).map(|(_, w)| w).collect();
    Ok((epochs, windows, stepped, disagree))
}

/// The epoch of `records` (one per rank, in rank order) replayed step by step from the
/// windows that list their steps ([`crate::steps`], by epoch and rank), where every rank
/// has some.
fn replay_steps(
    windows: &BTreeMap<(u64, usize), Vec<telemetry::WindowRecord>>,
    records: &[EpochRecord],
) -> Option<crate::steps::StepReplay> {
    let ranks: Vec<(String, Vec<(u64, crate::steps::StepWork)>)> = records
        .iter()
        .map(|e| {
            let mine: Vec<&telemetry::WindowRecord> = windows.get(&(e.epoch, e.rank)).into_iter().flatten().collect();
            (e.host.clone(), crate::steps::rank_steps(&mine))
        })
        .collect();
    crate::steps::replay(&ranks)
}

/// A meshfeed run as the cost model sees it: `run.json`'s configuration (its read plan
/// among it), its hosts, its epochs' times and its windows. `None` for runs without window
/// records (schema 1) or configuration (run.json).
fn model_run(name: &str, t: Telemetry, reports: &[EpochReport]) -> Option<model::Run> {
    if t.windows.is_empty() {
        return None;
    }
    let run = t.config.as_ref()?;
    let mine: Vec<&EpochReport> = reports.iter().filter(|r| r.run == name).collect();
    let first = mine.first()?;
    let read: u64 = t.windows.iter().filter(|w| w.epoch == first.epoch).map(|w| w.bytes_read).sum();
    Some(model::Run {
        name: name.to_string(),
        nodes: first.hosts,
        ranks: first.ranks,
        samples: run.samples,
        batch_size: run.batch_size,
        window_bytes: run.window_bytes,
        prefetch: run.prefetch,
        sample_bytes: run.sample_bytes.map_or(read as f64 / first.samples.max(1) as f64, |b| b as f64),
        reads: run.read_plan.as_ref().map_or(ReadPlan::EVERY_EPOCH, |p| ReadPlan::of(p, run.samples)),
        shares_stores: run.shares_stores.unwrap_or(false),
        epoch_s: mine.iter().map(|r| (r.epoch, r.seconds)).collect(),
        consumer: t
            .epochs
            .iter()
            .flatten()
            .map(|r| {
                let rows = t.windows.iter().filter(|w| w.rank == r.rank && w.epoch == r.epoch).map(|w| w.rows).sum();
                ((r.seconds - r.wait_s).max(0.0), rows)
            })
            .collect(),
        windows: t.windows,
    })
}

/// The cost model fitted to the measured runs, checked against them, and its predictions
/// (`meshfeed report --predict`).
#[derive(Clone, Debug, PartialEq)]
pub struct Model {
    pub calibration: Calibration,
    pub validation: Vec<Validation>,
    pub scenario: Scenario,
    pub predictions: Vec<Prediction>,
}

/// Fits the model to `runs` and predicts as `args` asks; an error where no run has window
/// records to fit to.
pub fn fit_and_predict(args: &PredictOptions, runs: &[model::Run]) -> Result<Model> {
    let mut calibration = model::fit(runs).ok_or_else(|| {
        Error::Config(
            "--predict: no meshfeed run with window records to fit the cost model to (telemetry from \
             `meshfeed run --telemetry DIR`, this version)"
                .into(),
        )
    })?;
    if let Some(b) = args.storage_bandwidth {
        calibration.storage_bytes_per_s = Some(b as f64);
    }
    if let Some(b) = args.node_read_bandwidth {
        calibration.node_read_bytes_per_s = b as f64;
    }
    if let Some(b) = args.link_bandwidth {
        calibration.inter_bytes_per_s = Some(b as f64);
    }
    let base = runs.iter().max_by_key(|r| (r.ranks, r.nodes)).expect("fitted to at least one run");
    let scenario = Scenario {
        nodes: 1,
        ranks_per_node: args.ranks_per_node.unwrap_or(base.ranks.div_ceil(base.nodes.max(1))),
        samples: args.samples.unwrap_or(base.samples),
        sample_bytes: args.sample_bytes.map_or(base.sample_bytes, |b| b as f64),
        batch_size: args.batch_size.unwrap_or(base.batch_size),
        window_bytes: args.window_bytes.unwrap_or(base.window_bytes),
        prefetch: base.prefetch,
        replicas: args.replicas.max(1),
        reads: base.reads,
        shares_stores: base.shares_stores,
    };
    let validation = model::validate(&calibration, runs);
    let predictions = model::predict(&calibration, &scenario, &args.nodes);
    Ok(Model { calibration, validation, scenario, predictions })
}

/// What `meshfeed report` says about some runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Each epoch of each run, in the order of the runs.
    pub epochs: Vec<EpochReport>,
    /// The runs' last epochs, per loader, by hosts then ranks.
    pub scaling: Vec<ScalingRow>,
    /// The cost model, where asked for.
    pub model: Option<Model>,
}

/// The report of the runs under `dirs` (each a run's telemetry, a PyTorch baseline's
/// record, or a directory of them: a sweep's results), with the cost model fitted to the
/// meshfeed runs and predicting as `predict` says, where given.
pub fn report(dirs: &[PathBuf], predict: Option<&PredictOptions>) -> Result<Report> {
    let mut reports = Vec::new();
    let mut measured = Vec::new();
    for dir in dirs {
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
                let mut r = analyse(&name, &loader, records);
                r.steps = replay_steps(&telemetry.step_windows, records);
                reports.push(r);
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
    let model = predict.map(|p| fit_and_predict(p, &measured)).transpose()?;
    Ok(Report { epochs: reports, scaling: table, model })
}

/// The report's plots, as PNG and SVG in `dir` (created if missing): throughput vs nodes
/// per loader (and the model's prediction beside it), time per phase per run, and each
/// rank's own work per run (skew). Returns the files written.
pub fn plots(dir: &Path, report: &Report) -> Result<Vec<PathBuf>> {
    use crate::bench::plots::{save_bars, save_lines, Bars, Lines, Series};
    let (reports, table, model) = (&report.epochs, &report.scaling, report.model.as_ref());
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
        title: "own work per rank (plan, read, fill, assemble; last epoch)".into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, host: &str, read: f64, exchange: f64) -> EpochRecord {
        EpochRecord {
            rank,
            host: host.into(),
            epoch: 0,
            seconds: 10.0,
            samples: 1000,
            phase_s: telemetry::Phases { plan: 0.1, read, fill: 0.2, exchange, assemble: 0.3 },
            verified: Some(true),
            ..EpochRecord::default()
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
            let records: Vec<EpochRecord> = (0..hosts * 2)
                .map(|r| EpochRecord { host: format!("n{}", r / 2), epoch, seconds, ..rank(r, "", 1.0, 1.0) })
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
