//! Positional reads with many in flight: a window's reads, sorted by file and offset, run
//! on up to `depth` threads at once, each value read straight into its place (RINAS's
//! point: the samples of a window can be fetched in any order). On storage that serves
//! many requests at once (cloud volumes, parallel filesystems, NVMe) this is the
//! difference between its IOPS and one read at a time; on a warm page cache it costs a
//! few thread starts per window.

use std::fs::File;
use std::io::IoSliceMut;
use std::sync::Mutex;

use crate::dataset::positional::read_vectored_exact_at;

/// One read: bytes from `offset` of `file` into `bufs`, one after another.
pub(crate) struct ReadOp<'a> {
    /// Which file (an index the caller gives meaning to, for errors).
    pub source: usize,
    pub file: &'a File,
    pub offset: u64,
    pub bufs: Vec<IoSliceMut<'a>>,
}

impl ReadOp<'_> {
    fn len(&self) -> u64 {
        self.bufs.iter().map(|b| b.len() as u64).sum()
    }
}

/// A failed read: which source, where, and why.
#[derive(Debug)]
pub(crate) struct ReadFailure {
    pub source: usize,
    pub offset: u64,
    pub len: usize,
    pub error: std::io::Error,
}

/// Sorts reads by source and offset and merges those that follow each other in a file into
/// one `preadv`.
pub(crate) fn merge(mut ops: Vec<ReadOp<'_>>) -> Vec<ReadOp<'_>> {
    ops.sort_unstable_by_key(|o| (o.source, o.offset));
    let mut merged: Vec<ReadOp<'_>> = Vec::with_capacity(ops.len());
    // Where the last merged read ends.
    let mut end = 0;
    for op in ops {
        let next_end = op.offset + op.len();
        match merged.last_mut() {
            Some(m) if m.source == op.source && end == op.offset && m.bufs.len() < 1024 => m.bufs.extend(op.bufs),
            _ => merged.push(op),
        }
        end = next_end;
    }
    merged
}

/// Runs `ops` with up to `depth` in flight; returns the bytes read, or the first failure.
pub(crate) fn run(ops: Vec<ReadOp<'_>>, depth: usize) -> Result<u64, ReadFailure> {
    let total: u64 = ops.iter().map(ReadOp::len).sum();
    let read = |mut op: ReadOp<'_>| {
        let len = op.len() as usize;
        read_vectored_exact_at(op.file, op.offset, &mut op.bufs).map_err(|error| ReadFailure {
            source: op.source,
            offset: op.offset,
            len,
            error,
        })
    };
    let threads = depth.min(ops.len());
    if threads <= 1 {
        ops.into_iter().try_for_each(read)?;
        return Ok(total);
    }
    let queue = Mutex::new(ops.into_iter());
    let failed: Mutex<Option<ReadFailure>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some(op) = next else { break };
                if let Err(f) = read(op) {
                    failed.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(f);
                    break;
                }
            });
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(f) => Err(f),
        None => Ok(total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_land_in_place_whatever_the_depth() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        f.write_all(&data).unwrap();
        for depth in [1, 4, 64] {
            let mut out = vec![0u8; 1000];
            let mut ops = Vec::new();
            // 100 reads of 10 bytes from scattered offsets, in reverse order; pairs of
            // adjacent ones merge.
            let mut rest = &mut out[..];
            for i in 0..100u64 {
                let (dst, r) = rest.split_at_mut(10);
                rest = r;
                let offset = (99 - i / 2 * 2) * 40 + (i % 2) * 10;
                ops.push(ReadOp { source: 0, file: &f, offset, bufs: vec![IoSliceMut::new(dst)] });
            }
            let ops = merge(ops);
            assert_eq!(ops.len(), 50);
            assert_eq!(run(ops, depth).unwrap(), 1000);
            for i in 0..100usize {
                let offset = (99 - i / 2 * 2) * 40 + (i % 2) * 10;
                assert_eq!(out[i * 10..i * 10 + 10], data[offset..offset + 10], "depth {depth} read {i}");
            }
        }
        // A read past the end is the failure of its source.
        let mut b = [0u8; 8];
        let op = ReadOp { source: 3, file: &f, offset: 4090, bufs: vec![IoSliceMut::new(&mut b)] };
        let failure = run(vec![op], 4).unwrap_err();
        assert_eq!((failure.source, failure.offset, failure.len), (3, 4090, 8));
        assert_eq!(failure.error.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
