//! Typed configuration of a loading job, parsed once at the edge.
//!
//! Command lines (clap), job files (TOML) and Python keyword arguments all produce the
//! values of this module; the loader and the planner only ever see these types, never the
//! strings they came from. Parsing checks syntax (a mesh is `name=size,...`, a byte size
//! is `64M`); what depends on the dataset and the world — field names, axis names in
//! sharding specs, divisibility, the number of ranks — is checked once, when a loader is
//! built ([`crate::loader::Loader::new`]), identically on every rank.
//!
//! A job file is the serde shape [`JobFile`]: every key optional, unknown keys refused.
//! An edge reads it (TOML for the command line), lets its own flags override keys, and
//! turns it into a [`Job`] with [`JobFile::into_job`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::dataset::DatasetOptions;
use crate::error::{Error, Result};

/// Reads a small text file (a job file, a state, a run's telemetry) defensively: opening
/// never blocks (a FIFO in a file's place would wait for a writer forever), only regular
/// files are read (a device might never end), and a file longer than `limit` bytes is
/// refused before anything is read, not read whole into memory. Errors name the file.
pub fn read_small_file(path: &Path, limit: u64) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::file(path, format!("not a regular file ({}): only regular files are read", kind(&meta))));
    }
    if meta.len() > limit {
        return Err(Error::file(path, format!("{} bytes: a file of this kind is at most {limit} bytes", meta.len())));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(Error::file(
            path,
            format!("grew past {limit} bytes while read: a file of this kind is at most that"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| Error::file(path, format!("not UTF-8 text (byte {} is not)", e.utf8_error().valid_up_to())))
}

/// What a path that is not a regular file is, for an error.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a file"
    }
}

/// The most a job file may hold (they are a few hundred bytes).
pub const JOB_FILE_LIMIT: u64 = 1 << 20;

/// A number of bytes, written `65536`, `64K`, `64M`, `1G` or `2T` (powers of 1024).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = Error;

    fn from_str(s: &str) -> Result<ByteSize> {
        let s = s.trim();
        let (digits, mult) = match s.char_indices().last() {
            Some((i, c)) if c.is_ascii_alphabetic() => {
                let m = match c.to_ascii_uppercase() {
                    'K' => 1u64 << 10,
                    'M' => 1 << 20,
                    'G' => 1 << 30,
                    'T' => 1 << 40,
                    _ => return Err(Error::Config(format!("unknown size suffix in '{s}' (use K, M, G or T)"))),
                };
                (&s[..i], m)
            }
            _ => (s, 1),
        };
        digits
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(mult))
            .map(ByteSize)
            .ok_or_else(|| Error::Config(format!("'{s}' is not a byte size (e.g. 65536, 64M, 1G)")))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Job files may write a size as a number or as a string with a suffix.
impl<'de> serde::Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<ByteSize, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u64),
            Text(String),
        }
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a byte size: a non-negative number or a string such as \"64M\"")
        })? {
            Raw::Number(n) => Ok(ByteSize(n)),
            Raw::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// One named mesh axis and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshAxis {
    pub name: String,
    pub size: usize,
}

/// A device mesh as written: `dp=2,tp=2,pp=2`. Axis names are unique, sizes positive,
/// and their product fits `usize`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MeshSpec {
    pub axes: Vec<MeshAxis>,
}

impl MeshSpec {
    /// The number of devices (product of the sizes).
    pub fn devices(&self) -> usize {
        self.axes.iter().map(|a| a.size).product()
    }
}

impl FromStr for MeshSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<MeshSpec> {
        let bad = |why: String| Error::Config(format!("mesh '{spec}': {why} (expected e.g. dp=2,tp=2,pp=2)"));
        let mut axes: Vec<MeshAxis> = Vec::new();
        for part in spec.split(',').map(str::trim) {
            let (name, size) = part.split_once('=').ok_or_else(|| bad(format!("'{part}' is not name=size")))?;
            let name = name.trim();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(bad(format!("bad axis name '{name}'")));
            }
            if axes.iter().any(|a| a.name == name) {
                return Err(bad(format!("axis '{name}' appears twice")));
            }
            let size: usize = size
                .trim()
                .parse()
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| bad(format!("bad size for axis '{name}'")))?;
            axes.push(MeshAxis { name: name.to_string(), size });
        }
        if axes.iter().try_fold(1usize, |a, x| a.checked_mul(x.size)).is_none() {
            return Err(bad("the product of the sizes overflows".into()));
        }
        Ok(MeshSpec { axes })
    }
}

impl TryFrom<String> for MeshSpec {
    type Error = Error;
    fn try_from(s: String) -> Result<MeshSpec> {
        s.parse()
    }
}

impl From<MeshSpec> for String {
    fn from(m: MeshSpec) -> String {
        m.to_string()
    }
}

impl fmt::Display for MeshSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.axes.iter().map(|a| format!("{}={}", a.name, a.size)).collect();
        f.write_str(&parts.join(","))
    }
}

/// A sharding spec in the spirit of JAX `PartitionSpec`, as written: for each dimension
/// of a field's batch array `[batch, *shape]`, the mesh axes that split it (`dp+fsdp` is a
/// tuple of axes) or none (`-`). `dp,-,tp` splits the batch over `dp` and dimension 2
/// over `tp`. Omitted trailing dimensions are not split.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ShardSpec {
    pub dims: Vec<Vec<String>>,
}

impl FromStr for ShardSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<ShardSpec> {
        let mut dims = Vec::new();
        for d in spec.split(',').map(str::trim) {
            if d == "-" || d.is_empty() {
                dims.push(vec![]);
                continue;
            }
            let axes: Vec<String> = d.split('+').map(|a| a.trim().to_string()).collect();
            if let Some(bad) =
                axes.iter().find(|a| a.is_empty() || !a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            {
                return Err(Error::Config(format!(
                    "sharding spec '{spec}': bad axis name '{bad}' (expected e.g. dp,-,tp or dp+fsdp)"
                )));
            }
            dims.push(axes);
        }
        Ok(ShardSpec { dims })
    }
}

impl TryFrom<String> for ShardSpec {
    type Error = Error;
    fn try_from(s: String) -> Result<ShardSpec> {
        s.parse()
    }
}

impl From<ShardSpec> for String {
    fn from(s: ShardSpec) -> String {
        s.to_string()
    }
}

impl fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> =
            self.dims.iter().map(|axes| if axes.is_empty() { "-".to_string() } else { axes.join("+") }).collect();
        f.write_str(&dims.join(","))
    }
}

/// An enum written as one of a fixed list of names (for help texts and value parsers).
pub trait NamedValues: FromStr<Err = Error> + Copy + Send + Sync + 'static {
    /// The accepted names, in order.
    const NAMES: &'static [&'static str];
}

/// Defines a unit-variant enum whose values are written in lower case (kebab case), with
/// `FromStr`, `Display`, serde, and the list of accepted names for help texts.
macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident, $what:literal { $($(#[$vm:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $text)] $variant),+
        }

        impl NamedValues for $name {
            const NAMES: &'static [&'static str] = &[$($text),+];
        }

        impl $name {
            /// The name of this value.
            pub fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl FromStr for $name {
            type Err = Error;
            fn from_str(s: &str) -> Result<$name> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(Error::Config(format!(
                        "{} '{s}': expected {}", $what, expected_list(Self::NAMES)
                    ))),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

/// `a, b or c`.
fn expected_list(names: &[&str]) -> String {
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

named_enum!(
    /// Which pipeline stages receive a field.
    Stage, "stage" {
        /// The first stage only (typically inputs).
        First => "first",
        /// The last stage only (typically labels).
        Last => "last",
        /// Every stage.
        All => "all",
    }
);

impl Stage {
    /// Whether pipeline stage `stage` of `stages` receives the field.
    pub fn includes(self, stage: usize, stages: usize) -> bool {
        match self {
            Stage::First => stage == 0,
            Stage::Last => stage + 1 == stages,
            Stage::All => true,
        }
    }
}

named_enum!(
    /// What happens to the last batch of an epoch when `B` does not divide `N`. Every rank
    /// derives the same steps from `N` and `B`, so no rank waits for a batch others skip.
    TailPolicy, "tail" {
        /// Drop the incomplete batch: `⌊N/B⌋` steps.
        Drop => "drop",
        /// Complete it with the first samples of the epoch's order (positions `N, N+1, ...`
        /// wrap to `0, 1, ...`): `⌈N/B⌉` full steps; those samples appear twice in the epoch.
        Pad => "pad",
        /// Deliver a short last batch of `N mod B` rows, split over the batch blocks as evenly
        /// as the mesh allows (block sizes differ by at most one; some may be empty).
        Partial => "partial",
    }
);

impl Default for TailPolicy {
    fn default() -> Self {
        TailPolicy::Drop
    }
}

named_enum!(
    /// Which exchange moves samples to the ranks that need them.
    ExchangeMode, "exchange" {
        /// The cheaper of fused and two-phase by the cost model.
        Auto => "auto",
        /// Home ranks send each needed slice straight to every rank that needs it.
        Fused => "fused",
        /// Whole rows to one leader per row block, which scatters slices in its group.
        TwoPhase => "two-phase",
        /// The single-loader baseline: rank 0 reads every batch and broadcasts it; every
        /// rank keeps its slice (for benchmarks; `P`× the traffic).
        Broadcast => "broadcast",
    }
);

impl Default for ExchangeMode {
    fn default() -> Self {
        ExchangeMode::Auto
    }
}

named_enum!(
    /// Whether ranks on one host read the rows they receive from each other's home ranges
    /// straight from the files (through the page cache they share) instead of receiving
    /// them in the all-to-all.
    LocalReads, "local reads" {
        /// Where values sit whole at fixed offsets (`.npy`, raw records, fixed-size Arrow
        /// columns) and are large enough to be read one by one (the direct-read rule),
        /// with the fused exchange.
        Auto => "auto",
        /// Every row crosses the exchange, whatever host its owner is on.
        Off => "off",
    }
);

impl Default for LocalReads {
    fn default() -> Self {
        LocalReads::Auto
    }
}

named_enum!(
    /// How ranks read their home ranges from storage ([`crate::plan::io`]).
    ReadStrategy, "read strategy" {
        /// The cheapest that fits the memory budget, by the storage's measured speed.
        Auto => "auto",
        /// Each rank streams its home range once into memory; later epochs read nothing.
        Resident => "resident",
        /// Each epoch streams the home range K times, keeping a K-th of it at a time.
        Passes => "passes",
        /// What fits the budget stays in memory; the rest is read where a window needs it,
        /// with many reads in flight (or spilled once, with a spill directory).
        Random => "random",
    }
);

impl Default for ReadStrategy {
    fn default() -> Self {
        ReadStrategy::Auto
    }
}

/// Reads each rank keeps in flight when it reads samples at random.
pub const DEFAULT_READ_QUEUE_DEPTH: usize = 16;

/// How a loader reads its home range: the strategy, the memory it may use for data, the
/// storage's speed when known, and the node-local spill directory.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReadOptions {
    pub strategy: ReadStrategy,
    /// Bytes the ranks of one host may hold for data together (resident rows, pass
    /// buffers); `None`: from the cgroup memory limit or the available memory.
    pub memory_budget: Option<u64>,
    /// The storage's sequential bandwidth per host, bytes/s (`None`: probed when needed).
    pub storage_bandwidth: Option<u64>,
    /// The storage's random reads per second per host (`None`: probed when needed).
    pub storage_iops: Option<u64>,
    /// Node-local directory to spill what does not fit in memory to.
    pub spill_dir: Option<PathBuf>,
    /// Reads in flight per rank when reading at random.
    pub queue_depth: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            strategy: ReadStrategy::Auto,
            memory_budget: None,
            storage_bandwidth: None,
            storage_iops: None,
            spill_dir: None,
            queue_depth: DEFAULT_READ_QUEUE_DEPTH,
        }
    }
}

named_enum!(
    /// How the ranks of a job talk.
    TransportKind, "transport" {
        /// MPI (launch with mpirun or srun).
        Mpi => "mpi",
        /// UCX, bootstrapped by the TCP rendezvous (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
        /// `MASTER_PORT`, `MESHFEED_JOB_TOKEN`): Ray, Kubernetes, `meshfeed launch`.
        Ucx => "ucx",
    }
);

impl Default for TransportKind {
    fn default() -> Self {
        TransportKind::Mpi
    }
}

/// The all-to-all's costs, which `exchange = auto` weighs the fused and the two-phase
/// exchange with: a latency per peer, the bandwidth of one rank to ranks on its host, and
/// the bandwidth of one host's link to other hosts (its ranks share it). Written
/// `latency=5e-6,intra=1e10,inter=1.2e9` (seconds, bytes per second); `meshfeed report
/// --predict` fits them to measured runs and prints them in this form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ExchangeCosts {
    pub latency_ns: u64,
    pub intra_bytes_per_s: u64,
    pub inter_bytes_per_s: u64,
}

impl Default for ExchangeCosts {
    /// Latency and on-host bandwidth fitted by `meshfeed report --predict` to the loader's
    /// own exchanges on a 16-core node (Open MPI shared memory, 2 to 16 ranks, 2 and 16
    /// KiB samples: 24 µs a peer, 4.4 GB/s a rank); the link between hosts is not
    /// measured (one node): a 10 Gbit/s link is assumed. Fit a cluster's own.
    fn default() -> Self {
        ExchangeCosts { latency_ns: 24_000, intra_bytes_per_s: 4_400_000_000, inter_bytes_per_s: 1_250_000_000 }
    }
}

impl FromStr for ExchangeCosts {
    type Err = Error;

    fn from_str(s: &str) -> Result<ExchangeCosts> {
        let bad = |why: String| {
            Error::Config(format!("exchange costs '{s}': {why} (e.g. latency=5e-6,intra=1e10,inter=1.2e9)"))
        };
        let mut c = ExchangeCosts::default();
        let mut seen = Vec::new();
        for pair in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| bad(format!("'{pair}' is not key=value")))?;
            let v: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v > 0.0)
                .ok_or_else(|| bad(format!("'{value}' is not a positive number")))?;
            match key.trim() {
                "latency" => c.latency_ns = (v * 1e9).round() as u64,
                "intra" => c.intra_bytes_per_s = v.round().max(1.0) as u64,
                "inter" => c.inter_bytes_per_s = v.round().max(1.0) as u64,
                k => return Err(bad(format!("unknown key '{k}' (latency, intra, inter)"))),
            }
            seen.push(key.trim().to_string());
        }
        if seen.is_empty() {
            return Err(bad("no key given".into()));
        }
        Ok(c)
    }
}

impl fmt::Display for ExchangeCosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "latency={:e},intra={:e},inter={:e}",
            self.latency_ns as f64 / 1e9,
            self.intra_bytes_per_s as f64,
            self.inter_bytes_per_s as f64
        )
    }
}

impl TryFrom<String> for ExchangeCosts {
    type Error = Error;
    fn try_from(s: String) -> Result<ExchangeCosts> {
        s.parse()
    }
}

impl From<ExchangeCosts> for String {
    fn from(c: ExchangeCosts) -> String {
        c.to_string()
    }
}

/// How batches are laid out over a device mesh. The default is data parallelism over all
/// ranks (`dp=<world>`, batch split over `dp`), one device per rank.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// Mesh axes; `None`: `dp=<world>`.
    pub mesh: Option<MeshSpec>,
    /// Axes from slowest to fastest in the rank numbering (empty: as written).
    pub mesh_order: Vec<String>,
    /// The pipeline axis (default: the axis called `pp`).
    pub pipeline_axis: Option<String>,
    /// Sharding spec per field (default: batch dimension over `dp`, the rest whole).
    pub shard: BTreeMap<String, ShardSpec>,
    /// Pipeline stages per field (default: all).
    pub stages: BTreeMap<String, Stage>,
    /// Exchange algorithm.
    pub exchange: ExchangeMode,
    /// The costs `exchange = auto` decides with.
    #[serde(default)]
    pub exchange_costs: ExchangeCosts,
    /// Mesh devices each rank drives (JAX: one process per host, several local devices):
    /// the mesh has `world × devices_per_process` devices, rank `r` drives devices
    /// `r·K .. (r+1)·K` and receives the union of their shards.
    #[serde(default = "one")]
    pub devices_per_process: usize,
}

fn one() -> usize {
    1
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            mesh: None,
            mesh_order: vec![],
            pipeline_axis: None,
            shard: BTreeMap::new(),
            stages: BTreeMap::new(),
            exchange: ExchangeMode::default(),
            exchange_costs: ExchangeCosts::default(),
            devices_per_process: 1,
        }
    }
}

/// Default window budget: 64 MiB per rank.
pub const DEFAULT_WINDOW_BYTES: u64 = 64 << 20;
/// Default number of windows the background producer may run ahead.
pub const DEFAULT_PREFETCH: usize = 2;

/// How a loader batches, shuffles, places and pipelines data.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderOptions {
    /// Global batch size `B`.
    pub batch_size: usize,
    /// Seed of the permutation.
    pub seed: u64,
    /// Budget for one exchange window's buffers per rank; the window length in steps is
    /// derived from it ([`crate::plan::budget`]).
    pub window_bytes: u64,
    /// Windows the background producer may run ahead of the consumer; 0 runs every window
    /// on the caller's thread when it asks for a batch (no producer thread).
    pub prefetch: usize,
    /// Device mesh, sharding specs and pipeline stages.
    pub layout: Layout,
    /// What happens to the last, incomplete batch of an epoch.
    pub tail: TailPolicy,
    /// How ranks read their home ranges from storage.
    #[serde(default)]
    pub read: ReadOptions,
    /// Whether rows whose owner is on this rank's host are read here rather than received.
    #[serde(default)]
    pub local_reads: LocalReads,
}

impl LoaderOptions {
    /// Every option as a (name, value) pair of text (names as in job files), so that ranks
    /// can check they were all given the same ([`crate::transport::agree_settings`]).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let l = &self.layout;
        let pairs = |m: Vec<String>| m.join("; ");
        vec![
            ("batch_size", self.batch_size.to_string()),
            ("seed", self.seed.to_string()),
            ("window_bytes", self.window_bytes.to_string()),
            ("prefetch", self.prefetch.to_string()),
            ("mesh", l.mesh.as_ref().map_or_else(|| "dp=<ranks>".into(), |m| m.to_string())),
            ("mesh_order", l.mesh_order.join(",")),
            ("pipeline_axis", l.pipeline_axis.clone().unwrap_or_default()),
            ("shard", pairs(l.shard.iter().map(|(f, s)| format!("{f}={s}")).collect())),
            ("stages", pairs(l.stages.iter().map(|(f, s)| format!("{f}={s}")).collect())),
            ("exchange", l.exchange.to_string()),
            ("exchange_costs", l.exchange_costs.to_string()),
            ("devices_per_process", l.devices_per_process.to_string()),
            ("tail", self.tail.to_string()),
            ("read_strategy", self.read.strategy.to_string()),
            ("memory_budget", self.read.memory_budget.map_or_else(|| "auto".into(), |b| b.to_string())),
            ("storage_bandwidth", self.read.storage_bandwidth.map_or_else(|| "probe".into(), |b| b.to_string())),
            ("storage_iops", self.read.storage_iops.map_or_else(|| "probe".into(), |b| b.to_string())),
            ("spill_dir", self.read.spill_dir.as_ref().map_or_else(String::new, |p| p.display().to_string())),
            ("read_queue_depth", self.read.queue_depth.to_string()),
            ("local_reads", self.local_reads.to_string()),
        ]
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 32,
            seed: 0,
            window_bytes: DEFAULT_WINDOW_BYTES,
            prefetch: DEFAULT_PREFETCH,
            layout: Layout::default(),
            tail: TailPolicy::Drop,
            read: ReadOptions::default(),
            local_reads: LocalReads::Auto,
        }
    }
}

/// The keys of a job file, every one optional; an edge sets the ones its own flags give
/// (flags override the file) and calls [`JobFile::into_job`].
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobFile {
    pub data: Vec<PathBuf>,
    pub group: Option<String>,
    pub batch_size: Option<usize>,
    pub epochs: Option<u64>,
    pub seed: Option<u64>,
    pub window_bytes: Option<ByteSize>,
    pub prefetch: Option<usize>,
    pub read_strategy: Option<ReadStrategy>,
    pub memory_budget: Option<ByteSize>,
    pub storage_bandwidth: Option<ByteSize>,
    pub storage_iops: Option<u64>,
    pub spill_dir: Option<PathBuf>,
    pub read_queue_depth: Option<usize>,
    pub tail: Option<TailPolicy>,
    pub transport: Option<TransportKind>,
    pub mesh: Option<MeshSpec>,
    pub mesh_order: Vec<String>,
    pub pipeline_axis: Option<String>,
    pub shard: BTreeMap<String, ShardSpec>,
    pub stages: BTreeMap<String, Stage>,
    pub exchange: Option<ExchangeMode>,
    pub exchange_costs: Option<ExchangeCosts>,
    pub local_reads: Option<LocalReads>,
    pub devices_per_process: Option<usize>,
}

/// A validated job: what to load and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub data: Vec<PathBuf>,
    pub dataset: DatasetOptions,
    pub loader: LoaderOptions,
    pub epochs: u64,
    pub transport: TransportKind,
}

impl Job {
    /// What defines the job beyond the loader's options, as (name, value) pairs of text,
    /// for checking that all ranks were given the same ([`LoaderOptions::settings`] holds
    /// the loader's; a `Loader` checks those itself).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let data: Vec<String> = self.data.iter().map(|p| p.display().to_string()).collect();
        vec![
            ("data", data.join(", ")),
            ("group", self.dataset.hdf5_group.clone().unwrap_or_default()),
            ("epochs", self.epochs.to_string()),
            ("transport", self.transport.to_string()),
        ]
    }
}

impl JobFile {
    /// Every key a job file may hold, sorted: what the CLI flags, the Python keyword
    /// arguments and the documentation's option table are checked against.
    pub fn keys() -> Vec<String> {
        match serde_json::to_value(JobFile::default()) {
            Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
            _ => unreachable!("a job file serialises to an object"),
        }
    }

    /// Makes relative dataset and spill paths relative to `base` (the job file's directory).
    pub fn relative_to(mut self, base: &Path) -> JobFile {
        let rebase = |p: PathBuf| if p.is_relative() { base.join(p) } else { p };
        self.data = self.data.into_iter().map(rebase).collect();
        self.spill_dir = self.spill_dir.map(rebase);
        self
    }

    /// Checks what can be checked without the dataset and the world, fills in defaults.
    pub fn into_job(self) -> Result<Job> {
        if self.data.is_empty() {
            return Err(Error::Config("no dataset given (--data PATH... or data = [...] in the job file)".into()));
        }
        let batch_size = self
            .batch_size
            .ok_or_else(|| Error::Config("no batch size given (--batch-size or batch_size in the job file)".into()))?;
        if batch_size == 0 {
            return Err(Error::Config("batch size must be at least 1".into()));
        }
        let epochs = self.epochs.unwrap_or(1);
        let devices_per_process = self.devices_per_process.unwrap_or(1);
        if devices_per_process == 0 {
            return Err(Error::Config("devices_per_process must be at least 1".into()));
        }
        let queue_depth = self.read_queue_depth.unwrap_or(DEFAULT_READ_QUEUE_DEPTH);
        if !(1..=1024).contains(&queue_depth) {
            return Err(Error::Config(format!("read_queue_depth {queue_depth}: expected 1 to 1024 reads in flight")));
        }
        if self.storage_bandwidth.is_some_and(|b| b.0 == 0) || self.storage_iops == Some(0) {
            return Err(Error::Config("storage_bandwidth and storage_iops must be positive".into()));
        }
        Ok(Job {
            data: self.data,
            dataset: DatasetOptions { hdf5_group: self.group },
            loader: LoaderOptions {
                batch_size,
                seed: self.seed.unwrap_or(0),
                window_bytes: self.window_bytes.map_or(DEFAULT_WINDOW_BYTES, |b| b.0),
                prefetch: self.prefetch.unwrap_or(DEFAULT_PREFETCH),
                layout: Layout {
                    mesh: self.mesh,
                    mesh_order: self.mesh_order,
                    pipeline_axis: self.pipeline_axis,
                    shard: self.shard,
                    stages: self.stages,
                    exchange: self.exchange.unwrap_or_default(),
                    exchange_costs: self.exchange_costs.unwrap_or_default(),
                    devices_per_process,
                },
                tail: self.tail.unwrap_or_default(),
                read: ReadOptions {
                    strategy: self.read_strategy.unwrap_or_default(),
                    memory_budget: self.memory_budget.map(|b| b.0),
                    storage_bandwidth: self.storage_bandwidth.map(|b| b.0),
                    storage_iops: self.storage_iops,
                    spill_dir: self.spill_dir,
                    queue_depth,
                },
                local_reads: self.local_reads.unwrap_or_default(),
            },
            epochs,
            transport: self.transport.unwrap_or_default(),
        })
    }
}

/// Checks a `NAME=VALUE` pair (as `--shard x=dp,tp` gives) and parses the value.
pub fn parse_pair<T: FromStr<Err = Error>>(s: &str) -> Result<(String, T)> {
    let (k, v) = s
        .split_once('=')
        .map(|(k, v)| (k.trim(), v.trim()))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .ok_or_else(|| Error::Config(format!("'{s}': expected FIELD=VALUE")))?;
    Ok((k.to_string(), v.parse()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_costs_parse_and_print() {
        let c: ExchangeCosts = "latency=2e-5, intra=5e9,inter=1.5e8".parse().unwrap();
        assert_eq!(
            c,
            ExchangeCosts { latency_ns: 20_000, intra_bytes_per_s: 5_000_000_000, inter_bytes_per_s: 150_000_000 }
        );
        assert_eq!(c.to_string().parse::<ExchangeCosts>().unwrap(), c);
        // Keys left out keep their defaults.
        let d: ExchangeCosts = "inter=1e9".parse().unwrap();
        assert_eq!((d.inter_bytes_per_s, d.latency_ns), (1_000_000_000, ExchangeCosts::default().latency_ns));
        let err = |s: &str| s.parse::<ExchangeCosts>().unwrap_err().to_string();
        assert!(err("speed=3").contains("unknown key 'speed'"));
        assert!(err("inter=-1").contains("'-1' is not a positive number"));
        assert!(err("inter").contains("'inter' is not key=value"));
        assert!(err("").contains("no key given"));
        // In a job file, as a string.
        let f: JobFile = serde_json::from_str(r#"{"exchange_costs": "inter=2e9"}"#).unwrap();
        assert_eq!(f.exchange_costs.unwrap().inter_bytes_per_s, 2_000_000_000);
    }

    #[test]
    fn byte_sizes() {
        let p = |s: &str| s.parse::<ByteSize>().map(|b| b.0);
        assert_eq!(p("65536").unwrap(), 65536);
        assert_eq!(p("64M").unwrap(), 64 << 20);
        assert_eq!(p("2g").unwrap(), 2 << 30);
        assert!(p("12Q").unwrap_err().to_string().contains("unknown size suffix"));
        assert!(p("M").is_err());
        assert!(p("99999999999T").is_err());
    }

    #[test]
    fn meshes_parse_and_print() {
        let m: MeshSpec = "dp=2, tp=2,pp=2".parse().unwrap();
        assert_eq!((m.to_string(), m.devices()), ("dp=2,tp=2,pp=2".to_string(), 8));
        for (spec, why) in [
            ("dp", "not name=size"),
            ("dp=0", "bad size"),
            ("dp=2,dp=2", "appears twice"),
            ("d p=2", "bad axis name"),
            ("dp=3,tp=12297829382473034411", "overflows"),
        ] {
            let e = spec.parse::<MeshSpec>().unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(spec), "{spec}: {e}");
        }
    }

    #[test]
    fn shard_specs_parse_and_print() {
        let s: ShardSpec = "dp+fsdp, -,tp".parse().unwrap();
        assert_eq!(s.dims, vec![vec!["dp".to_string(), "fsdp".to_string()], vec![], vec!["tp".to_string()]]);
        assert_eq!(s.to_string(), "dp+fsdp,-,tp");
        assert!("dp,t p".parse::<ShardSpec>().unwrap_err().to_string().contains("bad axis name 't p'"));
        assert!("dp+".parse::<ShardSpec>().is_err());
    }

    #[test]
    fn enums_name_what_they_accept() {
        assert_eq!("two-phase".parse::<ExchangeMode>().unwrap(), ExchangeMode::TwoPhase);
        assert_eq!(TailPolicy::Partial.to_string(), "partial");
        let e = "middle".parse::<Stage>().unwrap_err().to_string();
        assert!(e.contains("stage 'middle': expected first, last or all"), "{e}");
        let e = "magic".parse::<ExchangeMode>().unwrap_err().to_string();
        assert!(e.contains("expected auto, fused, two-phase or broadcast"), "{e}");
    }

    #[test]
    fn pairs() {
        let (k, v): (String, Stage) = parse_pair("y = last").unwrap();
        assert_eq!((k.as_str(), v), ("y", Stage::Last));
        assert!(parse_pair::<Stage>("y").unwrap_err().to_string().contains("expected FIELD=VALUE"));
        assert!(parse_pair::<Stage>("y=middle").is_err());
    }

    #[test]
    fn settings_name_every_option() {
        let mut o = LoaderOptions::default();
        o.layout.shard.insert("x".into(), "dp,tp".parse().unwrap());
        o.layout.shard.insert("y".into(), "dp".parse().unwrap());
        let s = o.settings();
        let get = |n: &str| s.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_str()).unwrap();
        assert_eq!(
            (get("batch_size"), get("mesh"), get("shard"), get("tail")),
            ("32", "dp=<ranks>", "x=dp,tp; y=dp", "drop")
        );
        assert_eq!((get("local_reads"), get("devices_per_process")), ("auto", "1"));
        assert_eq!(get("exchange_costs"), ExchangeCosts::default().to_string());
        assert_eq!((get("read_strategy"), get("memory_budget"), get("read_queue_depth")), ("auto", "auto", "16"));
        assert_eq!(s.len(), 20);
        let other = LoaderOptions { seed: 9, ..LoaderOptions::default() };
        assert_ne!(other.settings(), LoaderOptions::default().settings());
    }

    #[test]
    fn job_file_keys_are_its_fields() {
        let keys = JobFile::keys();
        assert_eq!(keys.len(), 24, "{keys:?}");
        for k in ["batch_size", "data", "mesh_order", "read_strategy", "shard", "transport"] {
            assert!(keys.iter().any(|x| x == k), "{k} missing from {keys:?}");
        }
    }

    #[test]
    fn job_files_fill_defaults_and_refuse_gaps() {
        let f = JobFile { data: vec!["d".into()], batch_size: Some(8), ..Default::default() };
        assert_eq!(f.clone().into_job().unwrap().loader.layout.devices_per_process, 1);
        let zero = JobFile { devices_per_process: Some(0), ..f.clone() };
        assert!(zero.into_job().unwrap_err().to_string().contains("devices_per_process must be at least 1"));
        let job = f.clone().relative_to(Path::new("/jobs")).into_job().unwrap();
        assert_eq!(job.data, vec![PathBuf::from("/jobs/d")]);
        assert_eq!((job.epochs, job.loader.prefetch, job.loader.window_bytes), (1, 2, 64 << 20));
        let e = JobFile { batch_size: None, ..f.clone() }.into_job().unwrap_err().to_string();
        assert!(e.contains("no batch size given"), "{e}");
        let e = JobFile { data: vec![], ..f }.into_job().unwrap_err().to_string();
        assert!(e.contains("no dataset given"), "{e}");
    }
}
