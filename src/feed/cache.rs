//! A feeder rank's cache of the rows it reads from storage (files past its memory
//! budget), so that jobs asking for the same rows at about the same time (jobs of a
//! shared order, `--shared-order`) read them from storage once between them.
//!
//! A request first [claims](RowCache::claim) its rows: those cached are its; those no
//! request is reading are marked as being read by it (it reads them, then
//! [fills](RowCache::fill) them in, or [abandons](RowCache::abandon) them when the read
//! fails); those another request is reading it [waits](RowCache::wait) for, and claims
//! again. A request never waits while it has rows marked as its own to read, so requests
//! cannot wait for one another in a circle. Rows leave the cache first in, first out,
//! once it holds more than its capacity.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// One row's values, field by field.
pub type Values = Arc<[Box<[u8]>]>;

/// Bytes a cached row costs besides its values: its key, its place in the map and the
/// queue, and each value's box.
const ROW_OVERHEAD: u64 = 96;
const VALUE_OVERHEAD: u64 = 24;

/// What [`RowCache::claim`] found for one row of a request.
#[derive(Clone, Debug)]
pub enum Claim {
    /// In the cache.
    Cached(Values),
    /// Marked as this request's to read (it must fill or abandon it).
    Mine,
    /// Another request is reading it.
    Pending,
}

enum Entry {
    Pending,
    Ready(Values),
}

#[derive(Default)]
struct State {
    entries: HashMap<(u32, u64), Entry>,
    /// Rows filled in, oldest first: one place for each cached row (a row leaves the
    /// queue as it leaves the cache, and only a row claimed, not cached, is filled in).
    order: VecDeque<(u32, u64)>,
    bytes: u64,
    hits: u64,
    /// Fills and abandons so far: a request waits only if none came since it claimed.
    changes: u64,
}

/// The rows read from storage, up to `capacity` bytes (none at 0: every request reads
/// its own rows).
pub struct RowCache {
    capacity: u64,
    state: Mutex<State>,
    changed: Condvar,
}

fn cost(values: &Values) -> u64 {
    ROW_OVERHEAD + values.iter().map(|v| v.len() as u64 + VALUE_OVERHEAD).sum::<u64>()
}

impl RowCache {
    pub fn new(capacity: u64) -> RowCache {
        RowCache { capacity, state: Mutex::new(State::default()), changed: Condvar::new() }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What each of `rows` of `file` is for this request; rows no request is reading are
    /// marked as this one's. Also the cache's change count, for [`RowCache::wait`].
    pub fn claim(&self, file: u32, rows: &[u64]) -> (Vec<Claim>, u64) {
        if self.capacity == 0 {
            return (vec![Claim::Mine; rows.len()], 0);
        }
        let mut state = self.state();
        let claims: Vec<Claim> = rows
            .iter()
            .map(|&row| match state.entries.get(&(file, row)) {
                Some(Entry::Ready(values)) => Claim::Cached(values.clone()),
                Some(Entry::Pending) => Claim::Pending,
                None => {
                    state.entries.insert((file, row), Entry::Pending);
                    Claim::Mine
                }
            })
            .collect();
        state.hits += claims.iter().filter(|c| matches!(c, Claim::Cached(_))).count() as u64;
        (claims, state.changes)
    }

    /// Rows this request claimed and read: cached (the oldest leave past the capacity),
    /// and the requests waiting for them woken.
    pub fn fill(&self, file: u32, rows: impl IntoIterator<Item = (u64, Values)>) {
        if self.capacity == 0 {
            return;
        }
        let mut state = self.state();
        for (row, values) in rows {
            state.bytes += cost(&values);
            let old = state.entries.insert((file, row), Entry::Ready(values));
            debug_assert!(matches!(old, Some(Entry::Pending)), "row {row} of file {file} filled in unclaimed");
            state.order.push_back((file, row));
        }
        state.changes += 1;
        while state.bytes > self.capacity {
            let Some(key) = state.order.pop_front() else { break };
            if let Some(Entry::Ready(values)) = state.entries.get(&key) {
                state.bytes -= cost(values);
                state.entries.remove(&key);
            }
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Rows this request claimed and could not read: unmarked, so that the requests
    /// waiting for them claim them again (and read them, or fail, themselves).
    pub fn abandon(&self, file: u32, rows: &[u64]) {
        if self.capacity == 0 {
            return;
        }
        let mut state = self.state();
        for &row in rows {
            if let Some(Entry::Pending) = state.entries.get(&(file, row)) {
                state.entries.remove(&(file, row));
            }
        }
        state.changes += 1;
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until rows are filled in or abandoned after the claim that returned
    /// `changes`, or `timeout` passes: true where it timed out.
    pub fn wait(&self, changes: u64, timeout: Duration) -> bool {
        let state = self.state();
        if state.changes != changes {
            return false;
        }
        let (_state, waited) = self.changed.wait_timeout(state, timeout).unwrap_or_else(PoisonError::into_inner);
        waited.timed_out()
    }

    /// Its capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Rows answered from the cache so far.
    pub fn hits(&self) -> u64 {
        self.state().hits
    }

    /// Bytes the cached rows take now (at most the capacity, after each fill).
    pub fn bytes(&self) -> u64 {
        self.state().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(byte: u8, len: usize) -> Values {
        Arc::from(vec![vec![byte; len].into_boxed_slice()])
    }

    fn kinds((claims, _): &(Vec<Claim>, u64)) -> String {
        claims
            .iter()
            .map(|c| match c {
                Claim::Cached(v) => char::from(b'0' + v[0][0]),
                Claim::Mine => 'm',
                Claim::Pending => 'p',
            })
            .collect()
    }

    #[test]
    fn rows_read_once_are_answered_from_the_cache_and_rows_being_read_are_waited_for() {
        let cache = RowCache::new(1 << 20);
        assert_eq!(kinds(&cache.claim(0, &[1, 2, 3])), "mmm");
        // Another request finds them being read, and rows of another file free.
        assert_eq!(kinds(&cache.claim(0, &[2, 4])), "pm");
        assert_eq!(kinds(&cache.claim(1, &[2])), "m");
        cache.fill(0, [(1, row(1, 10)), (2, row(2, 10))]);
        cache.abandon(0, &[3]);
        assert_eq!(kinds(&cache.claim(0, &[1, 2, 3])), "12m");
        assert_eq!(cache.hits(), 2);
        // A fill between a claim and its wait is not missed.
        let (claims, changes) = cache.claim(0, &[3]);
        assert!(matches!(claims[0], Claim::Pending));
        cache.fill(0, [(3, row(3, 10))]);
        let start = std::time::Instant::now();
        assert!(!cache.wait(changes, Duration::from_secs(10)));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_waiting_request_wakes_when_the_row_is_filled_in() {
        let cache = Arc::new(RowCache::new(1 << 20));
        assert_eq!(kinds(&cache.claim(0, &[7])), "m");
        let waiter = {
            let cache = cache.clone();
            std::thread::spawn(move || loop {
                let (claims, changes) = cache.claim(0, &[7]);
                match &claims[0] {
                    Claim::Cached(v) => return v[0][0],
                    Claim::Pending => {
                        cache.wait(changes, Duration::from_secs(10));
                    }
                    Claim::Mine => panic!("the row was being read"),
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        cache.fill(0, [(7, row(5, 3))]);
        assert_eq!(waiter.join().unwrap(), 5);
    }

    #[test]
    fn the_oldest_rows_leave_past_the_capacity() {
        let one = cost(&row(0, 100));
        let cache = RowCache::new(3 * one);
        for r in 0..5u64 {
            assert_eq!(kinds(&cache.claim(0, &[r])), "m");
            cache.fill(0, [(r, row(r as u8, 100))]);
            assert!(cache.bytes() <= 3 * one, "{} bytes after row {r}", cache.bytes());
        }
        assert_eq!(kinds(&cache.claim(0, &[0, 1, 2, 3, 4])), "mm234");
        // Rows evicted and read again are cached again; the oldest others leave.
        cache.fill(0, [(0, row(0, 100)), (1, row(1, 100))]);
        assert_eq!(kinds(&cache.claim(0, &[0, 1, 2, 3, 4])), "01mm4");
        assert!(cache.bytes() <= 3 * one);
    }

    #[test]
    fn without_capacity_every_request_reads_its_own_rows() {
        let cache = RowCache::new(0);
        assert_eq!(kinds(&cache.claim(0, &[1, 2])), "mm");
        cache.fill(0, [(1, row(1, 10))]);
        assert_eq!(kinds(&cache.claim(0, &[1, 2])), "mm");
        assert_eq!((cache.hits(), cache.bytes()), (0, 0));
    }
}
