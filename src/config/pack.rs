//! The `--pack` option: sequence packing of a token field ([`crate::dataset::pack`]).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The optional field holding each input's position: in its run of a document inside the
/// sample ([`PositionIds::Sample`]) or in its whole document ([`PositionIds::Document`]).
pub const POSITION_IDS: &str = "position_ids";
/// The value of `position_ids=` asking for positions in the whole document.
const DOCUMENT: &str = "document";
/// The optional field holding the document boundaries of a sample's inputs.
pub const CU_SEQLENS: &str = "cu_seqlens";

/// What the `position_ids` field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionIds {
    /// `position_ids`: 0 at the sample's first input and at the first input of every
    /// document starting inside the sample, counting up from there, so every value is
    /// below `S` (Megatron-LM's `reset_position_ids`, where no document holds the
    /// end-of-document token inside it).
    Sample,
    /// `position_ids=document`: the input's position in its whole document, from the
    /// document's first token (values reach the document's length, past `S` in a long one).
    Document,
}

/// What `--pack` asks for: `FIELD:SEQ_LEN[,eos=ID][,position_ids[=document]][,cu_seqlens]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PackSpec {
    /// The token field (a variable-length list of integers).
    pub field: String,
    /// Inputs per sample `S` (each sample holds `S + 1` tokens of the stream).
    pub seq_len: u64,
    /// A token put after every document; none where documents end with one already (as
    /// Megatron's preprocessing with `--append-eod` writes them).
    pub eos: Option<i64>,
    /// Whether samples carry a `position_ids` field, and what it holds.
    pub position_ids: Option<PositionIds>,
    /// Whether samples carry a `cu_seqlens` field (where each document's run of inputs starts).
    pub cu_seqlens: bool,
}

impl FromStr for PackSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<PackSpec> {
        let bad = |why: &str| {
            Error::Config(format!(
                "--pack '{spec}': {why} (expected FIELD:SEQ_LEN[,eos=ID][,position_ids[=document]][,cu_seqlens], e.g. tokens:2048,eos=0)"
            ))
        };
        let mut parts = spec.split(',').map(str::trim);
        let head = parts.next().unwrap_or_default();
        let (field, len) = head.split_once(':').ok_or_else(|| bad("no sequence length"))?;
        if field.is_empty() {
            return Err(bad("no field name"));
        }
        let seq_len = len.trim().parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| bad("bad sequence length"))?;
        if seq_len > i32::MAX as u64 {
            return Err(bad("sequence length over 2^31"));
        }
        let mut out =
            PackSpec { field: field.trim().into(), seq_len, eos: None, position_ids: None, cu_seqlens: false };
        for p in parts {
            match p.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                Some(("eos", id)) => out.eos = Some(id.trim().parse().map_err(|_| bad("bad eos token id"))?),
                Some((POSITION_IDS, DOCUMENT)) => out.position_ids = Some(PositionIds::Document),
                Some((POSITION_IDS, other)) => {
                    return Err(bad(&format!("unknown position_ids '{other}' (position_ids or position_ids=document)")))
                }
                None if p == POSITION_IDS => out.position_ids = Some(PositionIds::Sample),
                None if p == CU_SEQLENS => out.cu_seqlens = true,
                _ => return Err(bad(&format!("unknown option '{p}'"))),
            }
        }
        Ok(out)
    }
}

impl fmt::Display for PackSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.field, self.seq_len)?;
        if let Some(eos) = self.eos {
            write!(f, ",eos={eos}")?;
        }
        match self.position_ids {
            Some(PositionIds::Sample) => write!(f, ",{POSITION_IDS}")?,
            Some(PositionIds::Document) => write!(f, ",{POSITION_IDS}={DOCUMENT}")?,
            None => {}
        }
        if self.cu_seqlens {
            write!(f, ",{CU_SEQLENS}")?;
        }
        Ok(())
    }
}

string_conversions!(PackSpec);
