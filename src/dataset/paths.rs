//! The files of a dataset path: a file, or a directory walked for files of known formats.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::header::Format;
use crate::error::{Error, Result};

/// Expands `--data` arguments into the ordered list of files.
///
/// A directory contributes every file with a supported extension in it and in its
/// subdirectories, in lexicographic order of their paths below it (each directory's entries
/// in name order, a subdirectory's files where its name comes); hidden subdirectories (a
/// name starting with `.`) are not walked. A file is taken as given. Entries of other
/// extensions are ignored. A missing path, a directory tree without dataset files, a file
/// of unknown format, a directory reached twice (a symbolic link back into the tree: its
/// files would be read twice), and anything that is not a regular file (a dangling or
/// looping symbolic link, a directory named `x.npy`, a FIFO, a socket or a device — given
/// directly or found in a directory) is an error naming the path: a listed file the job
/// cannot use must not silently shrink the dataset, and a FIFO would block every rank that
/// opens it.
pub fn resolve_paths(paths: &[PathBuf]) -> Result<Vec<(PathBuf, Format)>> {
    if paths.is_empty() {
        return Err(Error::Config("no dataset given (--data PATH...)".into()));
    }
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| unusable(path, e))?;
        if meta.is_dir() {
            let mut found: Vec<(PathBuf, Format)> = Vec::new();
            walk(path, &mut Vec::new(), &mut found)?;
            if found.is_empty() {
                return Err(Error::file(
                    path,
                    "directory holds no .npy, .h5, .arrow, .parquet, .raw, .tar or .idx files (nor do its subdirectories)",
                ));
            }
            files.extend(found);
        } else {
            regular_file(path, &meta)?;
            let format = Format::from_path(path).ok_or_else(|| {
                Error::file(
                    path,
                    "unknown format (expected .npy, .h5/.hdf5, .arrow/.feather/.ipc, .parquet, .raw, .tar or .idx)",
                )
            })?;
            files.push((path.clone(), format));
        }
    }
    Ok(files)
}

/// Appends the dataset files under directory `dir` to `found`, in the order
/// [`resolve_paths`] gives. `seen` holds the directories walked (device, inode).
fn walk(dir: &Path, seen: &mut Vec<(u64, u64)>, found: &mut Vec<(PathBuf, Format)>) -> Result<()> {
    let meta = std::fs::metadata(dir).map_err(|e| unusable(dir, e))?;
    if seen.contains(&(meta.dev(), meta.ino())) {
        return Err(Error::file(
            dir,
            "directory reached twice (a symbolic link back into the dataset): its files would be read twice",
        ));
    }
    seen.push((meta.dev(), meta.ino()));
    let mut entries = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<PathBuf>>>()
        .map_err(|e| Error::io(dir, e))?;
    entries.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    for p in entries {
        if let Some(format) = Format::from_path(&p) {
            let meta = std::fs::metadata(&p).map_err(|e| unusable(&p, e))?;
            regular_file(&p, &meta)?;
            found.push((p, format));
        } else if p.file_name().is_some_and(|n| !n.as_encoded_bytes().starts_with(b".")) && p.is_dir() {
            walk(&p, seen, found)?;
        }
    }
    Ok(())
}

/// Why `path` cannot be used, from the error of `stat` (which follows symbolic links): the
/// OS's error, kept as the cause and in the text, after what it means for a link.
pub(crate) fn unusable(path: &Path, e: std::io::Error) -> Error {
    let is_link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    let link = match e.kind() {
        std::io::ErrorKind::NotFound if is_link => "dangling symbolic link (its target does not exist)",
        _ if e.raw_os_error() == Some(libc::ELOOP) => "symbolic link loop",
        _ => return Error::io(path, e),
    };
    Error::file_caused(path, format!("{link}: {e}"), e)
}

/// Refuses anything but a regular file (after following symbolic links), naming what it is.
pub(crate) fn regular_file(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let t = meta.file_type();
    let what = if t.is_file() {
        return Ok(());
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "not a regular file"
    };
    Err(Error::file(path, format!("is {what}, not a regular file: only regular files can be dataset files")))
}
