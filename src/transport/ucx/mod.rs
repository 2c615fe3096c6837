//! The UCX transport: the [`Transport`] collectives over UCP tagged messages.
//!
//! Ranks find each other through a bootstrap that exchanges UCP worker addresses (the TCP
//! [`super::rendezvous`] when there is no MPI launcher, or an MPI all-gather for
//! benchmarks); every rank then connects an endpoint to every other rank. Collectives are
//! built from one primitive, [`UcxTransport::exchange`]: post every receive, then the
//! sends (at most [`MAX_OUTSTANDING`] sends in flight, messages cut into [`CHUNK`]-byte
//! pieces, as 1–4 MiB messages are fastest here), and progress the worker until all
//! complete. Every wait has a deadline: a peer that sends nothing for the peer timeout is
//! reported lost, by rank.
//!
//! Tags are 64 bits: group id (12) | collective sequence number (20) | chunk (12) |
//! source rank in the group (20). Group id `0xfff` is reserved for aborts: a rank that
//! finds a peer lost tells every other rank why before it exits (each rank keeps one
//! receive posted per peer for that), so the others stop at once with the root cause
//! instead of waiting for their own timeouts.

mod raw;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::counts::check_send_table;
use super::{ReduceOp, Transport};
use crate::error::{Error, Result};
use crate::types::Rank;
use raw::{Context, Endpoint, Request, Worker};

/// Bytes per message piece.
pub const CHUNK: usize = 4 << 20;
/// Sends in flight at once per exchange.
pub const MAX_OUTSTANDING: usize = 64;

/// Default time a peer may stay silent inside a collective before it is reported lost.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(60);

/// Bytes of an abort message.
const ABORT_BYTES: usize = 512;
const ABORT_GROUP: u64 = 0xfff;

/// A posted receive for a peer's abort message. Field order is drop order: the request is
/// cancelled before its buffer is freed.
struct AbortSlot {
    request: Request,
    buf: Box<[u8]>,
}

struct Shared {
    // Field order is drop order: pending abort receives first, then endpoints close, then
    // the worker is destroyed.
    aborts: Vec<Option<AbortSlot>>,
    endpoints: Vec<Option<Endpoint>>,
    worker: Rc<Worker>,
    world_rank: usize,
    peer_timeout: Duration,
}

/// Collectives over UCX among a group of ranks (the world, or a split of it).
pub struct UcxTransport {
    shared: Rc<Shared>,
    /// World ranks of the group's members; index = rank in the group.
    members: Vec<usize>,
    rank: usize,
    group: u64,
    seq: Cell<u64>,
    splits: Cell<u64>,
}

impl UcxTransport {
    /// Creates the worker, publishes its address through `bootstrap` (which must return
    /// every rank's address in rank order) and connects to every peer.
    ///
    /// Lost peers are detected by `peer_timeout` and the abort messages; UCX's own peer
    /// failure reporting (`MESHFEED_UCX_PEER_ERRORS=1`) is off by default because it rules
    /// out the shared-memory transports.
    pub fn connect(
        rank: usize,
        world: usize,
        tls: Option<&str>,
        peer_timeout: Duration,
        bootstrap: impl FnOnce(Vec<u8>) -> Result<Vec<Vec<u8>>>,
    ) -> Result<UcxTransport> {
        let peer_errors = std::env::var("MESHFEED_UCX_PEER_ERRORS").is_ok_and(|v| v == "1");
        if world >= 1 << 20 {
            return Err(Error::Config(format!("UCX transport supports up to {} ranks", (1 << 20) - 1)));
        }
        let context = Rc::new(Context::new(tls)?);
        let worker = Worker::new(context)?;
        let addresses = bootstrap(worker.address()?)?;
        if addresses.len() != world {
            return Err(Error::Transport(format!(
                "bootstrap returned {} addresses for {world} ranks",
                addresses.len()
            )));
        }
        let endpoints = addresses
            .iter()
            .enumerate()
            .map(
                |(r, a)| if r == rank { Ok(None) } else { Endpoint::connect(worker.clone(), a, peer_errors).map(Some) },
            )
            .collect::<Result<Vec<_>>>()?;
        let aborts = (0..world)
            .map(|r| {
                if r == rank {
                    return Ok(None);
                }
                let mut buf = vec![0u8; ABORT_BYTES].into_boxed_slice();
                // SAFETY: the buffer is boxed (stable address) and stored next to its request
                // in an AbortSlot, whose field order drops (cancels) the request first.
                let request = unsafe { Request::recv(&worker, &mut buf, ABORT_GROUP << 52 | r as u64) }?;
                Ok(Some(AbortSlot { request, buf }))
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = Rc::new(Shared { aborts, endpoints, worker, world_rank: rank, peer_timeout });
        let t = UcxTransport {
            shared,
            members: (0..world).collect(),
            rank,
            group: 0,
            seq: Cell::new(0),
            splits: Cell::new(0),
        };
        // Wire up every endpoint before the first real collective.
        t.barrier()?;
        Ok(t)
    }

    fn tag(&self, seq: u64, chunk: usize, src: usize) -> u64 {
        (self.group & 0xfff) << 52 | (seq & 0xf_ffff) << 32 | (chunk as u64 & 0xfff) << 20 | src as u64
    }

    /// The exchange primitive: sends `sends[p]` to group rank `p` and receives exactly
    /// `recvs[p].len()` bytes from each `p` (messages to and from oneself are copied).
    fn exchange(&self, sends: &[&[u8]], recvs: &mut [&mut [u8]]) -> Result<()> {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        let n = self.members.len();
        let me = self.rank;
        recvs[me].copy_from_slice(sends[me]);
        let pieces = |len: usize| len.div_ceil(CHUNK).max(1);
        for len in sends.iter().map(|s| s.len()).chain(recvs.iter().map(|r| r.len())) {
            if pieces(len) > 0xfff {
                return Err(Error::Transport(format!("message of {len} bytes exceeds {} pieces", 0xfff)));
            }
        }
        let worker = &self.shared.worker;
        // Receives first, so that eager sends find them posted.
        let mut pending: Vec<(usize, Request)> = Vec::new();
        for p in (0..n).filter(|&p| p != me) {
            let buf = &mut *recvs[p];
            let len = buf.len();
            let mut rest: &mut [u8] = buf;
            for k in 0..pieces(len) {
                let take = rest.len().min(CHUNK);
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(take);
                rest = tail;
                // SAFETY: `recvs` outlives this function's requests: every request is
                // completed, or cancelled and completed, before it returns (Request::drop),
                // and the process exits if a cancellation cannot complete.
                pending.push((p, unsafe { Request::recv(worker, piece, self.tag(seq, k, p)) }?));
            }
        }
        let mut to_send: Vec<(usize, usize, &[u8])> = Vec::new();
        for p in (0..n).filter(|&p| p != me) {
            for (k, piece) in sends[p].chunks(CHUNK).enumerate() {
                to_send.push((p, k, piece));
            }
            if sends[p].is_empty() {
                to_send.push((p, 0, &[]));
            }
        }
        let mut next = 0;
        let mut last_progress = Instant::now();
        loop {
            if let Some(remote) = self.received_abort() {
                return Err(remote);
            }
            let mut sends_in_flight = pending.iter().filter(|(p, _)| *p >= n).count();
            while next < to_send.len() && sends_in_flight < MAX_OUTSTANDING {
                let (p, k, piece) = to_send[next];
                let ep = self.shared.endpoints[self.members[p]].as_ref().expect("endpoint to every peer");
                // SAFETY: `sends` outlives the request (same argument as for receives).
                let req = match unsafe { ep.send(piece, self.tag(seq, k, me)) } {
                    Ok(r) => r,
                    Err(e) => return Err(self.fail(self.lost(p, e))),
                };
                // Sends are marked with p + n to tell them apart from receives.
                pending.push((p + n, req));
                sends_in_flight += 1;
                next += 1;
            }
            let before = pending.len();
            let mut failure = None;
            pending.retain(|(p, r)| match r.test() {
                Ok(done) => !done,
                Err(e) => {
                    failure.get_or_insert((p % n, e));
                    false
                }
            });
            if let Some((p, e)) = failure {
                return Err(self.fail(self.lost(p, e)));
            }
            if pending.is_empty() && next == to_send.len() {
                return Ok(());
            }
            if pending.len() < before || worker.progress() {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > self.shared.peer_timeout {
                let silent: Vec<usize> = {
                    let mut v: Vec<usize> = pending.iter().map(|(p, _)| self.members[p % n]).collect();
                    v.sort_unstable();
                    v.dedup();
                    v
                };
                return Err(self.fail(Error::Transport(format!(
                    "lost rank(s) {silent:?}: no progress for {} s (peer timeout, MESHFEED_PEER_TIMEOUT)",
                    self.shared.peer_timeout.as_secs_f64()
                ))));
            }
        }
    }

    fn lost(&self, group_rank: usize, e: Error) -> Error {
        let world_rank = self.members[group_rank];
        let detail =
            self.shared.endpoints[world_rank].as_ref().and_then(Endpoint::failure).unwrap_or_else(|| e.to_string());
        Error::Transport(format!("lost rank {world_rank}: {detail}"))
    }

    /// An abort message a peer sent, if one arrived.
    fn received_abort(&self) -> Option<Error> {
        self.shared.aborts.iter().enumerate().find_map(|(r, slot)| {
            let slot = slot.as_ref()?;
            matches!(slot.request.test(), Ok(true)).then(|| {
                let end = slot.buf.iter().position(|&b| b == 0).unwrap_or(slot.buf.len());
                Error::Remote { rank: r, message: String::from_utf8_lossy(&slot.buf[..end]).into_owned() }
            })
        })
    }

    /// Turns a local failure into the job's failure: prefers an abort that a peer sent
    /// (the root cause), otherwise tells every reachable peer about `error`.
    fn fail(&self, error: Error) -> Error {
        // Give an abort already on its way a moment to arrive.
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            if let Some(remote) = self.received_abort() {
                return remote;
            }
            self.shared.worker.progress();
        }
        let mut text = error.to_string().into_bytes();
        text.truncate(ABORT_BYTES - 1);
        let me = self.shared.world_rank;
        let tag = ABORT_GROUP << 52 | me as u64;
        let requests: Vec<Request> = self
            .shared
            .endpoints
            .iter()
            .flatten()
            .filter(|ep| ep.failure().is_none())
            // SAFETY: `text` outlives the requests: they are waited for below and, if
            // still pending, cancelled by Request::drop before `text` is dropped.
            .filter_map(|ep| unsafe { ep.send(&text, tag) }.ok())
            .collect();
        let deadline = Instant::now() + Duration::from_millis(500);
        for r in requests {
            let _ = r.wait(deadline);
        }
        error
    }

    fn exchange_sizes(&self, sizes: &[usize]) -> Result<Vec<usize>> {
        let out: Vec<[u8; 8]> = sizes.iter().map(|&s| (s as u64).to_le_bytes()).collect();
        let mut inb = vec![[0u8; 8]; sizes.len()];
        {
            let sends: Vec<&[u8]> = out.iter().map(|b| &b[..]).collect();
            let mut recvs: Vec<&mut [u8]> = inb.iter_mut().map(|b| &mut b[..]).collect();
            self.exchange(&sends, &mut recvs)?;
        }
        inb.iter()
            .map(|b| {
                usize::try_from(u64::from_le_bytes(*b)).map_err(|_| Error::Transport("size does not fit usize".into()))
            })
            .collect()
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
        let n = self.size();
        check_send_table(send.len(), send_counts, n)?;
        let recv_counts = self.exchange_sizes(send_counts)?;
        let mut recv = vec![0u8; recv_counts.iter().sum()];
        let mut sends = Vec::with_capacity(n);
        let mut at = 0;
        for &c in send_counts {
            sends.push(&send[at..at + c]);
            at += c;
        }
        let mut recvs = Vec::with_capacity(n);
        let mut rest: &mut [u8] = &mut recv;
        for &c in &recv_counts {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(c);
            recvs.push(head);
            rest = tail;
        }
        self.exchange(&sends, &mut recvs)?;
        Ok((recv, recv_counts))
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let n = self.size();
        let lens = self.exchange_sizes(&vec![mine.len(); n])?;
        let mut out: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0u8; l]).collect();
        {
            let sends = vec![mine; n];
            let mut recvs: Vec<&mut [u8]> = out.iter_mut().map(|v| &mut v[..]).collect();
            self.exchange(&sends, &mut recvs)?;
        }
        Ok(out)
    }

    fn all_reduce_u64(&self, values: &mut [u64], op: ReduceOp) -> Result<()> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.all_gather(&bytes)?;
        for (i, v) in values.iter_mut().enumerate() {
            let each = all.iter().map(|b| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes")));
            *v = match op {
                ReduceOp::Sum => each.fold(0u64, u64::wrapping_add),
                ReduceOp::Max => each.max().unwrap_or(0),
                ReduceOp::Min => each.min().unwrap_or(0),
            };
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.all_reduce_u64(&mut [0], ReduceOp::Max)
    }

    fn split(&self, color: usize) -> Result<Box<dyn Transport>> {
        let colors = self.all_gather(&(color as u64).to_le_bytes())?;
        let members: Vec<usize> = colors
            .iter()
            .enumerate()
            .filter(|(_, c)| c[..] == (color as u64).to_le_bytes())
            .map(|(r, _)| self.members[r])
            .collect();
        let rank = members.iter().position(|&r| r == self.shared.world_rank).expect("own color");
        // A group id every member computes alike: from the parent, the split count and
        // the color. Collisions need more than 4095 live groups.
        let k = self.splits.get();
        self.splits.set(k + 1);
        let group = 1 + (self.group * 131 + k * 31 + color as u64) % (ABORT_GROUP - 1);
        Ok(Box::new(UcxTransport {
            shared: self.shared.clone(),
            members,
            rank,
            group,
            seq: Cell::new(0),
            splits: Cell::new(0),
        }))
    }

    fn dup(&self) -> Result<Box<dyn Transport>> {
        self.split(0)
    }
}
