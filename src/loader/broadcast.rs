//! The single-loader baseline, the common design meshfeed is measured against: rank 0
//! reads every row of each window and broadcasts whole batches to every rank (an
//! all-gather to which only rank 0 contributes); each rank then copies out its own rows
//! and slices. It delivers the same batches as the fused exchange, at `P`× the traffic.
//! Selected with the exchange mode `broadcast`, for benchmarks.

use super::batch::{Batch, FieldData};
use super::marshal::{assemble, fill, Receipt};
use super::metrics::{Metrics, Phase};
use super::read::{FromReads, Reads};
use super::stream::{Stream, WindowSpec};
use super::window::{Filled, Route};
use crate::dataset::Field;
use crate::error::Result;
use crate::plan::{FieldPart, Permutation, Placement};
use crate::transport::{agree, Transport};
use crate::types::{Rank, SampleId};

/// Plans the window on every rank; rank 0 reads and fills every row whole.
pub(crate) fn prepare(
    stream: &Stream,
    transport: &dyn Transport,
    reads: &mut Reads,
    spec: WindowSpec,
) -> Result<Filled> {
    let mut metrics = Metrics::default();
    let n = stream.dataset.len();
    let b = stream.options.batch_size as u64;
    let perm = Permutation::of(n, stream.options.seed, stream.options.shared_order, spec.epoch.0);
    let ids: Vec<SampleId> = metrics.timed(Phase::Plan, |_| {
        (spec.steps.start * b..spec.steps.end * b).map(|p| SampleId(perm.apply(p % n))).collect()
    });
    let mut send = Vec::new();
    if stream.rank.0 == 0 {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup(); // a padded last batch repeats the epoch's first samples
        let read = metrics.timed(Phase::Read, |m| reads.read(stream, &sorted, m));
        let read = metrics.agreed(|| agree(transport, read))?;
        let fields = stream.dataset.fields();
        let whole = whole_parts(fields);
        let rows: Vec<usize> = (0..ids.len()).collect();
        let source = FromReads { ids: &ids, read: &read };
        send = metrics.timed(Phase::Fill, |_| fill(&[rows], &[Some(&whole[..])], fields, &source)).0;
        metrics.bytes_sent += (send.len() * (stream.world - 1)) as u64;
        metrics.bytes_copied += send.len() as u64;
    } else {
        metrics.agreed(|| agree(transport, Ok(())))?;
    }
    let home = std::sync::Arc::new(stream.home.clone());
    Ok(Filled { spec, route: Route::Broadcast, home, ids, send, counts: vec![], metrics, deferred: None })
}

/// Broadcasts rank 0's buffer (an all-gather to which only rank 0 contributes).
pub(crate) fn exchange(transport: &dyn Transport, send: Vec<u8>) -> Result<(Vec<u8>, Vec<usize>)> {
    let mut all = transport.all_gather(&send)?;
    let data = std::mem::take(&mut all[0]);
    let len = data.len();
    Ok((data, vec![len]))
}

/// Assembles whole batches, then cuts out this rank's rows and slices.
pub(crate) fn complete(
    stream: &Stream,
    spec: &WindowSpec,
    ids: &[SampleId],
    data: &[u8],
    metrics: &mut Metrics,
) -> Result<Vec<Batch>> {
    let fields = stream.dataset.fields();
    let whole = whole_parts(fields);
    let b = stream.options.batch_size;
    let receipt = Receipt {
        epoch: spec.epoch,
        steps: spec.steps.clone(),
        batch_size: b,
        ids,
        rows: 0..b,
        parts: &whole,
        coords: &stream.coords,
    };
    // Whole batches from the received bytes, then this rank's rows of them.
    metrics.bytes_copied += 2 * data.len() as u64;
    metrics.timed(Phase::Assemble, |_| {
        let full = assemble(&receipt, fields, data, &[data.len()], |_| 0)?;
        Ok(full.iter().map(|f| cut(f, &stream.placement, stream.rank, fields, &stream.coords)).collect())
    })
}

fn whole_parts(fields: &[Field]) -> Vec<FieldPart> {
    (0..fields.len()).map(FieldPart::whole).collect()
}

/// This rank's rows and slices of a whole batch.
fn cut(full: &Batch, placement: &Placement, me: Rank, fields: &[Field], coords: &[usize]) -> Batch {
    let Some((block, rc)) = placement.receiver(me) else {
        return Batch {
            coords: coords.to_vec(),
            epoch: full.epoch,
            step: full.step,
            rows: 0..0,
            ids: vec![],
            fields: vec![],
        };
    };
    let n = block.rows.len();
    let field_data = rc
        .parts
        .iter()
        .map(|p| {
            let f = &fields[p.field];
            let whole = &full.fields[p.field];
            match p.bytes(f) {
                Some(len) => {
                    let mut out = FieldData::tensor(f.clone(), p.clone(), n);
                    let mut tmp = Vec::with_capacity(len);
                    for (i, row) in block.rows.clone().enumerate() {
                        tmp.clear();
                        p.copy(f, whole.row(row), &mut tmp);
                        out.bytes_mut()[i * len..(i + 1) * len].copy_from_slice(&tmp);
                    }
                    out
                }
                None => {
                    let values: Vec<&[u8]> = block.rows.clone().map(|r| whole.row(r)).collect();
                    FieldData::var_len(f.clone(), p.clone(), n, &values)
                }
            }
        })
        .collect();
    Batch {
        coords: coords.to_vec(),
        epoch: full.epoch,
        step: full.step,
        rows: block.rows.clone(),
        ids: full.ids[block.rows.clone()].to_vec(),
        fields: field_data,
    }
}
