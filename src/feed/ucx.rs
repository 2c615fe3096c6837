//! Rows over UCX between a feeder and one client process (`meshfeed serve
//! --client-transport ucx`): each connection's two sides make a UCX worker of their own
//! and trade worker addresses over the connection, after the token check. The connection
//! still carries every request, and each answer's kind and length; an answer of values
//! of at least [`MIN_BYTES`] then follows as one tagged UCX message (on InfiniBand, RDMA
//! rather than TCP over IPoIB). A side that cannot make a worker says so with an empty
//! address, and the connection carries the values itself.

use std::time::{Duration, Instant};

use super::wire::WireError;
use crate::error::Result;
use crate::transport::ucx::raw::{self, Worker};

/// Answers smaller than this travel over the connection: a UCX message costs a round of
/// progress on both sides.
pub const MIN_BYTES: usize = 64 << 10;

/// How long a feeder's send may take before the connection is given up.
const SEND_DEADLINE: Duration = Duration::from_secs(120);

/// How long cancelling a failed transfer may take before its buffer is leaked.
const SETTLE: Duration = Duration::from_secs(2);

/// How often a transfer in progress asks whether the other side is still there.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// One side's worker for one connection.
pub struct Link {
    worker: Worker,
}

// SAFETY: the worker is serialized (any one thread at a time; `Worker::new` refuses a
// single-threaded one), a client's link is used under its connection's lock, and no
// request outlives the call that posted it (each is completed or settled, its buffer
// leaked where it could not be).
unsafe impl Send for Link {}

impl Link {
    /// A new worker, and its address for the other side.
    pub fn new() -> Result<(Link, Vec<u8>)> {
        let worker = Worker::new(None)?;
        let address = worker.address()?;
        Ok((Link { worker }, address))
    }

    /// The feeder's side: an endpoint to the client's worker at `address`, with UCX
    /// reporting the client's failure on it.
    pub fn connect(&mut self, address: &[u8]) -> Result<()> {
        self.worker.connect(&[&[], address], 0, true)
    }

    /// The feeder's side: sends `payload` to the client, tagged `tag`, and waits until it
    /// is delivered, while `waiting()` holds. On failure: why, and the payload unless
    /// UCX may still read it (then it is leaked).
    pub fn send(
        &self,
        payload: Vec<u8>,
        tag: u64,
        waiting: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<(), (WireError, Option<Vec<u8>>)> {
        // SAFETY: `payload` stays allocated and unmodified until the request completes, or
        // is leaked where it does not settle (`finish`); the request is dropped before the
        // worker (it lives in this call).
        match unsafe { self.worker.send(1, payload.as_ptr(), payload.len(), tag) } {
            Ok(request) => self.finish(request, payload, SEND_DEADLINE, waiting).map(|_| ()),
            Err(e) => Err((WireError::Connection(e.to_string()), Some(payload))),
        }
    }

    /// The client's side: receives the `len` bytes tagged `tag`, waiting at most
    /// `timeout` for the whole of it, and while `waiting()` holds (asked every
    /// [`CHECK_EVERY`]: the feeder's connection is quiet).
    pub fn recv(
        &self,
        len: usize,
        tag: u64,
        timeout: Duration,
        waiting: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<Vec<u8>, WireError> {
        let mut buffer = vec![0u8; len];
        // SAFETY: `buffer` stays allocated and untouched until the request completes, or
        // is leaked below where it does not settle; the request is dropped before the
        // worker (it lives in this call).
        let request = unsafe { self.worker.recv(buffer.as_mut_ptr(), len, tag) };
        let request = request.map_err(|e| WireError::Connection(e.to_string()))?;
        self.finish(request, buffer, timeout, waiting).map_err(|(why, _)| why)
    }

    /// Progresses `request` until it completes (returning `buffer`, checked to be whole
    /// for a receive), fails, `waiting()` stops holding or `timeout` passes; a request
    /// that did not complete is cancelled and settled, and `buffer` returned with why, or
    /// leaked where it does not settle.
    fn finish(
        &self,
        request: raw::Request,
        buffer: Vec<u8>,
        timeout: Duration,
        waiting: &mut dyn FnMut() -> bool,
    ) -> std::result::Result<Vec<u8>, (WireError, Option<Vec<u8>>)> {
        let deadline = Instant::now() + timeout;
        let mut checked = Instant::now();
        let failed = loop {
            match request.test() {
                Ok(true) => match request.received() {
                    Some(n) if n != buffer.len() => break format!("{n} bytes received of {}", buffer.len()),
                    _ => return Ok(buffer),
                },
                Err(failure) => break format!("UCX: {failure}"),
                Ok(false) if Instant::now() >= deadline => break format!("no UCX transfer within {timeout:?}"),
                Ok(false) if checked.elapsed() >= CHECK_EVERY => {
                    if !waiting() {
                        break "the other side stopped waiting".to_string();
                    }
                    checked = Instant::now();
                }
                Ok(false) => {
                    if !self.worker.progress() {
                        std::thread::yield_now();
                    }
                }
            }
        };
        let why = WireError::Connection(failed);
        let mut pending = vec![request];
        if !raw::settle(&mut pending, Instant::now() + SETTLE) {
            // UCX may still read or write it: never freed.
            std::mem::forget(buffer);
            return Err((why, None));
        }
        Err((why, Some(buffer)))
    }
}
