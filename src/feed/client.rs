//! A client's side: attaching to a feeder, and a [`FileReader`] that reads a file's rows
//! from it.

use std::collections::HashMap;
use std::io::{BufReader, BufWriter};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arrow_buffer::Buffer;

use super::wire::{self, Hello, Request, Rows};
use super::Source;
use crate::dataset::{FileInfo, FileReader, RowChunk};
use crate::error::{Error, Result};

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
    broken: Option<String>,
}

impl Connection {
    /// Connects to the feeder rank at `address`, presents the token and the name; returns
    /// the connection and the answer: the feeder's welcome (JSON) from byte 1 where
    /// `headers` asks for it. A refusal or an unreachable feeder is an error naming it.
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
        let mut conn = Connection { r, w: BufWriter::new(stream), timeout, broken: None };
        let hello = Hello { token: source.token.clone(), name: source.name.clone(), headers };
        let headers = conn.call(&hello.encode()).map_err(|e| fail(format!("refused: {e}")))?;
        Ok((conn, headers))
    }

    /// Sends one frame and reads the answer: the whole frame (its payload from byte 1), or
    /// the feeder's message. Once the connection failed, every call fails as it did.
    fn call(&mut self, frame: &[u8]) -> std::result::Result<Vec<u8>, String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        // The feeder closes a connection after refusing a request on it: later calls fail
        // with its reason.
        let answer = self.exchange(frame).and_then(|answer| {
            wire::parse_answer(&answer)?;
            Ok(answer)
        });
        if let Err(why) = &answer {
            self.broken = Some(why.clone());
        }
        answer
    }

    /// One request and its answer frame, or why the connection failed.
    fn exchange(&mut self, frame: &[u8]) -> std::result::Result<Vec<u8>, String> {
        use std::io::ErrorKind::*;
        let timeout = self.timeout;
        let failed = |e: std::io::Error| match e.kind() {
            // A feeder that exits (killed, stopped) resets or closes its connections.
            UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => {
                format!("the feeder closed the connection (was it stopped?): {e}")
            }
            WouldBlock | TimedOut => format!("no answer within {timeout:?} (MESHFEED_FEEDER_TIMEOUT_S)"),
            _ => format!("the connection failed: {e}"),
        };
        wire::write_frame(&mut self.w, frame).map_err(failed)?;
        loop {
            match wire::read_frame(&mut self.r, wire::MAX_FRAME) {
                // The feeder is still reading the file: each of these restarts the timeout.
                Ok(Some(frame)) if frame == [wire::STILL_READING] => continue,
                Ok(Some(answer)) => return Ok(answer),
                Ok(None) => return Err("the feeder closed the connection (was it stopped?)".into()),
                Err(e) => return Err(failed(e)),
            }
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

/// Reads a feeder's welcome ([`attach`]): the headers of the files it serves and the
/// address of the feeder rank serving each.
pub fn welcome(source: &Source, welcome: &[u8]) -> Result<(Vec<FileInfo>, Vec<String>)> {
    crate::loader::welcome_from_json(welcome)
        .map_err(|e| Error::Transport(format!("feeder {}: bad file headers: {e}", source.url())))
}

/// A job's way to a feeder, in one process: where it is, the feeder rank serving each
/// file, and one connection to each feeder rank this process reads from, which the
/// readers of its files share (a process opens at most one connection a feeder rank,
/// however many files it reads).
pub struct Feed {
    pub source: Source,
    /// `owners[i]`: the address of the feeder rank that serves file `i`.
    pub owners: Vec<String>,
    connections: Mutex<HashMap<String, Arc<Mutex<Connection>>>>,
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Feed({:?}, {} files)", self.source, self.owners.len())
    }
}

impl Feed {
    pub fn new(source: Source, owners: Vec<String>) -> Feed {
        Feed { source, owners, connections: Mutex::new(HashMap::new()) }
    }

    /// A reader of file `file` (`info`: its header), on the connection to the feeder rank
    /// serving it (opened on first use).
    pub fn reader(&self, file: usize, info: &FileInfo) -> Result<Reader> {
        let address = &self.owners[file];
        let name =
            info.path.file_name().map_or_else(|| info.path.display().to_string(), |n| n.to_string_lossy().into());
        let path = PathBuf::from(format!("{}{address}/{}/{name}", super::SCHEME, self.source.name));
        let mut connections = self.connections.lock().unwrap_or_else(PoisonError::into_inner);
        let conn = match connections.get(address) {
            Some(conn) => conn.clone(),
            None => {
                let (conn, _) = Connection::open(&self.source, address, false, answer_timeout())?;
                let conn = Arc::new(Mutex::new(conn));
                connections.insert(address.clone(), conn.clone());
                conn
            }
        };
        Ok(Reader { conn, file: file as u32, fields: info.fields.len(), path })
    }
}

/// Reads the rows of one file from the feeder ([`Feed::reader`]).
pub struct Reader {
    conn: Arc<Mutex<Connection>>,
    file: u32,
    fields: usize,
    /// `meshfeed://HOST:PORT/NAME/FILE`, for messages.
    path: PathBuf,
}

impl FileReader for Reader {
    fn read_rows(&mut self, rows: &[u64]) -> Result<RowChunk> {
        let request = Request { file: self.file, rows: rows.to_vec() };
        let answer = self.conn.lock().unwrap_or_else(PoisonError::into_inner).call(&request.encode());
        let answer = answer.map_err(|e| Error::file(&self.path, e))?;
        // The values stay in the frame they arrived in: one buffer, no copy.
        let got =
            Rows::decode(&answer[1..], rows.len()).map_err(|e| Error::file(&self.path, format!("bad answer: {e}")))?;
        if got.fields as usize != self.fields {
            return Err(Error::file(&self.path, format!("{} fields, the header says {}", got.fields, self.fields)));
        }
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

    /// A feeder that welcomes one reader, then answers its one request with `before`
    /// frames (`STILL_READING` or nothing, each after `every`), then rows (one value).
    fn fake_feeder(before: usize, every: Duration, still_reading: bool) -> (Source, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let feeder = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let (mut r, mut w) = (BufReader::new(stream.try_clone().unwrap()), BufWriter::new(stream));
            wire::read_frame(&mut r, wire::MAX_HELLO).unwrap().unwrap();
            wire::write_frame(&mut w, &wire::answer(Ok(Vec::new()))).unwrap();
            wire::read_frame(&mut r, wire::MAX_FRAME).unwrap().unwrap();
            for _ in 0..before {
                std::thread::sleep(every);
                if still_reading {
                    wire::write_frame(&mut w, &[wire::STILL_READING]).unwrap();
                }
            }
            let _ = wire::write_frame(&mut w, &wire::rows_answer(1, &[b"abc"]));
            // Held open until the client has read (or given up).
            let _ = wire::read_frame(&mut r, wire::MAX_FRAME);
        });
        (Source { address, name: "d".into(), token: "t".into() }, feeder)
    }

    #[test]
    fn a_feeder_still_reading_keeps_the_answer_timeout_alive_and_a_silent_one_fails_it() {
        let request = Request { file: 0, rows: vec![0] }.encode();
        // Told five times over 1.5 s that the file is being read: a 1 s timeout holds.
        let (source, feeder) = fake_feeder(5, Duration::from_millis(300), true);
        let (mut conn, _) = Connection::open(&source, &source.address, false, Duration::from_secs(1)).unwrap();
        let answer = conn.call(&request).unwrap();
        assert_eq!(&answer[answer.len() - 3..], b"abc");
        drop(conn);
        feeder.join().unwrap();
        // Silent for 1.5 s: the read fails after 1 s, saying why.
        let (source, feeder) = fake_feeder(1, Duration::from_millis(1500), false);
        let (mut conn, _) = Connection::open(&source, &source.address, false, Duration::from_secs(1)).unwrap();
        let start = std::time::Instant::now();
        let err = conn.call(&request).unwrap_err();
        assert!(err.contains("no answer within 1s"), "{err}");
        assert!(start.elapsed() < Duration::from_millis(1400), "it waited {:?}", start.elapsed());
        // The late answer arrives; the next call must not take it for its own.
        std::thread::sleep(Duration::from_millis(800));
        let again = conn.call(&request).unwrap_err();
        assert_eq!(again, err, "a connection that failed is not used again");
        drop(conn);
        feeder.join().unwrap();
    }
}
