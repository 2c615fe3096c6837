//! Files the analysis reads whole — a sweep point's records (`point.json`,
//! `storage.json`, `pytorch.jsonl`) and bench results — read defensively, as
//! `LoaderState::read_file` reads a resume file, telemetry (`rank-<r>.jsonl`, `run.json`)
//! is read and the command line reads a `--config` job file (all with
//! [`meshfeed::config::read_small_file`]): opening never blocks (a FIFO
//! in a file's place would wait for a writer forever),
//! only regular files are read, and a file longer than its kind can be is refused before
//! anything is read, not read whole into memory.

use std::path::Path;

use meshfeed::Result;

/// The most a file of records (a rank's telemetry, bench results, a PyTorch baseline's
/// record) may hold: 1 GiB, far beyond any real run's.
pub const RECORDS_LIMIT: u64 = 1 << 30;

/// The most a small JSON file (`point.json`, `storage.json`) may hold: 1 MiB.
pub const SMALL_LIMIT: u64 = 1 << 20;

/// Reads the text of `path`, at most `limit` bytes ([`meshfeed::config::read_small_file`]):
/// an error naming the file where it is not a regular file (a FIFO, a device, a
/// directory), is longer than `limit`, or is not UTF-8.
pub fn read_small(path: &Path, limit: u64) -> Result<String> {
    meshfeed::config::read_small_file(path, limit)
}

/// [`read_small`] for a file that may be absent: `None` where nothing is at `path` (a
/// dangling link, or anything else there, is read and refused as [`read_small`] says).
pub fn read_if_present(path: &Path, limit: u64) -> Result<Option<String>> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_small(path, limit).map(Some),
    }
}

/// Whether anything is at `path` (a file of any kind, or a link to nothing): what a file
/// is, reading it says.
pub fn present(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_directories_and_long_files_are_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("rank-0.jsonl");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        // No writer: a blocking open would never return.
        let err = read_small(&fifo, SMALL_LIMIT).unwrap_err().to_string();
        assert!(err.contains("rank-0.jsonl: not a regular file (a FIFO)"), "{err}");
        let err = read_small(dir.path(), SMALL_LIMIT).unwrap_err().to_string();
        assert!(err.contains("Is a directory (os error 21)"), "{err}");
        let long = dir.path().join("run.json");
        std::fs::write(&long, "x".repeat(101)).unwrap();
        let err = read_small(&long, 100).unwrap_err().to_string();
        assert!(err.contains("run.json: 101 bytes: a file of this kind is at most 100 bytes"), "{err}");
        assert_eq!(read_small(&long, 101).unwrap().len(), 101);
        assert!(read_if_present(&dir.path().join("none.json"), 100).unwrap().is_none());
        assert!(read_if_present(&fifo, 100).is_err());
        std::fs::write(&long, b"\xff\xfe").unwrap();
        assert!(read_small(&long, 100).unwrap_err().to_string().contains("not UTF-8"));
    }
}
