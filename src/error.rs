//! One error type for the whole crate.
//!
//! Every variant carries the context a user needs to act on it: the file, the rank, the
//! option. Errors raised on one rank are turned into [`Error::Remote`] on every other rank
//! by the failure agreement in [`crate::transport::agree`], so that all ranks exit with
//! the same root cause instead of waiting in a collective (docs/design.md, "No hangs").

use std::path::PathBuf;

/// Result alias used throughout meshfeed.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in meshfeed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A dataset file could not be opened, parsed or read.
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },

    /// I/O on a path failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Two files of one dataset disagree about their fields.
    #[error("schema mismatch between {} and {}: {reason}", first.display(), second.display())]
    SchemaMismatch { first: PathBuf, second: PathBuf, reason: String },

    /// The loader options are inconsistent with the dataset or the world.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A transport (MPI) operation failed or was asked for something impossible.
    #[error("transport: {0}")]
    Transport(String),

    /// Verification of delivered data failed.
    #[error("verification failed: {0}")]
    Verify(String),

    /// Another rank failed; this rank stops with the same cause.
    #[error("rank {rank}: {message}")]
    Remote { rank: usize, message: String },

    /// The API was used in a way it does not allow (e.g. ranks that diverged, a loader
    /// used after it failed).
    #[error("{0}")]
    Misuse(String),

    /// A capability this build does not have.
    #[error(
        "meshfeed was built without the `{feature}` feature, needed for {needed_for}; rebuild with default features"
    )]
    FeatureDisabled { feature: &'static str, needed_for: String },

    /// A bug in meshfeed: please report it.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// A file error with a reason.
    pub fn file(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::File { path: path.into(), reason: reason.into() }
    }

    /// An I/O error on a path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    /// A capability of a feature this build lacks.
    pub fn feature_disabled(feature: &'static str, needed_for: impl Into<String>) -> Self {
        Error::FeatureDisabled { feature, needed_for: needed_for.into() }
    }
}

// Errors cross from the producer thread to the consumer.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Error>();
};
