//! The cost model of `meshfeed report --predict`: fitted to the windows of measured runs
//! (telemetry schema 2, [`meshfeed::telemetry`]), it predicts an epoch's time, throughput and scaling efficiency on
//! more nodes than were measured. Pure: the report reads the telemetry, this fits and
//! predicts.
//!
//! One window on one rank costs (all fitted constants in brackets):
//!
//! * **read**: `[read latency] + bytes read / per-rank read bandwidth`, where the per-rank
//!   bandwidth is `min([node read bandwidth] / ranks per node, [storage bandwidth] / ranks)`:
//!   a node's link to the shared storage, or the storage itself, whichever is the limit.
//!   The bytes read depend on the run's read strategy ([`ReadPlan`], from the read plan
//!   `run.json` records): a `resident` run streams its data once, in the first epoch, and
//!   later epochs read nothing (no read term at all); `passes` read it K times every epoch;
//!   `random` reads every epoch what it does not keep. What a rank reads from the rows kept
//!   in memory costs `[kept read per byte] × bytes it delivers` instead (fitted to the
//!   windows that read nothing from storage: a resident run's later epochs).
//! * **own work** besides reading (planning, packing, assembling): `[cpu per row] × rows`.
//! * **the slowest rank**: a window is collective, so it waits for the slowest rank's own
//!   work. With own work spread like a normal variable of coefficient of variation `[cv]`
//!   over `P` ranks, the slowest is about `mean × (1 + cv·√(2 ln P))`.
//! * **exchange** (its exposed part, peer waiting excluded): `[overhead] + [latency] ×
//!   (P − 1) + on-host bytes / [intra bandwidth] + the node's off-host bytes / [inter
//!   bandwidth]`: a fixed cost per window, peers, shared memory, and the node's network
//!   link shared by its ranks: [`meshfeed::plan::cost::all_to_all_seconds`], the function
//!   `--exchange auto` weighs fused against two-phase with, on these fitted constants
//!   ([`meshfeed::config::ExchangeCosts`]). Where a node's ranks copy each other's kept
//!   rows (`--local-reads`, recorded in `run.json`), those rows are not exchanged on the
//!   node, and a resident run exchanges with other nodes' ranks only.
//! * **the consumer** (the training step; `meshfeed run`'s verification, dump or
//!   `--compute-ms`): `[consume per row] × rows + [consume per byte] × bytes`, its time
//!   not waiting for batches.
//!
//! A window takes the slowest rank's own work plus the exchange, or the consumer's time,
//! whichever is longer (the producer runs ahead of the consumer); an epoch, its windows.
//! Read and exchange bandwidths are fitted by least squares with non-negative
//! coefficients; a constant the measurements cannot tell (no run crossed hosts, the
//! storage never saturated) is reported as unknown and left out (or given on the command
//! line).

use serde::Serialize;

use meshfeed::config::ExchangeCosts;
use meshfeed::plan::budget::{bookkeeping_per_step, WindowBudget};
use meshfeed::plan::cost::all_to_all_seconds;
use meshfeed::plan::{IoPlan, Strategy};

use crate::median;

/// What an epoch reads from storage, as a multiple of the bytes it delivers: the first
/// epoch, and every later one (the read strategy, as the model weighs it).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ReadPlan {
    pub first: f64,
    pub later: f64,
}

impl Default for ReadPlan {
    fn default() -> ReadPlan {
        ReadPlan::EVERY_EPOCH
    }
}

impl ReadPlan {
    /// Every epoch reads its rows from storage (a `random` plan that keeps nothing; runs
    /// that recorded no read plan).
    pub const EVERY_EPOCH: ReadPlan = ReadPlan { first: 1.0, later: 1.0 };
    /// The data is streamed once, in the first epoch, and kept: later epochs read nothing.
    pub const RESIDENT: ReadPlan = ReadPlan { first: 1.0, later: 0.0 };

    /// The reads of a run's read plan, for a dataset of `samples` samples: `resident`
    /// reads once; `passes` K times each epoch; `random` keeps its resident rows (read in
    /// the first epoch) and reads the rest every epoch — from the spill directory after
    /// the first where there is one, counted at the storage's rate, which overstates a
    /// faster local disk. Passes over a spill directory read the data once in the first
    /// epoch and K times from the spill files after, counted the same way.
    pub fn of(plan: &IoPlan, samples: u64) -> ReadPlan {
        match plan.strategy {
            Strategy::Resident => ReadPlan::RESIDENT,
            Strategy::Passes { passes } if plan.spill => ReadPlan { first: 1.0, later: passes.max(1) as f64 },
            Strategy::Passes { passes } => ReadPlan { first: passes.max(1) as f64, later: passes.max(1) as f64 },
            Strategy::Random => {
                let kept = (plan.resident.iter().sum::<u64>() as f64 / samples.max(1) as f64).clamp(0.0, 1.0);
                ReadPlan { first: 1.0, later: 1.0 - kept }
            }
        }
    }

    /// The share of the rows delivered that come from rows kept in memory (every epoch:
    /// a resident run's first epoch streams its rows into memory before sending them).
    pub fn kept(&self) -> f64 {
        (1.0 - self.later).clamp(0.0, 1.0)
    }

    /// The factor of epoch `epoch`.
    pub fn factor(&self, epoch: u64) -> f64 {
        if epoch == 0 {
            self.first
        } else {
            self.later
        }
    }
}

/// One rank's record of one window, as the model reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowSample {
    pub rank: usize,
    /// Index of the rank's host in its run.
    pub host: usize,
    pub epoch: u64,
    pub first_step: u64,
    pub read_s: f64,
    /// Planning, packing and assembling.
    pub cpu_s: f64,
    pub exchange_s: f64,
    pub peer_wait_s: f64,
    pub rows: u64,
    pub bytes_read: u64,
    pub bytes_sent: u64,
    pub bytes_sent_off_host: u64,
    pub bytes_received: u64,
}

impl WindowSample {
    /// The bytes this rank moved to and from ranks of its own host, the on-host argument
    /// of [`all_to_all_seconds`]: its sends less those off the host, and its receipts less
    /// the share from off the host, taken as that of its sends (a window records which
    /// sends left the host, not which receipts came from off it; on one host both are 0).
    pub fn on_host_bytes(&self) -> f64 {
        let sent_on = self.bytes_sent.saturating_sub(self.bytes_sent_off_host) as f64;
        let off_share =
            if self.bytes_sent > 0 { self.bytes_sent_off_host as f64 / self.bytes_sent as f64 } else { 0.0 };
        sent_on + self.bytes_received as f64 * (1.0 - off_share)
    }

    /// The model's view of a window's record (host 0: the run's reader numbers the hosts).
    pub fn of(w: &meshfeed::telemetry::WindowRecord) -> WindowSample {
        let p = &w.phase_s;
        WindowSample {
            rank: w.rank,
            host: 0,
            epoch: w.epoch,
            first_step: w.first_step,
            read_s: p.read,
            cpu_s: p.plan + p.fill + p.assemble,
            exchange_s: p.exchange,
            peer_wait_s: w.peer_wait_s,
            rows: w.rows,
            bytes_read: w.bytes_read,
            bytes_sent: w.bytes_sent,
            bytes_sent_off_host: w.bytes_sent_off_host,
            bytes_received: w.bytes_received,
        }
    }
}

/// A measured run: its shape and its windows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    pub name: String,
    pub nodes: usize,
    pub ranks: usize,
    pub samples: u64,
    pub batch_size: u64,
    pub window_bytes: u64,
    pub prefetch: usize,
    pub sample_bytes: f64,
    /// What its epochs read ([`ReadPlan::of`] its recorded read plan).
    pub reads: ReadPlan,
    /// Same-host ranks copied each other's kept rows rather than exchange them.
    pub shares_stores: bool,
    /// Each epoch's time (the slowest rank's), by epoch.
    pub epoch_s: Vec<(u64, f64)>,
    /// Per rank and epoch: the consumer's time not waiting for batches, and the rows it
    /// took.
    pub consumer: Vec<(f64, u64)>,
    pub windows: Vec<WindowSample>,
}

impl Run {
    fn ranks_per_node(&self) -> usize {
        self.ranks.div_ceil(self.nodes.max(1)).max(1)
    }
}

/// The fitted constants.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Calibration {
    pub kind: &'static str,
    /// Runs and window records the fit used.
    pub runs: usize,
    pub windows: usize,
    pub read_latency_s: f64,
    /// Bytes per second one node reads from the storage (its ranks together).
    pub node_read_bytes_per_s: f64,
    /// The storage's own limit (all nodes together), where the measurements reached it.
    pub storage_bytes_per_s: Option<f64>,
    pub cpu_s_per_row: f64,
    /// The read phase's time per byte a rank delivers from rows kept in memory (fitted to
    /// windows that read nothing from storage; 0 where no run had one).
    pub kept_read_s_per_byte: f64,
    /// Exchange cost per window, whatever the world size.
    pub overhead_s: f64,
    /// Exchange cost per peer (`None`: the runs that exchanged all had one world size,
    /// which cannot tell it from the overhead).
    pub latency_s: Option<f64>,
    /// On-host exchange bandwidth of one rank.
    pub intra_bytes_per_s: Option<f64>,
    /// Off-host exchange bandwidth of one node (its ranks share it).
    pub inter_bytes_per_s: Option<f64>,
    /// Spread of the ranks' own work in a window (standard deviation over mean).
    pub cv: f64,
    /// The consumer's time per row it takes, and per byte of those rows.
    pub consume_s_per_row: f64,
    pub consume_s_per_byte: f64,
}

impl Calibration {
    /// The exchange constants, as `--exchange-costs` takes them (unknown ones: the
    /// defaults).
    pub fn exchange_costs(&self) -> ExchangeCosts {
        let d = ExchangeCosts::default();
        ExchangeCosts {
            latency_ns: self.latency_s.map_or(d.latency_ns, |l| (l * 1e9).round() as u64),
            intra_bytes_per_s: self.intra_bytes_per_s.map_or(d.intra_bytes_per_s, |b| b as u64),
            inter_bytes_per_s: self.inter_bytes_per_s.map_or(d.inter_bytes_per_s, |b| b as u64),
        }
    }
}

/// What to predict: a dataset, a loader configuration and a machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub nodes: usize,
    pub ranks_per_node: usize,
    pub samples: u64,
    pub sample_bytes: f64,
    pub batch_size: u64,
    pub window_bytes: u64,
    pub prefetch: usize,
    /// Ranks that receive each sample (1: data parallel; a mesh that replicates the batch
    /// over a tensor-parallel axis of size T: T).
    pub replicas: usize,
    /// What its epochs read from storage.
    pub reads: ReadPlan,
    /// Same-host ranks copy each other's kept rows rather than exchange them (`--local-reads`).
    pub shares_stores: bool,
}

/// The peers a rank exchanges with, of `ranks` ranks, `per_node` a node: all but itself,
/// or only those on other nodes where a node's ranks share every row they keep.
fn peers(ranks: usize, per_node: usize, shared: bool) -> usize {
    if shared {
        ranks.saturating_sub(per_node.max(1))
    } else {
        ranks.saturating_sub(1)
    }
}

/// The model's answer for one scenario.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub kind: &'static str,
    pub nodes: usize,
    pub ranks: usize,
    pub windows: u64,
    pub steps_per_window: u64,
    /// A later epoch's time (the steady state: what throughput and efficiency are of), and
    /// the first epoch's (which differs where the read strategy keeps the data).
    pub epoch_s: f64,
    pub first_epoch_s: f64,
    pub samples_per_s: f64,
    /// Throughput per node over the first scenario's (the fewest nodes).
    pub efficiency: f64,
    /// Per window of a later epoch: the slowest rank's read and other own work, and the
    /// exchange.
    pub read_s: f64,
    pub cpu_s: f64,
    pub exchange_s: f64,
    /// The share of a window spent waiting for the slowest rank.
    pub skew_share: f64,
    /// The consumer's time per window; where it exceeds the loader's, the consumer sets the
    /// pace.
    pub consume_s: f64,
    pub consumer_bound: bool,
}

/// Least squares with non-negative coefficients, for a few features: the best of the
/// unconstrained fits over every subset of features whose coefficients are all
/// non-negative (features left out get 0). `None` if no subset can be solved.
pub fn nonneg_least_squares(x: &[Vec<f64>], y: &[f64]) -> Option<Vec<f64>> {
    let k = x.first()?.len();
    let mut best: Option<(f64, Vec<f64>)> = None;
    for mask in 1u32..(1 << k) {
        let cols: Vec<usize> = (0..k).filter(|&j| mask & (1 << j) != 0).collect();
        let Some(c) = solve_normal(x, y, &cols) else { continue };
        if c.iter().any(|&v| v < 0.0) {
            continue;
        }
        let mut coef = vec![0.0; k];
        for (&j, &v) in cols.iter().zip(&c) {
            coef[j] = v;
        }
        let sse: f64 = x
            .iter()
            .zip(y)
            .map(|(row, &yi)| (yi - row.iter().zip(&coef).map(|(a, b)| a * b).sum::<f64>()).powi(2))
            .sum();
        // Prefer fewer features unless more fit clearly better.
        if best.as_ref().is_none_or(|(b, _)| sse < b * (1.0 - 1e-9)) {
            best = Some((sse, coef));
        }
    }
    best.map(|(_, c)| c)
}

/// The least-squares coefficients of columns `cols` (normal equations, Gaussian
/// elimination with partial pivoting); `None` when they are not determined.
fn solve_normal(x: &[Vec<f64>], y: &[f64], cols: &[usize]) -> Option<Vec<f64>> {
    let n = cols.len();
    // Scale columns so that bytes and counts are comparable.
    let scale: Vec<f64> = cols.iter().map(|&j| x.iter().map(|r| r[j].abs()).fold(0.0, f64::max)).collect();
    if scale.contains(&0.0) {
        return None;
    }
    let mut a = vec![vec![0.0; n + 1]; n];
    for (row, &yi) in x.iter().zip(y) {
        for i in 0..n {
            let xi = row[cols[i]] / scale[i];
            for j in 0..n {
                a[i][j] += xi * row[cols[j]] / scale[j];
            }
            a[i][n] += xi * yi;
        }
    }
    for c in 0..n {
        let p = (c..n).max_by(|&i, &j| a[i][c].abs().total_cmp(&a[j][c].abs()))?;
        a.swap(c, p);
        let diag: f64 = a[c][c];
        let norm: f64 = a[c][..n].iter().map(|v| v.abs()).fold(0.0, f64::max);
        if diag.abs() <= 1e-9 * norm.max(1e-300) || diag == 0.0 {
            return None;
        }
        for r in 0..n {
            if r != c {
                let f = a[r][c] / diag;
                let pivot = a[c].clone();
                for (x, p) in a[r][c..=n].iter_mut().zip(&pivot[c..=n]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i] / scale[i]).collect())
}

/// Fits the model to measured runs (meshfeed's, with window records). `None` when they
/// hold no window that read anything.
pub fn fit(runs: &[Run]) -> Option<Calibration> {
    let runs: Vec<&Run> = runs.iter().filter(|r| r.windows.iter().any(|w| w.bytes_read > 0)).collect();
    if runs.is_empty() {
        return None;
    }
    // Reading: per run, each rank's bandwidth (and, where windows differ in size enough to
    // tell, a latency per window).
    let mut latencies = Vec::new();
    let mut per_node: Vec<(usize, f64, f64)> = Vec::new(); // (nodes, node rate, aggregate)
    for run in &runs {
        let reads: Vec<&WindowSample> = run.windows.iter().filter(|w| w.bytes_read > 0).collect();
        let x: Vec<Vec<f64>> = reads.iter().map(|w| vec![1.0, w.bytes_read as f64]).collect();
        let y: Vec<f64> = reads.iter().map(|w| w.read_s).collect();
        let bytes: Vec<f64> = reads.iter().map(|w| w.bytes_read as f64).collect();
        let mean = bytes.iter().sum::<f64>() / bytes.len() as f64;
        let spread = (bytes.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / bytes.len() as f64).sqrt() / mean;
        let latency = match nonneg_least_squares(&x, &y) {
            Some(c) if spread > 0.1 => c[0],
            _ => 0.0,
        };
        latencies.push(latency);
        // Each rank's rate with the latency taken out, then the median rank's.
        let mut by_rank: std::collections::BTreeMap<usize, (f64, f64)> = Default::default();
        for w in &reads {
            let e = by_rank.entry(w.rank).or_default();
            e.0 += w.bytes_read as f64;
            e.1 += (w.read_s - latency).max(1e-9);
        }
        let rate = median(by_rank.values().map(|(b, t)| b / t).collect());
        let rpn = run.ranks_per_node() as f64;
        per_node.push((run.nodes, rate * rpn, rate * run.ranks as f64));
    }
    let fewest = per_node.iter().map(|p| p.0).min().unwrap_or(1);
    let most = per_node.iter().map(|p| p.0).max().unwrap_or(1);
    let node_rate = median(per_node.iter().filter(|p| p.0 == fewest).map(|p| p.1).collect());
    let node_rate_most = median(per_node.iter().filter(|p| p.0 == most).map(|p| p.1).collect());
    // The storage is the limit only if adding nodes clearly stopped adding bandwidth.
    let storage =
        (most > fewest && node_rate_most < 0.75 * node_rate).then(|| per_node.iter().map(|p| p.2).fold(0.0, f64::max));

    // Own work besides reading, per row delivered.
    let all: Vec<(&Run, &WindowSample)> = runs.iter().flat_map(|r| r.windows.iter().map(move |w| (*r, w))).collect();
    let rows: u64 = all.iter().map(|(_, w)| w.rows).sum();
    let cpu_s_per_row = all.iter().map(|(_, w)| w.cpu_s).sum::<f64>() / rows.max(1) as f64;
    // Reading kept rows (from memory: the rank's own, or its host's where ranks read each
    // other's), per byte delivered, where a window read nothing from storage.
    let kept: Vec<(f64, f64)> = all
        .iter()
        .filter(|(_, w)| w.bytes_read == 0 && w.rows > 0)
        .map(|(r, w)| (w.read_s, w.rows as f64 * r.sample_bytes))
        .collect();
    let kept_bytes: f64 = kept.iter().map(|k| k.1).sum();
    let kept_read_s_per_byte = if kept_bytes > 0.0 { kept.iter().map(|k| k.0).sum::<f64>() / kept_bytes } else { 0.0 };

    // The exchange: the exposed time less peer waiting, over peers, on-host bytes and the
    // node's off-host bytes in the same window.
    let mut node_off: std::collections::HashMap<(usize, usize, u64, u64), u64> = Default::default();
    for (i, run) in runs.iter().enumerate() {
        for w in &run.windows {
            *node_off.entry((i, w.host, w.epoch, w.first_step)).or_default() += w.bytes_sent_off_host;
        }
    }
    let mut x = Vec::new();
    let mut y = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        for w in run.windows.iter().filter(|w| w.bytes_sent > 0) {
            let off = node_off[&(i, w.host, w.epoch, w.first_step)] as f64;
            let shared = run.shares_stores && run.reads.kept() >= 1.0;
            let peers = peers(run.ranks, run.ranks_per_node(), shared) as f64;
            x.push(vec![1.0, peers, w.on_host_bytes(), off]);
            y.push((w.exchange_s - w.peer_wait_s).max(0.0));
        }
    }
    let coef = nonneg_least_squares(&x, &y).unwrap_or_else(|| vec![0.0; 4]);
    let sizes = x.iter().map(|r| r[1]).fold((f64::MAX, 0.0f64), |(lo, hi), p| (lo.min(p), hi.max(p)));
    let crossed = x.iter().any(|r| r[3] > 0.0);
    let bandwidth = |c: f64| (c > 0.0).then(|| 1.0 / c);

    // The consumer: its busy time over the rows it took and their bytes.
    let (x, y): (Vec<Vec<f64>>, Vec<f64>) = runs
        .iter()
        .flat_map(|r| {
            r.consumer.iter().map(move |&(busy, rows)| (vec![rows as f64, rows as f64 * r.sample_bytes], busy))
        })
        .unzip();
    let consume = nonneg_least_squares(&x, &y).unwrap_or_else(|| vec![0.0; 2]);

    // The spread of own work between the ranks of each window.
    let mut groups: std::collections::HashMap<(usize, u64, u64), Vec<f64>> = Default::default();
    for (i, run) in runs.iter().enumerate() {
        for w in &run.windows {
            groups.entry((i, w.epoch, w.first_step)).or_default().push(w.read_s + w.cpu_s);
        }
    }
    let cvs: Vec<f64> = groups
        .values()
        .filter(|v| v.len() > 1)
        .filter_map(|v| {
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            let var = v.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / v.len() as f64;
            (mean > 0.0).then(|| var.sqrt() / mean)
        })
        .collect();

    Some(Calibration {
        kind: "calibration",
        runs: runs.len(),
        windows: all.len(),
        read_latency_s: median(latencies),
        node_read_bytes_per_s: node_rate,
        storage_bytes_per_s: storage,
        cpu_s_per_row,
        kept_read_s_per_byte,
        overhead_s: coef[0],
        latency_s: (sizes.0 < sizes.1).then_some(coef[1]),
        intra_bytes_per_s: bandwidth(coef[2]),
        inter_bytes_per_s: if crossed { bandwidth(coef[3]) } else { None },
        cv: median(cvs),
        consume_s_per_row: consume[0],
        consume_s_per_byte: consume[1],
    })
}

/// The model's epoch for one scenario (efficiency left at 1: see [`predict`]).
pub fn predict_one(c: &Calibration, s: &Scenario) -> Prediction {
    let rpn = s.ranks_per_node.max(1);
    let p = (s.nodes.max(1) * rpn) as f64;
    let b = s.batch_size.max(1);
    let steps = (s.samples / b).max(1);
    let rows_per_step = b as f64 * s.replicas.max(1) as f64 / p;
    let per_step = (rows_per_step.ceil() * s.sample_bytes) as u64 + bookkeeping_per_step(b as usize, p as usize, 2);
    let spw = WindowBudget { window_bytes: s.window_bytes, prefetch: s.prefetch }.steps_per_window(per_step, steps);
    let windows = steps.div_ceil(spw);
    // Bytes one rank sends, and delivers, in a window.
    let sent = spw as f64 * rows_per_step * s.sample_bytes;
    // One window on one rank: its reads from storage (a multiple `factor` of the bytes it
    // delivers, as the read strategy says; none, no latency either, where it keeps its
    // data), and from the rows kept (the rest).
    let mut rate = c.node_read_bytes_per_s / rpn as f64;
    if let Some(storage) = c.storage_bytes_per_s {
        rate = rate.min(storage / p);
    }
    let read_of = |factor: f64| {
        let read_bytes = factor * spw as f64 * b as f64 / p * s.sample_bytes;
        let storage = if read_bytes > 0.0 { c.read_latency_s + read_bytes / rate.max(1.0) } else { 0.0 };
        storage + (1.0 - factor).max(0.0) * sent * c.kept_read_s_per_byte
    };
    let read = read_of(s.reads.later);
    let cpu = c.cpu_s_per_row * spw as f64 * rows_per_step;
    let slowest = 1.0 + c.cv * (2.0 * p.ln()).max(0.0).sqrt();
    // Bytes to ranks of the node (none of the kept rows where the node's ranks share
    // them) and off the node.
    let kept = if s.shares_stores { s.reads.kept() } else { 0.0 };
    let to_node = sent * rpn as f64 / p;
    // In and out: a rank receives what it sends (data parallel, uniform home ranges).
    let on_host = 2.0 * to_node * (1.0 - kept);
    let node_off = rpn as f64 * (sent - to_node);
    let exchange = if p > 1.0 {
        let peers = peers(p as usize, rpn, kept >= 1.0);
        c.overhead_s + all_to_all_seconds(&c.exchange_costs(), peers, on_host, node_off)
    } else {
        0.0
    };
    let own = (read + cpu) * slowest;
    let consume = (c.consume_s_per_row + c.consume_s_per_byte * s.sample_bytes) * spw as f64 * rows_per_step;
    let window = (own + exchange).max(consume);
    let epoch_s = windows as f64 * window;
    let first_window = ((read_of(s.reads.first) + cpu) * slowest + exchange).max(consume);
    Prediction {
        kind: "prediction",
        nodes: s.nodes,
        ranks: p as usize,
        windows,
        steps_per_window: spw,
        epoch_s,
        first_epoch_s: windows as f64 * first_window,
        samples_per_s: (steps * b) as f64 / epoch_s.max(1e-12),
        efficiency: 1.0,
        read_s: read * slowest,
        cpu_s: cpu * slowest,
        exchange_s: exchange,
        skew_share: (own - (read + cpu)) / window.max(1e-12),
        consume_s: consume,
        consumer_bound: consume > own + exchange,
    }
}

/// Predictions for `base` at each node count, efficiency against the first.
pub fn predict(c: &Calibration, base: &Scenario, nodes: &[usize]) -> Vec<Prediction> {
    let mut out: Vec<Prediction> =
        nodes.iter().map(|&n| predict_one(c, &Scenario { nodes: n, ..base.clone() })).collect();
    if let Some(first) = out.first().map(|p| p.samples_per_s / p.nodes as f64) {
        for p in &mut out {
            p.efficiency = p.samples_per_s / p.nodes as f64 / first;
        }
    }
    out
}

/// A measured run against the model's prediction of it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Validation {
    pub kind: &'static str,
    pub run: String,
    pub nodes: usize,
    pub ranks: usize,
    pub measured_s: f64,
    pub predicted_s: f64,
    /// Predicted over measured.
    pub ratio: f64,
}

/// The model's error on the runs it was fitted to (each run's last epoch: the first, or a
/// later one, as its read strategy reads it).
pub fn validate(c: &Calibration, runs: &[Run]) -> Vec<Validation> {
    runs.iter()
        .filter_map(|r| {
            let &(epoch, measured) = r.epoch_s.iter().max_by_key(|(e, _)| *e)?;
            let s = Scenario {
                nodes: r.nodes,
                ranks_per_node: r.ranks_per_node(),
                samples: r.samples,
                sample_bytes: r.sample_bytes,
                batch_size: r.batch_size,
                window_bytes: r.window_bytes,
                prefetch: r.prefetch,
                replicas: 1,
                reads: r.reads,
                shares_stores: r.shares_stores,
            };
            let p = predict_one(c, &s);
            let predicted = if epoch == 0 { p.first_epoch_s } else { p.epoch_s };
            Some(Validation {
                kind: "validation",
                run: r.name.clone(),
                nodes: r.nodes,
                ranks: r.ranks,
                measured_s: measured,
                predicted_s: predicted,
                ratio: predicted / measured.max(1e-12),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Windows of a run that behaves exactly like the model with `c`: `nodes × rpn` ranks,
    /// `windows` windows of `rows` rows of `bytes` bytes per rank (the last one half).
    fn synthetic(c: &Calibration, nodes: usize, rpn: usize, windows: u64, rows: u64, bytes: f64) -> Run {
        let p = nodes * rpn;
        let mut out = Vec::new();
        for w in 0..windows {
            let rows = if w + 1 == windows { rows / 2 } else { rows };
            for rank in 0..p {
                let read_bytes = rows as f64 * bytes;
                let mut rate = c.node_read_bytes_per_s / rpn as f64;
                if let Some(s) = c.storage_bytes_per_s {
                    rate = rate.min(s / p as f64);
                }
                let sent = read_bytes;
                let on = sent * rpn as f64 / p as f64;
                let off = sent - on;
                let node_off = off * rpn as f64;
                let exchange = c.overhead_s
                    + c.latency_s.unwrap() * (p - 1) as f64
                    + 2.0 * on / c.intra_bytes_per_s.unwrap()
                    + c.inter_bytes_per_s.map_or(0.0, |b| node_off / b);
                out.push(WindowSample {
                    rank,
                    host: rank / rpn,
                    epoch: 0,
                    first_step: w,
                    read_s: c.read_latency_s + read_bytes / rate,
                    cpu_s: c.cpu_s_per_row * rows as f64,
                    exchange_s: exchange + 0.001,
                    peer_wait_s: 0.001,
                    rows,
                    bytes_read: read_bytes as u64,
                    bytes_sent: sent as u64,
                    bytes_sent_off_host: off as u64,
                    bytes_received: sent as u64,
                });
            }
        }
        Run {
            name: format!("n{nodes}"),
            nodes,
            ranks: p,
            samples: 1 << 20,
            batch_size: 1024,
            window_bytes: 64 << 20,
            prefetch: 2,
            sample_bytes: bytes,
            reads: ReadPlan::EVERY_EPOCH,
            shares_stores: false,
            epoch_s: vec![(0, 1.0)],
            consumer: vec![(0.5, 1000); p],
            windows: out,
        }
    }

    /// Two nodes of two ranks, batches of 256 of 65,536 samples of `sample_bytes`, 8 MiB
    /// windows two ahead, read every epoch.
    fn two_by_two(sample_bytes: f64) -> Scenario {
        Scenario {
            nodes: 2,
            ranks_per_node: 2,
            samples: 1 << 16,
            sample_bytes,
            batch_size: 256,
            window_bytes: 8 << 20,
            prefetch: 2,
            replicas: 1,
            reads: ReadPlan::EVERY_EPOCH,
            shares_stores: false,
        }
    }

    fn truth() -> Calibration {
        Calibration {
            kind: "calibration",
            runs: 3,
            windows: 0,
            read_latency_s: 0.002,
            node_read_bytes_per_s: 400e6,
            storage_bytes_per_s: None,
            cpu_s_per_row: 1e-6,
            kept_read_s_per_byte: 0.0,
            overhead_s: 0.0005,
            latency_s: Some(20e-6),
            intra_bytes_per_s: Some(5e9),
            inter_bytes_per_s: Some(1e9),
            cv: 0.0,
            consume_s_per_row: 0.0,
            consume_s_per_byte: 0.0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 0.02 * b.abs().max(1e-12)
    }

    #[test]
    fn least_squares_recovers_a_line_and_keeps_coefficients_non_negative() {
        let x: Vec<Vec<f64>> = (0..10).map(|i| vec![1.0, i as f64]).collect();
        let y: Vec<f64> = (0..10).map(|i| 3.0 + 2.0 * i as f64).collect();
        let c = nonneg_least_squares(&x, &y).unwrap();
        assert!(close(c[0], 3.0) && close(c[1], 2.0), "{c:?}");
        // A falling line: the slope cannot be negative, so the fit is the mean.
        let y: Vec<f64> = (0..10).map(|i| 20.0 - i as f64).collect();
        let c = nonneg_least_squares(&x, &y).unwrap();
        assert_eq!(c[1], 0.0);
        assert!(close(c[0], 15.5), "{c:?}");
        // A column that is all zero cannot be determined, and gets 0.
        let x: Vec<Vec<f64>> = (0..10).map(|i| vec![i as f64, 0.0]).collect();
        let y: Vec<f64> = (0..10).map(|i| 2.0 * i as f64).collect();
        let c = nonneg_least_squares(&x, &y).unwrap();
        assert!(close(c[0], 2.0) && c[1] == 0.0, "{c:?}");
    }

    #[test]
    fn the_fit_recovers_the_constants_of_a_model_machine() {
        let t = truth();
        let runs = vec![
            synthetic(&t, 1, 2, 8, 4096, 2048.0),
            synthetic(&t, 2, 2, 8, 4096, 2048.0),
            synthetic(&t, 4, 2, 8, 4096, 2048.0),
        ];
        let c = fit(&runs).unwrap();
        assert_eq!(c.runs, 3);
        assert!(close(c.read_latency_s, t.read_latency_s), "{c:?}");
        assert!(close(c.node_read_bytes_per_s, t.node_read_bytes_per_s), "{c:?}");
        assert_eq!(c.storage_bytes_per_s, None, "per-node reading did not slow down");
        assert!(close(c.cpu_s_per_row, t.cpu_s_per_row), "{c:?}");
        assert!(close(c.overhead_s, t.overhead_s), "{c:?}");
        assert!(close(c.latency_s.unwrap(), 20e-6), "{c:?}");
        assert!(close(c.intra_bytes_per_s.unwrap(), 5e9), "{c:?}");
        assert!(close(c.inter_bytes_per_s.unwrap(), 1e9), "{c:?}");
        assert_eq!(c.cv, 0.0);
        let costs = c.exchange_costs();
        assert_eq!(costs.latency_ns, 20_000);
    }

    #[test]
    fn a_saturated_storage_is_found_and_one_host_tells_no_inter_bandwidth() {
        let t = Calibration { storage_bytes_per_s: Some(1e9), ..truth() };
        // One node reads at 400 MB/s; four would want 1.6 GB/s but get 1 GB/s.
        let runs = vec![synthetic(&t, 1, 2, 8, 4096, 2048.0), synthetic(&t, 4, 2, 8, 4096, 2048.0)];
        let c = fit(&runs).unwrap();
        assert!(close(c.storage_bytes_per_s.unwrap(), 1e9), "{c:?}");
        let c = fit(&runs[..1]).unwrap();
        assert_eq!((c.storage_bytes_per_s, c.inter_bytes_per_s, c.latency_s), (None, None, None));
        assert!(c.intra_bytes_per_s.is_some());
        // One world size: the per-peer latency is the defaults', the rest is overhead.
        assert_eq!(c.exchange_costs().latency_ns, ExchangeCosts::default().latency_ns);
        assert!(close(c.overhead_s, t.overhead_s + 20e-6), "{c:?}");
        assert_eq!(fit(&[]), None);
    }

    #[test]
    fn predictions_follow_the_model_by_hand() {
        let c =
            Calibration { read_latency_s: 0.0, cpu_s_per_row: 0.0, overhead_s: 0.0, latency_s: Some(0.0), ..truth() };
        let s = Scenario {
            nodes: 1,
            ranks_per_node: 4,
            samples: 1 << 20,
            sample_bytes: 1024.0,
            batch_size: 1024,
            window_bytes: 1 << 30,
            prefetch: 0,
            replicas: 1,
            reads: ReadPlan::EVERY_EPOCH,
            shares_stores: false,
        };
        let one = predict_one(&c, &s);
        // 1 GiB / 3 per step: the whole epoch (1024 steps of 256 KiB per rank) in one window.
        assert_eq!((one.windows, one.steps_per_window), (1, 1024));
        // Each rank reads 256 MiB at 100 MB/s, and sends and receives it on its host at
        // 5 GB/s (the on-host bandwidth counts bytes in and out).
        let bytes = (256u64 << 20) as f64;
        assert!(close(one.read_s, bytes / 100e6), "{one:?}");
        assert!(close(one.exchange_s, 2.0 * bytes / 5e9), "{one:?}");
        assert!(close(one.epoch_s, bytes / 100e6 + 2.0 * bytes / 5e9), "{one:?}");
        // Twice the nodes: half the reading per rank; 3/4 of the bytes cross the link,
        // shared by 4 ranks... efficiency below 1, throughput up.
        let p = predict(&c, &s, &[1, 2, 4096]);
        assert_eq!(p[0].efficiency, 1.0);
        assert!(p[1].samples_per_s > p[0].samples_per_s && p[1].efficiency < 1.0, "{p:?}");
        let half = bytes / 2.0;
        let expect = half / 100e6 + 2.0 * (half / 2.0) / 5e9 + 4.0 * (half / 2.0) / 1e9;
        assert!(close(p[1].epoch_s, expect), "{:?} vs {expect}", p[1]);
        assert_eq!(p[2].ranks, 4096 * 4);
        assert!(p.iter().all(|p| p.efficiency > 0.0 && p.efficiency <= 1.0 && p.skew_share == 0.0));
        // A spread of own work costs more the more ranks wait for the slowest.
        let c = Calibration { cv: 0.1, ..c };
        let p = predict(&c, &s, &[1, 4096]);
        assert!(p[1].skew_share > p[0].skew_share && p[1].skew_share > 0.0, "{p:?}");
    }

    #[test]
    fn a_slow_consumer_sets_the_pace() {
        let t = truth();
        let mut runs = vec![synthetic(&t, 1, 2, 8, 4096, 2048.0), synthetic(&t, 2, 2, 8, 4096, 512.0)];
        // 0.1 ms a row and 0.1 µs a byte: 0.1 + 0.2048 s for 1000 rows of 2 KiB, 0.1 + 0.0512
        // for rows of 512 B.
        runs[0].consumer = vec![(0.3048, 1000); 2];
        runs[1].consumer = vec![(0.1512, 1000); 4];
        let c = fit(&runs).unwrap();
        assert!(close(c.consume_s_per_row, 1e-4) && close(c.consume_s_per_byte, 1e-7), "{c:?}");
        let s = two_by_two(2048.0);
        let fast = predict_one(&t, &s);
        assert!(!fast.consumer_bound && fast.consume_s == 0.0);
        let slow = predict_one(&Calibration { consume_s_per_row: 1e-3, ..t }, &s);
        assert!(slow.consumer_bound, "{slow:?}");
        // Each window: its rows on this rank (a quarter of its steps' rows) at 1 ms.
        let rows = (slow.steps_per_window * 256 / 4) as f64;
        assert!(
            close(slow.consume_s, rows * 1e-3) && close(slow.epoch_s, slow.windows as f64 * rows * 1e-3),
            "{slow:?}"
        );
    }

    #[test]
    fn a_resident_run_reads_in_its_first_epoch_only() {
        let t = truth();
        let s = two_by_two(16384.0);
        let every = predict_one(&t, &s);
        assert_eq!(every.first_epoch_s, every.epoch_s);
        assert!(every.read_s > 0.0);
        let resident = predict_one(&t, &Scenario { reads: ReadPlan::RESIDENT, ..s.clone() });
        // The first epoch streams the data as before; later ones have no read term at all.
        assert_eq!(resident.first_epoch_s, every.first_epoch_s);
        assert_eq!(resident.read_s, 0.0);
        let windows = resident.windows as f64;
        assert!(close(resident.epoch_s, every.epoch_s - windows * every.read_s), "{resident:?} vs {every:?}");
        assert!(resident.samples_per_s > every.samples_per_s);
        // Passes read K times an epoch.
        let passes = predict_one(&t, &Scenario { reads: ReadPlan { first: 3.0, later: 3.0 }, ..s.clone() });
        assert!(close(passes.read_s, 3.0 * every.read_s - 2.0 * t.read_latency_s), "{passes:?}");
        // Reading the kept rows costs its own rate: all of them in a resident run's later
        // epochs, three quarters where a random plan keeps that much.
        let k = Calibration { kept_read_s_per_byte: 1e-10, ..t.clone() };
        let sent = (resident.steps_per_window * 256 / 4) as f64 * 16384.0;
        let kept = predict_one(&k, &Scenario { reads: ReadPlan::RESIDENT, ..s.clone() });
        assert!(close(kept.read_s, sent * 1e-10), "{kept:?}");
        assert_eq!(kept.first_epoch_s, every.first_epoch_s);
        let quarter = predict_one(&k, &Scenario { reads: ReadPlan { first: 1.0, later: 0.25 }, ..s.clone() });
        let storage = t.read_latency_s + (every.read_s - t.read_latency_s) / 4.0;
        assert!(close(quarter.read_s, storage + 0.75 * sent * 1e-10), "{quarter:?}");

        // The plans `run.json` records.
        let plan = |strategy, resident: Vec<u64>| IoPlan { strategy, resident, ..IoPlan::direct(2) };
        assert_eq!(ReadPlan::of(&plan(Strategy::Resident, vec![50, 50]), 100), ReadPlan::RESIDENT);
        assert_eq!(ReadPlan::of(&plan(Strategy::Passes { passes: 3 }, vec![0, 0]), 100).later, 3.0);
        assert_eq!(ReadPlan::of(&plan(Strategy::Random, vec![0, 0]), 100), ReadPlan::EVERY_EPOCH);
        assert_eq!(ReadPlan::of(&plan(Strategy::Random, vec![10, 15]), 100), ReadPlan { first: 1.0, later: 0.75 });

        // Validation compares a resident run's later epoch with the prediction without
        // reads, and a run of one epoch with the first.
        let mut run = synthetic(&t, 2, 2, 8, 4096, 2048.0);
        run.reads = ReadPlan::RESIDENT;
        run.epoch_s = vec![(0, 9.0), (1, 2.0)];
        let v = &validate(&t, std::slice::from_ref(&run))[0];
        let mut every_run = run.clone();
        every_run.reads = ReadPlan::EVERY_EPOCH;
        let v_every = &validate(&t, &[every_run])[0];
        assert!(v.predicted_s < v_every.predicted_s, "{v:?} vs {v_every:?}");
        // A resident run whose node's ranks share their rows exchanges nothing on a node:
        // on one node, only the fixed cost per window remains.
        let one_node = Scenario { nodes: 1, reads: ReadPlan::RESIDENT, ..s.clone() };
        let exchanged = predict_one(&t, &one_node);
        let shared = predict_one(&t, &Scenario { shares_stores: true, ..one_node.clone() });
        assert!(close(shared.exchange_s, t.overhead_s) && exchanged.exchange_s > shared.exchange_s, "{shared:?}");
        // On two, the bytes to the other node and its ranks remain.
        let two = predict_one(&t, &Scenario { shares_stores: true, reads: ReadPlan::RESIDENT, ..s.clone() });
        let off = 2.0 * (two.steps_per_window * 256 / 4) as f64 * 16384.0 / 2.0;
        assert!(close(two.exchange_s, t.overhead_s + 2.0 * 20e-6 + off / 1e9), "{two:?}");
        // The fit tells the cost of reading kept rows from the windows that read nothing.
        for w in run.windows.iter_mut().filter(|w| w.first_step % 2 == 1) {
            w.bytes_read = 0;
            w.read_s = w.rows as f64 * run.sample_bytes * 2e-10;
        }
        assert!(close(fit(std::slice::from_ref(&run)).unwrap().kept_read_s_per_byte, 2e-10));
        run.epoch_s = vec![(0, 9.0)];
        assert_eq!(
            validate(&t, std::slice::from_ref(&run))[0].predicted_s,
            validate(&t, &[Run { reads: ReadPlan::EVERY_EPOCH, ..run.clone() }])[0].predicted_s
        );
    }

    #[test]
    fn validation_compares_each_run_with_its_prediction() {
        let t = truth();
        let mut run = synthetic(&t, 2, 2, 8, 4096, 2048.0);
        run.epoch_s = vec![(0, 9.0), (1, 2.0)];
        let v = validate(&t, &[run]);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].measured_s, 2.0);
        assert!(close(v[0].ratio, v[0].predicted_s / 2.0));
    }
}
