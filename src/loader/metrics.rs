//! Per-rank metrics of the loader's phases.

use std::time::{Duration, Instant};

/// The phases of the pipeline, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Computing window plans (permutation, placement).
    Plan,
    /// Reading samples of the home range from files.
    Read,
    /// Copying read values into the send buffer.
    Pack,
    /// The all-to-all exchange (and failure agreement).
    Exchange,
    /// Copying received values into batches.
    Assemble,
}

impl Phase {
    /// All phases.
    pub const ALL: [Phase; 5] = [Phase::Plan, Phase::Read, Phase::Pack, Phase::Exchange, Phase::Assemble];

    /// Lower-case name, as printed and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Plan => "plan",
            Phase::Read => "read",
            Phase::Pack => "pack",
            Phase::Exchange => "exchange",
            Phase::Assemble => "assemble",
        }
    }
}

/// Time per phase and bytes moved, accumulated on one rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Time per phase, indexed like [`Phase::ALL`].
    pub phase: [Duration; 5],
    /// Bytes brought into memory by the readers.
    pub bytes_read: u64,
    /// Bytes this rank sent (including to itself).
    pub bytes_sent: u64,
    /// Bytes this rank received.
    pub bytes_received: u64,
    /// Rows delivered in batches.
    pub rows_delivered: u64,
    /// Windows exchanged.
    pub windows: u64,
}

impl Metrics {
    /// Time spent in one phase.
    pub fn time(&self, p: Phase) -> Duration {
        self.phase[p as usize]
    }

    /// Runs `f`, adding its duration to phase `p`.
    pub fn timed<R>(&mut self, p: Phase, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.phase[p as usize] += start.elapsed();
        r
    }
}
