//! Home ranges: rank `r` of `P` owns the contiguous ids `[r·N/P, (r+1)·N/P)`; the first
//! `N mod P` ranks own one extra sample (docs/design.md, "Concepts"). A weighted split
//! ([`HomeRanges::weighted`]) gives each rank a length of its own, still contiguous and in
//! rank order; [`rebalance`] computes such lengths from the ranks' measured speeds. Who
//! reads a sample never changes the stream: the home ranges only decide which rank reads
//! and sends it.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::types::{Rank, SampleId};

/// The split of `[0, N)` into one contiguous home range per rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeRanges {
    samples: u64,
    ranks: u64,
    /// A weighted split: where each rank's range starts, then `N` (`None`: the equal split).
    starts: Option<Vec<u64>>,
}

impl HomeRanges {
    /// Splits `samples` ids over `ranks` ranks (`ranks >= 1`).
    pub fn new(samples: u64, ranks: usize) -> HomeRanges {
        assert!(ranks >= 1, "at least one rank");
        HomeRanges { samples, ranks: ranks as u64, starts: None }
    }

    /// Rank `r`'s range holds `lengths[r]` ids, in rank order: each at least one (every
    /// live rank reads something).
    pub fn weighted(lengths: &[u64]) -> Result<HomeRanges> {
        if lengths.is_empty() || lengths.contains(&0) {
            return Err(Error::Internal(format!("home range lengths {lengths:?}: every rank needs at least one id")));
        }
        let mut starts = Vec::with_capacity(lengths.len() + 1);
        let mut at = 0u64;
        for &n in lengths {
            starts.push(at);
            at = at.checked_add(n).ok_or_else(|| Error::Internal("home range lengths overflow".into()))?;
        }
        starts.push(at);
        Ok(HomeRanges { samples: at, ranks: lengths.len() as u64, starts: Some(starts) })
    }

    /// Each rank's number of ids, in rank order.
    pub fn lengths(&self) -> Vec<u64> {
        (0..self.ranks).map(|r| self.start(r + 1) - self.start(r)).collect()
    }

    fn start(&self, r: u64) -> u64 {
        if let Some(starts) = &self.starts {
            return starts[r as usize];
        }
        let (q, rem) = (self.samples / self.ranks, self.samples % self.ranks);
        r * q + r.min(rem)
    }

    /// The ids rank `r` reads.
    pub fn range(&self, r: Rank) -> Range<u64> {
        let r = r.0 as u64;
        self.start(r)..self.start(r + 1)
    }

    /// The rank whose home range holds `id`.
    pub fn owner(&self, id: SampleId) -> Rank {
        if let Some(starts) = &self.starts {
            return Rank(starts.partition_point(|&s| s <= id.0) - 1);
        }
        let (q, rem) = (self.samples / self.ranks, self.samples % self.ranks);
        let big = rem * (q + 1); // ids held by the ranks with one extra sample
        let r = if id.0 < big { id.0 / (q + 1) } else { rem + (id.0 - big) / q };
        Rank(r as usize)
    }
}

/// The most a balanced home range holds, as a multiple of the equal split's longest range:
/// the window budget counts a rank's read and send buffers at this share
/// ([`crate::plan::budget`]), so that balancing keeps the memory bound.
pub const MAX_SHARE: f64 = 1.5;

/// The next home range lengths, from the current ones and each rank's measured rate (ids
/// it read and sent per second of its own work, over the last epoch): each rank's share
/// moves towards its share of the total rate, by at most `max_change` of its current
/// length per call, never below one id nor above `cap` (a length already above it may
/// stay); the lengths still sum to the same total. A rate
/// that is not a positive number (a rank that measured nothing) counts as the median of
/// the others; with none, the lengths stay. Pure: every rank computes the same lengths
/// from the same (agreed) rates.
pub fn rebalance(lengths: &[u64], rates: &[f64], max_change: f64, cap: u64) -> Vec<u64> {
    let total: u64 = lengths.iter().sum();
    let mut known: Vec<f64> = rates.iter().copied().filter(|r| r.is_finite() && *r > 0.0).collect();
    if known.is_empty() || rates.len() != lengths.len() || total < lengths.len() as u64 {
        return lengths.to_vec();
    }
    known.sort_by(f64::total_cmp);
    let fill = known[known.len() / 2];
    let rates: Vec<f64> = rates.iter().map(|&r| if r.is_finite() && r > 0.0 { r } else { fill }).collect();
    let sum: f64 = rates.iter().sum();
    let c = max_change.clamp(0.0, 1.0);
    // Bounds per rank, as integers that hold the current lengths: Σ lo ≤ total ≤ Σ hi.
    let lo: Vec<u64> = lengths.iter().map(|&n| ((n as f64 * (1.0 - c)).ceil() as u64).clamp(1, n.max(1))).collect();
    let hi: Vec<u64> = lengths.iter().map(|&n| ((n as f64 * (1.0 + c)).floor() as u64).min(cap).max(n)).collect();
    // The targets, clamped; then what is missing (or over) shared among the ranks with
    // room, in proportion to their rates, until the total is met.
    let mut want: Vec<f64> = rates
        .iter()
        .zip(lo.iter().zip(&hi))
        .map(|(&r, (&l, &h))| (total as f64 * r / sum).clamp(l as f64, h as f64))
        .collect();
    for _ in 0..lengths.len() {
        let gap = total as f64 - want.iter().sum::<f64>();
        if gap.abs() < 1e-6 {
            break;
        }
        let open: Vec<bool> = (0..want.len())
            .map(|i| if gap > 0.0 { (hi[i] as f64) > want[i] } else { want[i] > lo[i] as f64 })
            .collect();
        let weight: f64 = (0..want.len()).filter(|&i| open[i]).map(|i| rates[i]).sum();
        if weight <= 0.0 {
            break;
        }
        for i in (0..want.len()).filter(|&i| open[i]) {
            want[i] = (want[i] + gap * rates[i] / weight).clamp(lo[i] as f64, hi[i] as f64);
        }
    }
    // Whole ids: the floors, then one more to the largest remainders that have room (or one
    // fewer from the smallest, where the floors overshoot).
    let mut out: Vec<u64> = want.iter().zip(&lo).map(|(&w, &l)| (w.floor() as u64).max(l)).collect();
    let mut order: Vec<usize> = (0..out.len()).collect();
    order.sort_by(|&a, &b| (want[b] - want[b].floor()).total_cmp(&(want[a] - want[a].floor())).then(a.cmp(&b)));
    let mut assigned: u64 = out.iter().sum();
    for &i in order.iter().cycle().take(4 * out.len() + 4) {
        if assigned == total {
            break;
        }
        if assigned < total && out[i] < hi[i] {
            out[i] += 1;
            assigned += 1;
        } else if assigned > total && out[i] > lo[i] {
            out[i] -= 1;
            assigned -= 1;
        }
    }
    if assigned != total {
        return lengths.to_vec();
    }
    out
}

/// How far [`next_lengths`] moves the ranges, and when it leaves them be.
#[derive(Clone, Copy, Debug)]
pub struct Damping {
    /// The most a length changes in one call, as a part of itself.
    pub max_change: f64,
    /// No change unless some length would move by more than this part of itself
    /// (measuring noise).
    pub dead_band: f64,
    /// No change unless the slowest rank's time would fall by at least this many seconds
    /// per epoch, were the rows read at the measured rates in the best split: a gain
    /// smaller than a loaded machine's scheduling noise is not worth a move.
    pub min_gain_s: f64,
}

/// The lengths the ranks move to at an epoch's start, from each rank's measure over the
/// last (`(rows, seconds)`: the rows it read and sent, and its own time doing so):
/// [`rebalance`] by at most `damping.max_change`, each at most [`MAX_SHARE`] of `equal`
/// (the equal split's longest range), or `None` where the gain or the move is below
/// `damping`'s thresholds (the ranges stay). Pure, like [`rebalance`].
pub fn next_lengths(lengths: &[u64], measures: &[(u64, f64)], equal: u64, damping: Damping) -> Option<Vec<u64>> {
    let rates: Vec<f64> =
        measures.iter().map(|&(rows, s)| if rows > 0 && s > 0.0 { rows as f64 / s } else { 0.0 }).collect();
    // The slowest rank's time against the time at which all the rows are read at the
    // summed rates (ranks that measured nothing left out of both).
    let slowest = measures.iter().map(|&(_, s)| s).fold(0.0, f64::max);
    let measured = || measures.iter().zip(&rates).filter(|(_, &rate)| rate > 0.0);
    let rows: u64 = measured().map(|(&(rows, _), _)| rows).sum();
    let rate: f64 = measured().map(|(_, &rate)| rate).sum();
    if rate <= 0.0 || slowest - rows as f64 / rate < damping.min_gain_s {
        return None;
    }
    let (max_change, dead_band) = (damping.max_change, damping.dead_band);
    let cap = (equal as f64 * MAX_SHARE).floor() as u64;
    let next = rebalance(lengths, &rates, max_change, cap);
    let moved = lengths.iter().zip(&next).any(|(&a, &b)| b.abs_diff(a) as f64 > dead_band * a as f64);
    moved.then_some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_ranges_tile_the_ids_in_rank_order_and_owner_agrees() {
        let h = HomeRanges::weighted(&[3, 1, 5, 2]).unwrap();
        assert_eq!(h.lengths(), [3, 1, 5, 2]);
        assert_eq!((h.range(Rank(0)), h.range(Rank(2)), h.range(Rank(3))), (0..3, 4..9, 9..11));
        let owners: Vec<usize> = (0..11).map(|id| h.owner(SampleId(id)).0).collect();
        assert_eq!(owners, [0, 0, 0, 1, 2, 2, 2, 2, 2, 3, 3]);
        assert_eq!(HomeRanges::new(10, 3).lengths(), [4, 3, 3]);
        assert!(HomeRanges::weighted(&[2, 0, 1]).is_err() && HomeRanges::weighted(&[]).is_err());
    }

    /// Equal rates keep the split; a rank at half the others' rate (2 : 2 : 1) loses at most
    /// a quarter of its range per call and settles at its share of the total rate, 1/5.
    #[test]
    fn rebalancing_follows_the_rates_by_bounded_steps() {
        assert_eq!(rebalance(&[100, 100, 100], &[2.0, 2.0, 2.0], 0.25, u64::MAX), [100, 100, 100]);
        let mut lengths = vec![100, 100, 100];
        let mut seen = vec![];
        for _ in 0..6 {
            let next = rebalance(&lengths, &[2.0, 2.0, 1.0], 0.25, u64::MAX);
            assert_eq!(next.iter().sum::<u64>(), 300);
            for (a, b) in lengths.iter().zip(&next) {
                assert!(b.abs_diff(*a) as f64 <= 0.25 * *a as f64 + 1.0, "{lengths:?} -> {next:?}");
            }
            lengths = next;
            seen.push(lengths[2]);
        }
        // The slow rank's share: 1/5 of 300 = 60, reached in two steps (100 → 75 → 60).
        assert_eq!(seen, [75, 60, 60, 60, 60, 60]);
        assert_eq!(lengths, [120, 120, 60]);
        // A rank that measured nothing counts as the median; nobody measured: no change.
        assert_eq!(rebalance(&[50, 50, 50], &[1.0, f64::NAN, 1.0], 0.5, u64::MAX), [50, 50, 50]);
        assert_eq!(rebalance(&[7, 3], &[0.0, 0.0], 0.5, u64::MAX), [7, 3]);
        // Never below one id, even for a rank a thousand times slower.
        let tiny = rebalance(&[2, 2, 2], &[1000.0, 1000.0, 1.0], 1.0, u64::MAX);
        assert_eq!((tiny.iter().sum::<u64>(), tiny[2]), (6, 1));
    }

    #[test]
    fn next_lengths_follow_rows_per_second_beyond_the_noise() {
        let damping = |max_change, min_gain_s| Damping { max_change, dead_band: 0.1, min_gain_s };
        // Rank 2 read as many rows in twice the time: towards its share (60), by the bound.
        let slow = [(100, 1.0), (100, 1.0), (100, 2.0)];
        assert_eq!(next_lengths(&[100, 100, 100], &slow, 100, damping(0.25, 0.0)), Some(vec![113, 112, 75]));
        // Rates 5 % apart are noise; a rank that measured nothing counts as the median.
        let near = [(100, 1.0), (100, 1.05), (100, 1.0)];
        assert_eq!(next_lengths(&[100, 100, 100], &near, 100, damping(0.5, 0.0)), None);
        assert_eq!(next_lengths(&[100, 100], &[(0, 0.0), (100, 1.0)], 100, damping(0.5, 0.0)), None);
        // Settled: per-row rates unchanged, the lengths already proportional to them.
        let settled = [(120, 1.0), (120, 1.0), (60, 1.0)];
        assert_eq!(next_lengths(&[120, 120, 60], &settled, 100, damping(0.5, 0.0)), None);
        // A rank a hundred times slower than the other: the fast one holds at most 1.5×
        // the equal split (the memory budget counts it so), the slow one the rest.
        let lopsided = [(100, 0.01), (100, 1.0)];
        assert_eq!(next_lengths(&[100, 100], &lopsided, 100, damping(0.5, 0.0)), Some(vec![150, 50]));
        assert_eq!(next_lengths(&[150, 50], &lopsided, 100, damping(0.5, 0.0)), None);
        // The gain: the slow rank's 2 s against 300 rows at 250 rows/s, 1.2 s. A gain under
        // the threshold moves nothing, whatever the rates: a millisecond epoch's rates are
        // scheduling noise.
        assert_eq!(next_lengths(&[100, 100, 100], &slow, 100, damping(0.25, 0.79)), Some(vec![113, 112, 75]));
        assert_eq!(next_lengths(&[100, 100, 100], &slow, 100, damping(0.25, 0.81)), None);
        let tiny = [(100, 0.0001), (100, 0.0001), (100, 0.0002)];
        assert_eq!(next_lengths(&[100, 100, 100], &tiny, 100, damping(0.25, 0.05)), None);
        assert_eq!(next_lengths(&[100, 100, 100], &tiny, 100, damping(0.25, 0.0)), Some(vec![113, 112, 75]));
    }

    proptest::proptest! {
        /// Whatever the lengths and rates: the total is kept, every rank keeps at least one
        /// id and grows to no more than the cap, and no length moves by more than the bound
        /// (and one id of rounding).
        #[test]
        fn rebalancing_keeps_the_total_and_the_bounds(
            lengths in proptest::collection::vec(1u64..10_000, 1..12),
            rates in proptest::collection::vec(0.0f64..1e6, 12),
            c in 0.0f64..1.0,
            cap in 1u64..20_000,
        ) {
            let rates = &rates[..lengths.len()];
            let next = rebalance(&lengths, rates, c, cap);
            proptest::prop_assert_eq!(next.iter().sum::<u64>(), lengths.iter().sum::<u64>());
            for (a, b) in lengths.iter().zip(&next) {
                proptest::prop_assert!(*b >= 1 && *b <= cap.max(*a));
                proptest::prop_assert!(b.abs_diff(*a) as f64 <= c * *a as f64 + 1.0, "{:?} -> {:?}", lengths, next);
            }
            let h = HomeRanges::weighted(&next).unwrap();
            proptest::prop_assert_eq!(h.lengths(), next);
        }
    }

    #[test]
    fn ranges_tile_the_ids_and_owner_agrees() {
        for (n, p) in [(1, 1), (10, 3), (10, 10), (101, 4), (7, 2), (1000, 7), (64, 8)] {
            let h = HomeRanges::new(n, p);
            let mut next = 0;
            for r in 0..p {
                let range = h.range(Rank(r));
                assert_eq!(range.start, next);
                let len = range.end - range.start;
                assert!(len == n / p as u64 || len == n / p as u64 + 1);
                for id in range.clone() {
                    assert_eq!(h.owner(SampleId(id)), Rank(r), "n={n} p={p} id={id}");
                }
                next = range.end;
            }
            assert_eq!(next, n);
        }
    }
}
