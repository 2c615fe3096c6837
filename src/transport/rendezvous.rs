//! TCP rendezvous: how ranks started without an MPI launcher (Ray actors, Kubernetes pods,
//! the local launcher) find each other.
//!
//! Every process gets `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (the convention of
//! torchrun, Ray Train and Kubernetes training operators; `MESHFEED_MASTER_PORT`, when set,
//! replaces `MASTER_PORT`, which torchrun's own store holds), `MESHFEED_JOB_TOKEN`, a secret
//! shared by the job's processes, and optionally `MESHFEED_JOB_ID`, an identity of this
//! launch of the job (a nonce the launcher makes). Rank 0 listens on `MASTER_PORT` (all
//! addresses) and acts as a small store; every other rank connects to
//! `MASTER_ADDR:MASTER_PORT`, retrying until the deadline, and publishes a payload (its UCP
//! worker address). When all `WORLD_SIZE` ranks have registered, rank 0 sends every rank
//! the table of all payloads and closes the connections.
//!
//! ## Protocol (all integers little-endian)
//!
//! ```text
//! client → server  HELLO  "MFRV" | version u8 = 2 | token_len u16 | token
//!                         | job_id_len u16 | job_id | rank u32 | world u32
//!                         | payload_len u32 | payload
//! server → client  OK     "OK" | world u32 | world × (len u32 | payload)
//!                  NO     "NO" | reason_len u32 | reason (UTF-8)
//! ```
//!
//! `job_id_len` 0 means "no job id". Version 1 (no job id field) is refused with a reason
//! that says the ranks run different meshfeed versions.
//!
//! A connection is refused — answered with `NO` where possible, logged on rank 0, and
//! closed, without disturbing the job — when it sends the wrong magic (e.g. an HTTP
//! request), another protocol version, nothing within [`HELLO_TIMEOUT`], a wrong token
//! (compared in constant time), a job id other than rank 0's (checked only once the token
//! matched, so that the id is never shown to a process without the token), a `WORLD_SIZE`
//! other than the job's, a rank out of range or already registered, or oversized fields
//! (token over 1 KiB, job id over 256 bytes, payload over 1 MiB). A process that is
//! refused gets an error and exits non-zero. Every wait has a deadline
//! (`MESHFEED_RENDEZVOUS_TIMEOUT`, default 120 s); on expiry rank 0 names the ranks that
//! never arrived, and tells the registered ones.
//!
//! ## What keeps two jobs apart
//!
//! Two jobs on one host normally use different ports and tokens. They can still meet: a
//! token shared by several jobs (one Kubernetes Secret for every Job, an exported
//! `MESHFEED_JOB_TOKEN`) and a port that a new job's rank 0 reuses while ranks of an
//! earlier job still retry it (a Job deleted and created again under the same name). The
//! job id tells such jobs apart: `meshfeed launch`, `python -m meshfeed.launch.ray` and
//! `launch/k8s/emulate.sh` make a fresh one per launch, the Kubernetes manifest uses the
//! Job's uid, and rank 0 refuses a rank whose id differs from its own. Without a job id
//! (unset or empty on every rank) nothing is derived in its place: then only the token,
//! the world size and the one registration per rank keep jobs apart, and a rank of
//! another job with the same token and world size that takes a free rank slot first would
//! be accepted.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::error::{BoxError, Error, ErrorKind, Result, ResultExt};

const MAGIC: &[u8; 4] = b"MFRV";
const VERSION: u8 = 2;
const MAX_TOKEN: usize = 1024;
const MAX_JOB_ID: usize = 256;
/// The most ranks a job may have: ranks travel as u32, and rank 0 keeps one slot per rank.
pub const MAX_WORLD: usize = 1 << 20;
const MAX_PAYLOAD: usize = 1 << 20;
/// How long a new connection may take to send its HELLO.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to rendezvous.
#[derive(Clone, Debug)]
pub struct RendezvousConfig {
    pub rank: usize,
    pub world: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub token: String,
    /// This launch of the job (`MESHFEED_JOB_ID`); `None` when unset or empty. Rank 0
    /// refuses ranks whose job id differs from its own.
    pub job_id: Option<String>,
    pub timeout: Duration,
    /// A listening socket rank 0 inherited from its launcher (`MESHFEED_RENDEZVOUS_FD`), to
    /// serve on instead of binding `master_port`: a launcher that holds the port from the
    /// moment it picks it cannot lose it to another process before rank 0 starts.
    pub listen_fd: Option<i32>,
}

/// The longest rendezvous timeout accepted, in seconds.
const MAX_TIMEOUT_SECS: f64 = 1e9;
/// The shortest, in seconds: anything shorter would expire before a connection is made.
const MIN_TIMEOUT_SECS: f64 = 1e-3;

impl RendezvousConfig {
    /// The configuration from the values of `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// `MASTER_PORT`, `MESHFEED_JOB_TOKEN` and the optional `MESHFEED_JOB_ID`,
    /// `MESHFEED_RENDEZVOUS_TIMEOUT` (seconds) and `MESHFEED_RENDEZVOUS_FD`, as `var` gives
    /// them (`None`: unset). The runtime passes the environment. Every value out of range
    /// is an error naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Result<Option<String>>) -> Result<RendezvousConfig> {
        let required = |name: &str| -> Result<String> {
            var(name)?
                .ok_or_else(|| Error::Config(format!("{name} is not set (needed by --transport ucx without mpirun)")))
        };
        fn number<T: std::str::FromStr>(name: &str, v: String) -> Result<T> {
            v.trim().parse().map_err(|_| Error::Config(format!("{name}='{v}' is not a valid number")))
        }
        let rank: usize = number("RANK", required("RANK")?)?;
        let world: usize = number("WORLD_SIZE", required("WORLD_SIZE")?)?;
        if world == 0 || rank >= world {
            return Err(Error::Config(format!("RANK {rank} is not below WORLD_SIZE {world}")));
        }
        // Rank 0 keeps a slot per rank: a huge WORLD_SIZE must not size an allocation.
        if world > MAX_WORLD {
            return Err(Error::Config(format!("WORLD_SIZE {world} exceeds the {MAX_WORLD} ranks a rendezvous serves")));
        }
        let token = required("MESHFEED_JOB_TOKEN")?;
        if token.is_empty() || token.len() > MAX_TOKEN {
            return Err(Error::Config(format!("MESHFEED_JOB_TOKEN must have 1 to {MAX_TOKEN} bytes")));
        }
        // Empty counts as unset: Kubernetes' downward API gives "" for a missing label.
        let job_id = var("MESHFEED_JOB_ID")?.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        if let Some(id) = &job_id {
            if id.len() > MAX_JOB_ID {
                return Err(Error::Config(format!("MESHFEED_JOB_ID has {} bytes; at most {MAX_JOB_ID}", id.len())));
            }
        }
        let timeout = match var("MESHFEED_RENDEZVOUS_TIMEOUT")? {
            Some(v) => {
                let secs = v
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| *s >= MIN_TIMEOUT_SECS && *s <= MAX_TIMEOUT_SECS)
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "MESHFEED_RENDEZVOUS_TIMEOUT='{v}' is not a number of seconds from {MIN_TIMEOUT_SECS} to {MAX_TIMEOUT_SECS:e}"
                        ))
                    })?;
                // In range (finite, positive), so this cannot panic.
                Duration::from_secs_f64(secs)
            }
            None => Duration::from_secs(120),
        };
        let listen_fd = match var("MESHFEED_RENDEZVOUS_FD")? {
            Some(v) => Some(number::<i32>("MESHFEED_RENDEZVOUS_FD", v)?).filter(|_| rank == 0),
            None => None,
        };
        // MESHFEED_MASTER_PORT, when set, is meshfeed's own: under torchrun, MASTER_PORT is
        // the port of torch's store, already taken.
        let port_var = if var("MESHFEED_MASTER_PORT")?.is_some() { "MESHFEED_MASTER_PORT" } else { "MASTER_PORT" };
        let port = required(port_var)?;
        // 0 would have rank 0 listen on a port nobody knows.
        let master_port = match number::<u64>(port_var, port.clone())? {
            p @ 1..=65535 => p as u16,
            _ => return Err(Error::Config(format!("{port_var}='{port}' is not a TCP port (1-65535)"))),
        };
        Ok(RendezvousConfig {
            rank,
            world,
            master_addr: required("MASTER_ADDR")?,
            master_port,
            token,
            job_id,
            timeout,
            listen_fd,
        })
    }
}

/// Publishes `payload` and returns every rank's payload, in rank order.
pub fn exchange(cfg: &RendezvousConfig, payload: Vec<u8>) -> Result<Vec<Vec<u8>>> {
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::Transport(format!("rendezvous payload of {} bytes exceeds {MAX_PAYLOAD}", payload.len())));
    }
    if cfg.rank == 0 {
        let listener = match cfg.listen_fd {
            Some(fd) => inherited_listener(fd, cfg.master_port)?,
            None => TcpListener::bind(("0.0.0.0", cfg.master_port)).context(
                ErrorKind::Transport,
                format_args!("rendezvous: rank 0 cannot listen on port {}", cfg.master_port),
            )?,
        };
        // One write per line, errors ignored: a closed stderr must not stop rank 0.
        serve(cfg, listener, payload, &mut |line| {
            let _ = std::io::Write::write_all(&mut std::io::stderr(), format!("{line}\n").as_bytes());
        })
    } else {
        join(cfg, &payload)
    }
}

/// The listening socket a launcher passed as file descriptor `fd`, checked to be a TCP
/// socket listening on `port`. The descriptor is duplicated, so the listener owns a
/// descriptor of its own (the inherited one stays open, unused).
fn inherited_listener(fd: i32, port: u16) -> Result<TcpListener> {
    use std::os::fd::FromRawFd;
    let bad = |why: String| Error::Config(format!("MESHFEED_RENDEZVOUS_FD={fd}: {why}"));
    let mut listening: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `listening`; on an fd that is not
    // a socket it fails with ENOTSOCK (or EBADF when not open), touching nothing.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            &mut listening as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 || listening == 0 {
        return Err(bad("not a listening socket inherited from the launcher".into()));
    }
    // SAFETY: dup of a descriptor just checked to be open; the copy belongs to us alone.
    let own = unsafe { libc::dup(fd) };
    if own < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::caused(
            ErrorKind::Config,
            format!("MESHFEED_RENDEZVOUS_FD={fd}: cannot duplicate it: {e}"),
            e,
        ));
    }
    // SAFETY: `own` is an open listening socket descriptor that nothing else owns.
    let listener = unsafe { TcpListener::from_raw_fd(own) };
    let at = listener.local_addr().context(ErrorKind::Config, format_args!("MESHFEED_RENDEZVOUS_FD={fd}"))?.port();
    if at != port {
        return Err(bad(format!("it listens on port {at}, not MASTER_PORT {port}")));
    }
    Ok(listener)
}

fn put_u32(out: &mut Vec<u8>, v: usize) {
    out.extend((v as u32).to_le_bytes());
}

fn hello(cfg: &RendezvousConfig, payload: &[u8]) -> Vec<u8> {
    let mut m = MAGIC.to_vec();
    m.push(VERSION);
    m.extend((cfg.token.len() as u16).to_le_bytes());
    m.extend(cfg.token.as_bytes());
    let job_id = cfg.job_id.as_deref().unwrap_or("");
    m.extend((job_id.len() as u16).to_le_bytes());
    m.extend(job_id.as_bytes());
    put_u32(&mut m, cfg.rank);
    put_u32(&mut m, cfg.world);
    put_u32(&mut m, payload.len());
    m.extend(payload);
    m
}

fn read_u32(s: &mut impl Read) -> std::io::Result<usize> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b) as usize)
}

fn refuse(stream: &mut TcpStream, reason: &str) {
    let mut m = b"NO".to_vec();
    put_u32(&mut m, reason.len());
    m.extend(reason.as_bytes());
    let _ = stream.write_all(&m);
}

/// A client that registered.
struct Registration {
    rank: usize,
    payload: Vec<u8>,
    stream: TcpStream,
}

/// Why rank 0 refuses a connection: what the client is told (after `NO`) and the log
/// says.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// No whole hello within [`HELLO_TIMEOUT`].
    #[error("sent no complete hello within {} s", HELLO_TIMEOUT.as_secs())]
    Silent,
    /// The connection closed mid-hello.
    #[error("closed the connection before a complete hello")]
    Closed,
    /// Reading the hello failed otherwise.
    #[error("read failed: {0}")]
    Read(#[source] std::io::Error),
    /// Not our protocol: its first bytes, printable ones shown.
    #[error("not a meshfeed rendezvous client (bad magic {0:?})")]
    BadMagic(String),
    /// Our protocol, another version.
    #[error("protocol version {0} (expected {VERSION}): the ranks run different meshfeed versions")]
    Version(u8),
    /// A token longer than [`MAX_TOKEN`].
    #[error("token of {0} bytes is too long")]
    TokenTooLong(usize),
    /// Not this job's token.
    #[error("wrong job token")]
    WrongToken,
    /// A job id longer than [`MAX_JOB_ID`].
    #[error("job id of {0} bytes is too long")]
    JobIdTooLong(usize),
    /// Another job's id (each shown quoted, or `none`).
    #[error("job id {theirs} is not this job's ({ours}): a rank of another job with the same token and port")]
    OtherJob { theirs: String, ours: String },
    /// Another world size than this job's.
    #[error("WORLD_SIZE {theirs} does not match the job's {ours}")]
    WorldSize { theirs: usize, ours: usize },
    /// A rank that is not one of this job's clients (0 is the server).
    #[error("rank {rank} is not a client rank of a {world}-rank job")]
    NotAClient { rank: usize, world: usize },
    /// A payload larger than [`MAX_PAYLOAD`].
    #[error("payload of {0} bytes is too large")]
    PayloadTooLarge(usize),
}

/// Reads and checks one HELLO. `Err` carries the reason for the refusal.
fn read_hello(stream: &mut TcpStream, cfg: &RendezvousConfig) -> std::result::Result<(usize, Vec<u8>), Refusal> {
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Refusal::Silent,
        std::io::ErrorKind::UnexpectedEof => Refusal::Closed,
        _ => Refusal::Read(e),
    };
    let mut head = [0u8; 7];
    stream.read_exact(&mut head).map_err(io)?;
    if &head[..4] != MAGIC {
        let shown: String =
            head.iter().map(|&b| if b.is_ascii_graphic() || b == b' ' { b as char } else { '.' }).collect();
        return Err(Refusal::BadMagic(shown));
    }
    if head[4] != VERSION {
        return Err(Refusal::Version(head[4]));
    }
    let token_len = u16::from_le_bytes([head[5], head[6]]) as usize;
    if token_len > MAX_TOKEN {
        return Err(Refusal::TokenTooLong(token_len));
    }
    let mut token = vec![0u8; token_len];
    stream.read_exact(&mut token).map_err(io)?;
    // Constant-time comparison: do not leak how much of the token matched.
    let expected = cfg.token.as_bytes();
    let same = token.len() == expected.len() && token.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    if !same {
        return Err(Refusal::WrongToken);
    }
    // The job id is checked only now: a process without the token learns nothing of it.
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).map_err(io)?;
    let job_id_len = u16::from_le_bytes(len) as usize;
    if job_id_len > MAX_JOB_ID {
        return Err(Refusal::JobIdTooLong(job_id_len));
    }
    let mut job_id = vec![0u8; job_id_len];
    stream.read_exact(&mut job_id).map_err(io)?;
    let ours = cfg.job_id.as_deref().unwrap_or("").as_bytes();
    if job_id != ours {
        let shown = |id: &[u8]| match id.is_empty() {
            true => "none".to_string(),
            false => format!("{:?}", String::from_utf8_lossy(id)),
        };
        return Err(Refusal::OtherJob { theirs: shown(&job_id), ours: shown(ours) });
    }
    let rank = read_u32(stream).map_err(io)?;
    let world = read_u32(stream).map_err(io)?;
    if world != cfg.world {
        return Err(Refusal::WorldSize { theirs: world, ours: cfg.world });
    }
    if rank == 0 || rank >= cfg.world {
        return Err(Refusal::NotAClient { rank, world: cfg.world });
    }
    let len = read_u32(stream).map_err(io)?;
    if len > MAX_PAYLOAD {
        return Err(Refusal::PayloadTooLarge(len));
    }
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).map_err(io)?;
    Ok((rank, payload))
}

/// Rank 0: accepts connections until every rank registered or the deadline passed.
/// `log` receives one line per refused connection.
fn serve(
    cfg: &RendezvousConfig,
    listener: TcpListener,
    payload: Vec<u8>,
    log: &mut dyn FnMut(String),
) -> Result<Vec<Vec<u8>>> {
    let deadline = Instant::now() + cfg.timeout;
    listener.set_nonblocking(true).context(ErrorKind::Transport, "rendezvous")?;
    let (tx, rx) = mpsc::channel::<std::result::Result<Registration, String>>();
    let mut slots: Vec<Option<Registration>> = (0..cfg.world).map(|_| None).collect();
    let mut registered = 1; // rank 0 itself
    while registered < cfg.world {
        if Instant::now() > deadline {
            let missing: Vec<usize> = (1..cfg.world).filter(|&r| slots[r].is_none()).collect();
            let reason =
                format!("rendezvous timed out after {} s: rank(s) {missing:?} never arrived", cfg.timeout.as_secs());
            for r in slots.iter_mut().flatten() {
                refuse(&mut r.stream, &reason);
            }
            return Err(Error::Transport(reason));
        }
        match listener.accept() {
            Ok((mut stream, peer)) => {
                // Each hello is read on its own thread, so a silent client cannot stall
                // the others.
                let (tx, cfg) = (tx.clone(), cfg.clone());
                std::thread::spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
                    let r = match read_hello(&mut stream, &cfg) {
                        Ok((rank, payload)) => Ok(Registration { rank, payload, stream }),
                        Err(reason) => {
                            refuse(&mut stream, &reason.to_string());
                            Err(format!("meshfeed: rendezvous: refused connection from {peer}: {reason}"))
                        }
                    };
                    let _ = tx.send(r);
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => log(format!("meshfeed: rendezvous: accept failed: {e}")),
        }
        while let Ok(r) = rx.try_recv() {
            match r {
                Ok(mut reg) if slots[reg.rank].is_some() => {
                    let reason = format!("rank {} is already registered", reg.rank);
                    refuse(&mut reg.stream, &reason);
                    log(format!("meshfeed: rendezvous: refused a second rank {}: {reason}", reg.rank));
                }
                Ok(reg) => {
                    let r = reg.rank;
                    slots[r] = Some(reg);
                    registered += 1;
                }
                Err(line) => log(line),
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let mut table = vec![payload];
    table.extend(slots[1..].iter().map(|s| s.as_ref().expect("all registered").payload.clone()));
    let mut reply = b"OK".to_vec();
    put_u32(&mut reply, cfg.world);
    for p in &table {
        put_u32(&mut reply, p.len());
        reply.extend(p);
    }
    for reg in slots.iter_mut().flatten() {
        reg.stream
            .write_all(&reply)
            .context(ErrorKind::Transport, format_args!("rendezvous: cannot answer rank {}", reg.rank))?;
    }
    Ok(table)
}

/// Ranks other than 0: registers with rank 0 and waits for the table.
fn join(cfg: &RendezvousConfig, payload: &[u8]) -> Result<Vec<Vec<u8>>> {
    let deadline = Instant::now() + cfg.timeout;
    let target = format!("{}:{}", cfg.master_addr, cfg.master_port);
    let mut stream = loop {
        let attempt = target
            .to_socket_addrs()
            .map_err(BoxError::from)
            .and_then(|mut a| a.next().ok_or_else(|| BoxError::from("no address")))
            .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).map_err(BoxError::from));
        match attempt {
            Ok(s) => break s,
            Err(e) if Instant::now() > deadline => {
                return Err(Error::caused(
                    ErrorKind::Transport,
                    format!("rendezvous: cannot reach rank 0 at {target} within {} s: {e}", cfg.timeout.as_secs()),
                    e,
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let fail = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Transport(format!(
            "rendezvous at {target}: no answer within {} s (the other ranks never arrived?)",
            cfg.timeout.as_secs()
        )),
        _ => Error::caused(ErrorKind::Transport, format!("rendezvous at {target}: {e}"), e),
    };
    stream.write_all(&hello(cfg, payload)).map_err(fail)?;
    stream
        .set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))))
        .map_err(fail)?;
    let mut kind = [0u8; 2];
    stream.read_exact(&mut kind).map_err(fail)?;
    match &kind {
        b"OK" => {
            let world = read_u32(&mut stream).map_err(fail)?;
            if world != cfg.world {
                return Err(Error::Transport(format!(
                    "rendezvous at {target} answered for {world} ranks, not {}",
                    cfg.world
                )));
            }
            (0..world)
                .map(|_| {
                    let len = read_u32(&mut stream).map_err(fail)?;
                    if len > MAX_PAYLOAD {
                        return Err(Error::Transport(format!("rendezvous at {target}: oversized entry ({len} bytes)")));
                    }
                    let mut p = vec![0u8; len];
                    stream.read_exact(&mut p).map_err(fail)?;
                    Ok(p)
                })
                .collect()
        }
        b"NO" => {
            let len = read_u32(&mut stream).map_err(fail)?.min(4096);
            let mut reason = vec![0u8; len];
            stream.read_exact(&mut reason).map_err(fail)?;
            Err(Error::Transport(format!(
                "rendezvous at {target} refused rank {}: {}",
                cfg.rank,
                String::from_utf8_lossy(&reason)
            )))
        }
        other => Err(Error::Transport(format!("rendezvous at {target}: unexpected answer {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configuration_from_variables() {
        let vars = |extra: &[(&'static str, &'static str)]| {
            let mut all = vec![
                ("RANK", "1"),
                ("WORLD_SIZE", "3"),
                ("MASTER_ADDR", "head"),
                ("MASTER_PORT", "29500"),
                ("MESHFEED_JOB_TOKEN", "t"),
            ];
            all.extend_from_slice(extra);
            move |name: &str| -> Result<Option<String>> {
                Ok(all.iter().rev().find(|(k, _)| *k == name).map(|(_, v)| v.to_string()))
            }
        };
        let c = RendezvousConfig::from_vars(vars(&[])).unwrap();
        assert_eq!((c.rank, c.world, c.master_port, c.timeout), (1, 3, 29500, Duration::from_secs(120)));
        let err =
            |extra: &[(&'static str, &'static str)]| RendezvousConfig::from_vars(vars(extra)).unwrap_err().to_string();
        assert!(err(&[("RANK", "3")]).contains("RANK 3 is not below WORLD_SIZE 3"));
        assert!(err(&[("MASTER_PORT", "x")]).contains("MASTER_PORT='x' is not a valid number"));
        // meshfeed's own port wins over MASTER_PORT (torchrun's store holds that one).
        let own = RendezvousConfig::from_vars(vars(&[("MESHFEED_MASTER_PORT", "29611")])).unwrap();
        assert_eq!(own.master_port, 29611);
        assert!(err(&[("MESHFEED_MASTER_PORT", "0")]).contains("MESHFEED_MASTER_PORT='0' is not a TCP port"));
        for bad in ["1e19", "inf", "nan", "0", "-1", "1e-300", "-inf", ""] {
            let e = err(&[("MESHFEED_RENDEZVOUS_TIMEOUT", bad)]);
            assert!(e.contains("MESHFEED_RENDEZVOUS_TIMEOUT") && e.contains(bad), "{e}");
        }
        // Out-of-range values are errors naming the variable, never a panic or a huge
        // allocation.
        for (name, bad, needle) in [
            ("WORLD_SIZE", "99999999999", "exceeds the 1048576 ranks"),
            ("WORLD_SIZE", "-3", "WORLD_SIZE='-3' is not a valid number"),
            ("RANK", "18446744073709551616", "RANK='18446744073709551616' is not a valid number"),
            ("MASTER_PORT", "0", "MASTER_PORT='0' is not a TCP port"),
            ("MASTER_PORT", "70000", "MASTER_PORT='70000' is not a TCP port"),
            ("MESHFEED_RENDEZVOUS_FD", "99999999999", "MESHFEED_RENDEZVOUS_FD='99999999999'"),
        ] {
            let e = err(&[(name, bad)]);
            assert!(e.contains(needle), "{name}={bad}: {e}");
        }
        let long: &'static str = Box::leak("j".repeat(MAX_JOB_ID + 1).into_boxed_str());
        assert!(err(&[("MESHFEED_JOB_ID", long)]).contains("MESHFEED_JOB_ID has 257 bytes"));
        // The job id: trimmed; empty is the same as unset (no id is derived).
        assert_eq!(c.job_id, None);
        let id = |v: &'static str| RendezvousConfig::from_vars(vars(&[("MESHFEED_JOB_ID", v)])).unwrap().job_id;
        assert_eq!(id(" 4f2a \n"), Some("4f2a".to_string()));
        assert_eq!(id(""), None);
        assert_eq!(id("  "), None);
        // A listening socket handed down from a launcher: for rank 0 only, a number.
        assert_eq!(RendezvousConfig::from_vars(vars(&[("MESHFEED_RENDEZVOUS_FD", "5")])).unwrap().listen_fd, None);
        let rank0 = RendezvousConfig::from_vars(vars(&[("RANK", "0"), ("MESHFEED_RENDEZVOUS_FD", "5")])).unwrap();
        assert_eq!(rank0.listen_fd, Some(5));
        assert!(err(&[("MESHFEED_RENDEZVOUS_FD", "x")]).contains("MESHFEED_RENDEZVOUS_FD='x'"));
        let missing = RendezvousConfig::from_vars(|name: &str| {
            Ok(match name {
                "MASTER_ADDR" => None,
                "RANK" => Some("0".to_string()),
                _ => Some("1".to_string()),
            })
        });
        assert!(missing.unwrap_err().to_string().contains("MASTER_ADDR is not set"));
    }

    #[test]
    fn an_inherited_listener_must_listen_on_the_master_port() {
        use std::os::fd::AsRawFd;
        let socket = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let listener = inherited_listener(socket.as_raw_fd(), port).unwrap();
        assert_eq!(listener.local_addr().unwrap().port(), port);
        let e = inherited_listener(socket.as_raw_fd(), port.wrapping_add(1)).unwrap_err().to_string();
        assert!(e.contains("not MASTER_PORT"), "{e}");
        let file = std::fs::File::open("/dev/null").unwrap();
        let e = inherited_listener(file.as_raw_fd(), port).unwrap_err().to_string();
        assert!(e.contains("not a listening socket"), "{e}");
        assert!(inherited_listener(-1, port).is_err());
    }

    fn cfg(rank: usize, world: usize, port: u16, token: &str) -> RendezvousConfig {
        RendezvousConfig {
            rank,
            world,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            token: token.into(),
            job_id: None,
            timeout: Duration::from_secs(20),
            listen_fd: None,
        }
    }

    fn listener() -> (TcpListener, u16) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    /// The server of a job's three ranks, as the tests start it: rank 0's table and log.
    type Server = std::thread::JoinHandle<(Result<Vec<Vec<u8>>>, Vec<String>)>;

    /// Ranks 1 and 2, configured by `rank_cfg`, join the job `server` serves as rank 0, and
    /// every rank gets the table of all three payloads, in rank order; the server's log.
    fn ranks_1_and_2_get_through(rank_cfg: impl Fn(usize) -> RendezvousConfig, server: Server) -> String {
        let (one, two) = (rank_cfg(1), rank_cfg(2));
        let c1 = std::thread::spawn(move || join(&one, b"one"));
        let c2 = std::thread::spawn(move || join(&two, b"two"));
        let want: Vec<Vec<u8>> = vec![b"zero".to_vec(), b"one".to_vec(), b"two".to_vec()];
        assert_eq!(c1.join().unwrap().unwrap(), want);
        assert_eq!(c2.join().unwrap().unwrap(), want);
        let (table, log) = server.join().unwrap();
        assert_eq!(table.unwrap(), want);
        log.join("\n")
    }

    #[test]
    fn ranks_exchange_payloads_despite_hostile_connections() {
        let (l, port) = listener();
        let server = std::thread::spawn(move || {
            let mut log = Vec::new();
            let table = serve(&cfg(0, 3, port, "s3cret"), l, b"zero".to_vec(), &mut |line| log.push(line));
            (table, log)
        });
        // Hostile traffic first: HTTP, garbage, a silent connection, a wrong token.
        let mut http = TcpStream::connect(("127.0.0.1", port)).unwrap();
        http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut garbage = TcpStream::connect(("127.0.0.1", port)).unwrap();
        garbage.write_all(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4]).unwrap();
        let _silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let wrong = join(&cfg(1, 3, port, "guess"), b"intruder").unwrap_err().to_string();
        assert!(wrong.contains("refused rank 1: wrong job token"), "{wrong}");
        let wrong_world = join(&cfg(2, 4, port, "s3cret"), b"x").unwrap_err().to_string();
        assert!(wrong_world.contains("WORLD_SIZE 4 does not match the job's 3"), "{wrong_world}");
        // The real ranks still get through.
        let log = ranks_1_and_2_get_through(move |rank| cfg(rank, 3, port, "s3cret"), server);
        assert!(log.contains("bad magic \"GET /"), "{log}");
        assert!(log.contains("not a meshfeed rendezvous client"), "{log}");
        assert!(log.contains("wrong job token"), "{log}");
        assert!(log.contains("does not match"), "{log}");
    }

    #[test]
    fn a_rank_of_another_job_with_the_same_token_is_refused() {
        let (l, port) = listener();
        let with_id = move |rank, id: Option<&str>| {
            let mut c = cfg(rank, 3, port, "shared");
            c.job_id = id.map(str::to_string);
            c
        };
        let server = std::thread::spawn(move || {
            let mut log = Vec::new();
            let table = serve(&with_id(0, Some("job-a")), l, b"zero".to_vec(), &mut |line| log.push(line));
            (table, log)
        });
        // Job B's rank 1 and a rank without any job id, both holding the token.
        let other = join(&with_id(1, Some("job-b")), b"b-one").unwrap_err().to_string();
        assert!(other.contains("refused rank 1: job id \"job-b\" is not this job's (\"job-a\")"), "{other}");
        let none = join(&with_id(2, None), b"b-two").unwrap_err().to_string();
        assert!(none.contains("job id none is not this job's"), "{none}");
        // A process without the token is told nothing of the job id.
        let stranger = join(&cfg(1, 3, port, "guess"), b"x").unwrap_err().to_string();
        assert!(stranger.contains("wrong job token") && !stranger.contains("job-a"), "{stranger}");
        // Job A's own ranks still get through, and the table holds only theirs.
        let log = ranks_1_and_2_get_through(move |rank| with_id(rank, Some("job-a")), server);
        assert!(log.contains("refused connection from") && log.contains("job id \"job-b\""), "{log}");
    }

    #[test]
    fn jobs_without_a_job_id_still_rendezvous() {
        let (l, port) = listener();
        let server = std::thread::spawn(move || serve(&cfg(0, 2, port, "t"), l, b"zero".to_vec(), &mut |_| {}));
        assert_eq!(join(&cfg(1, 2, port, "t"), b"one").unwrap(), vec![b"zero".to_vec(), b"one".to_vec()]);
        assert!(server.join().unwrap().is_ok());
    }

    #[test]
    fn an_older_client_is_refused_naming_the_version() {
        let (l, port) = listener();
        let server = std::thread::spawn(move || {
            let mut log = Vec::new();
            let mut c = cfg(0, 2, port, "t");
            c.timeout = Duration::from_millis(1500);
            let r = serve(&c, l, vec![], &mut |line| log.push(line));
            (r, log)
        });
        // A version-1 hello: no job id field.
        let mut old = MAGIC.to_vec();
        old.push(1);
        old.extend(1u16.to_le_bytes());
        old.push(b't');
        for v in [1u32, 2, 3] {
            old.extend(v.to_le_bytes());
        }
        old.extend(b"one");
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&old).unwrap();
        // Read exactly the answer: the rest of the old hello is never read, so the close
        // that follows may reset the connection.
        let mut kind = [0u8; 2];
        s.read_exact(&mut kind).unwrap();
        assert_eq!(&kind, b"NO");
        let mut reason = vec![0u8; read_u32(&mut s).unwrap()];
        s.read_exact(&mut reason).unwrap();
        let reason = String::from_utf8_lossy(&reason);
        assert!(reason.contains("protocol version 1 (expected 2)"), "{reason}");
        let (r, log) = server.join().unwrap();
        assert!(r.unwrap_err().to_string().contains("rank(s) [1] never arrived"));
        assert!(log.join("\n").contains("different meshfeed versions"), "{log:?}");
    }

    #[test]
    fn missing_ranks_are_named_on_timeout() {
        let (l, port) = listener();
        let mut c = cfg(0, 3, port, "t");
        c.timeout = Duration::from_millis(1500);
        let server = std::thread::spawn(move || serve(&c, l, vec![], &mut |_| {}));
        let mut c1 = cfg(1, 3, port, "t");
        c1.timeout = Duration::from_secs(10);
        let err1 = join(&c1, b"one").unwrap_err().to_string();
        let err0 = server.join().unwrap().unwrap_err().to_string();
        assert!(err0.contains("rank(s) [2] never arrived"), "{err0}");
        assert!(err1.contains("never arrived"), "{err1}");
    }

    #[test]
    fn clients_give_up_when_rank_zero_never_listens() {
        let (l, port) = listener();
        drop(l);
        let mut c = cfg(1, 2, port, "t");
        c.timeout = Duration::from_millis(500);
        let err = join(&c, b"x").unwrap_err().to_string();
        assert!(err.contains("cannot reach rank 0 at 127.0.0.1:"), "{err}");
    }
}
