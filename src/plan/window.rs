//! Window plans: for a window of consecutive steps, which samples this rank reads, which
//! rows it sends to whom, and which rows it receives.
//!
//! Exchanging a window of steps at once amortises the collective's latency; the window
//! length is chosen so that the bytes in flight stay under the configured budget
//! ([`super::budget`]). Send and receive orders are both "step, then row of the global
//! batch", so a receiver can take rows off each source's segment in order without any
//! per-row header.

use std::ops::Range;

use rayon::prelude::*;

use super::{HomeRanges, Permutation, Placement};
use crate::types::{Rank, SampleId};

/// The plan of one window of steps for one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    /// Steps covered, within the epoch.
    pub steps: Range<u64>,
    /// Global batch size.
    pub batch_size: usize,
    /// Sample id of every row of every step: index `(step - steps.start) · B + row`.
    pub ids: Vec<SampleId>,
    /// Ids this rank reads from its home range, sorted.
    pub reads: Vec<SampleId>,
    /// Per destination rank: window rows this rank sends it, in order.
    pub sends: Vec<Vec<usize>>,
    /// Window rows this rank receives, in order.
    pub recvs: Vec<usize>,
}

impl WindowPlan {
    /// Plans steps `steps` of the epoch whose order is `perm`, for rank `me`. Row `j` of
    /// step `k` is position `k·stride + j` of the order (`stride` is the global batch size;
    /// `placement` may cover fewer rows, for a partial last batch); positions at or past
    /// the dataset's end wrap to its start (the `pad` tail policy).
    pub fn new(
        perm: &Permutation,
        home: &HomeRanges,
        placement: &Placement,
        me: Rank,
        steps: Range<u64>,
        stride: usize,
    ) -> WindowPlan {
        let b = placement.batch_size();
        let n = perm.len();
        let positions =
            steps.clone().flat_map(|k| (0..b as u64).map(move |j| k * stride as u64 + j)).collect::<Vec<_>>();
        // The permutation is the one O(rows) computation of the plan; spread it over cores.
        let ids: Vec<SampleId> = positions.into_par_iter().map(|p| SampleId(perm.apply(p % n))).collect();

        let mut sends = vec![Vec::new(); placement.world()];
        let mut reads = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            if home.owner(id) != me {
                continue;
            }
            let mut needed = false;
            for rc in &placement.block_of_row(i % b).receivers {
                if !rc.parts.is_empty() {
                    sends[rc.rank.0].push(i);
                    needed = true;
                }
            }
            if needed {
                reads.push(id);
            }
        }
        reads.sort_unstable();
        // A padded last batch repeats the epoch's first samples: a window that holds both
        // reads each once (readers take unique rows).
        reads.dedup();

        let mut recvs = Vec::new();
        if let Some((block, _)) = placement.receiver(me) {
            for s in 0..(steps.end - steps.start) as usize {
                recvs.extend(block.rows.clone().map(|row| s * b + row));
            }
        }
        WindowPlan { steps, batch_size: b, ids, reads, sends, recvs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_is_sent_once_by_its_owner_and_received_in_order() {
        let (n, b, p) = (103u64, 12usize, 4usize);
        let perm = Permutation::new(n, 7, 1);
        let home = HomeRanges::new(n, p);
        let placement = Placement::data_parallel(b, p, 2).unwrap();
        let plans: Vec<WindowPlan> =
            (0..p).map(|r| WindowPlan::new(&perm, &home, &placement, Rank(r), 2..5, b)).collect();
        // All ranks agree on the ids; the ids are the permutation's.
        for plan in &plans {
            assert_eq!(plan.ids, plans[0].ids);
        }
        assert_eq!(plans[0].ids[0], SampleId(perm.apply(24)));
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
        let home = HomeRanges::new(n, 2);
        // The partial last step (rows 8, 9) with a 2-row placement.
        let tail = Placement::data_parallel(2, 2, 1).unwrap();
        let plan = WindowPlan::new(&perm, &home, &tail, Rank(0), 2..3, b);
        assert_eq!(plan.ids, vec![SampleId(perm.apply(8)), SampleId(perm.apply(9))]);
        // A padded last step wraps to the start of the order.
        let full = Placement::data_parallel(b, 2, 1).unwrap();
        let plan = WindowPlan::new(&perm, &home, &full, Rank(0), 2..3, b);
        let want: Vec<SampleId> = [8, 9, 0, 1].iter().map(|&p| SampleId(perm.apply(p))).collect();
        assert_eq!(plan.ids, want);
        // A window of the whole padded epoch reads every sample once.
        let plan = WindowPlan::new(
            &perm,
            &HomeRanges::new(n, 1),
            &Placement::data_parallel(b, 1, 1).unwrap(),
            Rank(0),
            0..3,
            b,
        );
        assert_eq!(plan.ids.len(), 12);
        assert_eq!(plan.reads, (0..n).map(SampleId).collect::<Vec<_>>());
    }
}
