//! Loader state: where a stream stands, and what defines the stream.
//!
//! The stream is a pure function of (dataset, seed, epoch, batch size, mesh, spec)
//! (docs/design.md, "Determinism and resumption"), and the global batches do not depend
//! on the number of ranks or the mesh ("World-size invariance"). So `(seed, epoch, step)` is all it takes to resume, on any
//! number of ranks and any mesh, provided the dataset, seed and batch size are the same:
//! the [`Fingerprint`] records those, and a mismatch is refused naming what changed.

use crate::dataset::Dataset;
use crate::error::{Error, Result};

/// What defines the global batch stream (not the ranks or the mesh).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint {
    /// Per file: name (not the full path, which may differ between machines), samples,
    /// bytes.
    pub files: Vec<(String, u64, u64)>,
    /// Field names and kinds, as text.
    pub fields: Vec<String>,
    pub samples: u64,
    pub batch_size: usize,
    pub seed: u64,
    pub tail: crate::config::TailPolicy,
}

impl Fingerprint {
    /// The fingerprint of a dataset loaded with `batch_size` and `seed`.
    pub fn of(dataset: &Dataset, batch_size: usize, seed: u64, tail: crate::config::TailPolicy) -> Fingerprint {
        Fingerprint {
            files: dataset
                .files()
                .iter()
                .map(|f| {
                    let name = f
                        .path
                        .file_name()
                        .map_or_else(|| f.path.display().to_string(), |n| n.to_string_lossy().into_owned());
                    (name, f.samples, f.bytes)
                })
                .collect(),
            fields: dataset.fields().iter().map(|f| format!("{}: {}", f.name, f.kind)).collect(),
            samples: dataset.len(),
            batch_size,
            seed,
            tail,
        }
    }

    /// What differs between a saved fingerprint (`self`) and the current one, if anything.
    pub fn differences(&self, now: &Fingerprint) -> Option<String> {
        let mut what = Vec::new();
        if self.seed != now.seed {
            what.push(format!("seed {} → {}", self.seed, now.seed));
        }
        if self.batch_size != now.batch_size {
            what.push(format!("batch size {} → {}", self.batch_size, now.batch_size));
        }
        if self.tail != now.tail {
            what.push(format!("tail policy {:?} → {:?}", self.tail, now.tail).to_lowercase());
        }
        if self.samples != now.samples {
            what.push(format!("dataset samples {} → {}", self.samples, now.samples));
        }
        if self.fields != now.fields {
            what.push(format!("fields [{}] → [{}]", self.fields.join(", "), now.fields.join(", ")));
        }
        if self.files != now.files {
            let first = self.files.iter().zip(&now.files).find(|(a, b)| a != b);
            what.push(match first {
                Some((a, b)) => {
                    format!("file {} ({} samples, {} bytes) → {} ({} samples, {} bytes)", a.0, a.1, a.2, b.0, b.1, b.2)
                }
                None => format!("{} files → {} files", self.files.len(), now.files.len()),
            });
        }
        (!what.is_empty()).then(|| what.join("; "))
    }
}

/// The state to resume a stream from: the next step to deliver.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderState {
    pub seed: u64,
    pub epoch: u64,
    pub step: u64,
    pub fingerprint: Fingerprint,
}

impl LoaderState {
    /// JSON text of the state.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("state serialises")
    }

    /// Parses a state written by [`LoaderState::to_json`].
    pub fn from_json(text: &str) -> Result<LoaderState> {
        serde_json::from_str(text).map_err(|e| Error::Config(format!("invalid loader state: {e}")))
    }

    /// Reads a state file of at most `limit` bytes, defensively: what is not a regular
    /// file (a FIFO would block the reader forever, a device never end) or is longer than
    /// a state can be is refused before anything is read.
    pub fn read_file(path: &std::path::Path, limit: u64) -> Result<LoaderState> {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        // Non-blocking: opening a FIFO for reading waits for a writer otherwise.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(Error::file(path, "not a regular file (a state is a small JSON file)"));
        }
        if meta.len() > limit {
            return Err(Error::file(
                path,
                format!("{} bytes: a state of this job is at most {limit} bytes; not a state file", meta.len()),
            ));
        }
        let mut text = String::new();
        file.take(limit + 1).read_to_string(&mut text).map_err(|e| Error::io(path, e))?;
        LoaderState::from_json(&text).map_err(|e| Error::file(path, e.to_string()))
    }
}
