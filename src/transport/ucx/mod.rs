//! The UCX transport: the [`Transport`] collectives over UCP tagged messages.
//!
//! Ranks find each other through a bootstrap that exchanges UCP worker addresses (the TCP
//! [`super::rendezvous`] when there is no MPI launcher, or an MPI all-gather for
//! benchmarks); every rank then connects an endpoint to every other rank. Collectives are
//! built from one primitive, an exchange: post every receive, then the sends (at most
//! [`MAX_OUTSTANDING`] sends in flight in the blocking path, messages cut into
//! [`CHUNK`]-byte pieces, as 1–4 MiB messages are fastest here), and progress the worker
//! until all complete. Every wait has a deadline: a peer that sends nothing for the peer
//! timeout is reported lost, by rank (ranks of the world `connect` made, in every group).
//! A transport that failed, or received a peer's abort, fails every later collective at
//! once with the same error.
//!
//! **Overlap.** The non-blocking all-to-all-v exchanges the sizes, posts every receive and
//! every send of the data exchange (unthrottled: while `during` runs nothing would post
//! queued sends, whereas its collectives progress this worker and so every request posted
//! on it), runs `during`, then waits like the blocking exchange.
//!
//! **Ownership.** A [`UcxTransport`] exclusively owns its UCP context, worker, endpoints
//! and posted requests; [`Transport::split`] and [`Transport::dup`] create a new context
//! and worker for the new group (their addresses are exchanged over the parent), so a
//! group shares nothing with its parent and may be used on another thread. The type is
//! `Send` (not `Sync`): its worker is created in serialized thread mode, so whichever one
//! thread holds the transport may use it.
//!
//! **Buffers and cancellation.** Every posted request is owned together with the buffer it
//! reads or writes (an exchange owns its send and receive buffers; an abort slot owns its
//! receive buffer). Dropping the owner cancels what is incomplete and progresses the
//! worker until it completes or [`CANCEL_DEADLINE`] passes; requests still stuck then are
//! leaked together with their buffers (one warning line on stderr), so UCX never writes
//! into freed memory and no `Drop` exits or panics.
//!
//! **Tags** are 64 bits: abort flag (1) | collective sequence number (31) | chunk (12) |
//! source rank in the group (20). Every group has its own worker, so groups never see each
//! other's messages and tags need no group id. The abort flag marks abort messages: a rank
//! that finds a peer lost tells every other member of the group why before it exits (each
//! rank keeps one receive posted per peer for that), so the others stop at once with the
//! root cause instead of waiting for their own timeouts. Aborts stay within the group whose
//! collective failed (they travel on its worker); ranks outside it stop at their own peer
//! timeout.

mod address;
pub(crate) mod raw;

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::counts::check_send_table;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::api::{ReduceOp, Transport};
use crate::types::Rank;
use raw::{Request, Worker};

/// Bytes per message piece.
pub const CHUNK: usize = 4 << 20;
/// Sends in flight at once per blocking exchange.
pub const MAX_OUTSTANDING: usize = 64;

/// Default time a peer may stay silent inside a collective before it is reported lost.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest peer timeout accepted, in seconds (about 31 years: "never", but finite).
pub const MAX_PEER_TIMEOUT_SECS: f64 = 1e9;

/// How long dropping posted requests waits for their cancellation before leaking them.
pub const CANCEL_DEADLINE: Duration = Duration::from_secs(2);

/// Bytes of an abort message.
const ABORT_BYTES: usize = 512;
/// Tag bit of abort messages; collective tags never set it.
const ABORT_BIT: u64 = 1 << 63;
/// Sequence numbers wrap at 31 bits; a wrap needs 2^31 collectives inside one overlapped
/// exchange to collide.
const SEQ_MASK: u64 = (1 << 31) - 1;
/// Pieces per message (12 tag bits).
const MAX_PIECES: usize = 0xfff;
/// Ranks per group (20 tag bits).
const MAX_RANKS: usize = 1 << 20;
/// How long a failing rank waits for a peer's abort already on its way (the root cause),
/// and then for its own abort messages to leave.
const ABORT_GRACE: Duration = Duration::from_millis(200);
const ABORT_SEND_WAIT: Duration = Duration::from_millis(500);

/// The UCX transport's settings. The transport reads no environment variable itself:
/// [`crate::runtime::Runtime::ucx_with`] is the edge that does, and hands the values to
/// [`UcxConfig::parse`] (UCX's own `UCX_*` settings are read by UCX).
#[derive(Clone, Debug, PartialEq)]
pub struct UcxConfig {
    /// UCX transports to use (overrides `UCX_TLS`); `None` leaves the choice to UCX.
    pub tls: Option<String>,
    /// Time a peer may stay silent inside a collective before it is reported lost.
    pub peer_timeout: Duration,
    /// Have UCX report peer failures on endpoints (error handling mode PEER). Off by
    /// default because it rules out the shared-memory transports.
    pub peer_errors: bool,
}

impl Default for UcxConfig {
    fn default() -> UcxConfig {
        UcxConfig { tls: None, peer_timeout: DEFAULT_PEER_TIMEOUT, peer_errors: false }
    }
}

impl UcxConfig {
    /// The settings from the values of `MESHFEED_PEER_TIMEOUT` (seconds) and
    /// `MESHFEED_UCX_PEER_ERRORS` (`1` on, `0` off; `None`: unset); `tls` stays `None`
    /// (UCX reads `UCX_TLS` itself). The runtime passes the environment's values.
    pub fn parse(peer_timeout: Option<&str>, peer_errors: Option<&str>) -> Result<UcxConfig> {
        let mut config = UcxConfig::default();
        if let Some(v) = peer_timeout {
            let not_positive =
                || Error::Config(format!("MESHFEED_PEER_TIMEOUT='{v}' is not a positive number of seconds"));
            let secs: f64 = v.trim().parse().map_err(|_| not_positive())?;
            if secs.is_nan() || secs <= 0.0 {
                return Err(not_positive());
            }
            if secs > MAX_PEER_TIMEOUT_SECS {
                return Err(Error::Config(format!(
                    "MESHFEED_PEER_TIMEOUT='{v}' is too large: at most {MAX_PEER_TIMEOUT_SECS:e} seconds"
                )));
            }
            // Finite and in range, so this cannot panic; a value below a nanosecond would
            // make every wait time out at once.
            config.peer_timeout = Duration::from_secs_f64(secs);
            if config.peer_timeout.is_zero() {
                return Err(not_positive());
            }
        }
        config.peer_errors = match peer_errors.map(str::trim) {
            None | Some("" | "0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(Error::Config(format!("MESHFEED_UCX_PEER_ERRORS='{v}' must be 1 (on) or 0 (off)")));
            }
        };
        Ok(config)
    }
}

/// A receive posted for one peer's abort message, owned together with its buffer.
struct AbortSlot {
    /// `None` only once Drop has taken it.
    request: Option<Request>,
    buf: Box<[u8]>,
}

impl AbortSlot {
    /// Posts a receive for the abort message tagged `tag` on `worker`.
    ///
    /// # Safety
    /// The slot must be dropped before `worker` (the contract of [`Worker::recv`]).
    unsafe fn post(worker: &Worker, tag: u64) -> Result<AbortSlot> {
        let mut buf = vec![0u8; ABORT_BYTES].into_boxed_slice();
        // SAFETY: the buffer is boxed (its address does not move with the slot) and owned
        // by the slot next to its request; AbortSlot::drop frees it only after the request
        // completed, or leaks it. Nothing reads it before the request completes
        // (`received_abort` tests first). The caller drops the slot before the worker.
        let request = unsafe { worker.recv(buf.as_mut_ptr(), buf.len(), tag) }?;
        Ok(AbortSlot { request: Some(request), buf })
    }
}

impl Drop for AbortSlot {
    fn drop(&mut self) {
        let mut requests: Vec<Request> = self.request.take().into_iter().collect();
        if !raw::settle(&mut requests, Instant::now() + CANCEL_DEADLINE) {
            leak_warning(requests.len(), self.buf.len());
            std::mem::forget(requests);
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

/// The one line a leak prints. Called from `Drop`: `writeln!` rather than `eprintln!`,
/// which panics when stderr fails.
fn leak_warning(requests: usize, bytes: usize) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "meshfeed: warning: {requests} UCX request(s) still incomplete {} s after cancellation; \
         leaking them with their buffers ({bytes} bytes)",
        CANCEL_DEADLINE.as_secs_f64()
    );
}

/// One posted request: its peer (rank in the group) and, for a receive, the bytes it must
/// receive.
struct Op {
    peer: usize,
    expect: Option<usize>,
    request: Request,
}

impl AsRef<Request> for Op {
    fn as_ref(&self) -> &Request {
        &self.request
    }
}

/// Requests posted on one worker together with the buffers they read (`send`) or write
/// (`recv`): the owner the cancellation rule needs. Borrows the worker, so that it is
/// dropped before it.
struct Posted<'w> {
    ops: Vec<Op>,
    send: Vec<u8>,
    recv: Vec<u8>,
    _worker: PhantomData<&'w Worker>,
}

impl<'w> Posted<'w> {
    fn new(_worker: &'w Worker, send: Vec<u8>, recv: Vec<u8>) -> Posted<'w> {
        Posted { ops: Vec::new(), send, recv, _worker: PhantomData }
    }
}

impl Drop for Posted<'_> {
    fn drop(&mut self) {
        if !raw::settle(&mut self.ops, Instant::now() + CANCEL_DEADLINE) {
            leak_warning(self.ops.len(), self.send.len() + self.recv.len());
            std::mem::forget(std::mem::take(&mut self.ops));
            std::mem::forget(std::mem::take(&mut self.send));
            std::mem::forget(std::mem::take(&mut self.recv));
        }
    }
}

/// A piece of a message still to send: destination, chunk index, bytes of the send buffer.
struct Piece {
    peer: usize,
    chunk: usize,
    range: Range<usize>,
}

/// One collective's exchange in flight.
struct Exchange<'w> {
    posted: Posted<'w>,
    /// Sends not posted yet: `queue[next..]`.
    queue: Vec<Piece>,
    next: usize,
    seq: u64,
    recv_counts: Vec<usize>,
}

impl Exchange<'_> {
    /// The received bytes (segments in rank order) and their lengths, once every request
    /// completed: the receive buffer leaves its owner only when UCX is done with it.
    fn finish(mut self) -> Result<(Vec<u8>, Vec<usize>)> {
        if !self.posted.ops.is_empty() || self.next < self.queue.len() {
            return Err(Error::Transport("internal: an exchange finished with requests in flight".into()));
        }
        Ok((std::mem::take(&mut self.posted.recv), std::mem::take(&mut self.recv_counts)))
    }
}

/// How a transport failed, kept so that every later collective fails alike at once.
enum Failed {
    Remote { rank: usize, kind: ErrorKind, message: String },
    Local(String),
}

/// Collectives over UCX among a group of ranks (the world, or a split or dup of it).
pub struct UcxTransport {
    // Field order is drop order: the abort receives (settled in AbortSlot::drop) go before
    // the worker, which closes its endpoints and then destroys itself and its context.
    aborts: Vec<Option<AbortSlot>>,
    worker: Worker,
    /// Ranks of the group's members in the world `connect` made (for messages); index =
    /// rank in the group.
    members: Vec<usize>,
    rank: usize,
    config: UcxConfig,
    seq: Cell<u64>,
    failed: RefCell<Option<Failed>>,
}

// SAFETY: every UCX handle a UcxTransport holds (context, worker, endpoints, the requests
// of its abort slots; exchanges in flight borrow it and cannot outlive a call) belongs to
// its one worker, which it owns exclusively (no Rc, nothing shared with other transports:
// splits and dups have workers of their own) and which was created in serialized thread
// mode (`Worker::new` refuses a single-threaded one), i.e. usable from any one thread at a
// time. Moving the value moves all these handles together, and the type is not Sync (it
// holds Cells), so only the thread that owns it uses the worker. UCX calls back (endpoint
// errors) only from progress, on that thread.
unsafe impl Send for UcxTransport {}

// A producer thread owns a transport: keep it Send.
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<UcxTransport>();
};

/// The error for a worker address that failed the checks of [`address`]: the job fails
/// naming the rank that published it, before UCX parses it.
fn invalid_address(rank: usize, why: address::AddressError) -> Error {
    Error::caused(ErrorKind::Transport, format!("rank {rank} published an invalid UCX worker address: {why}"), why)
}

/// Number of pieces a message of `len` bytes is cut into (an empty message is one piece).
fn pieces(len: usize) -> usize {
    len.div_ceil(CHUNK).max(1)
}

fn tag(seq: u64, chunk: usize, src: usize) -> u64 {
    (seq & SEQ_MASK) << 32 | (chunk as u64 & 0xfff) << 20 | src as u64
}

fn abort_tag(src: usize) -> u64 {
    ABORT_BIT | src as u64
}

/// Back-to-back segments of `counts` bytes.
fn segments(counts: &[usize]) -> Vec<Range<usize>> {
    let mut at = 0;
    counts
        .iter()
        .map(|&c| {
            at += c;
            at - c..at
        })
        .collect()
}

/// Reduces the contributions every rank made to an all-reduce of `count` values (each
/// `count` little-endian u64s; `ranks[i]` names contributor `i` in errors).
fn reduce_u64(contributions: &[Vec<u8>], ranks: &[usize], count: usize, op: ReduceOp) -> Result<Vec<u64>> {
    let want = count * 8;
    for (i, c) in contributions.iter().enumerate() {
        if c.len() != want {
            return Err(Error::Transport(format!(
                "rank {} sent a {}-byte contribution to an all-reduce of {count} values ({want} bytes)",
                ranks.get(i).copied().unwrap_or(i),
                c.len()
            )));
        }
    }
    let value = |c: &Vec<u8>, i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&c[i * 8..i * 8 + 8]);
        u64::from_le_bytes(b)
    };
    Ok((0..count)
        .map(|i| {
            let each = contributions.iter().map(|c| value(c, i));
            match op {
                ReduceOp::Sum => each.fold(0u64, u64::wrapping_add),
                ReduceOp::Max => each.max().unwrap_or(0),
                ReduceOp::Min => each.min().unwrap_or(0),
            }
        })
        .collect())
}

impl UcxTransport {
    /// Creates a worker, publishes its address through `bootstrap` (which must return
    /// every rank's address in rank order) and connects to every peer.
    ///
    /// Lost peers are detected by `config.peer_timeout` and the abort messages; UCX's own
    /// peer failure reporting (`config.peer_errors`) is off by default because it rules
    /// out the shared-memory transports.
    pub fn connect(
        rank: usize,
        world: usize,
        config: &UcxConfig,
        bootstrap: impl FnOnce(Vec<u8>) -> Result<Vec<Vec<u8>>>,
    ) -> Result<UcxTransport> {
        if world >= MAX_RANKS {
            return Err(Error::Config(format!("UCX transport supports up to {} ranks", MAX_RANKS - 1)));
        }
        if rank >= world {
            return Err(Error::Config(format!("rank {rank} is not below the world size {world}")));
        }
        let worker = Worker::new(config.tls.as_deref())?;
        // Published framed (see `address`): what comes back is another process's word,
        // checked before UCX parses any of it.
        let framed = bootstrap(address::frame(&worker.address()?, raw::ucx_version()))?;
        if framed.len() != world {
            return Err(Error::Transport(format!("bootstrap returned {} addresses for {world} ranks", framed.len())));
        }
        let published = framed
            .iter()
            .enumerate()
            .map(|(r, f)| address::unframe(f).map_err(|why| invalid_address(r, why)))
            .collect::<Result<Vec<_>>>()?;
        let addresses: Vec<&[u8]> = published.iter().map(|p| p.address).collect();
        let versions: Vec<(u32, u32)> = published.iter().map(|p| p.ucx).collect();
        let t = UcxTransport::build(worker, &addresses, Some(&versions), rank, (0..world).collect(), config.clone())?;
        // Wire up every endpoint before the first real collective.
        t.barrier()?;
        Ok(t)
    }

    /// A transport over `worker`, connected to the group whose members' worker addresses
    /// are `addresses` (this rank is `rank` among them; `members` are their world ranks),
    /// with an abort receive posted for every peer. No communication.
    /// `versions` are the UCX versions the members reported, where known (for messages).
    fn build(
        mut worker: Worker,
        addresses: &[&[u8]],
        versions: Option<&[(u32, u32)]>,
        rank: usize,
        members: Vec<usize>,
        config: UcxConfig,
    ) -> Result<UcxTransport> {
        if addresses.get(rank).copied() != Some(worker.address()?.as_slice()) {
            return Err(Error::Transport(format!(
                "the bootstrap did not return rank {}'s own UCX worker address in its place",
                members.get(rank).copied().unwrap_or(rank)
            )));
        }
        let ours = raw::ucx_version();
        let versions = versions.map_or_else(|| vec![ours; addresses.len()], <[_]>::to_vec);
        address::check_table(addresses, &versions, &members, rank).map_err(|(r, why)| invalid_address(r, why))?;
        worker.connect(addresses, rank, config.peer_errors)?;
        let n = members.len();
        let mut t = UcxTransport {
            aborts: Vec::with_capacity(n),
            worker,
            members,
            rank,
            config,
            seq: Cell::new(0),
            failed: RefCell::new(None),
        };
        for r in 0..n {
            let slot = if r == rank {
                None
            } else {
                // SAFETY: the slot is stored in `t.aborts`, declared before `t.worker`, so
                // it is dropped before the worker.
                Some(unsafe { AbortSlot::post(&t.worker, abort_tag(r)) }?)
            };
            t.aborts.push(slot);
        }
        Ok(t)
    }

    /// A new group (of the members of this one whose `color` equals this rank's) with a
    /// context and worker of its own, bootstrapped over this transport. Collective.
    fn new_group(&self, color: u64) -> Result<UcxTransport> {
        // Each rank contributes its color and new worker address, or nothing if it could
        // not create a worker, so that every rank learns of such a failure instead of
        // waiting for the failed rank in the group's first collective.
        let local = Worker::new(self.config.tls.as_deref()).and_then(|w| Ok((w.address()?, w)));
        let mut mine = Vec::new();
        if let Ok((address, _)) = &local {
            mine.extend_from_slice(&color.to_le_bytes());
            mine.extend_from_slice(address);
        }
        let all = self.all_gather(&mine)?;
        let (_, worker) = local?;
        let mut failed = Vec::new();
        let mut colors = Vec::with_capacity(all.len());
        for (r, c) in all.iter().enumerate() {
            match c.len() {
                0 => failed.push(self.members[r]),
                1..=8 => {
                    return Err(Error::Transport(format!(
                        "rank {} sent a {}-byte contribution to a split (a color and a worker address)",
                        self.members[r],
                        c.len()
                    )))
                }
                _ => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&c[..8]);
                    colors.push(u64::from_le_bytes(b));
                }
            }
        }
        if !failed.is_empty() {
            return Err(Error::Transport(format!("rank(s) {failed:?} could not create a UCX worker for a new group")));
        }
        let group: Vec<usize> = (0..all.len()).filter(|&r| colors[r] == color).collect();
        let rank = group.iter().position(|&r| r == self.rank).ok_or_else(|| {
            Error::Transport(format!("rank {} is missing from its own split group", self.members[self.rank]))
        })?;
        let addresses: Vec<&[u8]> = group.iter().map(|&r| &all[r][8..]).collect();
        let members = group.iter().map(|&r| self.members[r]).collect();
        let built = UcxTransport::build(worker, &addresses, None, rank, members, self.config.clone());
        // Agree on the outcome over this transport before the group's first collective,
        // so that nobody waits there for a rank that failed to connect.
        let outcomes = self.all_gather(&[u8::from(built.is_err())])?;
        let t = built?;
        let failed: Vec<usize> =
            outcomes.iter().enumerate().filter(|(_, o)| o.first() != Some(&0)).map(|(r, _)| self.members[r]).collect();
        if !failed.is_empty() {
            return Err(Error::Transport(format!("rank(s) {failed:?} could not connect a new UCX group")));
        }
        // Wire up the new endpoints.
        t.barrier()?;
        Ok(t)
    }

    fn next_seq(&self) -> u64 {
        let seq = self.seq.get();
        self.seq.set(seq.wrapping_add(1));
        seq
    }

    /// Fails at once if this transport already failed or a peer sent an abort.
    fn check_alive(&self) -> Result<()> {
        if let Some(failed) = &*self.failed.borrow() {
            return Err(match failed {
                Failed::Remote { rank, kind, message } => {
                    Error::Remote { rank: *rank, kind: *kind, message: message.clone() }
                }
                Failed::Local(message) => Error::Transport(message.clone()),
            });
        }
        match self.received_abort() {
            Some(remote) => Err(remote),
            None => Ok(()),
        }
    }

    /// Starts an exchange: sends `send[send_ranges[p]]` to group rank `p` and receives
    /// exactly `recv_counts[p]` bytes from each `p` (to and from oneself by copy). Posts
    /// every receive; the sends wait in the queue for [`UcxTransport::post_sends`].
    fn start(&self, send: Vec<u8>, send_ranges: Vec<Range<usize>>, recv_counts: Vec<usize>) -> Result<Exchange<'_>> {
        self.check_alive()?;
        let seq = self.next_seq();
        let (n, me) = (self.size(), self.rank);
        if send_ranges.len() != n
            || recv_counts.len() != n
            || send_ranges.iter().any(|r| r.start > r.end || r.end > send.len())
        {
            return Err(Error::Transport(format!(
                "internal: an exchange among {n} ranks with {} send and {} receive segments",
                send_ranges.len(),
                recv_counts.len()
            )));
        }
        // Peer-announced sizes are checked before they size an allocation.
        for p in 0..n {
            for (len, what) in [(send_ranges[p].len(), "to"), (recv_counts[p], "from")] {
                if pieces(len) > MAX_PIECES {
                    return Err(self.fail(Error::Transport(format!(
                        "a message of {len} bytes {what} rank {} exceeds {MAX_PIECES} pieces of {CHUNK} bytes",
                        self.members[p]
                    ))));
                }
            }
        }
        let total = recv_counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)).ok_or_else(|| {
            self.fail(Error::Transport(format!("received segments {recv_counts:?} add up to more than usize::MAX")))
        })?;
        let recv_ranges = segments(&recv_counts);
        let mut recv = crate::buffers::bytes(total);
        let own = &send[send_ranges[me].clone()];
        if own.len() != recv_counts[me] {
            return Err(Error::Transport(format!(
                "internal: {} bytes to oneself, {} expected",
                own.len(),
                recv_counts[me]
            )));
        }
        recv[recv_ranges[me].clone()].copy_from_slice(own);
        let mut x =
            Exchange { posted: Posted::new(&self.worker, send, recv), queue: Vec::new(), next: 0, seq, recv_counts };
        // Receives first, so that eager sends find them posted.
        for p in (0..n).filter(|&p| p != me) {
            let range = recv_ranges[p].clone();
            for k in 0..pieces(range.len()) {
                let start = range.start + k * CHUNK;
                let len = (range.end - start).min(CHUNK);
                // SAFETY: the buffer is `x.posted.recv`, owned by the same Posted as the
                // request: it is freed only after every request on it completed, or leaked
                // with them (Posted::drop). `start + len` is within it; the pieces of
                // different requests are disjoint, and nothing reads the buffer before
                // every request completed (`finish`). Posted borrows the worker, so the
                // request is dropped before it.
                let posted = unsafe { self.worker.recv(x.posted.recv.as_mut_ptr().add(start), len, tag(seq, k, p)) };
                match posted {
                    Ok(request) => x.posted.ops.push(Op { peer: p, expect: Some(len), request }),
                    Err(e) => return Err(self.fail(e)),
                }
            }
        }
        for p in (0..n).filter(|&p| p != me) {
            let range = send_ranges[p].clone();
            for k in 0..pieces(range.len()) {
                let start = range.start + k * CHUNK;
                let end = (start + CHUNK).min(range.end);
                x.queue.push(Piece { peer: p, chunk: k, range: start..end });
            }
        }
        Ok(x)
    }

    /// Posts queued sends of `x` while fewer than `limit` of its sends are in flight.
    /// Returns whether it posted any.
    fn post_sends(&self, x: &mut Exchange<'_>, limit: usize) -> Result<bool> {
        let mut in_flight = x.posted.ops.iter().filter(|op| op.expect.is_none()).count();
        let before = x.next;
        while x.next < x.queue.len() && in_flight < limit {
            let Piece { peer, chunk, ref range } = x.queue[x.next];
            // SAFETY: the buffer is `x.posted.send`, owned by the same Posted as the
            // request and never modified while it lives; it is freed only after every
            // request on it completed, or leaked with them (Posted::drop). The range lies
            // within it (checked in `start`). Posted borrows the worker, so the request is
            // dropped before it.
            let posted = unsafe {
                self.worker.send(
                    peer,
                    x.posted.send.as_ptr().add(range.start),
                    range.len(),
                    tag(x.seq, chunk, self.rank),
                )
            };
            match posted {
                Ok(request) => x.posted.ops.push(Op { peer, expect: None, request }),
                Err(e) => return Err(self.fail(self.lost(peer, e.to_string()))),
            }
            in_flight += 1;
            x.next += 1;
        }
        Ok(x.next > before)
    }

    /// Progresses the worker until every request of `x` completed, posting its queued
    /// sends (`limit` in flight). Fails on a peer's abort, a failed request, a message of
    /// the wrong length, or when nothing happens for the peer timeout.
    fn wait(&self, x: &mut Exchange<'_>, limit: usize) -> Result<()> {
        let mut last_progress = Instant::now();
        loop {
            // A collective run while this exchange was pending (an overlapped one) may have
            // failed the transport already.
            self.check_alive()?;
            let posted_any = self.post_sends(x, limit)?;
            let before = x.posted.ops.len();
            let mut failure = None;
            x.posted.ops.retain(|op| match op.request.test() {
                Ok(false) => true,
                Ok(true) => {
                    if let Some(expect) = op.expect {
                        let got = op.request.received();
                        if got != Some(expect) && failure.is_none() {
                            failure = Some(self.mismatch(op.peer, expect, got));
                        }
                    }
                    false
                }
                Err(f) => {
                    if failure.is_none() {
                        failure = Some(match op.expect {
                            Some(expect) if f.is_truncation() => Error::Transport(format!(
                                "rank {} sent more than the {expect} bytes expected (collectives out of step?)",
                                self.members[op.peer]
                            )),
                            _ => self.lost(op.peer, f.to_string()),
                        });
                    }
                    false
                }
            });
            if let Some(e) = failure {
                return Err(self.fail(e));
            }
            if x.posted.ops.is_empty() && x.next == x.queue.len() {
                return Ok(());
            }
            if posted_any || x.posted.ops.len() < before || self.worker.progress() {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > self.config.peer_timeout {
                let mut silent: Vec<usize> = x.posted.ops.iter().map(|op| self.members[op.peer]).collect();
                silent.sort_unstable();
                silent.dedup();
                return Err(self.fail(Error::Transport(format!(
                    "lost rank(s) {silent:?}: no progress for {} s (peer timeout, MESHFEED_PEER_TIMEOUT)",
                    self.config.peer_timeout.as_secs_f64()
                ))));
            } else {
                // Nothing to do: let the other ranks' processes (and threads) run.
                std::thread::yield_now();
            }
        }
    }

    /// The blocking exchange: [`UcxTransport::start`], then wait with at most
    /// [`MAX_OUTSTANDING`] sends in flight.
    fn exchange(
        &self,
        send: Vec<u8>,
        send_ranges: Vec<Range<usize>>,
        recv_counts: Vec<usize>,
    ) -> Result<(Vec<u8>, Vec<usize>)> {
        let mut x = self.start(send, send_ranges, recv_counts)?;
        self.wait(&mut x, MAX_OUTSTANDING)?;
        x.finish()
    }

    fn mismatch(&self, peer: usize, expect: usize, got: Option<usize>) -> Error {
        let got = got.map_or("an unknown number of".to_string(), |g| g.to_string());
        Error::Transport(format!(
            "rank {} sent {got} bytes where {expect} were expected (collectives out of step?)",
            self.members[peer]
        ))
    }

    fn lost(&self, peer: usize, detail: String) -> Error {
        let detail = self.worker.failure(peer).unwrap_or(detail);
        Error::Transport(format!("lost rank {}: {detail}", self.members[peer]))
    }

    /// An abort message a peer sent, if one arrived.
    fn received_abort(&self) -> Option<Error> {
        self.aborts.iter().enumerate().find_map(|(r, slot)| {
            let slot = slot.as_ref()?;
            let request = slot.request.as_ref()?;
            let rank = self.members[r];
            match request.test() {
                Ok(false) => None,
                Ok(true) => {
                    // The received length bounds the text (a peer's word, so clamped too).
                    let len = request.received().unwrap_or(0).min(slot.buf.len());
                    let text = &slot.buf[..len];
                    let end = text.iter().position(|&b| b == 0).unwrap_or(len);
                    Some(Error::Remote {
                        rank,
                        kind: ErrorKind::Transport,
                        message: String::from_utf8_lossy(&text[..end]).into_owned(),
                    })
                }
                Err(f) => Some(Error::Remote {
                    rank,
                    kind: ErrorKind::Transport,
                    message: format!("aborted (unreadable abort message: {f})"),
                }),
            }
        })
    }

    /// Turns a local failure into the job's failure: prefers an abort that a peer sent
    /// (the root cause), otherwise tells every reachable peer about `error`. Either way
    /// the transport keeps failing with the same error from then on.
    fn fail(&self, error: Error) -> Error {
        if let Err(earlier) = self.check_alive() {
            return earlier;
        }
        let error = self.fail_once(error);
        *self.failed.borrow_mut() = Some(match &error {
            Error::Remote { rank, kind, message } => {
                Failed::Remote { rank: *rank, kind: *kind, message: message.clone() }
            }
            Error::Transport(message) | Error::Caused { kind: ErrorKind::Transport, message, .. } => {
                Failed::Local(message.clone())
            }
            other => Failed::Local(other.to_string()),
        });
        error
    }

    fn fail_once(&self, error: Error) -> Error {
        // Give an abort already on its way a moment to arrive.
        let until = Instant::now() + ABORT_GRACE;
        while Instant::now() < until {
            if let Some(remote) = self.received_abort() {
                return remote;
            }
            if !self.worker.progress() {
                std::thread::yield_now();
            }
        }
        let mut text = error.to_string().into_bytes();
        text.truncate(ABORT_BYTES - 1);
        let mut posted = Posted::new(&self.worker, text, Vec::new());
        for p in (0..self.size()).filter(|&p| p != self.rank && self.worker.failure(p).is_none()) {
            // SAFETY: the buffer is `posted.send`, owned with the request and not modified;
            // Posted::drop frees it only after the request completed, or leaks it. Posted
            // borrows the worker, so the request is dropped before it.
            let sent = unsafe { self.worker.send(p, posted.send.as_ptr(), posted.send.len(), abort_tag(self.rank)) };
            if let Ok(request) = sent {
                posted.ops.push(Op { peer: p, expect: None, request });
            }
        }
        raw::drain(&mut posted.ops, Instant::now() + ABORT_SEND_WAIT);
        error
    }

    fn exchange_sizes(&self, sizes: &[usize]) -> Result<Vec<usize>> {
        let n = self.size();
        let send: Vec<u8> = sizes.iter().flat_map(|&s| (s as u64).to_le_bytes()).collect();
        let (recv, _) = self.exchange(send, (0..n).map(|p| p * 8..p * 8 + 8).collect(), vec![8; n])?;
        // `wait` checked that every peer sent exactly 8 bytes.
        recv.chunks_exact(8)
            .zip(&self.members)
            .map(|(b, &rank)| {
                let mut v = [0u8; 8];
                v.copy_from_slice(b);
                let v = u64::from_le_bytes(v);
                usize::try_from(v)
                    .map_err(|_| Error::Transport(format!("rank {rank} announced {v} bytes, more than usize::MAX")))
            })
            .collect()
    }

    /// The sizes exchange and the start of an all-to-all-v's data exchange.
    fn start_all_to_all(&self, send: Vec<u8>, send_counts: &[usize]) -> Result<Exchange<'_>> {
        check_send_table(send.len(), send_counts, self.size())?;
        let recv_counts = self.exchange_sizes(send_counts)?;
        self.start(send, segments(send_counts), recv_counts)
    }
}

impl Transport for UcxTransport {
    fn rank(&self) -> Rank {
        Rank(self.rank)
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    fn all_to_all_v(&self, send: Vec<u8>, send_counts: &[usize]) -> Result<(Vec<u8>, Vec<usize>)> {
        let mut x = self.start_all_to_all(send, send_counts)?;
        self.wait(&mut x, MAX_OUTSTANDING)?;
        x.finish()
    }

    fn all_to_all_v_overlapped(
        &self,
        send: Vec<u8>,
        send_counts: &[usize],
        during: &mut dyn FnMut(),
    ) -> Result<(Vec<u8>, Vec<usize>)> {
        let mut x = self.start_all_to_all(send, send_counts)?;
        // Every send is posted before `during`: its own collectives progress this worker,
        // and so the posted requests, but nothing would post sends still queued here.
        // MAX_OUTSTANDING is only a throttle, so lifting it is correct.
        self.post_sends(&mut x, usize::MAX)?;
        during();
        self.wait(&mut x, usize::MAX)?;
        x.finish()
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.size();
        let lens = self.exchange_sizes(&vec![mine.len(); n])?;
        // One copy of `mine`; every peer's send reads all of it.
        let (recv, lens) = self.exchange(mine.to_vec(), vec![0..mine.len(); n], lens)?;
        Ok(segments(&lens).into_iter().map(|r| recv[r].to_vec()).collect())
    }

    fn all_reduce_u64(&self, values: &mut [u64], op: ReduceOp) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.all_gather(&bytes)?;
        let reduced = reduce_u64(&all, &self.members, values.len(), op)?;
        values.copy_from_slice(&reduced);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.all_reduce_u64(&mut [0], ReduceOp::Max)
    }

    fn split(&self, color: usize) -> Result<Box<dyn Transport>> {
        Ok(Box::new(self.new_group(color as u64)?))
    }

    fn dup(&self) -> Result<Box<dyn Transport>> {
        Ok(Box::new(self.new_group(0)?))
    }
}

#[cfg(test)]
mod tests;
