//! Weighted blends of several sources: which source gives each sample of the blended
//! stream, and which of its samples.
//!
//! A blend draws from `S` sources (datasets) with weights `w_s` (normalised to sum to 1).
//! Position `n = 0, 1, 2, …` of the blended stream is given to one source by the
//! Balinski–Young *quota method* (Balinski & Young, "The Quota Method of Apportionment",
//! Amer. Math. Monthly 82, 1975), one position at a time, as seats of a house of growing
//! size: going from `h` to `h + 1` samples, among the sources whose count `c_s` is still
//! below their upper quota at `h + 1` (`c_s < w_s·(h + 1)`, i.e. one more sample would not
//! exceed `ceil(w_s·(h + 1))`), the one with the largest Jefferson priority `w_s / (c_s + 1)`
//! gets the sample, ties to the lowest source index. The method stays within quota at every
//! house size: after every `n` positions each source has given `floor(w_s·n)` or
//! `ceil(w_s·n)` samples. Proportions are therefore exact on every prefix of the stream,
//! not only on average, and in particular on every global batch (within one sample per
//! source), which a random draw of sources would not give.
//!
//! **Arithmetic.** Weights are held as integers `a_s` with `w_s = a_s / A`, `A = Σ a_s`
//! ([`Weights`]): every eligibility test (`c_s·A < a_s·(h + 1)`) and priority comparison
//! (`a_s·(c_t + 1)` against `a_t·(c_s + 1)`) is exact in 128-bit integers, so every rank
//! computes the same sequence and the quota bounds hold exactly, whatever the weights.
//! Weights given as decimals with at most 9 places (`0.7,0.2,0.1`) or as integers are taken
//! exactly (`7,2,1`); others are rounded to 62 bits relative to their sum ([`Weights::new`]).
//!
//! **Periodicity.** At house sizes that are multiples of `A` both quotas agree, so the
//! counts are exactly `k·a_s`; and the next choice depends only on the counts minus
//! `k·a_s` (both tests are unchanged by adding `k·a` to the counts and `k·A` to `h`). The
//! sequence is therefore periodic with period `A`, and skipping positions without listing
//! them (resuming, [`BlendCursor::quotas`]) jumps whole periods at once.
//!
//! **State.** A [`BlendCursor`] is O(sources): the position, the weights in effect and
//! the position they took effect at, each source's count since then (the quota method's
//! state) and each source's total draws since the stream began (what indexes the source's
//! own order). New weights ([`BlendCursor::reweight`]) apply from the current position on,
//! with counts starting again from zero: the quota bounds then hold on the stream since
//! the change. A cursor is rebuilt at any position from the schedule of weights
//! ([`BlendCursor::at`]) by replaying the sequence, or loaded from a resume state (it is
//! serialisable, and checked on load).
//!
//! **Samples.** Draw `d` of source `s` (its `d`-th sample since the stream began) is
//! position `d mod len_s` of the source's epoch `d / len_s`, under the source's own
//! [`Permutation`] of seed [`source_seed`]`(seed, s)` ([`draw_to_sample`]): every source
//! goes through all its samples once per source epoch, in a fresh order each epoch,
//! whatever the other sources do.
//!
//! **Rows of a batch.** The quota sequence decides how many rows of a global batch each
//! source gives and which draws; the rows are then shuffled within the batch by a
//! permutation of the step ([`Blend::batch_rows`]), so that a batch is not ordered by
//! source.
//!
//! **Epochized blends.** Weights proportional to `len_s × rep_s` ([`Weights::epochized`])
//! make every source give exactly `len_s × rep_s` samples (its `rep_s` epochs) in each
//! blend epoch of `Σ len_s × rep_s` positions, where those products are integers.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use super::permutation::{fmix64, Permutation};
use crate::error::{Error, Result};

/// The most sources a blend may have.
pub const MAX_SOURCES: usize = 65_536;

/// A cursor at or past this position is refused on load: far beyond any stream, and it
/// leaves every count and sum far from overflowing.
const MAX_POSITION: u64 = 1 << 62;

/// Decimal places tried when taking weights exactly as decimals ([`Weights::new`]).
const MAX_DECIMALS: i32 = 9;

/// Weights that are neither integers nor short decimals are rounded to integers summing to
/// about `2^62` ([`Weights::new`]).
const SCALE_BITS: i32 = 62;

/// Salt of [`source_seed`] ("blend_sr" in ASCII): keeps the sources' seeds apart from
/// other seeds derived from the job's seed.
const SOURCE_SALT: u64 = 0x626c_656e_645f_7372;

/// Salt of the seed of the rows' order within a batch ("blend_rw" in ASCII).
const ROWS_SALT: u64 = 0x626c_656e_645f_7277;

/// Validated weights of `S ≥ 1` sources, held exactly as integers `a_s` with
/// `w_s = a_s / A`, `A = Σ a_s` (the module's "Arithmetic"). At least one weight is
/// positive; `A` fits in 64 bits. The integers are reduced by their greatest common
/// divisor, so that equal weights compare equal however they were written (`1,3` and
/// `0.25,0.75`). Serialised as the list of integers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<u64>", into = "Vec<u64>")]
pub struct Weights {
    units: Vec<u64>,
    total: u64,
}

impl Weights {
    /// Weights of the sources, in source order: each finite and `≥ 0`, at least one
    /// positive, at most [`MAX_SOURCES`] of them. An error names the first weight that is
    /// wrong.
    ///
    /// Weights that are all integers, or all decimals of at most 9 places (`0.7,0.2,0.1`,
    /// as the nearest `f64`s to them), are taken exactly: `7,2,1`, so that every 10
    /// positions give exactly 7, 2 and 1 samples. Other weights are rounded to integers
    /// summing to about `2^62` (a positive weight never to zero): within `2^-62` of the
    /// normalised weight, which no stream is long enough to tell.
    pub fn new(weights: &[f64]) -> Result<Weights> {
        check_count(weights.len())?;
        for (s, &w) in weights.iter().enumerate() {
            if !w.is_finite() {
                return Err(Error::Config(format!("blend weight {s} ({w}) is not a finite number")));
            }
            if w < 0.0 {
                return Err(Error::Config(format!("blend weight {s} ({w}) is negative")));
            }
        }
        if weights.iter().all(|&w| w == 0.0) {
            return Err(Error::Config("every blend weight is zero: at least one must be positive".into()));
        }
        let units = decimal_units(weights).unwrap_or_else(|| scaled_units(weights));
        Weights::from_units(&units)
    }

    /// Exact integer weights `a_s` (normalised `a_s / Σ a`): at least one positive, at most
    /// [`MAX_SOURCES`] of them, their sum within 64 bits.
    pub fn from_units(units: &[u64]) -> Result<Weights> {
        check_count(units.len())?;
        let total: u128 = units.iter().map(|&a| u128::from(a)).sum();
        let total = u64::try_from(total)
            .map_err(|_| Error::Config(format!("blend weights sum to {total}, more than 2^64 - 1")))?;
        if total == 0 {
            return Err(Error::Config("every blend weight is zero: at least one must be positive".into()));
        }
        let g = units.iter().fold(0, |g, &a| gcd(g, a));
        Ok(Weights { units: units.iter().map(|&a| a / g).collect(), total: total / g })
    }

    /// Weights of an *epochized* blend: source `s` of `lens[s]` samples repeated
    /// `repetitions[s]` times (each finite and `≥ 0`) per blend epoch, with the length of
    /// a blend epoch, `Σ lens[s] × repetitions[s]`.
    ///
    /// The weights are proportional to `lens[s] × repetitions[s]`. Where every product is
    /// an integer (and their sum fits in 64 bits) the weights are exact, and at the end of
    /// each blend epoch (every multiple of its length, both quotas being equal there) every
    /// source has given exactly `lens[s] × repetitions[s]` samples since the blend began.
    /// Otherwise the length is the sum rounded to the nearest integer (at least 1), and
    /// each source gives its product rounded up or down.
    pub fn epochized(lens: &[u64], repetitions: &[f64]) -> Result<(Weights, u64)> {
        if lens.len() != repetitions.len() {
            return Err(Error::Config(format!(
                "an epochized blend needs one repetition count per source: {} sources, {} repetitions",
                lens.len(),
                repetitions.len()
            )));
        }
        for (s, &r) in repetitions.iter().enumerate() {
            if !r.is_finite() || r < 0.0 {
                return Err(Error::Config(format!(
                    "repetitions of blend source {s} ({r}) must be a finite number >= 0"
                )));
            }
        }
        // Exact products where they are integers: an integer count times the length in
        // 128 bits, a fractional one through f64 (exact where the product is an integer
        // below 2^53, e.g. 0.5 × an even length).
        let exact: Option<Vec<u128>> = lens
            .iter()
            .zip(repetitions)
            .map(|(&len, &r)| {
                if r.fract() == 0.0 && r < 2f64.powi(64) {
                    Some(u128::from(len) * r as u128)
                } else {
                    let p = len as f64 * r;
                    (p.fract() == 0.0 && p < 2f64.powi(53)).then_some(p as u128)
                }
            })
            .collect();
        if let Some(products) = exact {
            let sum: u128 = products.iter().sum();
            if let (Ok(sum), Ok(units)) =
                (u64::try_from(sum), products.iter().map(|&p| u64::try_from(p)).collect::<Result<Vec<u64>, _>>())
            {
                return Ok((Weights::from_units(&units)?, sum));
            }
        }
        let products: Vec<f64> = lens.iter().zip(repetitions).map(|(&len, &r)| len as f64 * r).collect();
        let weights = Weights::new(&products)?;
        let sum: f64 = products.iter().sum();
        // `as` saturates: a sum past 2^64 is not a length any stream reaches.
        Ok((weights, (sum.round() as u64).max(1)))
    }

    /// Number of sources.
    // No `is_empty`: there is always at least one source.
    #[allow(clippy::len_without_is_empty)]
    #[must_use]
    pub fn len(&self) -> usize {
        self.units.len()
    }

    /// The integer weights `a_s`, reduced (`w_s = a_s / total()`).
    #[must_use]
    pub fn units(&self) -> &[u64] {
        &self.units
    }

    /// `A = Σ a_s`: also the period of the quota sequence (module docs, "Periodicity").
    #[must_use]
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The normalised weight of `source` (`< len()`), as an `f64` (for display: the
    /// sequence uses the integers).
    #[must_use]
    pub fn fraction(&self, source: usize) -> f64 {
        self.units[source] as f64 / self.total as f64
    }

    /// The lower and upper quotas of `source` (`< len()`) after `h` samples: `floor(w·h)`
    /// and `ceil(w·h)`.
    #[must_use]
    pub fn quota_bounds(&self, source: usize, h: u64) -> (u64, u64) {
        let (num, den) = (u128::from(self.units[source]) * u128::from(h), u128::from(self.total));
        // Both are at most h (a ≤ A), so they fit in 64 bits.
        ((num / den) as u64, num.div_ceil(den) as u64)
    }
}

impl TryFrom<Vec<u64>> for Weights {
    type Error = Error;

    fn try_from(units: Vec<u64>) -> Result<Weights> {
        Weights::from_units(&units)
    }
}

impl From<Weights> for Vec<u64> {
    fn from(weights: Weights) -> Vec<u64> {
        weights.units
    }
}

/// A blend has between 1 and [`MAX_SOURCES`] sources.
fn check_count(sources: usize) -> Result<()> {
    if sources == 0 {
        return Err(Error::Config("a blend needs at least one source".into()));
    }
    if sources > MAX_SOURCES {
        return Err(Error::Config(format!("a blend has at most {MAX_SOURCES} sources, not {sources}")));
    }
    Ok(())
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The weights as integers, if they are all integers (below `2^63`) or all decimals of
/// at most [`MAX_DECIMALS`] places (scaled by `10^k` for the least such `k`, each below
/// `2^53`, each within 4 ulps of its integer), with a sum within 64 bits; positive
/// weights stay positive. The weights are finite and `≥ 0`.
fn decimal_units(weights: &[f64]) -> Option<Vec<u64>> {
    'places: for k in 0..=MAX_DECIMALS {
        let scale = 10f64.powi(k);
        let mut units = Vec::with_capacity(weights.len());
        let mut sum = 0u64;
        for &w in weights {
            let y = w * scale;
            let r = y.round();
            let exact = if k == 0 {
                y == r && r < 2f64.powi(63)
            } else {
                (y - r).abs() <= 4.0 * f64::EPSILON * r.max(1.0) && r <= 2f64.powi(53)
            };
            if !exact || (w > 0.0) != (r > 0.0) {
                continue 'places;
            }
            let Some(s) = sum.checked_add(r as u64) else { continue 'places };
            sum = s;
            units.push(r as u64);
        }
        return Some(units);
    }
    None
}

/// The weights rounded to integers summing to about `2^62`, a positive weight never to
/// zero. The weights are finite, `≥ 0`, and not all zero; dividing by the largest first
/// keeps the sum finite.
fn scaled_units(weights: &[f64]) -> Vec<u64> {
    let max = weights.iter().copied().fold(0.0, f64::max);
    let sum: f64 = weights.iter().map(|&w| w / max).sum();
    let scale = 2f64.powi(SCALE_BITS) / sum;
    weights
        .iter()
        .map(|&w| {
            let u = ((w / max) * scale).round() as u64;
            if w > 0.0 {
                u.max(1)
            } else {
                0
            }
        })
        .collect()
}

/// A source in the quota method's queue: ordered by Jefferson priority `units / next`
/// (`next` = its count + 1), then by the lower source index.
#[derive(Clone, Copy, Debug)]
struct Entry {
    units: u64,
    next: u64,
    source: u32,
}

impl Ord for Entry {
    fn cmp(&self, other: &Entry) -> Ordering {
        // a/(c+1) against a'/(c'+1), exactly: both products are below 2^128.
        let mine = u128::from(self.units) * u128::from(other.next);
        let theirs = u128::from(other.units) * u128::from(self.next);
        mine.cmp(&theirs).then_with(|| other.source.cmp(&self.source))
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Entry) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Entry {}

/// Where a blended stream stands: O(sources) state (module docs, "State"). Serialisable
/// for a resume state; loading one checks it ([`BlendCursor::check`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "CursorState")]
pub struct BlendCursor {
    /// Positions delivered since the stream began.
    position: u64,
    /// The position the weights in effect took effect at.
    since: u64,
    /// The weights in effect.
    weights: Weights,
    /// Per source: positions given since `since`.
    counts: Vec<u64>,
    /// Per source: positions given since the stream began (its draws).
    draws: Vec<u64>,
}

/// A cursor as read, before [`BlendCursor::check`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CursorState {
    position: u64,
    since: u64,
    weights: Weights,
    counts: Vec<u64>,
    draws: Vec<u64>,
}

impl TryFrom<CursorState> for BlendCursor {
    type Error = Error;

    fn try_from(s: CursorState) -> Result<BlendCursor> {
        let cursor =
            BlendCursor { position: s.position, since: s.since, weights: s.weights, counts: s.counts, draws: s.draws };
        cursor.check()?;
        Ok(cursor)
    }
}

impl BlendCursor {
    /// The start of a stream blended with `weights`.
    #[must_use]
    pub fn start(weights: Weights) -> BlendCursor {
        let sources = weights.len();
        BlendCursor { position: 0, since: 0, weights, counts: vec![0; sources], draws: vec![0; sources] }
    }

    /// The cursor at position `n` of a stream whose weights were `schedule`: `(from,
    /// weights)` pairs, the first from position 0, the positions non-decreasing, each
    /// weights taking effect at its position (an entry at `n` has taken effect; of
    /// entries at the same position the last wins, as repeated [`Self::reweight`]s do).
    /// Equal to the cursor advanced live to `n` with the same reweights.
    ///
    /// Cost: the positions are replayed without being listed, O(log S) each, except that
    /// whole periods of the weights (module docs, "Periodicity") are jumped in O(S): at
    /// most `min(n, segments × A)` positions are replayed, `A` being each segment's
    /// [`Weights::total`] (10 for `0.7,0.2,0.1`).
    pub fn at(schedule: &[(u64, Weights)], n: u64) -> Result<BlendCursor> {
        let Some(((first, weights), rest)) = schedule.split_first() else {
            return Err(Error::Config("a blend's weight schedule is empty".into()));
        };
        if *first != 0 {
            return Err(Error::Config(format!("a blend's weight schedule starts at position {first}, not 0")));
        }
        if let Some(w) = schedule.windows(2).find(|w| w[1].0 < w[0].0) {
            return Err(Error::Config(format!(
                "a blend's weight schedule goes back from position {} to {}",
                w[0].0, w[1].0
            )));
        }
        let mut cursor = BlendCursor::start(weights.clone());
        for (from, weights) in rest.iter().take_while(|(from, _)| *from <= n) {
            cursor.skip(from - cursor.position);
            cursor.reweight(weights.clone())?;
        }
        cursor.skip(n - cursor.position);
        Ok(cursor)
    }

    /// The sources of the next `k` positions, in order; advances the cursor past them.
    pub fn take(&mut self, k: u64) -> Vec<u32> {
        let mut sources = Vec::with_capacity(k as usize);
        self.run(k, |s, _| sources.push(s));
        sources
    }

    /// Per source, how many of the next `batch` positions it gives; advances the cursor
    /// past them.
    pub fn quotas(&mut self, batch: u64) -> Vec<u64> {
        let before = self.draws.clone();
        self.skip(batch);
        self.draws.iter().zip(before).map(|(after, before)| after - before).collect()
    }

    /// New weights from the current position on: the counts since the change start from
    /// zero, the draws go on. The number of sources cannot change.
    pub fn reweight(&mut self, new: Weights) -> Result<()> {
        if new.len() != self.sources() {
            return Err(Error::Config(format!(
                "the blend has {} sources; its new weights give {}",
                self.sources(),
                new.len()
            )));
        }
        self.weights = new;
        self.since = self.position;
        self.counts.iter_mut().for_each(|c| *c = 0);
        Ok(())
    }

    /// Checks a cursor read from outside (done on every deserialisation): one count and
    /// one draw total per weight, counts and draws that add up to the positions, and
    /// counts within both quotas of the weights in effect — the state only the quota
    /// method reaches, from which it goes on without fault.
    pub fn check(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Config(format!("invalid blend state: {why}")));
        let sources = self.weights.len();
        if self.counts.len() != sources || self.draws.len() != sources {
            return bad(format!(
                "{sources} weights, {} counts and {} draw totals (one each per source)",
                self.counts.len(),
                self.draws.len()
            ));
        }
        if self.position >= MAX_POSITION || self.since > self.position {
            return bad(format!("position {} (weights since {})", self.position, self.since));
        }
        let h = self.position - self.since;
        let counted: u128 = self.counts.iter().map(|&c| u128::from(c)).sum();
        let drawn: u128 = self.draws.iter().map(|&d| u128::from(d)).sum();
        if counted != u128::from(h) || drawn != u128::from(self.position) {
            return bad(format!(
                "counts sum to {counted} and draws to {drawn}, not {h} and {} positions",
                self.position
            ));
        }
        for (s, (&c, &d)) in self.counts.iter().zip(&self.draws).enumerate() {
            let (low, high) = self.weights.quota_bounds(s, h);
            if c < low || c > high || d < c {
                return bad(format!(
                    "source {s} has {c} samples of {h} since the weights changed (quotas {low}..={high}) and {d} in all"
                ));
            }
        }
        Ok(())
    }

    /// Positions delivered since the stream began.
    #[must_use]
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The position the weights in effect took effect at.
    #[must_use]
    pub fn since(&self) -> u64 {
        self.since
    }

    /// The weights in effect.
    #[must_use]
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Number of sources.
    #[must_use]
    pub fn sources(&self) -> usize {
        self.weights.len()
    }

    /// Per source: positions given since the weights in effect took effect.
    #[must_use]
    pub fn counts(&self) -> &[u64] {
        &self.counts
    }

    /// Per source: positions given since the stream began (the next draw of each).
    #[must_use]
    pub fn draws(&self) -> &[u64] {
        &self.draws
    }

    /// The sources and draws of the next `k` positions, in order; advances past them.
    fn take_draws(&mut self, k: u64) -> Vec<(u32, u64)> {
        let mut rows = Vec::with_capacity(k as usize);
        self.run(k, |s, d| rows.push((s, d)));
        rows
    }

    /// Advances `k` positions without listing them, jumping whole periods.
    fn skip(&mut self, k: u64) {
        let period = self.weights.total;
        let h = self.position - self.since;
        let head = ((period - h % period) % period).min(k);
        self.run(head, |_, _| {});
        let periods = (k - head) / period;
        if periods > 0 {
            // At a multiple of the period the counts are exactly `periods · a` apart
            // (module docs, "Periodicity").
            for ((c, d), &a) in self.counts.iter_mut().zip(&mut self.draws).zip(&self.weights.units) {
                *c += periods * a;
                *d += periods * a;
            }
            self.position += periods * period;
        }
        self.run(k - head - periods * period, |_, _| {});
    }

    /// Advances `k` positions by the quota method, calling `emit(source, draw)` for each.
    fn run(&mut self, k: u64, mut emit: impl FnMut(u32, u64)) {
        if k == 0 {
            return;
        }
        let total = u128::from(self.weights.total);
        let mut queue: BinaryHeap<Entry> = (self.weights.units.iter().zip(&self.counts).enumerate())
            .filter(|(_, (&a, _))| a > 0)
            .map(|(s, (&a, &c))| Entry { units: a, next: c + 1, source: s as u32 })
            .collect();
        let mut ineligible = Vec::new();
        let mut h = self.position - self.since;
        for _ in 0..k {
            h += 1;
            // The eligible source of highest priority: those popped before it would
            // exceed their upper quota at h. Some source is eligible: the counts sum to
            // h - 1, the upper quotas at h to at least h.
            let chosen = loop {
                let entry = queue.pop().expect("a source below its upper quota (the counts sum to h - 1)");
                if u128::from(entry.next - 1) * total < u128::from(entry.units) * u128::from(h) {
                    break entry;
                }
                ineligible.push(entry);
            };
            let s = chosen.source as usize;
            emit(chosen.source, self.draws[s]);
            self.counts[s] += 1;
            self.draws[s] += 1;
            queue.push(Entry { next: chosen.next + 1, ..chosen });
            for entry in ineligible.drain(..) {
                queue.push(entry);
            }
        }
        self.position += k;
    }
}

/// The seed of source `source`'s own orders under the job's `seed`:
/// `fmix64(fmix64(seed ^ SOURCE_SALT) ^ source)`, with MurmurHash3's finaliser `fmix64`
/// and `SOURCE_SALT = 0x626c_656e_645f_7372`. Stable: resume states and recorded runs
/// depend on it. Distinct sources get distinct seeds (`fmix64` is a bijection).
#[must_use]
pub fn source_seed(seed: u64, source: u32) -> u64 {
    fmix64(fmix64(seed ^ SOURCE_SALT) ^ u64::from(source))
}

/// The sample of draw `draw` of source `source` (of `source_len` samples) under the job's
/// `seed`: `(epoch, id)`, the source's epoch `draw / source_len` and the local sample id
/// at position `draw % source_len` of that epoch's [`Permutation`] of seed
/// [`source_seed`]`(seed, source)`.
///
/// # Panics
///
/// If `source_len == 0`: an empty source has no samples to draw ([`Blend::new`] refuses
/// one a positive weight).
#[must_use]
pub fn draw_to_sample(source_len: u64, seed: u64, source: u32, draw: u64) -> (u64, u64) {
    let epoch = draw / source_len;
    (epoch, Permutation::new(source_len, source_seed(seed, source), epoch).apply(draw % source_len))
}

/// A blend: its sources' lengths, its first weights and the job's seed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blend {
    lens: Vec<u64>,
    weights: Weights,
    seed: u64,
}

impl Blend {
    /// A blend of sources of `lens` samples with `weights`: one weight per source, and no
    /// positive weight for an empty source (a zero-weight source may be empty).
    pub fn new(lens: &[u64], weights: Weights, seed: u64) -> Result<Blend> {
        let blend = Blend { lens: lens.to_vec(), weights, seed };
        blend.check_weights(&blend.weights)?;
        Ok(blend)
    }

    /// Whether `weights` suit this blend's sources (as for [`Blend::new`]).
    pub fn check_weights(&self, weights: &Weights) -> Result<()> {
        if weights.len() != self.lens.len() {
            return Err(Error::Config(format!(
                "the blend has {} sources but {} weights",
                self.lens.len(),
                weights.len()
            )));
        }
        match self.lens.iter().zip(weights.units()).position(|(&len, &a)| len == 0 && a > 0) {
            Some(s) => Err(Error::Config(format!("blend source {s} is empty but its weight is positive"))),
            None => Ok(()),
        }
    }

    /// Whether `cursor` (e.g. from a resume state) suits this blend: weights it may have,
    /// and no draw from an empty source.
    pub fn check_cursor(&self, cursor: &BlendCursor) -> Result<()> {
        self.check_weights(cursor.weights())?;
        match self.lens.iter().zip(cursor.draws()).position(|(&len, &d)| len == 0 && d > 0) {
            Some(s) => {
                Err(Error::Config(format!("invalid blend state: {} draws from empty source {s}", cursor.draws[s])))
            }
            None => Ok(()),
        }
    }

    /// The start of the blended stream.
    #[must_use]
    pub fn start(&self) -> BlendCursor {
        BlendCursor::start(self.weights.clone())
    }

    /// New weights from the cursor's position on ([`BlendCursor::reweight`]), checked
    /// against the sources.
    pub fn reweight(&self, cursor: &mut BlendCursor, new: Weights) -> Result<()> {
        self.check_weights(&new)?;
        cursor.reweight(new)
    }

    /// The sample of draw `draw` of `source`: `(source epoch, local id)` ([`draw_to_sample`]).
    pub fn sample(&self, source: u32, draw: u64) -> Result<(u64, u64)> {
        match self.lens.get(source as usize) {
            Some(&len) if len > 0 => Ok(draw_to_sample(len, self.seed, source, draw)),
            Some(_) => Err(Error::Misuse(format!("blend source {source} is empty: it has no draw {draw}"))),
            None => Err(Error::Misuse(format!("the blend has no source {source} (it has {})", self.lens.len()))),
        }
    }

    /// The rows of the global batch of `batch` positions at `step` that starts at
    /// `cursor`: `(source, draw)` per row. Which sources give how many rows, and which
    /// draws, is the quota sequence's next `batch` positions; row `j` is then the
    /// sequence's position `π(j)` of the batch, `π` the [`Permutation`] of `batch` under
    /// seed `fmix64(seed ^ ROWS_SALT)` (`ROWS_SALT = 0x626c_656e_645f_7277`) and epoch
    /// `step`. Advances the cursor past the batch. Deterministic: the same cursor, batch
    /// and step give the same rows on every rank.
    pub fn batch_rows(&self, cursor: &mut BlendCursor, batch: u64, step: u64) -> Result<Vec<(u32, u64)>> {
        if cursor.sources() != self.lens.len() {
            return Err(Error::Misuse(format!(
                "a cursor of {} sources used with a blend of {}",
                cursor.sources(),
                self.lens.len()
            )));
        }
        let rows = cursor.take_draws(batch);
        if batch == 0 {
            return Ok(rows);
        }
        let order = Permutation::new(batch, fmix64(self.seed ^ ROWS_SALT), step);
        Ok((0..batch).map(|j| rows[order.apply(j) as usize]).collect())
    }

    /// The sources' lengths.
    #[must_use]
    pub fn lens(&self) -> &[u64] {
        &self.lens
    }

    /// The first weights.
    #[must_use]
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// The job's seed.
    #[must_use]
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Whether `c` samples of `n` are within both quotas of weight `a / total`, by
    /// multiplication only: `floor(a·n/A) <= c` iff `(c + 1)·A > a·n`, and
    /// `c <= ceil(a·n/A)` iff `c·A < a·n + A`.
    fn within_quota(c: u64, n: u64, a: u64, total: u64) -> bool {
        let (c, n, a, total) = (u128::from(c), u128::from(n), u128::from(a), u128::from(total));
        (c + 1) * total > a * n && c * total < a * n + total
    }

    /// Walks `sequence` (sources of consecutive positions from 0) and checks both quotas
    /// of `weights` at every prefix, exactly, and of the `f64` weights `given` (within
    /// 1e-9 of a sample: what rounding the weights to integers may move).
    fn assert_quota_at_every_prefix(weights: &Weights, given: Option<&[f64]>, sequence: &[u32]) {
        let sum: f64 = given.map_or(0.0, |g| g.iter().sum());
        let mut counts = vec![0u64; weights.len()];
        for (i, &s) in sequence.iter().enumerate() {
            counts[s as usize] += 1;
            let n = i as u64 + 1;
            for (t, &c) in counts.iter().enumerate() {
                assert!(
                    within_quota(c, n, weights.units()[t], weights.total()),
                    "source {t}: {c} samples of {n}, weight {}/{}",
                    weights.units()[t],
                    weights.total()
                );
                if let Some(given) = given {
                    let q = given[t] / sum * n as f64;
                    assert!(
                        (q - 1e-9).floor() <= c as f64 && c as f64 <= (q + 1e-9).ceil(),
                        "source {t}: {c} samples of {n}, weight {} of {sum}",
                        given[t]
                    );
                }
            }
        }
    }

    /// The quota method written out plainly: at each house size a linear scan over the
    /// sources, the upper quota by integer ceiling division, the Jefferson priority by
    /// cross-multiplication, ties to the first source scanned. The sources of the first
    /// `n` positions.
    fn reference_sequence(a: &[u64], n: usize) -> Vec<u32> {
        let total: u128 = a.iter().map(|&x| u128::from(x)).sum();
        let mut counts = vec![0u128; a.len()];
        let mut sequence = Vec::with_capacity(n);
        for h in 1..=n as u128 {
            let mut best: Option<usize> = None;
            for s in 0..a.len() {
                let upper = (u128::from(a[s]) * h).div_ceil(total);
                if counts[s] + 1 > upper {
                    continue;
                }
                let better = match best {
                    None => true,
                    Some(b) => u128::from(a[s]) * (counts[b] + 1) > u128::from(a[b]) * (counts[s] + 1),
                };
                if better {
                    best = Some(s);
                }
            }
            let s = best.expect("some source is below its upper quota");
            counts[s] += 1;
            sequence.push(s as u32);
        }
        sequence
    }

    /// Random weights: zeros, very small ones, ordinary ones, small integers and large
    /// ones; at least one positive.
    fn weights_strategy() -> impl Strategy<Value = Vec<f64>> {
        let one = prop_oneof![
            2 => Just(0.0),
            2 => 1e-4..2e-4f64,
            3 => 0.0..1.0f64,
            2 => (1u32..10).prop_map(f64::from),
            1 => 1e3..1e6f64,
        ];
        proptest::collection::vec(one, 1..=100).prop_map(|mut w| {
            if w.iter().all(|&x| x == 0.0) {
                w[0] = 1.0;
            }
            w
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever the weights: both quotas hold after every position, and every
        /// position gives exactly one sample to one source — listed all at once, one by
        /// one, or skipped over.
        #[test]
        fn the_quota_method_stays_within_quota_at_every_position(given in weights_strategy()) {
            const N: u64 = 20_000;
            let weights = Weights::new(&given).unwrap();
            let mut all = BlendCursor::start(weights.clone());
            let sequence = all.take(N);
            prop_assert_eq!(sequence.len() as u64, N);
            assert_quota_at_every_prefix(&weights, Some(&given), &sequence);

            let mut one = BlendCursor::start(weights.clone());
            for (i, &s) in sequence.iter().enumerate() {
                let before = one.counts().to_vec();
                prop_assert_eq!(one.take(1), vec![s], "position {}", i);
                let gained: Vec<usize> =
                    (0..before.len()).filter(|&t| one.counts()[t] != before[t]).collect();
                prop_assert_eq!(&gained, &vec![s as usize]);
                prop_assert_eq!(one.counts()[s as usize], before[s as usize] + 1);
            }
            prop_assert_eq!(&one, &all);
            let mut skipped = BlendCursor::start(weights);
            prop_assert_eq!(skipped.quotas(N).iter().sum::<u64>(), N);
            prop_assert_eq!(&skipped, &all);
        }

        /// Exact integer weights, large and small, with periods shorter than the stream
        /// (so that skipping jumps whole periods): both quotas at every position, and
        /// skipping in batches lands where listing does.
        #[test]
        fn integer_weights_stay_within_quota_and_skipping_agrees(
            units in proptest::collection::vec(prop_oneof![Just(0u64), 1u64..20, 1u64..(1 << 40)], 1..=40),
            batch in 1u64..300,
        ) {
            let mut units = units;
            if units.iter().all(|&a| a == 0) {
                units[0] = 3;
            }
            let weights = Weights::from_units(&units).unwrap();
            let mut listed = BlendCursor::start(weights.clone());
            let sequence = listed.take(20_000);
            assert_quota_at_every_prefix(&weights, None, &sequence);
            let mut skipped = BlendCursor::start(weights);
            let mut counted = BlendCursor::start(skipped.weights().clone());
            while skipped.position() + batch <= 20_000 {
                let from = skipped.position() as usize;
                let quotas = skipped.quotas(batch);
                let mut expected = vec![0u64; units.len()];
                for &s in &sequence[from..from + batch as usize] {
                    expected[s as usize] += 1;
                }
                prop_assert_eq!(&quotas, &expected, "batch at {}", from);
                counted.take(batch);
                prop_assert_eq!(&skipped, &counted);
            }
        }

        /// A hostile resume state is refused or usable, never a panic.
        #[test]
        fn any_loaded_cursor_is_refused_or_usable(
            position in 0u64..50,
            since in 0u64..50,
            units in proptest::collection::vec(0u64..4, 0..5),
            counts in proptest::collection::vec(0u64..30, 0..5),
            draws in proptest::collection::vec(0u64..50, 0..5),
        ) {
            let json = serde_json::json!({
                "position": position, "since": since, "weights": units, "counts": counts, "draws": draws
            });
            if let Ok(mut cursor) = serde_json::from_value::<BlendCursor>(json) {
                cursor.check().unwrap();
                let before = cursor.position();
                prop_assert_eq!(cursor.quotas(100).iter().sum::<u64>(), 100);
                prop_assert_eq!(cursor.position(), before + 100);
                cursor.check().unwrap();
            }
        }
    }

    #[test]
    fn cursor_quotas_equal_an_independent_reference() {
        // Integer ratios, given as decimals and as integers; periods short (10) and long
        // (a prime past the whole stream).
        let cases: [(&[f64], &[u64]); 5] = [
            (&[0.7, 0.2, 0.1], &[7, 2, 1]),
            (&[0.35, 0.05, 0.6, 0.0], &[7, 1, 12, 0]),
            (&[1.0, 1.0, 1.0], &[1, 1, 1]),
            (&[0.0, 997.0, 1009.0, 3.0, 50_000.0, 1.0], &[0, 997, 1009, 3, 50_000, 1]),
            (&[131_071.0, 1.0, 524_287.0, 8191.0, 2.0, 0.0, 31.0], &[131_071, 1, 524_287, 8191, 2, 0, 31]),
        ];
        for (given, a) in cases {
            let reference = reference_sequence(a, 2_000 * 64);
            for batch in [1u64, 7, 64] {
                let mut cursor = BlendCursor::start(Weights::new(given).unwrap());
                for step in 0..2_000 {
                    let from = (step * batch) as usize;
                    let mut expected = vec![0u64; a.len()];
                    for &s in &reference[from..from + batch as usize] {
                        expected[s as usize] += 1;
                    }
                    assert_eq!(cursor.quotas(batch), expected, "weights {given:?}, batch {batch}, step {step}");
                }
            }
            let mut cursor = BlendCursor::start(Weights::from_units(a).unwrap());
            assert_eq!(cursor.take(reference.len() as u64), reference, "weights {a:?}");
        }
    }

    #[test]
    fn short_decimals_and_integers_are_taken_exactly() {
        let w = Weights::new(&[0.7, 0.2, 0.1]).unwrap();
        assert_eq!((w.units(), w.total()), (&[7u64, 2, 1][..], 10));
        assert_eq!(Weights::new(&[0.25, 0.75]).unwrap(), Weights::from_units(&[1, 3]).unwrap());
        assert_eq!(Weights::new(&[2.0, 6.0]).unwrap(), Weights::from_units(&[1, 3]).unwrap());
        assert_eq!(Weights::new(&[0.123456789, 0.0]).unwrap().units(), &[1, 0]);
        assert_eq!(Weights::new(&[0.3333, 0.3333, 0.3334]).unwrap().units(), &[3333, 3333, 3334]);
        // Every 10 positions give exactly 7, 2 and 1, at every offset of the stream.
        let mut cursor = BlendCursor::start(w);
        for _ in 0..100 {
            assert_eq!(cursor.quotas(10), vec![7, 2, 1]);
        }
        // Not short decimals: rounded to about 2^62 in all, keeping the ratios and a
        // tiny positive weight positive.
        let w = Weights::new(&[1.0 / 3.0, 2.0 / 3.0, 1e-30]).unwrap();
        assert!(w.total() > 1 << 61 && w.total() < 1 << 63, "{w:?}");
        assert!((w.fraction(1) / w.fraction(0) - 2.0).abs() < 1e-15 && w.units()[2] == 1, "{w:?}");
        let w = Weights::new(&[1e300, 3e300]).unwrap();
        assert!((w.fraction(1) - 0.75).abs() < 1e-15, "{w:?}");
    }

    #[test]
    fn invalid_weights_are_errors_naming_the_weight() {
        let err = |w: &[f64]| Weights::new(w).unwrap_err().to_string();
        assert!(err(&[1.0, f64::NAN]).contains("blend weight 1 (NaN) is not a finite"), "{}", err(&[1.0, f64::NAN]));
        assert!(err(&[1.0, 1.0, f64::INFINITY]).contains("blend weight 2 (inf)"));
        assert!(err(&[1.0, 2.0, -0.5]).contains("blend weight 2 (-0.5) is negative"));
        assert!(err(&[0.0, 0.0]).contains("every blend weight is zero"));
        assert!(err(&[]).contains("at least one source"));
        assert!(err(&vec![1.0; MAX_SOURCES + 1]).contains("at most 65536 sources"));
        assert_eq!(Weights::new(&vec![1.0; MAX_SOURCES]).unwrap().len(), MAX_SOURCES);
        let e = Weights::from_units(&[u64::MAX, 1]).unwrap_err();
        assert!(e.to_string().contains("more than 2^64 - 1"), "{e}");
        assert_eq!(e.kind(), crate::error::ErrorKind::Config);
        assert!(Weights::from_units(&[0, 0]).is_err());
    }

    /// A live stream with reweights, and the schedule it followed.
    fn live_stream() -> (Vec<(u64, Weights)>, Vec<BlendCursor>) {
        let schedule = vec![
            (0, Weights::new(&[0.5, 0.3, 0.2, 0.0]).unwrap()),
            (1_003, Weights::new(&[1.0 / 7.0, 0.0, 2.0, 0.5]).unwrap()),
            (1_003, Weights::new(&[0.0, 0.1, 0.0, 0.9]).unwrap()),
            (2_500, Weights::from_units(&[5, 0, 17, 3]).unwrap()),
            (2_500 + 17 * 25, Weights::new(&[1.0, 1.0, 1.0, 1.0]).unwrap()),
        ];
        let mut live = BlendCursor::start(schedule[0].1.clone());
        let mut states = vec![live.clone()];
        for n in 1..=4_000u64 {
            live.take(1);
            for (_, w) in schedule.iter().filter(|(from, _)| *from == n) {
                live.reweight(w.clone()).unwrap();
            }
            states.push(live.clone());
        }
        (schedule, states)
    }

    #[test]
    fn a_cursor_rebuilt_from_the_schedule_equals_the_live_one() {
        let (schedule, states) = live_stream();
        for n in (0..=4_000u64).filter(|n| n % 97 == 0 || [1, 1_002, 1_003, 1_004, 2_500, 2_925].contains(n)) {
            assert_eq!(BlendCursor::at(&schedule, n).unwrap(), states[n as usize], "n = {n}");
        }
        // The reweights took effect where they say, counts restarting, draws going on.
        let at = &states[2_500];
        assert_eq!((at.since(), at.counts(), at.draws().iter().sum::<u64>()), (2_500, &[0u64; 4][..], 2_500));
        assert_eq!(states[2_499].since(), 1_003);
        assert_eq!(states[2_499].counts()[0] + states[2_499].counts()[2], 0, "weights 0 give nothing");
    }

    #[test]
    fn a_bad_schedule_is_an_error() {
        let w = Weights::new(&[1.0, 2.0]).unwrap();
        let three = Weights::new(&[1.0, 2.0, 3.0]).unwrap();
        let err = |s: &[(u64, Weights)]| BlendCursor::at(s, 100).unwrap_err().to_string();
        assert!(err(&[]).contains("empty"));
        assert!(err(&[(5, w.clone())]).contains("starts at position 5"));
        assert!(err(&[(0, w.clone()), (50, w.clone()), (40, w.clone())]).contains("back from position 50 to 40"));
        assert!(err(&[(0, w.clone()), (50, three.clone())]).contains("2 sources; its new weights give 3"));
        // Entries past n are not applied (nor their sources checked).
        assert_eq!(BlendCursor::at(&[(0, w.clone()), (500, three)], 100).unwrap().since(), 0);
    }

    #[test]
    fn a_cursor_survives_serde_and_hostile_states_are_errors() {
        let (_, states) = live_stream();
        for cursor in [&states[0], &states[1_003], &states[3_999]] {
            let json = serde_json::to_string(cursor).unwrap();
            assert_eq!(&serde_json::from_str::<BlendCursor>(&json).unwrap(), cursor, "{json}");
        }
        let good = serde_json::to_value(&states[1_500]).unwrap();
        assert_eq!(good["weights"], serde_json::json!([0, 1, 0, 9]));
        assert_eq!(good["counts"], serde_json::json!([0, 49, 0, 448]));
        let hostile: [(&str, serde_json::Value, &str); 9] = [
            ("counts", serde_json::json!([0, 50]), "4 weights, 2 counts and 4 draw totals"),
            ("draws", serde_json::json!([1, 2, 3, 4, 5]), "4 counts and 5 draw totals"),
            ("weights", serde_json::json!([1, 2]), "2 weights, 4 counts"),
            ("weights", serde_json::json!([0, 0, 0, 0]), "every blend weight is zero"),
            ("weights", serde_json::json!([]), "at least one source"),
            ("since", serde_json::json!(1_501), "position 1500 (weights since 1501)"),
            ("position", serde_json::json!(1u64 << 62), "position 4611686018427387904"),
            ("counts", serde_json::json!([0, 0, 0, 400]), "counts sum to 400 and draws to 1500, not 497"),
            ("counts", serde_json::json!([1, 48, 0, 448]), "source 0 has 1 samples of 497"),
        ];
        for (field, value, why) in hostile {
            let mut bad = good.clone();
            bad[field] = value;
            let e = serde_json::from_value::<BlendCursor>(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{field}: {e}");
        }
        let mut extra = good.clone();
        extra["heap"] = serde_json::json!([]);
        assert!(serde_json::from_value::<BlendCursor>(extra).is_err());
        // Draws must cover the counts since the reweight.
        let mut bad = good;
        bad["draws"] = serde_json::json!([1004, 48, 0, 448]);
        let e = serde_json::from_value::<BlendCursor>(bad).unwrap_err().to_string();
        assert!(
            e.contains("source 1 has 49 samples of 497 since the weights changed (quotas 49..=50) and 48 in all"),
            "{e}"
        );
    }

    #[test]
    fn draws_visit_every_sample_of_a_source_once_per_epoch_in_a_fresh_order() {
        let (len, seed) = (37u64, 11u64);
        let orders: Vec<Vec<u64>> = (0..3)
            .map(|epoch| {
                let ids: Vec<u64> = (epoch * len..(epoch + 1) * len)
                    .map(|d| {
                        let (e, id) = draw_to_sample(len, seed, 2, d);
                        assert_eq!(e, epoch);
                        id
                    })
                    .collect();
                let mut sorted = ids.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..len).collect::<Vec<_>>(), "epoch {epoch}");
                ids
            })
            .collect();
        assert!(orders[0] != orders[1] && orders[1] != orders[2]);
        // Another source of the same length has its own order; the seed derivation is
        // the documented one.
        let other: Vec<u64> = (0..len).map(|d| draw_to_sample(len, seed, 3, d).1).collect();
        assert_ne!(other, orders[0]);
        assert_eq!(orders[0][5], Permutation::new(len, fmix64(fmix64(seed ^ SOURCE_SALT) ^ 2), 0).apply(5));
        assert_ne!(source_seed(seed, 0), source_seed(seed, 1));
        assert_ne!(source_seed(seed, 0), source_seed(seed + 1, 0));
        assert_eq!(draw_to_sample(1, 0, 0, 41), (41, 0));
    }

    #[test]
    fn a_blend_refuses_a_positive_weight_on_an_empty_source() {
        let w = Weights::new(&[0.5, 0.0, 0.5]).unwrap();
        let blend = Blend::new(&[10, 0, 5], w.clone(), 1).unwrap();
        let e = Blend::new(&[10, 0, 0], w.clone(), 1).unwrap_err().to_string();
        assert!(e.contains("blend source 2 is empty but its weight is positive"), "{e}");
        assert!(Blend::new(&[10, 5], w, 1).unwrap_err().to_string().contains("3 weights"));
        let mut cursor = blend.start();
        let e = blend.reweight(&mut cursor, Weights::new(&[1.0, 1.0, 1.0]).unwrap()).unwrap_err();
        assert!(e.to_string().contains("source 1 is empty"), "{e}");
        assert_eq!(cursor.weights(), blend.weights(), "a refused reweight changes nothing");
        assert!(blend.sample(1, 0).is_err() && blend.sample(3, 0).is_err());
        assert_eq!(blend.sample(2, 7).unwrap(), draw_to_sample(5, 1, 2, 7));
        // A loaded cursor that drew from the empty source does not suit the blend.
        let bad: BlendCursor = serde_json::from_value(serde_json::json!({
            "position": 2, "since": 2, "weights": [1, 0, 1], "counts": [0, 0, 0], "draws": [1, 1, 0]
        }))
        .unwrap();
        assert!(blend.check_cursor(&bad).unwrap_err().to_string().contains("1 draws from empty source 1"));
        assert!(blend.check_cursor(&blend.start()).is_ok());
    }

    #[test]
    fn batch_rows_give_the_quotas_every_draw_once_and_mix_the_sources() {
        let blend = Blend::new(&[100, 7, 1_000, 0], Weights::new(&[0.5, 0.3, 0.2, 0.0]).unwrap(), 9).unwrap();
        let batch = 64u64;
        let mut cursor = blend.start();
        let mut seen = vec![Vec::new(); 4];
        let mut mixed = 0;
        for step in 0..200 {
            let expected = cursor.clone().quotas(batch);
            let before = cursor.clone();
            let rows = blend.batch_rows(&mut cursor, batch, step).unwrap();
            assert_eq!(rows.len() as u64, batch);
            let mut got = vec![0u64; 4];
            for &(s, d) in &rows {
                got[s as usize] += 1;
                seen[s as usize].push(d);
            }
            assert_eq!(got, expected, "step {step}");
            // Same cursor, batch and step: same rows.
            assert_eq!(blend.batch_rows(&mut before.clone(), batch, step).unwrap(), rows);
            // Not grouped by source, nor in the sequence's order.
            let mut unshuffled = before.clone();
            if rows != unshuffled.take_draws(batch) && !rows.windows(2).all(|w| w[0].0 <= w[1].0) {
                mixed += 1;
            }
        }
        assert_eq!(mixed, 200, "every batch is shuffled");
        for (s, mut draws) in seen.into_iter().enumerate() {
            draws.sort_unstable();
            assert_eq!(draws, (0..cursor.draws()[s]).collect::<Vec<_>>(), "source {s}: every draw once");
        }
        assert_eq!(blend.batch_rows(&mut cursor, 0, 0).unwrap(), vec![]);
        let mut other = BlendCursor::start(Weights::new(&[1.0]).unwrap());
        assert!(blend.batch_rows(&mut other, 4, 0).is_err());
    }

    #[test]
    fn an_epochized_blend_gives_every_source_its_repetitions_each_blend_epoch() {
        let lens = [10u64, 3, 8, 0, 5];
        let (weights, epoch) = Weights::epochized(&lens, &[1.0, 2.0, 0.5, 3.0, 0.0]).unwrap();
        assert_eq!(epoch, 20);
        let blend = Blend::new(&lens, weights.clone(), 4).unwrap();
        let mut cursor = blend.start();
        for k in 1..=5u64 {
            cursor.skip(epoch - 7);
            cursor.take(7);
            assert_eq!(cursor.draws(), &[10 * k, 6 * k, 4 * k, 0, 0], "blend epoch {k}");
            // Source 1 went through its 3 samples twice in each blend epoch.
            let ids: Vec<(u64, u64)> = (6 * (k - 1)..6 * k).map(|d| blend.sample(1, d).unwrap()).collect();
            for e in [2 * (k - 1), 2 * k - 1] {
                let mut of: Vec<u64> = ids.iter().filter(|(x, _)| *x == e).map(|p| p.1).collect();
                of.sort_unstable();
                assert_eq!(of, vec![0, 1, 2], "source epoch {e}");
            }
        }
        // Large lengths stay exact.
        let (w, e) = Weights::epochized(&[1 << 40, 3 << 39], &[2.5, 1.0]).unwrap();
        assert_eq!((w.units(), e), (&[5u64, 3][..], (5 << 39) + (3 << 39)));
        // Fractional products: the nearest length.
        let (_, e) = Weights::epochized(&[3, 3], &[0.3, 0.4]).unwrap();
        assert_eq!(e, 2);
        assert!(Weights::epochized(&[1, 2], &[1.0]).is_err());
        assert!(Weights::epochized(&[1, 2], &[1.0, -1.0]).unwrap_err().to_string().contains("source 1"));
        assert!(Weights::epochized(&[0, 2], &[1.0, 0.0]).is_err());
    }

    #[test]
    fn the_state_of_a_hundred_sources_stays_small() {
        let given: Vec<f64> = (0..100).map(|s| 1.0 + f64::from(s) * 0.37 + f64::from(s % 7) * 1e-3).collect();
        let mut cursor = BlendCursor::start(Weights::new(&given).unwrap());
        for _ in 0..1_000 {
            cursor.quotas(1_000);
        }
        assert_eq!(cursor.position(), 1_000_000);
        let json = serde_json::to_string(&cursor).unwrap();
        assert!(json.len() < 64 << 10, "{} bytes", json.len());
        // O(sources): not growing with the position.
        cursor.quotas(1_000_000);
        assert!(serde_json::to_string(&cursor).unwrap().len() < json.len() + 300);
    }
}
