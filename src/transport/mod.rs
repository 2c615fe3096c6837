//! Transports: the small byte-level interface the loader needs from a communication
//! library, and the failure agreement built on it.
//!
//! The interface is deliberately narrow (rank, size, all-to-all-v — blocking and
//! overlapped —, all-gather, all-reduce of small values, barrier, split, dup;
//! docs/design.md, "Transports") so that every backend implements all of it. Backends: [`mpi::MpiTransport`] (rsmpi) and [`local::LocalTransport`] (one
//! process, no communication; for tests, examples and single-process use) and, with the
//! `ucx` feature, `ucx::UcxTransport` (UCP tagged messages, bootstrapped by the TCP
//! [`rendezvous`] or by MPI). Count tables are validated in [`counts`] before any C call.

mod agree;
mod api;
pub mod counts;
pub mod hosts;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod rendezvous;
#[cfg(feature = "ucx")]
pub mod ucx;

pub use agree::{agree, agree_carrying, agree_position, agree_settings, agree_with};
pub use api::{ReduceOp, Transport};

#[cfg(feature = "mpi")]
pub use self::mpi::MpiTransport;
pub use local::LocalTransport;
