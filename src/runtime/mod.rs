//! The explicit runtime: how this process joins its job, how it is asked to stop, and what
//! a panic does. Programs (the `meshfeed` command line, the Python package, a training
//! job) start one [`Runtime`] and hand its [`Runtime::world`] to loaders.
//!
//! * **Joining.** Under MPI, MPI is initialised asking for `MPI_THREAD_MULTIPLE` (a
//!   loader's producer thread runs collectives on its own communicator while the program
//!   uses others) — or, when someone else already initialised it (mpi4py, the training
//!   framework), adopted as it is and never finalised by meshfeed. The world size is
//!   checked against the launcher's, which catches a binary started by another MPI's
//!   `mpirun`. Without MPI, UCX joins through the TCP rendezvous the environment
//!   describes (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, `MESHFEED_JOB_TOKEN`).
//! * **Stopping.** [`StopSignal`] records SIGTERM (as Slurm sends before preemption) and
//!   SIGINT; [`StopCheck`] lets all ranks agree to stop after one step.
//! * **Panics.** [`Runtime::abort_on_panic`] makes a panic on any thread end the whole job
//!   (`MPI_Abort`, or exit for UCX, whose peers then report this rank lost), so that no
//!   rank is left waiting in a collective.
//!
//! The environment is read here, in the `from_env` constructors, and nowhere below: the
//! transports take configuration values.

mod abandon;
mod launcher;
pub mod memory;
pub(crate) mod shared_memory;
mod signals;

use crate::config::TransportKind;
use crate::error::{Error, Result};
use crate::transport::Transport;
pub use abandon::{abandoned, mark_abandoned};
pub use launcher::{check_launcher, choose_transport, launched_by_mpi, launcher_mismatch, launcher_sizes, Choice};
pub use signals::{signal_name, StopCheck, StopHandlers, StopSignal};

/// Exit code of a job stopped by SIGTERM/SIGINT at a step boundary (EX_TEMPFAIL: resume
/// it; see `--resume-from`).
pub const EXIT_STOPPED: i32 = 75;

/// This process's membership in its job. Drop every loader built on it before the runtime
/// itself: when meshfeed initialised MPI, dropping the runtime finalises it, and a loader's
/// communicator must be freed before that.
pub struct Runtime {
    // Field order is drop order: the world communicator goes before MPI is finalised.
    // (`None` only while being dropped.)
    world: Option<Box<dyn Transport>>,
    #[cfg(feature = "mpi")]
    mpi: Option<mpi_session::MpiSession>,
    kind: TransportKind,
    /// The process that joined (a forked child leaves the parent's membership alone).
    pid: u32,
}

impl Drop for Runtime {
    /// Leaves the job: frees the world communicator and finalises MPI if meshfeed
    /// initialised it — except in a forked child (the membership is the parent's) and
    /// after a loader gave up a wait and left its producer inside a collective
    /// ([`abandoned`]): finalising under it could hang, so the process
    /// leaves as it is and the launcher ends the job.
    fn drop(&mut self) {
        let world = self.world.take();
        if std::process::id() != self.pid || abandoned() {
            std::mem::forget(world);
            #[cfg(feature = "mpi")]
            std::mem::forget(self.mpi.take());
        }
    }
}

impl Runtime {
    /// Joins the job over `kind`, configured from the environment.
    pub fn from_env(kind: TransportKind) -> Result<Runtime> {
        Runtime::join(kind, None)
    }

    /// Joins the job over `kind` (`auto`: the launcher's, [`choose_transport`]),
    /// configured from the environment; `max_round_bytes` as in [`Runtime::mpi`].
    pub fn join(kind: TransportKind, max_round_bytes: Option<usize>) -> Result<Runtime> {
        let env = |name: &str| std::env::var(name).ok();
        match choose_transport(kind, env, cfg!(feature = "ucx"))? {
            Choice::Mpi => Runtime::mpi(max_round_bytes),
            Choice::Ucx => Runtime::ucx_from_env(),
            // A singleton, as before `auto` (MPI keeps it off the network); without MPI
            // built in, a world of one needs no transport at all.
            Choice::Alone if cfg!(feature = "mpi") => Runtime::mpi(max_round_bytes),
            Choice::Alone => Ok(Runtime::local()),
        }
    }

    /// Joins over MPI: initialises MPI (or adopts it) and checks the world size against
    /// the launcher's. `max_round_bytes` caps one all-to-all-v round (tests use it to force
    /// the chunked path).
    #[cfg(feature = "mpi")]
    pub fn mpi(max_round_bytes: Option<usize>) -> Result<Runtime> {
        let session = mpi_session::MpiSession::init_or_adopt()?;
        let mut world = crate::transport::MpiTransport::new(::mpi::topology::SimpleCommunicator::world());
        if let Some(cap) = max_round_bytes {
            world = world.with_max_round_bytes(cap);
        }
        check_launcher(world.size(), &launcher_sizes())?;
        Ok(Runtime {
            world: Some(Box::new(world)),
            mpi: Some(session),
            kind: TransportKind::Mpi,
            pid: std::process::id(),
        })
    }

    /// Without the `mpi` feature, MPI is a clear error.
    #[cfg(not(feature = "mpi"))]
    pub fn mpi(_max_round_bytes: Option<usize>) -> Result<Runtime> {
        Err(Error::feature_disabled("mpi", "the MPI transport (--transport mpi)"))
    }

    /// Joins over UCX through the TCP rendezvous, configured from the environment.
    #[cfg(feature = "ucx")]
    pub fn ucx_from_env() -> Result<Runtime> {
        use crate::transport::rendezvous::{self, RendezvousConfig};
        let rendezvous = RendezvousConfig::from_vars(env_var)?;
        Runtime::ucx_with(rendezvous.rank, rendezvous.world, |addr| rendezvous::exchange(&rendezvous, addr))
    }

    /// Joins over UCX as rank `rank` of `world`, publishing this rank's worker address
    /// with `all_gather` (which returns every rank's, in rank order): a framework's own
    /// store (torch.distributed's, JAX's) instead of the TCP rendezvous.
    #[cfg(feature = "ucx")]
    pub fn ucx_with(
        rank: usize,
        world: usize,
        all_gather: impl FnOnce(Vec<u8>) -> Result<Vec<Vec<u8>>>,
    ) -> Result<Runtime> {
        use crate::transport::ucx::{UcxConfig, UcxTransport};
        if world == 0 || rank >= world {
            return Err(Error::Config(format!("rank {rank} is not below the world size {world}")));
        }
        let config = UcxConfig::parse(
            env_var("MESHFEED_PEER_TIMEOUT")?.as_deref(),
            env_var("MESHFEED_UCX_PEER_ERRORS")?.as_deref(),
        )?;
        let world = UcxTransport::connect(rank, world, &config, |addr| {
            let all = all_gather(addr)?;
            if all.len() != world {
                return Err(Error::Transport(format!("the address exchange returned {} of {world} ranks", all.len())));
            }
            Ok(all)
        })?;
        report_joined();
        Ok(Runtime {
            world: Some(Box::new(world)),
            #[cfg(feature = "mpi")]
            mpi: None,
            kind: TransportKind::Ucx,
            pid: std::process::id(),
        })
    }

    /// Without the `ucx` feature, UCX is a clear error.
    #[cfg(not(feature = "ucx"))]
    pub fn ucx_from_env() -> Result<Runtime> {
        Err(Error::feature_disabled("ucx", "the UCX transport (--transport ucx; needs libucx-dev)"))
    }

    /// Without the `ucx` feature, UCX is a clear error.
    #[cfg(not(feature = "ucx"))]
    pub fn ucx_with(
        _rank: usize,
        _world: usize,
        _all_gather: impl FnOnce(Vec<u8>) -> Result<Vec<Vec<u8>>>,
    ) -> Result<Runtime> {
        Runtime::ucx_from_env()
    }

    /// A world of one process (no communication).
    pub fn local() -> Runtime {
        Runtime {
            world: Some(Box::new(crate::transport::LocalTransport::new())),
            #[cfg(feature = "mpi")]
            mpi: None,
            kind: TransportKind::Mpi,
            pid: std::process::id(),
        }
    }

    /// The job's world communicator.
    pub fn world(&self) -> &dyn Transport {
        self.world.as_deref().expect("the world communicator lives as long as the runtime")
    }

    /// This process's rank in the world.
    pub fn rank(&self) -> usize {
        self.world().rank().0
    }

    /// The transport the job runs over.
    pub fn transport_kind(&self) -> TransportKind {
        self.kind
    }

    /// Makes a panic on any thread end the whole job instead of leaving the other ranks
    /// waiting: `MPI_Abort` under MPI, exit (code 101) otherwise — UCX peers then report
    /// this rank lost. The panic is printed first (with a backtrace when `RUST_BACKTRACE`
    /// is set). Panics of the Arrow decoder on corrupt input, which meshfeed catches and
    /// reports as a corrupt file, pass.
    pub fn abort_on_panic(&self) {
        #[cfg(feature = "mpi")]
        let mpi = self.mpi.is_some();
        #[cfg(not(feature = "mpi"))]
        let mpi = false;
        std::panic::set_hook(Box::new(move |info| {
            if crate::dataset::arrow::decoding_untrusted_input() {
                return;
            }
            // One write, errors ignored: a closed stderr must not panic inside the hook.
            let text = format!("meshfeed: internal error (panic): {info}\n{}\n", std::backtrace::Backtrace::capture());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
            #[cfg(feature = "mpi")]
            if mpi {
                use ::mpi::traits::Communicator;
                ::mpi::topology::SimpleCommunicator::world().abort(101);
            }
            let _ = mpi;
            std::process::exit(101);
        }));
    }
}

/// Tells `meshfeed launch` that this rank joined its job: one byte to the pipe it handed
/// down (`MESHFEED_LAUNCH_JOINED_FD`), which is then closed. A launcher that sees a rank
/// end before every rank joined stops the others instead of leaving them waiting.
#[cfg(feature = "ucx")]
fn report_joined() {
    let Some(fd) = std::env::var("MESHFEED_LAUNCH_JOINED_FD").ok().and_then(|v| v.parse::<i32>().ok()) else {
        return;
    };
    // Once per process (a second runtime, or a child started later, must not count again).
    std::env::remove_var("MESHFEED_LAUNCH_JOINED_FD");
    // SAFETY: fstat fills the zeroed struct it is given; then one byte is written from a
    // live buffer to the pipe the launcher handed down for this alone, which is closed.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut stat) == 0 && stat.st_mode & libc::S_IFMT == libc::S_IFIFO {
            let _ = libc::write(fd, b"j".as_ptr().cast(), 1);
            libc::close(fd);
        }
    }
}

/// An environment variable (`None` when unset); a value that is not UTF-8 is an error
/// naming the variable.
pub fn env_var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(crate::error::Error::Config(format!("{name} is not valid UTF-8")))
        }
    }
}

/// Open MPI parameters that keep a singleton from listening on the network, with why.
/// Measured with Open MPI 4.1.4 (`ss -ltnp` on a singleton; docs/launching.md): without
/// them the process listens on `0.0.0.0:1024` and `[::]:1024` (the TCP BTL, bound at
/// `MPI_Init` whether or not a peer ever connects), and `MPI_Init` forks an `orted` that
/// listens on all addresses (ORTE's out-of-band TCP) and on 127.0.0.1 (PMIx). A job of
/// one process talks to itself only: the `self` BTL over the `ob1` PML is all it needs.
#[cfg(feature = "mpi")]
const SINGLETON_MCA: [(&str, &str); 3] = [
    // Only the loopback-to-self BTL: no TCP BTL listener (nor one of the `ofi` BTL's
    // providers, which listened on eth0 when only `tcp` was left out).
    ("OMPI_MCA_btl", "self"),
    // ob1 uses the BTLs: the `ucx` and `cm` PMLs would bring their own network transports
    // (where the host has InfiniBand or the like; not measured here, where ob1 is chosen).
    ("OMPI_MCA_pml", "ob1"),
    // No supporting `orted` (it serves only MPI_Comm_spawn and the like, which meshfeed
    // does not call). Open MPI 5 has no such daemon and ignores the variable.
    ("OMPI_MCA_ess_singleton_isolated", "1"),
];

/// The environment variables to set before `MPI_Init` so that a singleton opens no
/// network listener ([`SINGLETON_MCA`]): none under a launcher (what its ranks open is
/// the launcher's business, and its settings rule), and none that the user set (`var`
/// tells whether a variable is set, even empty): `OMPI_MCA_btl=self,vader,tcp` gives a
/// singleton its TCP BTL back. MPICH ignores these variables.
#[cfg(feature = "mpi")]
fn singleton_settings(var: impl Fn(&str) -> Option<()>) -> Vec<(&'static str, &'static str)> {
    if launcher::MPI_LAUNCHER_VARS.iter().any(|v| var(v).is_some()) {
        return Vec::new();
    }
    SINGLETON_MCA.into_iter().filter(|(name, _)| var(name).is_none()).collect()
}

/// Peak resident set size of this process, in bytes (0 where unknown).
pub fn peak_rss_bytes() -> u64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out-pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0;
    }
    (usage.ru_maxrss as u64).saturating_mul(1024) // Linux reports kilobytes
}

/// The calling thread's id, as `/proc/self/task` names it.
pub fn thread_id() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Bytes thread `tid` of this process has read so far: what its reads returned (`rchar`)
/// and what it made the kernel fetch from storage for them (`read_bytes`, counted as the
/// fetch is issued, so that it grows during one long read). 0 where the kernel does not
/// tell (`/proc/self/task/TID/io` missing or unreadable).
pub fn thread_read_bytes(tid: i32) -> u64 {
    let Ok(io) = std::fs::read_to_string(format!("/proc/self/task/{tid}/io")) else { return 0 };
    io.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(key, _)| matches!(*key, "rchar" | "read_bytes"))
        .filter_map(|(_, n)| n.trim().parse::<u64>().ok())
        .fold(0, u64::saturating_add)
}

#[cfg(feature = "mpi")]
mod mpi_session {
    use crate::error::{Error, Result};

    /// MPI as this process has it: initialised by meshfeed (finalised when dropped) or
    /// adopted from whoever initialised it (left alone).
    pub struct MpiSession {
        _universe: Option<::mpi::environment::Universe>,
    }

    impl MpiSession {
        pub fn init_or_adopt() -> Result<MpiSession> {
            if ::mpi::environment::is_finalized() {
                return Err(Error::Transport("MPI was already finalised in this process".into()));
            }
            if ::mpi::environment::is_initialized() {
                return Ok(MpiSession { _universe: None });
            }
            // A singleton listens on no network: issue 41, item 7 (`super::singleton_settings`).
            for (name, value) in super::singleton_settings(|v| std::env::var_os(v).map(|_| ())) {
                // Before MPI reads its parameters. Changing the environment races only with
                // another thread reading or changing it at this moment: meshfeed starts none
                // before its runtime; a host program's (Python's) threads are its own.
                std::env::set_var(name, value);
            }
            match ::mpi::initialize_with_threading(::mpi::Threading::Multiple) {
                Some((universe, _provided)) => Ok(MpiSession { _universe: Some(universe) }),
                // Another thread initialised MPI between the check and the call: adopt it.
                None => Ok(MpiSession { _universe: None }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "mpi")]
    fn a_singleton_is_kept_off_the_network_unless_launched_or_told_otherwise() {
        let env = |set: &'static [&'static str]| singleton_settings(move |v| set.contains(&v).then_some(()));
        let all: Vec<(&str, &str)> = SINGLETON_MCA.to_vec();
        assert_eq!(env(&[]), all);
        // Unrelated variables change nothing; Slurm's alone is no MPI launcher (srun
        // --mpi=none starts singletons).
        assert_eq!(env(&["OMPI_ALLOW_RUN_AS_ROOT", "SLURM_STEP_NUM_TASKS"]), all);
        // Under any MPI launcher: nothing.
        for var in launcher::MPI_LAUNCHER_VARS {
            let set: &'static [&'static str] = Box::leak(Box::new([var]));
            assert_eq!(env(set), vec![], "{var}");
        }
        // The user's own setting stays theirs; the others still apply.
        assert_eq!(env(&["OMPI_MCA_btl"]), vec![("OMPI_MCA_pml", "ob1"), ("OMPI_MCA_ess_singleton_isolated", "1")]);
        assert_eq!(env(&["OMPI_MCA_btl", "OMPI_MCA_pml", "OMPI_MCA_ess_singleton_isolated"]), vec![]);
    }
}
