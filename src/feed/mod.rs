//! A shared feeder: one process reads a dataset from storage once and serves its rows to
//! any number of training jobs (`meshfeed serve`).
//!
//! The feeder ([`server::Feeder`]) reads every file whole, sequentially, and keeps the rows
//! in memory, as the resident strategy does; launched on F ranks, rank r holds every F-th
//! file from r ([`server::owner`]). It serves from the start: a request for a file not
//! read yet waits for it. A client job names it instead of files: its
//! loader's single data path is `meshfeed://HOST:PORT/NAME` (the token in
//! `$MESHFEED_FEEDER_TOKEN`) or the feeder's rendezvous file (`NAME.feeder.json`, which
//! holds the address, the name and the token). Every rank of the client attaches, receives
//! the files' headers, and from then on reads rows from the feeder where it would have
//! read them from the files ([`client::Reader`]); everything else — the permutation, the
//! exchange between the client's ranks, the placement — is the client's own. So a client
//! receives exactly the stream it would have read from the files itself: the same
//! fingerprint, bytes, order and placement, whatever its seed, batch, mesh and world size.
//!
//! Each reader is one TCP connection speaking [`wire`]'s frames; a connection that does
//! not present the feeder's token is answered with a refusal and closed. On a feeder
//! rank's host, a client maps the feeder's memory and is told where held rows lie
//! ([`server`]); a feeder offering UCX (`--client-transport ucx`) sends large answers
//! over UCX, the connection still carrying every request ([`ucx`]). A client that dies
//! closes its connections and disturbs no other; a feeder that dies fails its clients'
//! reads with an error naming it (agreed on every rank, as any read error is).

pub mod admission;
pub mod cache;
pub mod client;
pub mod server;
#[cfg_attr(not(feature = "ucx"), path = "no_ucx.rs")]
pub mod ucx;
pub mod welcome;
pub mod wire;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The URL scheme of a feeder.
pub const SCHEME: &str = "meshfeed://";

/// The environment variable a client's token comes from, with a `meshfeed://` source.
pub const TOKEN_VAR: &str = "MESHFEED_FEEDER_TOKEN";

/// The ending of a rendezvous file's name.
pub const RENDEZVOUS_SUFFIX: &str = ".feeder.json";

/// The most bytes a rendezvous file holds (an address, a name and a token).
pub const MAX_RENDEZVOUS: u64 = 64 << 10;

/// Where a feeder listens, what it serves and the token it asks for: what a rendezvous
/// file holds.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Source {
    /// `HOST:PORT`.
    pub address: String,
    /// The dataset's name.
    pub name: String,
    pub token: String,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        write!(f, "{}", self.url())
    }
}

impl Source {
    /// The feeder a loader's data paths name, if they name one: a single
    /// `meshfeed://HOST:PORT/NAME` (token from `$MESHFEED_FEEDER_TOKEN`) or a single
    /// rendezvous file. A feeder among other paths is an error.
    pub fn from_paths(paths: &[PathBuf]) -> Result<Option<Source>> {
        let is_feeder = |p: &PathBuf| {
            let s = p.to_string_lossy();
            s.starts_with(SCHEME) || s.ends_with(RENDEZVOUS_SUFFIX)
        };
        match paths {
            [one] if is_feeder(one) => {
                let text = one.to_string_lossy();
                match text.strip_prefix(SCHEME) {
                    Some(rest) => Source::parse_url(rest, std::env::var(TOKEN_VAR).ok()).map(Some),
                    None => Source::read(one).map(Some),
                }
            }
            _ if paths.iter().any(is_feeder) => {
                Err(Error::Config("a feeder (meshfeed://... or a .feeder.json file) must be the only data path".into()))
            }
            _ => Ok(None),
        }
    }

    /// Parses `HOST:PORT/NAME` (the URL after the scheme).
    fn parse_url(rest: &str, token: Option<String>) -> Result<Source> {
        let url = format!("{SCHEME}{rest}");
        let (address, name) = rest
            .split_once('/')
            .filter(|(a, n)| a.contains(':') && !n.is_empty() && !n.contains('/'))
            .ok_or_else(|| Error::Config(format!("{url}: expected {SCHEME}HOST:PORT/NAME")))?;
        let token = token.filter(|t| !t.is_empty()).ok_or_else(|| {
            Error::Config(format!(
                "{url}: no token: set {TOKEN_VAR} to the feeder's token (its rendezvous file holds it), or give the \
                 rendezvous file as the data path"
            ))
        })?;
        Ok(Source { address: address.into(), name: name.into(), token })
    }

    /// Reads a rendezvous file: a regular file of at most [`MAX_RENDEZVOUS`] bytes (a FIFO
    /// or a device in its place is refused, never waited on).
    pub fn read(path: &Path) -> Result<Source> {
        let text = crate::config::read_small_file(path, MAX_RENDEZVOUS)?;
        serde_json::from_str(&text)
            .map_err(|e| Error::file(path, format!("not a feeder's rendezvous file (address, name, token): {e}")))
    }

    /// Writes the rendezvous file, readable by its owner only (it holds the token): into a
    /// new file of an unpredictable name beside it, created only if nothing has that name
    /// (a file or link planted there is never opened, let alone followed), mode 0600 whatever
    /// the umask, then renamed over `path` (whole or absent: clients may be polling for it;
    /// a link at `path` is replaced, not followed).
    pub fn write(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let is_dir = std::fs::metadata(dir).map_err(|e| Error::io(dir, e))?.is_dir();
        if !is_dir {
            return Err(Error::file(dir, "not a directory: the rendezvous file cannot be written there"));
        }
        let name = path.file_name().ok_or_else(|| Error::file(path, "no file name for the rendezvous file"))?;
        let suffix: String = random_bytes::<8>()?.iter().map(|b| format!("{b:02x}")).collect();
        let tmp = dir.join(format!(".{}.{suffix}.tmp", name.to_string_lossy()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true) // O_CREAT | O_EXCL
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, e))?;
        let written = (|| {
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            let text = serde_json::to_vec(self).map_err(std::io::Error::other)?;
            f.write_all(&text)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(path, e)
        })
    }

    /// `meshfeed://HOST:PORT/NAME`.
    pub fn url(&self) -> String {
        format!("{SCHEME}{}/{}", self.address, self.name)
    }
}

/// What the other side of a connection did, seen without reading: while an answer goes
/// over UCX, the connection carries nothing unless that side gives up on UCX.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Peeked {
    /// Nothing to read.
    Quiet,
    /// It wrote something.
    Readable,
    /// It closed the connection, or it was reset: why.
    Closed(String),
}

/// [`Peeked`] of `stream`, without blocking or consuming anything.
pub(crate) fn peek(stream: &std::net::TcpStream) -> Peeked {
    let peeked = stream.set_nonblocking(true).and_then(|()| stream.peek(&mut [0u8; 1]));
    let _ = stream.set_nonblocking(false);
    match peeked {
        Ok(0) => Peeked::Closed("closed".into()),
        Ok(_) => Peeked::Readable,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Peeked::Quiet,
        Err(e) => Peeked::Closed(e.to_string()),
    }
}

/// A fresh token: 128 random bits, in hex.
pub fn new_token() -> Result<String> {
    let bits: [u8; 16] = random_bytes()?;
    Ok(bits.iter().map(|b| format!("{b:02x}")).collect())
}

/// `N` random bytes.
fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    use std::io::Read;
    let mut bits = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bits))
        .map_err(|e| Error::io("/dev/urandom", e))?;
    Ok(bits)
}

/// Whether two tokens are equal, in time independent of where they differ.
fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_paths_name_a_feeder_by_url_or_rendezvous_file() {
        assert_eq!(Source::from_paths(&["/data/a.npy".into(), "/data/b".into()]).unwrap(), None);
        let s = Source::parse_url("node1:7000/imagenet", Some("t0k".into())).unwrap();
        assert_eq!((s.address.as_str(), s.name.as_str(), s.token.as_str()), ("node1:7000", "imagenet", "t0k"));
        assert_eq!(s.url(), "meshfeed://node1:7000/imagenet");
        assert_eq!(format!("{s:?}"), "meshfeed://node1:7000/imagenet", "the token is never printed");
        for bad in ["node1/imagenet", "node1:7000/", "node1:7000", "node1:7000/a/b"] {
            let err = Source::parse_url(bad, Some("t".into())).unwrap_err().to_string();
            assert!(err.contains("expected meshfeed://HOST:PORT/NAME"), "{bad}: {err}");
        }
        let err = Source::parse_url("node1:7000/imagenet", None).unwrap_err().to_string();
        assert!(err.contains("no token: set MESHFEED_FEEDER_TOKEN"), "{err}");
        let err = Source::from_paths(&["meshfeed://h:1/d".into(), "/data".into()]).unwrap_err().to_string();
        assert!(err.contains("must be the only data path"), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("imagenet.feeder.json");
        s.write(&file).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(Source::from_paths(std::slice::from_ref(&file)).unwrap(), Some(s));
        std::fs::write(&file, "{}").unwrap();
        let err = Source::from_paths(&[file]).unwrap_err().to_string();
        assert!(err.contains("imagenet.feeder.json: not a feeder's rendezvous file"), "{err}");
    }

    #[test]
    fn the_rendezvous_file_is_never_written_through_a_planted_file_or_link() {
        use std::os::unix::fs::PermissionsExt;
        let s = Source { address: "h:1".into(), name: "d".into(), token: "0123456789abcdef".into() };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("d.feeder.json");
        // What an older meshfeed wrote to, planted world-readable, and a link in its place
        // to a file the attacker wants overwritten.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let planted = dir.path().join("d.feeder.tmp");
        std::fs::write(&planted, "").unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("d.feeder.json.tmp")).unwrap();
        // A link at the rendezvous path itself is replaced, not followed.
        std::os::unix::fs::symlink(&victim, &file).unwrap();
        // SAFETY: umask only changes this process's file creation mask (restored below).
        let old = unsafe { libc::umask(0) };
        let written = s.write(&file);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        written.unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&planted).unwrap(), "");
        let meta = std::fs::symlink_metadata(&file).unwrap();
        assert!(meta.is_file(), "the rendezvous file is a file, not a link");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "owner-only, whatever the umask");
        assert_eq!(Source::read(&file).unwrap(), s);
        // Nothing left behind but what was there.
        let mut names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert_eq!(names, ["d.feeder.json", "d.feeder.json.tmp", "d.feeder.tmp", "victim"]);
        // A missing directory is named as the problem.
        let err = s.write(&dir.path().join("no/such/d.feeder.json")).unwrap_err().to_string();
        assert!(err.contains("no/such") && err.contains("No such file or directory"), "{err}");
        assert!(!err.contains("d.feeder.json"), "the directory is the problem, not a file in it: {err}");
    }

    #[test]
    fn a_rendezvous_file_that_is_a_fifo_or_too_long_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("d.feeder.json");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let start = std::time::Instant::now();
        let err = Source::from_paths(std::slice::from_ref(&fifo)).unwrap_err().to_string();
        assert!(err.contains("not a regular file (a FIFO)"), "{err}");
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        let long = dir.path().join("e.feeder.json");
        std::fs::write(&long, vec![b' '; MAX_RENDEZVOUS as usize + 1]).unwrap();
        let err = Source::read(&long).unwrap_err().to_string();
        assert!(err.contains("65537 bytes: a file of this kind is at most 65536 bytes"), "{err}");
    }

    #[test]
    fn tokens_are_fresh_and_compared_whole() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        assert!(same_token(&a, &a.clone()));
        assert!(!same_token(&a, &b) && !same_token(&a, &a[..31]) && !same_token("", &a));
    }
}
