//! The window budget: how many steps one exchange window holds, and what that bounds.
//!
//! This is the one place that turns `window_bytes` and `prefetch` into a window length and
//! a memory bound. Per step, the busiest rank receives `S` bytes: its rows and slices
//! (two-phase leaders: whole rows), variable-length values counted at their mean size
//! where the files tell it, else [`VAR_LEN_ESTIMATE`] ([`value_sizes`]). A window of `w`
//! steps then holds, on that rank, at its peak, in three kinds of buffer:
//!
//! * **read buffers**, only where values are read into buffers of their own and then
//!   copied ([`Reading::Copied`]: coalesced spans of small records, Arrow's variable-length
//!   values): at most `2wS` (a read brings in at most twice what it needs, see
//!   `dataset::positional::coalesce`); none where values are read straight into the send buffer
//!   or the batches ([`Reading::Direct`]);
//! * **send and receive buffers**: `2wS` while a window is exchanged; with a producer
//!   thread, also the next window's send buffer, filled during that exchange: `3wS`;
//! * **batches**: the window the consumer delivers from; with a producer `prefetch = p ≥
//!   1` windows ahead, also the `p` in the queue and the one the producer has assembled and
//!   waits to queue: `(p + 2)·wS`.
//!
//! Each kind has its own memory, kept when a window is done with it for the next window of
//! that kind (`crate::buffers` recycles send, receive and batch buffers; read buffers go
//! back to the allocator, which keeps them for the next reads): a window's read buffers
//! never reuse the previous window's receive or batch buffers, so the peak is the sum of
//! the three, not the largest of them. Counted in multiples of `wS`:
//!
//! | | `prefetch = 0` | `prefetch = p ≥ 1` |
//! |---|---|---|
//! | copied (read into buffers, then copied) | `2 + 2 + 1 = 5` | `2 + 3 + (p + 2) = 7 + p` |
//! | direct | `3` | `6 + p` (holds `5 + p`: one window's slack for sends above the mean) |
//!
//! A rank's read and send buffers hold the rows of its home range that the window draws,
//! which vary around `wS` with the shuffle (and variable-length values around their
//! mean); the floor of the window length and the direct path's slack with a producer
//! mostly absorb that, but a window can go a few percent past its share (measured with
//! 64 KiB samples at 4–16 MiB windows: up to 4%, at `prefetch = 0`). Where the home ranges
//! are balanced (`--balance`), a range grows to at most [`MAX_SHARE`] of the equal split,
//! and its read and send buffers with it: each is counted at that share.
//!
//! `S` also counts the bookkeeping a step costs besides its values ([`bookkeeping_per_step`]):
//! for tiny samples the ids, plans and read locations outweigh the data.
//!
//! Windows are sized so that this peak stays within `(p + 1) × window_bytes` (with
//! `p = 0`: `1 ×`), which is the bound the documentation promises (a tuned loader, by the
//! same rule, within the larger of that and the defaults' bound: [`super::tune`]); the rows a rank keeps
//! in memory or in a pass come on top, within the memory budget ([`super::io`]). A window
//! holds at least one step, so a single step
//! larger than the budget exceeds it.

use crate::config::{LoaderOptions, Tune, DEFAULT_PREFETCH, DEFAULT_WINDOW_BYTES};
use crate::dataset::Field;
pub use crate::plan::home::MAX_SHARE;

/// The most a loader's pipeline holds ([`WindowBudget::peak_bytes`] of its options); a
/// tuned loader's ([`crate::config::Tune::Auto`]) may grow to the larger of that and the
/// default options' bound ([`super::tune`]).
pub fn pipeline_bound(options: &LoaderOptions) -> u64 {
    let given = WindowBudget { window_bytes: options.window_bytes, prefetch: options.prefetch }.peak_bytes();
    match options.tune {
        Tune::Auto => given.max(DEFAULT_WINDOW_BYTES.saturating_mul(DEFAULT_PREFETCH as u64 + 1)),
        Tune::Off => given,
    }
}

/// With a producer thread, an epoch holds at least this many windows per window the
/// pipeline holds (where it has enough steps).
pub const WINDOWS_PER_QUEUE: u64 = 8;

/// Bytes assumed per variable-length value where sizes are not known in advance.
pub const VAR_LEN_ESTIMATE: u64 = 256;

/// How a window's values reach its send buffer, which decides whether it holds read
/// buffers besides (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// Read from the files straight into the send buffer or the batches, or copied from
    /// memory: no read buffers.
    Direct,
    /// Read into buffers of their own (coalesced spans, variable-length values), then
    /// copied into the send buffer.
    Copied,
}

/// What a window's steps hold, for sizing windows: at most `bytes_per_step` received per
/// step, values that reach the send buffer as `reading` says, `reserved` bytes of the peak
/// held by something else (the home index), and home ranges that may grow to
/// [`MAX_SHARE`] where `balanced`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLoad {
    pub bytes_per_step: u64,
    pub reserved: u64,
    pub reading: Reading,
    pub balanced: bool,
}

/// The window budget of a loader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowBudget {
    /// The configured budget per window (`--window-bytes`).
    pub window_bytes: u64,
    /// Windows the producer runs ahead (`--prefetch`).
    pub prefetch: usize,
}

impl WindowBudget {
    /// The most the pipeline holds at once, as documented: `(prefetch + 1) × window_bytes`.
    pub fn peak_bytes(&self) -> u64 {
        self.window_bytes.saturating_mul(self.prefetch as u64 + 1)
    }

    /// Multiples of one window's per-step bytes (`wS`) held at the peak (module docs).
    fn windows_held(&self, reading: Reading) -> u64 {
        match (reading, self.prefetch) {
            (Reading::Direct, 0) => 3,
            (Reading::Direct, p) => 6 + p as u64,
            (Reading::Copied, 0) => 5,
            (Reading::Copied, p) => 7 + p as u64,
        }
    }

    /// Half-multiples of `wS` held at the peak: [`Self::windows_held`] twice, and where the
    /// home ranges are balanced, half a window more for each read and send buffer (a range
    /// grows to at most [`MAX_SHARE`], 1.5×, of the equal split).
    fn halves_held(&self, reading: Reading, balanced: bool) -> u64 {
        let grown = match (reading, self.prefetch) {
            _ if !balanced => 0,
            (Reading::Direct, 0) => 1,
            (Reading::Direct, _) => 2,
            (Reading::Copied, 0) => 3,
            (Reading::Copied, _) => 4,
        };
        2 * self.windows_held(reading) + grown
    }

    /// Steps per window so that the peak stays within [`WindowBudget::peak_bytes`], for a
    /// rank receiving at most `bytes_per_step` per step and reading values straight into
    /// place ([`Reading::Direct`]); at least one step, at most the epoch. With a producer
    /// thread, an epoch is also cut into at least [`WINDOWS_PER_QUEUE`]` × (prefetch + 1)`
    /// windows where it has that many steps: a window is the unit the pipeline overlaps
    /// with training, and a queue of a few huge windows hides loading badly (each epoch
    /// would start by waiting for one).
    pub fn steps_per_window(&self, bytes_per_step: u64, steps_in_epoch: u64) -> u64 {
        let load = StepLoad { bytes_per_step, reserved: 0, reading: Reading::Direct, balanced: false };
        self.steps_per_window_besides(load, steps_in_epoch)
    }

    /// [`WindowBudget::steps_per_window`] for the steps of `load`.
    pub fn steps_per_window_besides(&self, load: StepLoad, steps_in_epoch: u64) -> u64 {
        let by_depth = match self.prefetch {
            0 => u64::MAX,
            p => steps_in_epoch.div_ceil(WINDOWS_PER_QUEUE * (p as u64 + 1)),
        };
        self.most_steps_besides(load, steps_in_epoch).min(by_depth).max(1)
    }

    /// The most steps a window may hold within [`WindowBudget::peak_bytes`] (as
    /// [`WindowBudget::steps_per_window_besides`], without the rule on windows per epoch:
    /// the tuner measures whether longer windows pay).
    pub fn most_steps_besides(&self, load: StepLoad, steps_in_epoch: u64) -> u64 {
        let StepLoad { bytes_per_step, reserved, reading, balanced } = load;
        let per_step = bytes_per_step.saturating_mul(self.halves_held(reading, balanced)).div_ceil(2).max(1);
        let by_bytes = self.peak_bytes().saturating_sub(reserved) / per_step;
        by_bytes.clamp(1, steps_in_epoch.max(1))
    }
}

/// Entries of the home index ([`super::index::HomeIndex`]) for a home range of `home`
/// samples: the whole range where it fits a quarter of the peak (then planning an epoch
/// evaluates the permutation once per home sample), else that quarter (an epoch then takes
/// a few passes). At least 4096 entries (64 KiB).
pub fn index_entries(budget: &WindowBudget, home: u64) -> u64 {
    home.min((budget.peak_bytes() / 4 / crate::plan::index::ENTRY_BYTES).max(4096))
}

/// Bytes of bookkeeping per step on one rank of `world`, for batches of `batch_size` rows
/// of `fields` fields: every rank plans the id of every row of a step (8 bytes, kept while
/// the window is exchanged, and 8 more while it is planned), and for the rows it reads
/// (about `batch_size / world`) it keeps their ids, send lists and delivered ids (about
/// 48 bytes) and where each value lies in its read buffers (24 bytes per field).
pub fn bookkeeping_per_step(batch_size: usize, world: usize, fields: usize) -> u64 {
    let (b, own) = (batch_size as u64, (batch_size as u64).div_ceil(world.max(1) as u64));
    b * 24 + own * (48 + 24 * fields as u64)
}

/// Bytes of one value of each field: a tensor's size; for a variable-length field, its
/// mean size where the dataset tells it (`measured`, e.g. from Arrow headers), else
/// [`VAR_LEN_ESTIMATE`].
pub fn value_sizes(fields: &[Field], measured: &[Option<u64>]) -> Vec<u64> {
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            f.fixed_bytes().map(|b| b as u64).or(measured.get(i).copied().flatten()).unwrap_or(VAR_LEN_ESTIMATE)
        })
        .collect()
}

/// Bytes of one sample, every field whole, from [`value_sizes`] (for sizing the
/// memory budget and the broadcast baseline's windows).
pub fn sample_bytes(sizes: &[u64]) -> u64 {
    sizes.iter().fold(0u64, |a, &b| a.saturating_add(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(bytes_per_step: u64, reserved: u64, reading: Reading, balanced: bool) -> StepLoad {
        StepLoad { bytes_per_step, reserved, reading, balanced }
    }

    /// What the memory budget sets aside for a pipeline: its bound as given, or, tuned, at
    /// least the defaults' (3 × 64 MiB).
    #[test]
    fn a_tuned_pipeline_is_bounded_by_the_larger_of_its_settings_and_the_defaults() {
        let tiny = LoaderOptions { window_bytes: 16 << 10, prefetch: 0, ..LoaderOptions::default() };
        assert_eq!(pipeline_bound(&tiny), 16 << 10);
        assert_eq!(pipeline_bound(&LoaderOptions { tune: Tune::Auto, ..tiny.clone() }), 192 << 20);
        let big = LoaderOptions { window_bytes: 256 << 20, prefetch: 3, tune: Tune::Auto, ..tiny };
        assert_eq!(pipeline_bound(&big), 1 << 30);
    }

    #[test]
    fn window_length_respects_the_budget() {
        let sync = WindowBudget { window_bytes: 1500, prefetch: 0 };
        assert_eq!(sync.steps_per_window(100, 50), 5); // 3 × 100 bytes per step
        assert_eq!(sync.steps_per_window(1000, 50), 1); // at least one step
        assert_eq!(WindowBudget { window_bytes: u64::MAX, prefetch: 0 }.steps_per_window(1, 7), 7);
        assert_eq!(sync.steps_per_window(0, 0), 1);
        // Two windows ahead: 3 × 1500 bytes for (6 + 2) × 100 bytes per step.
        let piped = WindowBudget { window_bytes: 1500, prefetch: 2 };
        assert_eq!((piped.peak_bytes(), piped.steps_per_window(100, 500)), (4500, 5));
        // ... but at least 8 × 3 windows per epoch: 50 steps in windows of 3, 120 in 5.
        assert_eq!(piped.steps_per_window(1, 50), 3);
        assert_eq!(piped.steps_per_window(1, 120), 5);
        assert_eq!(piped.steps_per_window(1, 3), 1);
        // The peak the windows give stays within the bound for any prefetch.
        for p in 0..8 {
            for (reading, balanced) in
                [Reading::Direct, Reading::Copied].into_iter().flat_map(|r| [(r, false), (r, true)])
            {
                let b = WindowBudget { window_bytes: 1 << 20, prefetch: p };
                let w = b.steps_per_window_besides(load(1000, 0, reading, balanced), 1 << 30);
                let held = w * 1000 * b.halves_held(reading, balanced) / 2;
                assert!(held <= b.peak_bytes(), "prefetch {p}, {reading:?}, balanced {balanced}");
            }
        }
        assert_eq!(WindowBudget { window_bytes: u64::MAX, prefetch: 3 }.peak_bytes(), u64::MAX);
    }

    #[test]
    fn values_read_then_packed_hold_their_read_buffers_besides_the_exchange_and_batches() {
        // Without a producer: read buffers (2), send and receive (2) and the delivered
        // batches (1), each kept by its own pool: 5 × 100 bytes per step, not 3.
        let sync = WindowBudget { window_bytes: 1500, prefetch: 0 };
        assert_eq!(sync.steps_per_window_besides(load(100, 0, Reading::Direct, false), 50), 5);
        assert_eq!(sync.steps_per_window_besides(load(100, 0, Reading::Copied, false), 50), 3);
        // Two ahead: reads (2), send, receive and the next send (3), the queue (2), the
        // consumer's window and the one waiting to be queued (2): 9 × 100 per step.
        let piped = WindowBudget { window_bytes: 1500, prefetch: 2 };
        assert_eq!(piped.steps_per_window_besides(load(100, 0, Reading::Copied, false), 500), 5);
        assert_eq!(piped.steps_per_window_besides(load(90, 0, Reading::Copied, false), 500), 5);
        assert_eq!(piped.steps_per_window_besides(load(90, 0, Reading::Direct, false), 500), 6);
        // The home index's share comes off the peak first.
        assert_eq!(sync.steps_per_window_besides(load(100, 1000, Reading::Copied, false), 50), 1);
        // Balanced home ranges grow to 1.5× the equal split, and their read and send
        // buffers with them: direct with a producer (two send buffers) holds 6 + 3 + ½·2 =
        // 10 windows' worth at prefetch 3, copied at prefetch 0 (two read buffers, one send
        // buffer) 5 + ½·3 = 6.5.
        let deep = WindowBudget { window_bytes: 2500, prefetch: 3 };
        assert_eq!(deep.steps_per_window_besides(load(100, 0, Reading::Direct, false), 5000), 10_000 / 900);
        assert_eq!(deep.steps_per_window_besides(load(100, 0, Reading::Direct, true), 5000), 10_000 / 1000);
        let one = WindowBudget { window_bytes: 6500, prefetch: 0 };
        assert_eq!(one.steps_per_window_besides(load(100, 0, Reading::Copied, false), 500), 13);
        assert_eq!(one.steps_per_window_besides(load(100, 0, Reading::Copied, true), 500), 10);
    }

    #[test]
    fn bookkeeping_counts_every_row() {
        // 256 rows over 4 ranks, 1 field: 256 × 24 + 64 × 72.
        assert_eq!(bookkeeping_per_step(256, 4, 1), 256 * 24 + 64 * 72);
        assert_eq!(bookkeeping_per_step(3, 4, 2), 3 * 24 + 96);
    }

    #[test]
    fn sizes_of_values() {
        use crate::dataset::{DType, FieldKind};
        let fields = vec![
            Field::tensor("x", DType::F32, vec![3, 4]),
            Field { name: "t".into(), kind: FieldKind::Bytes { utf8: false, elem: None } },
        ];
        assert_eq!(sample_bytes(&value_sizes(&fields, &[])), 48 + VAR_LEN_ESTIMATE);
        // A measured mean replaces the estimate for variable-length fields only.
        assert_eq!(value_sizes(&fields, &[Some(7), Some(65536)]), vec![48, 65536]);
    }
}
