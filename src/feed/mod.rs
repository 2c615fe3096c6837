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

pub mod cache;
pub mod client;
pub mod server;
#[cfg_attr(not(feature = "ucx"), path = "no_ucx.rs")]
pub mod ucx;
pub mod wire;

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The URL scheme of a feeder.
pub const SCHEME: &str = "meshfeed://";

/// The environment variable a client's token comes from, with a `meshfeed://` source.
pub const TOKEN_VAR: &str = "MESHFEED_FEEDER_TOKEN";

/// The ending of a rendezvous file's name.
pub const RENDEZVOUS_SUFFIX: &str = ".feeder.json";

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

    /// Reads a rendezvous file.
    pub fn read(path: &Path) -> Result<Source> {
        let text = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_slice(&text)
            .map_err(|e| Error::file(path, format!("not a feeder's rendezvous file (address, name, token): {e}")))
    }

    /// Writes the rendezvous file, readable by its owner only (it holds the token).
    pub fn write(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, e))?;
        let text = serde_json::to_vec(self).map_err(|e| Error::Internal(format!("rendezvous: {e}")))?;
        f.write_all(&text).and_then(|()| f.sync_all()).map_err(|e| Error::io(&tmp, e))?;
        // Whole or absent: clients may be polling for it.
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
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
    fn tokens_are_fresh_and_compared_whole() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        assert!(same_token(&a, &a.clone()));
        assert!(!same_token(&a, &b) && !same_token(&a, &a[..31]) && !same_token("", &a));
    }
}
