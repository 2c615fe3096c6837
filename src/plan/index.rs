//! Where a rank's home samples fall in an epoch's order: the inverse permutation of its
//! home range, so that a rank plans what it sends in O(N/P) work per epoch instead of
//! evaluating the position of every row of every step (O(N) on every rank).
//!
//! The index holds `(position, id)` for the home ids whose positions lie in a *span* of
//! the epoch's positions, sorted by position. Building a span evaluates the inverse
//! permutation once for every home id; a span is as long as the entry cap allows (the
//! expected number of home ids in `L` positions is `L · home / n`), so an epoch takes one
//! pass when the whole home range fits the cap and a few passes otherwise — memory stays
//! bounded however small the samples are.

use std::ops::Range;

use super::permutation::Permutation;

/// Bytes of one index entry, for sizing the cap.
pub const ENTRY_BYTES: u64 = 16;

/// The inverse permutation of one home range over a span of positions.
#[derive(Debug)]
pub struct HomeIndex {
    home: Range<u64>,
    max_entries: u64,
    /// The permutation the span was built for (`None`: nothing built yet).
    built_for: Option<Permutation>,
    span: Range<u64>,
    /// `(position, id)` with position in `span`, sorted by position.
    entries: Vec<(u64, u64)>,
    /// Permutation evaluations so far (each inverse of a home id counts one).
    pub evaluations: u64,
}

impl HomeIndex {
    /// An index of `home` holding at most about `max_entries` entries at a time.
    pub fn new(home: Range<u64>, max_entries: u64) -> HomeIndex {
        HomeIndex {
            home,
            max_entries: max_entries.max(1),
            built_for: None,
            span: 0..0,
            entries: vec![],
            evaluations: 0,
        }
    }

    /// The home ids at `positions` (within `[0, perm.len())`) with their positions, in
    /// position order. Rebuilds the span when `positions` is outside it.
    pub fn lookup(&mut self, perm: &Permutation, positions: Range<u64>) -> &[(u64, u64)] {
        if positions.is_empty() {
            return &[];
        }
        let current = self.built_for.as_ref() == Some(perm);
        if !current || positions.start < self.span.start || positions.end > self.span.end {
            self.build(perm, positions.clone());
        }
        let lo = self.entries.partition_point(|e| e.0 < positions.start);
        let hi = self.entries.partition_point(|e| e.0 < positions.end);
        &self.entries[lo..hi]
    }

    /// Builds the span starting at `need.start`, covering at least `need`.
    fn build(&mut self, perm: &Permutation, need: Range<u64>) {
        let (n, home) = (perm.len(), self.home.end - self.home.start);
        // Positions whose expected home ids fill the cap: max_entries · n / home.
        let len = if home <= self.max_entries {
            n
        } else {
            ((self.max_entries as u128 * n as u128) / home.max(1) as u128) as u64
        };
        let end = need.start.saturating_add(len.max(need.end - need.start)).min(n);
        let span = need.start..end;
        // Refilled in place, sequentially: a fresh (or parallel-collected) vector per pass
        // would leave the allocator a new block of this size each time. A rank's share is
        // one core's work; the ranks are the parallelism.
        self.entries.clear();
        self.entries.reserve((self.max_entries.min(home) + self.max_entries.min(home) / 8) as usize);
        self.entries.extend(self.home.clone().filter_map(|id| {
            let p = perm.invert(id);
            span.contains(&p).then_some((p, id))
        }));
        self.entries.sort_unstable();
        self.evaluations += home;
        self.span = span;
        self.built_for = Some(perm.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every home id at the asked positions, found by brute force.
    fn expected(perm: &Permutation, home: &Range<u64>, positions: Range<u64>) -> Vec<(u64, u64)> {
        positions.map(|p| (p, perm.apply(p))).filter(|(_, id)| home.contains(id)).collect()
    }

    #[test]
    fn finds_every_home_id_in_one_pass_when_it_fits() {
        let perm = Permutation::new(1000, 3, 0);
        let home = 250..500;
        let mut index = HomeIndex::new(home.clone(), 1 << 20);
        for w in (0..1000).step_by(64) {
            let positions = w..(w + 64).min(1000);
            assert_eq!(index.lookup(&perm, positions.clone()), expected(&perm, &home, positions));
        }
        assert_eq!(index.evaluations, 250, "one pass over the home range");
        // Another epoch rebuilds.
        let next = Permutation::new(1000, 3, 1);
        assert_eq!(index.lookup(&next, 0..1000), expected(&next, &home, 0..1000));
        assert_eq!(index.evaluations, 500);
    }

    #[test]
    fn a_small_cap_takes_several_passes_and_bounded_memory() {
        let perm = Permutation::new(10_000, 9, 2);
        let home = 0..2_500;
        let mut index = HomeIndex::new(home.clone(), 200);
        for w in (0..10_000).step_by(100) {
            let positions = w..w + 100;
            assert_eq!(index.lookup(&perm, positions.clone()), expected(&perm, &home, positions));
            assert!(index.entries.len() < 400, "{} entries for a cap of 200", index.entries.len());
        }
        // Spans of 200 · 10000 / 2500 = 800 positions: 13 passes over 10 000 positions.
        assert_eq!(index.evaluations / 2_500, 13);
        // Seeking back rebuilds from there.
        assert_eq!(index.lookup(&perm, 0..10), expected(&perm, &home, 0..10));
    }

    #[test]
    fn lookups_wider_than_a_span_are_whole() {
        let perm = Permutation::new(5_000, 1, 0);
        let home = 1_000..3_000;
        let mut index = HomeIndex::new(home.clone(), 10);
        assert_eq!(index.lookup(&perm, 100..2_100), expected(&perm, &home, 100..2_100));
        assert!(index.lookup(&perm, 7..7).is_empty());
    }
}
