//! One window's work on the producer side, in three collective steps that every rank takes
//! in the same order:
//!
//! 1. [`prepare`]: agree that every rank is at this window, **plan** it ([`WindowPlan`]:
//!    the id of every row, what this rank reads and sends), **read** the samples of its
//!    home range it sends, agree with the other ranks that every read succeeded, and
//!    **fill** each destination's values into one send buffer (one copy);
//! 2. [`exchange`]: one all-to-all-v over the loader's own communicator — overlapped, when
//!    the producer runs ahead, with preparing the next window;
//! 3. [`complete`]: **assemble** the received values into [`Batch`]es (one copy), agree
//!    that every rank did (the agreement carries any stop request and the tuner's
//!    measures), **retune**, and count the window.
//!
//! The route a window takes — fused, two-phase ([`super::two_phase`]) or the broadcast
//! baseline ([`super::broadcast`]) — is fixed by the stream; a partial last batch is always
//! fused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::balance::Balancer;
use super::batch::Batch;
use super::marshal::{assemble_received, fill, LocalRow};
use super::metrics::{Metrics, Phase};
use super::read::passes;
use super::read::{FromReads, Reads};
use super::stream::{Stream, WindowSpec};
use super::tuning::{ConsumerClock, Tuning};
use super::window::{receipt, Delivered, Filled, Received, Route};
use super::{broadcast, two_phase};
use crate::config::ExchangeMode;
use crate::error::{Error, Result};
use crate::plan::{EpochOrder, FieldPart, HomeIndex, Permutation, Placement, Strategy, WindowPlan};
use crate::transport::{agree, agree_carrying, agree_position, Transport};
use crate::types::{Rank, SampleId};

/// What [`super::Loader::stop_requested`] reports for a stop asked for by
/// [`super::Loader::request_stop`] rather than by a signal.
pub const STOP_REQUESTED: i32 = 255;

/// The signals [`super::Loader::stop_requested`] catches: SIGTERM (what Slurm, Kubernetes and most
/// schedulers send before they preempt a job) and SIGUSR1 (what `sbatch --signal` sends).
pub const STOP_SIGNALS: [i32; 2] = [libc::SIGTERM, libc::SIGUSR1];

/// Everything a producer owns: the loader's own communicator, open readers and cache, and
/// the two-phase group. Moves to the producer thread and back as one value.
pub(crate) struct Engine {
    pub stream: Arc<Stream>,
    pub transport: Box<dyn Transport>,
    pub reads: Reads,
    /// Where this rank's home samples fall in the current epoch's order.
    pub index: HomeIndex,
    /// The two-phase row-block group (made at the first two-phase window; a collective).
    pub group: Option<Box<dyn Transport>>,
    /// Stop requests on this rank (a signal number, or [`STOP_REQUESTED`]; 0: none),
    /// agreed with every window.
    pub stop: Arc<AtomicUsize>,
    /// The home ranges, and the read measures that move them.
    pub balance: Balancer,
    /// The tuner of the window length, prefetch and reads in flight, and its measures.
    pub tuning: Tuning,
}

// The producer thread takes the engine with it: everything in it must be `Send`.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Engine>();
};

impl Engine {
    /// An engine for `stream` over the loader's own communicator, reading with `reads`.
    /// `clock` is the consumer's, which the tuner reads.
    pub fn new(
        stream: Arc<Stream>,
        transport: Box<dyn Transport>,
        reads: Reads,
        stop: Arc<AtomicUsize>,
        clock: Arc<ConsumerClock>,
    ) -> Engine {
        let index = HomeIndex::new(stream.home.range(stream.rank), stream.index_entries);
        let balance = Balancer::new(&stream);
        let tuning = Tuning::new(&stream, transport.concurrent(), clock);
        Engine { stream, transport, reads, index, group: None, stop, balance, tuning }
    }
}

/// The passes strategy: makes sure the current pass serves window `spec`, streaming the
/// next one where it does not (a K-th of the epoch from this window on, in whole windows).
fn ensure_pass(
    stream: &Stream,
    reads: &mut Reads,
    index: &mut HomeIndex,
    perm: &Permutation,
    spec: &WindowSpec,
    metrics: &mut Metrics,
) -> Result<()> {
    let Strategy::Passes { passes } = stream.io.strategy else { return Ok(()) };
    let (epoch, steps) = (spec.epoch.0, &spec.steps);
    if reads.pass.as_ref().is_some_and(|p| p.covers(epoch, steps.start) && p.covers(epoch, steps.end - 1)) {
        return Ok(());
    }
    // Passes over the spill file start once it holds the whole home range; until then
    // the windows read their spilled rows where they need them.
    let spilled = match (&reads.store, stream.io.spill) {
        (Some(store), true) if !store.is_filled() => {
            reads.pass = None;
            return Ok(());
        }
        (Some(store), true) => Some(store.view()),
        (None, true) => return Err(Error::Internal("passes over a spill file, but this rank has no store".into())),
        _ => None,
    };
    // The old pass goes first: memory holds one at a time.
    reads.pass = None;
    let (spe, spw) = (stream.steps_per_epoch, stream.steps_per_window.max(1));
    let per_pass = spe.div_ceil(passes.max(1)).div_ceil(spw) * spw;
    let pass_steps = steps.start..(steps.start + per_pass.max(steps.end - steps.start)).min(spe);
    let (b, n) = (stream.options.batch_size as u64, stream.dataset.len());
    let positions = (pass_steps.start * b).min(n)..(pass_steps.end * b).min(n);
    let mut ids: Vec<u64> = index.lookup(perm, positions).iter().map(|&(_, id)| id).collect();
    ids.sort_unstable();
    let dataset = &stream.dataset;
    let pass = match spilled {
        Some(view) => {
            let home = stream.home.range(stream.rank);
            let (pass, bytes) = passes::fill_spilled(&view, home.start, epoch, pass_steps, ids)?;
            metrics.bytes_read_spill += bytes;
            pass
        }
        None => {
            let (pass, bytes) = passes::fill(dataset, epoch, pass_steps, ids, &mut |f| dataset.open_reader(f))?;
            metrics.bytes_read += bytes;
            pass
        }
    };
    metrics.bytes_copied += pass.bytes() as u64;
    reads.pass = Some(Arc::new(pass));
    Ok(())
}

/// The route of a window.
fn route(stream: &Stream, spec: &WindowSpec) -> Route {
    match stream.mode {
        _ if stream.all_local => Route::Local,
        _ if stream.is_tail_window(spec) => Route::Fused,
        ExchangeMode::TwoPhase => Route::TwoPhase,
        ExchangeMode::Broadcast => Route::Broadcast,
        ExchangeMode::Fused | ExchangeMode::Auto => Route::Fused,
    }
}

/// Who receives what in the all-to-all-v of a window on `route`.
fn exchange_placement<'a>(stream: &'a Stream, spec: &WindowSpec, route: Route) -> &'a Placement {
    match (route, &stream.two_phase) {
        (Route::TwoPhase, Some(t)) => &t.leaders,
        _ => stream.placement_for_step(first_step(spec)),
    }
}

/// Any step of the window (they share one placement).
fn first_step(spec: &WindowSpec) -> crate::types::Step {
    crate::types::Step(spec.steps.start)
}

/// Step 1: plans, reads and fills window `spec`. Collective (the position agreement: every
/// rank prepares the same window; the read agreement).
pub(crate) fn prepare(
    stream: &Stream,
    transport: &dyn Transport,
    reads: &mut Reads,
    index: &mut HomeIndex,
    balance: &mut Balancer,
    spec: WindowSpec,
) -> Result<Filled> {
    let mut metrics = Metrics::default();
    // Waiting here is waiting for the slowest rank to be done with the window before (a
    // producer held back by its consumer, when prefetch is full): peer waiting.
    metrics.agreed(|| agree_position(transport, spec.epoch.0, spec.steps.start, None))?;
    let route = route(stream, &spec);
    if route == Route::Broadcast {
        return broadcast::prepare(stream, transport, reads, spec);
    }
    // A balanced stream's ranges move at an epoch's first window (a collective there).
    let home = balance.ranges_for(stream, transport, index, &spec)?;
    let o = &stream.options;
    let perm = Permutation::of(stream.dataset.len(), o.seed, o.shared_order, spec.epoch.0);
    let placement = exchange_placement(stream, &spec, route);
    // A two-phase member also needs the ids of its own rows under the final placement.
    let own_rows = match route {
        Route::TwoPhase => stream.placement.receiver(stream.rank).map(|(block, _)| block.rows.clone()),
        _ => None,
    };
    let order = EpochOrder { perm: &perm, home: &home, stride: stream.options.batch_size };
    // The pass serving this window is streamed first (passes strategy); its rows need the
    // home index, which planning uses next.
    let pass = metrics.timed(Phase::Read, |m| ensure_pass(stream, reads, index, &perm, &spec, m));
    let plan = metrics
        .timed(Phase::Plan, |_| WindowPlan::new(&order, index, placement, stream.rank, spec.steps.clone(), own_rows));
    metrics.evaluations += plan.evaluations;
    let local = matches!(route, Route::Fused | Route::Local) && stream.local_reads;
    // Receivers on this host read some of this rank's rows themselves: those are not
    // sent, and those they read from the files are read ahead here, in file order.
    let me = stream.rank;
    let read_there = |d: usize, i: usize| local && stream.reads_locally(Rank(d), me, plan.ids[i]);
    let sends: Vec<Vec<usize>> = plan
        .sends
        .iter()
        .enumerate()
        .map(|(d, rows)| rows.iter().copied().filter(|&i| !read_there(d, i)).collect())
        .collect();
    let parts: Vec<Option<&[FieldPart]>> =
        (0..placement.world()).map(|d| placement.receiver(Rank(d)).map(|(_, rc)| &rc.parts[..])).collect();
    // Every row this rank reads or a receiver of its host reads from it must be in its
    // store before the read agreement (after which receivers read the stores).
    let ready = |reads: &mut Reads, m: &mut Metrics| {
        pass.and_then(|()| reads.wait_for_store(stream, spec.epoch.0, &plan.reads, m))
    };
    let filled = if stream.direct_reads {
        // Read straight into the send buffer: reading is filling.
        let there =
            (0..placement.world()).flat_map(|d| plan.sends[d].iter().copied().filter(move |&i| read_there(d, i)));
        metrics.timed(Phase::Read, |m| {
            ready(reads, m)
                .and_then(|()| reads.advise(stream, there, &plan.ids))
                .and_then(|()| reads.fill_direct(stream, &sends, &parts, &plan.ids, m))
        })
    } else {
        let read = metrics.timed(Phase::Read, |m| {
            let mut sent: Vec<SampleId> = sends.iter().flatten().map(|&i| plan.ids[i]).collect();
            sent.sort_unstable();
            sent.dedup();
            ready(reads, m).and_then(|()| reads.read(stream, &sent, m))
        });
        read.map(|read| {
            let source = FromReads { ids: &plan.ids, read: &read };
            let filled = metrics.timed(Phase::Fill, |_| fill(&sends, &parts, stream.dataset.fields(), &source));
            metrics.bytes_copied += filled.0.len() as u64;
            filled
        })
    };
    let (send, counts, deferred) = if route == Route::Local && !stream.io.streams_any() {
        // Nothing was read or is sent, and no store is waited for: an error waits for the
        // assembly agreement, the window's only collective.
        match filled {
            Ok((send, counts)) => (send, counts, None),
            Err(e) => (Vec::new(), vec![0; placement.world()], Some(e)),
        }
    } else {
        let (send, counts) = metrics.agreed(|| agree(transport, filled))?;
        (send, counts, None)
    };
    metrics.bytes_sent += send.len() as u64;
    let me = stream.hosts[stream.rank.0];
    metrics.bytes_sent_off_host +=
        counts.iter().zip(&stream.hosts).filter(|&(_, &h)| h != me).map(|(&c, _)| c as u64).sum::<u64>();
    metrics.window_sends.push(counts.clone());
    let read_s = metrics.time(Phase::Read) + metrics.time(Phase::Fill);
    balance.measured(sends.iter().map(|rows| rows.len() as u64).sum(), read_s.as_secs_f64());
    let mine = home.range(stream.rank);
    metrics.home_rows = mine.end - mine.start;
    Ok(Filled { spec, route, home, ids: plan.ids, send, counts, metrics, deferred })
}

/// Step 2: exchanges a filled window. With `during`, the exchange is non-blocking and
/// `during` runs while it is in flight (its time is not counted as exchange time).
pub(crate) fn exchange(
    transport: &dyn Transport,
    filled: Filled,
    during: Option<&mut dyn FnMut()>,
) -> Result<Received> {
    let Filled { spec, route, home, ids, send, counts, mut metrics, deferred } = filled;
    let start = Instant::now();
    let mut busy = std::time::Duration::ZERO;
    let (recv, recv_counts) = match (route, during) {
        (Route::Local, during) => {
            if let Some(during) = during {
                let t = Instant::now();
                during();
                busy = t.elapsed();
            }
            (send, counts)
        }
        (Route::Broadcast, during) => {
            let r = broadcast::exchange(transport, send)?;
            if let Some(during) = during {
                let t = Instant::now();
                during();
                busy = t.elapsed();
            }
            r
        }
        (_, None) => transport.all_to_all_v(send, &counts)?,
        (_, Some(during)) => {
            let mut timed = || {
                let t = Instant::now();
                during();
                busy += t.elapsed();
            };
            transport.all_to_all_v_overlapped(send, &counts, &mut timed)?
        }
    };
    metrics.charge(Phase::Exchange, start.elapsed().saturating_sub(busy));
    metrics.bytes_received += recv.len() as u64;
    Ok(Received { spec, route, home, ids, recv, recv_counts, metrics, deferred })
}

/// Step 3: assembles a received window into batches, agrees with every rank that each
/// did (and on any stop request and the tuner's measures), retunes, and counts the window.
/// Collective (the assembly agreement, and the two-phase scatter).
pub(crate) fn complete(engine: &mut Engine, mut received: Received) -> Result<Delivered> {
    let mut metrics = std::mem::take(&mut received.metrics);
    let batches = match received.deferred.take() {
        Some(e) => Err(e),
        None => assemble(engine, &received, &mut metrics),
    };
    let Received { spec, recv, .. } = received;
    crate::buffers::give_bytes(recv);
    let (batches, carried) = agree_assembly(engine, batches, &mut metrics)?;
    retune(engine, spec.steps.end - spec.steps.start, &carried.measures);
    count_delivered(&mut metrics, &batches);
    Ok(Delivered { spec, batches, metrics, stop: carried.stop, tuned: engine.tuning.settings() })
}

/// Assembles a received window's batches by its route: on the fused routes from the
/// values received and the rows this rank reads itself ([`read_own`]); on the others by
/// their own step 3. Collective on the two-phase route (the scatter within its group).
fn assemble(engine: &mut Engine, received: &Received, metrics: &mut Metrics) -> Result<Vec<Batch>> {
    let Received { spec, route, home, ids, recv, recv_counts, .. } = received;
    let stream = &*engine.stream;
    match route {
        Route::Fused | Route::Local => {
            let placement = stream.placement_for_step(first_step(spec));
            let r = receipt(stream, placement, spec, ids);
            let fields = stream.dataset.fields();
            metrics.bytes_copied += recv.len() as u64;
            let source_of =
                |id| Some(home.owner(id)).filter(|&o| !stream.reads_locally(stream.rank, o, id)).map(|o| o.0);
            let (mut batches, local) =
                metrics.timed(Phase::Assemble, |_| assemble_received(&r, fields, recv, recv_counts, source_of))?;
            read_own(stream, &mut engine.reads, &mut batches, &local, metrics)?;
            Ok(batches)
        }
        Route::TwoPhase => {
            two_phase::complete(stream, &*engine.transport, &mut engine.group, spec, ids, (recv, recv_counts), metrics)
        }
        Route::Broadcast => broadcast::complete(stream, spec, ids, recv, metrics),
    }
}

/// The rows of a fused window that this rank reads itself rather than receives (those
/// whose owner shares its host: from the owner's store or the files), copied into their
/// places in `batches`; the time counts as reading.
fn read_own(
    stream: &Stream,
    reads: &mut Reads,
    batches: &mut [Batch],
    local: &[LocalRow],
    metrics: &mut Metrics,
) -> Result<()> {
    metrics.timed(Phase::Read, |m| reads.read_local(stream, batches, local, m))
}

/// What the assembly agreement carries besides its outcome, agreed by every rank.
struct Carried {
    /// A stop some rank was asked for (the signal number, or [`STOP_REQUESTED`]).
    stop: Option<i32>,
    /// The tuner's measures of the window, the maxima over the ranks ([`Tuning::local`]).
    measures: Vec<u64>,
}

/// The assembly agreement: every rank learns, with the same window, whether every rank
/// assembled it, whether any was asked to stop, and the tuner's measures (the same maxima
/// on every rank, so every tuner makes the same move). Records in `metrics` the settings
/// the window ran with. Collective.
fn agree_assembly(
    engine: &mut Engine,
    batches: Result<Vec<Batch>>,
    metrics: &mut Metrics,
) -> Result<(Vec<Batch>, Carried)> {
    metrics.tuned = engine.tuning.settings();
    let mut carried = vec![engine.stop.load(Ordering::SeqCst) as u64];
    carried.extend(engine.tuning.local(metrics));
    let batches = metrics.agreed(|| agree_carrying(&*engine.transport, batches, &mut carried))?;
    let stop = (carried[0] != 0).then(|| i32::try_from(carried[0]).unwrap_or(STOP_REQUESTED));
    Ok((batches, Carried { stop, measures: carried.split_off(1) }))
}

/// Retuning: feeds the tuner a window of `steps` steps and its agreed `measures`. A new
/// number of reads in flight applies from the next window's reads; the window length and
/// prefetch are read from the tuner where they apply ([`super::tuning`]).
fn retune(engine: &mut Engine, steps: u64, measures: &[u64]) {
    if let Some(tuned) = engine.tuning.agreed(steps, measures) {
        engine.reads.queue_depth = tuned.read_depth;
    }
}

/// Counts a delivered window and its rows.
fn count_delivered(metrics: &mut Metrics, batches: &[Batch]) {
    metrics.windows += 1;
    metrics.rows_delivered += batches.iter().map(|b| b.ids.len() as u64).sum::<u64>();
}
