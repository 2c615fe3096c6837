//! `meshfeed serve`: one read of a dataset for many jobs (the library's `feed`). Launched
//! on F ranks, rank r holds and serves every F-th file from r; rank 0's address is the
//! feeder's, and tells clients where each file is served.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;

use meshfeed::config::{ByteSize, TransportKind};
use meshfeed::dataset::gen;
use meshfeed::dataset::DatasetOptions;
use meshfeed::feed::admission::Limits;
use meshfeed::feed::server::{rank_budget, Feeder, FeederStats};
use meshfeed::feed::{new_token, Source, RENDEZVOUS_SUFFIX, TOKEN_VAR};
use meshfeed::loader::open_dataset;
use meshfeed::runtime::{signal_name, Runtime, StopSignal};
use meshfeed::transport::{agree, ReduceOp};
use meshfeed::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Dataset files or directories, as for `meshfeed run`.
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// HDF5 group that holds the datasets (default: the file root).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// The name clients ask for (default: the first data path's last component).
    #[arg(long)]
    pub name: Option<String>,
    /// Where each rank listens: HOST:PORT (port 0: any free port per rank, which the
    /// rendezvous file and the feeder tell clients; a fixed port allows one rank a host).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "HOST:PORT")]
    pub listen: String,
    /// The host name clients reach this feeder by, where it differs from the listening
    /// address, for a feeder of one rank or ranks on one host [default, listening on
    /// 0.0.0.0: each rank's host name].
    #[arg(long, value_name = "HOST")]
    pub advertise: Option<String>,
    /// Where to write the rendezvous file clients give as their data path (the address,
    /// the name and the token; readable by its owner only) [default: NAME.feeder.json].
    #[arg(long, value_name = "FILE")]
    pub rendezvous: Option<PathBuf>,
    /// Memory the feeder's ranks on one host may hold together (K/M/G); files past it are
    /// read from storage when clients ask for their rows [default: 3/4 of the cgroup
    /// limit's or the host's headroom].
    #[arg(long, value_name = "BYTES")]
    pub memory_budget: Option<ByteSize>,
    /// Send every client the held rows' bytes over its connection. By default the held
    /// files live in memory the host shares, and clients on a feeder rank's host read
    /// them from their own mapping of it, the connection carrying only where they lie.
    #[arg(long)]
    pub no_shared_memory: bool,
    /// How answers reach clients: `tcp` over their connections; `ucx` also offers each
    /// client process a UCX worker of its own for answers of 64 KiB or more (RDMA where
    /// the network has it), the connections still carrying requests.
    #[arg(long, default_value = "tcp", value_parser = ["tcp", "ucx"], value_name = "TRANSPORT")]
    pub client_transport: String,
    /// Seconds a connection may take to present the token, from being accepted; a
    /// connection that has not is closed.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS", help_heading = "Limits on peers")]
    pub hello_timeout: f64,
    /// Connections a rank holds that have not presented the token yet, at most; one more
    /// closes the one that has waited longest.
    #[arg(long, default_value_t = 64, value_name = "N", help_heading = "Limits on peers")]
    pub max_unauthenticated: usize,
    /// Connections a rank holds, at most (each is a thread; a job's process holds one to
    /// each feeder rank it reads from); one more is closed at once.
    #[arg(long, default_value_t = 1024, value_name = "N", help_heading = "Limits on peers")]
    pub max_connections: usize,
    /// JSON lines instead of text: one when serving starts (`"kind":"serving"`), one when
    /// the held files are read (`"kind":"loaded"`), and one a rank when it is stopped
    /// (`"kind":"stopped"`, what it read and served); should it fail, one error object a
    /// rank (`"kind":"error"`).
    #[arg(long)]
    pub json: bool,
    /// On a failure, every rank says why it stopped (without it, the cause is printed
    /// once, by rank 0).
    #[arg(short, long)]
    pub verbose: bool,
    /// How the feeder's ranks meet (`mpirun -np F meshfeed serve`: F ranks, each holding
    /// every F-th file, on the nodes that hold the data); `auto` takes the launcher's, as
    /// `run` does (MPI under mpirun/srun, UCX under `meshfeed launch`, else one rank).
    #[arg(long, default_value = "auto", value_parser = meshfeed::config::named::<TransportKind>())]
    pub transport: TransportKind,
}

/// `meshfeed serve` on every rank of its launch (a lone process is a feeder of one rank).
/// It serves until SIGTERM or SIGINT, then each rank says what it read and served, and
/// exits 0.
pub fn main(args: ServeArgs) -> i32 {
    let style = crate::output::ErrorStyle { verbose: args.verbose, json: args.json };
    crate::job::with_runtime(args.transport, None, style, |rt| serve(&args, rt))
}

fn serve(args: &ServeArgs, rt: &Runtime) -> Result<i32> {
    let (world, rank, ranks) = (rt.world(), rt.rank(), rt.world().size());
    let limits = agree(world, limits(args))?;
    // Each client connection holds a descriptor: as many as this process may have.
    raise_descriptor_limit();
    let name = match &args.name {
        Some(n) => n.clone(),
        None => args.data[0]
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| Error::Config("--name is needed: the data path has no last component".into()))?,
    };
    if name.is_empty() || name.contains('/') {
        return Err(Error::Config(format!("--name '{name}': a name is non-empty and has no '/'")));
    }
    // Rank 0's token, on every rank.
    let token = match std::env::var(TOKEN_VAR) {
        Ok(t) if !t.is_empty() => Ok(t),
        _ if rank == 0 => new_token(),
        _ => Ok(String::new()),
    };
    let token = agree(world, token)?;
    let token = String::from_utf8_lossy(&world.all_gather(token.as_bytes())?[0]).into_owned();
    // Bind first: a port in use is an error before minutes of loading.
    let listener = agree(world, bind(args))?;
    let address = agree(world, advertised(args, &listener))?;
    let options = DatasetOptions { hdf5_group: args.group.clone(), ..Default::default() };
    let dataset = open_dataset(world, &args.data, options)?;
    let budget = rank_budget(world, args.memory_budget.map(|b| b.0))?;
    let (samples, files) = (dataset.len(), dataset.files().len());
    let mut feeder = agree(world, Feeder::new(dataset.clone(), rank, ranks, &name, token.clone(), budget))?;
    feeder.set_limits(limits);
    // The generator's manifest, where the files are `meshfeed gen`'s: clients' `--verify`
    // checks contents through the feeder as it would on the files.
    let manifest = agree(world, gen::find_manifest(&args.data))?;
    let shared = !args.no_shared_memory && agree(world, feeder.share_memory())?;
    if args.client_transport == "ucx" {
        agree(world, feeder.offer_ucx())?;
    }
    let mut sharing = [u64::from(shared)];
    world.all_reduce_u64(&mut sharing, ReduceOp::Sum)?;
    let addresses: Vec<String> =
        world.all_gather(address.as_bytes())?.iter().map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    feeder.set_addresses(dataset.files(), &addresses, manifest)?;
    let source = Source { address: addresses[0].clone(), name: name.clone(), token };
    let rendezvous = args.rendezvous.clone().unwrap_or_else(|| PathBuf::from(format!("{name}{RENDEZVOUS_SUFFIX}")));
    // Every rank serves before the rendezvous file tells clients where to come; a request
    // for a file not read yet waits for it, so jobs start while the feeder reads.
    let feeder = Arc::new(feeder);
    let serving = std::thread::spawn({
        let feeder = feeder.clone();
        move || feeder.serve(listener)
    });
    let written = if rank == 0 { source.write(&rendezvous) } else { Ok(()) };
    agree(world, written.map_err(|e| Error::Config(format!("--rendezvous {}: {e}", rendezvous.display()))))?;
    let mut held = [feeder.stats().held_files];
    world.all_reduce_u64(&mut held, ReduceOp::Sum)?;
    let held = held[0];
    if rank == 0 {
        if args.json {
            let v = serde_json::json!({
                "kind": "serving", "name": name, "url": source.url(), "rendezvous": rendezvous, "ranks": ranks,
                "samples": samples, "files": files, "held_files": held, "shared_memory_ranks": sharing[0],
                "client_transport": args.client_transport,
            });
            out!("{v}");
        } else {
            let storage = match files as u64 - held {
                0 => String::new(),
                n => format!("; {n} past the memory budget, read from storage as asked"),
            };
            let shared = match sharing[0] {
                0 => "every client served over its connection".to_string(),
                n if n == ranks as u64 => "clients on a feeder host map its memory".to_string(),
                n => format!("clients on the hosts of {n} of its ranks map their memory"),
            };
            let ucx = if args.client_transport == "ucx" { "; answers of 64 KiB or more over UCX" } else { "" };
            out!(
                "meshfeed serve: {name}: {samples} samples in {files} files on {ranks} rank(s); serving at {} \
                 (rendezvous file {}); reading {held} files into memory{storage}; {shared}{ucx}",
                source.url(),
                rendezvous.display()
            );
        }
    }
    agree(world, feeder.load())?;
    let mut totals = [feeder.stats().bytes_loaded];
    world.all_reduce_u64(&mut totals, ReduceOp::Sum)?;
    let mut slowest = [feeder.load_time().as_millis() as u64];
    world.all_reduce_u64(&mut slowest, ReduceOp::Max)?;
    if rank == 0 {
        let load_s = slowest[0] as f64 / 1e3;
        if args.json {
            let v = serde_json::json!({
                "kind": "loaded", "name": name, "bytes_read": totals[0], "load_s": load_s, "held_files": held,
            });
            out!("{v}");
        } else {
            out!("meshfeed serve: {name}: {} bytes of {held} files read in {load_s:.2} s", totals[0]);
        }
    }
    // Serves until stopped (a stop signal while reading ends the feeder at once); a
    // listening socket that fails ends this rank, naming it. No collective after this
    // point: a rank stopped alone ends alone.
    let stop = StopSignal::install()?;
    loop {
        if serving.is_finished() {
            serving.join().map_err(|_| Error::Internal("the serving thread panicked".into()))??;
            return Err(Error::Internal("the feeder stopped accepting clients".into()));
        }
        if let Some(signal) = stop.received() {
            stopped(args, &name, rank, signal, feeder.stats());
            return Ok(0);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// What rank `rank` says when stopped by `signal`.
fn stopped(args: &ServeArgs, name: &str, rank: usize, signal: i32, s: FeederStats) {
    let signal = signal_name(signal);
    if args.json {
        let v = serde_json::json!({
            "kind": "stopped", "name": name, "rank": rank, "signal": signal, "held_files": s.held_files,
            "bytes_loaded": s.bytes_loaded, "storage_files": s.storage_files, "storage_bytes": s.storage_bytes,
            "cache_capacity": s.cache_capacity, "cache_rows": s.cache_rows,
            "jobs": s.jobs, "connections": s.connections, "requests": s.requests, "bytes_sent": s.bytes_sent,
            "bytes_mapped": s.bytes_mapped, "bytes_ucx": s.bytes_ucx, "turned_away": s.turned_away, "evicted": s.evicted,
        });
        out!("{v}");
    } else {
        out!(
            "meshfeed serve: {name}: rank {rank} stopped by {signal}: {} jobs attached, {} requests answered, {} bytes sent, \
             {} bytes read by clients from its shared memory, {} bytes sent over UCX; \
             {} bytes read into memory ({} files), {} bytes read from storage on request ({} files), \
             {} rows answered from its cache of rows read ({} bytes); {} connections turned away past its limit, {} closed before their token to make room",
            s.jobs,
            s.requests,
            s.bytes_sent,
            s.bytes_mapped,
            s.bytes_ucx,
            s.bytes_loaded,
            s.held_files,
            s.storage_bytes,
            s.storage_files,
            s.cache_rows,
            s.cache_capacity,
            s.turned_away,
            s.evicted
        );
    }
}

/// The limits on peers the flags set.
fn limits(args: &ServeArgs) -> Result<Limits> {
    if !(args.hello_timeout.is_finite() && args.hello_timeout > 0.0) {
        return Err(Error::Config(format!("--hello-timeout {}: a positive number of seconds", args.hello_timeout)));
    }
    if args.max_unauthenticated == 0 || args.max_connections < args.max_unauthenticated {
        return Err(Error::Config(format!(
            "--max-unauthenticated {} --max-connections {}: at least 1, and at most --max-connections",
            args.max_unauthenticated, args.max_connections
        )));
    }
    Ok(Limits {
        hello_timeout: std::time::Duration::from_secs_f64(args.hello_timeout),
        unauthenticated: args.max_unauthenticated,
        connections: args.max_connections,
    })
}

/// Raises this process's soft limit on open descriptors to its hard limit (best effort).
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid resource and a pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

fn bind(args: &ServeArgs) -> Result<TcpListener> {
    TcpListener::bind(&args.listen).map_err(|e| Error::Config(format!("--listen {}: {e}", args.listen)))
}

/// `HOST:PORT` clients reach this rank's listener at.
fn advertised(args: &ServeArgs, listener: &TcpListener) -> Result<String> {
    let bound = listener.local_addr().map_err(|e| Error::Transport(format!("listening socket: {e}")))?;
    let host = match (&args.advertise, bound.ip().is_unspecified()) {
        (Some(h), _) => h.clone(),
        (None, true) => hostname()?,
        (None, false) => bound.ip().to_string(),
    };
    Ok(format!("{host}:{}", bound.port()))
}

fn hostname() -> Result<String> {
    let name =
        std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(|e| Error::io("/proc/sys/kernel/hostname", e))?;
    Ok(name.trim().to_string())
}
