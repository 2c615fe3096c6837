//! What a feeder lets its peers hold: a network listener bounds what a peer can take from
//! it before that peer has proven that it holds the token.
//!
//! * A connection that has not presented its hello (the token) within
//!   [`Limits::hello_timeout`] is closed: the deadline covers the whole hello, so a peer
//!   that sends it a byte at a time gains nothing ([`ByDeadline`]).
//! * At most [`Limits::connections`] are open (each is a thread): one more is closed as
//!   soon as it is accepted. At most [`Limits::unauthenticated`] of them wait for their
//!   hello: one more closes the one that has waited longest ([`Ticket`]). So strangers can
//!   take neither the feeder's descriptors nor its threads, and cannot lock new clients
//!   out either: a client sends its hello as soon as it connects, and a stranger would
//!   have to open connections faster than that round trip to push it out.
//! * A failure to accept that passes (no descriptor, no memory, a peer that left before it
//!   was accepted) is logged and waited out ([`accept_passes`]); the feeder serves on.
//!
//! Lengths are bounded where frames are read ([`super::wire`]); what a token holder may ask
//! for is bounded by the dataset ([`super::wire::request_bound`]).

use std::collections::VecDeque;
use std::io::Read;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// What a feeder lets its peers hold (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// How long a connection may take, from being accepted, to present its hello.
    pub hello_timeout: Duration,
    /// Connections that have not presented the token yet, at most.
    pub unauthenticated: usize,
    /// Connections, at most (each is a thread of the feeder).
    pub connections: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { hello_timeout: Duration::from_secs(10), unauthenticated: 64, connections: 1024 }
    }
}

/// The connections a feeder holds: how many are open, and those waiting for their hello,
/// oldest first (a handle to each, to close it when a newer one needs its place).
#[derive(Debug, Default)]
pub struct Admitted {
    open: AtomicUsize,
    waiting: Mutex<VecDeque<(u64, TcpStream)>>,
    next: AtomicU64,
    evicted: AtomicU64,
}

impl Admitted {
    /// (open, waiting for their hello).
    pub fn counts(&self) -> (usize, usize) {
        (self.open.load(Ordering::Relaxed), self.waiting().len())
    }

    /// Connections closed, while waiting for their hello, to make room for newer ones.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn waiting(&self) -> MutexGuard<'_, VecDeque<(u64, TcpStream)>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One admitted connection's place within the [`Limits`]; given back when dropped.
#[derive(Debug)]
pub struct Ticket {
    admitted: Arc<Admitted>,
    /// Its place among those waiting for their hello, until it is past it.
    waiting: Option<u64>,
}

impl Ticket {
    /// A place for a connection just accepted (`handle`: a handle to it, to close it when a
    /// newer one needs its place), if fewer than [`Limits::connections`] are open; where
    /// [`Limits::unauthenticated`] already wait for their hello, the oldest of them is
    /// closed (its thread then ends, and gives its place back).
    pub fn take(admitted: &Arc<Admitted>, limits: &Limits, handle: TcpStream) -> Option<Ticket> {
        let open = admitted
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limits.connections).then_some(n + 1));
        if open.is_err() {
            return None;
        }
        let id = admitted.next.fetch_add(1, Ordering::Relaxed);
        let mut waiting = admitted.waiting();
        while waiting.len() >= limits.unauthenticated.max(1) {
            let Some((_, oldest)) = waiting.pop_front() else { break };
            let _ = oldest.shutdown(Shutdown::Both);
            admitted.evicted.fetch_add(1, Ordering::Relaxed);
        }
        waiting.push_back((id, handle));
        Some(Ticket { admitted: admitted.clone(), waiting: Some(id) })
    }

    /// The connection presented the token: it no longer counts as waiting.
    pub fn authenticated(&mut self) {
        if let Some(id) = self.waiting.take() {
            self.admitted.waiting().retain(|(other, _)| *other != id);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.authenticated();
        self.admitted.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether a failed `accept` passes, so that the feeder waits and accepts again: the
/// process or the system ran out of descriptors or memory, or the peer left before it was
/// accepted. Anything else (the socket itself failed) ends the listener.
pub fn accept_passes(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::ECONNABORTED
                | libc::EPROTO
                | libc::EINTR
                | libc::EAGAIN
                | libc::EPERM
        )
    )
}

/// A reader of a stream that fails once `deadline` has passed, however the bytes come:
/// each read waits at most the time left.
pub struct ByDeadline<'a> {
    pub stream: &'a TcpStream,
    pub deadline: Instant,
}

impl Read for ByDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        (&mut &*self.stream).read(buf)
    }
}

/// The error of a connection that failed before its hello was done: a deadline that
/// passed says which.
pub fn before_hello(e: std::io::Error, timeout: Duration) -> std::io::Error {
    match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
            std::io::Error::new(std::io::ErrorKind::TimedOut, format!("no hello within {timeout:?}: closed"))
        }
        _ => e,
    }
}

/// A log line that repeats at most every ten seconds, saying how many it held back.
#[derive(Debug, Default)]
pub struct Throttled {
    last: Option<Instant>,
    held_back: u64,
}

impl Throttled {
    /// Prints `line()` unless a line was printed in the last ten seconds.
    pub fn log(&mut self, line: impl FnOnce() -> String) {
        if self.last.is_some_and(|t| t.elapsed() < Duration::from_secs(10)) {
            self.held_back += 1;
            return;
        }
        match std::mem::take(&mut self.held_back) {
            0 => eprintln!("{}", line()),
            n => eprintln!("{} ({n} more like it since the last)", line()),
        }
        self.last = Some(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` connected pairs: (the client's end, the accepted end).
    fn pairs(n: usize) -> Vec<(TcpStream, TcpStream)> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        (0..n).map(|_| (TcpStream::connect(address).unwrap(), listener.accept().unwrap().0)).collect()
    }

    /// Whether the peer of `client` closed it (reads end at once).
    fn closed(client: &TcpStream) -> bool {
        client.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        matches!((&mut &*client).read(&mut [0u8; 1]), Ok(0))
    }

    #[test]
    fn tickets_keep_connections_within_the_limits_and_are_given_back() {
        let admitted = Arc::new(Admitted::default());
        let limits = Limits { unauthenticated: 2, connections: 4, ..Limits::default() };
        let p = pairs(5);
        let mut a = Ticket::take(&admitted, &limits, p[0].1.try_clone().unwrap()).unwrap();
        let b = Ticket::take(&admitted, &limits, p[1].1.try_clone().unwrap()).unwrap();
        assert_eq!(admitted.counts(), (2, 2));
        // A third waiting for its hello closes the one that waited longest.
        let c = Ticket::take(&admitted, &limits, p[2].1.try_clone().unwrap()).unwrap();
        assert_eq!((admitted.counts(), admitted.evicted()), ((3, 2), 1));
        assert!(closed(&p[0].0), "the oldest stranger is closed");
        assert!(!closed(&p[1].0) && !closed(&p[2].0));
        // Its thread ends, giving its place back; the next closes the next oldest.
        drop(a);
        let mut d = Ticket::take(&admitted, &limits, p[3].1.try_clone().unwrap()).unwrap();
        assert!(closed(&p[1].0));
        // One past the token no longer waits, and is never closed for room.
        d.authenticated();
        d.authenticated();
        assert_eq!(admitted.counts(), (3, 1));
        a = Ticket::take(&admitted, &limits, p[4].1.try_clone().unwrap()).unwrap();
        assert!(!closed(&p[2].0) && !closed(&p[3].0));
        // Four open: a fifth is not admitted, and nothing is closed for it.
        let extra = pairs(1);
        assert!(Ticket::take(&admitted, &limits, extra[0].1.try_clone().unwrap()).is_none());
        assert_eq!((admitted.counts(), admitted.evicted()), ((4, 2), 2));
        drop((a, b, c, d));
        assert_eq!(admitted.counts(), (0, 0));
    }

    #[test]
    fn running_out_of_descriptors_passes_and_a_broken_socket_does_not() {
        for passes in [libc::EMFILE, libc::ENFILE, libc::ECONNABORTED, libc::ENOBUFS, libc::ENOMEM] {
            assert!(accept_passes(&std::io::Error::from_raw_os_error(passes)), "{passes}");
        }
        for ends in [libc::EBADF, libc::EINVAL, libc::ENOTSOCK] {
            assert!(!accept_passes(&std::io::Error::from_raw_os_error(ends)), "{ends}");
        }
    }

    #[test]
    fn a_deadline_bounds_the_whole_read_however_the_bytes_come() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        // A peer that sends a byte every 100 ms and never finishes its 8-byte length.
        let peer = std::thread::spawn(move || {
            let mut s = TcpStream::connect(address).unwrap();
            for _ in 0..20 {
                if std::io::Write::write_all(&mut s, &[1]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let (stream, _) = listener.accept().unwrap();
        let start = Instant::now();
        let timeout = Duration::from_millis(450);
        let err = super::super::wire::read_frame(&mut ByDeadline { stream: &stream, deadline: start + timeout }, 64)
            .map_err(|e| before_hello(e, timeout))
            .unwrap_err();
        assert_eq!(err.to_string(), "no hello within 450ms: closed");
        let waited = start.elapsed();
        assert!(waited >= timeout && waited < Duration::from_millis(900), "waited {waited:?}");
        drop(stream);
        peer.join().unwrap();
    }
}
