//! The `--shared-order` option: an order that jobs sharing a feeder opt into
//! ([`crate::plan::permutation`]).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The order jobs sharing a feeder may opt into: the permutation of `seed`, each job
/// reordering it within blocks of `block` positions by its own seed ([`crate::plan::permutation`]).
/// Written `SEED` or `SEED,block=N` (default block: [`SharedOrder::DEFAULT_BLOCK`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "SharedOrderValue", into = "String")]
pub struct SharedOrder {
    /// The seed every job of the sweep gives.
    pub seed: u64,
    /// Positions a job reorders among themselves by its own seed.
    pub block: u64,
}

impl SharedOrder {
    /// Positions reordered by a job's own seed, by default: small enough that jobs a few
    /// batches apart ask for the same rows, large enough that their batches differ.
    pub const DEFAULT_BLOCK: u64 = 1024;
}

impl FromStr for SharedOrder {
    type Err = Error;

    fn from_str(spec: &str) -> Result<SharedOrder> {
        let bad = |why: &str| Error::Config(format!("shared order {spec:?}: {why} (expected SEED or SEED,block=N)"));
        let mut parts = spec.split(',');
        let seed = parts.next().unwrap_or("").trim().parse().map_err(|_| bad("the seed is not an integer"))?;
        let mut block = None;
        for part in parts {
            let value = part.trim().strip_prefix("block=").ok_or_else(|| bad(&format!("unknown part {part:?}")))?;
            if block.replace(value.parse().map_err(|_| bad("the block is not an integer"))?).is_some() {
                return Err(bad("the block is given twice"));
            }
        }
        let block = block.unwrap_or(SharedOrder::DEFAULT_BLOCK);
        if block == 0 {
            return Err(bad("the block must be at least 1"));
        }
        Ok(SharedOrder { seed, block })
    }
}

impl fmt::Display for SharedOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},block={}", self.seed, self.block)
    }
}

/// A shared order as a job file or Python gives it: its seed alone (`7`), or its text
/// (`"7,block=64"`).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum SharedOrderValue {
    Seed(u64),
    Text(String),
}

impl TryFrom<SharedOrderValue> for SharedOrder {
    type Error = Error;
    fn try_from(value: SharedOrderValue) -> Result<SharedOrder> {
        match value {
            SharedOrderValue::Seed(seed) => Ok(SharedOrder { seed, block: SharedOrder::DEFAULT_BLOCK }),
            SharedOrderValue::Text(text) => text.parse(),
        }
    }
}

impl From<SharedOrder> for String {
    fn from(s: SharedOrder) -> String {
        s.to_string()
    }
}
