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

    /// Another rank failed; this rank stops with the same cause (`kind` is the cause's).
    #[error("rank {rank}: {message}")]
    Remote { rank: usize, kind: ErrorKind, message: String },

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

/// What kind of failure an error is, the same on every rank for an agreed failure: what
/// the Python package's exception classes and scripts go by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The data: a file missing, unreadable, truncated or corrupt, or schemas that differ.
    Data,
    /// The options, the job file or the launch environment.
    Config,
    /// Communication between ranks.
    Transport,
    /// Delivered data failed verification.
    Verify,
    /// The API used in a way it does not allow.
    Misuse,
    /// A bug in meshfeed (or a build without a needed feature).
    Internal,
}

impl ErrorKind {
    const ALL: [ErrorKind; 6] = [
        ErrorKind::Data,
        ErrorKind::Config,
        ErrorKind::Transport,
        ErrorKind::Verify,
        ErrorKind::Misuse,
        ErrorKind::Internal,
    ];

    /// The kind as one byte (for the failure agreement).
    pub fn code(self) -> u8 {
        ErrorKind::ALL.iter().position(|&k| k == self).expect("listed") as u8
    }

    /// The kind of a byte from [`ErrorKind::code`] (a peer's: unknown bytes are `Internal`).
    pub fn from_code(code: u8) -> ErrorKind {
        ErrorKind::ALL.get(code as usize).copied().unwrap_or(ErrorKind::Internal)
    }
}

impl Error {
    /// The kind of failure (for [`Error::Remote`], the kind at its origin).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::File { .. } | Error::Io { .. } | Error::SchemaMismatch { .. } => ErrorKind::Data,
            Error::Config(_) => ErrorKind::Config,
            Error::Transport(_) => ErrorKind::Transport,
            Error::Verify(_) => ErrorKind::Verify,
            Error::Remote { kind, .. } => *kind,
            Error::Misuse(_) => ErrorKind::Misuse,
            Error::FeatureDisabled { .. } | Error::Internal(_) => ErrorKind::Internal,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_survive_their_codes() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_code(k.code()), k);
        }
        assert_eq!(ErrorKind::from_code(200), ErrorKind::Internal);
        let remote = Error::Remote { rank: 1, kind: ErrorKind::Data, message: "m".into() };
        assert_eq!((remote.kind(), Error::file("f", "r").kind()), (ErrorKind::Data, ErrorKind::Data));
    }
}
