//! What a loader delivers and how, as it was built: the stream's steps and windows, the
//! dataset and options, the ranks and mesh, the placement of rows on ranks, and the read
//! plan. Read only, and as built: where the tuner grows the windows or the balancer moves
//! the home ranges, each window's telemetry says where they went.

use super::Loader;
use crate::config::{ExchangeMode, LoaderOptions};
use crate::dataset::Dataset;
use crate::plan::{IoPlan, Mesh, Placement, WindowBudget};
use crate::types::Step;

/// The stream as built: its shape, the world, the placement and the read plan.
impl Loader {
    /// Global batches (steps) per epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        self.stream.steps_per_epoch
    }

    /// Steps exchanged together in one window.
    pub fn steps_per_window(&self) -> u64 {
        self.stream.steps_per_window
    }

    /// The window budget (and the memory bound it gives).
    pub fn budget(&self) -> WindowBudget {
        self.stream.budget
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.stream.dataset
    }

    /// The options.
    pub fn options(&self) -> &LoaderOptions {
        &self.stream.options
    }

    /// This rank, in the loader's world.
    pub fn rank(&self) -> crate::types::Rank {
        self.stream.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.stream.world
    }

    /// The device mesh.
    pub fn mesh(&self) -> &Mesh {
        &self.stream.mesh
    }

    /// This rank's mesh coordinate (of its first device, with several devices per process).
    pub fn coords(&self) -> &[usize] {
        &self.stream.coords
    }

    /// Each field's sharding over the mesh's axes, in field order (defaults resolved).
    pub fn sharding(&self) -> &[crate::plan::sharding::FieldSharding] {
        &self.stream.sharding
    }

    /// This rank's index among the ranks on its host, and their number (hosts as
    /// `MESHFEED_HOST` or the host name tells).
    pub fn local_rank(&self) -> (usize, usize) {
        let hosts = &self.stream.hosts;
        let mine = hosts[self.stream.rank.0];
        let before = hosts[..self.stream.rank.0].iter().filter(|&&h| h == mine).count();
        (before, hosts.iter().filter(|&&h| h == mine).count())
    }

    /// The placement of batch rows and slices on ranks.
    pub fn placement(&self) -> &Placement {
        &self.stream.placement
    }

    /// The placement of step `step` (the last step of a `partial` epoch has its own).
    pub fn placement_for_step(&self, step: Step) -> &Placement {
        self.stream.placement_for_step(step)
    }

    /// The placement of the partial last batch, if the tail policy makes one.
    pub fn tail_placement(&self) -> Option<&Placement> {
        self.stream.tail_placement.as_ref()
    }

    /// Rows of the global batches of steps `steps`.
    pub fn rows_in_steps(&self, steps: std::ops::Range<u64>) -> u64 {
        self.stream.rows_in_steps(steps)
    }

    /// Samples per epoch that no batch delivers (tail policy `drop`).
    pub fn dropped_per_epoch(&self) -> u64 {
        self.dataset().len().saturating_sub(self.rows_in_steps(0..self.steps_per_epoch()))
    }

    /// The exchange in use (`Auto` resolved).
    pub fn exchange_mode(&self) -> ExchangeMode {
        self.stream.mode
    }

    /// This rank's home range of sample ids, as the loader started (a balanced stream's
    /// ranges move between epochs: each window's telemetry names its length).
    pub fn home_range(&self) -> std::ops::Range<u64> {
        self.stream.home.range(self.stream.rank)
    }

    /// Every rank's home range, as the loader started (any split of the ids into ranges
    /// serves [`crate::verify`]'s exactly-once check).
    pub fn home_ranges(&self) -> &crate::plan::HomeRanges {
        &self.stream.home
    }

    /// How the ranks read their home ranges: the strategy, what each rank keeps in
    /// memory, whether the rest is spilled, and why.
    pub fn read_plan(&self) -> &IoPlan {
        &self.stream.io
    }

    /// Whether same-host ranks copy each other's kept rows (else they are exchanged).
    pub fn shares_stores(&self) -> bool {
        self.stream.shared_stores
    }
}
