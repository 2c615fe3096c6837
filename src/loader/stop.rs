//! Stopping: a job's stop request — a signal or [`Loader::request_stop`] on any rank —
//! agreed by every rank with the same window, so that every rank stops after the same
//! step; and the check that lets a program give up a wait for a slow or absent peer.

use std::sync::atomic::Ordering;

use super::engine::{STOP_REQUESTED, STOP_SIGNALS};
use super::Loader;
use crate::error::Result;

/// Stopping: asking every rank to stop, learning that they agreed to, and giving up a wait.
impl Loader {
    /// Whether the job was asked to stop, as every rank agreed it: after the same step,
    /// every rank gets the same answer. `Some(signal)` once any rank received SIGTERM or
    /// SIGUSR1 ([`STOP_SIGNALS`]) or called [`Loader::request_stop`] ([`STOP_REQUESTED`]).
    /// A training loop asks after each step and, when told to, saves its model and
    /// [`Loader::state`] and exits (75, [`crate::runtime::EXIT_STOPPED`], where its
    /// scheduler requeues on it).
    ///
    /// The first call installs the signal handlers (so a program that never asks keeps
    /// the signals' usual effect); they record the signal, chain to any handler the
    /// program installed before, and are removed when the loader is dropped. The request
    /// travels to the other ranks in the agreement every window already makes (no
    /// collective of its own), so the answer turns true at the first step of a window
    /// assembled after the signal: up to `prefetch + 1` windows later.
    pub fn stop_requested(&mut self) -> Result<Option<i32>> {
        if self.stop_handlers.is_none() {
            self.stop_handlers = Some(crate::runtime::StopHandlers::install(&STOP_SIGNALS, self.stop.clone())?);
        }
        Ok(self.stop_agreed)
    }

    /// Asks every rank to stop, as a stop signal would ([`Loader::stop_requested`] then
    /// reports [`STOP_REQUESTED`] on every rank, after the same step). For programs that
    /// handle signals themselves: call it from the handler.
    pub fn request_stop(&self) {
        let _ = self.stop.compare_exchange(0, STOP_REQUESTED as usize, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Makes the loader's waits interruptible: while it waits for a window or for the
    /// other ranks (at `next_batch`, `set_epoch`, `seek`, drop), `check` is called about
    /// every 100 ms, and when it returns `true` the wait is given up with a
    /// [`Error::Misuse`](crate::error::Error::Misuse) error. The loader cannot continue
    /// after that: its producer is left where it was (perhaps in a collective the other
    /// ranks never join), the runtime does not finalise MPI at exit
    /// ([`crate::runtime::abandoned`]), and the process should end. The Python package
    /// checks for signals here, so that Ctrl-C and SIGTERM reach a training loop
    /// that waits for a slow or absent peer.
    pub fn interrupt_with(&mut self, check: impl FnMut() -> bool + Send + 'static) {
        self.interrupt = Some(Box::new(check));
    }
}
