//! From a [`Layout`] (mesh, sharding specs, pipeline stages, exchange mode) to the mesh and
//! placement of a world, and the choice between the fused and the two-phase exchange.
//!
//! * **Fused**: every home rank sends each needed slice of a sample straight to every rank
//!   that needs it, in one all-to-all-v.
//! * **Two-phase**: the shuffle delivers whole rows to one *leader* per row block (the
//!   lowest rank that needs them); each leader then scatters every member's slices inside
//!   its row block's sub-communicator.
//!
//! The cost model compares, for one step, the busiest rank's time in each: its bytes on
//! its host over the on-host bandwidth, its host's bytes to and from other hosts over the
//! host's link, and a latency per peer — [`crate::plan::cost::all_to_all_seconds`], the
//! function `meshfeed report --predict` fits ([`ExchangeCosts`]: measured defaults, or
//! that fit's).

use crate::config::{ExchangeCosts, ExchangeMode, Layout};
use crate::dataset::{Field, FieldKind};
use crate::error::Result;
use crate::plan::cost::all_to_all_seconds;
use crate::plan::placement::{Receiver, RowBlock};
use crate::plan::{sharding, FieldPart, Mesh, Placement};

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

/// Per-rank time (seconds) of an all-to-all in which rank `r` receives `recv[r]` bytes
/// from home ranks spread uniformly over the world (each rank sends `total / P`, split in
/// proportion to what each receiver gets). A rank's on-host bytes (in and out) go at
/// `intra`; a host's off-host bytes (the larger of in and out, its ranks together) at
/// `inter`; and it exchanges a message with every rank.
fn all_to_all_times(recv: &[u64], hosts: &[usize], costs: &ExchangeCosts) -> Vec<f64> {
    let p = recv.len() as f64;
    let total: f64 = recv.iter().map(|&r| r as f64).sum();
    let hosts_n = hosts.iter().copied().max().map_or(0, |h| h + 1);
    let mut on_host = vec![0usize; hosts_n];
    let mut host_recv = vec![0f64; hosts_n];
    for (r, &h) in hosts.iter().enumerate() {
        on_host[h] += 1;
        host_recv[h] += recv[r] as f64;
    }
    recv.iter()
        .zip(hosts)
        .map(|(&r, &h)| {
            let n = on_host[h] as f64;
            let on = r as f64 * n / p + host_recv[h] / p;
            let link_in = host_recv[h] * (p - n) / p;
            let link_out = n * (total - host_recv[h]) / p;
            all_to_all_seconds(costs, recv.len() - 1, on, link_in.max(link_out))
        })
        .collect()
}

/// Modelled per-step cost (seconds) of the fused and two-phase exchanges: the busiest
/// rank's time, with the ranks on hosts `hosts` (`hosts[r]`: rank `r`'s host index) and
/// the all-to-all costing `costs`.
pub fn modelled_costs(
    placement: &Placement,
    fields: &[Field],
    sizes: &[u64],
    hosts: &[usize],
    costs: &ExchangeCosts,
) -> Result<(f64, f64)> {
    // Fused: one all-to-all straight to every receiver.
    let recv = recv_bytes_per_step(placement, fields, sizes);
    let fused = all_to_all_times(&recv, hosts, costs).into_iter().fold(0.0, f64::max);
    // Two-phase: whole rows to the leaders only, then each leader scatters to its group.
    let leaders = leader_placement(placement)?;
    let phase1 = all_to_all_times(&recv_bytes_per_step(&leaders, fields, sizes), hosts, costs);
    let mut two = 0.0f64;
    for b in placement.blocks() {
        let members: Vec<&Receiver> = b.receivers.iter().filter(|r| !r.parts.is_empty()).collect();
        let Some(leader) = members.first().map(|m| m.rank.0) else { continue };
        // Phase 2 is an exchange too: the leader sends each member its part (bytes on the
        // leader's host or over the link), a member receives one message.
        let split = |m: usize| if hosts[m] == hosts[leader] { (recv[m] as f64, 0.0) } else { (0.0, recv[m] as f64) };
        let (on, link) = members.iter().map(|m| split(m.rank.0)).fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        for (i, m) in members.iter().enumerate() {
            let phase2 = if i == 0 {
                all_to_all_seconds(costs, members.len(), on, link)
            } else {
                let (on, link) = split(m.rank.0);
                all_to_all_seconds(costs, 1, on, link)
            };
            two = two.max(phase1[m.rank.0] + phase2);
        }
    }
    Ok((fused, two))
}

/// Resolves `Auto` with the cost model (`costs`, ranks on `hosts`); other modes are taken
/// as given.
pub fn choose(
    mode: ExchangeMode,
    placement: &Placement,
    fields: &[Field],
    sizes: &[u64],
    hosts: &[usize],
    costs: &ExchangeCosts,
) -> Result<ExchangeMode> {
    Ok(match mode {
        ExchangeMode::Auto => {
            let (fused, two) = modelled_costs(placement, fields, sizes, hosts, costs)?;
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
        let (one_host, costs) = (vec![0; 4], ExchangeCosts::default());
        let (fused, two) = modelled_costs(&p, &fields, &sizes(&fields), &one_host, &costs).unwrap();
        assert!(fused > 0.0 && two > 0.0);
        // With large values the bytes dominate: on one host, fused never moves more per rank.
        let big = vec![Field::tensor("x", DType::F32, vec![1 << 20]), Field::tensor("y", DType::I64, vec![])];
        let p = placement(&big);
        let auto = |hosts: &[usize], costs: &ExchangeCosts| {
            choose(ExchangeMode::Auto, &p, &big, &sizes(&big), hosts, costs).unwrap()
        };
        assert_eq!(auto(&one_host, &costs), ExchangeMode::Fused);
        assert_eq!(
            choose(ExchangeMode::TwoPhase, &p, &big, &sizes(&big), &one_host, &costs).unwrap(),
            ExchangeMode::TwoPhase
        );
    }

    #[test]
    fn a_slow_link_between_hosts_favours_two_phase_for_replicated_rows() {
        // dp=2,tp=2 with x split over dp only: each row goes to both ranks of a tp pair.
        let fields = vec![Field::tensor("x", DType::F32, vec![1 << 16])];
        let layout = Layout {
            mesh: Some("dp=2,tp=2".parse().unwrap()),
            shard: [("x".to_string(), "dp,-".parse().unwrap())].into(),
            ..Default::default()
        };
        let mesh = mesh(&layout, 4).unwrap();
        let p = Placement::from_mesh(8, &mesh, &fields, &sharding(&layout, &mesh, &fields, 8).unwrap()).unwrap();
        let sizes = crate::plan::budget::value_sizes(&fields, &[]);
        // Each tp pair on its own host: fused sends every row across the link twice (once
        // per pair member), two-phase once (to the leader), then copies it on the host.
        let hosts = [0, 0, 1, 1];
        let slow = ExchangeCosts { inter_bytes_per_s: 100_000_000, ..ExchangeCosts::default() };
        let (fused, two) = modelled_costs(&p, &fields, &sizes, &hosts, &slow).unwrap();
        assert!(two < fused, "two-phase {two} vs fused {fused}");
        let auto = |hosts: &[usize], costs: &ExchangeCosts| {
            choose(ExchangeMode::Auto, &p, &fields, &sizes, hosts, costs).unwrap()
        };
        assert_eq!(auto(&hosts, &slow), ExchangeMode::TwoPhase);
        // A link as fast as shared memory: the extra phase does not pay.
        let fast = ExchangeCosts { inter_bytes_per_s: slow.intra_bytes_per_s, ..slow };
        assert_eq!(auto(&hosts, &fast), ExchangeMode::Fused);
        // All on one host: fused.
        assert_eq!(auto(&[0; 4], &slow), ExchangeMode::Fused);
    }

    #[test]
    fn mesh_world_mismatch() {
        let layout = Layout { mesh: Some("dp=2,tp=2".parse().unwrap()), ..Default::default() };
        assert!(mesh(&layout, 3).unwrap_err().to_string().contains("has 4 devices but the world has 3 ranks"));
        assert_eq!(mesh(&layout, 4).unwrap().devices(), 4);
        assert_eq!(mesh(&Layout::default(), 5).unwrap().to_string(), "dp=5");
    }
}
