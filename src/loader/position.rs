//! Where a loader stands and moving it: its position, the state to save and resume
//! from, setting the epoch and seeking. Moving is collective: every rank moves at the same
//! point, or every rank fails at its next window naming where each went.

use std::time::Instant;

use super::state::{check_epoch, Fingerprint, LoaderState};
use super::stream::Position;
use super::Loader;
use crate::error::{Error, Result};
use crate::types::{Epoch, Step};

/// Position and resuming: where the loader stands, the state that saves it, and moving it.
impl Loader {
    /// Where the loader stands: the next batch it delivers.
    pub fn position(&self) -> Position {
        self.position
    }

    /// The state to save: the next batch to deliver, and what defines the stream. After
    /// the last batch of an epoch it is the start of the next epoch.
    pub fn state(&self) -> LoaderState {
        self.state_at(self.position)
    }

    /// The state of position `at` of this loader's stream (a step equal to
    /// [`Loader::steps_per_epoch`] means the start of the next epoch).
    pub fn state_at(&self, at: Position) -> LoaderState {
        let (epoch, step) = if at.step.0 >= self.stream.steps_per_epoch {
            (at.epoch.0.saturating_add(1), 0)
        } else {
            (at.epoch.0, at.step.0)
        };
        LoaderState { seed: self.stream.options.seed, epoch, step, fingerprint: self.fingerprint() }
    }

    /// Positions the loader at the start of `epoch` (like `DistributedSampler.set_epoch`).
    /// Where the loader already stands there, nothing changes (a producer running ahead
    /// keeps its work); otherwise the producer is stopped collectively and restarts there
    /// at the next batch. Every rank must call it at the same point: where a rank
    /// repositions alone, every rank fails at its next window, naming each rank's position
    /// (or that it read on), instead of waiting. An epoch beyond
    /// [`MAX_EPOCH`](crate::loader::MAX_EPOCH) is refused.
    pub fn set_epoch(&mut self, epoch: Epoch) -> Result<()> {
        check_epoch(epoch.0)?;
        self.reposition(Position { epoch, step: Step(0) })
    }

    /// [`Loader::set_epoch`], then the loader as an iterator over that epoch's batches (an
    /// error setting the epoch is the iterator's first item).
    pub fn epoch(&mut self, epoch: Epoch) -> &mut Loader {
        if let Err(e) = self.set_epoch(epoch) {
            self.deferred = Some(e);
        }
        self
    }

    /// Continues the stream where `state` says (saved by [`Loader::state`], possibly by a
    /// job with another number of ranks or mesh). Refuses a state of another stream
    /// (dataset, seed, batch size or tail policy changed), naming what changed, and a
    /// step beyond the epoch. Every rank must call it at the same point.
    pub fn seek(&mut self, state: &LoaderState) -> Result<()> {
        let at = self.resume_point(state)?;
        self.reposition(at)
    }

    fn reposition(&mut self, at: Position) -> Result<()> {
        self.check_process()?;
        if at == self.position && self.failed.is_none() {
            self.epoch_ended = false;
            return Ok(());
        }
        let stream = &self.stream;
        self.tracker.interrupted(Instant::now(), |a, b| stream.rows_in_steps(a..b));
        let stopped = self.pipeline.stop(self.interrupt.as_deref_mut(), false);
        self.window.clear();
        self.position = at;
        self.epoch_ended = false;
        match stopped {
            Ok(expected_by) => {
                self.expected_by = self.expected_by.or(expected_by);
                Ok(())
            }
            Err(e) => {
                self.failed = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Checks that `state` belongs to this loader's stream (same dataset, seed, batch size
    /// and tail policy; the ranks and mesh may differ) and returns where it resumes.
    pub fn resume_point(&self, state: &LoaderState) -> Result<Position> {
        if state.seed != state.fingerprint.seed {
            return Err(Error::Config(format!(
                "cannot resume: the state contradicts itself: seed {}, but its fingerprint says seed {} (an edited \
                 state?)",
                state.seed, state.fingerprint.seed
            )));
        }
        if let Some(what) = state.fingerprint.differences(&self.fingerprint()) {
            return Err(Error::Config(format!("cannot resume: the stream changed since the state was saved: {what}")));
        }
        check_epoch(state.epoch)?;
        if state.step >= self.stream.steps_per_epoch {
            return Err(Error::Config(format!(
                "cannot resume at epoch {} step {}: an epoch has {} steps",
                state.epoch, state.step, self.stream.steps_per_epoch
            )));
        }
        Ok(Position::new(state.epoch, state.step))
    }

    /// What defines this loader's stream.
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of(&self.stream.dataset, &self.stream.options)
    }
}
