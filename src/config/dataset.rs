//! The options that change how a dataset's files are interpreted: which fields, how
//! nulls are delivered, sequence packing, the most a reader decodes at once.

use std::fmt;
use std::str::FromStr;

use super::defaults::DEFAULT_WINDOW_BYTES;
use super::pack::PackSpec;
use crate::error::{Error, Result};

/// Options that change how files are interpreted.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DatasetOptions {
    /// HDF5 group holding the datasets (default: the file root).
    pub hdf5_group: Option<String>,
    /// The fields delivered, in this order (default: every field of the files, in their
    /// order). Readers of formats that store fields apart read only these.
    #[serde(default)]
    pub fields: Option<Vec<String>>,
    /// Sequence packing of a token field ([`crate::dataset::pack`]): the samples are then the packed ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pack: Option<PackSpec>,
    /// The most bytes a reader decodes at once where it cannot decode less than a whole
    /// unit of the file (a Parquet page): a larger unit is refused, so that memory follows
    /// the window, not the file. A job sets it to its window budget (`--window-bytes`);
    /// `None`: [`DEFAULT_WINDOW_BYTES`]. Never less than
    /// [`MIN_DECODE_LIMIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_limit: Option<u64>,
    /// Per field of an Arrow or Parquet file, what its nulls are delivered as
    /// ([`NullPolicy`]); a delivered field with nulls and no policy is an error.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub nulls: std::collections::BTreeMap<String, NullPolicy>,
}

/// The least [`DatasetOptions::decode_limit`]: 1 MiB, the data page size Parquet writers
/// aim at by default (pyarrow, Spark's parquet-mr, arrow-rs), so that files written with
/// the defaults read at any window budget (a window holds one step at least, whatever its
/// budget, and a small one is exceeded by it anyway).
pub const MIN_DECODE_LIMIT: u64 = 1 << 20;

impl DatasetOptions {
    /// [`DatasetOptions::decode_limit`], or its default; at least [`MIN_DECODE_LIMIT`].
    pub fn decode_limit(&self) -> u64 {
        self.decode_limit.unwrap_or(DEFAULT_WINDOW_BYTES).max(MIN_DECODE_LIMIT)
    }
}

/// What a field's null values are delivered as.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum NullPolicy {
    /// Nulls are delivered as zeros (empty for variable-length values), and the field
    /// `<name>_valid` (`u8`, one per row: 1 present, 0 null) is delivered after the field.
    Mask,
    /// Nulls are delivered as this value (numbers and booleans; written as given).
    Fill(String),
}

impl FromStr for NullPolicy {
    type Err = Error;

    fn from_str(s: &str) -> Result<NullPolicy> {
        match s.trim() {
            "mask" => Ok(NullPolicy::Mask),
            s => match s.strip_prefix("fill:").map(str::trim) {
                Some(v) if !v.is_empty() => Ok(NullPolicy::Fill(v.to_string())),
                _ => Err(Error::Config(format!("nulls '{s}': expected mask or fill:VALUE (e.g. fill:0, fill:nan)"))),
            },
        }
    }
}

impl fmt::Display for NullPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NullPolicy::Mask => f.write_str("mask"),
            NullPolicy::Fill(v) => write!(f, "fill:{v}"),
        }
    }
}
