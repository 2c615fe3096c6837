//! The feeder's side: the dataset read once and held in memory, as much of it as the
//! memory budget allows, and a thread per client connection answering requests for rows.
//!
//! With [`Feeder::share_memory`], each held file lives in a memory region the feeder's
//! host shares ([`crate::runtime::shared_memory`]): a client on that host that proves it
//! sees the region (the [`wire::Share`] probe) receives where the rows' values lie instead
//! of the values, and reads them from its own mapping of the same pages. However many
//! jobs on the host read a file, its bytes are in memory once and never copied through
//! a socket.

use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::admission::{accept_passes, before_hello, Admitted, ByDeadline, Limits, Throttled, Ticket};
use super::cache::{Claim, RowCache, Values};
use super::ucx::Link;
use super::wire::{self, Hello, Request, WireError};
use crate::dataset::gen::Manifest;
use crate::dataset::{Dataset, Field, FileInfo, FileReader, RowChunk};
use crate::error::{Error, Result};
use crate::runtime::memory::MemoryLimits;
use crate::runtime::shared_memory::Region;
use crate::transport::Transport;

/// How often a request waiting for a file not read yet tells its client so.
/// (Half the shortest answer timeout a client allows.)
const KEEP_ALIVE: Duration = if cfg!(test) { Duration::from_millis(20) } else { Duration::from_millis(500) };

/// Bytes a held value costs besides its own (its place in the chunk's index).
const VALUE_OVERHEAD: u64 = 24;

/// How long writing to a client that presented the token may block: a client reads its
/// answers as they come, and one that stops reading gives its thread back after this.
const WRITE_TIMEOUT: Duration = Duration::from_secs(300);

/// The least time a read waits (a socket timeout of zero would mean no timeout).
const MIN_WAIT: Duration = Duration::from_millis(1);

/// A connection past its hello: its halves, and its UCX link where it has one.
type Greeted = (BufReader<TcpStream>, BufWriter<TcpStream>, Option<Link>);

/// The feeder rank that serves file `file`, of a feeder of `ranks` ranks.
pub fn owner(file: usize, ranks: usize) -> usize {
    file % ranks.max(1)
}

/// The memory holding `info`'s rows takes (estimated from its header): its fixed-size
/// values, its variable-length values where the header tells their size (else the file's
/// size), and each value's place in the chunk.
pub fn held_bytes(info: &FileInfo, fields: &[Field]) -> u64 {
    let values: u64 = fields
        .iter()
        .enumerate()
        .map(|(f, field)| match field.fixed_bytes() {
            Some(b) => b as u64 * info.samples,
            None => info.value_bytes.get(f).copied().unwrap_or(info.bytes),
        })
        .sum();
    values + VALUE_OVERHEAD * info.samples * fields.len() as u64
}

/// Which of `mine` (a feeder rank's files, in order) it holds in `budget` bytes: each
/// that still fits, in order ([`held_bytes`]). The others are read from storage when a
/// client asks for their rows.
pub fn choose_held(files: &[FileInfo], fields: &[Field], mine: &[usize], budget: u64) -> Vec<usize> {
    choose_held_left(files, fields, mine, budget).0
}

/// How a feeder rank spends its `budget`: the files it holds, and the bytes of its cache
/// of rows read from storage. Where its files all fit it holds them all and caches
/// nothing; else it holds what fits in 7/8 of the budget ([`choose_held`]) and the rest
/// caches rows ([`super::cache`]).
pub fn plan_memory(files: &[FileInfo], fields: &[Field], mine: &[usize], budget: u64) -> (Vec<usize>, u64) {
    let (held, _) = choose_held_left(files, fields, mine, budget);
    if held.len() == mine.len() {
        return (held, 0);
    }
    let (held, left) = choose_held_left(files, fields, mine, budget - budget / 8);
    (held, left + budget / 8)
}

/// [`choose_held`], and the bytes of `budget` left.
fn choose_held_left(files: &[FileInfo], fields: &[Field], mine: &[usize], budget: u64) -> (Vec<usize>, u64) {
    let mut left = budget;
    let mut held = Vec::new();
    for &i in mine {
        let need = held_bytes(&files[i], fields);
        if need <= left {
            left -= need;
            held.push(i);
        }
    }
    (held, left)
}

/// The memory budget of one feeder rank: its host's (`host_budget`, or else 3/4 of the
/// least headroom its ranks on that host report, as `meshfeed run` budgets; never past
/// that headroom), shared evenly by the feeder's ranks on the host. Collective.
pub fn rank_budget(comm: &dyn Transport, host_budget: Option<u64>) -> Result<u64> {
    let hosts = crate::transport::hosts::host_groups(comm)?;
    let all = crate::runtime::memory::all_headrooms(comm, &MemoryLimits::of_this_process())?;
    let mine = hosts[comm.rank().0];
    let (mut room, mut members) = (u64::MAX, 0u64);
    for (&headroom, _) in all.iter().zip(&hosts).filter(|&(_, &h)| h == mine) {
        room = room.min(headroom);
        members += 1;
    }
    let host = match host_budget {
        Some(b) => b.min(room),
        None => crate::runtime::memory::auto_budget(room, members as usize, 0),
    };
    Ok(host / members.max(1))
}

/// One file's rows on a feeder rank, as loading goes.
enum Slot {
    /// Another rank's file.
    Other,
    /// Not read yet: requests for it wait.
    Loading,
    /// Read, with the region that holds its values where the memory is shared.
    Loaded(Arc<RowChunk>, Option<Arc<Region>>),
    /// Past the rank's memory budget: each request reads its rows from storage.
    Storage,
    /// Reading it failed: requests for it are refused with this.
    Failed(String),
}

/// What one feeder rank has done: from storage, and for its clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeederStats {
    /// Files held in memory, and their bytes read (once, each whole).
    pub held_files: u64,
    pub bytes_loaded: u64,
    /// Files read from storage on request (past the memory budget), and the bytes of
    /// those reads.
    pub storage_files: u64,
    pub storage_bytes: u64,
    /// The cache of rows read from storage: its capacity in bytes, and the rows it
    /// answered (each a row some request did not read from storage again).
    pub cache_capacity: u64,
    pub cache_rows: u64,
    /// Jobs that attached here (a job's rank 0 asks rank 0 of the feeder for the file
    /// headers once), connections accepted (a job's process opens one a feeder rank it
    /// reads from, besides), requests answered and bytes sent, over every client.
    pub jobs: u64,
    pub connections: u64,
    pub requests: u64,
    pub bytes_sent: u64,
    /// Bytes of values answered by where they lie in the feeder's shared memory (read by
    /// same-host clients from their mapping of it), not sent.
    pub bytes_mapped: u64,
    /// Bytes of answers sent over UCX (`--client-transport ucx`), not over the
    /// connections (`bytes_sent` counts those).
    pub bytes_ucx: u64,
    /// Connections closed as soon as they were accepted, [`Limits::connections`] being
    /// open, and connections closed while waiting for their hello to make room for newer
    /// ones ([`Limits::unauthenticated`]).
    pub turned_away: u64,
    pub evicted: u64,
}

/// A dataset held in memory for its clients: the files one feeder rank serves. It serves
/// from the start: a request for a file not read yet waits until [`Feeder::load`] has
/// read it. Files past its memory budget are read from storage, row by row as asked.
pub struct Feeder {
    dataset: Dataset,
    name: String,
    token: String,
    /// What a client that presents the token receives (JSON): the files' headers and
    /// each file's feeder address ([`Feeder::set_addresses`]).
    welcome: Vec<u8>,
    slots: Mutex<Vec<Slot>>,
    /// Signalled as each file is read (or fails).
    read: Condvar,
    /// A reader of each file read on request, kept between requests.
    readers: Vec<Mutex<Option<Box<dyn FileReader>>>>,
    /// Rows read on request, for the next requests that ask for them.
    cache: RowCache,
    /// The probe region a same-host client reads to prove it sees this feeder's memory,
    /// and the nonce it holds ([`Feeder::share_memory`]; `None`: memory not shared).
    share: Option<(Region, [u8; 16])>,
    /// Whether clients are offered UCX for large answers ([`Feeder::offer_ucx`]).
    ucx: bool,
    /// What peers may hold ([`Feeder::set_limits`]), and what they hold now.
    limits: Limits,
    admitted: Arc<Admitted>,
    /// The most bytes a request may hold: one for every row of the largest file.
    max_request: u64,
    /// The thread reading the held files while [`Feeder::load`] runs (0: none), whose
    /// reads from storage tell waiting clients that loading makes progress.
    loader: AtomicI32,
    /// The most progress reported so far ([`Feeder::progress`]).
    progress: AtomicU64,
    /// Why connections ended before their token, logged at most every ten seconds.
    strangers: Mutex<Throttled>,
    /// How long reading the held files took ([`Feeder::load`]).
    load_time: Mutex<Duration>,
    bytes_loaded: AtomicU64,
    storage_bytes: AtomicU64,
    jobs: AtomicU64,
    connections: AtomicU64,
    requests: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_mapped: AtomicU64,
    bytes_ucx: AtomicU64,
    turned_away: AtomicU64,
}

impl Feeder {
    /// Rank `rank` of a feeder of `ranks` ranks for `dataset`, holding nothing yet; it
    /// serves the files [`owner`] gives it, and spends `budget` bytes as [`plan_memory`]
    /// says. The dataset delivers its files' own rows: packing and field
    /// selection are the clients' options.
    pub fn new(dataset: Dataset, rank: usize, ranks: usize, name: &str, token: String, budget: u64) -> Result<Feeder> {
        if dataset.options().pack.is_some() || dataset.options().fields.is_some() {
            return Err(Error::Config(
                "a feeder serves whole files: sequence packing and field selection are the clients' options".into(),
            ));
        }
        let files = dataset.files().len();
        let mine: Vec<usize> = (0..files).filter(|&i| owner(i, ranks) == rank).collect();
        let mut held = vec![false; files];
        let (chosen, cache) = plan_memory(dataset.files(), dataset.fields(), &mine, budget);
        chosen.into_iter().for_each(|i| held[i] = true);
        let slots = (0..files)
            .map(|i| match (owner(i, ranks) == rank, held[i]) {
                (false, _) => Slot::Other,
                (true, true) => Slot::Loading,
                (true, false) => Slot::Storage,
            })
            .collect();
        let max_rows = dataset.files().iter().map(|f| f.samples).max().unwrap_or(0);
        Ok(Feeder {
            max_request: wire::request_bound(max_rows),
            name: name.into(),
            token,
            welcome: Vec::new(),
            slots: Mutex::new(slots),
            read: Condvar::new(),
            readers: (0..files).map(|_| Mutex::new(None)).collect(),
            cache: RowCache::new(cache),
            share: None,
            ucx: false,
            limits: Limits::default(),
            admitted: Arc::default(),
            loader: AtomicI32::new(0),
            progress: AtomicU64::new(0),
            strangers: Mutex::default(),
            dataset,
            load_time: Mutex::new(Duration::ZERO),
            bytes_loaded: AtomicU64::new(0),
            storage_bytes: AtomicU64::new(0),
            jobs: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_mapped: AtomicU64::new(0),
            bytes_ucx: AtomicU64::new(0),
            turned_away: AtomicU64::new(0),
        })
    }

    /// Sets what peers may hold ([`Limits`]; the defaults otherwise).
    pub fn set_limits(&mut self, limits: Limits) {
        self.limits = limits;
    }

    /// Bytes this rank has read from storage so far: the files held and the rows read on
    /// request, and, while the held files are read, what the reading thread has read of
    /// the file it is on (the kernel's count, so that one long read shows progress too).
    /// Never less than it said before.
    fn progress(&self) -> u64 {
        let done = self.bytes_loaded.load(Ordering::Relaxed) + self.storage_bytes.load(Ordering::Relaxed);
        let reading = match self.loader.load(Ordering::Relaxed) {
            0 => 0,
            tid => crate::runtime::thread_read_bytes(tid),
        };
        let now = done.saturating_add(reading);
        self.progress.fetch_max(now, Ordering::Relaxed).max(now)
    }

    /// Offers clients UCX for answers of at least [`super::ucx::MIN_BYTES`]: each
    /// connection that takes the offer gets a UCX worker of its own ([`super::ucx`]).
    /// An error where this build has no UCX.
    pub fn offer_ucx(&mut self) -> Result<()> {
        if !cfg!(feature = "ucx") {
            Link::new()?;
        }
        self.ucx = true;
        Ok(())
    }

    /// Keeps the files this rank holds in memory its host shares, so that clients on the
    /// host map them (module docs). Returns whether it can: not where `memfd_create` or
    /// `mmap` fails. Call it before [`Feeder::load`].
    pub fn share_memory(&mut self) -> Result<bool> {
        let nonce: [u8; 16] = super::random_bytes()?;
        let shared =
            // (Unsealed, where the kernel has no seals, clients would refuse to map it.)
            Region::create(c"meshfeed-feeder", nonce.len()).ok().filter(|probe| probe.sealed()).map(|probe| {
                // SAFETY: nobody sees the probe before this function returns.
                unsafe { probe.bytes_to_fill(0..nonce.len()) }.copy_from_slice(&nonce);
                (probe, nonce)
            });
        self.share = shared;
        Ok(self.share.is_some())
    }

    /// Reads the files this rank holds, each whole, one after another, handing each to
    /// the requests waiting for it. A file that cannot be read is an error here and the
    /// refusal of every request for it.
    pub fn load(&self) -> Result<()> {
        let start = Instant::now();
        self.loader.store(crate::runtime::thread_id(), Ordering::Relaxed);
        let loaded = self.load_held();
        self.loader.store(0, Ordering::Relaxed);
        *self.load_time.lock().unwrap_or_else(PoisonError::into_inner) = start.elapsed();
        loaded
    }

    /// [`Feeder::load`]'s reads.
    fn load_held(&self) -> Result<()> {
        let mut arena = None;
        for (i, info) in self.dataset.files().iter().enumerate() {
            if !matches!(self.slots()[i], Slot::Loading) {
                continue;
            }
            let rows: Vec<u64> = (0..info.samples).collect();
            let (slot, result) = match self.dataset.open_reader(i).and_then(|mut r| r.read_rows(&rows)) {
                Ok(chunk) => {
                    self.bytes_loaded.fetch_add(chunk.bytes_read(), Ordering::Relaxed);
                    let (chunk, region) = match &self.share {
                        Some(_) => into_region(chunk, &mut arena),
                        None => (chunk, None),
                    };
                    (Slot::Loaded(Arc::new(chunk), region), Ok(()))
                }
                Err(e) => (Slot::Failed(format!("the feeder could not read it: {e}")), Err(e)),
            };
            self.slots()[i] = slot;
            self.read.notify_all();
            result?;
        }
        Ok(())
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells clients where each file is served: `addresses[r]` (`HOST:PORT`) is feeder rank
    /// `r`'s; `files` are the dataset's headers, and `manifest` the generator's where the
    /// files are `meshfeed gen`'s (clients' `--verify` then checks contents).
    pub fn set_addresses(
        &mut self,
        files: &[FileInfo],
        addresses: &[String],
        manifest: Option<Manifest>,
    ) -> Result<()> {
        let owners = (0..files.len()).map(|i| addresses[owner(i, addresses.len())].clone()).collect();
        self.welcome = crate::feed::welcome::welcome_json(files, owners, manifest)?;
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The files this rank serves.
    pub fn files(&self) -> usize {
        self.slots().iter().filter(|s| !matches!(s, Slot::Other)).count()
    }

    /// How long reading the held files took (once [`Feeder::load`] is done).
    pub fn load_time(&self) -> Duration {
        *self.load_time.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What this rank has read and served so far.
    pub fn stats(&self) -> FeederStats {
        let slots = self.slots();
        let count = |f: fn(&Slot) -> bool| slots.iter().filter(|s| f(s)).count() as u64;
        FeederStats {
            held_files: count(|s| matches!(s, Slot::Loading | Slot::Loaded(..))),
            bytes_loaded: self.bytes_loaded.load(Ordering::Relaxed),
            storage_files: count(|s| matches!(s, Slot::Storage)),
            storage_bytes: self.storage_bytes.load(Ordering::Relaxed),
            cache_capacity: self.cache.capacity(),
            cache_rows: self.cache.hits(),
            jobs: self.jobs.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            bytes_mapped: self.bytes_mapped.load(Ordering::Relaxed),
            bytes_ucx: self.bytes_ucx.load(Ordering::Relaxed),
            turned_away: self.turned_away.load(Ordering::Relaxed),
            evicted: self.admitted.evicted(),
        }
    }

    /// Accepts clients on `listener` until it fails, a thread per connection, within the
    /// [`Limits`]: a connection past them is closed at once, and a failure to accept that
    /// passes (descriptors or memory running out, a peer that left before it was accepted)
    /// is logged and waited out, never the end of the feeder. A connection's failure (a
    /// client that dies, a stranger) ends that connection only.
    pub fn serve(self: Arc<Self>, listener: TcpListener) -> Result<()> {
        let mut backoff = Duration::ZERO;
        let (mut accept_log, mut busy_log) = (Throttled::default(), Throttled::default());
        loop {
            let (stream, peer) = match listener.accept() {
                Ok(accepted) => {
                    backoff = Duration::ZERO;
                    accepted
                }
                Err(e) if accept_passes(&e) => {
                    backoff = (backoff * 2).clamp(Duration::from_millis(5), Duration::from_secs(1));
                    accept_log.log(|| format!("meshfeed serve: {}: accept: {e}; serving on", self.name));
                    std::thread::sleep(backoff);
                    continue;
                }
                Err(e) => return Err(Error::Transport(format!("accept: {e}"))),
            };
            // A handle to close it by, should a newer connection need its place.
            let handle = match stream.try_clone() {
                Ok(handle) => handle,
                Err(e) => {
                    accept_log.log(|| format!("meshfeed serve: {}: accept: {e}; serving on", self.name));
                    continue;
                }
            };
            let Some(ticket) = Ticket::take(&self.admitted, &self.limits, handle) else {
                self.turned_away.fetch_add(1, Ordering::Relaxed);
                busy_log.log(|| {
                    let (open, waiting) = self.admitted.counts();
                    format!(
                        "meshfeed serve: {}: closing a connection from {peer}: {open} open (at most {}), {waiting} of \
                         them before their token",
                        self.name, self.limits.connections
                    )
                });
                continue;
            };
            let feeder = self.clone();
            let spawned = std::thread::Builder::new()
                .name("meshfeed-client".into())
                .spawn(move || feeder.connection(stream, peer, ticket));
            if let Err(e) = spawned {
                // The connection (moved into the closure) is closed; the feeder serves on.
                accept_log.log(|| format!("meshfeed serve: {}: no thread for a client ({e}); serving on", self.name));
            }
        }
    }

    /// One client connection from `peer`: the hello (within [`Limits::hello_timeout`], or
    /// it is closed), then requests until the client closes. Why a connection ended before
    /// the token is logged at most every ten seconds (strangers could flood the log);
    /// after it, always.
    fn connection(&self, stream: TcpStream, peer: std::net::SocketAddr, mut ticket: Ticket) {
        let (r, w, link) = match self.greet(stream, &mut ticket) {
            Ok(Some(greeted)) => greeted,
            Ok(None) => return,
            Err(e) => {
                let mut log = self.strangers.lock().unwrap_or_else(PoisonError::into_inner);
                log.log(|| format!("meshfeed serve: {}: client {peer}: {e}", self.name));
                return;
            }
        };
        if let Err(e) = self.requests(r, w, link) {
            eprintln!("meshfeed serve: {}: client {peer}: {e}", self.name);
        }
    }

    /// A connection's hello, the answer to it, and the UCX handshake where the client asks
    /// for one, all within [`Limits::hello_timeout`]: the connection's two halves and its
    /// UCX link, once the client presented the token (from then on, `ticket` no longer
    /// waits: the connection is never closed to make room); `None` where it closed first.
    fn greet(&self, stream: TcpStream, ticket: &mut Ticket) -> std::io::Result<Option<Greeted>> {
        stream.set_nodelay(true)?;
        let hello_by = Instant::now() + self.limits.hello_timeout;
        stream.set_write_timeout(Some(self.limits.hello_timeout))?;
        let hello = wire::read_frame(&mut ByDeadline { stream: &stream, deadline: hello_by }, wire::MAX_HELLO);
        let Some(hello) = hello.map_err(|e| before_hello(e, self.limits.hello_timeout))? else { return Ok(None) };
        let welcome = self.welcome(&hello);
        let refused = welcome.as_ref().err().cloned();
        if refused.is_none() {
            // Before the client hears it is welcome, and may rely on the connection.
            ticket.authenticated();
        }
        let mut r = BufReader::new(stream.try_clone()?);
        let mut w = BufWriter::new(stream);
        wire::write_frame(&mut w, &wire::answer(welcome))?;
        if let Some(reason) = refused {
            return Err(std::io::Error::other(format!("refused: {reason}")));
        }
        self.connections.fetch_add(1, Ordering::Relaxed);
        let link = match Hello::decode(&hello) {
            Ok(hello) if hello.ucx => {
                r.get_ref().set_read_timeout(Some(hello_by.saturating_duration_since(Instant::now()).max(MIN_WAIT)))?;
                self.ucx_handshake(&mut r, &mut w).map_err(|e| before_hello(e, self.limits.hello_timeout))?
            }
            _ => None,
        };
        Ok(Some((r, w, link)))
    }

    /// A client's requests, each answered, until it closes the connection. The client holds
    /// the token: it may stay idle between epochs (no read timeout), and reads its answers
    /// as they come (a write blocked for [`WRITE_TIMEOUT`] ends the connection).
    fn requests(
        &self,
        mut r: BufReader<TcpStream>,
        mut w: BufWriter<TcpStream>,
        mut link: Option<Link>,
    ) -> std::io::Result<()> {
        r.get_ref().set_read_timeout(None)?;
        w.get_ref().set_write_timeout(Some(WRITE_TIMEOUT))?;
        // Tags no stranger can guess: a UCX message is matched by its tag alone.
        let mut tag = u64::from_le_bytes(super::random_bytes().map_err(std::io::Error::other)?);
        loop {
            let Some(len) = wire::read_frame_len(&mut r)? else { return Ok(()) };
            let frame = match wire::read_payload(&mut r, len, self.max_request) {
                Ok(frame) => frame,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    // Nothing allocated: the connection ends with the reason, the feeder serves on.
                    let reason = WireError::Refused(format!(
                        "a request of {len} bytes; a request for rows of this dataset holds at most {}",
                        self.max_request
                    ));
                    let _ = wire::write_frame(&mut w, &wire::answer(Err(reason.clone())));
                    return Err(std::io::Error::other(format!("bad request: {reason}")));
                }
                Err(e) => return Err(e),
            };
            let mut still_reading = || wire::write_frame(&mut w, &wire::still_reading(self.progress())).is_ok();
            match Request::decode(&frame).and_then(|request| self.rows(&request, &mut still_reading)) {
                Ok(answer) => {
                    self.requests.fetch_add(1, Ordering::Relaxed);
                    let over_tcp = match &link {
                        Some(ucx) if goes_over_ucx(&answer) => {
                            tag = tag.wrapping_add(1);
                            let failed = self.send_over_ucx(ucx, answer, tag, &mut w)?;
                            if failed.is_some() {
                                // It goes over the connection, and so will every later one.
                                link = None;
                            }
                            failed
                        }
                        _ => Some(answer),
                    };
                    if let Some(answer) = over_tcp {
                        self.bytes_sent.fetch_add(answer.len() as u64, Ordering::Relaxed);
                        wire::write_frame(&mut w, &answer)?;
                    }
                }
                Err(reason) => {
                    wire::write_frame(&mut w, &wire::answer(Err(reason.clone())))?;
                    return Err(std::io::Error::other(format!("bad request: {reason}")));
                }
            }
        }
    }

    /// Sends `values` (an answer) over `ucx` tagged `tag`, announced on the connection
    /// `w`. Returns them where the send failed and they can go over the connection (the
    /// client stops waiting for UCX when it sees them); where UCX may still read them,
    /// the client is told and the connection ends.
    fn send_over_ucx(
        &self,
        ucx: &Link,
        values: Vec<u8>,
        tag: u64,
        w: &mut BufWriter<TcpStream>,
    ) -> std::io::Result<Option<Vec<u8>>> {
        let (len, announced) = (values.len() as u64, wire::via_ucx(values.len(), tag));
        self.bytes_sent.fetch_add(announced.len() as u64, Ordering::Relaxed);
        wire::write_frame(w, &announced)?;
        let stream = w.get_ref();
        let mut waiting = || !matches!(super::peek(stream), super::Peeked::Closed(_));
        match ucx.send(values, tag, &mut waiting) {
            Ok(()) => {
                self.bytes_ucx.fetch_add(len, Ordering::Relaxed);
                Ok(None)
            }
            Err((why, Some(values))) => {
                eprintln!("meshfeed serve: {}: UCX send failed ({why}); answering over TCP", self.name);
                Ok(Some(values))
            }
            Err((why, None)) => {
                let failed = WireError::Connection(format!("the feeder's UCX send failed: {why}"));
                wire::write_frame(w, &wire::answer(Err(failed.clone())))?;
                Err(std::io::Error::other(failed))
            }
        }
    }

    /// After the welcome of a client that can take UCX: this side's worker address (empty
    /// where UCX is not offered, or no worker could be made), then the client's (empty:
    /// it declined). The link, where both gave one.
    fn ucx_handshake(
        &self,
        r: &mut BufReader<TcpStream>,
        w: &mut BufWriter<TcpStream>,
    ) -> std::io::Result<Option<Link>> {
        let (link, address) = match self.ucx.then(Link::new) {
            Some(Ok((link, address))) => (Some(link), address),
            Some(Err(e)) => {
                eprintln!("meshfeed serve: {}: no UCX worker for a client ({e}); answering it over TCP", self.name);
                (None, Vec::new())
            }
            None => (None, Vec::new()),
        };
        wire::write_frame(w, &address)?;
        let theirs = wire::read_frame(r, wire::MAX_HELLO)?.unwrap_or_default();
        match link {
            Some(mut link) if !theirs.is_empty() => match link.connect(&theirs) {
                Ok(()) => Ok(Some(link)),
                // The client takes answers over the connection as well.
                Err(e) => {
                    eprintln!(
                        "meshfeed serve: {}: cannot reach a client's UCX worker ({e}); answering it over TCP",
                        self.name
                    );
                    Ok(None)
                }
            },
            _ => Ok(None),
        }
    }

    /// The answer to a hello: the files' headers (where asked for; else how to reach this
    /// feeder's shared memory, where it shares it), or why the client is refused.
    fn welcome(&self, hello: &[u8]) -> std::result::Result<Vec<u8>, WireError> {
        let hello = Hello::decode(hello)?;
        if !super::same_token(&hello.token, &self.token) {
            return Err(refused("the feeder's token was not presented (wrong token)"));
        }
        if hello.name != self.name {
            return Err(refused(format!("this feeder serves '{}', not '{}'", self.name, hello.name)));
        }
        if !hello.headers {
            let share = self.share.as_ref().and_then(|(probe, nonce)| {
                Some(wire::Share { pid: std::process::id(), fd: probe.fd()?, nonce: *nonce }.encode())
            });
            return Ok(share.unwrap_or_default());
        }
        self.jobs.fetch_add(1, Ordering::Relaxed);
        Ok(self.welcome.clone())
    }

    /// The answer to one request: its rows' values ([`wire::rows_answer`]), or where they
    /// lie in a shared region ([`wire::Mapped`]) for a client that mapped this feeder's
    /// memory, where that answer is the smaller. A request for
    /// a file not read yet waits for it, calling `still_reading` every [`KEEP_ALIVE`]
    /// (which tells the client, so that its answer timeout does not run out); where that
    /// returns false (the client left), the request is dropped.
    fn rows(
        &self,
        request: &Request,
        still_reading: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<Vec<u8>, WireError> {
        let (chunk, region) = loop {
            let timed_out = {
                let slots = self.slots();
                match slots.get(request.file as usize) {
                    None => return Err(refused(format!("no file {} (the dataset has {})", request.file, slots.len()))),
                    Some(Slot::Other) => {
                        return Err(refused(format!("file {} is served by another feeder rank", request.file)))
                    }
                    Some(Slot::Failed(reason)) => return Err(refused(reason.clone())),
                    Some(Slot::Loaded(chunk, region)) => break (chunk.clone(), region.clone()),
                    Some(Slot::Storage) => {
                        drop(slots);
                        return self.storage_rows(request, still_reading);
                    }
                    Some(Slot::Loading) => {
                        let (slots, waited) =
                            self.read.wait_timeout(slots, KEEP_ALIVE).unwrap_or_else(PoisonError::into_inner);
                        // Released before the client is told (a socket write).
                        drop(slots);
                        waited.timed_out()
                    }
                }
            };
            if timed_out && !still_reading() {
                return Err(refused("the client left while its file was being read"));
            }
        };
        if let Some(&last) = request.rows.last().filter(|&&r| r >= chunk.rows() as u64) {
            return Err(refused(format!(
                "row {last} of file {} is past its end ({} rows)",
                request.file,
                chunk.rows()
            )));
        }
        let rows = request.rows.iter().map(|&r| r as usize);
        if let Some(region) = region.filter(|_| request.mapped) {
            let (fields, held) = (chunk.fields(), &*chunk);
            let bytes: u64 = rows.clone().flat_map(|r| (0..fields).map(move |f| held.location(r, f).2 as u64)).sum();
            // Places cost 16 bytes a value; values of 8 bytes or fewer on average travel as
            // they are.
            if bytes > 8 * (request.rows.len() * fields) as u64 {
                self.bytes_mapped.fetch_add(bytes, Ordering::Relaxed);
                return Ok(mapped_rows(&chunk, &region, rows).encode());
            }
        }
        Ok(answer_rows(&chunk, rows))
    }

    /// The answer to a request for rows of a file this rank does not hold: the rows its
    /// cache has, those another request is reading once that read is done, and the
    /// others read from storage ([`super::cache`]). Waiting, it calls `still_reading` as
    /// [`Feeder::rows`] does.
    fn storage_rows(
        &self,
        request: &Request,
        still_reading: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<Vec<u8>, WireError> {
        let samples = self.dataset.files()[request.file as usize].samples;
        if let Some(&last) = request.rows.last().filter(|&&r| r >= samples) {
            return Err(refused(format!("row {last} of file {} is past its end ({samples} rows)", request.file)));
        }
        let mut values: Vec<Option<Values>> = vec![None; request.rows.len()];
        let mut told = Instant::now();
        loop {
            let todo: Vec<usize> = (0..values.len()).filter(|&i| values[i].is_none()).collect();
            if todo.is_empty() {
                break;
            }
            let rows: Vec<u64> = todo.iter().map(|&i| request.rows[i]).collect();
            let (claims, changes) = self.cache.claim(request.file, &rows);
            let mut mine = Vec::new();
            for (&i, claim) in todo.iter().zip(&claims) {
                match claim {
                    Claim::Cached(v) => values[i] = Some(v.clone()),
                    Claim::Mine => mine.push(i),
                    Claim::Pending => {}
                }
            }
            if !mine.is_empty() {
                // Read before waiting for anything: no request waits holding rows of its own.
                let rows: Vec<u64> = mine.iter().map(|&i| request.rows[i]).collect();
                let read = self.read_from_storage(request.file as usize, &rows).and_then(|chunk| {
                    if chunk.rows() == rows.len() {
                        return Ok(chunk);
                    }
                    Err(refused(format!(
                        "file {}: {} rows read of {} asked for",
                        request.file,
                        chunk.rows(),
                        rows.len()
                    )))
                });
                // Rows claimed and not filled in are released to the requests waiting for them.
                let chunk = read.inspect_err(|_| self.cache.abandon(request.file, &rows))?;
                let read: Vec<Values> = (0..chunk.rows())
                    .map(|r| (0..chunk.fields()).map(|f| Box::from(chunk.value(r, f))).collect())
                    .collect();
                self.cache.fill(request.file, rows.iter().copied().zip(read.iter().cloned()));
                for (&i, v) in mine.iter().zip(read) {
                    values[i] = Some(v);
                }
            } else if claims.iter().any(|c| matches!(c, Claim::Pending)) {
                self.cache.wait(changes, KEEP_ALIVE);
                // Told every KEEP_ALIVE however often other reads wake it.
                if told.elapsed() >= KEEP_ALIVE {
                    if !still_reading() {
                        return Err(refused("the client left while its rows were being read"));
                    }
                    told = Instant::now();
                }
            }
        }
        let fields = self.dataset.fields().len();
        let values: Vec<&[u8]> = values.iter().flatten().flat_map(|row| row.iter().map(|v| &v[..])).collect();
        Ok(wire::rows_answer(fields as u32, &values))
    }

    /// `rows` of `file` (which this rank does not hold), read from storage, in order. The
    /// file's reader is kept for the next request; a request that finds it in use opens
    /// another, so that none waits for another's read.
    fn read_from_storage(&self, file: usize, rows: &[u64]) -> std::result::Result<RowChunk, WireError> {
        let kept = self.readers[file].lock().unwrap_or_else(PoisonError::into_inner).take();
        let result = match kept {
            Some(r) => Ok(r),
            // Rows asked for are scattered over the file: no readahead past them.
            None => self.dataset.open_reader(file).inspect(|r| r.random_access()),
        }
        .and_then(|mut r| r.read_rows(rows).map(|chunk| (r, chunk)));
        let (r, got) = result.map_err(|e| refused(format!("the feeder could not read rows of file {file}: {e}")))?;
        self.readers[file].lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(r);
        self.storage_bytes.fetch_add(got.bytes_read(), Ordering::Relaxed);
        Ok(got)
    }
}

/// A [`WireError::Refused`]: why this feeder does not serve a hello or a request, as the
/// client is told.
fn refused(why: impl Into<String>) -> WireError {
    WireError::Refused(why.into())
}

/// The least size of a shared region the held files are put in, one after another: each
/// region costs a descriptor (of the feeder, and of each client mapping it, until mapped),
/// and its tail not written yet costs no memory.
const ARENA_BYTES: usize = 1 << 30;

/// `chunk`'s values in the shared region `arena` (the region being filled, and its bytes
/// used), after the files before it, row-major, and a chunk that reads them there; or
/// `chunk` as it is where no region can be made (best effort: the file is then served
/// over the socket only). A file that does not fit what is left starts a new region of at
/// least [`ARENA_BYTES`].
fn into_region(chunk: RowChunk, arena: &mut Option<(Arc<Region>, usize)>) -> (RowChunk, Option<Arc<Region>>) {
    let (fields, read) = (chunk.fields(), &chunk);
    let values = || (0..read.rows()).flat_map(move |r| (0..fields).map(move |f| read.value(r, f)));
    let bytes: usize = values().map(<[u8]>::len).sum();
    if !matches!(arena, Some((region, used)) if region.len() - *used >= bytes) {
        match Region::create(c"meshfeed-feeder", bytes.max(ARENA_BYTES)) {
            Ok(region) if region.fd().is_some() => *arena = Some((Arc::new(region), 0)),
            _ => return (chunk, None),
        }
    }
    let Some((region, used)) = arena else { unreachable!("a region was made") };
    let mut shared = RowChunk::new(fields);
    shared.add_bytes_read(chunk.bytes_read());
    let buffer = shared.add_made_buffer(region.buffer());
    for value in values() {
        // SAFETY: bytes past those of the files already in the region: nobody reads them
        // before this file's slot holds it, and only this thread (the loader) writes.
        unsafe { region.bytes_to_fill(*used..*used + value.len()) }.copy_from_slice(value);
        shared.push_value(buffer, *used, value.len());
        *used += value.len();
    }
    (shared, Some(region.clone()))
}

/// Where `rows` of `chunk` (which reads `region`) lie in `region`, every field of each.
fn mapped_rows(chunk: &RowChunk, region: &Region, rows: impl Iterator<Item = usize>) -> wire::Mapped {
    let fields = chunk.fields();
    let places = rows
        .flat_map(|row| (0..fields).map(move |f| chunk.location(row, f)))
        .map(|(_, offset, len)| (offset as u64, len as u64))
        .collect();
    let fd = region.fd().expect("a shared region has a descriptor");
    wire::Mapped { fields: fields as u32, fd, len: region.len() as u64, places }
}

/// Whether `answer` goes over UCX, where the client takes it: values (not places, not an
/// error) of at least [`super::ucx::MIN_BYTES`].
fn goes_over_ucx(answer: &[u8]) -> bool {
    answer[0] == 0 && answer.len() >= super::ucx::MIN_BYTES
}

/// An answer holding `rows` of `chunk`, every field of each ([`wire::rows_answer`]).
fn answer_rows(chunk: &RowChunk, rows: impl Iterator<Item = usize>) -> Vec<u8> {
    let fields = chunk.fields();
    let values: Vec<&[u8]> = rows.flat_map(|row| (0..fields).map(move |f| chunk.value(row, f))).collect();
    wire::rows_answer(fields as u32, &values)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::dataset::{gen, DType, Field, Format};

    /// 500 samples of two fields (14 bytes) in 5 files of 100.
    fn five_files(format: Format) -> (tempfile::TempDir, Dataset) {
        let fields = vec![Field::tensor("x", DType::U16, vec![3]), Field::tensor("y", DType::I64, vec![])];
        files_of(format, 5, fields)
    }

    /// 100 samples a file of `fields`, in `files` files.
    pub(crate) fn files_of(format: Format, files: u64, fields: Vec<Field>) -> (tempfile::TempDir, Dataset) {
        let (dir, _) = gen::GenSpec::write_temp(format, 100 * files, files, 9, fields);
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        (dir, ds)
    }

    /// The values of `rows` of an answer, as the client reads them.
    fn answered_values(answer: &[u8], rows: usize) -> Vec<u8> {
        let payload = wire::parse_answer(answer).unwrap();
        let got = wire::Rows::decode(payload, rows).unwrap();
        payload[got.values_at..].to_vec()
    }

    /// The values of `rows` of file `file`, read from the file.
    fn file_values(ds: &Dataset, file: usize, rows: &[u64]) -> Vec<u8> {
        let chunk = ds.open_reader(file).unwrap().read_rows(rows).unwrap();
        let chunk = &chunk;
        (0..rows.len()).flat_map(|r| (0..chunk.fields()).flat_map(move |f| chunk.value(r, f).to_vec())).collect()
    }

    #[test]
    fn the_budget_holds_each_file_that_still_fits_in_order() {
        let (_dir, ds) = five_files(Format::Npy);
        let one = held_bytes(&ds.files()[0], ds.fields());
        assert_eq!(one, 100 * 14 + 100 * 2 * VALUE_OVERHEAD);
        let mine = [0, 1, 2, 3, 4];
        assert_eq!(choose_held(ds.files(), ds.fields(), &mine, u64::MAX), mine);
        assert_eq!(choose_held(ds.files(), ds.fields(), &mine, 2 * one + one / 2), [0, 1]);
        assert_eq!(choose_held(ds.files(), ds.fields(), &[1, 3], one), [1]);
        assert!(choose_held(ds.files(), ds.fields(), &mine, one - 1).is_empty());
        // A file past the budget is skipped, and later ones that fit are held.
        let mut files = ds.files().to_vec();
        files[1].samples *= 10;
        assert_eq!(choose_held(&files, ds.fields(), &mine, 2 * one), [0, 2]);
        // Where every file fits, nothing is cached; else 1/8 of the budget, and what the
        // held files leave of the rest, caches rows read from storage.
        assert_eq!(plan_memory(ds.files(), ds.fields(), &[1, 3], 2 * one), (vec![1, 3], 0));
        let budget = 2 * one + one / 2;
        assert_eq!(plan_memory(ds.files(), ds.fields(), &mine, budget), (vec![0, 1], budget - 2 * one));
        assert_eq!(plan_memory(ds.files(), ds.fields(), &mine, 2 * one), (vec![0], one));
    }

    #[test]
    fn files_past_the_budget_are_read_from_storage_row_by_row_as_asked() {
        for format in [Format::Npy, Format::Arrow] {
            let (_dir, ds) = five_files(format);
            let one = held_bytes(&ds.files()[0], ds.fields());
            // Two files fit 7/8 of it; the rest caches rows read from storage.
            let budget = 2 * one + one / 2;
            let feeder = Feeder::new(ds.clone(), 0, 1, "d", "t".into(), budget).unwrap();
            let mut never = || panic!("nothing waits for a file held or read from storage");
            // Served before the held files are read: storage needs no load.
            let rows = [3, 50, 99];
            let answer = feeder.rows(&Request { file: 4, rows: rows.to_vec(), mapped: false }, &mut never).unwrap();
            assert_eq!(answered_values(&answer, 3), file_values(&ds, 4, &rows), "{format:?}");
            feeder.load().unwrap();
            let stats = feeder.stats();
            assert_eq!((stats.held_files, stats.storage_files), (2, 3), "{format:?}");
            assert!(stats.storage_bytes > 0 && stats.bytes_loaded > 0, "{stats:?}");
            assert_eq!((stats.cache_capacity, stats.cache_rows), (budget - 2 * one, 0));
            // Rows read once are answered from the cache; the others are read.
            let answer = feeder.rows(&Request { file: 4, rows: vec![3, 50, 60], mapped: false }, &mut never).unwrap();
            assert_eq!(answered_values(&answer, 3), file_values(&ds, 4, &[3, 50, 60]), "{format:?}");
            let again = feeder.stats();
            assert_eq!(again.cache_rows, 2);
            assert!(again.storage_bytes > stats.storage_bytes, "row 60 was read: {again:?}");
            feeder.rows(&Request { file: 4, rows: vec![3, 60, 99], mapped: false }, &mut never).unwrap();
            assert_eq!((feeder.stats().cache_rows, feeder.stats().storage_bytes), (5, again.storage_bytes));
            let answer = feeder.rows(&Request { file: 2, rows: vec![0, 1], mapped: false }, &mut never).unwrap();
            assert_eq!(answered_values(&answer, 2), file_values(&ds, 2, &[0, 1]));
            let answer = feeder.rows(&Request { file: 1, rows: vec![7], mapped: false }, &mut never).unwrap();
            assert_eq!(answered_values(&answer, 1), file_values(&ds, 1, &[7]));
            assert!(feeder
                .rows(&Request { file: 3, rows: vec![100], mapped: false }, &mut never)
                .unwrap_err()
                .to_string()
                .contains("past its end (100 rows)"));
        }
    }

    #[test]
    fn held_files_live_in_shared_memory_and_a_mapping_client_is_told_where_its_rows_lie() {
        // Values of 40 and 8 bytes: 16 bytes of place a value is the smaller answer.
        let fields = vec![Field::tensor("x", DType::U8, vec![40]), Field::tensor("y", DType::I64, vec![])];
        let (_dir, ds) = files_of(Format::Arrow, 2, fields);
        let mut feeder = Feeder::new(ds.clone(), 0, 1, "d", "t".into(), u64::MAX).unwrap();
        assert!(feeder.share_memory().unwrap(), "memfd_create works here");
        feeder.load().unwrap();
        let reader = Hello { token: "t".into(), name: "d".into(), headers: false, ucx: false }.encode();
        let share = wire::Share::decode(&feeder.welcome(&reader).unwrap()).unwrap();
        assert_eq!(share.pid, std::process::id());
        let probe = Region::open_peer(share.pid, share.fd, 16).unwrap();
        assert_eq!(probe.bytes(0..16), share.nonce, "the probe region holds the nonce");
        let mut never = || panic!("nothing waits for a file read");
        let rows = [0, 41, 99];
        let answer = feeder.rows(&Request { file: 1, rows: rows.to_vec(), mapped: true }, &mut never).unwrap();
        assert_eq!(answer[0], wire::MAPPED);
        let mapped = wire::Mapped::decode(&answer[1..], 3).unwrap();
        assert_eq!((mapped.fields, mapped.places.len(), mapped.len), (2, 6, ARENA_BYTES as u64));
        // Both files in one region (one descriptor), file 1 after file 0's 100 rows.
        assert_eq!(mapped.places[0], (100 * 48, 40));
        // Read where the answer says, in another mapping of the file's region: the file's bytes.
        let region = Region::open_peer(share.pid, mapped.fd, mapped.len as usize).unwrap();
        let read: Vec<u8> = mapped
            .places
            .iter()
            .flat_map(|&(at, len)| region.bytes(at as usize..(at + len) as usize).to_vec())
            .collect();
        assert_eq!(read, file_values(&ds, 1, &rows));
        assert_eq!(feeder.stats().bytes_mapped, 3 * 48);
        // A client that did not map the memory gets the values themselves, as before.
        let answer = feeder.rows(&Request { file: 1, rows: rows.to_vec(), mapped: false }, &mut never).unwrap();
        assert_eq!(answered_values(&answer, 3), file_values(&ds, 1, &rows));
        assert_eq!(feeder.stats().bytes_mapped, 3 * 48);

        // Values of 6 and 8 bytes travel as they are, however the client asks.
        let (_dir, small) = five_files(Format::Npy);
        let mut feeder = Feeder::new(small.clone(), 0, 1, "d", "t".into(), u64::MAX).unwrap();
        assert!(feeder.share_memory().unwrap());
        feeder.load().unwrap();
        let answer = feeder.rows(&Request { file: 2, rows: vec![5, 6], mapped: true }, &mut never).unwrap();
        assert_eq!(answered_values(&answer, 2), file_values(&small, 2, &[5, 6]));
        assert_eq!(feeder.stats().bytes_mapped, 0);
        // Without shared memory, a reader's welcome is empty.
        let plain = Feeder::new(small, 0, 1, "d", "t".into(), u64::MAX).unwrap();
        assert!(plain.welcome(&reader).unwrap().is_empty());
    }

    /// A feeder of `ds` serving on a loopback port within `limits`: it and its address.
    fn serving(ds: &Dataset, limits: Limits) -> (Arc<Feeder>, String) {
        let mut feeder = Feeder::new(ds.clone(), 0, 1, "d", "t".into(), u64::MAX).unwrap();
        feeder.set_limits(limits);
        feeder.load().unwrap();
        let feeder = Arc::new(feeder);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn({
            let feeder = feeder.clone();
            move || feeder.serve(listener)
        });
        (feeder, address)
    }

    /// A reader's connection that presented the token: (reader, writer).
    fn authenticated(address: &str) -> (BufReader<TcpStream>, BufWriter<TcpStream>) {
        let stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (mut r, mut w) = (BufReader::new(stream.try_clone().unwrap()), BufWriter::new(stream));
        let hello = Hello { token: "t".into(), name: "d".into(), headers: false, ucx: false };
        wire::write_frame(&mut w, &hello.encode()).unwrap();
        let welcome = wire::read_frame(&mut r, wire::MAX_HELLO).unwrap().unwrap();
        assert_eq!(wire::parse_answer(&welcome), Ok(&[][..]));
        (r, w)
    }

    /// Rows 0 and 99 of file 2, asked for on `conn`, are the file's.
    fn still_serves(ds: &Dataset, conn: &mut (BufReader<TcpStream>, BufWriter<TcpStream>)) {
        let request = Request { file: 2, rows: vec![0, 99], mapped: false };
        wire::write_frame(&mut conn.1, &request.encode()).unwrap();
        let answer = wire::read_frame(&mut conn.0, 1 << 20).unwrap().unwrap();
        assert_eq!(answered_values(&answer, 2), file_values(ds, 2, &[0, 99]));
    }

    #[test]
    fn strangers_idle_slow_or_many_are_closed_and_clients_still_get_in() {
        let (_dir, ds) = five_files(Format::Npy);
        let limits = Limits { hello_timeout: Duration::from_millis(400), unauthenticated: 4, connections: 64 };
        let (feeder, address) = serving(&ds, limits);
        let eof_within = |s: &mut TcpStream, limit: Duration| {
            s.set_read_timeout(Some(limit)).unwrap();
            let start = Instant::now();
            let got = std::io::Read::read(s, &mut [0u8; 64]);
            assert!(matches!(got, Ok(0)) || got.is_err(), "{got:?}");
            start.elapsed()
        };
        // A stranger that sends 3 bytes and waits, and one that drips its hello a byte at
        // a time: each closed once the hello's deadline has passed, however it drips.
        let mut idle = TcpStream::connect(&address).unwrap();
        std::io::Write::write_all(&mut idle, b"abc").unwrap();
        let mut slow = TcpStream::connect(&address).unwrap();
        let dripping = std::thread::spawn({
            let mut slow = slow.try_clone().unwrap();
            move || {
                (0..30).all(|_| {
                    std::thread::sleep(Duration::from_millis(50));
                    std::io::Write::write_all(&mut slow, &[1]).is_ok()
                })
            }
        });
        assert!(eof_within(&mut idle, Duration::from_secs(5)) < Duration::from_secs(2));
        assert!(eof_within(&mut slow, Duration::from_secs(5)) < Duration::from_secs(2));
        assert!(!dripping.join().unwrap(), "the dripping stranger was cut off");
        // Garbage before the token: refused and closed.
        let mut garbage = TcpStream::connect(&address).unwrap();
        wire::write_frame(&mut garbage, b"GET / HTTP/1.1\r\n\r\n").unwrap();
        let refusal = wire::read_frame(&mut garbage, wire::MAX_HELLO).unwrap().unwrap();
        assert!(wire::parse_answer(&refusal).unwrap_err().to_string().contains("not a meshfeed client"));
        // 100 strangers that never send their hello hold 4 places at most; a client
        // connecting after them gets in at once, and so does one already in.
        let mut inside = authenticated(&address);
        let strangers: Vec<TcpStream> = (0..100).map(|_| TcpStream::connect(&address).unwrap()).collect();
        let start = Instant::now();
        while feeder.admitted.evicted() < 96 {
            assert!(start.elapsed() < Duration::from_secs(10), "{:?}", feeder.admitted.counts());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(feeder.admitted.counts().1 <= 4, "{:?}", feeder.admitted.counts());
        let mut late = authenticated(&address);
        still_serves(&ds, &mut late);
        still_serves(&ds, &mut inside);
        drop(strangers);
    }

    #[test]
    fn an_oversize_request_closes_its_connection_and_the_feeder_serves_on() {
        let (_dir, ds) = five_files(Format::Npy);
        let (feeder, address) = serving(&ds, Limits::default());
        // A token holder announcing a request of 2^36 bytes: nothing is allocated for it,
        // it is told why, and its connection ends.
        let (mut r, mut w) = authenticated(&address);
        std::io::Write::write_all(&mut w, &(1u64 << 36).to_le_bytes()).unwrap();
        std::io::Write::flush(&mut w).unwrap();
        let answer = wire::read_frame(&mut r, wire::MAX_HELLO).unwrap().unwrap();
        let reason = wire::parse_answer(&answer).unwrap_err();
        assert!(matches!(reason, WireError::Refused(_)), "{reason:?}");
        assert_eq!(
            reason.to_string(),
            format!(
                "a request of 68719476736 bytes; a request for rows of this dataset holds at most {}",
                13 + 8 * 100
            )
        );
        assert_eq!(wire::read_frame(&mut r, wire::MAX_HELLO).unwrap(), None, "the connection is closed");
        // A request just within the bound (every row of a file) is answered; the feeder serves on.
        let mut conn = authenticated(&address);
        let all = Request { file: 1, rows: (0..100).collect(), mapped: false };
        assert_eq!(all.encode().len() as u64, feeder.max_request);
        wire::write_frame(&mut conn.1, &all.encode()).unwrap();
        let answer = wire::read_frame(&mut conn.0, 1 << 20).unwrap().unwrap();
        assert_eq!(answered_values(&answer, 100), file_values(&ds, 1, &all.rows));
        still_serves(&ds, &mut conn);
    }

    #[test]
    fn a_waiting_client_is_told_how_much_has_been_read_and_it_grows() {
        let (_dir, ds) = five_files(Format::Npy);
        let feeder = Arc::new(Feeder::new(ds.clone(), 0, 1, "d", "t".into(), u64::MAX).unwrap());
        assert_eq!(feeder.progress(), 0);
        feeder.load().unwrap();
        let after = feeder.progress();
        assert!(after >= 5 * 100 * 14, "{after}");
        assert_eq!(feeder.progress(), after, "no reading, no progress");
        // A thread's reads count while it is the loader's.
        feeder.loader.store(crate::runtime::thread_id(), Ordering::Relaxed);
        let before = feeder.progress();
        std::fs::read(&ds.files()[0].path).unwrap();
        assert!(feeder.progress() >= before + ds.files()[0].bytes, "{before} {}", feeder.progress());
        feeder.loader.store(0, Ordering::Relaxed);
        assert!(feeder.progress() >= before + ds.files()[0].bytes, "never less than said before");
    }

    #[test]
    fn a_feeder_rank_holds_every_fth_file_and_answers_only_for_them() {
        let (_dir, ds) = five_files(Format::Npy);
        let mut feeder = Feeder::new(ds.clone(), 1, 2, "d", "secret".into(), u64::MAX).unwrap();
        assert_eq!(feeder.files(), 2, "files 1 and 3");
        let addresses = ["a:1".to_string(), "b:2".to_string()];
        feeder.set_addresses(ds.files(), &addresses, None).unwrap();
        // A request before the file is read waits for it.
        let feeder = Arc::new(feeder);
        let early = std::thread::spawn({
            let feeder = feeder.clone();
            move || {
                let mut told = 0;
                let rows = feeder.rows(&Request { file: 3, rows: vec![0, 7, 99], mapped: false }, &mut || {
                    told += 1;
                    true
                });
                (rows, told)
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!early.is_finished(), "a request for a file not read yet is answered");
        feeder.load().unwrap();
        let stats = feeder.stats();
        assert_eq!((stats.held_files, stats.storage_files), (2, 0));
        assert_eq!(stats.bytes_loaded, 2 * 100 * 14, "two files of 100 rows of 14 bytes, read once");
        let hello = |token: &str, name: &str| {
            Hello { token: token.into(), name: name.into(), headers: true, ucx: false }.encode()
        };
        let (files, owners, manifest) =
            crate::feed::welcome::welcome_from_json(&feeder.welcome(&hello("secret", "d")).unwrap(), "test").unwrap();
        assert_eq!(files, ds.files());
        assert_eq!(manifest, None);
        assert_eq!(owners, ["a:1", "b:2", "a:1", "b:2", "a:1"]);
        let reader = Hello { token: "secret".into(), name: "d".into(), headers: false, ucx: false };
        assert!(feeder.welcome(&reader.encode()).unwrap().is_empty(), "a reader's connection gets no headers");
        assert!(feeder.welcome(&hello("secreT", "d")).unwrap_err().to_string().contains("wrong token"));
        assert!(feeder.welcome(&hello("secret", "e")).unwrap_err().to_string().contains("serves 'd', not 'e'"));
        // Its rows are the file's, byte for byte; others' files and rows past the end are refused.
        let (answer, told) = early.join().unwrap();
        let answer = answer.unwrap();
        assert!(told >= 1, "the waiting client was told the file is still being read");
        let rows = wire::Rows::decode(wire::parse_answer(&answer).unwrap(), 3).unwrap();
        assert_eq!((rows.fields, rows.lens.len()), (2, 6));
        assert_eq!(answered_values(&answer, 3), file_values(&ds, 3, &[0, 7, 99]));
        let mut never = || panic!("nothing waits for a file read");
        assert!(feeder
            .rows(&Request { file: 2, rows: vec![0], mapped: false }, &mut never)
            .unwrap_err()
            .to_string()
            .contains("served by another feeder rank"));
        assert!(feeder
            .rows(&Request { file: 3, rows: vec![100], mapped: false }, &mut never)
            .unwrap_err()
            .to_string()
            .contains("past its end (100 rows)"));
        assert!(feeder
            .rows(&Request { file: 9, rows: vec![0], mapped: false }, &mut never)
            .unwrap_err()
            .to_string()
            .contains("no file 9"));
    }
}
