//! The per-epoch global sample order, as a seekable pseudo-random permutation.
//!
//! The global order of an epoch is a permutation `pi(seed, epoch)` of `[0, n)`: position `p`
//! of the epoch reads sample id `pi(p)`. It is never stored. Each position is evaluated on
//! demand in O(1) time and memory with a keyed Feistel network over the smallest power-of-two
//! domain `2^b` with `b` even, `b >= ceil(log2(n))` and `b >= 4`, combined with *cycle
//! walking*: the network is a bijection of `[0, 2^b)`, so re-applying it to a value `>= n`
//! until the value falls below `n` yields a bijection of `[0, n)` (the walk from a position
//! `< n` must end, at the latest when its cycle returns to the position itself). Rounding `b`
//! up to an even number makes the domain smaller than `4n` (for `n > 4`), so a walk takes
//! fewer than 4 network evaluations on average.
//!
//! Why not shuffle an index array: with hundreds of millions of samples per epoch, every rank
//! would materialise the same O(n) array only to read its own slice of it. Here each rank
//! evaluates just the positions it owns, any position can be sought directly (resuming
//! mid-epoch needs no replay), and all ranks agree bit for bit because the order depends only
//! on `(n, seed, epoch)`, and the shared order where a job opts into one (docs/design.md,
//! "Concepts").
//!
//! This is a shuffle, not cryptography: the round keys come from a strong 64-bit mixer so
//! that orders of different seeds and epochs are unrelated, but nothing here is meant to
//! resist an adversary.
//!
//! **A shared order** ([`SharedOrder`], opt-in) correlates the orders of jobs that share a
//! feeder whose memory cannot hold the dataset (Joader's dependent sampling, made
//! deterministic): each job's order is `shared ∘ own`, where `shared` is the permutation
//! of the sweep's common seed and `own` reorders positions only within consecutive blocks
//! of `block` positions, keyed by the job's own seed. Every job then visits the same
//! samples block by block, in its own order inside each block, so that a row read from
//! storage for one job is read from the feeder's cache by the others. Each job's order is
//! still a uniform random permutation of the epoch: composing a uniform permutation with
//! any permutation chosen independently of it gives a uniform permutation.

pub use crate::config::SharedOrder;

/// Number of Feistel rounds. Luby-Rackoff needs 4 for a pseudo-random permutation with
/// ideal round functions; 8 leaves a wide margin for tiny half-blocks and a cheap mixer.
const ROUNDS: usize = 8;

/// Smallest half-block width, in bits (a domain of at least `2^4`): 1-bit halves leave a
/// round function only 4 possible tables, far too few to reach a well-spread permutation.
const MIN_HALF_BITS: u32 = 2;

/// Weyl-sequence increment of splitmix64 (2^64 / golden ratio, odd).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// A seekable pseudo-random permutation of `[0, n)`, fixed by `(n, seed, epoch)` (and a
/// [`SharedOrder`], where one is given: [`Permutation::of`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    /// Width of each Feistel half; the network permutes `[0, 2^(2 * half_bits))`.
    half_bits: u32,
    /// `2^half_bits - 1`; `half_bits <= 32`, so the shift never reaches 64.
    half_mask: u64,
    keys: [u64; ROUNDS],
    /// With a shared order: the job's own reordering within blocks, applied to a position
    /// before the network (whose keys are then the shared seed's).
    within: Option<Within>,
}

/// A job's own reordering of a shared order: positions permuted within blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Within {
    seed: u64,
    epoch: u64,
    block: u64,
}

impl Within {
    /// The permutation of block `b`'s positions (the last block may be shorter).
    fn block(&self, b: u64, n: u64) -> (u64, Permutation) {
        let start = b * self.block;
        let len = self.block.min(n - start);
        (start, Permutation::new(len, fmix64(self.seed ^ fmix64(b.wrapping_add(GOLDEN_GAMMA))), self.epoch))
    }
}

impl Permutation {
    /// The order of `epoch` under `seed` for a dataset of `n` samples.
    ///
    /// # Panics
    ///
    /// If `n == 0`: callers reject empty datasets before planning an epoch.
    #[must_use]
    #[inline]
    pub fn new(n: u64, seed: u64, epoch: u64) -> Permutation {
        assert!(n >= 1, "Permutation::new: n must be >= 1 (got 0)");

        // ceil(log2(n)) without overflow: n - 1 never wraps (n >= 1), and the result is at
        // most 64. Halving and rounding up yields the even total width; n <= 2^64 - 1
        // bounds half_bits by 32, so both the mask and the final `l << half_bits` are safe.
        let bits = u64::BITS - (n - 1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(MIN_HALF_BITS);
        let half_mask = (1u64 << half_bits) - 1;

        // Chained fmix64 with an offset keeps (seed, epoch) -> state injective in `epoch`
        // for a fixed seed (fmix64 is a bijection), so two epochs never share round keys;
        // the offset keeps seed 0 from mapping to state 0.
        let mut state = fmix64(fmix64(seed.wrapping_add(GOLDEN_GAMMA)) ^ epoch);
        let mut keys = [0u64; ROUNDS];
        for key in &mut keys {
            *key = splitmix64(&mut state);
        }

        Permutation { n, half_bits, half_mask, keys, within: None }
    }

    /// The order of `epoch` for a job of `seed`: its own permutation, or with `shared`,
    /// the shared order reordered within blocks by `seed` (module docs).
    #[must_use]
    pub fn of(n: u64, seed: u64, shared: Option<SharedOrder>, epoch: u64) -> Permutation {
        match shared {
            None => Permutation::new(n, seed, epoch),
            Some(SharedOrder { seed: common, block }) => {
                Permutation { within: Some(Within { seed, epoch, block }), ..Permutation::new(n, common, epoch) }
            }
        }
    }

    /// Number of positions (and of sample ids).
    // No `is_empty`: `new` rejects n == 0, so it would always be false.
    #[allow(clippy::len_without_is_empty)]
    #[must_use]
    #[inline]
    pub fn len(&self) -> u64 {
        self.n
    }

    /// The sample id at `position` (`position < n`).
    #[must_use]
    #[inline]
    pub fn apply(&self, position: u64) -> u64 {
        debug_assert!(position < self.n, "position {position} out of range for n = {}", self.n);
        let position = match &self.within {
            None => position,
            Some(within) => {
                let (start, own) = within.block(position / within.block, self.n);
                start + own.apply(position - start)
            }
        };
        let mut x = self.encrypt(position);
        while x >= self.n {
            x = self.encrypt(x);
        }
        x
    }

    /// The position holding sample id `id` (`id < n`): `invert(apply(p)) == p`.
    #[must_use]
    #[inline]
    pub fn invert(&self, id: u64) -> u64 {
        debug_assert!(id < self.n, "id {id} out of range for n = {}", self.n);
        // Walking the inverse network backwards retraces the forward walk exactly: the
        // intermediate values it steps over are the same out-of-range ones.
        let mut x = self.decrypt(id);
        while x >= self.n {
            x = self.decrypt(x);
        }
        match &self.within {
            None => x,
            Some(within) => {
                let (start, own) = within.block(x / within.block, self.n);
                start + own.invert(x - start)
            }
        }
    }

    /// One pass of the Feistel network over `[0, 2^(2 * half_bits))`.
    #[inline]
    fn encrypt(&self, x: u64) -> u64 {
        let mut l = x >> self.half_bits;
        let mut r = x & self.half_mask;
        for &key in &self.keys {
            (l, r) = (r, l ^ self.round(r, key));
        }
        (l << self.half_bits) | r
    }

    /// Inverse of [`Self::encrypt`]: the same rounds, keys in reverse order.
    #[inline]
    fn decrypt(&self, x: u64) -> u64 {
        let mut l = x >> self.half_bits;
        let mut r = x & self.half_mask;
        for &key in self.keys.iter().rev() {
            (l, r) = (r ^ self.round(l, key), l);
        }
        (l << self.half_bits) | r
    }

    /// Round function: every output bit depends on every input bit and key bit (fmix64
    /// avalanches), truncated to the half width. It need not be invertible; Feistel is.
    #[inline]
    fn round(&self, half: u64, key: u64) -> u64 {
        fmix64(half ^ key) & self.half_mask
    }
}

/// MurmurHash3's 64-bit finaliser: a bijection with full avalanche. Also what
/// [`super::blend`] derives its sources' and rows' seeds with.
#[inline]
pub(crate) fn fmix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// One step of splitmix64: advances `state` by the Weyl increment and mixes it.
#[inline]
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GOLDEN_GAMMA);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Pearson's chi-square statistic of observed counts against a uniform expectation.
    fn chi_square(counts: &[u64]) -> f64 {
        let total: u64 = counts.iter().sum();
        let expected = total as f64 / counts.len() as f64;
        counts
            .iter()
            .map(|&c| {
                let d = c as f64 - expected;
                d * d / expected
            })
            .sum()
    }

    #[test]
    fn domain_width_is_even_at_least_four_and_tight() {
        // (n, expected half_bits): the minimum, exact powers of two, one past them, and
        // the top of the u64 range, where a careless shift would overflow.
        let cases = [
            (1, 2),
            (2, 2),
            (16, 2),
            (17, 3),
            (64, 3),
            (65, 4),
            (1 << 40, 20),
            ((1 << 40) + 17, 21),
            ((1 << 62) - 3, 31),
            (1 << 62, 31),
            ((1 << 62) + 1, 32),
            (u64::MAX, 32),
        ];
        for (n, half_bits) in cases {
            let perm = Permutation::new(n, 1, 2);
            assert_eq!(perm.half_bits, half_bits, "n = {n}");
            // The domain covers n, and is under 4n (fewer than 4 passes per walk) for n > 4.
            let domain = 1u128 << (2 * perm.half_bits);
            assert!(domain >= u128::from(n), "n = {n}");
            assert!(n <= 4 || domain < 4 * u128::from(n), "n = {n}");
        }
    }

    #[test]
    #[should_panic(expected = "n must be >= 1")]
    fn empty_dataset_is_rejected() {
        let _ = Permutation::new(0, 0, 0);
    }

    #[test]
    fn bijection_and_inverse_on_small_and_odd_sizes() {
        let sizes = [1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64, 97, 127, 128, 1000, 1024, 4093, 65536, 100_003];
        let keys = [(0, 0), (0, 1), (42, 0), (u64::MAX, 7), (0xdead_beef, 1 << 40)];
        for n in sizes {
            for (seed, epoch) in keys {
                let perm = Permutation::new(n, seed, epoch);
                assert_eq!(perm.len(), n);
                let mut seen = vec![false; n as usize];
                for p in 0..n {
                    let id = perm.apply(p);
                    assert!(id < n, "n={n} seed={seed} epoch={epoch}: {p} -> {id}");
                    assert!(!seen[id as usize], "n={n}: id {id} hit twice");
                    seen[id as usize] = true;
                    assert_eq!(perm.invert(id), p, "n={n}: invert({id})");
                }
                // n distinct ids below n: every id was hit exactly once.
                assert!(seen.iter().all(|&s| s));
            }
        }
    }

    #[test]
    fn large_sizes_stay_in_range_and_invert() {
        for n in [(1u64 << 40) + 17, (1u64 << 62) - 3, u64::MAX] {
            let perm = Permutation::new(n, 12345, 3);
            // Spread-out positions plus both ends of the range.
            let mut positions: HashSet<u64> = (0..10_000u64).map(|i| fmix64(i) % n).collect();
            positions.extend([0, 1, n - 2, n - 1]);
            let mut ids = HashSet::with_capacity(positions.len());
            for &p in &positions {
                let id = perm.apply(p);
                assert!(id < n, "n={n}: {p} -> {id}");
                assert_eq!(perm.invert(id), p, "n={n}");
                assert!(ids.insert(id), "n={n}: id {id} produced twice");
            }
        }
    }

    #[test]
    fn same_inputs_give_the_same_order() {
        let n = 100_003;
        let a = Permutation::new(n, 99, 5);
        let b = Permutation::new(n, 99, 5);
        let c = a.clone();
        assert_eq!(a, b);
        for p in 0..n {
            let id = a.apply(p);
            assert_eq!(b.apply(p), id);
            assert_eq!(c.apply(p), id);
        }
    }

    #[test]
    fn epochs_and_seeds_give_unrelated_orders() {
        let n = 10_000;
        let base = Permutation::new(n, 7, 0);
        let others = [Permutation::new(n, 7, 1), Permutation::new(n, 8, 0), Permutation::new(n, 0, 0)];
        for other in &others {
            assert_ne!(&base, other);
            let differing = (0..n).filter(|&p| base.apply(p) != other.apply(p)).count();
            assert!(differing as f64 > 0.99 * n as f64, "only {differing} differ");
        }
    }

    #[test]
    fn id_at_a_position_is_uniform_over_keys() {
        // 63 degrees of freedom: P(chi2 > 110) is about 1e-4.
        let n = 64;
        let num_keys = 64_000u64;
        for position in [0, 1, 31, 63] {
            let mut counts = vec![0u64; n as usize];
            for k in 0..num_keys {
                counts[Permutation::new(n, k >> 4, k & 15).apply(position) as usize] += 1;
            }
            let stat = chi_square(&counts);
            assert!(stat < 110.0, "position {position}: chi2 = {stat:.1}");
        }

        // Whole position x id table: 63 * 63 = 3969 degrees of freedom (mean 3969, sd 89),
        // so 4320 is about 3.9 sd out. Catches biases shared across positions too.
        let mut table = vec![0u64; (n * n) as usize];
        for k in 0..num_keys {
            let perm = Permutation::new(n, k.wrapping_mul(0x1_0001), k);
            for p in 0..n {
                table[(p * n + perm.apply(p)) as usize] += 1;
            }
        }
        let stat = chi_square(&table);
        assert!(stat < 4320.0, "position x id table: chi2 = {stat:.1}");

        // n = 10 lives in a domain of 16, so this checks cycle walking stays uniform.
        // 9 degrees of freedom: P(chi2 > 33.7) is about 1e-4.
        let mut counts = [0u64; 10];
        for k in 0..num_keys {
            counts[Permutation::new(10, k, 0).apply(0) as usize] += 1;
        }
        let stat = chi_square(&counts);
        assert!(stat < 33.7, "n = 10: chi2 = {stat:.1}, counts {counts:?}");
    }

    #[test]
    fn position_and_id_are_uncorrelated() {
        let n = 100_000u64;
        let perm = Permutation::new(n, 2024, 1);
        let (mut sxy, mut fixed) = (0.0f64, 0u64);
        for p in 0..n {
            let id = perm.apply(p);
            sxy += p as f64 * id as f64;
            fixed += u64::from(id == p);
        }
        // Both marginals are exactly 0..n (a bijection), so their mean and variance are
        // known: mean (n-1)/2, variance (n^2-1)/12.
        let nf = n as f64;
        let mean = (nf - 1.0) / 2.0;
        let var = (nf * nf - 1.0) / 12.0;
        let r = (sxy / nf - mean * mean) / var;
        assert!(r.abs() < 0.02, "correlation r = {r}");
        assert!((fixed as f64) < 0.01 * nf, "{fixed} fixed points");
    }

    #[test]
    fn neighbouring_positions_are_far_apart() {
        // For a uniform random permutation E|pi(p+1) - pi(p)| = (n+1)/3.
        let n = 100_000u64;
        let perm = Permutation::new(n, 5, 9);
        let total: u64 = (0..n - 1).map(|p| perm.apply(p + 1).abs_diff(perm.apply(p))).sum();
        let mean = total as f64 / (n - 1) as f64;
        let target = n as f64 / 3.0;
        assert!((mean - target).abs() < 0.1 * target, "mean gap {mean}, expected about {target}");
    }

    #[test]
    fn a_shared_order_is_a_bijection_and_inverts() {
        for (n, block) in [(1, 1), (7, 3), (50, 16), (1000, 64), (1000, 5000), (4099, 4096)] {
            let shared = SharedOrder { seed: 11, block };
            let perm = Permutation::of(n, 3, Some(shared), 2);
            let mut seen = vec![false; n as usize];
            for p in 0..n {
                let id = perm.apply(p);
                assert!(id < n && !seen[id as usize], "n={n} block={block}: {p} -> {id}");
                seen[id as usize] = true;
                assert_eq!(perm.invert(id), p, "n={n} block={block}");
            }
        }
        // Without a shared order, `of` is the job's own permutation.
        assert_eq!(Permutation::of(100, 3, None, 2), Permutation::new(100, 3, 2));
    }

    #[test]
    fn jobs_of_a_shared_order_visit_the_same_samples_block_by_block_in_their_own_order() {
        let (n, block) = (10_000u64, 256u64);
        let shared = Some(SharedOrder { seed: 5, block });
        let (a, b) = (Permutation::of(n, 1, shared, 3), Permutation::of(n, 2, shared, 3));
        for start in (0..n).step_by(block as usize) {
            let set = |perm: &Permutation| {
                let mut ids: Vec<u64> = (start..(start + block).min(n)).map(|p| perm.apply(p)).collect();
                ids.sort_unstable();
                ids
            };
            assert_eq!(set(&a), set(&b), "block at {start}");
        }
        let differing = (0..n).filter(|&p| a.apply(p) != b.apply(p)).count();
        assert!(differing as f64 > 0.99 * n as f64, "only {differing} positions differ");
        // Another epoch, another shared order: the blocks' samples change too.
        let next = Permutation::of(n, 1, shared, 4);
        let moved = (0..n).filter(|&p| next.apply(p) / 97 != a.apply(p) / 97).count();
        assert!(moved as f64 > 0.9 * n as f64, "only {moved} moved");
    }

    #[test]
    fn a_jobs_shared_order_is_a_uniform_permutation_over_epochs() {
        // One job (seed 7) of a sweep (shared seed 3, blocks of 16: the last one short),
        // over many epochs: the chi-square of the whole position x id table. 49 * 49 = 2401
        // degrees of freedom (mean 2401, sd 69), so 2680 is 4 sd out.
        let (n, epochs) = (50u64, 50_000u64);
        let shared = Some(SharedOrder { seed: 3, block: 16 });
        let mut table = vec![0u64; (n * n) as usize];
        for epoch in 0..epochs {
            let perm = Permutation::of(n, 7, shared, epoch);
            for p in 0..n {
                table[(p * n + perm.apply(p)) as usize] += 1;
            }
        }
        let stat = chi_square(&table);
        assert!(stat < 2680.0, "position x id table: chi2 = {stat:.1}");
        // A position inside a block and one in the short last block, alone: 49 degrees of
        // freedom, P(chi2 > 94) is about 1e-4.
        for p in [0, 20, n - 1] {
            let counts: Vec<u64> = (0..n).map(|id| table[(p * n + id) as usize]).collect();
            let stat = chi_square(&counts);
            assert!(stat < 94.0, "position {p}: chi2 = {stat:.1}");
        }
    }

    #[test]
    fn a_shared_order_is_written_seed_and_block() {
        let parse = |s: &str| s.parse::<SharedOrder>();
        assert_eq!(parse("42").unwrap(), SharedOrder { seed: 42, block: SharedOrder::DEFAULT_BLOCK });
        assert_eq!(parse("42,block=100").unwrap(), SharedOrder { seed: 42, block: 100 });
        assert_eq!(parse(&SharedOrder { seed: 1, block: 9 }.to_string()).unwrap(), SharedOrder { seed: 1, block: 9 });
        // A job file or Python may give the seed alone, as a number.
        let from_json = |v: &str| serde_json::from_str::<SharedOrder>(v).map_err(|e| e.to_string());
        assert_eq!(from_json("5"), Ok(SharedOrder { seed: 5, block: SharedOrder::DEFAULT_BLOCK }));
        assert_eq!(from_json("\"5,block=8\""), Ok(SharedOrder { seed: 5, block: 8 }));
        assert!(from_json("\"5,block=0\"").unwrap_err().contains("at least 1"));
        let bads = [("x", "the seed is not"), ("4,block=0", "at least 1"), ("4,blk=2", "unknown part")];
        for (bad, why) in bads.into_iter().chain([("4,block=2,block=3", "given twice")]) {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains("SEED,block=N"), "{bad}: {err}");
        }
    }
}
