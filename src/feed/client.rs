//! A client's side: attaching to a feeder, and a [`FileReader`] that reads a file's rows
//! from it: over the connection, or — on the feeder's host, where this process can map
//! the feeder's memory — from that memory, the connection carrying only where they lie.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arrow_buffer::Buffer;

use super::ucx::Link;
use super::wire::{self, Hello, Mapped, Request, Rows, Share, WireError};
use super::Source;
use crate::dataset::gen::Manifest;
use crate::dataset::{Dataset, FileInfo, FileReader, RowChunk, RowSource};
use crate::error::{Error, ErrorKind, Result, ResultExt};
use crate::runtime::shared_memory::Region;

/// How long connecting to a feeder may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a feeder may stay silent (a feeder that stops answering fails the read,
/// never hangs it; one still reading the file asked for says so twice a second):
/// `$MESHFEED_FEEDER_TIMEOUT_S`, default 120 s, at least 1 s.
fn answer_timeout() -> Duration {
    let s = std::env::var("MESHFEED_FEEDER_TIMEOUT_S").ok().and_then(|s| s.parse::<f64>().ok());
    Duration::from_secs_f64(s.filter(|s| *s > 0.0).unwrap_or(120.0).max(1.0))
}

/// One connection to a feeder, past the hello.
struct Connection {
    r: BufReader<TcpStream>,
    w: BufWriter<TcpStream>,
    /// How long the feeder may stay silent ([`answer_timeout`]).
    timeout: Duration,
    /// Why a call failed, once one did: the connection is not used again (an answer that
    /// arrives after its timeout must not be read as the next request's).
    broken: Option<WireError>,
    /// The feeder's shared memory, where this process maps it.
    peer: Option<Peer>,
    /// This side's UCX worker, where the feeder offered UCX and one could be made.
    link: Option<Link>,
}

/// A feeder process whose memory this process maps: its pid, and the regions mapped so
/// far, by the feeder's descriptor.
struct Peer {
    pid: u32,
    regions: HashMap<i32, Arc<Region>>,
}

impl Peer {
    /// The feeder's memory, if this process sees it: the probe region `share` names holds
    /// its nonce (the same host, user and PID namespace).
    fn probe(share: &Share) -> Option<Peer> {
        // (Nothing but a meshfeed memfd is opened: `open_peer` checks.)
        let probe = Region::open_peer(share.pid, share.fd, share.nonce.len()).ok()?;
        (probe.bytes(0..share.nonce.len()) == share.nonce).then(|| Peer { pid: share.pid, regions: HashMap::new() })
    }

    /// The feeder's region `fd` of `len` bytes, mapped on first use.
    fn region(&mut self, fd: i32, len: u64) -> std::io::Result<Arc<Region>> {
        match self.regions.get(&fd) {
            Some(region) if region.len() as u64 == len => Ok(region.clone()),
            _ => {
                let region = Arc::new(Region::open_peer(self.pid, fd, len as usize)?);
                self.regions.insert(fd, region.clone());
                Ok(region)
            }
        }
    }
}

impl Connection {
    /// Connects to the feeder rank at `address`, presents the token and the name; returns
    /// the connection and the answer: the feeder's welcome (JSON) from byte 1 where
    /// `headers` asks for it (else the connection maps the feeder's memory where it
    /// can). A refusal or an unreachable feeder is an error naming it.
    fn open(source: &Source, address: &str, headers: bool, timeout: Duration) -> Result<(Connection, Vec<u8>)> {
        let url = format!("{}{address}/{}", super::SCHEME, source.name);
        let fail = |what: String| Error::Transport(format!("feeder {url}: {what}"));
        let addrs: Vec<_> =
            address.to_socket_addrs().map_err(|e| fail(format!("cannot resolve {address}: {e}")))?.collect();
        let mut last = None;
        let stream = addrs.iter().find_map(|a| match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => Some(s),
            Err(e) => {
                last = Some(e);
                None
            }
        });
        let stream = stream.ok_or_else(|| {
            let why = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
            fail(format!("cannot connect ({why}): is `meshfeed serve` running there?"))
        })?;
        let io = |e: std::io::Error| fail(e.to_string());
        stream.set_nodelay(true).map_err(io)?;
        stream.set_read_timeout(Some(timeout)).map_err(io)?;
        let r = BufReader::new(stream.try_clone().map_err(io)?);
        let mut conn = Connection { r, w: BufWriter::new(stream), timeout, broken: None, peer: None, link: None };
        let ucx = !headers && cfg!(feature = "ucx");
        let hello = Hello { token: source.token.clone(), name: source.name.clone(), headers, ucx };
        // Whoever answers at the address need not be the feeder: its welcome is bounded, and
        // it is not waited for past the timeout (no keep-alive counts before the welcome).
        let max = if headers { wire::MAX_WELCOME } else { wire::MAX_HELLO };
        let answer = conn
            .call(&hello.encode(), max, false)
            .context(ErrorKind::Transport, format_args!("feeder {url}: refused"))?;
        if !headers && answer.len() > 1 {
            let share =
                Share::decode(&answer[1..]).context(ErrorKind::Transport, format_args!("feeder {url}: bad welcome"))?;
            conn.peer = Peer::probe(&share);
        }
        if ucx {
            conn.ucx_handshake().map_err(|e| fail(format!("UCX handshake: {e}")))?;
        }
        Ok((conn, answer))
    }

    /// After the welcome: the feeder's UCX worker address (empty: not offered), then this
    /// side's (empty: none could be made, and answers come over the connection).
    fn ucx_handshake(&mut self) -> std::io::Result<()> {
        let offered = wire::read_frame(&mut self.r, wire::MAX_HELLO)?.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the feeder closed the connection")
        })?;
        let mut mine = Vec::new();
        if !offered.is_empty() {
            // Where no worker can be made here, the answers come over the connection.
            if let Ok((link, address)) = Link::new() {
                self.link = Some(link);
                mine = address;
            }
        }
        wire::write_frame(&mut self.w, &mine)
    }

    /// Sends one frame and reads the answer, of at most `max` bytes: the whole frame (its
    /// payload from byte 1), or the feeder's message. Where `keep_alives` (a request for
    /// rows), the feeder may say that it is still reading them ([`Connection::exchange`]).
    /// Once the connection failed, every call fails as it did.
    fn call(&mut self, frame: &[u8], max: u64, keep_alives: bool) -> std::result::Result<Vec<u8>, WireError> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        // The feeder closes a connection after refusing a request on it: later calls fail
        // with its reason.
        let answer = self.exchange(frame, max, keep_alives).and_then(|answer| {
            wire::parse_answer(&answer)?;
            Ok(answer)
        });
        if let Err(why) = &answer {
            self.broken = Some(why.clone());
        }
        answer
    }

    /// One request and its answer frame, of at most `max` bytes, or why the connection
    /// failed.
    ///
    /// The answer must begin within the timeout. Where `keep_alives`, a feeder still
    /// reading the rows' file says so every half second with the bytes it has read from
    /// storage: each report that grows (and the first) restarts the timeout; a report
    /// that does not grow, or any report where none is due, restarts nothing. So a feeder
    /// stuck on its storage, or whatever holds its port after it died, fails the read
    /// within two timeouts at most, never holds it. Once an answer has begun, its bytes
    /// may take as long as they keep coming (the timeout then measures silence).
    fn exchange(&mut self, frame: &[u8], max: u64, keep_alives: bool) -> std::result::Result<Vec<u8>, WireError> {
        use std::io::ErrorKind::*;
        let timeout = self.timeout;
        let failed = |e: std::io::Error| match e.kind() {
            // A feeder that exits (killed, stopped) resets or closes its connections.
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => {
                WireError::Connection(format!("{CLOSED}: {e}"))
            }
            WouldBlock | TimedOut => {
                WireError::Connection(format!("no answer within {timeout:?} (MESHFEED_FEEDER_TIMEOUT_S)"))
            }
            InvalidData => WireError::Malformed(format!("a bad answer: {e}")),
            _ => WireError::Connection(format!("the connection failed: {e}")),
        };
        wire::write_frame(&mut self.w, frame).map_err(failed)?;
        let mut deadline = std::time::Instant::now() + timeout;
        let mut reported: Option<u64> = None;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Err(failed(TimedOut.into()));
            }
            // The frame's length within the time left; the rest as it comes.
            let stream = self.r.get_ref();
            stream.set_read_timeout(Some(left)).map_err(failed)?;
            let len = wire::read_frame_len(&mut self.r);
            self.r.get_ref().set_read_timeout(Some(timeout)).map_err(failed)?;
            let frame = match len.map_err(failed)? {
                Some(len) => wire::read_payload(&mut self.r, len, max).map(Some),
                None => Ok(None),
            };
            match frame {
                Ok(Some(frame)) if frame.first() == Some(&wire::STILL_READING) => {
                    if !keep_alives {
                        return Err(WireError::Malformed(
                            "a keep-alive where none is due: not a feeder's answer".into(),
                        ));
                    }
                    let progress = wire::parse_still_reading(&frame)
                        .map_err(|e| WireError::Malformed(format!("a bad keep-alive: {e}")))?;
                    if reported.is_none_or(|before| progress > before) {
                        deadline = std::time::Instant::now() + timeout;
                    }
                    reported = Some(reported.map_or(progress, |before| before.max(progress)));
                }
                // The answer follows over UCX.
                Ok(Some(frame)) if frame.first() == Some(&wire::VIA_UCX) => {
                    let (len, tag) = wire::parse_via_ucx(&frame, max)?;
                    let link = self
                        .link
                        .as_ref()
                        .ok_or_else(|| WireError::Malformed("an answer over UCX on a connection without UCX".into()))?;
                    let stream = self.r.get_ref();
                    let mut quiet = || super::peek(stream) == super::Peeked::Quiet;
                    let failed = match link.recv(len, tag, timeout, &mut quiet) {
                        Ok(answer) => return Ok(answer),
                        Err(e) => e,
                    };
                    match settled_peek(stream) {
                        // The feeder gave up on UCX and answers over the connection, as it
                        // will from now on.
                        super::Peeked::Readable => self.link = None,
                        super::Peeked::Closed(why) => {
                            return Err(WireError::Connection(format!(
                                "{CLOSED} during an answer over UCX ({why}; UCX: {failed})"
                            )))
                        }
                        super::Peeked::Quiet => {
                            return Err(WireError::Connection(format!("the answer over UCX failed: {failed}")))
                        }
                    }
                }
                Ok(Some(answer)) => return Ok(answer),
                Ok(None) => return Err(WireError::Connection(CLOSED.into())),
                Err(e) => return Err(failed(e)),
            }
        }
    }
}

/// What a client says of a feeder that closed its connection.
const CLOSED: &str = "the feeder closed the connection (was it stopped?)";

/// [`super::peek`] of a feeder's connection after an answer over UCX failed: a feeder
/// that ended closes it within a second (UCX often noticing first), and one that gave up
/// on UCX writes the answer to it.
fn settled_peek(stream: &TcpStream) -> super::Peeked {
    let start = std::time::Instant::now();
    loop {
        match super::peek(stream) {
            super::Peeked::Quiet if start.elapsed() < Duration::from_secs(1) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            peeked => return peeked,
        }
    }
}

/// Attaches to a feeder (its rank 0, at the rendezvous address): checks that it is there
/// and takes this token, and returns its welcome (JSON, [`welcome`] reads it).
pub fn attach(source: &Source) -> Result<Vec<u8>> {
    let (_, mut answer) = Connection::open(source, &source.address, true, answer_timeout())?;
    answer.remove(0);
    Ok(answer)
}

/// Reads a feeder's welcome ([`attach`]): the headers of the files it serves, the
/// address of the feeder rank serving each, and the generator's manifest where the files
/// are `meshfeed gen`'s.
pub fn welcome(source: &Source, welcome: &[u8]) -> Result<(Vec<FileInfo>, Vec<String>, Option<Manifest>)> {
    crate::feed::welcome::welcome_from_json(welcome, &source.url())
}

/// A job's way to a feeder, in one process: where it is, the feeder rank serving each
/// file, and one connection to each feeder rank this process reads from, which the
/// readers of its files share (a process opens at most one connection a feeder rank,
/// however many files it reads).
pub struct Feed {
    pub source: Source,
    /// `owners[i]`: the address of the feeder rank that serves file `i`.
    pub owners: Vec<String>,
    /// The generator's manifest, where the feeder serves `meshfeed gen`'s files.
    pub manifest: Option<Manifest>,
    /// By feeder address: the connection to it, once opened. Each address has a lock of
    /// its own, so that connecting to one feeder rank never waits for another.
    connections: Mutex<HashMap<String, Arc<Mutex<Option<Arc<Mutex<Connection>>>>>>>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Feed({:?}, {} files)", self.source, self.owners.len())
    }
}

impl Feed {
    pub fn new(source: Source, owners: Vec<String>, manifest: Option<Manifest>) -> Feed {
        Feed { source, owners, manifest, connections: Mutex::new(HashMap::new()) }
    }

    /// A reader of file `file` (`info`: its header), on the connection to the feeder rank
    /// serving it (opened on first use).
    pub fn reader(&self, file: usize, info: &FileInfo) -> Result<Reader> {
        let address = &self.owners[file];
        let name =
            info.path.file_name().map_or_else(|| info.path.display().to_string(), |n| n.to_string_lossy().into());
        let path = PathBuf::from(format!("{}{address}/{}/{name}", super::SCHEME, self.source.name));
        let slot =
            self.connections.lock().unwrap_or_else(PoisonError::into_inner).entry(address.clone()).or_default().clone();
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        let conn = match &*slot {
            Some(conn) => conn.clone(),
            None => {
                let (conn, _) = Connection::open(&self.source, address, false, answer_timeout())?;
                slot.insert(Arc::new(Mutex::new(conn))).clone()
            }
        };
        let row_bytes = info.fields.iter().filter_map(|f| f.fixed_bytes()).map(|b| b as u64).sum();
        // A variable-length field's values in any request are at most all of the file's:
        // as its header says, or else the file's size.
        let variable_bytes = (info.fields.iter().enumerate())
            .filter(|(_, f)| f.fixed_bytes().is_none())
            .map(|(i, _)| info.value_bytes.get(i).copied().unwrap_or(info.bytes).max(info.bytes))
            .fold(0, u64::saturating_add);
        Ok(Reader { conn, file: file as u32, fields: info.fields.len(), row_bytes, variable_bytes, path })
    }
}

impl RowSource for Feed {
    fn reader(&self, file: usize, info: &FileInfo) -> Result<Box<dyn FileReader>> {
        Ok(Box::new(Feed::reader(self, file, info)?))
    }

    fn describe(&self) -> String {
        format!("the feeder {}", self.source.url())
    }

    fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The feeder `dataset`'s rows come from, if they come from one.
pub fn feeder_of(dataset: &Dataset) -> Option<&Source> {
    let feed = dataset.row_source()?.as_any().downcast_ref::<Feed>()?;
    Some(&feed.source)
}

/// Reads the rows of one file from the feeder ([`Feed::reader`]).
pub struct Reader {
    conn: Arc<Mutex<Connection>>,
    file: u32,
    fields: usize,
    /// The bytes of a row's fixed-size values, and at most those of the file's
    /// variable-length ones: what bounds an answer.
    row_bytes: u64,
    variable_bytes: u64,
    /// `meshfeed://HOST:PORT/NAME/FILE`, for messages.
    path: PathBuf,
}

impl Reader {
    /// An answer's fields must be the header's.
    fn check_fields(&self, fields: u32) -> Result<()> {
        if fields as usize != self.fields {
            return Err(Error::file(&self.path, format!("{fields} fields, the header says {}", self.fields)));
        }
        Ok(())
    }

    /// A mapped answer's rows, read from the feeder's region (mapped here on first use).
    /// `Ok(None)` where the region cannot be mapped: the connection stops asking for
    /// mapped answers.
    fn mapped_rows(&self, conn: &mut Connection, answer: &[u8], rows: usize) -> Result<Option<RowChunk>> {
        let got = Mapped::decode(&answer[1..], rows).file_context(&self.path, "bad answer")?;
        self.check_fields(got.fields)?;
        let Some(region) = conn.peer.as_mut().and_then(|peer| peer.region(got.fd, got.len).ok()) else {
            conn.peer = None;
            return Ok(None);
        };
        let mut chunk = RowChunk::new(self.fields);
        let buffer = chunk.add_made_buffer(region.buffer());
        for (offset, len) in got.places {
            chunk.add_bytes_read(len);
            chunk.push_value(buffer, offset as usize, len as usize);
        }
        Ok(Some(chunk))
    }
}

impl FileReader for Reader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let request = Request { file: self.file, rows: rows.to_vec(), mapped: conn.peer.is_some() };
        // No answer is read past what the rows asked for can hold.
        let n = rows.len() as u64;
        let values = self.row_bytes.saturating_mul(n).saturating_add(self.variable_bytes);
        let max = wire::answer_bound(n, self.fields as u64, values);
        let answer = conn.call(&request.encode(), max, true).in_file(&self.path)?;
        if answer[0] == wire::MAPPED {
            if !request.mapped {
                return Err(Error::file(&self.path, "bad answer: places in memory this process did not map"));
            }
            match self.mapped_rows(&mut conn, &answer, rows.len())? {
                Some(chunk) => return Ok(chunk),
                // Asked again, for the values themselves.
                None => {
                    drop(conn);
                    return self.read_rows(rows);
                }
            }
        }
        drop(conn);
        // The values stay in the frame they arrived in: one buffer, no copy.
        let got = Rows::decode(&answer[1..], rows.len()).file_context(&self.path, "bad answer")?;
        self.check_fields(got.fields)?;
        let mut chunk = RowChunk::new(self.fields);
        let buffer = chunk.add_buffer(Buffer::from_vec(answer));
        let mut at = 1 + got.values_at;
        for len in got.lens {
            chunk.push_value(buffer, at, len as usize);
            at += len as usize;
        }
        Ok(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    type Wire = (BufReader<TcpStream>, BufWriter<TcpStream>);

    /// Whatever listens at an address, speaking to one client as `script` says from the
    /// moment the client connects (the client's hello not read yet).
    fn fake_peer(script: impl FnOnce(&mut Wire) + Send + 'static) -> (Source, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let peer = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut wire = (BufReader::new(stream.try_clone().unwrap()), BufWriter::new(stream));
            script(&mut wire);
            // Held open until the client has read (or given up).
            let _ = wire::read_frame(&mut wire.0, 1 << 20);
        });
        (Source { address, name: "d".into(), token: "t".into() }, peer)
    }

    /// A feeder that welcomes one reader, reads its one request, then does as `script` says.
    fn fake_feeder(script: impl FnOnce(&mut Wire) + Send + 'static) -> (Source, std::thread::JoinHandle<()>) {
        fake_peer(|(r, w)| {
            let hello = wire::read_frame(r, wire::MAX_HELLO).unwrap().unwrap();
            wire::write_frame(w, &wire::answer(Ok(Vec::new()))).unwrap();
            if Hello::decode(&hello).unwrap().ucx {
                // No UCX offered; the client's (empty) address.
                wire::write_frame(w, &[]).unwrap();
                assert_eq!(wire::read_frame(r, wire::MAX_HELLO).unwrap(), Some(Vec::new()));
            }
            wire::read_frame(r, 1 << 20).unwrap().unwrap();
            script(&mut (
                r.get_ref().try_clone().map(BufReader::new).unwrap(),
                BufWriter::new(w.get_ref().try_clone().unwrap()),
            ));
        })
    }

    /// `count` keep-alives, `every` apart, reporting `progress(i)` bytes read, then an
    /// answer holding one value, `abc`.
    fn keep_alives(count: u64, every: Duration, progress: fn(u64) -> u64) -> impl FnOnce(&mut Wire) + Send {
        move |(_, w)| {
            for i in 0..count {
                std::thread::sleep(every);
                if wire::write_frame(w, &wire::still_reading(progress(i))).is_err() {
                    return;
                }
            }
            let _ = wire::write_frame(w, &wire::rows_answer(1, &[b"abc"]));
        }
    }

    #[test]
    fn a_client_on_the_feeders_host_reads_held_rows_from_its_memory_and_others_over_the_socket() {
        use crate::dataset::{DType, Field, Format};
        use crate::feed::server::Feeder;
        let fields = vec![Field::tensor("x", DType::U8, vec![100])];
        let (_dir, ds) = crate::feed::server::tests::files_of(Format::Npy, 2, fields);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let serve = |share: bool| {
            let mut feeder = Feeder::new(ds.clone(), 0, 1, "d", "t".into(), u64::MAX).unwrap();
            if share {
                assert!(feeder.share_memory().unwrap(), "memfd_create works here");
            }
            feeder.load().unwrap();
            Arc::new(feeder)
        };
        let feeder = serve(true);
        std::thread::spawn({
            let feeder = feeder.clone();
            move || feeder.serve(listener)
        });
        let source = Source { address: address.clone(), name: "d".into(), token: "t".into() };
        let feed = Feed::new(source, vec![address.clone(); 2], None);
        let rows = [1, 50, 98];
        let mut reader = feed.reader(1, &ds.files()[1]).unwrap();
        let chunk = reader.read_rows(&rows).unwrap();
        let want = ds.open_reader(1).unwrap().read_rows(&rows).unwrap();
        for r in 0..3 {
            assert_eq!(chunk.value(r, 0), want.value(r, 0));
        }
        // Read from the feeder's memory: 300 bytes mapped, only their places sent.
        let stats = feeder.stats();
        assert_eq!(stats.bytes_mapped, 300);
        assert!(stats.bytes_sent < 100, "{stats:?}");
        assert_eq!(chunk.bytes_read(), 300);
        // A feeder that does not share its memory sends the bytes.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let plain = serve(false);
        std::thread::spawn({
            let plain = plain.clone();
            move || plain.serve(listener)
        });
        let source = Source { address: address.clone(), name: "d".into(), token: "t".into() };
        let chunk =
            Feed::new(source, vec![address; 2], None).reader(1, &ds.files()[1]).unwrap().read_rows(&rows).unwrap();
        assert_eq!(chunk.value(2, 0), want.value(2, 0));
        assert_eq!((plain.stats().bytes_mapped, plain.stats().bytes_sent > 300), (0, true));
    }

    #[test]
    fn only_a_feeders_probe_holding_its_nonce_proves_that_its_memory_is_seen() {
        use crate::dataset::{DType, Field, Format};
        let fields = vec![Field::tensor("x", DType::U8, vec![4])];
        let (_dir, ds) = crate::feed::server::tests::files_of(Format::Npy, 1, fields);
        let mut feeder = crate::feed::server::Feeder::new(ds, 0, 1, "d", "t".into(), u64::MAX).unwrap();
        assert!(feeder.share_memory().unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || Arc::new(feeder).serve(listener));
        let source = Source { address: address.clone(), name: "d".into(), token: "t".into() };
        let (conn, answer) = Connection::open(&source, &address, false, Duration::from_secs(5)).unwrap();
        assert!(conn.peer.is_some(), "the feeder's memory is seen from its own process");
        let share = Share::decode(&answer[1..]).unwrap();
        assert!(Peer::probe(&share).is_some());
        // Another nonce (another feeder's, or another host's process of that pid)...
        assert!(Peer::probe(&Share { nonce: [7; 16], ..share.clone() }).is_none());
        // ...a descriptor that is not a feeder's memory, even holding the nonce (never
        // mapped: it could be anything, a FIFO among them)...
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &share.nonce).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let err = Region::open_peer(share.pid, fd, 16).err().unwrap().to_string();
        assert!(err.to_string().contains("not a meshfeed memory region"), "{err}");
        assert!(Peer::probe(&Share { fd, ..share.clone() }).is_none());
        // ...or no such process: the client reads over the socket.
        assert!(Peer::probe(&Share { pid: u32::MAX - 1, ..share }).is_none());
    }

    /// The client's request for row 0 of file 0, and the most its answer may hold.
    fn one_row() -> (Vec<u8>, u64) {
        (Request { file: 0, rows: vec![0], mapped: false }.encode(), wire::answer_bound(1, 1, 3))
    }

    #[test]
    fn a_feeder_still_reading_keeps_the_answer_timeout_alive_and_a_silent_one_fails_it() {
        let (request, max) = one_row();
        // Told five times over 1.5 s that the file is being read, more of it each time: a
        // 1 s timeout holds.
        let (source, feeder) = fake_feeder(keep_alives(5, Duration::from_millis(300), |i| 1000 * (i + 1)));
        let (mut conn, _) = Connection::open(&source, &source.address, false, Duration::from_secs(1)).unwrap();
        let answer = conn.call(&request, max, true).unwrap();
        assert_eq!(&answer[answer.len() - 3..], b"abc");
        drop(conn);
        feeder.join().unwrap();
        // Silent for 1.5 s: the read fails after 1 s, saying why.
        let (source, feeder) = fake_feeder(|(_, w)| {
            std::thread::sleep(Duration::from_millis(1500));
            let _ = wire::write_frame(w, &wire::rows_answer(1, &[b"abc"]));
        });
        let (mut conn, _) = Connection::open(&source, &source.address, false, Duration::from_secs(1)).unwrap();
        let start = std::time::Instant::now();
        let err = conn.call(&request, max, true).unwrap_err();
        assert!(err.to_string().contains("no answer within 1s"), "{err}");
        assert!(start.elapsed() < Duration::from_millis(1400), "it waited {:?}", start.elapsed());
        // The late answer arrives; the next call must not take it for its own.
        std::thread::sleep(Duration::from_millis(800));
        let again = conn.call(&request, max, true).unwrap_err();
        assert_eq!(again, err, "a connection that failed is not used again");
        drop(conn);
        feeder.join().unwrap();
    }

    #[test]
    fn keep_alives_without_progress_hold_no_read_past_two_timeouts() {
        let (request, max) = one_row();
        // A feeder stuck on its storage (or a squatter on its port) says "still reading"
        // every 200 ms for 5 s, never having read more: a 1 s timeout fails the read
        // after the first report's one restart.
        let (source, feeder) = fake_feeder(keep_alives(25, Duration::from_millis(200), |_| 7));
        let (mut conn, _) = Connection::open(&source, &source.address, false, Duration::from_secs(1)).unwrap();
        let start = std::time::Instant::now();
        let err = conn.call(&request, max, true).unwrap_err();
        assert!(err.to_string().contains("no answer within 1s"), "{err}");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_secs(1) && waited < Duration::from_millis(2000), "waited {waited:?}");
        drop(conn);
        feeder.join().unwrap();
    }

    #[test]
    fn a_keep_alive_before_the_welcome_is_refused_at_once() {
        // Whatever holds a dead feeder's port answers every hello with keep-alives.
        let (source, peer) = fake_peer(|(r, w)| {
            wire::read_frame(r, wire::MAX_HELLO).unwrap();
            for i in 0..10 {
                if wire::write_frame(w, &wire::still_reading(i)).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        let start = std::time::Instant::now();
        let err = Connection::open(&source, &source.address, false, Duration::from_secs(2)).err().unwrap().to_string();
        assert!(err.to_string().contains("refused: a keep-alive where none is due: not a feeder's answer"), "{err}");
        assert!(err.to_string().contains(&format!("feeder meshfeed://{}/d", source.address)), "{err}");
        assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
        peer.join().unwrap();
    }

    #[test]
    fn an_answer_longer_than_the_rows_asked_for_is_refused_before_it_is_allocated() {
        let (request, max) = one_row();
        // 2^36 bytes announced for one row of 3 bytes: refused on its length alone.
        let (source, feeder) = fake_feeder(|(_, w)| {
            use std::io::Write;
            let _ = w.write_all(&(1u64 << 36).to_le_bytes()).and_then(|()| w.flush());
        });
        let (mut conn, _) = Connection::open(&source, &source.address, false, Duration::from_secs(5)).unwrap();
        let err = conn.call(&request, max, true).unwrap_err();
        assert_eq!(err.to_string(), format!("a bad answer: a frame of 68719476736 bytes (at most {max} here)"));
        drop(conn);
        feeder.join().unwrap();
        // The same over UCX's announcement.
        let (source, feeder) = fake_feeder(move |(_, w)| {
            let _ = wire::write_frame(w, &wire::via_ucx(1 << 36, 1));
        });
        let (mut conn, _) = Connection::open(&source, &source.address, false, Duration::from_secs(5)).unwrap();
        let err = conn.call(&request, max, true).unwrap_err();
        assert!(err.to_string().starts_with("an answer of 68719476736 bytes announced, at most"), "{err}");
        drop(conn);
        feeder.join().unwrap();
        // And a welcome: a job attaching to whatever answers there gets an error, not an abort.
        let (source, peer) = fake_peer(|(r, w)| {
            use std::io::Write;
            wire::read_frame(r, wire::MAX_HELLO).unwrap();
            let _ = w.write_all(&(1u64 << 36).to_le_bytes()).and_then(|()| w.flush());
        });
        let err = attach(&source).unwrap_err().to_string();
        assert!(
            err.contains(&format!(
                "refused: a bad answer: a frame of 68719476736 bytes (at most {} here)",
                wire::MAX_WELCOME
            )),
            "{err}"
        );
        peer.join().unwrap();
    }
}
