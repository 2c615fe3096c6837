//! Count tables for `MPI_Alltoallv`-style exchanges, validated before any C call.
//!
//! MPI counts and displacements are C `int`s. Lengths are converted here, in one place,
//! with checked conversions (STYLE.md, from rsmpi); an exchange whose buffers do not fit
//! is split into rounds ([`Rounds`]) instead of failing or truncating.

use crate::error::{Error, Result};

/// Checks that `send_counts` describes a send buffer of `send_len` bytes for `world`
/// ranks: one count per rank, adding up to the buffer's length. Every transport checks
/// this before communicating.
pub fn check_send_table(send_len: usize, send_counts: &[usize], world: usize) -> Result<()> {
    let total: usize = send_counts.iter().sum();
    if send_counts.len() != world || total != send_len {
        return Err(Error::Transport(format!(
            "count table ({} entries, {total} bytes) does not describe the {send_len}-byte send buffer for {world} ranks",
            send_counts.len()
        )));
    }
    Ok(())
}

/// Counts and displacements of one side of an exchange, as C ints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountTable {
    pub counts: Vec<i32>,
    pub displs: Vec<i32>,
}

impl CountTable {
    /// Builds the table for segments of `counts` bytes laid out back to back in a buffer of
    /// `buffer_len` bytes, for a world of `world` ranks. Errors (not panics) when the table
    /// length differs from the world size, the segments overrun the buffer, or a count or
    /// displacement does not fit a C int.
    pub fn new(counts: &[usize], world: usize, buffer_len: usize) -> Result<CountTable> {
        if counts.len() != world {
            return Err(Error::Transport(format!("count table has {} entries for {world} ranks", counts.len())));
        }
        let mut displs = Vec::with_capacity(world);
        let mut c_counts = Vec::with_capacity(world);
        let mut at = 0usize;
        for (r, &c) in counts.iter().enumerate() {
            let end = at.checked_add(c).filter(|&e| e <= buffer_len).ok_or_else(|| {
                Error::Transport(format!(
                    "segment for rank {r} ({c} bytes at {at}) overruns the {buffer_len}-byte buffer"
                ))
            })?;
            let fit = |v: usize, what: &str| {
                i32::try_from(v).map_err(|_| Error::Transport(format!("{what} {v} for rank {r} does not fit a C int")))
            };
            c_counts.push(fit(c, "count")?);
            displs.push(fit(at, "displacement")?);
            at = end;
        }
        Ok(CountTable { counts: c_counts, displs })
    }
}

/// How a large exchange is split: in round `k`, every segment sends its bytes
/// `[k·chunk, (k+1)·chunk)`. With `chunk = max_round_bytes / world`, every round's buffers
/// stay under `max_round_bytes` on every rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rounds {
    pub chunk: usize,
    pub rounds: usize,
}

impl Rounds {
    /// Rounds this rank needs for its send and receive segments (1 when one direct
    /// exchange fits). Ranks must agree on the maximum before exchanging.
    pub fn local_need(send: &[usize], recv: &[usize], world: usize, max_round_bytes: usize) -> usize {
        let fits = |c: &[usize]| c.iter().sum::<usize>() <= max_round_bytes;
        if fits(send) && fits(recv) {
            return 1;
        }
        let chunk = Self::chunk(world, max_round_bytes);
        let largest = send.iter().chain(recv).copied().max().unwrap_or(0);
        largest.div_ceil(chunk).max(1)
    }

    /// Bytes per segment per round.
    pub fn chunk(world: usize, max_round_bytes: usize) -> usize {
        (max_round_bytes / world.max(1)).max(1)
    }

    /// The byte range of a segment of `len` bytes sent in round `k`.
    pub fn piece(&self, len: usize, k: usize) -> std::ops::Range<usize> {
        let start = (k * self.chunk).min(len);
        start..((k + 1) * self.chunk).min(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_validated() {
        let t = CountTable::new(&[3, 0, 5], 3, 8).unwrap();
        assert_eq!((t.counts, t.displs), (vec![3, 0, 5], vec![0, 3, 3]));
        assert!(CountTable::new(&[1, 2], 3, 3).unwrap_err().to_string().contains("2 entries for 3 ranks"));
        assert!(CountTable::new(&[4, 5], 2, 8).unwrap_err().to_string().contains("overruns"));
        let big = i32::MAX as usize + 1;
        assert!(CountTable::new(&[big], 1, big).unwrap_err().to_string().contains("does not fit a C int"));
        assert!(CountTable::new(&[1, big], 2, big + 1).unwrap_err().to_string().contains("for rank 1"));
    }

    #[test]
    fn send_tables_must_describe_the_buffer() {
        assert!(check_send_table(8, &[3, 5], 2).is_ok());
        assert!(check_send_table(8, &[3, 5], 3).unwrap_err().to_string().contains("2 entries, 8 bytes"));
        assert!(check_send_table(9, &[3, 5], 2).unwrap_err().to_string().contains("9-byte send buffer"));
    }

    #[test]
    fn rounds_cover_every_byte_once() {
        assert_eq!(Rounds::local_need(&[10, 10], &[5, 5], 2, 100), 1);
        let need = Rounds::local_need(&[70, 10], &[5, 5], 2, 40);
        assert_eq!(need, 4); // chunk 20, largest segment 70
        let r = Rounds { chunk: Rounds::chunk(2, 40), rounds: need };
        let pieces: Vec<_> = (0..r.rounds).map(|k| r.piece(70, k)).collect();
        assert_eq!(pieces, vec![0..20, 20..40, 40..60, 60..70]);
        assert_eq!(r.piece(10, 3), 10..10);
    }
}
