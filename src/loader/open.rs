//! Opening a dataset collectively: every rank lists the files, each file's header is read
//! by one rank (file `i` by rank `i mod P`), and the headers are shared. Failures on any
//! rank are agreed, so every rank returns the same error.

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;

use crate::dataset::gen::Manifest;
use crate::dataset::{self, Dataset, DatasetOptions, Field, FileInfo, FileStamp, Format};
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::transport::{agree, ReduceOp, Transport};

/// A file header on the wire. Paths travel as bytes: a file name need not be UTF-8.
#[derive(serde::Serialize, serde::Deserialize)]
struct WireInfo {
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
pub(crate) fn welcome_json(files: &[FileInfo], owners: Vec<String>, manifest: Option<Manifest>) -> Result<Vec<u8>> {
    let welcome = Welcome { files: files.iter().cloned().map(WireInfo::from).collect(), owners, manifest };
    serde_json::to_vec(&welcome).context(ErrorKind::Internal, "file headers do not serialise")
}

/// Reads [`welcome_json`]: the files, each one's feeder address, and the manifest.
pub(crate) fn welcome_from_json(
    bytes: &[u8],
) -> std::result::Result<(Vec<FileInfo>, Vec<String>, Option<Manifest>), String> {
    let w: Welcome = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if w.owners.len() != w.files.len() {
        return Err(format!("{} files but {} addresses", w.files.len(), w.owners.len()));
    }
    Ok((w.files.into_iter().map(FileInfo::from).collect(), w.owners, w.manifest))
}

/// Opens the dataset at `paths` on every rank of `transport` (collective). Where `paths`
/// name a feeder ([`crate::feed`]), rank 0 attaches to it instead and shares the file
/// headers it gets, and every rank reads its rows from there.
pub fn open_dataset(transport: &dyn Transport, paths: &[PathBuf], options: DatasetOptions) -> Result<Dataset> {
    if let Some(source) = agree(transport, crate::feed::Source::from_paths(paths))? {
        use crate::feed::client;
        if options.pack.is_some() {
            let url = source.url();
            return agree(
                transport,
                Err(Error::Config(format!("{url}: sequence packing of a feeder's rows is not supported"))),
            );
        }
        let welcome = agree(transport, if transport.rank().0 == 0 { client::attach(&source) } else { Ok(Vec::new()) })?;
        let welcome = transport.all_gather(&welcome)?.swap_remove(0);
        let served = client::welcome(&source, &welcome)
            .and_then(|(files, owners, manifest)| Dataset::from_files(files, options).map(|d| (d, owners, manifest)))
            .and_then(|(d, owners, manifest)| d.served_by(source, owners, manifest));
        return agree(transport, served);
    }
    let files = agree(transport, dataset::resolve_paths(paths))?;
    // Ranks must see the same files (a rank on another filesystem would disagree).
    let mut listing = Vec::new();
    for (path, format) in &files {
        listing.extend_from_slice(path.as_os_str().as_bytes());
        listing.push(0);
        listing.push(*format as u8);
    }
    let digest = u64::from(crc32fast::hash(&listing)) | (listing.len() as u64) << 32;
    let mut lo_hi = [digest, u64::MAX - digest];
    transport.all_reduce_u64(&mut lo_hi[..1], ReduceOp::Min)?;
    transport.all_reduce_u64(&mut lo_hi[1..], ReduceOp::Min)?;
    if lo_hi[0] != u64::MAX - lo_hi[1] {
        return Err(Error::Config("ranks see different dataset files (is the dataset on a shared filesystem?)".into()));
    }
    let (me, world) = (transport.rank().0, transport.size());
    let mine: Result<Vec<WireInfo>> = files
        .iter()
        .enumerate()
        .filter(|(i, _)| i % world == me)
        .map(|(_, (path, format))| dataset::scan_file(path, *format, &options).map(WireInfo::from))
        .collect();
    let mine = agree(transport, mine)?;
    let bytes = serde_json::to_vec(&mine).context(ErrorKind::Internal, "file headers do not serialise")?;
    let gathered = transport.all_gather(&bytes)?;
    let mut per_rank: Vec<std::vec::IntoIter<WireInfo>> = gathered
        .iter()
        .map(|bytes| serde_json::from_slice::<Vec<WireInfo>>(bytes).map(Vec::into_iter))
        .collect::<std::result::Result<_, _>>()
        .context(ErrorKind::Transport, "bad file header exchange")?;
    let infos = (0..files.len())
        .map(|i| {
            per_rank[i % world]
                .next()
                .map(FileInfo::from)
                .ok_or_else(|| Error::Transport("missing file header in exchange".into()))
        })
        .collect::<Result<Vec<_>>>()?;
    agree(transport, Dataset::from_files(infos, options))
}
