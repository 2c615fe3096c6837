//! The two-phase exchange: the shuffle delivers whole rows to one *leader* per row block
//! (the lowest rank that needs them; [`super::layout::leader_placement`]); each leader
//! then scatters every member's slices inside its row block's sub-communicator.

use super::batch::Batch;
use super::marshal::{assemble, fill, ValueSource};
use super::metrics::{Metrics, Phase};
use super::stream::{Stream, WindowSpec};
use super::window::receipt;
use crate::error::Result;
use crate::plan::FieldPart;
use crate::transport::{agree, Transport};
use crate::types::SampleId;

/// Phase one's assembly at the leaders, then phase two inside the row block's group
/// (created at the first window: a collective over the loader's communicator).
pub(crate) fn complete(
    stream: &Stream,
    transport: &dyn Transport,
    group: &mut Option<Box<dyn Transport>>,
    spec: &WindowSpec,
    ids: &[SampleId],
    (recv, recv_counts): (&[u8], &[usize]),
    metrics: &mut Metrics,
) -> Result<Vec<Batch>> {
    let shape = stream.two_phase.as_ref().expect("a two-phase stream has its shape");
    let fields = stream.dataset.fields();
    // Phase one: the leader assembles whole rows.
    let leader = receipt(stream, &shape.leaders, spec, ids);
    metrics.bytes_copied += recv.len() as u64;
    let full =
        metrics.timed(Phase::Assemble, |_| assemble(&leader, fields, recv, recv_counts, |id| stream.home.owner(id).0));
    let full = metrics.agreed(|| agree(transport, full))?;

    // Phase two, inside the row block's group; the leader is the group's first member.
    if group.is_none() {
        *group = Some(transport.split(shape.color)?);
    }
    let group = group.as_deref().expect("group made above");
    let own = receipt(stream, &stream.placement, spec, ids);
    let b = stream.options.batch_size;
    let steps = (spec.steps.end - spec.steps.start) as usize;
    let window_rows: Vec<usize> = (0..steps).flat_map(|s| own.rows.clone().map(move |r| s * b + r)).collect();
    let mut sends = vec![Vec::new(); group.size()];
    let mut member_parts: Vec<Option<&[FieldPart]>> = vec![None; group.size()];
    if !leader.parts.is_empty() {
        for (g, m) in shape.members.iter().enumerate() {
            sends[g] = window_rows.clone();
            member_parts[g] = stream.placement.receiver(*m).map(|(_, rc)| &rc.parts[..]);
        }
    }
    let source = FromLeader { batches: &full, batch_size: b, first_row: leader.rows.start, fields: leader.parts };
    let (send, counts) = metrics.timed(Phase::Fill, |_| fill(&sends, &member_parts, fields, &source));
    metrics.bytes_sent += send.len() as u64;
    metrics.bytes_copied += send.len() as u64;
    let (recv, recv_counts) = metrics.timed(Phase::Exchange, |_| group.all_to_all_v(send, &counts))?;
    metrics.bytes_received += recv.len() as u64;
    metrics.bytes_copied += recv.len() as u64;
    metrics.timed(Phase::Assemble, |_| assemble(&own, fields, &recv, &recv_counts, |_| 0))
}

/// Values for the scatter: the leader's whole-row batches of the window.
struct FromLeader<'a> {
    batches: &'a [Batch],
    batch_size: usize,
    first_row: usize,
    /// The fields the leader holds, in its batches' field order.
    fields: &'a [FieldPart],
}

impl ValueSource for FromLeader<'_> {
    fn value(&self, row: usize, field: usize) -> &[u8] {
        let batch = &self.batches[row / self.batch_size];
        let k = self.fields.iter().position(|p| p.field == field).expect("leader holds every field its group needs");
        batch.fields[k].row(row % self.batch_size - self.first_row)
    }
}
