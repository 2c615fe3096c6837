//! The feeder's side: the dataset read once and held in memory, and a thread per client
//! connection answering requests for rows.

use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::wire::{self, Hello, Request};
use crate::dataset::{Dataset, FileInfo, RowChunk};
use crate::error::{Error, Result};

/// How often a request waiting for a file not read yet tells its client so.
/// (Half the shortest answer timeout a client allows.)
const KEEP_ALIVE: Duration = if cfg!(test) { Duration::from_millis(20) } else { Duration::from_millis(500) };

/// The feeder rank that serves file `file`, of a feeder of `ranks` ranks.
pub fn owner(file: usize, ranks: usize) -> usize {
    file % ranks.max(1)
}

/// One file's rows on a feeder rank, as loading goes.
enum Slot {
    /// Another rank's file.
    Other,
    /// Not read yet: requests for it wait.
    Loading,
    Loaded(Arc<RowChunk>),
    /// Reading it failed: requests for it are refused with this.
    Failed(String),
}

/// A dataset held in memory for its clients: the files one feeder rank serves. It serves
/// from the start: a request for a file not read yet waits until [`Feeder::load`] has
/// read it.
pub struct Feeder {
    name: String,
    token: String,
    /// What a client that presents the token receives (JSON): the files' headers and
    /// each file's feeder address ([`Feeder::set_addresses`]).
    welcome: Vec<u8>,
    slots: Mutex<Vec<Slot>>,
    /// Signalled as each file is read (or fails).
    read: Condvar,
    /// Bytes read from storage, and how long it took ([`Feeder::load`]).
    loaded: Mutex<(u64, Duration)>,
    /// Requests answered and bytes sent, over every client.
    requests: AtomicU64,
    bytes_sent: AtomicU64,
}

impl Feeder {
    /// Rank `rank` of a feeder of `ranks` ranks for `dataset`, holding nothing yet; it
    /// serves the files [`owner`] gives it. The dataset delivers its files' own rows:
    /// packing and field selection are the clients' options.
    pub fn new(dataset: &Dataset, rank: usize, ranks: usize, name: &str, token: String) -> Result<Feeder> {
        if dataset.options().pack.is_some() || dataset.options().fields.is_some() {
            return Err(Error::Config(
                "a feeder serves whole files: sequence packing and field selection are the clients' options".into(),
            ));
        }
        let slots = (0..dataset.files().len())
            .map(|i| if owner(i, ranks) == rank { Slot::Loading } else { Slot::Other })
            .collect();
        Ok(Feeder {
            name: name.into(),
            token,
            welcome: Vec::new(),
            slots: Mutex::new(slots),
            read: Condvar::new(),
            loaded: Mutex::new((0, Duration::ZERO)),
            requests: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
        })
    }

    /// Reads this rank's files of `dataset` (the one it was made for), each whole, one
    /// after another, handing each to the requests waiting for it. A file that cannot be
    /// read is an error here and the refusal of every request for it.
    pub fn load(&self, dataset: &Dataset) -> Result<()> {
        let start = Instant::now();
        let mut bytes = 0;
        for (i, info) in dataset.files().iter().enumerate() {
            if !matches!(self.slots()[i], Slot::Loading) {
                continue;
            }
            let rows: Vec<u64> = (0..info.samples).collect();
            let (slot, result) = match dataset.open_reader(i).and_then(|mut r| r.read_rows(&rows)) {
                Ok(chunk) => {
                    bytes += chunk.bytes_read();
                    (Slot::Loaded(Arc::new(chunk)), Ok(()))
                }
                Err(e) => (Slot::Failed(format!("the feeder could not read it: {e}")), Err(e)),
            };
            self.slots()[i] = slot;
            self.read.notify_all();
            result?;
        }
        *self.loaded.lock().unwrap_or_else(PoisonError::into_inner) = (bytes, start.elapsed());
        Ok(())
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Slot>> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
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
        self.slots().iter().filter(|s| !matches!(s, Slot::Other)).count()
    }

    /// Bytes this rank read from storage to load its files, and the time it took (once
    /// [`Feeder::load`] is done).
    pub fn loaded(&self) -> (u64, Duration) {
        *self.loaded.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Requests answered and bytes sent so far.
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
            let mut still_reading = || wire::write_frame(&mut w, &[wire::STILL_READING]).is_ok();
            match Request::decode(&frame).and_then(|request| self.rows(&request, &mut still_reading)) {
                Ok(answer) => {
                    self.requests.fetch_add(1, Ordering::Relaxed);
                    self.bytes_sent.fetch_add(answer.len() as u64, Ordering::Relaxed);
                    wire::write_frame(&mut w, &answer)?;
                }
                Err(reason) => {
                    wire::write_frame(&mut w, &wire::answer(Err(reason.clone())))?;
                    return Err(std::io::Error::other(format!("bad request: {reason}")));
                }
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

    /// The answer to one request: its rows' values ([`wire::rows_answer`]). A request for
    /// a file not read yet waits for it, calling `still_reading` every [`KEEP_ALIVE`]
    /// (which tells the client, so that its answer timeout does not run out); where that
    /// returns false (the client left), the request is dropped.
    fn rows(&self, request: &Request, still_reading: &mut dyn FnMut() -> bool) -> std::result::Result<Vec<u8>, String> {
        let chunk = loop {
            let timed_out = {
                let slots = self.slots();
                match slots.get(request.file as usize) {
                    None => return Err(format!("no file {} (the dataset has {})", request.file, slots.len())),
                    Some(Slot::Other) => return Err(format!("file {} is served by another feeder rank", request.file)),
                    Some(Slot::Failed(reason)) => return Err(reason.clone()),
                    Some(Slot::Loaded(chunk)) => break chunk.clone(),
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
                return Err("the client left while its file was being read".into());
            }
        };
        if let Some(&last) = request.rows.last().filter(|&&r| r >= chunk.rows() as u64) {
            return Err(format!("row {last} of file {} is past its end ({} rows)", request.file, chunk.rows()));
        }
        let (fields, chunk) = (chunk.fields(), &*chunk);
        let values: Vec<&[u8]> =
            request.rows.iter().flat_map(|&row| (0..fields).map(move |f| chunk.value(row as usize, f))).collect();
        Ok(wire::rows_answer(fields as u32, &values))
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
        let mut feeder = Feeder::new(&ds, 1, 2, "d", "secret".into()).unwrap();
        assert_eq!(feeder.files(), 2, "files 1 and 3");
        let addresses = ["a:1".to_string(), "b:2".to_string()];
        feeder.set_addresses(ds.files(), &addresses).unwrap();
        // A request before the file is read waits for it.
        let feeder = Arc::new(feeder);
        let early = std::thread::spawn({
            let feeder = feeder.clone();
            move || {
                let mut told = 0;
                let rows = feeder.rows(&Request { file: 3, rows: vec![0, 7, 99] }, &mut || {
                    told += 1;
                    true
                });
                (rows, told)
            }
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!early.is_finished(), "a request for a file not read yet is answered");
        feeder.load(&ds).unwrap();
        assert_eq!(feeder.loaded().0, 2 * 100 * 14, "two files of 100 rows of 14 bytes, read once");
        let hello = |token: &str, name: &str| Hello { token: token.into(), name: name.into() }.encode();
        let (files, owners) =
            crate::loader::welcome_from_json(&feeder.welcome(&hello("secret", "d")).unwrap()).unwrap();
        assert_eq!(files, ds.files());
        assert_eq!(owners, ["a:1", "b:2", "a:1", "b:2", "a:1"]);
        assert!(feeder.welcome(&hello("secreT", "d")).unwrap_err().contains("wrong token"));
        assert!(feeder.welcome(&hello("secret", "e")).unwrap_err().contains("serves 'd', not 'e'"));
        // Its rows are the file's, byte for byte; others' files and rows past the end are refused.
        let (answer, told) = early.join().unwrap();
        let answer = answer.unwrap();
        assert!(told >= 1, "the waiting client was told the file is still being read");
        let payload = wire::parse_answer(&answer).unwrap();
        let rows = wire::Rows::decode(payload, 3).unwrap();
        let direct = ds.open_reader(3).unwrap().read_rows(&[0, 7, 99]).unwrap();
        let direct = &direct;
        let want: Vec<u8> = (0..3).flat_map(|r| (0..2).flat_map(move |f| direct.value(r, f).to_vec())).collect();
        assert_eq!((rows.fields, rows.lens.len(), &payload[rows.values_at..]), (2, 6, want.as_slice()));
        let mut never = || panic!("nothing waits for a file read");
        assert!(feeder
            .rows(&Request { file: 2, rows: vec![0] }, &mut never)
            .unwrap_err()
            .contains("served by another feeder rank"));
        assert!(feeder
            .rows(&Request { file: 3, rows: vec![100] }, &mut never)
            .unwrap_err()
            .contains("past its end (100 rows)"));
        assert!(feeder.rows(&Request { file: 9, rows: vec![0] }, &mut never).unwrap_err().contains("no file 9"));
    }
}
