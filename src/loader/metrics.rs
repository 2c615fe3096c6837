//! Per-rank metrics of the loader's phases, and their reduction over ranks.
//!
//! The producer measures each window it makes; the loader adds a window's metrics when
//! its consumer takes the window, so the metrics of an epoch are those of the windows it
//! delivered, even when the producer already runs ahead into the next epoch.

use std::time::{Duration, Instant};

use crate::error::Result;
pub use crate::telemetry::Phase;
use crate::transport::{ReduceOp, Transport};

/// Time per phase and bytes moved, accumulated on one rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Time per phase, indexed like [`Phase::ALL`].
    pub phase: [Duration; 5],
    /// Bytes brought into memory by the readers of the dataset's files.
    pub bytes_read: u64,
    /// Bytes read back from the spill directory (node-local storage).
    pub bytes_read_spill: u64,
    /// Bytes this rank sent (including to itself).
    pub bytes_sent: u64,
    /// Bytes this rank received.
    pub bytes_received: u64,
    /// Rows delivered in batches.
    pub rows_delivered: u64,
    /// Windows exchanged.
    pub windows: u64,
    /// Bytes the loader copied on this rank: read from files into memory, filled into
    /// send buffers and assembled into batches (the transport's own copies are not
    /// counted). Over the bytes delivered, the copies each delivered byte took.
    pub bytes_copied: u64,
    /// Permutation evaluations made planning windows (the broadcast baseline's not counted).
    pub evaluations: u64,
    /// Time the consumer waited for the producer (for batches not yet ready).
    pub wait: Duration,
    /// Time in the agreements, the collectives that wait for every rank to finish a phase
    /// (part of [`Phase::Exchange`]): mostly waiting for the slowest peer.
    pub peer_wait: Duration,
    /// Bytes this rank sent to ranks on other hosts (part of `bytes_sent`; the two-phase
    /// scatter's not counted).
    pub bytes_sent_off_host: u64,
    /// Per window exchanged over the loader's communicator, the bytes this rank sent to
    /// each rank, in exchange order: what a bare all-to-all-v must move to replay the
    /// epoch's exchange (the benchmark's exchange limit). Kept only where the loader is
    /// asked to ([`super::Loader::keep_window_sends`]).
    pub window_sends: Vec<Vec<usize>>,
    /// The length of this rank's home range the window was read with (the last window's,
    /// once added up): it moves between epochs where the stream balances the ranges.
    pub home_rows: u64,
    /// The tuned settings the window was made with (the last window's, once added up);
    /// `None` where the loader is not tuned ([`crate::plan::tune`]).
    pub tuned: Option<crate::plan::tune::Settings>,
}

impl Metrics {
    /// Time spent in one phase.
    pub fn time(&self, p: Phase) -> Duration {
        self.phase[p as usize]
    }

    /// Runs `f`, adding its duration to phase `p`: the one way a phase is timed. `f` is
    /// handed these metrics, for the counters it keeps as it works (bytes read, reads in
    /// flight).
    pub fn timed<R>(&mut self, p: Phase, f: impl FnOnce(&mut Metrics) -> R) -> R {
        let start = Instant::now();
        let r = f(self);
        self.phase[p as usize] += start.elapsed();
        r
    }

    /// Adds `d`, measured elsewhere, to phase `p` (an exchange less the work overlapped
    /// with it).
    pub fn charge(&mut self, p: Phase, d: Duration) {
        self.phase[p as usize] += d;
    }

    /// Adds `d`, spent waiting for the slowest peer, to the exchange and to
    /// [`Metrics::peer_wait`].
    pub fn waited(&mut self, d: Duration) {
        self.charge(Phase::Exchange, d);
        self.peer_wait += d;
    }

    /// Runs an agreement `f` (a collective every rank enters when done with a phase),
    /// adding its duration to the exchange and to [`Metrics::peer_wait`].
    pub fn agreed<R>(&mut self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let r = f();
        self.waited(start.elapsed());
        r
    }

    /// Adds another set of metrics to these.
    pub fn add(&mut self, other: &Metrics) {
        for (a, b) in self.phase.iter_mut().zip(&other.phase) {
            *a += *b;
        }
        self.bytes_read += other.bytes_read;
        self.bytes_read_spill += other.bytes_read_spill;
        self.bytes_sent += other.bytes_sent;
        self.bytes_received += other.bytes_received;
        self.rows_delivered += other.rows_delivered;
        self.windows += other.windows;
        self.bytes_copied += other.bytes_copied;
        self.evaluations += other.evaluations;
        self.wait += other.wait;
        self.peer_wait += other.peer_wait;
        self.bytes_sent_off_host += other.bytes_sent_off_host;
        self.window_sends.extend(other.window_sends.iter().cloned());
        if other.home_rows > 0 {
            self.home_rows = other.home_rows;
        }
        if other.tuned.is_some() {
            self.tuned = other.tuned;
        }
    }

    /// Reduces every rank's metrics (collective; every rank gets the same summary).
    pub fn reduce(&self, transport: &dyn Transport) -> Result<MetricsSummary> {
        let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let mut maxes: Vec<u64> = self.phase.iter().map(|&d| nanos(d)).collect();
        maxes.extend([nanos(self.wait), self.bytes_sent, self.bytes_received, self.windows, self.evaluations]);
        transport.all_reduce_u64(&mut maxes, ReduceOp::Max)?;
        let mut sums = [
            self.bytes_read,
            self.bytes_sent,
            self.bytes_received,
            self.rows_delivered,
            self.bytes_copied,
            self.bytes_read_spill,
        ];
        transport.all_reduce_u64(&mut sums, ReduceOp::Sum)?;
        let mut phase_max = [Duration::ZERO; 5];
        for (p, &ns) in phase_max.iter_mut().zip(&maxes) {
            *p = Duration::from_nanos(ns);
        }
        let n = Phase::ALL.len();
        Ok(MetricsSummary {
            phase_max,
            wait_max: Duration::from_nanos(maxes[n]),
            max_sent: maxes[n + 1],
            max_received: maxes[n + 2],
            windows: maxes[n + 3],
            max_evaluations: maxes[n + 4],
            bytes_read: sums[0],
            bytes_sent: sums[1],
            bytes_received: sums[2],
            rows_delivered: sums[3],
            bytes_copied: sums[4],
            bytes_read_spill: sums[5],
        })
    }
}

/// Metrics reduced over ranks: times as the maximum over ranks, bytes and rows summed,
/// and the most any one rank sent and received.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSummary {
    /// Time per phase, indexed like [`Phase::ALL`]: the slowest rank's.
    pub phase_max: [Duration; 5],
    /// The longest any consumer waited for data.
    pub wait_max: Duration,
    pub bytes_read: u64,
    /// Bytes read back from spill files, summed over ranks.
    pub bytes_read_spill: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub rows_delivered: u64,
    /// Bytes copied by the loader, summed over ranks ([`Metrics::bytes_copied`]).
    pub bytes_copied: u64,
    pub max_sent: u64,
    pub max_received: u64,
    /// Windows (the most any rank exchanged).
    pub windows: u64,
    /// The most permutation evaluations any rank made planning.
    pub max_evaluations: u64,
}

impl MetricsSummary {
    /// The slowest rank's time in one phase.
    pub fn time(&self, p: Phase) -> Duration {
        self.phase_max[p as usize]
    }
}
