//! The deployment emulations, in one test binary: the container image's recipe checked
//! against the code (`image`), the MPIJob on emulated pods of the image (`mpijob`), a
//! preempted Kubernetes Job (`kubernetes`), the Ray launcher on a multi-node Ray cluster
//! (`launchers`) and jobs on a two-node Slurm (`slurm`). Emulated nodes and pods are
//! network namespaces on a bridge, made by one helper (launch/netns.sh).
//!
//! A tier of its own (slower, root, more system packages): tests/ci.sh runs it after the
//! behaviour tests (tests/behaviour), as `cargo test --release --test emulation`.

use std::sync::{Mutex, MutexGuard};

#[path = "../common/mod.rs"]
mod common;
mod recipe;

mod image;
mod kubernetes;
mod launchers;
mod mpijob;
mod slurm;

/// Held by each test that brings up an emulated cluster (Slurm nodes, Ray nodes, MPIJob
/// pods, a preempted Kubernetes Job): one at a time, as when each file was a test binary
/// of its own, so that two clusters never share the two cores (and their hang limits).
/// The other tests of the tier run beside them.
pub fn one_cluster_at_a_time() -> MutexGuard<'static, ()> {
    static CLUSTER: Mutex<()> = Mutex::new(());
    // A test that failed holding it poisons nothing the next one needs.
    CLUSTER.lock().unwrap_or_else(|e| e.into_inner())
}
