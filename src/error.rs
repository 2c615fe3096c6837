//! One error type for the whole crate.
//!
//! Every variant carries the context a user needs to act on it: the file, the rank, the
//! option. Errors raised on one rank are turned into [`Error::Remote`] on every other rank
//! by the failure agreement in [`crate::transport::agree`], so that all ranks exit with
//! the same root cause instead of waiting in a collective (docs/design.md, "No hangs").
//!
//! An error that another library or the OS reported (an I/O error, a JSON or Arrow or
//! HDF5 error, a refused allocation) is kept as the [`std::error::Error::source`] of
//! ours, not only as text: [`ResultExt`] wraps it with the file or the context and the
//! right kind. The message still holds the cause's text, so it reads the same whether or
//! not the printer walks the chain (the command line's skips a cause whose text the
//! message already holds).

use std::fmt::Display;
use std::path::{Path, PathBuf};

/// Result alias used throughout meshfeed.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A foreign error kept as the cause ([`std::error::Error::source`]) of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in meshfeed.
///
/// Foreign errors become ours at the edges: with [`ResultExt`] where the call site knows
/// the file or what it was doing (nearly always), with `?` through a `From` conversion
/// where the foreign error alone says what went wrong. The `From` conversions:
///
/// * `serde_json::Error` → kind [`ErrorKind::Config`] ("invalid configuration: …"): JSON
///   meshfeed is given without a file is options or a loader state. JSON read from a file
///   takes [`ResultExt::in_file`], JSON from a peer [`ErrorKind::Transport`], and
///   serialising our own values [`ErrorKind::Internal`] (with [`ResultExt::context`]).
/// * `arrow_schema::ArrowError` and (feature `hdf5`) `hdf5::Error` → kind
///   [`ErrorKind::Data`], the foreign message as it is: these libraries are used for data
///   files only. Prefer [`ResultExt::in_file`], which names the file.
/// * No `std::io::Error`: what an I/O error is depends on what it was on — a data file
///   (kind `Data`, and the path is what the user needs: [`Error::io`]), a socket
///   (`Transport`), a pipe or a thread (`Internal`) — and a conversion would let `?` drop
///   the path silently.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A dataset file could not be opened, parsed or read. `reason` is the whole message
    /// after the path, the cause's text included; `source` is the cause, if a foreign error
    /// was one.
    #[error("{}: {reason}", path.display())]
    File {
        path: PathBuf,
        reason: String,
        #[source]
        source: Option<BoxError>,
    },

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

    /// A failure of kind `kind` outside a file that a foreign error caused (a socket, a
    /// thread, a signal handler, a peer's bytes): shown as the variant of its kind shows
    /// its text (`Config`'s "invalid configuration: …", `Transport`'s "transport: …"),
    /// with `message` holding the cause's text and `source` the cause. Made by
    /// [`ResultExt::context`] and [`Error::caused`].
    #[error("{}{message}", kind.prefix())]
    Caused {
        kind: ErrorKind,
        message: String,
        #[source]
        source: BoxError,
    },
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

    /// What the message of an error of this kind starts with: the prefix of the text
    /// variant of the kind ([`Error::Config`]'s, [`Error::Transport`]'s, …), so that
    /// [`Error::Caused`] reads as they do.
    fn prefix(self) -> &'static str {
        match self {
            ErrorKind::Data | ErrorKind::Misuse => "",
            ErrorKind::Config => "invalid configuration: ",
            ErrorKind::Transport => "transport: ",
            ErrorKind::Verify => "verification failed: ",
            ErrorKind::Internal => "internal error: ",
        }
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
            Error::Remote { kind, .. } | Error::Caused { kind, .. } => *kind,
            Error::Misuse(_) => ErrorKind::Misuse,
            Error::FeatureDisabled { .. } | Error::Internal(_) => ErrorKind::Internal,
        }
    }

    /// A file error with a reason (of meshfeed's own: no cause to keep).
    pub fn file(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::File { path: path.into(), reason: reason.into(), source: None }
    }

    /// A file error that `source` caused; `reason` holds its text, worded as the call
    /// site needs (for the usual "{what}: {cause}", [`ResultExt::file_context`]).
    pub fn file_caused(path: impl Into<PathBuf>, reason: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::File { path: path.into(), reason: reason.into(), source: Some(source.into()) }
    }

    /// An I/O error on a path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    /// An error of `kind` outside a file that `source` caused; `message` holds its text,
    /// worded as the call site needs (for the usual "{what}: {cause}",
    /// [`ResultExt::context`]).
    pub fn caused(kind: ErrorKind, message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Caused { kind, message: message.into(), source: source.into() }
    }

    /// A capability of a feature this build lacks.
    pub fn feature_disabled(feature: &'static str, needed_for: impl Into<String>) -> Self {
        Error::FeatureDisabled { feature, needed_for: needed_for.into() }
    }
}

/// JSON meshfeed is given without a file: options or a loader state ([`Error`] says why).
impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::caused(ErrorKind::Config, e.to_string(), e)
    }
}

/// Arrow is used for data files only ([`Error`] says why); prefer [`ResultExt::in_file`].
impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Error::caused(ErrorKind::Data, e.to_string(), e)
    }
}

/// HDF5 is used for data files only ([`Error`] says why); prefer [`ResultExt::in_file`].
#[cfg(feature = "hdf5")]
impl From<hdf5::Error> for Error {
    fn from(e: hdf5::Error) -> Self {
        Error::caused(ErrorKind::Data, e.to_string(), e)
    }
}

/// Turns a foreign error into an [`Error`] that keeps it as its cause
/// ([`std::error::Error::source`]), its text in the message. The context is formatted
/// only on failure: pass `format_args!(..)` rather than `format!(..)` on hot paths.
///
/// ```
/// use meshfeed::error::{ErrorKind, ResultExt};
/// let e = std::fs::read("/nonexistent/a.npy").in_file("/nonexistent/a.npy").unwrap_err();
/// assert!(e.to_string().starts_with("/nonexistent/a.npy: No such file or directory"));
/// assert_eq!(e.kind(), ErrorKind::Data);
/// let e = serde_json::from_str::<u32>("x").context(ErrorKind::Transport, "bad reply").unwrap_err();
/// assert_eq!(e.to_string(), "transport: bad reply: expected value at line 1 column 1");
/// assert!(std::error::Error::source(&e).unwrap().is::<serde_json::Error>());
/// ```
pub trait ResultExt<T> {
    /// An error of the file at `path` (kind [`ErrorKind::Data`]): "{path}: {cause}". An
    /// `std::io::Error` becomes [`Error::Io`], as [`Error::io`] makes it.
    fn in_file(self, path: impl AsRef<Path>) -> Result<T>;

    /// An error of the file at `path` (kind [`ErrorKind::Data`]): "{path}: {what}: {cause}".
    fn file_context(self, path: impl AsRef<Path>, what: impl Display) -> Result<T>;

    /// An error of `kind` outside a file: "{what}: {cause}" after the kind's prefix, as
    /// the text variant of the kind shows it (e.g. "transport: {what}: {cause}").
    fn context(self, kind: ErrorKind, what: impl Display) -> Result<T>;
}

impl<T, E> ResultExt<T> for std::result::Result<T, E>
where
    E: std::error::Error + Send + Sync + 'static,
{
    fn in_file(self, path: impl AsRef<Path>) -> Result<T> {
        self.map_err(|e| {
            let path = path.as_ref().to_path_buf();
            let e: BoxError = Box::new(e);
            match e.downcast::<std::io::Error>() {
                Ok(io) => Error::io(path, *io),
                Err(e) => Error::File { path, reason: e.to_string(), source: Some(e) },
            }
        })
    }

    fn file_context(self, path: impl AsRef<Path>, what: impl Display) -> Result<T> {
        self.map_err(|e| Error::file_caused(path.as_ref(), format!("{what}: {e}"), e))
    }

    fn context(self, kind: ErrorKind, what: impl Display) -> Result<T> {
        self.map_err(|e| Error::caused(kind, format!("{what}: {e}"), e))
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
    use std::error::Error as _;

    /// The causes of `e`, outermost first.
    fn chain(e: &Error) -> Vec<&(dyn std::error::Error + 'static)> {
        std::iter::successors(e.source(), |&s| s.source()).collect()
    }

    #[test]
    fn kinds_survive_their_codes() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_code(k.code()), k);
        }
        assert_eq!(ErrorKind::from_code(200), ErrorKind::Internal);
        let remote = Error::Remote { rank: 1, kind: ErrorKind::Data, message: "m".into() };
        assert_eq!((remote.kind(), Error::file("f", "r").kind()), (ErrorKind::Data, ErrorKind::Data));
        assert!(Error::file("f", "r").source().is_none());
    }

    #[test]
    fn an_io_error_in_a_file_keeps_its_cause_and_reads_as_before() {
        let path = Path::new("/nonexistent/meshfeed/a.npy");
        let io = std::fs::File::open(path).unwrap_err();
        let want = format!("{}: {io}", path.display());
        let e = std::fs::File::open(path).in_file(path).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e:?}");
        assert_eq!((e.to_string(), e.kind()), (want.clone(), ErrorKind::Data));
        assert_eq!(Error::io(path, std::fs::File::open(path).unwrap_err()).to_string(), want);
        let cause = chain(&e)[0].downcast_ref::<std::io::Error>().expect("the io error");
        assert_eq!(cause.kind(), std::io::ErrorKind::NotFound);

        // With context, and outside a file.
        let e = std::fs::File::open(path).file_context(path, "spill directory").unwrap_err();
        assert_eq!(e.to_string(), format!("{}: spill directory: {io}", path.display()));
        assert!(chain(&e)[0].is::<std::io::Error>());
        let e = std::fs::File::open(path).context(ErrorKind::Internal, format_args!("cannot start thread {}", 3));
        let e = e.unwrap_err();
        assert_eq!(
            (e.to_string(), e.kind()),
            (format!("internal error: cannot start thread 3: {io}"), ErrorKind::Internal)
        );
        assert!(chain(&e)[0].is::<std::io::Error>());
    }

    #[test]
    fn a_json_error_keeps_its_cause_through_our_own() {
        let json = serde_json::from_str::<u32>("{").unwrap_err();
        // A loader state: Config, then the file it was read from (`LoaderState::read_file`).
        let e = serde_json::from_str::<u32>("{").context(ErrorKind::Config, "invalid loader state").unwrap_err();
        let text = format!("invalid configuration: invalid loader state: {json}");
        assert_eq!((e.to_string(), e.kind()), (text.clone(), ErrorKind::Config));
        let e = Err::<(), _>(e).in_file("/s/state.json").unwrap_err();
        assert_eq!((e.to_string(), e.kind()), (format!("/s/state.json: {text}"), ErrorKind::Data));
        let causes = chain(&e);
        assert_eq!(causes.len(), 2);
        assert!(causes[0].is::<Error>() && causes[1].is::<serde_json::Error>());
        assert_eq!(causes[1].to_string(), json.to_string());

        // `?` at an edge: options given as JSON.
        fn parse(text: &str) -> Result<u32> {
            Ok(serde_json::from_str(text)?)
        }
        let e = parse("{").unwrap_err();
        assert_eq!((e.to_string(), e.kind()), (format!("invalid configuration: {json}"), ErrorKind::Config));
        assert!(chain(&e)[0].is::<serde_json::Error>());
    }

    #[test]
    fn an_arrow_error_keeps_its_cause() {
        let tail = [0u8; 10]; // no "ARROW1" trailer
        let arrow = arrow_ipc::reader::read_footer_length(tail).unwrap_err();
        let e = arrow_ipc::reader::read_footer_length(tail)
            .file_context("/d/a.arrow", "corrupt Arrow IPC file")
            .unwrap_err();
        assert_eq!(
            (e.to_string(), e.kind()),
            (format!("/d/a.arrow: corrupt Arrow IPC file: {arrow}"), ErrorKind::Data)
        );
        assert!(matches!(&e, Error::File { reason, .. } if reason.ends_with(&arrow.to_string())));
        assert!(chain(&e)[0].is::<arrow_schema::ArrowError>());
        let e = arrow_ipc::reader::read_footer_length(tail).in_file("/d/a.arrow").unwrap_err();
        assert_eq!(e.to_string(), format!("/d/a.arrow: {arrow}"));
        let e = Error::from(arrow_ipc::reader::read_footer_length(tail).unwrap_err());
        assert_eq!((e.to_string(), e.kind()), (arrow.to_string(), ErrorKind::Data));
        assert!(chain(&e)[0].is::<arrow_schema::ArrowError>());
    }

    #[test]
    fn a_caused_error_reads_as_the_text_variant_of_its_kind() {
        let texts = [
            (ErrorKind::Data, "m".to_string()),
            (ErrorKind::Config, Error::Config("m".into()).to_string()),
            (ErrorKind::Transport, Error::Transport("m".into()).to_string()),
            (ErrorKind::Verify, Error::Verify("m".into()).to_string()),
            (ErrorKind::Misuse, Error::Misuse("m".into()).to_string()),
            (ErrorKind::Internal, Error::Internal("m".into()).to_string()),
        ];
        for (kind, text) in texts {
            let e = Error::caused(kind, "m", std::io::Error::other("cause"));
            assert_eq!((e.kind(), e.to_string()), (kind, text));
        }
    }
}
