//! Planning: pure functions that decide who reads, sends and receives which sample.
//!
//! Nothing here communicates; every rank computes the same plan from the same inputs,
//! which is what makes the exchange deterministic and world-size invariant
//! (docs/design.md: world-size invariance, determinism). Start with [`window::WindowPlan`]: it combines the
//! epoch's [`permutation::Permutation`], the [`home::HomeRanges`] (who reads a sample)
//! and the [`placement::Placement`] (who receives which rows and slices of a global
//! batch, derived from a [`mesh::Mesh`] and the fields' [`sharding`]). [`blend`] decides,
//! for a weighted blend of several sources, which source gives each position and which of
//! its samples (not yet used by the loader).

pub mod blend;
pub mod budget;
pub mod cost;
pub mod cost_balance;
pub mod home;
pub mod index;
pub mod io;
pub mod mesh;
pub mod permutation;
pub mod placement;
pub mod sharding;
pub mod tune;
pub mod window;

pub use blend::{Blend, BlendCursor, Weights};
pub use budget::WindowBudget;
pub use home::HomeRanges;
pub use index::HomeIndex;
pub use io::{IoPlan, Strategy};
pub use mesh::Mesh;
pub use permutation::{Permutation, SharedOrder};
pub use placement::{FieldPart, Placement};
pub use sharding::{FieldSharding, Stage};
pub use window::{EpochOrder, WindowPlan};
