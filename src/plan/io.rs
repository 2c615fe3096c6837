//! How each rank reads its home range from storage: the read strategy, chosen from the
//! storage's speeds and the memory the job may use, and the cost model that chooses it.
//!
//! meshfeed shuffles over the network so that storage is read sequentially: a rank's home
//! range is a contiguous run of the files. How often and how it is read depends on memory:
//!
//! * **resident** — the home ranges of a host fit its memory budget: each rank streams
//!   its home range once, in large sequential reads, and every later epoch reads nothing
//!   from storage;
//! * **passes** — they do not fit, by a factor K: each epoch streams the home range K
//!   times, pass `j` keeping only the rows the `j`-th K-th of the epoch needs (the order is
//!   known ahead), so memory holds a K-th of it; K × the data, all sequential;
//! * **random** — the rows that fit the budget stay in memory (a prefix of the home
//!   range, streamed once) and the rest are read where a window needs them, with many
//!   reads in flight; with a spill directory on node-local storage, the rest is streamed
//!   there once instead and read from it.
//!
//! [`choose`] picks one from [`IoInputs`] (what the job holds per host, the memory budget,
//! the storage's sequential bandwidth and random-read rate) by predicting an epoch's time
//! under each ([`predict`]). Pure: every rank computes the same plan from the same
//! agreed inputs. The measurement of the inputs (memory limits, the storage probe) lives
//! in [`crate::runtime::memory`] and the loader.

use crate::config::ReadStrategy;
use crate::error::{Error, Result};

/// Bytes a rank reads at once when it streams its home range.
pub const STREAM_READ_BYTES: u64 = 8 << 20;

/// A pass keeps a K-th of the home range on average; its actual share varies with the
/// permutation (binomially), so K is chosen for this much more than the mean.
pub const PASS_SLACK: f64 = 1.1;

/// `auto` considers passes only where every rank's budget holds at least this much (a few
/// streaming reads' worth): below it a pass holds less than its reads bring in.
pub const MIN_PASS_BYTES: u64 = 4 * STREAM_READ_BYTES;

/// The storage's speed as one host sees it, all its ranks reading at once.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StorageRates {
    /// Sequential reading, bytes per second.
    pub bandwidth: f64,
    /// Random reads of one sample each, with many in flight, per second.
    pub iops: f64,
}

/// What one host holds and may use.
#[derive(Clone, Debug, PartialEq)]
pub struct HostShare {
    /// Home samples of each of the host's ranks, in rank order.
    pub ranks: Vec<(usize, u64)>,
    /// Bytes the host's ranks may hold for data, together.
    pub budget: u64,
}

impl HostShare {
    fn samples(&self) -> u64 {
        self.ranks.iter().map(|&(_, n)| n).sum()
    }

    fn rank_budget(&self) -> u64 {
        self.budget / self.ranks.len().max(1) as u64
    }
}

/// Everything the choice depends on, agreed by every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct IoInputs {
    /// The strategy asked for (`auto`: the cheapest that fits).
    pub requested: ReadStrategy,
    pub hosts: Vec<HostShare>,
    /// Mean bytes of one sample, every field.
    pub sample_bytes: u64,
    /// Every field has a fixed size: rows have one layout, and can be shared with the
    /// ranks of the host and spilled.
    pub fixed: bool,
    /// The storage's speed (`None`: not measured, because the data fits).
    pub storage: Option<StorageRates>,
    /// A spill directory on node-local storage was given.
    pub spill: bool,
}

/// How the ranks read their home ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", tag = "strategy")]
pub enum Strategy {
    Resident,
    Passes { passes: u64 },
    Random,
}

impl Strategy {
    /// `resident`, `passes` or `random`.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Resident => "resident",
            Strategy::Passes { .. } => "passes",
            Strategy::Random => "random",
        }
    }
}

/// An epoch's predicted time on the busiest host, seconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Prediction {
    pub first_epoch_s: f64,
    pub later_epoch_s: f64,
    /// Bytes read from storage in a later epoch.
    pub later_storage_bytes: f64,
}

/// The chosen plan (as `meshfeed run --telemetry` records it in `run.json`:
/// [`crate::telemetry::RunInfo`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IoPlan {
    pub strategy: Strategy,
    /// Home rows each rank keeps in memory (a prefix of its home range), by rank.
    pub resident: Vec<u64>,
    /// Rows past the resident prefix are streamed to the spill directory once.
    pub spill: bool,
    /// Why, in a sentence: the numbers the choice was made from.
    pub reason: String,
    /// The cost model's prediction, where the storage's speed is known.
    pub prediction: Option<Prediction>,
    /// The memory budget of the host that decided (the busiest for its budget), bytes.
    pub budget: u64,
    /// The storage's speed the choice was made with, where it was needed.
    pub storage: Option<StorageRates>,
}

impl IoPlan {
    /// The plan of a loader that reads every row from storage where a window needs it and
    /// keeps nothing (a single process's tests, the broadcast baseline).
    pub fn direct(ranks: usize) -> IoPlan {
        IoPlan {
            strategy: Strategy::Random,
            resident: vec![0; ranks],
            spill: false,
            reason: "no memory budget".into(),
            prediction: None,
            budget: 0,
            storage: None,
        }
    }

    /// Whether rank `rank` keeps or spills anything (it then streams its home range once).
    pub fn streams(&self, rank: usize) -> bool {
        self.resident.get(rank).is_some_and(|&r| r > 0) || self.spill
    }

    /// Whether any rank keeps or spills anything.
    pub fn streams_any(&self) -> bool {
        (0..self.resident.len()).any(|r| self.streams(r))
    }
}

/// Where a home row lies under a read plan: kept in memory, in the node-local spill file,
/// or only on the shared storage. A pure function of the plan ([`IoPlan::resident`], the
/// spill), so that an owner and a same-host receiver always agree on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    Memory,
    Spill,
    Storage,
}

/// Per-row and per-byte costs of producing an epoch from memory on one host (planning, and
/// copying rows from the ranks' memory into batches): fitted to resident epochs of 256 B,
/// 16 KiB and 147 KiB samples, 4 ranks on 2 cores (0.18, 0.28 and 0.05 s for 1 M, 131 k and
/// 2.8 k samples; docs/perf/cold/).
pub const MEMORY_ROW_S: f64 = 1.5e-7;
/// See [`MEMORY_ROW_S`].
pub const MEMORY_BYTES_PER_S: f64 = 8.0e9;
/// Node-local spill storage (not probed): bytes per second one host streams from its spill
/// files, and random reads of one row each per second, with reads in flight. For small rows
/// the reads' own cost binds first: 4 ranks on 2 cores read 256-byte rows back at about
/// 250 000 a second here (HDF5 and Arrow at 3bdd760, `docs/perf/cold/`).
pub const SPILL_BYTES_PER_S: f64 = 1.5e9;
/// See [`SPILL_BYTES_PER_S`].
pub const SPILL_READS_PER_S: f64 = 2.5e5;

/// Predicted time of an epoch under `strategy` on `host`.
pub fn predict(inputs: &IoInputs, host: &HostShare, strategy: Strategy, resident: &[u64], spill: bool) -> Prediction {
    let s = inputs.sample_bytes.max(1) as f64;
    let rows = host.samples() as f64;
    let memory = rows * MEMORY_ROW_S + rows * s / MEMORY_BYTES_PER_S;
    let kept: f64 = host.ranks.iter().map(|&(r, n)| n.min(resident.get(r).copied().unwrap_or(0)) as f64).sum();
    // With a spill tier, later epochs read what memory does not keep from the spill files
    // (node-local: no storage speed needed): in passes, or one read per row.
    let spilled = rows - kept;
    let from_spill = match strategy {
        _ if !spill => None,
        Strategy::Passes { passes } => Some(passes as f64 * spilled * s / SPILL_BYTES_PER_S + memory),
        _ => Some((spilled * (1.0 / SPILL_READS_PER_S).max(s / SPILL_BYTES_PER_S)).max(memory)),
    };
    let Some(st) = inputs.storage else {
        let later_epoch_s = from_spill.unwrap_or(memory);
        return Prediction { first_epoch_s: memory, later_epoch_s, later_storage_bytes: 0.0 };
    };
    let stream = |bytes: f64| bytes / st.bandwidth.max(1.0);
    // One read per sample, as many in flight as the device takes: the slower of its
    // reads per second and its bandwidth.
    let random = |rows: f64| rows * (1.0 / st.iops.max(1e-9)).max(s / st.bandwidth.max(1.0));
    if let Some(later_epoch_s) = from_spill {
        // The first epoch streams the home ranges once (to memory and the spill files).
        return Prediction { first_epoch_s: stream(rows * s) + memory, later_epoch_s, later_storage_bytes: 0.0 };
    }
    match strategy {
        Strategy::Resident => {
            Prediction { first_epoch_s: stream(rows * s) + memory, later_epoch_s: memory, later_storage_bytes: 0.0 }
        }
        Strategy::Passes { passes } => {
            let t = passes as f64 * stream(rows * s) + memory;
            Prediction { first_epoch_s: t, later_epoch_s: t, later_storage_bytes: passes as f64 * rows * s }
        }
        Strategy::Random => {
            let reads = random(rows - kept);
            Prediction {
                first_epoch_s: stream(kept * s) + reads.max(memory),
                later_epoch_s: reads.max(memory),
                later_storage_bytes: (rows - kept) * s,
            }
        }
    }
}

/// Chooses the read strategy (see the module docs).
pub fn choose(inputs: &IoInputs) -> Result<IoPlan> {
    let world: usize = inputs.hosts.iter().flat_map(|h| &h.ranks).map(|&(r, _)| r + 1).max().unwrap_or(0);
    let s = inputs.sample_bytes.max(1);
    // The host with the most data for its budget decides.
    let busiest = inputs
        .hosts
        .iter()
        .max_by(|a, b| {
            let need = |h: &HostShare| h.samples() as f64 * s as f64 / h.budget.max(1) as f64;
            need(a).total_cmp(&need(b))
        })
        .ok_or_else(|| Error::Internal("no hosts to plan reads for".into()))?;
    let need = busiest.samples().saturating_mul(s);
    // Variable-length values are counted at their mean: keep a quarter of the budget for
    // the spread.
    let usable = |b: u64| if inputs.fixed { b } else { b / 4 * 3 };
    let fits = inputs.hosts.iter().all(|h| h.samples().saturating_mul(s) <= usable(h.budget));
    let resident_prefix = || {
        let mut r = vec![0; world];
        for h in &inputs.hosts {
            let rows = if inputs.fixed { usable(h.rank_budget()) / s } else { 0 };
            for &(rank, n) in &h.ranks {
                r[rank] = n.min(rows);
            }
        }
        r
    };
    let all_resident = || {
        let mut r = vec![0; world];
        for &(rank, n) in inputs.hosts.iter().flat_map(|h| &h.ranks) {
            r[rank] = n;
        }
        r
    };
    let passes = inputs
        .hosts
        .iter()
        .flat_map(|h| {
            h.ranks
                .iter()
                .map(move |&(_, n)| (n.saturating_mul(s) as f64 * PASS_SLACK) / usable(h.rank_budget()).max(1) as f64)
        })
        .fold(1.0f64, f64::max)
        .ceil() as u64;
    // Passes are possible where every rank's budget holds a few streaming reads.
    let passes_fit = inputs.hosts.iter().all(|h| usable(h.rank_budget()) >= MIN_PASS_BYTES);
    let budget = show_bytes(busiest.budget);
    let held = format!(
        "{} on the busiest host ({} ranks) for a memory budget of {budget}",
        show_bytes(need),
        busiest.ranks.len()
    );
    let spill = inputs.spill && inputs.fixed;
    let plan = |strategy: Strategy, resident: Vec<u64>, spill: bool, reason: String| {
        let prediction =
            Some(predict(inputs, busiest, strategy, &resident, spill)).filter(|_| inputs.storage.is_some());
        IoPlan { strategy, resident, spill, reason, prediction, budget: busiest.budget, storage: inputs.storage }
    };
    if inputs.spill && !inputs.fixed {
        return Err(Error::Config(
            "--spill-dir needs every field to have a fixed size (variable-length values cannot be spilled)".into(),
        ));
    }
    match inputs.requested {
        ReadStrategy::Resident if !fits => Err(Error::Config(format!(
            "--read-strategy resident: the data does not fit in memory: {held}{} (--memory-budget, or another strategy)",
            if inputs.fixed { "" } else { ", a quarter kept for variable-length values" }
        ))),
        ReadStrategy::Auto | ReadStrategy::Resident if fits => Ok(plan(
            Strategy::Resident,
            all_resident(),
            false,
            format!("the data fits in memory: {held}"),
        )),
        ReadStrategy::Passes if inputs.hosts.iter().any(|h| usable(h.rank_budget()) < s) => Err(Error::Config(format!(
            "--read-strategy passes: a memory budget of {budget} on the busiest host leaves a rank less than one sample ({}) for a pass",
            show_bytes(s)
        ))),
        ReadStrategy::Passes => Ok(plan(
            Strategy::Passes { passes },
            vec![0; world],
            spill,
            format!(
                "asked for: {held} gives {passes} passes per epoch{}",
                if spill { " over the spill files (once they hold the data; the first epoch streams it there)" } else { "" }
            ),
        )),
        ReadStrategy::Random => {
            let what = if spill { "the rest spilled once" } else { "the rest read where needed" };
            Ok(plan(Strategy::Random, resident_prefix(), spill, format!("asked for: {held}, {what}")))
        }
        ReadStrategy::Auto if spill => {
            // Spilled rows are read back in passes over the spill files where one read per
            // row costs more (small rows), else at random with what fits kept in memory.
            let random = predict(inputs, busiest, Strategy::Random, &resident_prefix(), true);
            let passed = predict(inputs, busiest, Strategy::Passes { passes }, &[], true);
            let why = format!("the data does not fit in memory ({held}): it is spilled once");
            let costs = format!(
                "{passes} passes {:.1} s vs random reads {:.1} s per later epoch",
                passed.later_epoch_s, random.later_epoch_s
            );
            Ok(if passes_fit && passed.later_epoch_s < random.later_epoch_s {
                plan(
                    Strategy::Passes { passes },
                    vec![0; world],
                    true,
                    format!("{why}, and later epochs stream the spill files in passes ({costs})"),
                )
            } else {
                plan(
                    Strategy::Random,
                    resident_prefix(),
                    true,
                    format!("{why}; what fits stays in memory, the rest is read from the spill files ({costs})"),
                )
            })
        }
        _ => {
            let Some(st) = inputs.storage else {
                return Err(Error::Internal("the storage's speed is needed to choose a read strategy".into()));
            };
            let random = predict(inputs, busiest, Strategy::Random, &resident_prefix(), false);
            let speed = format!("storage {}/s, {:.0} reads/s", show_bytes(st.bandwidth as u64), st.iops);
            if !passes_fit {
                let why = format!("{held}, too little for passes; {speed}: random reads {:.1} s per epoch", random.later_epoch_s);
                return Ok(plan(Strategy::Random, resident_prefix(), false, why));
            }
            let passed = predict(inputs, busiest, Strategy::Passes { passes }, &[], false);
            let speeds = format!(
                "{speed}: {passes} passes {:.1} s vs random reads {:.1} s per epoch",
                passed.later_epoch_s, random.later_epoch_s
            );
            Ok(if passed.later_epoch_s < random.later_epoch_s {
                plan(Strategy::Passes { passes }, vec![0; world], false, format!("{held}; {speeds}"))
            } else {
                plan(Strategy::Random, resident_prefix(), false, format!("{held}; {speeds}"))
            })
        }
    }
}

/// `512 B`, `16.0 KiB`, `4.0 GiB`: a byte count for people.
pub fn show_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// One host of 4 ranks holding `total` bytes of `sample`-byte samples.
    fn inputs(total: u64, sample: u64, budget: u64, storage: Option<StorageRates>) -> IoInputs {
        let n = total / sample;
        IoInputs {
            requested: ReadStrategy::Auto,
            hosts: vec![HostShare { ranks: (0..4).map(|r| (r, n / 4)).collect(), budget }],
            sample_bytes: sample,
            fixed: true,
            storage,
            spill: false,
        }
    }

    /// A cloud volume's baseline: 250 MB/s, 3 000 reads/s.
    const VOLUME: StorageRates = StorageRates { bandwidth: 250e6, iops: 3000.0 };

    #[test]
    fn data_that_fits_is_resident_and_read_once() {
        let p = choose(&inputs(2 * GIB, 16 << 10, 3 * GIB, None)).unwrap();
        assert_eq!((p.strategy, p.spill), (Strategy::Resident, false));
        assert_eq!(p.resident, vec![32768; 4]);
        assert!(p.reason.contains("fits in memory: 2.0 GiB"), "{}", p.reason);
        // With the storage's speed: the first epoch streams, later ones read nothing.
        let p = choose(&inputs(2 * GIB, 16 << 10, 3 * GIB, Some(VOLUME))).unwrap();
        let pr = p.prediction.unwrap();
        assert!((pr.first_epoch_s - pr.later_epoch_s - 2.0 * GIB as f64 / 250e6).abs() < 1e-6, "{pr:?}");
        assert_eq!(pr.later_storage_bytes, 0.0);
        assert!(pr.later_epoch_s < pr.first_epoch_s / 4.0, "{pr:?}");
    }

    #[test]
    fn small_samples_stream_in_passes_and_large_ones_are_read_at_random() {
        // 4× the budget. 256 B samples: a read each would take 2.8 M reads at 3 000/s;
        // four or five sequential passes take seconds.
        let p = choose(&inputs(GIB, 256, GIB / 4, Some(VOLUME))).unwrap();
        assert_eq!(p.strategy, Strategy::Passes { passes: 5 }, "{}", p.reason);
        assert_eq!(p.resident, vec![0; 4]);
        // 1 MiB samples: bandwidth-bound either way, and random reads read each once while
        // what fits stays in memory.
        let p = choose(&inputs(4 * GIB, 1 << 20, GIB, Some(VOLUME))).unwrap();
        assert_eq!(p.strategy, Strategy::Random, "{}", p.reason);
        assert_eq!(p.resident, vec![256; 4], "a quarter of each home range stays");
        let pr = p.prediction.unwrap();
        assert!((pr.later_storage_bytes - 3.0 * GIB as f64).abs() < 1e6, "{pr:?}");
        // 16 KiB at 4×: 3 000 reads/s with a quarter resident beats 5 passes at 250 MB/s.
        let p = choose(&inputs(2 * GIB, 16 << 10, GIB / 2, Some(VOLUME))).unwrap();
        assert_eq!(p.strategy, Strategy::Random, "{}", p.reason);
        assert!(p.reason.contains("5 passes"), "{}", p.reason);
    }

    #[test]
    fn forced_strategies_and_spill() {
        let mut i = inputs(4 * GIB, 16 << 10, GIB, Some(VOLUME));
        i.requested = ReadStrategy::Resident;
        let e = choose(&i).unwrap_err().to_string();
        assert!(
            e.contains("does not fit in memory: 4.0 GiB on the busiest host (4 ranks) for a memory budget of 1.0 GiB"),
            "{e}"
        );
        i.requested = ReadStrategy::Passes;
        assert_eq!(choose(&i).unwrap().strategy, Strategy::Passes { passes: 5 });
        // A budget too small for passes: random reads, or an error if passes were asked for.
        let mut tiny = inputs(GIB, 256, 64 << 20, Some(VOLUME));
        let p = choose(&tiny).unwrap();
        assert_eq!(p.strategy, Strategy::Random);
        assert!(p.reason.contains("too little for passes"), "{}", p.reason);
        // Asked for, passes take any budget that holds a sample (many passes)...
        tiny.requested = ReadStrategy::Passes;
        assert_eq!(choose(&tiny).unwrap().strategy, Strategy::Passes { passes: 18 });
        // ... and refuse one that does not.
        tiny.hosts[0].budget = 1000;
        let e = choose(&tiny).unwrap_err().to_string();
        assert!(e.contains("leaves a rank less than one sample (256 B) for a pass"), "{e}");
        i.requested = ReadStrategy::Auto;
        i.spill = true;
        let p = choose(&i).unwrap();
        assert_eq!((p.strategy, p.spill, p.resident[0]), (Strategy::Random, true, 16384));
        assert_eq!(p.prediction.unwrap().later_storage_bytes, 0.0);
        assert!(p.reason.contains("the rest is read from the spill files"), "{}", p.reason);
        // Small rows are read back from the spill files in passes: one read per 256-byte
        // row costs more than streaming the files K times.
        let mut small = inputs(GIB, 256, GIB / 4, None);
        small.spill = true;
        let p = choose(&small).unwrap();
        assert_eq!((p.strategy, p.spill, p.resident.clone()), (Strategy::Passes { passes: 5 }, true, vec![0; 4]));
        assert!(p.reason.contains("stream the spill files in passes"), "{}", p.reason);
        small.requested = ReadStrategy::Passes;
        assert_eq!(
            (choose(&small).unwrap().strategy, choose(&small).unwrap().spill),
            (Strategy::Passes { passes: 5 }, true)
        );
        small.requested = ReadStrategy::Random;
        assert_eq!((choose(&small).unwrap().strategy, choose(&small).unwrap().spill), (Strategy::Random, true));
        // Variable-length values cannot be spilled.
        i.fixed = false;
        assert!(choose(&i).unwrap_err().to_string().contains("--spill-dir needs every field to have a fixed size"));
    }

    #[test]
    fn the_tightest_host_decides_and_each_rank_keeps_its_hosts_share() {
        let mut i = inputs(GIB, 1 << 20, 2 * GIB, Some(VOLUME));
        // A second host with half the budget its data needs.
        i.hosts.push(HostShare { ranks: vec![(4, 256), (5, 256)], budget: GIB / 4 });
        let p = choose(&i).unwrap();
        assert_eq!(p.strategy, Strategy::Random);
        assert_eq!(p.resident, vec![256, 256, 256, 256, 128, 128]);
    }

    #[test]
    fn byte_counts_for_people() {
        assert_eq!(show_bytes(512), "512 B");
        assert_eq!(show_bytes(16 << 10), "16.0 KiB");
        assert_eq!(show_bytes(3 << 30), "3.0 GiB");
    }
}
