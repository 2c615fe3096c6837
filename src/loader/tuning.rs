//! The tuner at runtime (`--tune auto`): the side of [`crate::plan::tune`] that measures
//! and applies.
//!
//! The consumer's tracker ([`super::tracker`], which times each step for telemetry) adds
//! up its waiting for windows and its time between batches (its training step) in a
//! [`ConsumerClock`] it shares with the producer. Each window's
//! assembly agreement — the collective every rank already makes with every window —
//! carries, besides the stop request, this rank's measures since the window before: the
//! window's production and reading time, and the consumer's waiting and computing. The
//! agreement makes each the maximum over the ranks, so every rank feeds the same measures
//! to the same tuner and takes the same decision at the same window. A decision applies
//! from the next window the producer plans: the window length at once, the reads in flight
//! with the next reads, and a producer thread (prefetch) from the next window the consumer
//! asks for ([`super::Loader`] restarts its pipeline there).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::metrics::{Metrics, Phase};
use super::stream::Stream;
use crate::plan::tune::{Measure, Settings, Tuner};

/// The consumer's time, shared with the producer: nanoseconds waited for windows and
/// spent in steps (from a batch handed out to the next call, or to a reposition).
#[derive(Debug, Default)]
pub(crate) struct ConsumerClock {
    pub waited_ns: AtomicU64,
    pub computed_ns: AtomicU64,
}

impl ConsumerClock {
    pub fn waited(&self, d: std::time::Duration) {
        self.waited_ns.fetch_add(nanos(d), Ordering::Relaxed);
    }

    pub fn computed(&self, d: std::time::Duration) {
        self.computed_ns.fetch_add(nanos(d), Ordering::Relaxed);
    }
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Numbers a tuned window's agreement carries besides the stop request.
pub(crate) const CARRIED: usize = 4;

/// A producer's tuner (`None` inside where the stream is not tuned).
pub(crate) struct Tuning {
    tuner: Option<Tuner>,
    clock: Arc<ConsumerClock>,
    /// The clock's values already counted.
    seen: [u64; 2],
}

impl Tuning {
    /// The tuner of `stream` (none where it is not tuned); `concurrent`: whether the
    /// transport can run a producer thread.
    pub fn new(stream: &Stream, concurrent: bool, clock: Arc<ConsumerClock>) -> Tuning {
        let tuner = stream.tune_limits.map(|mut limits| {
            if !concurrent {
                limits.prefetch = 0;
            }
            let start = Settings {
                steps_per_window: stream.steps_per_window,
                prefetch: stream.options.prefetch,
                read_depth: stream.options.read.queue_depth,
            };
            Tuner::new(start, limits)
        });
        Tuning { tuner, clock, seen: [0; 2] }
    }

    /// The window length in force.
    pub fn steps_per_window(&self, stream: &Stream) -> u64 {
        self.tuner.as_ref().map_or(stream.steps_per_window, |t| t.settings().steps_per_window)
    }

    /// The settings in force (`None`: not tuned).
    pub fn settings(&self) -> Option<Settings> {
        self.tuner.as_ref().map(Tuner::settings)
    }

    /// This rank's measures of a window about to be agreed (nothing where the loader is
    /// not tuned; a settled tuner still watches them): its production and reading time,
    /// and the consumer's waiting and computing since the last window, in nanoseconds.
    pub fn local(&mut self, metrics: &Metrics) -> Vec<u64> {
        if self.tuner.is_none() {
            return Vec::new();
        }
        let produce: std::time::Duration = metrics.phase.iter().sum();
        let read = metrics.time(Phase::Read) + metrics.time(Phase::Fill);
        let now = [self.clock.waited_ns.load(Ordering::Relaxed), self.clock.computed_ns.load(Ordering::Relaxed)];
        let (wait, compute) = (now[0].saturating_sub(self.seen[0]), now[1].saturating_sub(self.seen[1]));
        self.seen = now;
        vec![nanos(produce), nanos(read), wait, compute]
    }

    /// Feeds a window of `steps` the agreed measures ([`Tuning::local`]'s, maxima over the
    /// ranks); the new settings where they change.
    pub fn agreed(&mut self, steps: u64, agreed: &[u64]) -> Option<Settings> {
        let tuner = self.tuner.as_mut()?;
        let [produce, read, wait, compute] = <[u64; CARRIED]>::try_from(agreed).ok()?;
        let s = |ns: u64| ns as f64 / 1e9;
        tuner.observe(Measure {
            steps,
            produce_s: s(produce),
            read_s: s(read),
            wait_s: s(wait),
            wall_s: s(wait) + s(compute),
        })
    }
}
