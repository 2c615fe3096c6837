//! The feeder's side: the dataset read once and held in memory, and a thread per client
//! connection answering requests for rows.

use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::wire::{self, Hello, Request, Rows};
use crate::dataset::{Dataset, FileInfo, RowChunk};
use crate::error::{Error, Result};

/// The feeder rank that serves file `file`, of a feeder of `ranks` ranks.
pub fn owner(file: usize, ranks: usize) -> usize {
    file % ranks.max(1)
}

/// A dataset held in memory for its clients: the files one feeder rank serves.
pub struct Feeder {
    name: String,
    token: String,
    /// What a client that presents the token receives (JSON): the files' headers and
    /// each file's feeder address ([`Feeder::set_addresses`]).
    welcome: Vec<u8>,
    /// Every row of each file this rank serves (`None`: another rank's).
    files: Vec<Option<RowChunk>>,
    /// Bytes read from storage, and how long it took.
    bytes_read: u64,
    load_time: Duration,
    /// Requests answered and value bytes sent, over every client.
    requests: AtomicU64,
    bytes_sent: AtomicU64,
}

impl Feeder {
    /// Reads the files of `dataset` that rank `rank` of a feeder of `ranks` ranks serves
    /// ([`owner`]), each whole, one after another. The dataset delivers its files' own
    /// rows: packing and field selection are the clients' options.
    pub fn load(dataset: &Dataset, rank: usize, ranks: usize, name: &str, token: String) -> Result<Feeder> {
        if dataset.options().pack.is_some() || dataset.options().fields.is_some() {
            return Err(Error::Config(
                "a feeder serves whole files: sequence packing and field selection are the clients' options".into(),
            ));
        }
        let start = Instant::now();
        let mut files = Vec::with_capacity(dataset.files().len());
        let mut bytes_read = 0;
        for (i, info) in dataset.files().iter().enumerate() {
            if owner(i, ranks) != rank {
                files.push(None);
                continue;
            }
            let rows: Vec<u64> = (0..info.samples).collect();
            let chunk = dataset.open_reader(i)?.read_rows(&rows)?;
            bytes_read += chunk.bytes_read();
            files.push(Some(chunk));
        }
        Ok(Feeder {
            name: name.into(),
            token,
            welcome: Vec::new(),
            files,
            bytes_read,
            load_time: start.elapsed(),
            requests: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
        })
    }

    /// Tells clients where each file is served: `addresses[r]` (`HOST:PORT`) is feeder rank
    /// `r`'s; `files` are the dataset's headers.
    pub fn set_addresses(&mut self, files: &[FileInfo], addresses: &[String]) -> Result<()> {
        let owners = (0..files.len()).map(|i| addresses[owner(i, addresses.len())].clone()).collect();
        self.welcome = crate::loader::welcome_json(files, owners)?;
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The files this rank serves.
    pub fn files(&self) -> usize {
        self.files.iter().flatten().count()
    }

    /// Bytes this rank read from storage to load its files, and the time it took.
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
        Ok(self.welcome.clone())
    }

    /// The values of one request's rows.
    fn rows(&self, request: &Request) -> std::result::Result<Rows, String> {
        let chunk = self
            .files
            .get(request.file as usize)
            .ok_or_else(|| format!("no file {} (the dataset has {})", request.file, self.files.len()))?
            .as_ref()
            .ok_or_else(|| format!("file {} is served by another feeder rank", request.file))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::{gen, DType, Field, Format};

    #[test]
    fn a_feeder_rank_holds_every_fth_file_and_answers_only_for_them() {
        let dir = tempfile::tempdir().unwrap();
        let fields = vec![Field::tensor("x", DType::U16, vec![3]), Field::tensor("y", DType::I64, vec![])];
        let spec = gen::GenSpec {
            format: Format::Npy,
            samples: 500,
            files: 5,
            out: dir.path().into(),
            arrow_batch_rows: 9,
            fields,
        };
        for i in 0..5 {
            gen::write_file(&spec, i).unwrap();
        }
        let ds = Dataset::open_local(&[dir.path().into()], Default::default()).unwrap();
        let mut feeder = Feeder::load(&ds, 1, 2, "d", "secret".into()).unwrap();
        assert_eq!(feeder.files(), 2, "files 1 and 3");
        assert_eq!(feeder.loaded().0, 2 * 100 * 14, "two files of 100 rows of 14 bytes, read once");
        let addresses = ["a:1".to_string(), "b:2".to_string()];
        feeder.set_addresses(ds.files(), &addresses).unwrap();
        let hello = |token: &str, name: &str| Hello { token: token.into(), name: name.into() }.encode();
        let (files, owners) =
            crate::loader::welcome_from_json(&feeder.welcome(&hello("secret", "d")).unwrap()).unwrap();
        assert_eq!(files, ds.files());
        assert_eq!(owners, ["a:1", "b:2", "a:1", "b:2", "a:1"]);
        assert!(feeder.welcome(&hello("secreT", "d")).unwrap_err().contains("wrong token"));
        assert!(feeder.welcome(&hello("secret", "e")).unwrap_err().contains("serves 'd', not 'e'"));
        // Its rows are the file's, byte for byte; others' files and rows past the end are refused.
        let rows = feeder.rows(&Request { file: 3, rows: vec![0, 7, 99] }).unwrap();
        let direct = ds.open_reader(3).unwrap().read_rows(&[0, 7, 99]).unwrap();
        let direct = &direct;
        let want: Vec<u8> = (0..3).flat_map(|r| (0..2).flat_map(move |f| direct.value(r, f).to_vec())).collect();
        assert_eq!((rows.fields, rows.lens.len(), rows.bytes), (2, 6, want));
        assert!(feeder
            .rows(&Request { file: 2, rows: vec![0] })
            .unwrap_err()
            .contains("served by another feeder rank"));
        assert!(feeder.rows(&Request { file: 3, rows: vec![100] }).unwrap_err().contains("past its end (100 rows)"));
        assert!(feeder.rows(&Request { file: 9, rows: vec![0] }).unwrap_err().contains("no file 9"));
    }
}
