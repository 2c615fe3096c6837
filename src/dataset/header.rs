//! What the header of one file says ([`FileInfo`]): its format, samples and fields, and
//! the stamp every reader checks the file against.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::schema::Field;
use crate::error::{Error, Result};

/// A file format meshfeed can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Npy,
    Hdf5,
    Arrow,
    Raw,
    /// WebDataset tar shards.
    #[serde(rename = "tar")]
    WebDataset,
    /// Megatron-LM indexed datasets (the `.idx`; the tokens in the `.bin` beside it).
    #[serde(rename = "idx")]
    Megatron,
    Parquet,
}

impl Format {
    /// The format a file name implies, from its extension.
    pub fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "npy" => Some(Format::Npy),
            "h5" | "hdf5" => Some(Format::Hdf5),
            "arrow" | "feather" | "ipc" => Some(Format::Arrow),
            "raw" => Some(Format::Raw),
            "tar" => Some(Format::WebDataset),
            "idx" => Some(Format::Megatron),
            "parquet" | "pq" => Some(Format::Parquet),
            _ => None,
        }
    }

    /// Parses a format name as given to `meshfeed gen --format`.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "npy" => Some(Format::Npy),
            "hdf5" | "h5" => Some(Format::Hdf5),
            "arrow" => Some(Format::Arrow),
            "raw" => Some(Format::Raw),
            _ => None,
        }
    }

    /// File extension used when writing.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Npy => "npy",
            Format::Hdf5 => "h5",
            Format::Arrow => "arrow",
            Format::Raw => "raw",
            Format::WebDataset => "tar",
            Format::Megatron => "idx",
            Format::Parquet => "parquet",
        }
    }
}

/// What the header of one file says.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileInfo {
    pub path: PathBuf,
    pub format: Format,
    pub samples: u64,
    pub fields: Vec<Field>,
    /// Size of the file in bytes.
    pub bytes: u64,
    /// Which file this was when it was scanned, besides its size: readers check the file
    /// against it ([`FileInfo::check_unchanged`]).
    pub stamp: FileStamp,
    /// Per field, the bytes of the file's variable-length values (0 for fixed-size
    /// fields), where the format tells them without reading the data (Arrow: the value
    /// buffers' lengths in its record batch headers); empty where it does not. The window
    /// budget sizes windows by them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub value_bytes: Vec<u64>,
    /// Whether every fixed-size value lies whole, uncompressed and in the host's byte order
    /// at a fixed offset of the file, so that it can be read in place
    /// ([`FileReader::value_range`](super::reader::FileReader::value_range)): `.npy`, raw
    /// records and Arrow IPC always (their readers refuse anything else), HDF5 where every
    /// dataset is contiguous, unfiltered and little-endian.
    #[serde(default)]
    pub in_place: bool,
    /// With sequence packing: the tokens of the file's packed stream (its documents' tokens
    /// and end-of-document tokens), which give its packed sample count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack_tokens: Option<u64>,
}

/// The identity of a file besides its size: its last modification time and inode number.
/// With the size, it tells whether a file was truncated, rewritten or replaced since it
/// was scanned. Neither is part of the stream's fingerprint: a copy of a dataset resumes
/// the same stream.
///
/// The scan of a file happens on one rank and its stamp is checked on others, maybe on
/// other hosts of one shared filesystem. The modification time is the same on every
/// client; the device number is not, and the inode number is on NFS, Lustre and GPFS but
/// not on every filesystem (sshfs numbers inodes per mount): the inode is compared only
/// on the host that scanned the file (`host`, a hash of its name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileStamp {
    /// Last modification time, nanoseconds since the Unix epoch.
    pub modified_ns: i64,
    pub inode: u64,
    /// CRC-32 of the name of the host that took the stamp (0: unknown).
    #[serde(default)]
    pub host: u32,
}

impl FileStamp {
    /// The stamp of a file's metadata, taken on this host.
    pub fn of(meta: &std::fs::Metadata) -> FileStamp {
        let ns = meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec());
        FileStamp { modified_ns: ns, inode: meta.ino(), host: this_host_hash() }
    }
}

/// [`FileStamp::host`] of this process's host.
fn this_host_hash() -> u32 {
    static HASH: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *HASH.get_or_init(|| crc32fast::hash(crate::transport::hosts::this_host().as_bytes()).max(1))
}

/// `secs.nanos` of a time in nanoseconds since the epoch, for messages.
fn show_time(ns: i64) -> String {
    format!("{}.{:09}", ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000))
}

impl FileInfo {
    /// How the file at `meta` differs from this scanned file, if it does: its size, its
    /// modification time or, on the host that scanned it, its inode (the path now names
    /// another file).
    pub fn describe_change(&self, meta: &std::fs::Metadata) -> Option<String> {
        let stamp = FileStamp::of(meta);
        let mut changes = Vec::new();
        if meta.len() != self.bytes {
            changes.push(format!("{} → {} bytes", self.bytes, meta.len()));
        }
        if stamp.inode != self.stamp.inode && stamp.host == self.stamp.host {
            changes.push(format!("replaced by another file (inode {} → {})", self.stamp.inode, stamp.inode));
        }
        if stamp.modified_ns != self.stamp.modified_ns {
            changes.push(format!(
                "modified (mtime {} → {} s since the epoch)",
                show_time(self.stamp.modified_ns),
                show_time(stamp.modified_ns)
            ));
        }
        (!changes.is_empty()).then(|| format!("changed since the dataset was opened: {}", changes.join(", ")))
    }

    /// Checks that the file at this path is still the one that was scanned: same size,
    /// modification time and inode (one `stat`). Readers do this after every read, so
    /// bytes of a file truncated or rewritten under a running job are never delivered —
    /// including where a format library hides short reads (HDF5 fills them with zeros).
    pub fn check_unchanged(&self) -> Result<()> {
        let meta = std::fs::metadata(&self.path).map_err(|e| {
            let reason = format!("changed since the dataset was opened: it can no longer be read ({e})");
            Error::file_caused(&self.path, reason, e)
        })?;
        match self.describe_change(&meta) {
            Some(change) => Err(Error::file(&self.path, change)),
            None => Ok(()),
        }
    }
}

/// Without the `hdf5` feature, an HDF5 file is a clear error naming it.
#[cfg(not(feature = "hdf5"))]
pub(crate) fn hdf5_disabled(path: &Path) -> Error {
    Error::feature_disabled("hdf5", format!("HDF5 file {}", path.display()))
}
