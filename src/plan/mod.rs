//! Planning: pure functions that decide who reads, sends and receives which sample.
//!
//! Nothing here communicates; every rank computes the same plan from the same inputs,
//! which is what makes the exchange deterministic and world-size invariant
//! (DESIGN.md contracts 2 and 5). Start with [`window::WindowPlan`]: it combines the
//! epoch's [`permutation::Permutation`], the [`home::HomeRanges`] (who reads a sample)
//! and the [`placement::Placement`] (who receives which rows of a global batch).

pub mod home;
pub mod permutation;
pub mod placement;
pub mod window;

pub use home::HomeRanges;
pub use permutation::Permutation;
pub use placement::Placement;
pub use window::{steps_per_window, WindowPlan};
