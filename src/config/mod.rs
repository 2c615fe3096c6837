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

/// Implements `TryFrom<String>` and `From<T> for String` by the type's `FromStr` and
/// `Display`: what `#[serde(try_from = "String", into = "String")]` asks of a type that is
/// written as text. Defined before the submodules so that they see it.
macro_rules! string_conversions {
    ($t:ty) => {
        impl TryFrom<String> for $t {
            type Error = $crate::error::Error;
            fn try_from(s: String) -> $crate::error::Result<$t> {
                s.parse()
            }
        }

        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
    };
}
pub(crate) use string_conversions;

mod dataset;
mod defaults;
mod order;
mod pack;

use crate::error::{Error, ErrorKind, Result, ResultExt};
pub use dataset::{DatasetOptions, NullPolicy, MIN_DECODE_LIMIT};
pub use defaults::{DEFAULT_PREFETCH, DEFAULT_WINDOW_BYTES};
pub use order::SharedOrder;
pub use pack::{PackSpec, PositionIds, CU_SEQLENS, POSITION_IDS};

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
    if meta.is_dir() {
        // Opening a directory read-only succeeds; reading it is what fails, and how.
        return Err(Error::io(path, std::io::Error::from_raw_os_error(libc::EISDIR)));
    }
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

string_conversions!(MeshSpec);

impl fmt::Display for MeshSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.axes.iter().map(|a| format!("{}={}", a.name, a.size)).collect();
        f.write_str(&parts.join(","))
    }
}

/// A sharding spec in the spirit of JAX `PartitionSpec`, as written: for each dimension
/// of a field's batch array `[batch, *shape]`, the mesh axes that split it (`dp+fsdp` is a
/// tuple of axes) or none (`-`). `dp,-,tp` splits the batch over `dp` and dimension 2
/// over `tp`. Omitted trailing dimensions are not split. `zigzag:cp` splits a dimension
/// over `cp` in the load-balanced layout of context parallelism: `2·size(cp)` chunks, the
/// rank at coordinate `i` holding chunks `i` and `2·size(cp) − 1 − i`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ShardSpec {
    pub dims: Vec<Vec<String>>,
    /// Per dimension, whether it is split zigzag (as long as `dims`).
    pub zigzag: Vec<bool>,
}

impl FromStr for ShardSpec {
    type Err = Error;

    fn from_str(spec: &str) -> Result<ShardSpec> {
        let (mut dims, mut zigzag) = (Vec::new(), Vec::new());
        for d in spec.split(',').map(str::trim) {
            let (d, zz) = match d.strip_prefix("zigzag:") {
                Some(axes) => (axes.trim(), true),
                None => (d, false),
            };
            zigzag.push(zz);
            if d == "-" || d.is_empty() {
                if zz {
                    return Err(Error::Config(format!(
                        "sharding spec '{spec}': zigzag names no axis (e.g. zigzag:cp)"
                    )));
                }
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
        Ok(ShardSpec { dims, zigzag })
    }
}

string_conversions!(ShardSpec);

impl fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self
            .dims
            .iter()
            .zip(&self.zigzag)
            .map(|(axes, &zz)| match (axes.is_empty(), zz) {
                (true, _) => "-".to_string(),
                (false, true) => format!("zigzag:{}", axes.join("+")),
                (false, false) => axes.join("+"),
            })
            .collect();
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
    /// Whether home ranges follow the ranks' measured read speeds: at each epoch's first
    /// window the ranks agree on new lengths from the last epoch's reads, so that a slow
    /// reader reads less. Who reads a sample never changes the stream.
    Balance, "balance" {
        /// Where nothing of a home range is kept across epochs (the `random` read
        /// strategy with nothing resident, no spill file), the rows cross the exchange
        /// (fused), and there are several ranks; elsewhere the ranges stay equal.
        Auto => "auto",
        /// Equal home ranges, always.
        Off => "off",
    }
);

impl Default for Balance {
    fn default() -> Self {
        Balance::Auto
    }
}

named_enum!(
    /// Whether the loader tunes its window length, prefetch depth and reads in flight as
    /// it runs ([`crate::plan::tune`]): from the consumer's measured waiting and each
    /// window's cost, agreed with each window, so every rank changes at the same window.
    /// The given `window_bytes`, `prefetch` and `read_queue_depth` are where it starts.
    Tune, "tune" {
        /// Tuned as the loader runs, within the memory ceiling of the larger of the given
        /// and the default window settings.
        Auto => "auto",
        /// The settings as given, always.
        Off => "off",
    }
);

impl Default for Tune {
    fn default() -> Self {
        Tune::Off
    }
}

named_enum!(
    /// How ranks read their home ranges from storage ([`crate::plan::io`]).
    ReadStrategy, "read strategy" {
        /// The cheapest that fits the memory budget, by the storage's measured speed.
        Auto => "auto",
        /// Each rank streams its home range once into memory; later epochs read nothing.
        Resident => "resident",
        /// Each epoch streams the home range K times, keeping a K-th of it at a time (with
        /// a spill directory: streamed there once, and the passes read the spill files).
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
    #[serde(rename = "read_strategy")]
    pub strategy: ReadStrategy,
    /// Bytes the ranks of one host may hold for data together (resident rows, pass
    /// buffers); `None`: from the cgroup memory limit or the available memory.
    pub memory_budget: Option<u64>,
    /// The storage's sequential bandwidth per host, bytes/s (`None`: probed when needed).
    pub storage_bandwidth: Option<u64>,
    /// The storage's random reads per second per host (`None`: probed when needed).
    pub storage_iops: Option<u64>,
    /// Node-local directory to spill what does not fit in memory to.
    #[serde(serialize_with = "lossy_path")]
    pub spill_dir: Option<PathBuf>,
    /// Reads in flight per rank when reading at random.
    #[serde(rename = "read_queue_depth")]
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
        /// The launcher's: MPI under an MPI launcher (mpirun, srun with an MPI plugin), the
        /// TCP rendezvous + UCX where `WORLD_SIZE`/`RANK` are set without one (torchrun,
        /// `meshfeed launch`, Ray, Kubernetes), one process alone otherwise
        /// ([`crate::runtime::choose_transport`], issue 42).
        Auto => "auto",
        /// MPI (launch with mpirun or srun).
        Mpi => "mpi",
        /// UCX, bootstrapped by the TCP rendezvous (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
        /// `MASTER_PORT`, `MESHFEED_JOB_TOKEN`): Ray, Kubernetes, `meshfeed launch`.
        Ucx => "ucx",
    }
);

impl Default for TransportKind {
    /// The launcher's transport: defaulting to MPI made each process of a torchrun or
    /// `meshfeed launch` job a world of its own, each loading every batch (issue 42).
    fn default() -> Self {
        TransportKind::Auto
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

string_conversions!(ExchangeCosts);

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

/// How a loader batches, shuffles, places and pipelines data.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderOptions {
    /// Global batch size `B`.
    pub batch_size: usize,
    /// Seed of the permutation.
    pub seed: u64,
    /// The sweep's shared order this job's order is derived from, if it opted into one
    /// ([`SharedOrder`]).
    #[serde(default)]
    pub shared_order: Option<SharedOrder>,
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
    /// Whether home ranges follow the ranks' measured read speeds.
    #[serde(default)]
    pub balance: Balance,
    /// Whether the window length, prefetch depth and reads in flight are tuned as the
    /// loader runs.
    #[serde(default)]
    pub tune: Tune,
}

impl LoaderOptions {
    /// Every option as a (job-file key, value) pair of text, so that ranks can check they
    /// were all given the same ([`crate::transport::agree_settings`]). Derived from the
    /// options' serde form, so that no option can be left out of the agreement: a nested
    /// struct's fields are named by their job-file keys (a test checks every name is one);
    /// a value not given reads as what it means (`dp=<ranks>`, `auto`, `probe`) or empty.
    pub fn settings(&self) -> Vec<(String, String)> {
        let value = serde_json::to_value(self).expect("loader options serialise (paths lossily)");
        let keys = JobFile::keys();
        let mut out = Vec::new();
        flatten_settings(&value, &keys, &mut out);
        out
    }
}

/// The leaves of `value` as (key, text): objects whose key is a job-file key (a field
/// table such as `shard`) are leaves (`x=dp,tp; y=dp`), other objects are descended into.
fn flatten_settings(value: &serde_json::Value, keys: &[String], out: &mut Vec<(String, String)>) {
    use serde_json::Value;
    let text = |v: &Value| match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let Value::Object(map) = value else { return };
    for (key, v) in map {
        match v {
            Value::Object(_) if !keys.contains(key) => flatten_settings(v, keys, out),
            Value::Object(fields) => {
                let pairs: Vec<String> = fields.iter().map(|(f, s)| format!("{f}={}", text(s))).collect();
                out.push((key.clone(), pairs.join("; ")));
            }
            Value::Array(items) => out.push((key.clone(), items.iter().map(text).collect::<Vec<_>>().join(","))),
            Value::Null => out.push((key.clone(), not_given(key).to_string())),
            v => out.push((key.clone(), text(v))),
        }
    }
}

/// What an option not given means, as the settings agreement names it (empty: nothing).
fn not_given(key: &str) -> &'static str {
    match key {
        "mesh" => "dp=<ranks>",
        "memory_budget" => "auto",
        "storage_bandwidth" | "storage_iops" => "probe",
        _ => "",
    }
}

/// Serialises a path as text, lossily (the settings agreement compares what it prints).
fn lossy_path<S: serde::Serializer>(p: &Option<PathBuf>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match p {
        Some(p) => s.serialize_some(&p.to_string_lossy()),
        None => s.serialize_none(),
    }
}

impl Default for LoaderOptions {
    fn default() -> Self {
        LoaderOptions {
            batch_size: 32,
            seed: 0,
            shared_order: None,
            window_bytes: DEFAULT_WINDOW_BYTES,
            prefetch: DEFAULT_PREFETCH,
            layout: Layout::default(),
            tail: TailPolicy::Drop,
            read: ReadOptions::default(),
            local_reads: LocalReads::Auto,
            balance: Balance::Auto,
            tune: Tune::Off,
        }
    }
}

/// The headings the command line's `--help` groups options under (clap's `help_heading`),
/// shared by the job description's flags and the commands' own.
#[cfg(feature = "clap")]
pub mod heading {
    /// What to read: the data and the job file.
    pub const DATA: &str = "Data";
    /// The stream: batch, epochs, order, tail.
    pub const BATCHES: &str = "Batches and epochs";
    /// Who receives what: mesh, sharding, stages.
    pub const MESH: &str = "Mesh and placement";
    /// How ranks read and what they hold.
    pub const READING: &str = "Reading and memory";
    /// How ranks talk and exchange.
    pub const TRANSPORT: &str = "Transport and exchange";
    /// Checking the stream, and what is printed or written.
    pub const OUTPUT: &str = "Checking and output";
    /// Stopping and resuming a stream.
    pub const RESUMPTION: &str = "Resumption";
}

/// The job description: every option of a job, declared once. A job file's keys (TOML),
/// the command line's flags (`--batch-size` for `batch_size`, derived from this struct
/// with the `clap` feature, the field docs as help: the first paragraph is `-h`'s line,
/// the whole `--help`'s text), the Python package's keyword arguments and the
/// documentation's option table are these fields (tests fail when one drifts:
/// [`JobFile::keys`]); the loader's options reach the cross-rank settings agreement from
/// their serde form ([`LoaderOptions::settings`]). Every key is optional; an edge overlays
/// its own flags ([`JobFile::overlay`]) and calls [`JobFile::into_job`]. Options a first
/// run rarely needs are `hide_short_help`: listed by `--help`, not by `-h`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct JobFile {
    /// Dataset files or directories.
    ///
    /// A directory stands for its supported files and its subdirectories', in path order.
    #[cfg_attr(feature = "clap", arg(long, num_args = 1.., value_name = "PATH", help_heading = heading::DATA))]
    pub data: Vec<PathBuf>,
    /// HDF5 group that holds the datasets [default: the file root].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "GROUP", help_heading = heading::DATA, hide_short_help = true)
    )]
    pub group: Option<String>,
    /// Only these fields, in this order (comma-separated) [default: every field].
    ///
    /// Formats that store fields apart (HDF5, Arrow) read only these.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', num_args = 1.., value_name = "NAME", help_heading = heading::DATA)
    )]
    pub fields: Option<Vec<String>>,
    /// Deliver an Arrow or Parquet column's nulls: FIELD=mask or FIELD=fill:VALUE.
    ///
    /// mask delivers zeros and a field FIELD_valid of u8 per row (1 present, 0 null) right
    /// after the field; fill:VALUE delivers VALUE [default: nulls in a delivered field are
    /// an error].
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_name = "FIELD=mask|fill:VALUE",
            value_parser = parse_pair::<NullPolicy>,
            help_heading = heading::DATA,
            hide_short_help = true
        )
    )]
    #[serde(with = "field_map")]
    pub nulls: Vec<(String, NullPolicy)>,
    /// Pack a token field's documents into samples of SEQ_LEN.
    ///
    /// Each sample holds SEQ_LEN inputs and their labels:
    /// `FIELD:SEQ_LEN[,eos=ID][,position_ids[=document]][,cu_seqlens]` [default: no packing].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "SPEC", help_heading = heading::DATA, hide_short_help = true)
    )]
    pub pack: Option<PackSpec>,
    /// Global batch size B.
    ///
    /// B must be divisible by the batch dimension's split.
    #[cfg_attr(feature = "clap", arg(long, value_name = "B", help_heading = heading::BATCHES))]
    pub batch_size: Option<usize>,
    /// Number of epochs [default: 1].
    #[cfg_attr(feature = "clap", arg(long, value_name = "E", help_heading = heading::BATCHES))]
    pub epochs: Option<u64>,
    /// Seed of the shuffle [default: 0].
    #[cfg_attr(feature = "clap", arg(long, value_name = "S", help_heading = heading::BATCHES))]
    pub seed: Option<u64>,
    /// Derive the order from a sweep's common SEED, blockwise.
    ///
    /// For jobs of a sweep reading one feeder whose memory cannot hold the data: this
    /// job's order is the sweep's common SEED's, reordered by --seed only within blocks of
    /// N positions, so that the jobs ask for the same rows at about the same time and the
    /// feeder reads each from storage once for all. Each job's order is still a uniform
    /// random permutation of every epoch: `SEED` or `SEED,block=N` [default: the job's own
    /// order; N: 1024].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "SEED[,block=N]", help_heading = heading::BATCHES, hide_short_help = true)
    )]
    pub shared_order: Option<SharedOrder>,
    /// Exchange buffers per rank and window [default: 64M].
    ///
    /// The budget of one exchange window's buffers per rank (K/M/G suffixes); memory stays
    /// within (prefetch + 1) × this.
    #[cfg_attr(feature = "clap", arg(long, value_name = "BYTES", help_heading = heading::READING))]
    pub window_bytes: Option<ByteSize>,
    /// Windows the producer runs ahead [default: 2].
    ///
    /// The background producer runs this many windows ahead of the consumer; 0: no
    /// producer thread, each window is made when asked for.
    #[cfg_attr(feature = "clap", arg(long, value_name = "N", help_heading = heading::READING))]
    pub prefetch: Option<usize>,
    /// How ranks read their home ranges [default: auto].
    ///
    /// auto: resident when the data fits the memory budget, else the cheaper of passes and
    /// random by the storage's speed; resident: stream once, keep in memory; passes: K
    /// sequential passes per epoch; random: keep what fits, read the rest where needed.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_parser = named::<ReadStrategy>(), help_heading = heading::READING, hide_short_help = true)
    )]
    pub read_strategy: Option<ReadStrategy>,
    /// Memory the ranks of one host may hold for data.
    ///
    /// The ranks of a host together (K/M/G) [default: 3/4 of the cgroup limit's or the
    /// host's headroom, less the pipelines].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "BYTES", help_heading = heading::READING, hide_short_help = true)
    )]
    pub memory_budget: Option<ByteSize>,
    /// The storage's sequential bandwidth per host in bytes/s (K/M/G).
    ///
    /// [default: probed when the choice depends on it]
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "BYTES", help_heading = heading::READING, hide_short_help = true)
    )]
    pub storage_bandwidth: Option<ByteSize>,
    /// The storage's random reads per second per host [default: probed when needed].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "READS", help_heading = heading::READING, hide_short_help = true)
    )]
    pub storage_iops: Option<u64>,
    /// Node-local directory for what does not fit in memory.
    ///
    /// Node-local scratch (NVMe) where what does not fit in memory is streamed once and
    /// read back from.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "DIR", help_heading = heading::READING, hide_short_help = true)
    )]
    pub spill_dir: Option<PathBuf>,
    /// Reads in flight per rank when reading samples at random [default: 16].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "N", help_heading = heading::READING, hide_short_help = true)
    )]
    pub read_queue_depth: Option<usize>,
    /// The last, incomplete batch of an epoch [default: drop].
    ///
    /// drop it, pad it (with the epoch's first samples) or deliver it partial (a short
    /// batch).
    #[cfg_attr(
        feature = "clap",
        arg(long, value_parser = named::<TailPolicy>(), help_heading = heading::BATCHES, hide_short_help = true)
    )]
    pub tail: Option<TailPolicy>,
    /// How the ranks talk [default: auto, the launcher's].
    ///
    /// auto: mpi under mpirun/srun, ucx where WORLD_SIZE/RANK are set without an MPI
    /// launcher, one process alone otherwise; mpi: launch with mpirun/srun; ucx: launch
    /// with `meshfeed launch`, torchrun, Ray or Kubernetes (RANK, WORLD_SIZE, MASTER_ADDR,
    /// MASTER_PORT, MESHFEED_JOB_TOKEN).
    #[cfg_attr(
        feature = "clap",
        arg(long, value_parser = named::<TransportKind>(), help_heading = heading::TRANSPORT)
    )]
    pub transport: Option<TransportKind>,
    /// Device mesh, e.g. dp=2,tp=2,pp=2 [default: dp over all ranks].
    ///
    /// The product of the sizes is the number of devices (ranks × --devices-per-process).
    #[cfg_attr(feature = "clap", arg(long, value_name = "AXIS=SIZE,...", help_heading = heading::MESH))]
    pub mesh: Option<MeshSpec>,
    /// Mesh axes from slowest to fastest varying in the rank numbering [default: as written].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', value_name = "AXES", help_heading = heading::MESH, hide_short_help = true)
    )]
    pub mesh_order: Vec<String>,
    /// The pipeline axis [default: pp].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "AXIS", help_heading = heading::MESH, hide_short_help = true)
    )]
    pub pipeline_axis: Option<String>,
    /// Sharding of a field, per dimension of [batch, *shape].
    ///
    /// Per dimension: a mesh axis, axes joined by +, - (whole), or zigzag:AXIS (context
    /// parallelism: chunks i and 2·size−1−i of 2·size), joined by commas.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "FIELD=SPEC", value_parser = parse_pair::<ShardSpec>, help_heading = heading::MESH)
    )]
    #[serde(with = "field_map")]
    pub shard: Vec<(String, ShardSpec)>,
    /// Pipeline stages that receive a field.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "FIELD=first|last|all", value_parser = parse_pair::<Stage>, help_heading = heading::MESH)
    )]
    #[serde(with = "field_map")]
    pub stages: Vec<(String, Stage)>,
    /// Exchange algorithm [default: auto].
    ///
    /// auto: the cheaper of fused and two-phase by the cost model; broadcast: the
    /// single-loader baseline.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_parser = named::<ExchangeMode>(), help_heading = heading::TRANSPORT, hide_short_help = true)
    )]
    pub exchange: Option<ExchangeMode>,
    /// The all-to-all costs `--exchange auto` decides with.
    ///
    /// The latency per peer (s), the bandwidth of a rank on its host and of a host's link
    /// (bytes/s), e.g.
    /// latency=5e-6,intra=1e10,inter=1.2e9 (`meshfeed report --predict` fits them)
    /// [default: measured here, see docs/meshes.md on the exchange].
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_name = "latency=S,intra=B/S,inter=B/S",
            help_heading = heading::TRANSPORT,
            hide_short_help = true
        )
    )]
    pub exchange_costs: Option<ExchangeCosts>,
    /// Same-host rows read from the files, not exchanged [default: auto].
    ///
    /// Ranks on one host read the rows they receive from each other's home ranges straight
    /// from the files (the page cache they share) instead of exchanging them: auto (npy, raw
    /// and fixed-size Arrow samples of 1 KiB and more, fused exchange) or off.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_parser = named::<LocalReads>(), help_heading = heading::READING, hide_short_help = true)
    )]
    pub local_reads: Option<LocalReads>,
    /// Home ranges follow the ranks' read speeds [default: auto].
    ///
    /// The lengths are agreed at each epoch's first window from each rank's measured read
    /// speed (a slow reader reads less; the stream is unchanged): auto (where nothing is
    /// kept across epochs and rows are exchanged fused) or off.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_parser = named::<Balance>(), help_heading = heading::READING, hide_short_help = true)
    )]
    pub balance: Option<Balance>,
    /// Tune windows, prefetch and reads in flight as the job runs [default: off].
    ///
    /// The window length, prefetch depth and reads in flight follow the waiting measured
    /// (every rank changes at the same window; the given settings are the start, the
    /// larger of them and the defaults the memory ceiling): auto or off.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_parser = named::<Tune>(), help_heading = heading::READING, hide_short_help = true)
    )]
    pub tune: Option<Tune>,
    /// Mesh devices each rank drives [default: 1].
    ///
    /// One process per host with several devices, as JAX runs: the mesh has ranks × K
    /// devices and a rank receives the union of its devices' shards.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "K", help_heading = heading::MESH, hide_short_help = true)
    )]
    pub devices_per_process: Option<usize>,
    /// Write per-rank telemetry here, for `meshfeed report`.
    ///
    /// `rank-<r>.jsonl` (a JSON line per window: time per
    /// phase, waiting for the slowest peer, bytes, and each step's waiting for data and
    /// training time; and one per epoch: host, time per phase, waiting, bytes, peak
    /// memory) and `run.json` (the configuration), for `meshfeed report`.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "DIR", help_heading = heading::OUTPUT, hide_short_help = true)
    )]
    pub telemetry: Option<PathBuf>,
    /// Rank 0's progress line this often, in seconds (0: never).
    ///
    /// The line holds the epoch, the step, the seconds elapsed, samples per second and the
    /// part of the time spent waiting for data [default: `meshfeed run`: every 30 s on
    /// stdout where no progress bar is drawn, as text, or JSON with --json; a Python
    /// loader: never; its lines, JSON, go to stderr].
    #[cfg_attr(
        feature = "clap",
        arg(long, value_name = "SECONDS", help_heading = heading::OUTPUT, hide_short_help = true)
    )]
    pub heartbeat: Option<f64>,
}

/// A value parser that lists the names an enum accepts (in `--help` and errors).
#[cfg(feature = "clap")]
pub fn named<T: NamedValues>() -> impl clap::builder::TypedValueParser<Value = T> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(T::NAMES).try_map(|s| s.parse::<T>())
}

/// `FIELD = VALUE` pairs, written as a table (`[shard]` in TOML, a dict in Python) and
/// held in the order given (a later pair for a field overrides an earlier one).
mod field_map {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(pairs: &[(String, T)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<Vec<(String, T)>, D::Error> {
        Ok(BTreeMap::<String, T>::deserialize(d)?.into_iter().collect())
    }
}

/// A validated job: what to load and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub data: Vec<PathBuf>,
    pub dataset: DatasetOptions,
    pub loader: LoaderOptions,
    pub epochs: u64,
    pub transport: TransportKind,
    /// Where the loader writes its telemetry ([`crate::loader::Loader::record_telemetry`]).
    pub telemetry: Option<PathBuf>,
    /// Seconds between rank 0's heartbeat lines ([`crate::loader::Loader::heartbeat`]);
    /// `None`: the program's default (`meshfeed run`: every 30 s where no progress bar is
    /// shown; a Python job: never); 0: never.
    pub heartbeat: Option<f64>,
}

impl Job {
    /// What defines the job beyond the loader's options, as (name, value) pairs of text,
    /// for checking that all ranks were given the same ([`LoaderOptions::settings`] holds
    /// the loader's; a `Loader` checks those itself).
    pub fn settings(&self) -> Vec<(String, String)> {
        let data: Vec<String> = self.data.iter().map(|p| p.display().to_string()).collect();
        [
            ("data", data.join(", ")),
            ("group", self.dataset.hdf5_group.clone().unwrap_or_default()),
            ("fields", self.dataset.fields.as_ref().map(|f| f.join(",")).unwrap_or_default()),
            ("nulls", self.dataset.nulls.iter().map(|(f, p)| format!("{f}={p}")).collect::<Vec<_>>().join("; ")),
            ("pack", self.dataset.pack.as_ref().map(ToString::to_string).unwrap_or_default()),
            ("epochs", self.epochs.to_string()),
            ("transport", self.transport.to_string()),
            ("telemetry", self.telemetry.as_ref().map(|p| p.display().to_string()).unwrap_or_default()),
            ("heartbeat", self.heartbeat.map(|h| h.to_string()).unwrap_or_default()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

impl JobFile {
    /// Every key a job file may hold, sorted: what the CLI flags, the Python keyword
    /// arguments and the documentation's option table are checked against.
    pub fn keys() -> Vec<String> {
        let mut keys: Vec<String> = match serde_json::to_value(JobFile::default()) {
            Ok(serde_json::Value::Object(map)) => map.keys().cloned().collect(),
            _ => unreachable!("a job file serialises to an object"),
        };
        // Sorted whatever order serde_json's map keeps (`preserve_order` keeps the fields').
        keys.sort();
        keys
    }

    /// This job with the keys `flags` gives put over it (a command line's flags over its
    /// job file): a value or a list given replaces the job's, and field tables (`shard`,
    /// `stages`) are merged field by field, the flags' winning.
    pub fn overlay(mut self, mut flags: JobFile) -> Result<JobFile> {
        use serde_json::Value;
        // Paths go around the serde form (JSON text cannot hold a path that is not UTF-8).
        let data = std::mem::take(&mut self.data);
        let (spill_dir, telemetry) = (self.spill_dir.take(), self.telemetry.take());
        let (flag_data, flag_spill_dir) = (std::mem::take(&mut flags.data), flags.spill_dir.take());
        let flag_telemetry = flags.telemetry.take();
        let object = |f: &JobFile| match serde_json::to_value(f) {
            Ok(Value::Object(map)) => map,
            _ => unreachable!("a job file without its paths serialises to an object"),
        };
        let mut merged = object(&self);
        for (key, value) in object(&flags) {
            match value {
                Value::Null => {}
                Value::Array(items) if items.is_empty() => {}
                Value::Object(fields) => match merged.get_mut(&key) {
                    Some(Value::Object(base)) => base.extend(fields),
                    _ => drop(merged.insert(key, Value::Object(fields))),
                },
                value => drop(merged.insert(key, value)),
            }
        }
        let mut job: JobFile = serde_json::from_value(Value::Object(merged))
            .context(ErrorKind::Internal, "a job's own values do not parse back")?;
        job.data = if flag_data.is_empty() { data } else { flag_data };
        job.spill_dir = flag_spill_dir.or(spill_dir);
        job.telemetry = flag_telemetry.or(telemetry);
        Ok(job)
    }

    /// Makes relative dataset, spill and telemetry paths relative to `base` (the job file's
    /// directory).
    pub fn relative_to(mut self, base: &Path) -> JobFile {
        let rebase = |p: PathBuf| if p.is_relative() { base.join(p) } else { p };
        self.data = self.data.into_iter().map(rebase).collect();
        self.spill_dir = self.spill_dir.map(rebase);
        self.telemetry = self.telemetry.map(rebase);
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
        if let Some(h) = self.heartbeat.filter(|h| !(h.is_finite() && *h >= 0.0)) {
            return Err(Error::Config(format!("heartbeat {h}: expected a non-negative number of seconds")));
        }
        if self.storage_bandwidth.is_some_and(|b| b.0 == 0) || self.storage_iops == Some(0) {
            return Err(Error::Config("storage_bandwidth and storage_iops must be positive".into()));
        }
        let window_bytes = self.window_bytes.map_or(DEFAULT_WINDOW_BYTES, |b| b.0);
        Ok(Job {
            data: self.data,
            dataset: DatasetOptions {
                hdf5_group: self.group,
                fields: self.fields,
                pack: self.pack,
                // A reader decodes no more than a window at once (a Parquet page).
                decode_limit: Some(window_bytes),
                nulls: self.nulls.into_iter().collect(),
            },
            loader: LoaderOptions {
                batch_size,
                seed: self.seed.unwrap_or(0),
                shared_order: self.shared_order,
                window_bytes,
                prefetch: self.prefetch.unwrap_or(DEFAULT_PREFETCH),
                layout: Layout {
                    mesh: self.mesh,
                    mesh_order: self.mesh_order,
                    pipeline_axis: self.pipeline_axis,
                    shard: self.shard.into_iter().collect(),
                    stages: self.stages.into_iter().collect(),
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
                balance: self.balance.unwrap_or_default(),
                tune: self.tune.unwrap_or_default(),
            },
            epochs,
            transport: self.transport.unwrap_or_default(),
            telemetry: self.telemetry,
            heartbeat: self.heartbeat,
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
        let s: ShardSpec = "dp, zigzag:cp+sp".parse().unwrap();
        assert_eq!((s.dims[1].len(), s.zigzag.clone()), (2, vec![false, true]));
        assert_eq!(s.to_string(), "dp,zigzag:cp+sp");
        assert!("dp,zigzag:".parse::<ShardSpec>().unwrap_err().to_string().contains("zigzag names no axis"));
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
        let get = |n: &str| s.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str()).unwrap();
        assert_eq!(
            (get("batch_size"), get("mesh"), get("shard"), get("tail")),
            ("32", "dp=<ranks>", "x=dp,tp; y=dp", "drop")
        );
        assert_eq!((get("local_reads"), get("balance"), get("devices_per_process")), ("auto", "auto", "1"));
        assert_eq!((get("tune"), get("shared_order")), ("off", ""));
        assert_eq!(get("exchange_costs"), ExchangeCosts::default().to_string());
        assert_eq!((get("read_strategy"), get("memory_budget"), get("read_queue_depth")), ("auto", "auto", "16"));
        assert_eq!(
            (get("storage_bandwidth"), get("storage_iops"), get("spill_dir"), get("pipeline_axis")),
            ("probe", "probe", "", "")
        );
        assert_eq!(s.len(), 23);
        let other = LoaderOptions { seed: 9, ..LoaderOptions::default() };
        assert_ne!(other.settings(), LoaderOptions::default().settings());
    }

    /// The agreement covers every key of the job description: the loader's settings and the
    /// job's own are, together, exactly the job file's keys (an option added to the options
    /// under another name, or to the job file only, fails here).
    #[test]
    fn settings_are_the_job_keys() {
        let job = JobFile { data: vec!["d".into()], batch_size: Some(8), ..Default::default() }.into_job().unwrap();
        let mut names: Vec<String> = job.settings().into_iter().chain(job.loader.settings()).map(|(k, _)| k).collect();
        names.sort();
        assert_eq!(names, JobFile::keys());
    }

    #[test]
    fn flags_overlay_a_job_file() {
        let file: JobFile = serde_json::from_str(
            r#"{"data": ["a"], "batch_size": 8, "seed": 3, "mesh_order": ["tp", "dp"], "shard": {"x": "dp", "y": "dp,-"},
                "memory_budget": "1G", "exchange_costs": "latency=1e-6,intra=1e9,inter=1e8"}"#,
        )
        .unwrap();
        assert_eq!(file.shard.len(), 2);
        let flags = JobFile {
            seed: Some(5),
            shard: vec![("y".into(), "dp,tp".parse().unwrap()), ("z".into(), "dp".parse().unwrap())],
            spill_dir: Some("/scratch".into()),
            ..Default::default()
        };
        let job = file.clone().overlay(flags).unwrap();
        assert_eq!((job.batch_size, job.seed, job.data.clone()), (Some(8), Some(5), vec![PathBuf::from("a")]));
        assert_eq!(
            (job.mesh_order.clone(), job.memory_budget),
            (vec!["tp".to_string(), "dp".into()], Some(ByteSize(1 << 30)))
        );
        let shard: Vec<String> = job.shard.iter().map(|(f, s)| format!("{f}={s}")).collect();
        assert_eq!(shard, ["x=dp", "y=dp,tp", "z=dp"]);
        assert_eq!((job.spill_dir, job.exchange_costs), (Some(PathBuf::from("/scratch")), file.exchange_costs));
        // Nothing given: the file as it was; a list given replaces the file's.
        assert_eq!(file.clone().overlay(JobFile::default()).unwrap(), file);
        let order = JobFile { mesh_order: vec!["dp".into()], data: vec!["b".into()], ..Default::default() };
        let job = file.overlay(order).unwrap();
        assert_eq!((job.mesh_order, job.data), (vec!["dp".to_string()], vec![PathBuf::from("b")]));
    }

    /// A path that is not UTF-8 survives the overlay (it goes around the serde form).
    #[test]
    fn overlay_keeps_paths_that_are_not_text() {
        use std::os::unix::ffi::OsStrExt;
        let odd = PathBuf::from(std::ffi::OsStr::from_bytes(b"/data/\xff.npy"));
        let file = JobFile { data: vec![odd.clone()], spill_dir: Some(odd.clone()), ..Default::default() };
        let job = file.overlay(JobFile { batch_size: Some(2), ..Default::default() }).unwrap();
        assert_eq!((job.data, job.spill_dir, job.batch_size), (vec![odd.clone()], Some(odd), Some(2)));
    }

    #[test]
    fn job_file_keys_are_its_fields() {
        let keys = JobFile::keys();
        assert_eq!(keys.len(), 32, "{keys:?}");
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
        // A heartbeat is a non-negative number of seconds; the telemetry directory is
        // relative to the job file, like the data.
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let e = JobFile { heartbeat: Some(bad), ..f.clone() }.into_job().unwrap_err().to_string();
            assert!(e.contains(&format!("heartbeat {bad}: expected a non-negative number of seconds")), "{e}");
        }
        let t = JobFile { telemetry: Some("tel".into()), heartbeat: Some(0.0), ..f.clone() };
        let job = t.relative_to(Path::new("/jobs")).into_job().unwrap();
        assert_eq!((job.telemetry, job.heartbeat), (Some(PathBuf::from("/jobs/tel")), Some(0.0)));
        let job = f.clone().relative_to(Path::new("/jobs")).into_job().unwrap();
        assert_eq!(job.data, vec![PathBuf::from("/jobs/d")]);
        assert_eq!((job.epochs, job.loader.prefetch, job.loader.window_bytes), (1, 2, 64 << 20));
        let e = JobFile { batch_size: None, ..f.clone() }.into_job().unwrap_err().to_string();
        assert!(e.contains("no batch size given"), "{e}");
        let e = JobFile { data: vec![], ..f }.into_job().unwrap_err().to_string();
        assert!(e.contains("no dataset given"), "{e}");
    }
}
