//! Window plans: for a window of consecutive steps, which samples this rank reads, which
//! rows it sends to whom, and which rows it receives.
//!
//! Exchanging a window of steps at once amortises the collective's latency; the window
//! length is chosen so that the bytes in flight stay under the configured budget
//! ([`super::budget`]). Send and receive orders are both "step, then row of the global
//! batch", so a receiver can take rows off each source's segment in order without any
//! per-row header.

use std::ops::Range;

use super::home::HomeRanges;
use super::index::HomeIndex;
use super::permutation::Permutation;
use super::placement::Placement;
use crate::types::{Rank, SampleId};

/// The id of a window row a rank neither sends nor receives: it never learns it.
pub const UNPLANNED: SampleId = SampleId(u64::MAX);

/// What every window of an epoch is planned from.
#[derive(Clone, Copy, Debug)]
pub struct EpochOrder<'a> {
    /// The epoch's order.
    pub perm: &'a Permutation,
    pub home: &'a HomeRanges,
    /// Positions per step: the global batch size (a partial last batch's placement covers
    /// fewer rows).
    pub stride: usize,
}

/// The plan of one window of steps for one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// Steps covered, within the epoch.
    pub steps: Range<u64>,
    /// Global batch size.
    pub batch_size: usize,
    /// Sample id of every window row this rank sends or receives, [`UNPLANNED`] for the
    /// others: index `(step - steps.start) · B + row`.
    pub ids: Vec<SampleId>,
    /// Ids this rank reads from its home range, sorted.
    pub reads: Vec<SampleId>,
    /// Per destination rank: window rows this rank sends it, in order.
    pub sends: Vec<Vec<usize>>,
    /// Window rows this rank receives, in order.
    pub recvs: Vec<usize>,
    /// Permutation evaluations this plan took (index passes included).
    pub evaluations: u64,
}

impl WindowPlan {
    /// Plans steps `steps` of the epoch for rank `me`. Row `j` of step `k` is position
    /// `k·stride + j` of the order (`placement` may cover fewer rows than `stride`, for a
    /// partial last batch); positions at or past the dataset's end wrap to its start (the
    /// `pad` tail policy).
    ///
    /// Work is proportional to this rank's share, not to the window: the rows it sends
    /// come from `index` (the inverse permutation of its home range), and only the rows
    /// it receives — those of its block under `placement`, and `own_rows` of every step
    /// (a two-phase member's rows under the final placement) — are evaluated forwards.
    pub fn new(
        order: &EpochOrder<'_>,
        index: &mut HomeIndex,
        placement: &Placement,
        me: Rank,
        steps: Range<u64>,
        own_rows: Option<Range<usize>>,
    ) -> WindowPlan {
        let (perm, b, stride) = (order.perm, placement.batch_size(), order.stride as u64);
        let n = perm.len();
        let nsteps = (steps.end - steps.start) as usize;
        let before = index.evaluations;
        let mut evaluations = 0u64;
        let mut ids = vec![UNPLANNED; nsteps * b];
        let mut sends = vec![Vec::new(); placement.world()];
        let mut reads = Vec::new();
        let mut send = |i: usize, id: u64| {
            ids[i] = SampleId(id);
            let mut needed = false;
            for rc in &placement.block_of_row(i % b).receivers {
                if !rc.parts.is_empty() {
                    sends[rc.rank.0].push(i);
                    needed = true;
                }
            }
            if needed {
                reads.push(SampleId(id));
            }
        };
        for (s, k) in steps.clone().enumerate() {
            let first = k * stride;
            let end = first + b as u64;
            // Positions inside the epoch, from the index, in position order...
            for &(p, id) in index.lookup(perm, first.min(n)..end.min(n)) {
                send(s * b + (p - first) as usize, id);
            }
            // ...then those a padded last step wraps to the start (fewer than a batch).
            for p in n.max(first)..end {
                evaluations += 1;
                let id = perm.apply(p % n);
                if order.home.owner(SampleId(id)) == me {
                    send(s * b + (p - first) as usize, id);
                }
            }
        }
        reads.sort_unstable();
        // A padded last batch repeats the epoch's first samples: a window that holds both
        // reads each once (readers take unique rows).
        reads.dedup();

        let mut recvs = Vec::new();
        let received = placement.receiver(me).map(|(block, _)| block.rows.clone());
        for rows in [received.clone(), own_rows].into_iter().flatten() {
            for s in 0..nsteps {
                for row in rows.clone() {
                    let i = s * b + row;
                    if ids[i] == UNPLANNED {
                        evaluations += 1;
                        ids[i] = SampleId(perm.apply(((steps.start + s as u64) * stride + row as u64) % n));
                    }
                }
            }
        }
        if let Some(rows) = received {
            for s in 0..nsteps {
                recvs.extend(rows.clone().map(|row| s * b + row));
            }
        }
        evaluations += index.evaluations - before;
        WindowPlan { steps, batch_size: b, ids, reads, sends, recvs, evaluations }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plans `steps` for rank `me` with a fresh index that fits the home range.
    fn plan(
        perm: &Permutation,
        home: &HomeRanges,
        placement: &Placement,
        me: usize,
        steps: Range<u64>,
        stride: usize,
    ) -> WindowPlan {
        let mut index = HomeIndex::new(home.range(Rank(me)), u64::MAX);
        let order = EpochOrder { perm, home, stride };
        WindowPlan::new(&order, &mut index, placement, Rank(me), steps, None)
    }

    #[test]
    fn every_row_is_sent_once_by_its_owner_and_received_in_order() {
        let (n, b, p) = (103u64, 12usize, 4usize);
        let perm = Permutation::new(n, 7, 1);
        let home = HomeRanges::new(n, p);
        let placement = Placement::data_parallel(b, p, 2).unwrap();
        let plans: Vec<WindowPlan> = (0..p).map(|r| plan(&perm, &home, &placement, r, 2..5, b)).collect();
        // Every id a rank knows is the permutation's; each row is known to its owner and
        // its receiver, and no other row.
        for (r, plan) in plans.iter().enumerate() {
            for (i, &id) in plan.ids.iter().enumerate() {
                let want = SampleId(perm.apply((2 * b + i) as u64));
                let involved = home.owner(want) == Rank(r) || (i % b) / (b / p) == r;
                assert_eq!(id, if involved { want } else { UNPLANNED }, "rank {r} row {i}");
            }
        }
        // Each window row is sent exactly once, by its owner, to the rank whose rows hold it.
        let mut seen = vec![0; 3 * b];
        for (src, plan) in plans.iter().enumerate() {
            for (dst, rows) in plan.sends.iter().enumerate() {
                assert!(rows.windows(2).all(|w| w[0] < w[1]), "send order is window order");
                for &i in rows {
                    seen[i] += 1;
                    assert_eq!(home.owner(plan.ids[i]), Rank(src));
                    assert_eq!((i % b) / (b / p), dst);
                }
            }
            let mut reads: Vec<_> = plan.sends.iter().flatten().map(|&i| plan.ids[i]).collect();
            reads.sort();
            assert_eq!(plan.reads, reads);
        }
        assert!(seen.iter().all(|&c| c == 1));
        // Rank 1 receives rows 3..6 of each of the three steps.
        assert_eq!(plans[1].recvs, vec![3, 4, 5, 15, 16, 17, 27, 28, 29]);
    }

    #[test]
    fn partial_and_padded_steps() {
        let (n, b) = (10u64, 4usize);
        let perm = Permutation::new(n, 1, 0);
        let one = HomeRanges::new(n, 1);
        // The partial last step (rows 8, 9) with a 2-row placement.
        let tail = Placement::data_parallel(2, 1, 1).unwrap();
        let p = plan(&perm, &one, &tail, 0, 2..3, b);
        assert_eq!(p.ids, vec![SampleId(perm.apply(8)), SampleId(perm.apply(9))]);
        // A padded last step wraps to the start of the order, on every rank that sends it.
        let full = Placement::data_parallel(b, 2, 1).unwrap();
        let two = HomeRanges::new(n, 2);
        let want: Vec<SampleId> = [8, 9, 0, 1].iter().map(|&p| SampleId(perm.apply(p))).collect();
        let plans: Vec<WindowPlan> = (0..2).map(|r| plan(&perm, &two, &full, r, 2..3, b)).collect();
        for (i, want) in want.iter().enumerate() {
            let sender = two.owner(*want).0;
            assert_eq!(plans[sender].ids[i], *want);
            assert!(plans[sender].sends[i / 2].contains(&i));
        }
        // A window of the whole padded epoch reads every sample once.
        let p = plan(&perm, &one, &Placement::data_parallel(b, 1, 1).unwrap(), 0, 0..3, b);
        assert_eq!(p.ids.len(), 12);
        assert_eq!(p.reads, (0..n).map(SampleId).collect::<Vec<_>>());
    }

    /// Planning an epoch costs each rank its home range (the index) plus the rows it
    /// receives, not the epoch's every row: evaluations per rank fall as ranks are added.
    #[test]
    fn planning_an_epoch_is_linear_in_a_ranks_share() {
        let (n, b) = (4096u64, 64usize);
        let perm = Permutation::new(n, 5, 0);
        let mut per_rank = vec![];
        for p in [1usize, 2, 4, 8] {
            let home = HomeRanges::new(n, p);
            let placement = Placement::data_parallel(b, p, 1).unwrap();
            let order = EpochOrder { perm: &perm, home: &home, stride: b };
            let mut most = 0;
            for r in 0..p {
                let mut index = HomeIndex::new(home.range(Rank(r)), u64::MAX);
                let mut evaluations = 0;
                for w in (0..n / b as u64).step_by(4) {
                    evaluations += WindowPlan::new(&order, &mut index, &placement, Rank(r), w..w + 4, None).evaluations;
                }
                // Home range once, plus the n / p received rows it does not own.
                let share = n / p as u64;
                assert!((share..=2 * share).contains(&evaluations), "{p} ranks, rank {r}: {evaluations}");
                most = most.max(evaluations);
            }
            per_rank.push(most);
        }
        assert!(per_rank.windows(2).all(|w| w[1] < w[0]), "{per_rank:?}");
        assert!(per_rank[3] * 4 < per_rank[0], "8 ranks: {per_rank:?}");
    }
}
