//! # meshfeed
//!
//! A data loader for distributed deep-learning training on HPC clusters: every rank reads
//! a disjoint range of the dataset files, the ranks perform an exact global shuffle by
//! exchanging samples with `MPI_Alltoallv` (or the same exchange over UCX), and each rank
//! receives exactly its shard of every global batch under the job's device mesh.
//!
//! The modules follow the pipeline:
//!
//! ```text
//! config (typed job description) ─► dataset (files → rows)
//!   ─► plan (permutation, home ranges, placement, windows, budget; pure)
//!   ─► transport (all-to-all-v over MPI or UCX; thin)
//!   ─► loader (producer: read, fill, exchange, assemble; consumer: batches)
//!   ─► verify (exactly-once checks, the dump format)
//!   ─► telemetry (typed, versioned records of a run: written by `meshfeed run`, read by
//!      `meshfeed report`)
//! feed: a shared feeder (`meshfeed serve`): one read of a dataset serves many jobs
//! runtime: how a process joins its job (MPI initialised or adopted, UCX rendezvous),
//!          stop signals, panics
//! ```
//!
//! Start with [`loader::Loader`] and [`runtime::Runtime`]. The contracts (exactly once,
//! world-size invariance, placement, byte exactness, resumption, bounded memory, no hangs,
//! the dump format) are described in `docs/design.md`.
//!
//! ## Features
//!
//! `mpi` (the MPI transport), `hdf5` (HDF5 files) and `ucx` (the UCX transport) are on by
//! default and additive; a build without one compiles, and selecting what it provides is a
//! clear error naming the feature.

pub(crate) mod buffers;
pub mod config;
pub mod dataset;
pub mod error;
pub mod feed;
pub mod loader;
pub mod plan;
pub mod runtime;
pub mod telemetry;
pub mod transport;
pub mod types;
pub mod verify;

pub use error::{Error, Result, ResultExt};

/// This build's version, with the git revision it was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("MESHFEED_GIT_REV"), ")");

// The README's and the docs' examples compile (and run, unless marked otherwise) as doc
// tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/rust.md")]
pub struct RustApiDoctests;
