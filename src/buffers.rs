//! Recycled buffers for the hot path: send and receive buffers of the exchange and the
//! value buffers of delivered batches.
//!
//! A fresh allocation of a window's buffer costs as much as a copy of it: the allocator
//! either maps new pages (a page fault and a kernel zeroing per 4 KiB) or hands back heap
//! memory that `calloc` zeroes again. Buffers that come back here after use are handed out
//! again with their old contents: every caller overwrites the bytes it asks for, so nothing
//! is zeroed twice (only the part that grows past an old buffer's length is).
//!
//! The pool is process-wide (a batch's buffers come back when the user drops the batch,
//! on whatever thread) and small: at most [`MAX_POOLED`] buffers of each kind, and none
//! larger than [`MAX_BUFFER_BYTES`], so it holds no more than the pipeline held at its peak
//! a moment before.

use std::sync::Mutex;

/// Buffers of each kind the pool keeps.
pub const MAX_POOLED: usize = 8;

/// Larger buffers are freed, not kept.
pub const MAX_BUFFER_BYTES: usize = 1 << 30;

static BYTES: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
static WORDS: Mutex<Vec<Vec<u64>>> = Mutex::new(Vec::new());

/// Takes the pooled buffer that best fits `len` elements (the smallest with the capacity,
/// else the largest), or none.
fn take<T>(pool: &Mutex<Vec<Vec<T>>>, len: usize) -> Option<Vec<T>> {
    let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
    let fits = pool.iter().enumerate().filter(|(_, b)| b.capacity() >= len).min_by_key(|(_, b)| b.capacity());
    let at = match fits {
        Some((i, _)) => i,
        None => pool.iter().enumerate().max_by_key(|(_, b)| b.capacity())?.0,
    };
    Some(pool.swap_remove(at))
}

fn give<T>(pool: &Mutex<Vec<Vec<T>>>, buf: Vec<T>) {
    if buf.capacity() == 0 || buf.capacity() * std::mem::size_of::<T>() > MAX_BUFFER_BYTES {
        return;
    }
    let mut pool = pool.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < MAX_POOLED {
        pool.push(buf);
    } else if let Some((i, _)) = pool.iter().enumerate().min_by_key(|(_, b)| b.capacity()) {
        // Keep the larger buffers: they are the ones a window needs again.
        if pool[i].capacity() < buf.capacity() {
            pool[i] = buf;
        }
    }
}

/// Sets `buf`'s length to `len`, zeroing only what grows past its old length.
fn fit<T: Copy + Default>(mut buf: Vec<T>, len: usize) -> Vec<T> {
    if buf.len() >= len {
        buf.truncate(len);
    } else {
        buf.resize(len, T::default());
    }
    buf
}

/// `len` bytes of unspecified (initialised) contents, for a caller that overwrites them all.
pub fn bytes(len: usize) -> Vec<u8> {
    match take(&BYTES, len) {
        Some(buf) => fit(buf, len),
        None => vec![0; len],
    }
}

/// An empty byte buffer with room for `capacity` bytes, for a caller that appends.
pub fn bytes_with_capacity(capacity: usize) -> Vec<u8> {
    match take(&BYTES, capacity) {
        Some(mut buf) => {
            buf.clear();
            buf.reserve(capacity);
            buf
        }
        None => Vec::with_capacity(capacity),
    }
}

/// Gives a byte buffer back for reuse.
pub fn give_bytes(buf: Vec<u8>) {
    give(&BYTES, buf);
}

/// `len` 8-byte words of unspecified (initialised) contents.
pub fn words(len: usize) -> Vec<u64> {
    match take(&WORDS, len) {
        Some(buf) => fit(buf, len),
        None => vec![0; len],
    }
}

/// Gives a word buffer back for reuse.
pub fn give_words(buf: Vec<u64>) {
    give(&WORDS, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_with_the_length_asked_and_their_memory() {
        // Other tests share the pool: only check what this one controls.
        let mut a = bytes(1000);
        assert_eq!(a.len(), 1000);
        a.fill(7);
        let ptr = a.as_ptr();
        give_bytes(a);
        // Some pooled buffer of at least 1000 bytes comes back; if it is ours, it kept its
        // memory and its bytes (nothing was zeroed).
        let b = bytes(600);
        assert_eq!(b.len(), 600);
        if b.as_ptr() == ptr {
            assert!(b.iter().all(|&x| x == 7));
        }
        let c = bytes_with_capacity(5000);
        assert!(c.is_empty() && c.capacity() >= 5000);
        let w = words(33);
        assert_eq!(w.len(), 33);
        give_words(w);
        give_bytes(b);
        give_bytes(c);
    }

    #[test]
    fn the_pool_is_bounded() {
        for _ in 0..3 * MAX_POOLED {
            give_bytes(vec![1; 64]);
        }
        assert!(BYTES.lock().unwrap().len() <= MAX_POOLED);
    }
}
