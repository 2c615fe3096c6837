//! From a [`Layout`] (mesh, sharding specs, pipeline stages, exchange mode) to the mesh and
//! placement of a world, and the choice between the fused and the two-phase exchange.
//!
//! * **Fused**: every home rank sends each needed slice of a sample straight to every rank
//!   that needs it, in one all-to-all-v.
//! * **Two-phase**: the shuffle delivers whole rows to one *leader* per row block (the
//!   lowest rank that needs them); each leader then scatters every member's slices inside
//!   its row block's sub-communicator.
//!
//! The cost model compares, for one step, the most any rank sends plus receives, and the
//! messages it exchanges: `cost = bytes / BANDWIDTH + messages · LATENCY`.

use crate::config::{ExchangeMode, Layout};
use crate::dataset::{Field, FieldKind};
use crate::error::Result;
use crate::plan::placement::{Receiver, RowBlock};
use crate::plan::{sharding, FieldPart, Mesh, Placement};

/// Bandwidth assumed by the cost model (bytes/s): shared-memory MPI_Alltoallv measured here.
const BANDWIDTH: f64 = 10e9;
/// Per-message latency assumed by the cost model (s).
const LATENCY: f64 = 5e-6;

/// The mesh a layout gives a world of `world` ranks (each driving
/// `layout.devices_per_process` of its devices).
pub fn mesh(layout: &Layout, world: usize) -> Result<Mesh> {
    let mut mesh = match &layout.mesh {
        Some(spec) => Mesh::from_spec(spec),
        None => Mesh::data_parallel(world),
    };
    if !layout.mesh_order.is_empty() {
        mesh = mesh.with_rank_order(&layout.mesh_order)?;
    }
    if let Some(p) = &layout.pipeline_axis {
        mesh = mesh.with_pipeline_axis(p)?;
    }
    mesh.check_world(world, layout.devices_per_process)?;
    Ok(mesh)
}

/// Validates a layout's specs against the mesh, the fields and the batch size.
pub fn sharding(
    layout: &Layout,
    mesh: &Mesh,
    fields: &[Field],
    batch_size: usize,
) -> Result<Vec<sharding::FieldSharding>> {
    sharding::resolve(mesh, fields, batch_size, &layout.shard, &layout.stages)
}

/// The phase-one placement of the two-phase exchange: one leader per row block (its
/// lowest rank that needs anything) receives whole rows of every field the block needs.
pub fn leader_placement(placement: &Placement) -> Result<Placement> {
    let blocks = placement
        .blocks()
        .iter()
        .map(|b| {
            let members: Vec<&Receiver> = b.receivers.iter().filter(|r| !r.parts.is_empty()).collect();
            let mut fields: Vec<usize> = members.iter().flat_map(|r| r.parts.iter().map(|p| p.field)).collect();
            fields.sort_unstable();
            fields.dedup();
            let receivers = members
                .first()
                .map(|leader| Receiver { rank: leader.rank, parts: fields.into_iter().map(FieldPart::whole).collect() })
                .into_iter()
                .collect();
            RowBlock { rows: b.rows.clone(), receivers }
        })
        .collect();
    Placement::from_blocks(placement.batch_size(), placement.world(), blocks)
}

/// Bytes of one value's part `p`: a tensor part's (whole or sliced) size, a
/// variable-length value's size from `sizes` (bytes per whole value, per field; see
/// [`crate::plan::budget::value_sizes`]).
fn part_bytes(fields: &[Field], sizes: &[u64], p: &FieldPart) -> u64 {
    match &fields[p.field].kind {
        FieldKind::Tensor { .. } => p.bytes(&fields[p.field]).unwrap_or(0) as u64,
        FieldKind::Bytes { .. } => sizes[p.field],
    }
}

/// Bytes each rank receives per step under `placement`.
pub fn recv_bytes_per_step(placement: &Placement, fields: &[Field], sizes: &[u64]) -> Vec<u64> {
    let mut out = vec![0u64; placement.world()];
    for b in placement.blocks() {
        for rc in &b.receivers {
            out[rc.rank.0] = b.rows.len() as u64 * rc.parts.iter().map(|p| part_bytes(fields, sizes, p)).sum::<u64>();
        }
    }
    out
}

/// Modelled per-step cost (seconds) of the fused and two-phase exchanges: the busiest
/// rank's bytes over the bandwidth plus its messages times the latency.
pub fn modelled_costs(placement: &Placement, fields: &[Field], sizes: &[u64]) -> Result<(f64, f64)> {
    let p = placement.world() as f64;
    // Fused: home ranks are spread uniformly, so each rank sends total/P and exchanges a
    // message with every rank.
    let recv = recv_bytes_per_step(placement, fields, sizes);
    let total: u64 = recv.iter().sum();
    let fused = recv.iter().map(|&r| (r as f64 + total as f64 / p) / BANDWIDTH + 2.0 * p * LATENCY).fold(0.0, f64::max);
    // Two-phase: phase one to the leaders only, then each leader scatters to its group.
    let leaders = leader_placement(placement)?;
    let recv1 = recv_bytes_per_step(&leaders, fields, sizes);
    let total1: u64 = recv1.iter().sum();
    let n_leaders = leaders.blocks().iter().filter(|b| !b.receivers.is_empty()).count() as f64;
    let mut two = 0.0f64;
    for b in placement.blocks() {
        let members: Vec<&Receiver> = b.receivers.iter().filter(|r| !r.parts.is_empty()).collect();
        let scatter: u64 = members.iter().map(|r| recv[r.rank.0]).sum();
        for (i, m) in members.iter().enumerate() {
            let phase1 = (recv1[m.rank.0] as f64 + total1 as f64 / p) / BANDWIDTH + (p + n_leaders) * LATENCY;
            let phase2 = if i == 0 {
                (scatter as f64) / BANDWIDTH + members.len() as f64 * LATENCY
            } else {
                recv[m.rank.0] as f64 / BANDWIDTH + LATENCY
            };
            two = two.max(phase1 + phase2);
        }
    }
    Ok((fused, two))
}

/// Resolves `Auto` with the cost model; other modes are taken as given.
pub fn choose(mode: ExchangeMode, placement: &Placement, fields: &[Field], sizes: &[u64]) -> Result<ExchangeMode> {
    Ok(match mode {
        ExchangeMode::Auto => {
            let (fused, two) = modelled_costs(placement, fields, sizes)?;
            if two < fused {
                ExchangeMode::TwoPhase
            } else {
                ExchangeMode::Fused
            }
        }
        m => m,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::DType;
    use crate::types::Rank;

    #[test]
    fn leaders_get_whole_rows_of_every_needed_field() {
        let fields = vec![Field::tensor("x", DType::F32, vec![8]), Field::tensor("y", DType::I64, vec![])];
        let layout = Layout {
            mesh: Some("dp=2,tp=2".parse().unwrap()),
            shard: [("x".to_string(), "dp,tp".parse().unwrap())].into(),
            ..Default::default()
        };
        let mesh = mesh(&layout, 4).unwrap();
        let placement = |fields: &[Field]| {
            Placement::from_mesh(8, &mesh, fields, &sharding(&layout, &mesh, fields, 8).unwrap()).unwrap()
        };
        let p = placement(&fields);
        let l = leader_placement(&p).unwrap();
        assert_eq!(l.receiver(Rank(2)).unwrap().1.parts, vec![FieldPart::whole(0), FieldPart::whole(1)]);
        assert!(l.receiver(Rank(1)).is_none() && l.receiver(Rank(3)).is_none());
        let sizes = |f: &[Field]| crate::plan::budget::value_sizes(f, &[]);
        let (fused, two) = modelled_costs(&p, &fields, &sizes(&fields)).unwrap();
        assert!(fused > 0.0 && two > 0.0);
        // With large values the bytes dominate: fused never moves more per rank.
        let big = vec![Field::tensor("x", DType::F32, vec![1 << 20]), Field::tensor("y", DType::I64, vec![])];
        let p = placement(&big);
        assert_eq!(choose(ExchangeMode::Auto, &p, &big, &sizes(&big)).unwrap(), ExchangeMode::Fused);
        assert_eq!(choose(ExchangeMode::TwoPhase, &p, &big, &sizes(&big)).unwrap(), ExchangeMode::TwoPhase);
    }

    #[test]
    fn mesh_world_mismatch() {
        let layout = Layout { mesh: Some("dp=2,tp=2".parse().unwrap()), ..Default::default() };
        assert!(mesh(&layout, 3).unwrap_err().to_string().contains("has 4 devices but the world has 3 ranks"));
        assert_eq!(mesh(&layout, 4).unwrap().devices(), 4);
        assert_eq!(mesh(&Layout::default(), 5).unwrap().to_string(), "dp=5");
    }
}
