//! `meshfeed launch -n N -- run --transport ucx ...`: the local launcher. Starts N copies
//! of this binary (or of `--exe PROGRAM`) on this host with `RANK`, `WORLD_SIZE`, `MASTER_ADDR=127.0.0.1`, a free
//! `MASTER_PORT` and a fresh `MESHFEED_JOB_TOKEN` (the convention Ray and Kubernetes
//! launchers follow too). When any rank fails, the others are stopped (SIGTERM, then
//! SIGKILL after a grace period) and the launcher exits with the failing rank's code.
//! SIGTERM or SIGINT to the launcher is passed on to every rank, which then stop together
//! at a step boundary (exit code 75, see `run --resume-from`).

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use meshfeed::runtime::StopSignal;
use meshfeed::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// Number of ranks.
    #[arg(short = 'n', long)]
    pub ranks: usize,
    /// Rendezvous port (default: a free port).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds the other ranks get to exit after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 5.0)]
    pub grace: f64,
    /// The program every rank runs (default: this meshfeed binary), e.g. a training script's
    /// interpreter or a program built on the library.
    #[arg(long, value_name = "PROGRAM")]
    pub exe: Option<std::path::PathBuf>,
    /// The arguments every rank runs the program with, e.g. `run --transport ucx --data ...`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// The rendezvous socket, bound here (on `port`, or on a free one) and handed to rank 0 as
/// an inherited descriptor (`MESHFEED_RENDEZVOUS_FD`): picking a free port and letting rank
/// 0 bind it later could lose it to another process in between.
fn rendezvous_socket(port: Option<u16>) -> Result<std::net::TcpListener> {
    let port = port.unwrap_or(0);
    std::net::TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| Error::Transport(format!("cannot listen for the rendezvous on port {port}: {e}")))
}

fn token() -> Result<String> {
    let mut b = [0u8; 16];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").map_err(|e| Error::io("/dev/urandom", e))?,
        &mut b,
    )
    .map_err(|e| Error::io("/dev/urandom", e))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn terminate(children: &mut [(usize, Child)], grace: Duration) {
    // Ranks that agreed on a failure exit on their own within moments (and print their
    // error line first): give them that before signalling.
    let settle = Instant::now() + grace.min(Duration::from_secs(3));
    while Instant::now() < settle && children.iter_mut().any(|(_, c)| c.try_wait().ok().flatten().is_none()) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (_, c) in children.iter_mut() {
        if c.try_wait().ok().flatten().is_some() {
            continue;
        }
        // SAFETY: kill(2) on the pid of a child we spawned and have not yet reaped.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + grace;
    for (_, c) in children.iter_mut() {
        while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
    }
}

pub fn run(args: LaunchArgs) -> Result<i32> {
    if args.ranks == 0 {
        return Err(Error::Config("-n must be at least 1".into()));
    }
    let exe = match args.exe {
        Some(exe) => exe,
        None => std::env::current_exe().map_err(|e| Error::Config(format!("cannot find the meshfeed binary: {e}")))?,
    };
    let mut socket = Some(rendezvous_socket(args.port)?);
    let port = socket.as_ref().and_then(|s| s.local_addr().ok()).map(|a| a.port()).unwrap_or(0);
    let token = std::env::var("MESHFEED_JOB_TOKEN").or_else(|_| token())?;
    let mut children: Vec<(usize, Child)> = Vec::new();
    for rank in 0..args.ranks {
        let mut cmd = Command::new(&exe);
        cmd.args(&args.command)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", args.ranks.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("MESHFEED_JOB_TOKEN", &token)
            .env_remove("MESHFEED_RENDEZVOUS_FD");
        // Rank 0 inherits the rendezvous socket; the launcher's copy closes after the spawn.
        let listener = if rank == 0 { socket.take() } else { None };
        if let Some(listener) = &listener {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let fd = listener.as_raw_fd();
            cmd.env("MESHFEED_RENDEZVOUS_FD", fd.to_string());
            // SAFETY: runs in the child between fork and exec, where only async-signal-safe
            // calls are allowed: fcntl is one. It keeps the rendezvous socket open across
            // exec for rank 0 (std opens every descriptor close-on-exec).
            unsafe {
                cmd.pre_exec(move || match libc::fcntl(fd, libc::F_SETFD, 0) {
                    -1 => Err(std::io::Error::last_os_error()),
                    _ => Ok(()),
                });
            }
        }
        let child = cmd.spawn();
        drop(listener);
        match child {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                terminate(&mut children, Duration::from_secs_f64(args.grace));
                return Err(Error::Config(format!("cannot start rank {rank}: {e}")));
            }
        }
    }
    let grace = Duration::from_secs_f64(args.grace.max(0.0));
    // The signal the launcher receives is passed on to the ranks.
    let received = StopSignal::install()?;
    let mut forwarded = false;
    let mut exit = 0;
    while !children.is_empty() {
        if let (Some(signal), false) = (received.received(), forwarded) {
            for (_, c) in &children {
                // SAFETY: kill(2) on the pid of a child we spawned and have not yet reaped.
                unsafe { libc::kill(c.id() as libc::pid_t, signal) };
            }
            forwarded = true;
        }
        let mut failed = None;
        children.retain_mut(|(rank, c)| match c.try_wait() {
            Ok(Some(status)) => {
                if !status.success() && failed.is_none() {
                    failed = Some((*rank, status.code().unwrap_or(128 + libc::SIGKILL)));
                }
                false
            }
            Ok(None) => true,
            Err(_) => false,
        });
        if let (Some((_, code)), true) = (failed, forwarded) {
            // Stopped on request: the ranks stop together; report their code.
            exit = if exit == 0 { code } else { exit };
            continue;
        }
        if let Some((rank, code)) = failed {
            eprintln!("meshfeed launch: rank {rank} exited with code {code}; stopping the other ranks");
            terminate(&mut children, grace);
            return Ok(code.max(1));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(exit)
}
