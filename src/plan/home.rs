//! Home ranges: rank `r` of `P` owns the contiguous ids `[r·N/P, (r+1)·N/P)`; the first
//! `N mod P` ranks own one extra sample (docs/design.md, "Concepts").

use std::ops::Range;

use crate::types::{Rank, SampleId};

/// The split of `[0, N)` into one contiguous home range per rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeRanges {
    samples: u64,
    ranks: u64,
}

impl HomeRanges {
    /// Splits `samples` ids over `ranks` ranks (`ranks >= 1`).
    pub fn new(samples: u64, ranks: usize) -> HomeRanges {
        assert!(ranks >= 1, "at least one rank");
        HomeRanges { samples, ranks: ranks as u64 }
    }

    fn start(&self, r: u64) -> u64 {
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
        let (q, rem) = (self.samples / self.ranks, self.samples % self.ranks);
        let big = rem * (q + 1); // ids held by the ranks with one extra sample
        let r = if id.0 < big { id.0 / (q + 1) } else { rem + (id.0 - big) / q };
        Rank(r as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
