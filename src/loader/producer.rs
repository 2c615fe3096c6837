//! The producer: runs a stream's windows in order from a position, one call per window.
//!
//! Running ahead (`overlap`, on whenever a background thread drives the producer), the
//! exchange of window `k` is non-blocking and window `k + 1` is planned, read and filled
//! while it is in flight; window `k + 1`'s send buffer then waits for the next call. The
//! read agreement of `k + 1` is a collective issued during `k`'s exchange: every rank
//! orders it the same way. Without overlap each window is prepared when it is asked for,
//! which keeps the peak at one window's buffers (see [`crate::plan::budget`]).

use std::time::Duration;

use super::engine::{complete, exchange, prepare, Engine};
use super::stream::{Position, WindowSpec};
use super::window::{Delivered, Filled};
use crate::error::Result;
use crate::transport::Transport;

pub(crate) struct Producer {
    engine: Engine,
    /// The window the next call delivers.
    next: WindowSpec,
    /// That window, already read and filled (or the error doing so gave).
    ahead: Option<Result<Filled>>,
    overlap: bool,
    /// Time in agreements between windows (the continue agreement), counted as the next
    /// window's peer waiting.
    between: Duration,
}

impl Producer {
    /// A producer of the stream from `from` on.
    pub fn new(engine: Engine, from: Position, overlap: bool) -> Producer {
        let next = engine.stream.window_of(from, engine.tuning.steps_per_window(&engine.stream));
        Producer { engine, next, ahead: None, overlap, between: Duration::ZERO }
    }

    /// The loader's communicator.
    pub fn transport(&self) -> &dyn Transport {
        &*self.engine.transport
    }

    /// Adds time spent in an agreement between windows to the next window's peer waiting.
    pub fn waited_between(&mut self, d: Duration) {
        self.between += d;
    }

    /// Gives the engine back (a window filled ahead is dropped: it was never exchanged).
    pub fn into_engine(self) -> Engine {
        self.engine
    }

    /// Produces the next window. Collective: every rank calls it in lockstep. After an
    /// error the producer must not be called again.
    pub fn next_window(&mut self) -> Result<Delivered> {
        // The length in force: a tuner's decision at the last window's assembly applies
        // from the window after the one already planned.
        let steps = self.engine.tuning.steps_per_window(&self.engine.stream);
        let following = self.engine.stream.window_after(&self.next, steps);
        let spec = std::mem::replace(&mut self.next, following);
        let filled = match self.ahead.take() {
            Some(filled) => filled?,
            None => {
                let Engine { stream, transport, reads, index, balance, .. } = &mut self.engine;
                prepare(stream, &**transport, reads, index, balance, spec)?
            }
        };
        let received = if self.overlap {
            let following = self.next.clone();
            let Engine { stream, transport, reads, index, balance, .. } = &mut self.engine;
            let mut ahead = None;
            let received = exchange(
                &**transport,
                filled,
                Some(&mut || ahead = Some(prepare(stream, &**transport, reads, index, balance, following.clone()))),
            );
            self.ahead = ahead;
            received?
        } else {
            exchange(&*self.engine.transport, filled, None)?
        };
        let mut window = complete(&mut self.engine, received)?;
        let between = std::mem::take(&mut self.between);
        window.metrics.waited(between);
        Ok(window)
    }
}
