//! How the loader will read, decided collectively when it is built: each host's memory
//! budget (from its cgroup limit or available memory, or `--memory-budget`), the storage
//! probe where the choice depends on it, the read plan ([`crate::plan::io::choose`]), and
//! the home stores — started on every rank that keeps or spills rows, and mapped by the
//! ranks of its host.

use std::ops::Range;

use super::probe::{probe, Probe};
use super::sends::Reads;
use super::store::{HomeStore, StoreHandle, StoreView};
use crate::config::{ExchangeMode, LoaderOptions};
use crate::dataset::Dataset;
use crate::error::Result;
use crate::loader::stream::Stream;
use crate::plan::io::{choose, show_bytes, HostShare, IoInputs, StorageRates, STREAM_READ_BYTES};
use crate::plan::{budget, HomeRanges, IoPlan};
use crate::runtime::memory::{all_headrooms, auto_budget, MemoryLimits};
use crate::transport::{agree, ReduceOp, Transport};
use crate::types::Rank;

/// Decides the read plan. Collective over `comm`; `hosts[r]` is rank `r`'s host.
pub(crate) fn plan(
    comm: &dyn Transport,
    dataset: &Dataset,
    options: &LoaderOptions,
    hosts: &[usize],
) -> Result<IoPlan> {
    let world = comm.size();
    let n = dataset.len();
    // The broadcast baseline reads every batch on rank 0, from the files; streams the
    // stream's own validation refuses get no store either.
    if options.layout.exchange == ExchangeMode::Broadcast || n < world as u64 || options.batch_size == 0 {
        return Ok(IoPlan::direct(world));
    }
    let read = &options.read;
    // A feeder holds the rows: each window asks it for the rows it needs, and nothing is
    // kept here (a copy per job is what the feeder saves), unless the job asks otherwise.
    if let (Some(rows), crate::config::ReadStrategy::Auto) = (dataset.row_source(), read.strategy) {
        let reason = format!("the rows come from {}, which holds them: nothing kept here", rows.describe());
        return Ok(IoPlan { reason, ..IoPlan::direct(world) });
    }
    let limits = MemoryLimits::of_this_process();
    let all = all_headrooms(comm, &limits)?;
    // What each rank holds besides its data: its pipeline's bound and one streaming read.
    let pipeline = budget::pipeline_bound(options).saturating_add(STREAM_READ_BYTES);
    let home = HomeRanges::new(n, world);
    let groups = host_members(hosts);
    let mut shares = Vec::with_capacity(groups.len());
    for members in &groups {
        let room = members.iter().map(|&r| all[r]).min().unwrap_or(0);
        let auto = auto_budget(room, members.len(), pipeline);
        // An explicit budget is never allowed past what the cgroup or host has room for.
        let budget = match read.memory_budget {
            Some(b) => b.min(room.saturating_sub(pipeline.saturating_mul(members.len() as u64))),
            None => auto,
        };
        let ranks = members.iter().map(|&r| (r, range_len(home.range(Rank(r))))).collect();
        shares.push(HostShare { ranks, budget });
    }
    let sizes = budget::value_sizes(dataset.fields(), &dataset.mean_value_bytes());
    let sample_bytes = budget::sample_bytes(&sizes).max(1);
    let fixed = dataset.fields().iter().all(|f| f.fixed_bytes().is_some());
    let mut inputs = IoInputs {
        requested: read.strategy,
        hosts: shares,
        sample_bytes,
        fixed,
        storage: None,
        spill: read.spill_dir.is_some(),
    };
    let fits = inputs.hosts.iter().all(|h| h.ranks.iter().map(|&(_, n)| n).sum::<u64>() * sample_bytes <= h.budget);
    let needs_speed = matches!(read.strategy, crate::config::ReadStrategy::Auto) && !fits && !inputs.spill;
    let mut measured = String::new();
    if let (Some(bw), Some(iops)) = (read.storage_bandwidth, read.storage_iops) {
        inputs.storage = Some(StorageRates { bandwidth: bw as f64, iops: iops as f64 });
        measured = "given".into();
    } else if needs_speed || read.storage_bandwidth.is_some() || read.storage_iops.is_some() {
        let mine = probe(dataset, home.range(comm.rank()), sample_bytes, read.queue_depth);
        let probes: Vec<Probe> =
            comm.all_gather(&mine.to_bytes())?.iter().map(|b| Probe::from_bytes(b).unwrap_or_default()).collect();
        let (rates, how) = host_rates(&probes, &groups);
        inputs.storage = Some(StorageRates {
            bandwidth: read.storage_bandwidth.map_or(rates.bandwidth, |b| b as f64),
            iops: read.storage_iops.map_or(rates.iops, |i| i as f64),
        });
        measured = how;
    }
    let mut io = agree(comm, choose(&inputs))?;
    let room = groups.iter().map(|m| m.iter().map(|&r| all[r]).min().unwrap_or(0)).min().unwrap_or(0);
    let origin = match read.memory_budget {
        Some(b) => format!("--memory-budget {}", show_bytes(b)),
        None => format!("{} of memory headroom per host ({})", show_bytes(room), limits.describe()),
    };
    io.reason = format!(
        "{}; budget from {origin}{}",
        io.reason,
        if measured.is_empty() { String::new() } else { format!("; storage speed {measured}") }
    );
    Ok(io)
}

/// The ranks of each host, hosts in order of their lowest rank.
fn host_members(hosts: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(usize, Vec<usize>)> = Vec::new();
    for (r, &h) in hosts.iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| *g == h) {
            Some((_, m)) => m.push(r),
            None => groups.push((h, vec![r])),
        }
    }
    groups.into_iter().map(|(_, m)| m).collect()
}

fn range_len(r: Range<u64>) -> u64 {
    r.end - r.start
}

/// The storage's speed per host from every rank's probe (the ranks of a host probe at
/// once: their bytes add up over the longest of their times), the slowest host's; and how
/// it was found. A host whose ranks all found their data in the page cache reads at
/// memory speed.
pub(crate) fn host_rates(probes: &[Probe], groups: &[Vec<usize>]) -> (StorageRates, String) {
    const CACHED: StorageRates = StorageRates { bandwidth: 5e9, iops: 1e6 };
    let mut worst: Option<StorageRates> = None;
    let mut cached_hosts = 0;
    for members in groups {
        let ps: Vec<&Probe> = members.iter().map(|&r| &probes[r]).filter(|p| !p.cached && p.seq_secs > 0.0).collect();
        let rates = if ps.is_empty() {
            cached_hosts += 1;
            CACHED
        } else {
            let secs = |f: fn(&Probe) -> f64| ps.iter().map(|p| f(p)).fold(1e-6, f64::max);
            let bw = ps.iter().map(|p| p.seq_bytes as f64).sum::<f64>() / secs(|p| p.seq_secs);
            let iops = ps.iter().map(|p| p.reads as f64).sum::<f64>() / secs(|p| p.read_secs);
            StorageRates { bandwidth: bw.max(1.0), iops: iops.max(1.0) }
        };
        worst = Some(match worst {
            Some(w) => StorageRates { bandwidth: w.bandwidth.min(rates.bandwidth), iops: w.iops.min(rates.iops) },
            None => rates,
        });
    }
    let rates = worst.unwrap_or(CACHED);
    let how = if cached_hosts == groups.len() {
        "unmeasured: the data is in the page cache".to_string()
    } else {
        format!("probed: {}/s, {:.0} reads/s", show_bytes(rates.bandwidth as u64), rates.iops)
    };
    (rates, how)
}

/// Starts this rank's home store (where it keeps or spills rows) and maps the stores of
/// the ranks on its host, for their rows this rank reads itself. Collective; the ranks
/// agree whether every same-host store could be mapped (else same-host rows kept in
/// stores are exchanged: [`Stream::share_stores`]).
pub(crate) fn start_stores(comm: &dyn Transport, stream: &Stream) -> Result<(Reads, bool)> {
    let world = comm.size();
    let me = stream.rank;
    let mut reads = Reads::new(world, stream.options.read.queue_depth);
    if !stream.io.streams_any() {
        return Ok((reads, false));
    }
    let started = match stream.io.streams(me.0) {
        true => HomeStore::start(
            stream.dataset.clone(),
            stream.home.range(me),
            stream.io.resident[me.0],
            stream.options.read.spill_dir.as_deref(),
        )
        .map(Some),
        false => Ok(None),
    };
    let store = agree(comm, started)?;
    let handle =
        store.as_ref().map_or(StoreHandle { pid: std::process::id(), region_fd: -1, spill_fd: -1 }, |s| s.handle());
    let handles = comm.all_gather(&handle.to_bytes())?;
    reads.views[me.0] = store.as_ref().map(HomeStore::view);
    let mut ok = true;
    if let (true, Some(layout)) = (stream.local_reads, &stream.layout) {
        for (q, bytes) in handles.iter().enumerate() {
            if q == me.0 || stream.hosts[q] != stream.hosts[me.0] || !stream.io.streams(q) {
                continue;
            }
            let opened = StoreHandle::from_bytes(bytes)
                .ok_or_else(|| std::io::Error::other("malformed store handle"))
                .and_then(|h| StoreView::open_peer(h, stream.io.resident[q], layout));
            match opened {
                Ok(v) => reads.views[q] = Some(v),
                Err(_) => ok = false,
            }
        }
    }
    let mut all_ok = [ok as u64];
    comm.all_reduce_u64(&mut all_ok, ReduceOp::Min)?;
    let shared = all_ok[0] == 1 && stream.local_reads;
    if !shared {
        for (q, v) in reads.views.iter_mut().enumerate() {
            if q != me.0 {
                *v = None;
            }
        }
    }
    reads.store = store;
    Ok((reads, shared))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_leave_a_margin_and_the_pipelines() {
        const GIB: u64 = 1 << 30;
        // 8 GiB of headroom: a quarter stays with the program, and 4 pipelines of 192 MiB.
        assert_eq!(auto_budget(8 * GIB, 4, 192 << 20), 6 * GIB - 768 * (1 << 20));
        // Small headroom: at least 256 MiB of margin, and never below zero.
        assert_eq!(auto_budget(512 << 20, 1, 64 << 20), 192 << 20);
        assert_eq!(auto_budget(100 << 20, 4, 64 << 20), 0);
    }

    #[test]
    fn hosts_add_their_ranks_probes_and_the_slowest_decides() {
        let p = |bytes: u64, secs: f64, reads: u64| Probe {
            seq_bytes: bytes,
            seq_secs: secs,
            reads,
            read_secs: secs,
            cached: false,
        };
        // Host A: two ranks streaming 100 MB each in 1 s; host B: one rank, 50 MB in 1 s.
        let probes = [p(100_000_000, 1.0, 1000), p(100_000_000, 0.5, 1000), p(50_000_000, 1.0, 300)];
        let (rates, how) = host_rates(&probes, &[vec![0, 1], vec![2]]);
        assert_eq!((rates.bandwidth, rates.iops), (50e6, 300.0));
        assert!(how.starts_with("probed: 47.7 MiB/s, 300 reads/s"), "{how}");
        let cached = Probe { cached: true, ..Probe::default() };
        let (rates, how) = host_rates(&[cached, cached], &[vec![0, 1]]);
        assert!(rates.bandwidth >= 1e9 && how.contains("page cache"), "{how}");
        assert_eq!(host_members(&[0, 1, 0, 2]), vec![vec![0, 2], vec![1], vec![3]]);
    }
}
