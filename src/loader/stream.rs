//! What a loader delivers on this rank: the dataset, the mesh, who receives which rows and
//! slices, and how an epoch is cut into steps and windows.
//!
//! Built once, and validated once, by [`Stream::build`]; then shared read-only by the
//! consumer (the `Loader`) and the producer that runs the windows. Validation depends only
//! on values every rank shares (dataset, options, world size), so ranks given the same job
//! fail alike; the loader still agrees on the outcome, for jobs whose ranks were started
//! with different options.

use std::ops::Range;
use std::sync::Arc;

use super::layout;
use crate::config::{Balance, ExchangeMode, LoaderOptions, LocalReads, TailPolicy, Tune, DEFAULT_PREFETCH};
use crate::dataset::Dataset;
use crate::dataset::RowLayout;
use crate::error::{Error, Result};
use crate::plan::io::Tier;
use crate::plan::sharding::FieldSharding;
use crate::plan::tune;
use crate::plan::{budget, HomeRanges, IoPlan, Mesh, Placement, Strategy, WindowBudget};
use crate::types::{Epoch, Rank, SampleId, Step};

/// A loader's position in its stream: the next batch it delivers. A plain value: saving,
/// comparing and restoring it needs no access to the loader.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub epoch: Epoch,
    pub step: Step,
}

impl Position {
    /// Step `step` of epoch `epoch`.
    pub fn new(epoch: u64, step: u64) -> Position {
        Position { epoch: Epoch(epoch), step: Step(step) }
    }
}

/// Consecutive steps of one epoch, exchanged together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowSpec {
    pub epoch: Epoch,
    pub steps: Range<u64>,
}

/// The two-phase exchange's fixed parts: the leaders' placement, this rank's row-block
/// group and the members of it that receive something.
pub(crate) struct TwoPhaseShape {
    pub leaders: Placement,
    /// The color of this rank's row-block group (block index; ranks receiving nothing
    /// share one more color and exchange nothing).
    pub color: usize,
    /// World ranks of this rank's group members that receive something, in group order.
    pub members: Vec<Rank>,
}

/// Everything fixed about one rank's stream.
pub(crate) struct Stream {
    pub dataset: Arc<Dataset>,
    pub options: LoaderOptions,
    pub rank: Rank,
    pub world: usize,
    pub home: HomeRanges,
    pub mesh: Mesh,
    /// The mesh coordinate of this rank's (first) device.
    pub coords: Vec<usize>,
    /// Each field's sharding over the mesh (defaults resolved).
    pub sharding: Vec<FieldSharding>,
    pub placement: Placement,
    /// The placement of a partial last batch (tail policy `partial`).
    pub tail_placement: Option<Placement>,
    /// The exchange in use (`Auto` resolved).
    pub mode: ExchangeMode,
    pub two_phase: Option<TwoPhaseShape>,
    pub steps_per_epoch: u64,
    pub steps_per_window: u64,
    /// Entries of this rank's home index (see [`budget::index_entries`]).
    pub index_entries: u64,
    /// Whether windows are filled straight from the files ([`direct_reads`]).
    pub direct_reads: bool,
    /// The host index of every rank ([`crate::transport::hosts`]).
    pub hosts: Vec<usize>,
    /// Whether receivers read the rows of owners on their own host straight from the
    /// files into their batches, and owners leave those rows out of the exchange
    /// ([`LocalReads`]): where reads are direct, or the rows come from a feeder (which
    /// every rank reaches: [`Stream::served`]), with the fused exchange.
    pub local_reads: bool,
    /// Local reads with every rank on one host, or every row from a feeder: no row
    /// crosses the exchange.
    pub all_local: bool,
    /// Whether the rows come from a feeder ([`crate::feed`]) and each is received by one
    /// rank: where reads are local ([`Stream::local_reads`]), a receiver asks the feeder
    /// for the rows it receives, whatever host their owner is on. (Rows that several
    /// ranks receive, as tensor-parallel ranks do, are asked for once and cross the
    /// exchange: the feeder sends each row once a job.)
    pub served: bool,
    /// Whether the home ranges may be balanced ([`Stream::balances`]); the window budget
    /// counts a rank's read and send buffers at the most a balanced range holds.
    pub balanced: bool,
    pub budget: WindowBudget,
    /// What the tuner may choose (`--tune auto`; `None`: the settings stay as given).
    pub tune_limits: Option<tune::Limits>,
    /// How ranks read their home ranges: what each keeps in memory or spills.
    pub io: IoPlan,
    /// Whether this rank reads the stores of the ranks on its host (agreed once the stores
    /// exist: [`Stream::share_stores`]); otherwise their kept rows cross the exchange.
    pub shared_stores: bool,
    /// Every field has a fixed size: rows are stored as records.
    pub layout: Option<RowLayout>,
}

impl Stream {
    /// Validates the options against the dataset and the world and derives the stream;
    /// `hosts[r]` is the host index of rank `r`.
    pub fn build(
        rank: Rank,
        world: usize,
        hosts: Vec<usize>,
        dataset: Arc<Dataset>,
        options: LoaderOptions,
        io: IoPlan,
    ) -> Result<Stream> {
        let (n, b) = (dataset.len(), options.batch_size);
        if hosts.len() != world {
            return Err(Error::Internal(format!("{} host indices for {world} ranks", hosts.len())));
        }
        if n == 0 {
            return Err(Error::Config("the dataset has no samples".into()));
        }
        if world as u64 > n {
            return Err(Error::Config(format!("more ranks ({world}) than samples ({n})")));
        }
        if b == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        if b as u64 > n {
            return Err(Error::Config(format!("batch size {b} is larger than the dataset ({n} samples)")));
        }
        let fields = dataset.fields();
        let mesh = layout::mesh(&options.layout, world)?;
        let sharding = layout::sharding(&options.layout, &mesh, fields, b)?;
        // Devices, then the processes that drive them (one device per rank by default).
        let k = options.layout.devices_per_process;
        let place = |rows| Placement::from_mesh(rows, &mesh, fields, &sharding)?.for_processes(k, fields);
        let placement = place(b)?;
        let sizes = budget::value_sizes(fields, &dataset.mean_value_bytes());
        let costs = &options.layout.exchange_costs;
        let mode = layout::choose(options.layout.exchange, &placement, fields, &sizes, &hosts, costs)?;
        let remainder = (n % b as u64) as usize;
        let steps_per_epoch = match options.tail {
            TailPolicy::Drop => n / b as u64,
            TailPolicy::Pad | TailPolicy::Partial => n.div_ceil(b as u64),
        };
        let tail_placement = match (options.tail, remainder) {
            (TailPolicy::Partial, r) if r > 0 => Some(place(r)?),
            _ => None,
        };
        if mode == ExchangeMode::Broadcast && tail_placement.is_some() {
            return Err(Error::Config("the broadcast baseline supports the drop and pad tail policies only".into()));
        }
        let two_phase = match mode {
            ExchangeMode::TwoPhase => {
                let (color, members) = match placement.receiver(rank) {
                    Some((block, _)) => (
                        placement.blocks().iter().position(|x| x.rows == block.rows).expect("own block"),
                        block.receivers.iter().filter(|r| !r.parts.is_empty()).map(|r| r.rank).collect(),
                    ),
                    None => (placement.blocks().len(), vec![]),
                };
                Some(TwoPhaseShape { leaders: layout::leader_placement(&placement)?, color, members })
            }
            _ => None,
        };
        // The busiest rank's receive buffer per step; two-phase leaders hold whole rows,
        // and the broadcast baseline gives every rank whole batches.
        let values_per_step = match mode {
            ExchangeMode::Broadcast => b as u64 * budget::sample_bytes(&sizes),
            _ => layout::recv_bytes_per_step(two_phase.as_ref().map_or(&placement, |t| &t.leaders), fields, &sizes)
                .into_iter()
                .chain(layout::recv_bytes_per_step(&placement, fields, &sizes))
                .max()
                .unwrap_or(0),
        };
        let per_step = values_per_step + budget::bookkeeping_per_step(b, world, fields.len());
        let placements = [Some(&placement), tail_placement.as_ref(), two_phase.as_ref().map(|t| &t.leaders)];
        let whole = whole_tensor_parts(fields, placements.into_iter().flatten());
        let direct_reads = mode != ExchangeMode::Broadcast && whole && direct_reads(&dataset);
        // Values read into buffers of their own before they fill send buffers (variable-length
        // values, small records) hold those buffers besides the exchange's and the
        // batches': the window holds fewer steps.
        let reading = if direct_reads { budget::Reading::Direct } else { budget::Reading::Copied };
        if io.resident.len() != world {
            return Err(Error::Internal(format!("a read plan for {} ranks, not {world}", io.resident.len())));
        }
        let kept = io.streams_any();
        let placements = [Some(&placement), tail_placement.as_ref()];
        let one_receiver = placements.into_iter().flatten().flat_map(|p| p.blocks()).all(|b| b.receivers.len() == 1);
        let served = dataset.row_source().is_some() && one_receiver;
        let local_reads = whole
            && mode == ExchangeMode::Fused
            && options.local_reads == LocalReads::Auto
            && !matches!(io.strategy, Strategy::Passes { .. })
            && (direct_reads || kept || served);
        // Ranges read anew each epoch, by ranks that send what they read (not every rank
        // reading its rows itself: local reads on one host, or from a feeder; with nothing
        // kept, that is when `share_stores` makes every window local).
        let one_host = hosts.iter().all(|&h| h == hosts[0]);
        let balanced = options.balance == Balance::Auto
            && world > 1
            && io.resident.iter().all(|&r| r == 0)
            && !io.spill
            && !matches!(io.strategy, Strategy::Passes { .. })
            && two_phase.is_none()
            && matches!(mode, ExchangeMode::Fused | ExchangeMode::Auto)
            && !(local_reads && (one_host || served));
        let budget = WindowBudget { window_bytes: options.window_bytes, prefetch: options.prefetch };
        let home = HomeRanges::new(n, world);
        let range = home.range(rank);
        // A tuned loader's index is sized by its ceiling, which its windows may grow to (a
        // small index would be planned in many passes an epoch, whatever the window).
        let index_budget = match options.tune {
            Tune::Auto => WindowBudget { window_bytes: budget::pipeline_bound(&options), prefetch: 0 },
            Tune::Off => budget,
        };
        let index_entries = budget::index_entries(&index_budget, range.end - range.start);
        let index_bytes = index_entries * crate::plan::index::ENTRY_BYTES;
        let load = budget::StepLoad { bytes_per_step: per_step, reserved: index_bytes, reading, balanced };
        let steps_per_window = budget.steps_per_window_besides(load, steps_per_epoch);
        // The tuner's memory ceiling: the larger of the given and the default pipeline
        // bounds, counted the same way (the home index reserved alike).
        let tune_limits = (options.tune == Tune::Auto).then(|| {
            let ceiling = budget::pipeline_bound(&options);
            let most_steps = |prefetch: usize| {
                let at = WindowBudget { window_bytes: ceiling / (prefetch as u64 + 1), prefetch };
                at.most_steps_besides(load, steps_per_epoch)
            };
            let prefetch = if options.prefetch == 0 { DEFAULT_PREFETCH } else { 0 };
            tune::Limits {
                prefetch,
                max_steps: most_steps(options.prefetch),
                max_steps_prefetched: most_steps(prefetch.max(options.prefetch)),
                window: !matches!(io.strategy, Strategy::Passes { .. }),
                max_read_depth: options.read.queue_depth.max(tune::MAX_READ_DEPTH),
            }
        });
        let layout = RowLayout::of(fields);
        Ok(Stream {
            tune_limits,
            coords: mesh.coords(Rank(rank.0 * k)),
            sharding,
            rank,
            world,
            home,
            mesh,
            placement,
            tail_placement,
            mode,
            two_phase,
            steps_per_epoch,
            steps_per_window,
            index_entries,
            direct_reads,
            all_local: false,
            served,
            balanced,
            hosts,
            local_reads,
            budget,
            shared_stores: false,
            layout,
            io,
            dataset,
            options,
        }
        .share_stores(false))
    }

    /// Sets whether this rank reads the stores of the ranks on its host (every rank must
    /// be told the same), and with it which windows skip the exchange.
    pub fn share_stores(mut self, shared: bool) -> Stream {
        self.shared_stores = shared && self.io.streams_any();
        let one_host = self.hosts.iter().all(|&h| h == self.hosts[0]);
        let any_stored = (0..self.world).any(|r| {
            let range = self.home.range(Rank(r));
            self.io.resident[r] < range.end - range.start && !self.io.spill
        });
        self.all_local = self.local_reads
            && (one_host || self.served)
            && (!any_stored || self.direct_reads || self.served)
            && (!self.io.streams_any() || self.shared_stores && one_host);
        self
    }

    /// Whether the producer moves the home ranges with the ranks' read speeds
    /// ([`super::balance`]): asked for (`--balance auto`), several ranks, nothing of a home
    /// range kept across epochs (no store, spill file or pass: the ranges are read anew
    /// each epoch), and every row of a full batch crossing the fused exchange (the
    /// two-phase and broadcast routes, and ranks that read all their rows themselves, keep
    /// the ranges the stream started with).
    pub fn balances(&self) -> bool {
        self.balanced && !self.all_local
    }

    /// Where home row `id` of rank `owner` is kept ([`IoPlan`]). Rows of a rank that keeps
    /// nothing are in storage whatever its range (the ranges of a balanced stream move).
    pub fn tier(&self, owner: Rank, id: SampleId) -> Tier {
        if self.io.resident[owner.0] == 0 && !self.io.spill {
            return Tier::Storage;
        }
        let offset = id.0 - self.home.range(owner).start;
        if offset < self.io.resident[owner.0] {
            Tier::Memory
        } else if self.io.spill {
            Tier::Spill
        } else {
            Tier::Storage
        }
    }

    /// Rows of the global batches of steps `steps` (of one epoch).
    pub fn rows_in_steps(&self, steps: std::ops::Range<u64>) -> u64 {
        let n = steps.end.saturating_sub(steps.start);
        let full = self.placement.batch_size() as u64;
        match &self.tail_placement {
            Some(t) if n > 0 && steps.contains(&(self.steps_per_epoch - 1)) => (n - 1) * full + t.batch_size() as u64,
            _ => n * full,
        }
    }

    /// The placement of step `step` (the last step of a `partial` epoch has its own).
    pub fn placement_for_step(&self, step: Step) -> &Placement {
        match &self.tail_placement {
            Some(t) if step.0 + 1 == self.steps_per_epoch => t,
            _ => &self.placement,
        }
    }

    /// Whether `receiver` reads sample `id` of `owner`'s home range itself instead of
    /// receiving it: local reads, and the row is where the receiver can reach it — in the
    /// owner's store when the host's stores are shared, in the files when they are read in
    /// place (both on the owner's host), at the feeder ([`Stream::served`]) from any host.
    /// An owner leaves such rows out of its sends.
    pub fn reads_locally(&self, receiver: Rank, owner: Rank, id: SampleId) -> bool {
        let same_host = self.hosts[owner.0] == self.hosts[receiver.0];
        self.local_reads
            && match self.tier(owner, id) {
                Tier::Storage => self.served || self.direct_reads && same_host,
                Tier::Memory | Tier::Spill => self.shared_stores && same_host,
            }
    }

    /// Whether `w` is the partial last batch's window (always exchanged fused).
    pub fn is_tail_window(&self, w: &WindowSpec) -> bool {
        self.tail_placement.is_some() && w.steps.end == self.steps_per_epoch
    }

    /// The window that starts at `at` (which must be a step of the epoch): up to `steps`
    /// steps (`steps_per_window`, or the tuner's length), never past the epoch's end; a
    /// partial last batch gets a window of its own.
    pub fn window_of(&self, at: Position, steps: u64) -> WindowSpec {
        let total = self.steps_per_epoch;
        let first = at.step.0;
        let mut end = (first + steps.max(1)).min(total);
        if self.tail_placement.is_some() && end == total && first + 1 < total {
            end = total - 1;
        }
        WindowSpec { epoch: at.epoch, steps: first..end }
    }

    /// The window after `w`, of up to `steps` steps: the rest of its epoch, then the next
    /// epoch from step 0.
    pub fn window_after(&self, w: &WindowSpec, steps: u64) -> WindowSpec {
        if w.steps.end < self.steps_per_epoch {
            self.window_of(Position { epoch: w.epoch, step: Step(w.steps.end) }, steps)
        } else {
            self.window_of(Position { epoch: Epoch(w.epoch.0 + 1), step: Step(0) }, steps)
        }
    }

    /// The position after the step at `at`.
    pub fn advance(&self, at: Position) -> Position {
        if at.step.0 + 1 < self.steps_per_epoch {
            Position { epoch: at.epoch, step: Step(at.step.0 + 1) }
        } else {
            Position { epoch: Epoch(at.epoch.0 + 1), step: Step(0) }
        }
    }
}

/// Samples at least this large are read straight into send buffers, one read per value;
/// smaller ones are read in coalesced spans and copied (a read per tiny value costs more
/// than the copy it saves). Measured here (npy, 4 ranks on 2 cores, 128–256 MB, batch
/// 1024, interleaved): direct reads take 0.7× the epoch at 1 KiB, 0.5–0.6× at 2–8 KiB, and
/// break even at 512 B.
pub const DIRECT_READ_MIN_BYTES: u64 = 1024;

/// Whether values can be read from the files straight into their places (with whole
/// tensor parts): every file stores values whole at fixed offsets
/// ([`crate::dataset::FileInfo::in_place`]: `.npy`, raw records, the fixed-size columns of
/// Arrow IPC files, contiguous HDF5 datasets) and samples are large enough
/// ([`DIRECT_READ_MIN_BYTES`]).
fn direct_reads(dataset: &Dataset) -> bool {
    let sample: u64 = dataset.fields().iter().map(|f| f.fixed_bytes().unwrap_or(0) as u64).sum();
    dataset.files().iter().all(|f| f.in_place) && sample >= DIRECT_READ_MIN_BYTES
}

/// Whether every receiver takes whole tensor fields (no slices, no variable-length values).
fn whole_tensor_parts<'a>(fields: &[crate::dataset::Field], placements: impl Iterator<Item = &'a Placement>) -> bool {
    let mut parts = placements.flat_map(|p| p.blocks()).flat_map(|b| &b.receivers).flat_map(|r| &r.parts);
    parts.all(|p| p.slice.is_none() && fields[p.field].fixed_bytes().is_some())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{DType, Field, FileInfo, FileStamp, Format};

    /// One `.npy` file of `samples` samples of a `u8` tensor field of `bytes` elements.
    fn npy_info(samples: u64, bytes: usize) -> FileInfo {
        FileInfo {
            path: "a.npy".into(),
            format: Format::Npy,
            samples,
            fields: vec![Field::tensor("x", DType::U8, vec![bytes])],
            bytes: 0,
            stamp: FileStamp::default(),
            value_bytes: vec![],
            in_place: true,
            pack_tokens: None,
        }
    }

    fn stream(samples: u64, batch: usize, window_bytes: u64, tail: TailPolicy) -> Stream {
        stream_balanced(samples, batch, window_bytes, tail, Balance::Off)
    }

    fn stream_balanced(samples: u64, batch: usize, window_bytes: u64, tail: TailPolicy, balance: Balance) -> Stream {
        let dataset = Arc::new(Dataset::from_files(vec![npy_info(samples, 10)], Default::default()).unwrap());
        let options =
            LoaderOptions { batch_size: batch, window_bytes, prefetch: 0, tail, balance, ..Default::default() };
        Stream::build(Rank(0), 2, vec![0, 0], dataset, options, IoPlan::direct(2)).unwrap()
    }

    /// Rank 0 of 2, on two hosts, of a dataset served by a feeder, under mesh `mesh`.
    fn served_stream(mesh: &str) -> Stream {
        let info = npy_info(1000, 2000);
        let source = crate::feed::Source { address: "f:1".into(), name: "d".into(), token: "t".into() };
        let dataset = Dataset::from_files(vec![info], Default::default()).unwrap();
        let feed = crate::feed::client::Feed::new(source, vec!["f:1".into()], None);
        let dataset = Arc::new(dataset.served_by(Arc::new(feed)));
        let mut options = LoaderOptions { batch_size: 10, ..Default::default() };
        options.layout.mesh = Some(mesh.parse().unwrap());
        Stream::build(Rank(0), 2, vec![0, 1], dataset, options, IoPlan::direct(2)).unwrap()
    }

    /// Each rank asks a feeder for the rows it receives, whatever host their owner is on:
    /// no row crosses the exchange, and home ranges do not follow read speeds. Rows that
    /// tensor-parallel ranks both receive are asked for once, and exchanged.
    #[test]
    fn a_feeder_s_rows_are_asked_for_by_their_receiver_unless_several_receive_them() {
        let dp = served_stream("dp=2");
        assert!(dp.served && dp.local_reads && dp.all_local && !dp.balances());
        assert!(dp.reads_locally(Rank(0), Rank(1), SampleId(999)), "a row of the other host's rank");
        let tp = served_stream("dp=1,tp=2");
        assert!(!tp.served && !tp.all_local);
        assert!(!tp.reads_locally(Rank(0), Rank(1), SampleId(999)));
    }

    /// A tuned stream's limits: a producer thread (2) from `prefetch = 0`, and windows within
    /// the defaults' bound (3 × 64 MiB) however small the given window: the whole epoch,
    /// without a producer and with one (64 MiB less the home index, over 9 × 260 bytes a
    /// step, is more than the epoch's 25 000 steps).
    #[test]
    fn a_tuned_stream_may_grow_to_the_defaults_bound() {
        let mut s = stream(100_000, 4, 4096, TailPolicy::Drop);
        assert_eq!((s.steps_per_epoch, s.steps_per_window, s.tune_limits, s.index_entries), (25_000, 1, None, 4096));
        let options = LoaderOptions { tune: Tune::Auto, ..s.options.clone() };
        s = Stream::build(Rank(0), 2, vec![0, 0], s.dataset.clone(), options, IoPlan::direct(2)).unwrap();
        let limits = s.tune_limits.unwrap();
        assert_eq!(s.steps_per_window, 1, "the given settings are the start");
        assert_eq!((limits.prefetch, limits.max_steps, limits.max_steps_prefetched), (2, 25_000, 25_000));
        assert_eq!((limits.window, limits.max_read_depth), (true, 64));
        // Its home index is sized by the ceiling too: the whole home range (untuned, the
        // least, 4096 entries), planned in one pass an epoch.
        assert_eq!(s.index_entries, 50_000);
    }

    #[test]
    fn windows_tile_epochs_and_cross_into_the_next() {
        // 2 rows × 10 bytes = 20 bytes of values per step per rank, plus bookkeeping (4 × 24
        // + 2 × 72 = 240): 260. Values this small are read into buffers, then copied: 5 ×
        // 260 per step held, so 3900 bytes give 3 steps per window, besides the home index
        // (12 samples × 16 bytes); 3 × 260 (as if read in place) would give 5.
        // 23 samples, batch 4: 5 steps + a partial one (3 rows).
        let s = stream(23, 4, 3900 + 12 * 16, TailPolicy::Partial);
        assert!(!s.direct_reads);
        assert_eq!((s.steps_per_epoch, s.steps_per_window), (6, 3));
        assert_eq!(stream(23, 4, 3900 + 12 * 16 - 1, TailPolicy::Partial).steps_per_window, 2);
        // Balanced home ranges (nothing kept, values exchanged) may grow to 1.5×, with their read
        // (2) and send (1) buffers: 6.5 × 260 per step held, 2 steps.
        let balanced = stream_balanced(23, 4, 3900 + 12 * 16, TailPolicy::Partial, Balance::Auto);
        assert!(balanced.balances());
        assert_eq!(balanced.steps_per_window, 2);
        let mut w = s.window_of(Position::new(0, 0), s.steps_per_window);
        let mut seen = vec![];
        for _ in 0..4 {
            seen.push((w.epoch.0, w.steps.clone()));
            w = s.window_after(&w, s.steps_per_window);
        }
        // The partial last batch is a window of its own.
        assert_eq!(seen, vec![(0, 0..3), (0, 3..5), (0, 5..6), (1, 0..3)]);
        // A tuned length: windows of one step, then of eight (cut at the epoch's end and
        // before the partial last batch).
        let one = s.window_of(Position::new(0, 0), 1);
        assert_eq!(
            (one.steps.clone(), s.window_after(&one, 8).steps, s.window_of(Position::new(0, 0), 0).steps),
            (0..1, 1..5, 0..1)
        );
        assert!(s.is_tail_window(&WindowSpec { epoch: Epoch(0), steps: 5..6 }));
        // A window starting mid-epoch (after a seek) still ends at the epoch's end.
        assert_eq!(s.window_of(Position::new(3, 4), s.steps_per_window).steps, 4..5);
        assert_eq!(s.advance(Position::new(2, 5)), Position::new(3, 0));
    }

    /// The rows of a range of steps, counted in one go, are the sum of each step's batch:
    /// the partial last batch has its own size, a padded one the full size.
    #[test]
    fn rows_in_steps_sum_the_steps_batches() {
        for tail in [TailPolicy::Drop, TailPolicy::Pad, TailPolicy::Partial] {
            let s = stream(23, 4, 1 << 20, tail);
            let spe = s.steps_per_epoch;
            for a in 0..=spe {
                for b in a..=spe {
                    let each: u64 = (a..b).map(|k| s.placement_for_step(Step(k)).batch_size() as u64).sum();
                    assert_eq!(s.rows_in_steps(a..b), each, "{tail:?}: steps {a}..{b}");
                }
            }
            let whole = match tail {
                TailPolicy::Drop => 20,
                TailPolicy::Pad => 24,
                TailPolicy::Partial => 23,
            };
            assert_eq!(s.rows_in_steps(0..spe), whole, "{tail:?}");
        }
    }

    #[test]
    fn invalid_streams() {
        let info = npy_info(3, 1);
        let ds = Arc::new(Dataset::from_files(vec![info], Default::default()).unwrap());
        let build = |world, batch| {
            Stream::build(
                Rank(0),
                world,
                vec![0; world],
                ds.clone(),
                LoaderOptions { batch_size: batch, ..Default::default() },
                IoPlan::direct(world),
            )
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
        };
        assert!(build(4, 1).contains("more ranks (4) than samples (3)"));
        assert!(build(1, 4).contains("batch size 4 is larger than the dataset (3 samples)"));
        assert!(build(1, 0).contains("at least 1"));
        assert!(build(2, 3).contains("not divisible"));
    }
}
