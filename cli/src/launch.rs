//! `meshfeed launch -n N -- run ...`: the local launcher (`run`'s default `--transport
//! auto` joins over UCX under it). Starts N copies
//! of this command line (this binary, or the Python package's `meshfeed` console script
//! run as `python -m meshfeed`; or `--exe PROGRAM`) on this host with `RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR=127.0.0.1`, a free `MASTER_PORT`, a fresh `MESHFEED_JOB_TOKEN` (the
//! convention Ray and Kubernetes launchers follow too) and a fresh `MESHFEED_JOB_ID`, and
//! supervises them:
//!
//! * When any rank fails, the others get a few seconds to exit on their own, then SIGTERM,
//!   then SIGKILL after `--grace`; the launcher exits with the failing rank's code, or 128
//!   + the signal that killed it (reported by name: `rank 2 was killed by signal 11
//!   (SIGSEGV)`).
//! * SIGTERM or SIGINT to the launcher is passed on to every rank, which then stop
//!   together at a step boundary (exit code 75, see `run --resume-from`). Ranks still
//!   running `--grace` seconds later are SIGKILLed and the launcher exits 137; a second
//!   SIGTERM/SIGINT kills them at once.
//! * A rank that ends — even with code 0 — before every rank joined the rendezvous leaves
//!   the others waiting for it (up to the rendezvous timeout): once the others had a
//!   moment to end on their own, the launcher stops them and exits 1, naming the rank.
//!   Each rank tells the launcher it joined by writing a byte to the pipe it inherits
//!   (`MESHFEED_LAUNCH_JOINED_FD`; the runtime does this after the rendezvous).
//! * The ranks never outlive the launcher: each is started with `PR_SET_PDEATHSIG`
//!   (SIGKILL), so even a launcher killed by SIGKILL takes its ranks with it. That covers
//!   the processes the launcher starts; a rank program that starts processes of its own
//!   (a shell script that does not `exec`) must stop them itself.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use meshfeed::error::ErrorKind;
use meshfeed::runtime::env_var;
use meshfeed::transport::rendezvous::MAX_WORLD;
use meshfeed::{Error, Result, ResultExt};

#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// Number of ranks.
    #[arg(short = 'n', long)]
    pub ranks: usize,
    /// Rendezvous port (default: a free port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds ranks get to exit after SIGTERM (a failed rank's peers, or every rank after
    /// a forwarded SIGTERM/SIGINT) before SIGKILL.
    #[arg(long, default_value = "5", value_name = "SECONDS", value_parser = parse_grace, allow_negative_numbers = true)]
    pub grace: Duration,
    /// The program every rank runs (default: this meshfeed command: the binary, or the
    /// Python package's console script), e.g. a training script's interpreter or a program
    /// built on the library.
    #[arg(long, value_name = "PROGRAM")]
    pub exe: Option<std::path::PathBuf>,
    /// The arguments every rank runs the program with, e.g. `run --transport ucx --data ...`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The longest `--grace` accepted, in seconds (about 11 days: "as long as it takes", but
/// finite, so that every wait has an end).
const MAX_GRACE_SECS: f64 = 1e6;
/// How long the other ranks get to end on their own after one ended before every rank
/// joined the rendezvous.
const EARLY_EXIT_SETTLE: Duration = Duration::from_secs(3);
/// The longest job token accepted (as the rendezvous does).
const MAX_TOKEN: usize = 1024;

/// `--grace` as a duration: a finite number of seconds from 0 to [`MAX_GRACE_SECS`]
/// (`inf`, `nan` or a negative number would make `Duration::from_secs_f64` panic).
fn parse_grace(v: &str) -> std::result::Result<Duration, String> {
    match v.trim().parse::<f64>() {
        // Finite and in range, so this cannot panic.
        Ok(secs) if (0.0..=MAX_GRACE_SECS).contains(&secs) => Ok(Duration::from_secs_f64(secs)),
        _ => Err(format!("expected a number of seconds from 0 to {MAX_GRACE_SECS:e}")),
    }
}

/// The rendezvous socket, bound here (on `port`, or on a free one) and handed to rank 0 as
/// an inherited descriptor (`MESHFEED_RENDEZVOUS_FD`): picking a free port and letting rank
/// 0 bind it later could lose it to another process in between.
fn rendezvous_socket(port: Option<u16>) -> Result<std::net::TcpListener> {
    let port = port.unwrap_or(0);
    std::net::TcpListener::bind(("0.0.0.0", port))
        .context(ErrorKind::Transport, format_args!("cannot listen for the rendezvous on port {port}"))
}

/// 16 random bytes in hex.
fn nonce() -> Result<String> {
    let mut b = [0u8; 16];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(|e| Error::io("/dev/urandom", e))?,
        &mut b,
    )
    .map_err(|e| Error::io("/dev/urandom", e))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// `MESHFEED_JOB_TOKEN` from the environment (empty counts as unset, as in
/// `python -m meshfeed.launch.ray`), else a fresh one.
fn job_token() -> Result<String> {
    match env_var("MESHFEED_JOB_TOKEN")? {
        Some(t) if t.len() > MAX_TOKEN => {
            Err(Error::Config(format!("MESHFEED_JOB_TOKEN has {} bytes; at most {MAX_TOKEN}", t.len())))
        }
        Some(t) if !t.is_empty() => Ok(t),
        _ => nonce(),
    }
}

/// The stop signals (SIGTERM, SIGINT) the launcher received: how many, and the last one.
/// The handler only stores into atomics this value shares with it.
struct Stops {
    count: Arc<AtomicUsize>,
    last: Arc<AtomicUsize>,
}

impl Stops {
    fn install() -> Result<Stops> {
        let (count, last) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        for sig in [libc::SIGTERM, libc::SIGINT] {
            let (c, l) = (count.clone(), last.clone());
            // SAFETY: the action runs in a signal handler, where only async-signal-safe
            // operations are allowed: it does two atomic operations on values it owns (no
            // allocation, no lock).
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    l.store(sig as usize, Ordering::SeqCst);
                    c.fetch_add(1, Ordering::SeqCst);
                })
            }
            .context(ErrorKind::Internal, format_args!("cannot install a handler for signal {sig}"))?;
        }
        Ok(Stops { count, last })
    }

    /// (number of stop signals received, the last one).
    fn get(&self) -> (usize, i32) {
        (self.count.load(Ordering::SeqCst), self.last.load(Ordering::SeqCst) as i32)
    }
}

/// `SIGSEGV` etc. for the signals a rank commonly dies of; `None` for others.
fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return None,
    })
}

/// `signal 11 (SIGSEGV)`.
fn describe_signal(sig: i32) -> String {
    match signal_name(sig) {
        Some(name) => format!("signal {sig} ({name})"),
        None => format!("signal {sig}"),
    }
}

/// How a rank ended: its exit code (128 + the signal for a rank killed by one, as shells
/// report it), and the words for a message.
fn outcome(status: ExitStatus) -> (i32, String) {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, format!("exited with code {code}")),
        (None, Some(sig)) => {
            let core = if status.core_dumped() { " (core dumped)" } else { "" };
            (128 + sig, format!("was killed by {}{core}", describe_signal(sig)))
        }
        (None, None) => (1, "ended in an unknown way".into()),
    }
}

/// Sends `signal` to every rank still running.
fn signal_all(children: &mut [(usize, Child)], signal: i32) {
    for (_, c) in children.iter_mut() {
        if c.try_wait().ok().flatten().is_none() {
            // SAFETY: kill(2) on the pid of a child we spawned and have not yet reaped (a
            // child that exited is reaped only by try_wait, which just said it runs).
            unsafe { libc::kill(c.id() as libc::pid_t, signal) };
        }
    }
}

/// SIGKILLs and reaps every rank still running.
fn kill_all(children: &mut Vec<(usize, Child)>) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    children.clear();
}

/// Stops the ranks after one failed: a moment to exit on their own, then SIGTERM, then
/// SIGKILL after `grace`.
fn terminate(children: &mut Vec<(usize, Child)>, grace: Duration) {
    // Ranks that agreed on a failure exit on their own within moments (and print their
    // error line first): give them that before signalling.
    let settle = Instant::now() + grace.min(Duration::from_secs(3));
    while Instant::now() < settle && children.iter_mut().any(|(_, c)| c.try_wait().ok().flatten().is_none()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    signal_all(children, libc::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && children.iter_mut().any(|(_, c)| c.try_wait().ok().flatten().is_none()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_all(children);
}

/// The pipe each rank writes a byte to once it joined the rendezvous: the launcher keeps
/// the read end (non-blocking) and counts the ranks that joined.
struct Joined {
    read: std::os::fd::OwnedFd,
    write: Option<std::os::fd::OwnedFd>,
    count: usize,
}

impl Joined {
    fn new() -> Result<Joined> {
        use std::os::fd::FromRawFd;
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two descriptors it is given room for.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } == -1 {
            let e = std::io::Error::last_os_error();
            return Err(Error::caused(ErrorKind::Internal, format!("cannot make a pipe: {e}"), e));
        }
        // SAFETY: both descriptors were just opened, and are owned here alone.
        let (read, write) =
            unsafe { (std::os::fd::OwnedFd::from_raw_fd(fds[0]), std::os::fd::OwnedFd::from_raw_fd(fds[1])) };
        Ok(Joined { read, write: Some(write), count: 0 })
    }

    /// The ranks that joined so far.
    fn poll(&mut self) -> usize {
        use std::os::fd::AsRawFd;
        let mut buf = [0u8; 256];
        loop {
            // SAFETY: reads into a buffer of the length given, from a descriptor owned here.
            let n = unsafe { libc::read(self.read.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return self.count;
            }
            self.count += n as usize;
        }
    }
}

/// Starts rank `rank`. `listener`: the rendezvous socket rank 0 inherits; `joined`: the
/// write end of the pipe it reports joining to.
fn spawn(
    command: &mut Command,
    launcher: libc::pid_t,
    listener: Option<&std::net::TcpListener>,
    joined: Option<&std::os::fd::OwnedFd>,
) -> std::io::Result<Child> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let fd = listener.map(|l| l.as_raw_fd());
    if let Some(fd) = fd {
        command.env("MESHFEED_RENDEZVOUS_FD", fd.to_string());
    }
    let joined = joined.map(|j| j.as_raw_fd());
    if let Some(fd) = joined {
        command.env("MESHFEED_LAUNCH_JOINED_FD", fd.to_string());
    }
    // SAFETY: runs in the child between fork and exec, where only async-signal-safe calls
    // are allowed: prctl, getppid and fcntl are system calls, and the errors are built
    // from OS error numbers without allocating.
    unsafe {
        command.pre_exec(move || {
            // The rank dies with the launcher, even when the launcher is SIGKILLed. The
            // setting survives exec (not for set-uid programs, which a rank is not).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) == -1 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died between fork and prctl: then no signal will come.
            if libc::getppid() != launcher {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // Keeps the rendezvous socket open across exec for rank 0 (std opens every
            // descriptor close-on-exec).
            for fd in [fd, joined].into_iter().flatten() {
                if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
    command.spawn()
}

/// Launches the ranks. `relaunch` is the command that runs this command line again when
/// the process is not the `meshfeed` binary (the Python console script: the interpreter is
/// the current executable there); `None` means the current executable.
pub fn run(args: LaunchArgs, relaunch: Option<&[OsString]>) -> Result<i32> {
    if args.ranks == 0 || args.ranks > MAX_WORLD {
        return Err(Error::Config(format!("-n {}: expected 1 to {MAX_WORLD} ranks", args.ranks)));
    }
    let grace = args.grace;
    let (exe, exe_args): (OsString, &[OsString]) = match (args.exe, relaunch) {
        (Some(exe), _) => (exe.into_os_string(), &[]),
        (None, Some([program, before @ ..])) => (program.clone(), before),
        (None, _) => {
            let exe = std::env::current_exe().context(ErrorKind::Config, "cannot find the meshfeed binary")?;
            (exe.into_os_string(), &[])
        }
    };
    let token = job_token()?;
    // This launch's identity: rank 0 refuses ranks of other jobs that share the token and
    // port. Always fresh, whatever the launcher's own environment holds.
    let job_id = nonce()?;
    // Installed before the ranks start, so that a signal arriving meanwhile is passed on.
    let stops = Stops::install()?;
    let mut socket = Some(rendezvous_socket(args.port)?);
    let port = socket.as_ref().and_then(|s| s.local_addr().ok()).map(|a| a.port()).unwrap_or(0);
    let launcher = std::process::id() as libc::pid_t;
    let mut joined = Joined::new()?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..args.ranks {
        let mut cmd = Command::new(&exe);
        cmd.args(exe_args)
            .args(&args.command)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", args.ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("MESHFEED_JOB_TOKEN", &token)
            .env("MESHFEED_JOB_ID", &job_id)
            .env_remove("MESHFEED_RENDEZVOUS_FD")
            .env_remove("MESHFEED_LAUNCH_JOINED_FD");
        // Rank 0 inherits the rendezvous socket; the launcher's copy closes after the spawn.
        let listener = if rank == 0 { socket.take() } else { None };
        let child = spawn(&mut cmd, launcher, listener.as_ref(), joined.write.as_ref());
        drop(listener);
        match child {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                terminate(&mut children, grace);
                return Err(Error::caused(ErrorKind::Config, format!("cannot start rank {rank}: {e}"), e));
            }
        }
    }
    // Only the ranks hold the write end now: the launcher reads.
    joined.write = None;
    Ok(supervise(children, &stops, grace, &mut joined))
}

/// Waits for the ranks; returns the launcher's exit code.
fn supervise(mut children: Vec<(usize, Child)>, stops: &Stops, grace: Duration, joined: &mut Joined) -> i32 {
    let world = children.len();
    // The signal passed on to the ranks, when, and how many the launcher had received then.
    let mut forwarded: Option<(i32, Instant, usize)> = None;
    // A rank that ended before every rank joined the rendezvous, and when.
    let mut left_early: Option<(usize, String, Instant)> = None;
    let mut exit = 0;
    while !children.is_empty() {
        let (count, last) = stops.get();
        match forwarded {
            None if count > 0 => {
                signal_all(&mut children, last);
                forwarded = Some((last, Instant::now(), count));
            }
            Some((_, _, seen)) if count > seen => {
                crate::output::line_err(&format!(
                    "meshfeed launch: {} again: killing the remaining rank(s) {:?}",
                    describe_signal(last),
                    children.iter().map(|(r, _)| *r).collect::<Vec<_>>()
                ));
                kill_all(&mut children);
                return 128 + libc::SIGKILL;
            }
            _ => {}
        }
        let mut failed = None;
        let all_joined = joined.poll() >= world;
        children.retain_mut(|(rank, c)| match c.try_wait() {
            Ok(Some(status)) => {
                if status.success() && !all_joined && forwarded.is_none() && left_early.is_none() {
                    left_early = Some((*rank, outcome(status).1, Instant::now()));
                }
                if !status.success() {
                    let (code, words) = outcome(status);
                    match forwarded {
                        // Stopped on request: the ranks stop together (75); a rank without
                        // a handler dies of the signal it was passed, which needs no word.
                        Some((signal, ..)) => {
                            if status.signal().is_some_and(|s| s != signal) {
                                crate::output::line_err(&format!("meshfeed launch: rank {rank} {words}"));
                            }
                            if exit == 0 {
                                exit = code;
                            }
                        }
                        None if failed.is_none() => failed = Some((*rank, code, words)),
                        None => {}
                    }
                }
                false
            }
            Ok(None) => true,
            Err(_) => false,
        });
        if let Some((rank, code, words)) = failed {
            crate::output::line_err(&format!("meshfeed launch: rank {rank} {words}; stopping the other ranks"));
            terminate(&mut children, grace);
            return code.max(1);
        }
        // The others would wait for it at the rendezvous: a moment to end on their own (a
        // job whose ranks never meet ends so), then they are stopped.
        if let Some((rank, words, at)) = &left_early {
            if joined.poll() >= world {
                left_early = None;
            } else if !children.is_empty() && at.elapsed() > EARLY_EXIT_SETTLE {
                crate::output::line_err(&format!(
                    "meshfeed launch: rank {rank} {words} before every rank joined the rendezvous ({} of {world} \
                     did): the others would wait for it; stopping rank(s) {:?}",
                    joined.poll(),
                    children.iter().map(|(r, _)| *r).collect::<Vec<_>>()
                ));
                terminate(&mut children, grace);
                return 1;
            }
        }
        if let Some((signal, at, _)) = forwarded {
            if !children.is_empty() && at.elapsed() > grace {
                crate::output::line_err(&format!(
                    "meshfeed launch: rank(s) {:?} did not exit within {} s of {}; killing them (SIGKILL)",
                    children.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
                    grace.as_secs_f64(),
                    describe_signal(signal)
                ));
                kill_all(&mut children);
                return 128 + libc::SIGKILL;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    exit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_must_be_a_finite_number_of_seconds() {
        assert_eq!(parse_grace("0"), Ok(Duration::ZERO));
        assert_eq!(parse_grace(" 2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_grace("1e6"), Ok(Duration::from_secs(1_000_000)));
        for bad in ["inf", "-inf", "nan", "NaN", "-1", "-0.001", "1e7", "1e300", "", "5s"] {
            let e = parse_grace(bad).unwrap_err();
            assert!(e.contains("expected a number of seconds from 0 to 1e6"), "{bad}: {e}");
        }
    }

    #[test]
    fn signals_are_reported_by_name() {
        assert_eq!(describe_signal(libc::SIGSEGV), "signal 11 (SIGSEGV)");
        assert_eq!(describe_signal(libc::SIGKILL), "signal 9 (SIGKILL)");
        assert_eq!(describe_signal(63), "signal 63");
        let (code, words) = outcome(ExitStatus::from_raw(libc::SIGSEGV));
        assert_eq!((code, words.as_str()), (139, "was killed by signal 11 (SIGSEGV)"));
        let (code, words) = outcome(ExitStatus::from_raw(libc::SIGABRT | 0x80));
        assert_eq!((code, words.as_str()), (134, "was killed by signal 6 (SIGABRT) (core dumped)"));
        let (code, words) = outcome(ExitStatus::from_raw(3 << 8));
        assert_eq!((code, words.as_str()), (3, "exited with code 3"));
    }
}
