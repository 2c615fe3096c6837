//! Opening a dataset collectively: every rank lists the files, each file's header is read
//! by one rank (file `i` by rank `i mod P`), and the headers are shared. Failures on any
//! rank are agreed, so every rank returns the same error.

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use crate::dataset::{self, Dataset, DatasetOptions, FileInfo};
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::feed::welcome::WireInfo;
use crate::transport::{agree, ReduceOp, Transport};

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
            .and_then(|(d, owners, manifest)| {
                if owners.len() != d.files().len() {
                    return Err(Error::Internal(format!("{}: an address for each file", source.url())));
                }
                Ok(d.served_by(std::sync::Arc::new(client::Feed::new(source, owners, manifest))))
            });
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
