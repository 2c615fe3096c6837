//! The straggler what-if, step by step (after Lin et al., "Understanding Stragglers in
//! Large Model Training Using What-if Analysis"), on the per-step records a training
//! job's loader writes (telemetry schema 3: each window's steps, the time the training
//! loop waited for each batch and the time it spent until it asked for the next).
//!
//! The model: the ranks of a synchronous job move in lockstep, so each step takes as long
//! as its slowest rank's own work at that step, and an epoch is the sum of its steps. A
//! rank's own work at a step is
//!
//! * its **training step** (the time from the batch's delivery to the next request);
//! * its **data loading**: the part of its wait for the batch that was not waiting for
//!   other ranks (a window's wait less its peer waiting, the agreements where the
//!   producer waited for the slowest rank), shared between loading and the exchange in
//!   the proportions of the window's own phases: planning, reading, packing and
//!   assembling are loading; the exchange less its peer waiting is the **exchange**.
//!
//! Replayed, step `s` takes `max over ranks r of (load + exchange + train)[r][s]`. The
//! slowest rank is the one whose own work over the epoch is the largest; the what-if
//! replays the epoch with its durations set to each step's median over ranks. What the
//! epoch would have saved is attributed by replaying with only one of its three kinds of
//! durations set to the median at a time.
//!
//! A training step that waits for other ranks itself (a gradient all-reduce) holds that
//! wait in every fast rank's training step: the loader cannot see inside it, and the
//! what-if then finds less to gain than there is. Pure: records in, figures out.

use meshfeed::telemetry::WindowRecord;
use serde::Serialize;

use crate::median;

/// How many of an epoch's slowest steps the report names.
pub const SLOWEST_STEPS: usize = 5;

/// One rank's own work at one step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepWork {
    pub load_s: f64,
    pub exchange_s: f64,
    pub train_s: f64,
}

impl StepWork {
    fn total(&self) -> f64 {
        self.load_s + self.exchange_s + self.train_s
    }

    /// One of the three kinds, by index (0: loading, 1: exchange, 2: training step).
    fn get(&self, kind: usize) -> f64 {
        [self.load_s, self.exchange_s, self.train_s][kind]
    }

    fn set(&mut self, kind: usize, v: f64) {
        *[&mut self.load_s, &mut self.exchange_s, &mut self.train_s][kind] = v;
    }
}

/// What the three kinds are called in the report.
pub const CAUSES: [&str; 3] = ["data loading", "exchange", "training step"];

/// Seconds the epoch would have saved, by what made the slowest rank slow.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Saving {
    pub data_loading_s: f64,
    pub exchange_s: f64,
    pub training_step_s: f64,
}

/// One of the slowest steps: which rank made it slow, and in what.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SlowStep {
    pub step: u64,
    /// The step as replayed: its slowest rank's own work.
    pub seconds: f64,
    /// The median rank's own work at the step.
    pub median_s: f64,
    pub rank: usize,
    pub host: String,
    /// The kind of that rank's work furthest above the step's median of it.
    pub cause: &'static str,
}

/// The epoch replayed step by step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepReplay {
    /// Steps every rank recorded.
    pub steps: u64,
    /// The sum of the steps as replayed (compare with the epoch's measured time).
    pub replayed_s: f64,
    /// The same with the slowest rank's durations set to each step's median.
    pub what_if_s: f64,
    pub slowest_rank: usize,
    pub slowest_host: String,
    /// `replayed_s - what_if_s`, had only one kind of the slowest rank's work been the
    /// median's.
    pub saving: Saving,
    /// The kind whose saving is the largest.
    pub cause: &'static str,
    pub slowest_steps: Vec<SlowStep>,
}

/// Each step's own work on one rank, from its window records of one epoch (those with
/// per-step records), by step.
pub fn rank_steps(windows: &[&WindowRecord]) -> Vec<(u64, StepWork)> {
    let mut out = Vec::new();
    for w in windows {
        let p = &w.phase_s;
        let own = p.plan + p.read + p.fill + p.assemble;
        let exchange = (p.exchange - w.peer_wait_s).max(0.0);
        // The part of the window's wait that was not waiting for peers, and its split.
        let kept = if w.wait_s > 0.0 { ((w.wait_s - w.peer_wait_s) / w.wait_s).clamp(0.0, 1.0) } else { 0.0 };
        let load_share = if own + exchange > 0.0 { own / (own + exchange) } else { 1.0 };
        for (i, (&wait, &train)) in w.step_wait_s.iter().zip(&w.step_compute_s).enumerate() {
            let waited = wait * kept;
            out.push((
                w.first_step + i as u64,
                StepWork { load_s: waited * load_share, exchange_s: waited * (1.0 - load_share), train_s: train },
            ));
        }
    }
    out
}

/// Replays an epoch from every rank's steps (`ranks[r]`: rank `r`'s, with its host), or
/// `None` where no step was recorded by every rank.
pub fn replay(ranks: &[(String, Vec<(u64, StepWork)>)]) -> Option<StepReplay> {
    use std::collections::BTreeMap;
    let n = ranks.len();
    let mut by_step: BTreeMap<u64, Vec<Option<StepWork>>> = BTreeMap::new();
    for (r, (_, steps)) in ranks.iter().enumerate() {
        for &(s, work) in steps {
            by_step.entry(s).or_insert_with(|| vec![None; n])[r] = Some(work);
        }
    }
    let steps: Vec<(u64, Vec<StepWork>)> =
        by_step.into_iter().filter_map(|(s, w)| w.into_iter().collect::<Option<Vec<_>>>().map(|w| (s, w))).collect();
    if steps.is_empty() || n == 0 {
        return None;
    }
    let totals: Vec<f64> = (0..n).map(|r| steps.iter().map(|(_, w)| w[r].total()).sum()).collect();
    let slowest = (0..n).max_by(|&a, &b| totals[a].total_cmp(&totals[b])).expect("ranks");
    let medians: Vec<StepWork> = steps
        .iter()
        .map(|(_, w)| StepWork {
            load_s: median(w.iter().map(|x| x.load_s).collect()),
            exchange_s: median(w.iter().map(|x| x.exchange_s).collect()),
            train_s: median(w.iter().map(|x| x.train_s).collect()),
        })
        .collect();
    // The epoch replayed with the slowest rank's kinds `kinds` set to the median.
    let replayed_with = |kinds: &[usize]| -> f64 {
        steps
            .iter()
            .zip(&medians)
            .map(|((_, w), m)| {
                let mut mine = w[slowest];
                for &k in kinds {
                    mine.set(k, m.get(k));
                }
                (0..n).map(|r| if r == slowest { mine.total() } else { w[r].total() }).fold(0.0, f64::max)
            })
            .sum()
    };
    let replayed = replayed_with(&[]);
    let saved: Vec<f64> = (0..3).map(|k| (replayed - replayed_with(&[k])).max(0.0)).collect();
    let cause = CAUSES[(0..3).max_by(|&a, &b| saved[a].total_cmp(&saved[b])).expect("kinds")];
    let mut slowest_steps: Vec<SlowStep> = steps
        .iter()
        .zip(&medians)
        .map(|((s, w), m)| {
            let r = (0..n).max_by(|&a, &b| w[a].total().total_cmp(&w[b].total())).expect("ranks");
            let k =
                (0..3).max_by(|&a, &b| (w[r].get(a) - m.get(a)).total_cmp(&(w[r].get(b) - m.get(b)))).expect("kinds");
            SlowStep {
                step: *s,
                seconds: w[r].total(),
                median_s: median(w.iter().map(StepWork::total).collect()),
                rank: r,
                host: ranks[r].0.clone(),
                cause: CAUSES[k],
            }
        })
        .collect();
    slowest_steps.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then(a.step.cmp(&b.step)));
    slowest_steps.truncate(SLOWEST_STEPS);
    Some(StepReplay {
        steps: steps.len() as u64,
        replayed_s: replayed,
        what_if_s: replayed_with(&[0, 1, 2]),
        slowest_rank: slowest,
        slowest_host: ranks[slowest].0.clone(),
        saving: Saving { data_loading_s: saved[0], exchange_s: saved[1], training_step_s: saved[2] },
        cause,
        slowest_steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshfeed::telemetry::{Phases, SCHEMA};

    /// A window of rank `rank` at `first`: its steps' waits and training times, its read
    /// and exchange time and peer waiting.
    fn window(
        rank: usize,
        first: u64,
        wait: &[f64],
        train: &[f64],
        read: f64,
        exchange: f64,
        peer: f64,
    ) -> WindowRecord {
        WindowRecord {
            schema: SCHEMA,
            rank,
            first_step: first,
            steps: wait.len() as u64,
            phase_s: Phases { read, exchange, ..Phases::default() },
            peer_wait_s: peer,
            wait_s: wait.iter().sum(),
            compute_s: train.iter().sum(),
            step_wait_s: wait.to_vec(),
            step_compute_s: train.to_vec(),
            ..WindowRecord::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// Three ranks, four steps in two windows of two. Rank 2's training step takes 0.1 s
    /// where the others' take 0.01 s, and the others wait 0.09 s for it at each window,
    /// all of it in agreements: the slow rank is 2, in its training step, and the epoch
    /// had taken 4 × 0.01 s with rank 2 at the median.
    #[test]
    fn a_slow_training_step_is_found_and_priced() {
        let rank = |r: usize| -> Vec<(u64, StepWork)> {
            let (train, wait, peer) = if r == 2 { (0.1, 0.0, 0.0) } else { (0.01, 0.09, 0.09) };
            let ws = [
                window(r, 0, &[wait, 0.0], &[train, train], 0.001, 0.0, peer),
                window(r, 2, &[wait, 0.0], &[train, train], 0.001, 0.0, peer),
            ];
            rank_steps(&ws.iter().collect::<Vec<_>>())
        };
        let ranks: Vec<(String, Vec<(u64, StepWork)>)> = (0..3).map(|r| (format!("h{r}"), rank(r))).collect();
        let r = replay(&ranks).unwrap();
        assert_eq!((r.steps, r.slowest_rank, r.slowest_host.as_str(), r.cause), (4, 2, "h2", "training step"));
        assert!(close(r.replayed_s, 0.4) && close(r.what_if_s, 0.04), "{r:?}");
        assert!(close(r.saving.training_step_s, 0.36) && r.saving.data_loading_s == 0.0, "{r:?}");
        assert_eq!(r.slowest_steps.len(), 4);
        assert!(r.slowest_steps.iter().all(|s| s.rank == 2 && s.cause == "training step" && close(s.median_s, 0.01)));
    }

    /// Rank 1 reads its second window for 0.5 s (its consumer waits for it, not for
    /// peers); the others wait as long, in agreements. Steps take 0.01 s everywhere. Step 2
    /// is the slow one, in data loading, and the epoch had saved the 0.5 s; the exchange's
    /// own time (less peer waiting) is split off the wait in proportion.
    #[test]
    fn a_slow_read_is_found_in_its_step_and_priced_as_data_loading() {
        let rank = |r: usize| -> Vec<(u64, StepWork)> {
            let t = [0.01, 0.01];
            let ws = if r == 1 {
                [window(r, 0, &[0.0, 0.0], &t, 0.0, 0.0, 0.0), window(r, 2, &[0.6, 0.0], &t, 0.5, 0.1, 0.0)]
            } else {
                [window(r, 0, &[0.0, 0.0], &t, 0.0, 0.0, 0.0), window(r, 2, &[0.6, 0.0], &t, 0.0, 0.6, 0.6)]
            };
            rank_steps(&ws.iter().collect::<Vec<_>>())
        };
        let ranks: Vec<(String, Vec<(u64, StepWork)>)> = (0..3).map(|r| ("h".to_string(), rank(r))).collect();
        let r = replay(&ranks).unwrap();
        assert_eq!((r.slowest_rank, r.cause), (1, "data loading"));
        assert!(close(r.replayed_s, 0.64) && close(r.what_if_s, 0.04), "{r:?}");
        assert!(close(r.saving.data_loading_s, 0.5) && close(r.saving.exchange_s, 0.1), "{r:?}");
        assert_eq!(r.saving.training_step_s, 0.0);
        let first = &r.slowest_steps[0];
        assert_eq!((first.step, first.rank, first.cause), (2, 1, "data loading"));
        assert!(close(first.seconds, 0.61), "{first:?}");
    }

    /// Steps some rank did not record are left out; no common step, no replay.
    #[test]
    fn only_steps_every_rank_recorded_are_replayed() {
        let a = ("a".to_string(), vec![(0, StepWork { train_s: 1.0, ..Default::default() })]);
        let b = ("b".to_string(), vec![(1, StepWork { train_s: 1.0, ..Default::default() })]);
        assert_eq!(replay(&[a.clone(), b]), None);
        let c = ("c".to_string(), vec![(0, StepWork { train_s: 3.0, ..Default::default() }), (1, StepWork::default())]);
        let r = replay(&[a, c]).unwrap();
        assert_eq!((r.steps, r.slowest_rank), (1, 1));
        assert!(close(r.replayed_s, 3.0) && close(r.what_if_s, 2.0), "{r:?}");
    }
}
