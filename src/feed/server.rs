//! The feeder's side: the dataset read once and held in memory, and a thread per client
//! connection answering requests for rows.

use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wire::{self, Hello, Request, Rows};
use crate::dataset::{Dataset, DatasetOptions, RowChunk};
use crate::error::{Error, Result};

/// A dataset held in memory for its clients.
pub struct Feeder {
    name: String,
    token: String,
    /// The files' headers as a client receives them (JSON).
    headers: Vec<u8>,
    /// Every row of each file.
    files: Vec<RowChunk>,
    samples: u64,
    /// Bytes read from storage, and how long it took.
    bytes_read: u64,
    load_time: Duration,
    /// Requests answered and value bytes sent, over every client.
    requests: AtomicU64,
    bytes_sent: AtomicU64,
}

impl Feeder {
    /// Reads the dataset at `paths` whole, file after file, each file in one pass.
    pub fn load(paths: &[PathBuf], options: DatasetOptions, name: &str, token: String) -> Result<Feeder> {
        if options.pack.is_some() || options.fields.is_some() {
            return Err(Error::Config(
                "a feeder serves whole files: sequence packing and field selection are the clients' options".into(),
            ));
        }
        let start = Instant::now();
        let dataset = Dataset::open_local(paths, options)?;
        let headers = crate::loader::wire_headers(dataset.files())?;
        let mut files = Vec::with_capacity(dataset.files().len());
        let mut bytes_read = 0;
        for (i, info) in dataset.files().iter().enumerate() {
            let rows: Vec<u64> = (0..info.samples).collect();
            let chunk = dataset.open_reader(i)?.read_rows(&rows)?;
            bytes_read += chunk.bytes_read();
            files.push(chunk);
        }
        Ok(Feeder {
            name: name.into(),
            token,
            headers,
            files,
            samples: dataset.len(),
            bytes_read,
            load_time: start.elapsed(),
            requests: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Bytes read from storage to load the dataset, and the time loading took.
    pub fn loaded(&self) -> (u64, Duration) {
        (self.bytes_read, self.load_time)
    }

    /// Requests answered and value bytes sent so far.
    pub fn served(&self) -> (u64, u64) {
        (self.requests.load(Ordering::Relaxed), self.bytes_sent.load(Ordering::Relaxed))
    }

    /// Accepts clients on `listener` until it fails, a thread per connection. A
    /// connection's failure (a client that dies, a stranger) ends that connection only.
    pub fn serve(self: Arc<Self>, listener: TcpListener) -> Result<()> {
        loop {
            let (stream, peer) = listener.accept().map_err(|e| Error::Transport(format!("accept: {e}")))?;
            let feeder = self.clone();
            std::thread::spawn(move || {
                if let Err(e) = feeder.connection(stream) {
                    eprintln!("meshfeed serve: {}: client {peer}: {e}", feeder.name);
                }
            });
        }
    }

    /// One client connection: the hello, then requests until the client closes.
    fn connection(&self, stream: TcpStream) -> std::io::Result<()> {
        stream.set_nodelay(true)?;
        let mut r = BufReader::new(stream.try_clone()?);
        let mut w = BufWriter::new(stream);
        let Some(hello) = wire::read_frame(&mut r, wire::MAX_HELLO)? else { return Ok(()) };
        let welcome = self.welcome(&hello);
        let refused = welcome.as_ref().err().cloned();
        wire::write_frame(&mut w, &wire::answer(welcome))?;
        if let Some(reason) = refused {
            return Err(std::io::Error::other(format!("refused: {reason}")));
        }
        while let Some(frame) = wire::read_frame(&mut r, wire::MAX_FRAME)? {
            let rows = Request::decode(&frame).and_then(|request| self.rows(&request));
            let failed = rows.as_ref().err().cloned();
            let rows = rows.map(|rows| {
                self.requests.fetch_add(1, Ordering::Relaxed);
                self.bytes_sent.fetch_add(rows.bytes.len() as u64, Ordering::Relaxed);
                rows.encode()
            });
            wire::write_frame(&mut w, &wire::answer(rows))?;
            if let Some(reason) = failed {
                return Err(std::io::Error::other(format!("bad request: {reason}")));
            }
        }
        Ok(())
    }

    /// The answer to a hello: the files' headers, or why the client is refused.
    fn welcome(&self, hello: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let hello = Hello::decode(hello)?;
        if !super::same_token(&hello.token, &self.token) {
            return Err("the feeder's token was not presented (wrong token)".into());
        }
        if hello.name != self.name {
            return Err(format!("this feeder serves '{}', not '{}'", self.name, hello.name));
        }
        Ok(self.headers.clone())
    }

    /// The values of one request's rows.
    fn rows(&self, request: &Request) -> std::result::Result<Rows, String> {
        let chunk = self
            .files
            .get(request.file as usize)
            .ok_or_else(|| format!("no file {} (the dataset has {})", request.file, self.files.len()))?;
        if let Some(&last) = request.rows.last().filter(|&&r| r >= chunk.rows() as u64) {
            return Err(format!("row {last} of file {} is past its end ({} rows)", request.file, chunk.rows()));
        }
        let fields = chunk.fields();
        let mut out =
            Rows { fields: fields as u32, lens: Vec::with_capacity(request.rows.len() * fields), bytes: Vec::new() };
        for &row in &request.rows {
            for field in 0..fields {
                let value = chunk.value(row as usize, field);
                out.lens.push(value.len() as u64);
                out.bytes.extend_from_slice(value);
            }
        }
        Ok(out)
    }
}
