//! Loader state: where a stream stands, and what defines the stream.
//!
//! The stream is a pure function of (dataset, seed, epoch, batch size, mesh, spec)
//! (docs/design.md, "Determinism and resumption"), and the global batches do not depend
//! on the number of ranks or the mesh ("World-size invariance"). So `(seed, epoch, step)` is all it takes to resume, on any
//! number of ranks and any mesh, provided the dataset, seed and batch size are the same:
//! the [`Fingerprint`] records those, and a mismatch is refused naming what changed.

use crate::config::LoaderOptions;
use crate::dataset::Dataset;
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::plan::SharedOrder;

/// The largest epoch a loader can stand at. A position is a JSON number in a state file,
/// exact in every JSON reader up to 2^53 (JavaScript's and Python's `float` included), and
/// no job runs that many epochs: a larger one is a mistake or a wrapped value, refused
/// wherever an epoch enters (`set_epoch`, a state, `--resume-from`, `--epochs`) rather
/// than silently wrapped.
pub const MAX_EPOCH: u64 = (1 << 53) - 1;

/// The error for an epoch beyond [`MAX_EPOCH`] (or not a number of 64 bits at all: `shown`
/// is the value as it was given), the same wherever it enters.
pub fn epoch_out_of_range(shown: &dyn std::fmt::Display) -> Error {
    Error::Config(format!("epoch {shown} is out of range: epochs run from 0 to {MAX_EPOCH} (2^53 - 1)"))
}

/// Refuses an epoch beyond [`MAX_EPOCH`].
pub fn check_epoch(epoch: u64) -> Result<()> {
    if epoch > MAX_EPOCH {
        return Err(epoch_out_of_range(&epoch));
    }
    Ok(())
}

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
    /// The sweep's shared order the job's order is derived from, if any (`--shared-order`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_order: Option<SharedOrder>,
    pub tail: crate::config::TailPolicy,
    /// The sequence packing the samples were made by, if any (`--pack`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<String>,
}

impl Fingerprint {
    /// The fingerprint of a dataset loaded with `options` (those the order depends on).
    pub fn of(dataset: &Dataset, options: &LoaderOptions) -> Fingerprint {
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
            batch_size: options.batch_size,
            seed: options.seed,
            shared_order: options.shared_order,
            tail: options.tail,
            pack: dataset.options().pack.as_ref().map(ToString::to_string),
        }
    }

    /// What differs between a saved fingerprint (`self`) and the current one, if anything.
    pub fn differences(&self, now: &Fingerprint) -> Option<String> {
        let mut what = Vec::new();
        if self.seed != now.seed {
            what.push(format!("seed {} → {}", self.seed, now.seed));
        }
        if self.shared_order != now.shared_order {
            let show = |o: &Option<SharedOrder>| o.map_or_else(|| "none".into(), |o| o.to_string());
            what.push(format!("shared order {} → {}", show(&self.shared_order), show(&now.shared_order)));
        }
        if self.batch_size != now.batch_size {
            what.push(format!("batch size {} → {}", self.batch_size, now.batch_size));
        }
        if self.tail != now.tail {
            what.push(format!("tail policy {:?} → {:?}", self.tail, now.tail).to_lowercase());
        }
        if self.pack != now.pack {
            let show = |p: &Option<String>| p.clone().unwrap_or_else(|| "none".into());
            what.push(format!("packing {} → {}", show(&self.pack), show(&now.pack)));
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
        serde_json::from_str(text).context(ErrorKind::Config, "invalid loader state")
    }

    /// Reads a state file of at most `limit` bytes, defensively
    /// ([`crate::config::read_small_file`]: no FIFO, no device, nothing longer than a
    /// state can be).
    pub fn read_file(path: &std::path::Path, limit: u64) -> Result<LoaderState> {
        let text = crate::config::read_small_file(path, limit)?;
        LoaderState::from_json(&text).in_file(path)
    }
}
