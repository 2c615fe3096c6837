//! Home ranges that follow the ranks' read speeds (`--balance auto`): the runtime side of
//! [`crate::plan::home::next_lengths`].
//!
//! Each rank measures the rows it reads and sends, and its own time doing so, window by
//! window. At the first window of the next epoch every rank's producer gathers every
//! rank's measure (one all-gather in that window's preparation, which every rank prepares
//! at the same point: windows are collective) and computes the same new ranges, used from
//! that window on. Who reads a sample never changes the stream: only who reads and sends
//! it. The ranges change only where nothing of them is kept across epochs
//! ([`Stream::balances`]); elsewhere they stay as the loader started.

use std::sync::Arc;

use super::stream::{Stream, WindowSpec};
use crate::error::{Error, Result};
use crate::plan::home::{next_lengths, Damping};
use crate::plan::{HomeIndex, HomeRanges};
use crate::transport::Transport;

/// How the ranges move ([`Damping`]):
///
/// * at most half a range at one epoch's start: a rank read at half the others' speed
///   reaches its share within two epochs;
/// * not at all where no range would move by more than a tenth of itself;
/// * nor where the slowest rank would gain less than 50 ms an epoch: the measures of
///   shorter reads are a loaded machine's scheduling noise, and balancing them would only
///   move the ranges about.
pub const DAMPING: Damping = Damping { max_change: 0.5, dead_band: 0.1, min_gain_s: 0.05 };

/// The current home ranges of a producer, and its measure since they were agreed.
pub(crate) struct Balancer {
    enabled: bool,
    home: Arc<HomeRanges>,
    /// The equal split's longest range (a balanced one holds at most 1.5× that).
    equal: u64,
    /// The epoch whose first window last agreed (`None`: none yet).
    agreed: Option<u64>,
    /// Windows prepared since: the same on every rank, so every rank decides alike
    /// whether there is anything to agree on.
    windows: u64,
    rows: u64,
    seconds: f64,
}

impl Balancer {
    /// The ranges `stream` starts with, balanced where the stream allows it.
    pub fn new(stream: &Stream) -> Balancer {
        Balancer {
            enabled: stream.balances(),
            home: Arc::new(stream.home.clone()),
            equal: stream.home.lengths().into_iter().max().unwrap_or(0),
            agreed: None,
            windows: 0,
            rows: 0,
            seconds: 0.0,
        }
    }

    /// The home ranges of window `spec`. At the first window of an epoch other than the
    /// one last agreed, after windows were measured, every rank gathers the measures and
    /// moves to the same new ranges (rebuilding `index` for its own): a collective then.
    pub fn ranges_for(
        &mut self,
        stream: &Stream,
        transport: &dyn Transport,
        index: &mut HomeIndex,
        spec: &WindowSpec,
    ) -> Result<Arc<HomeRanges>> {
        if !self.enabled || spec.steps.start != 0 || self.agreed == Some(spec.epoch.0) {
            return Ok(self.home.clone());
        }
        self.agreed = Some(spec.epoch.0);
        if self.windows == 0 {
            return Ok(self.home.clone());
        }
        let mine = [self.rows.to_le_bytes(), self.seconds.to_le_bytes()].concat();
        let all = transport.all_gather(&mine)?;
        (self.windows, self.rows, self.seconds) = (0, 0, 0.0);
        let measures = all
            .iter()
            .map(|m| match m.len() {
                16 => Ok((
                    u64::from_le_bytes(m[..8].try_into().expect("8 bytes")),
                    f64::from_le_bytes(m[8..].try_into().expect("8 bytes")),
                )),
                n => Err(Error::Internal(format!("a rank's read measure of {n} bytes, not 16"))),
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(lengths) = next_lengths(&self.home.lengths(), &measures, self.equal, DAMPING) {
            self.home = Arc::new(HomeRanges::weighted(&lengths)?);
            *index = HomeIndex::new(self.home.range(stream.rank), stream.index_entries);
        }
        Ok(self.home.clone())
    }

    /// Counts a prepared window: `rows` read and filled in `seconds` of this rank's time.
    pub fn measured(&mut self, rows: u64, seconds: f64) {
        self.windows += 1;
        self.rows += rows;
        self.seconds += seconds;
    }
}
