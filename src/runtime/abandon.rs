//! Whether a loader of this process gave up a wait and left its producer behind, possibly
//! inside a collective the other ranks never join: the [`super::Runtime`] then leaves MPI
//! (or UCX) as it is at exit instead of finalising it under that thread, and the launcher
//! ends the job.

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether a producer was ever abandoned in this process.
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// Whether a loader of this process gave up a wait and left its producer behind.
pub fn abandoned() -> bool {
    ABANDONED.load(Ordering::Acquire)
}

/// Records that a loader left its producer behind ([`abandoned`] is `true` from now on).
pub fn mark_abandoned() {
    ABANDONED.store(true, Ordering::Release);
}
