//! The job description at the edge: flags and the `--config` TOML file, merged (flags
//! win) into the library's typed [`Job`]; and the runtime a ranked command runs in.

use std::path::{Path, PathBuf};

use clap::builder::{PossibleValuesParser, TypedValueParser};
use meshfeed::config::{
    parse_pair, ByteSize, ExchangeCosts, ExchangeMode, Job, JobFile, LocalReads, MeshSpec, NamedValues, ReadStrategy,
    ShardSpec, Stage, TailPolicy, TransportKind, JOB_FILE_LIMIT,
};
use meshfeed::runtime::Runtime;
use meshfeed::{Error, Result};

use crate::input::read_small;

/// A value parser that lists the names an enum accepts (in `--help` and errors).
pub fn named<T: NamedValues>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::NAMES).try_map(|s| s.parse::<T>())
}

/// What to load and how: shared by `run` and `bench`.
#[derive(clap::Args, Debug)]
pub struct JobArgs {
    /// TOML job file: dataset, loader options, mesh, specs, stages. Flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Dataset files or directories (all supported files in a directory, in name order).
    #[arg(long, num_args = 1.., value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// HDF5 group that holds the datasets (default: the file root).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// Global batch size B (must be divisible by the batch dimension's split).
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Number of epochs [default: 1].
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Seed of the shuffle [default: 0].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Budget for one exchange window's buffers per rank (K/M/G suffixes); memory stays
    /// within (prefetch + 1) × this [default: 64M].
    #[arg(long, value_name = "BYTES")]
    pub window_bytes: Option<ByteSize>,
    /// Windows the background producer runs ahead of the consumer; 0: no producer thread,
    /// each window is made when asked for [default: 2].
    #[arg(long)]
    pub prefetch: Option<usize>,
    /// Device mesh, e.g. dp=2,tp=2,pp=2 (product = number of ranks) [default: dp=<ranks>].
    #[arg(long)]
    pub mesh: Option<MeshSpec>,
    /// Mesh axes from slowest to fastest varying in the rank numbering [default: as written].
    #[arg(long, value_delimiter = ',')]
    pub mesh_order: Vec<String>,
    /// Mesh devices each rank drives (one process per host with several devices, as JAX
    /// runs): the mesh has ranks × K devices and a rank receives the union of its devices'
    /// shards [default: 1].
    #[arg(long, value_name = "K")]
    pub devices_per_process: Option<usize>,
    /// The pipeline axis [default: pp].
    #[arg(long)]
    pub pipeline_axis: Option<String>,
    /// Sharding of a field, per dimension of [batch, *shape]: mesh axis, axes joined by +, or -.
    #[arg(long = "shard", value_name = "FIELD=SPEC", value_parser = parse_pair::<ShardSpec>)]
    pub shard: Vec<(String, ShardSpec)>,
    /// Pipeline stages that receive a field.
    #[arg(long = "stages", value_name = "FIELD=first|last|all", value_parser = parse_pair::<Stage>)]
    pub stages: Vec<(String, Stage)>,
    /// Exchange algorithm (auto: the cheaper of fused and two-phase by the cost model;
    /// broadcast: the single-loader baseline) [default: auto].
    #[arg(long, value_parser = named::<ExchangeMode>())]
    pub exchange: Option<ExchangeMode>,
    /// The all-to-all costs `--exchange auto` decides with: latency per peer (s), bandwidth
    /// of a rank on its host and of a host's link (bytes/s), e.g.
    /// latency=5e-6,intra=1e10,inter=1.2e9 (`meshfeed report --predict` fits them)
    /// [default: measured here, see the README's cost model].
    #[arg(long, value_name = "latency=S,intra=B/S,inter=B/S")]
    pub exchange_costs: Option<ExchangeCosts>,
    /// Last incomplete batch of an epoch: drop, pad (with the epoch's first samples) or
    /// partial (a short batch) [default: drop].
    #[arg(long, value_parser = named::<TailPolicy>())]
    pub tail: Option<TailPolicy>,
    /// How ranks read their home ranges: auto (resident when the data fits the memory
    /// budget, else the cheaper of passes and random by the storage's speed), resident
    /// (stream once, keep in memory), passes (K sequential passes per epoch), random (keep
    /// what fits, read the rest where needed) [default: auto].
    #[arg(long, value_parser = named::<ReadStrategy>())]
    pub read_strategy: Option<ReadStrategy>,
    /// Memory the ranks of one host may hold for data together (K/M/G) [default: 3/4 of
    /// the cgroup limit's or the host's headroom, less the pipelines].
    #[arg(long, value_name = "BYTES")]
    pub memory_budget: Option<ByteSize>,
    /// The storage's sequential bandwidth per host in bytes/s (K/M/G) [default: probed
    /// when the choice depends on it].
    #[arg(long, value_name = "BYTES")]
    pub storage_bandwidth: Option<ByteSize>,
    /// The storage's random reads per second per host [default: probed when needed].
    #[arg(long, value_name = "READS")]
    pub storage_iops: Option<u64>,
    /// Node-local directory (NVMe scratch) where what does not fit in memory is streamed
    /// once and read back from.
    #[arg(long, value_name = "DIR")]
    pub spill_dir: Option<PathBuf>,
    /// Reads in flight per rank when reading samples at random [default: 16].
    #[arg(long, value_name = "N")]
    pub read_queue_depth: Option<usize>,
    /// Ranks on one host read the rows they receive from each other's home ranges straight
    /// from the files (the page cache they share) instead of exchanging them: auto (npy, raw
    /// and fixed-size Arrow samples of 1 KiB and more, fused exchange) or off [default: auto].
    #[arg(long, value_parser = named::<LocalReads>())]
    pub local_reads: Option<LocalReads>,
    /// Transport: mpi (launch with mpirun/srun) or ucx (launch with `meshfeed launch`, Ray or
    /// Kubernetes: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, MESHFEED_JOB_TOKEN) [default: mpi].
    #[arg(long, value_parser = named::<TransportKind>())]
    pub transport: Option<TransportKind>,
}

impl JobArgs {
    /// Merges the config file (if any) and the flags into a job; flags win.
    pub fn job(&self) -> Result<Job> {
        let mut file = match &self.config {
            Some(path) => read_job_file(path)?,
            None => JobFile::default(),
        };
        if !self.data.is_empty() {
            file.data = self.data.clone();
        }
        macro_rules! flag_wins {
            ($($field:ident),*) => { $(if let Some(v) = &self.$field { file.$field = Some(v.clone()); })* };
        }
        flag_wins!(group, batch_size, epochs, seed, window_bytes, prefetch, tail, transport, mesh);
        flag_wins!(pipeline_axis, exchange, exchange_costs, local_reads, devices_per_process);
        flag_wins!(read_strategy, memory_budget, storage_bandwidth, storage_iops, spill_dir, read_queue_depth);
        if !self.mesh_order.is_empty() {
            file.mesh_order = self.mesh_order.clone();
        }
        file.shard.extend(self.shard.iter().cloned());
        file.stages.extend(self.stages.iter().cloned());
        file.into_job()
    }

    /// The transport the job asks for, even when the job is invalid (its error is then
    /// reported over that transport, on every rank).
    pub fn transport(&self, job: &Result<Job>) -> TransportKind {
        match job {
            Ok(job) => job.transport,
            Err(_) => self.transport.unwrap_or_default(),
        }
    }
}

/// Reads a TOML job file (a regular file of at most [`JOB_FILE_LIMIT`] bytes: a FIFO in its
/// place is refused, not waited on); relative dataset paths are relative to the file.
fn read_job_file(path: &Path) -> Result<JobFile> {
    let text = read_small(path, JOB_FILE_LIMIT)?;
    let file: JobFile =
        toml::from_str(&text).map_err(|e| Error::file(path, format!("invalid job file: {}", e.message())))?;
    Ok(file.relative_to(path.parent().unwrap_or(Path::new("."))))
}

/// Joins the job over `kind`, runs `job` on this rank, prints any error once per rank and
/// returns the exit code; MPI (if meshfeed initialised it) is finalised after `job`.
pub fn with_runtime(
    kind: TransportKind,
    max_round_bytes: Option<u64>,
    job: impl FnOnce(&Runtime) -> Result<i32>,
) -> i32 {
    let runtime = match kind {
        TransportKind::Mpi => Runtime::mpi(max_round_bytes.map(|b| b.clamp(1, i32::MAX as u64) as usize)),
        TransportKind::Ucx => Runtime::ucx_from_env(),
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            crate::report::print_error(std::env::var("RANK").ok().and_then(|r| r.parse().ok()), &e);
            return 1;
        }
    };
    runtime.abort_on_panic();
    let rank = runtime.rank();
    crate::report::exit_code(Some(rank), job(&runtime))
}
