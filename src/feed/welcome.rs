//! The feeder's first answer (its welcome, JSON) and the file header on the wire that it,
//! and the ranks of a job opening a dataset ([`crate::loader::open_dataset`]), send.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use crate::dataset::gen::Manifest;
use crate::dataset::{Field, FileInfo, FileStamp, Format};
use crate::error::{Error, ErrorKind, Result, ResultExt};

/// A file header on the wire. Paths travel as bytes: a file name need not be UTF-8.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct WireInfo {
    path: Vec<u8>,
    format: Format,
    samples: u64,
    fields: Vec<Field>,
    bytes: u64,
    /// The identity every reader of the file checks against (see [`FileStamp`]).
    stamp: FileStamp,
    value_bytes: Vec<u64>,
    in_place: bool,
    pack_tokens: Option<u64>,
}

impl From<FileInfo> for WireInfo {
    fn from(f: FileInfo) -> WireInfo {
        WireInfo {
            path: f.path.into_os_string().into_vec(),
            format: f.format,
            samples: f.samples,
            fields: f.fields,
            bytes: f.bytes,
            stamp: f.stamp,
            value_bytes: f.value_bytes,
            in_place: f.in_place,
            pack_tokens: f.pack_tokens,
        }
    }
}

impl From<WireInfo> for FileInfo {
    fn from(w: WireInfo) -> FileInfo {
        FileInfo {
            path: PathBuf::from(OsString::from_vec(w.path)),
            format: w.format,
            samples: w.samples,
            fields: w.fields,
            bytes: w.bytes,
            stamp: w.stamp,
            value_bytes: w.value_bytes,
            in_place: w.in_place,
            pack_tokens: w.pack_tokens,
        }
    }
}

/// What a feeder tells a client that presented its token (JSON): the files' headers, the
/// address of the feeder rank that serves each file, and the generator's manifest where
/// the files are `meshfeed gen`'s (so that `--verify` checks contents through a feeder as
/// it does on the files).
#[derive(serde::Serialize, serde::Deserialize)]
struct Welcome {
    files: Vec<WireInfo>,
    owners: Vec<String>,
    #[serde(default)]
    manifest: Option<Manifest>,
}

/// A feeder's [`Welcome`]: `files`, file `i` served at `owners[i]`.
pub fn welcome_json(files: &[FileInfo], owners: Vec<String>, manifest: Option<Manifest>) -> Result<Vec<u8>> {
    let welcome = Welcome { files: files.iter().cloned().map(WireInfo::from).collect(), owners, manifest };
    serde_json::to_vec(&welcome).context(ErrorKind::Internal, "file headers do not serialise")
}

/// Reads [`welcome_json`], as the feeder at `feeder` (its URL, which errors name) sent
/// it: the files, each one's feeder address, and the manifest.
pub fn welcome_from_json(bytes: &[u8], feeder: &str) -> Result<(Vec<FileInfo>, Vec<String>, Option<Manifest>)> {
    let w: Welcome = serde_json::from_slice(bytes)
        .context(ErrorKind::Transport, format_args!("feeder {feeder}: bad file headers"))?;
    if w.owners.len() != w.files.len() {
        let (files, owners) = (w.files.len(), w.owners.len());
        return Err(Error::Transport(format!(
            "feeder {feeder}: bad file headers: {files} files but {owners} addresses"
        )));
    }
    Ok((w.files.into_iter().map(FileInfo::from).collect(), w.owners, w.manifest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_welcome_names_the_feeder_and_keeps_its_cause() {
        let e = welcome_from_json(b"{", "meshfeed://h:1/d").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transport);
        let text = e.to_string();
        assert!(text.starts_with("transport: feeder meshfeed://h:1/d: bad file headers: EOF while parsing"), "{text}");
        assert!(std::error::Error::source(&e).unwrap().is::<serde_json::Error>());
        let e = welcome_from_json(br#"{"files": [], "owners": ["a"]}"#, "meshfeed://h:1/d").unwrap_err();
        assert_eq!(e.to_string(), "transport: feeder meshfeed://h:1/d: bad file headers: 0 files but 1 addresses");
    }
}
