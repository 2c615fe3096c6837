//! The exchange's byte layout: filling send buffers with values, and assembling received
//! bytes into batches. The exchange itself is the transport's (`engine`, `two_phase`,
//! `broadcast` call it).
//!
//! The wire format needs no per-row headers: sender and receiver walk the same plan in the
//! same order (window row, then the receiver's parts in field order). A tensor part is its
//! bytes (a slice is copied in C order); a variable-length value is an 8-byte
//! little-endian length followed by its bytes.

use std::ops::Range;

use super::batch::{Batch, FieldData};
use crate::dataset::{Field, FieldKind};
use crate::error::{Error, Result};
use crate::plan::FieldPart;
use crate::types::{Epoch, SampleId, Step};

/// Length prefix of a variable-length value in a send buffer.
const LEN_PREFIX: usize = 8;

/// Where filling finds the full value of `field` for window row `row`.
pub(crate) trait ValueSource {
    fn value(&self, row: usize, field: usize) -> &[u8];
}

/// Fills every destination's values into one send buffer. `sends[d]` lists the window rows
/// for destination `d`, `parts[d]` what it receives of each (`None`: nothing). Two passes:
/// exact byte counts first, so that each value is copied once, straight into place.
pub(crate) fn fill(
    sends: &[Vec<usize>],
    parts: &[Option<&[FieldPart]>],
    fields: &[Field],
    source: &impl ValueSource,
) -> (Vec<u8>, Vec<usize>) {
    let part_len = |row: usize, p: &FieldPart| match p.bytes(&fields[p.field]) {
        Some(n) => n,
        None => LEN_PREFIX + source.value(row, p.field).len(),
    };
    let counts: Vec<usize> = sends
        .iter()
        .zip(parts)
        .map(|(rows, parts)| match parts {
            Some(parts) => rows.iter().map(|&i| parts.iter().map(|p| part_len(i, p)).sum::<usize>()).sum(),
            None => 0,
        })
        .collect();
    let mut send = crate::buffers::bytes_with_capacity(counts.iter().sum());
    for (rows, parts) in sends.iter().zip(parts) {
        for &i in rows {
            for p in parts.unwrap_or(&[]) {
                let field = &fields[p.field];
                let v = source.value(i, p.field);
                if matches!(field.kind, FieldKind::Bytes { .. }) {
                    send.extend_from_slice(&(v.len() as u64).to_le_bytes());
                }
                p.copy(field, v, &mut send);
            }
        }
    }
    debug_assert_eq!(send.len(), counts.iter().sum::<usize>());
    (send, counts)
}

/// Takes values off each source's segment of the receive buffer, in plan order.
struct Cursors<'a> {
    recv: &'a [u8],
    at: Vec<usize>,
    end: Vec<usize>,
}

impl<'a> Cursors<'a> {
    fn new(recv: &'a [u8], counts: &[usize]) -> Cursors<'a> {
        let mut at = Vec::with_capacity(counts.len());
        let mut end = Vec::with_capacity(counts.len());
        let mut o = 0;
        for &c in counts {
            at.push(o);
            o += c;
            end.push(o);
        }
        Cursors { recv, at, end }
    }

    fn take(&mut self, src: usize, len: usize) -> Result<&'a [u8]> {
        let (at, end) = (self.at[src], self.end[src]);
        if at + len > end {
            return Err(Error::Transport(format!(
                "received segment from rank {src} is shorter than planned ({} bytes left, {len} needed)",
                end - at
            )));
        }
        self.at[src] += len;
        Ok(&self.recv[at..at + len])
    }

    fn take_var(&mut self, src: usize) -> Result<&'a [u8]> {
        let len = u64::from_le_bytes(self.take(src, LEN_PREFIX)?.try_into().expect("8 bytes"));
        let len =
            usize::try_from(len).map_err(|_| Error::Transport(format!("bad value length {len} from rank {src}")))?;
        self.take(src, len)
    }

    fn check_consumed(&self) -> Result<()> {
        match (0..self.at.len()).find(|&s| self.at[s] != self.end[s]) {
            Some(s) => {
                Err(Error::Transport(format!("rank {s} sent {} bytes more than planned", self.end[s] - self.at[s])))
            }
            None => Ok(()),
        }
    }
}

/// What a rank receives in a window, for [`assemble`].
pub(crate) struct Receipt<'a> {
    pub epoch: Epoch,
    pub steps: Range<u64>,
    pub batch_size: usize,
    /// Sample id of every window row.
    pub ids: &'a [SampleId],
    /// Rows of each global batch this rank receives (empty: nothing).
    pub rows: Range<usize>,
    /// Parts it receives, in field order.
    pub parts: &'a [FieldPart],
    pub coords: &'a [usize],
}

/// Builds the batches of a window from received bytes; `source_of(id)` is the rank (in the
/// exchange's communicator) that sent the sample.
pub(crate) fn assemble(
    r: &Receipt<'_>,
    fields: &[Field],
    recv: &[u8],
    recv_counts: &[usize],
    source_of: impl Fn(SampleId) -> usize,
) -> Result<Vec<Batch>> {
    let (batches, local) = assemble_received(r, fields, recv, recv_counts, |id| Some(source_of(id)))?;
    debug_assert!(local.is_empty());
    Ok(batches)
}

/// A row of a window's batches whose values this rank reads itself: row `row` of
/// `batches[batch]`, sample `id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalRow {
    pub batch: usize,
    pub row: usize,
    pub id: SampleId,
}

/// [`assemble`] where some rows were not sent: `source_of(id)` is `None` for them. Their
/// places in the batches are left for the caller to fill, and listed, in batch and row
/// order. Only tensor parts can be left: a variable-length value's size is known once it
/// is received.
pub(crate) fn assemble_received(
    r: &Receipt<'_>,
    fields: &[Field],
    recv: &[u8],
    recv_counts: &[usize],
    source_of: impl Fn(SampleId) -> Option<usize>,
) -> Result<(Vec<Batch>, Vec<LocalRow>)> {
    let mut local = Vec::new();
    let mut cursors = Cursors::new(recv, recv_counts);
    let nrows = r.rows.len();
    let mut out = Vec::with_capacity((r.steps.end - r.steps.start) as usize);
    for (s, step) in r.steps.clone().enumerate() {
        let rows = if r.parts.is_empty() { 0..0 } else { r.rows.clone() };
        let ids: Vec<SampleId> = rows.clone().map(|row| r.ids[s * r.batch_size + row]).collect();
        let mut tensors: Vec<Option<FieldData>> = r
            .parts
            .iter()
            .map(|p| p.bytes(&fields[p.field]).map(|_| FieldData::tensor(fields[p.field].clone(), p.clone(), nrows)))
            .collect();
        let mut var_values: Vec<Vec<&[u8]>> = vec![Vec::new(); r.parts.len()];
        for (i, &id) in ids.iter().enumerate() {
            let Some(src) = source_of(id) else {
                debug_assert!(tensors.iter().all(Option::is_some), "only tensor parts are read locally");
                local.push(LocalRow { batch: s, row: i, id });
                continue;
            };
            for (k, p) in r.parts.iter().enumerate() {
                match &mut tensors[k] {
                    Some(t) => {
                        let n = p.bytes(&fields[p.field]).expect("tensor");
                        t.bytes_mut()[i * n..(i + 1) * n].copy_from_slice(cursors.take(src, n)?);
                    }
                    None => var_values[k].push(cursors.take_var(src)?),
                }
            }
        }
        let field_data = tensors
            .into_iter()
            .zip(r.parts)
            .zip(var_values)
            .map(|((t, p), vals)| {
                t.unwrap_or_else(|| FieldData::var_len(fields[p.field].clone(), p.clone(), nrows, &vals))
            })
            .collect();
        out.push(Batch { coords: r.coords.to_vec(), epoch: r.epoch, step: Step(step), rows, ids, fields: field_data });
    }
    cursors.check_consumed()?;
    Ok((out, local))
}
