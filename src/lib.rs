//! # meshfeed
//!
//! A data loader for distributed deep-learning training on HPC clusters: every rank reads
//! a disjoint range of the dataset files, the ranks perform an exact global shuffle by
//! exchanging samples with `MPI_Alltoallv`, and each rank receives exactly its rows of
//! every global batch.
//!
//! The modules follow the pipeline:
//!
//! ```text
//! dataset (files → rows) ─► plan (permutation, home ranges, placement, windows)
//!        ─► transport (all-to-all-v over MPI) ─► loader (read, pack, exchange, assemble)
//!        ─► cli (gen, inspect, run)
//! ```
//!
//! Start with [`loader::Loader`]. The contracts (exactly once, world-size invariance,
//! byte exactness, bounded memory, no hangs, the `--dump` format) are described in the
//! README and in DESIGN.md.

pub mod cli;
pub mod dataset;
pub mod error;
pub mod loader;
pub mod plan;
pub mod transport;
pub mod types;

pub use error::{Error, Result};
