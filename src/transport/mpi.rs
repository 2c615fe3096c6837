//! The MPI transport, over rsmpi.
//!
//! Thin by design: counts are validated and converted in [`super::counts`], then handed
//! to `MPI_Alltoallv` (`MPI_Ialltoallv` for the overlapped exchange) / `MPI_Allgatherv` /
//! `MPI_Allreduce`. Exchanges whose buffers do
//! not fit C int counts are split into rounds. MPI errors are fatal (the default error
//! handler), which aborts the whole job rather than leaving ranks waiting.

use ::mpi::collective::SystemOperation;
use ::mpi::datatype::{Partition, PartitionMut};
use ::mpi::topology::SimpleCommunicator;
use ::mpi::traits::*;

use super::api::{ReduceOp, Transport};
use super::counts::{check_send_table, CountTable, Rounds};
use crate::error::{Error, Result};
use crate::types::Rank;

/// Collectives over an MPI communicator.
pub struct MpiTransport {
    comm: SimpleCommunicator,
    max_round_bytes: usize,
}

// SAFETY: an MPI communicator handle is a plain value that MPI lets any thread use; what
// MPI restricts is *concurrent* calls, by thread level. `MpiTransport` is not `Sync`, so
// one thread at a time uses each communicator, and a loader moves its duplicate to a
// producer thread (running while the caller uses other communicators) only when
// `concurrent()` reports MPI_THREAD_MULTIPLE.
unsafe impl Send for MpiTransport {}

impl MpiTransport {
    /// Wraps a communicator (usually `universe.world()`).
    pub fn new(comm: SimpleCommunicator) -> MpiTransport {
        MpiTransport { comm, max_round_bytes: i32::MAX as usize }
    }

    /// Caps the bytes one `MPI_Alltoallv` round moves per rank (default `i32::MAX`, the
    /// largest a C int count can describe). Small values force the chunked path; tests
    /// use that to exercise it.
    pub fn with_max_round_bytes(mut self, bytes: usize) -> MpiTransport {
        self.max_round_bytes = bytes.clamp(1, i32::MAX as usize);
        self
    }

    /// One `MPI_Alltoallv` (or, with `during`, one `MPI_Ialltoallv` that runs `during`
    /// while it is in flight) of buffers whose counts fit C ints.
    fn exchange_once(
        &self,
        send: &[u8],
        send_counts: &[usize],
        recv: &mut [u8],
        recv_counts: &[usize],
        during: Option<&mut dyn FnMut()>,
    ) -> Result<()> {
        let world = self.size();
        let (mut send_dummy, mut recv_dummy) = ([0u8; 1], [0u8; 1]);
        let send = non_dangling(send, &mut send_dummy);
        let recv = non_dangling_mut(recv, &mut recv_dummy);
        let s = CountTable::new(send_counts, world, send.len())?;
        let r = CountTable::new(recv_counts, world, recv.len())?;
        let partition = Partition::new(send, &s.counts[..], &s.displs[..]);
        let mut partition_mut = PartitionMut::new(recv, &r.counts[..], &r.displs[..]);
        match during {
            None => self.comm.all_to_all_varcount_into(&partition, &mut partition_mut),
            Some(during) => ::mpi::request::scope(|scope| {
                let request = self.comm.immediate_all_to_all_varcount_into(scope, &partition, &mut partition_mut);
                during();
                request.wait_without_status();
            }),
        }
        Ok(())
    }

    /// The all-to-all-v behind both trait methods: counts first (every rank learns what
    /// it receives), then one direct exchange, overlapped with `during` when given, or
    /// rounds of pieces when the buffers exceed the round cap (`during` then runs after).
    fn exchange(
        &self,
        send: &[u8],
        send_counts: &[usize],
        during: Option<&mut dyn FnMut()>,
    ) -> Result<(Vec<u8>, Vec<usize>)> {
        let world = self.size();
        check_send_table(send.len(), send_counts, world)?;
        let counts_out: Vec<u64> = send_counts.iter().map(|&c| c as u64).collect();
        let mut counts_in = vec![0u64; world];
        self.comm.all_to_all_into(&counts_out[..], &mut counts_in[..]);
        let recv_counts: Vec<usize> = counts_in
            .iter()
            .map(|&c| {
                usize::try_from(c).map_err(|_| Error::Transport(format!("received count {c} does not fit usize")))
            })
            .collect::<Result<_>>()?;
        let total: usize = recv_counts.iter().sum();
        let mut recv = crate::buffers::bytes(total);

        let mut rounds = [Rounds::local_need(send_counts, &recv_counts, world, self.max_round_bytes) as u64];
        self.all_reduce_u64(&mut rounds, ReduceOp::Max)?;
        if rounds[0] == 1 {
            self.exchange_once(send, send_counts, &mut recv, &recv_counts, during)?;
            return Ok((recv, recv_counts));
        }
        // Chunked path: stage each round's pieces contiguously (one extra copy, only for
        // exchanges too large for C int counts or the configured cap).
        let plan = Rounds { chunk: Rounds::chunk(world, self.max_round_bytes), rounds: rounds[0] as usize };
        let offsets = |counts: &[usize]| -> Vec<usize> {
            counts
                .iter()
                .scan(0, |at, &c| {
                    let o = *at;
                    *at += c;
                    Some(o)
                })
                .collect()
        };
        let (send_at, recv_at) = (offsets(send_counts), offsets(&recv_counts));
        for k in 0..plan.rounds {
            let mut stage = Vec::new();
            let mut piece_counts = Vec::with_capacity(world);
            for d in 0..world {
                let p = plan.piece(send_counts[d], k);
                piece_counts.push(p.len());
                stage.extend_from_slice(&send[send_at[d] + p.start..send_at[d] + p.end]);
            }
            let recv_pieces: Vec<_> = (0..world).map(|s| plan.piece(recv_counts[s], k)).collect();
            let recv_piece_counts: Vec<usize> = recv_pieces.iter().map(|p| p.len()).collect();
            let mut stage_in = vec![0u8; recv_piece_counts.iter().sum()];
            self.exchange_once(&stage, &piece_counts, &mut stage_in, &recv_piece_counts, None)?;
            let mut at = 0;
            for (s, p) in recv_pieces.iter().enumerate() {
                recv[recv_at[s] + p.start..recv_at[s] + p.end].copy_from_slice(&stage_in[at..at + p.len()]);
                at += p.len();
            }
        }
        if let Some(during) = during {
            during();
        }
        Ok((recv, recv_counts))
    }
}

/// An empty Rust slice points at address `align_of::<T>()`, which for bytes is 1 — the
/// value of OpenMPI's `MPI_IN_PLACE`. Passing it as a send buffer makes MPI treat the call
/// as in-place and fail (`MPI_ERR_ARG`). Empty buffers are therefore replaced by an empty
/// slice of a real (stack) allocation.
fn non_dangling<'a>(buf: &'a [u8], dummy: &'a mut [u8; 1]) -> &'a [u8] {
    if buf.is_empty() {
        &dummy[..0]
    } else {
        buf
    }
}

fn non_dangling_mut<'a>(buf: &'a mut [u8], dummy: &'a mut [u8; 1]) -> &'a mut [u8] {
    if buf.is_empty() {
        &mut dummy[..0]
    } else {
        buf
    }
}

impl Transport for MpiTransport {
    fn rank(&self) -> Rank {
        Rank(self.comm.rank() as usize)
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }

    fn all_to_all_v(&self, send: Vec<u8>, send_counts: &[usize]) -> Result<(Vec<u8>, Vec<usize>)> {
        let exchanged = self.exchange(&send, send_counts, None);
        crate::buffers::give_bytes(send);
        exchanged
    }

    fn all_to_all_v_overlapped(
        &self,
        send: Vec<u8>,
        send_counts: &[usize],
        during: &mut dyn FnMut(),
    ) -> Result<(Vec<u8>, Vec<usize>)> {
        let exchanged = self.exchange(&send, send_counts, Some(during));
        crate::buffers::give_bytes(send);
        exchanged
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let world = self.size();
        let mut lens = vec![0u64; world];
        self.comm.all_gather_into(&(mine.len() as u64), &mut lens[..]);
        let lens: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
        let mut all = vec![0u8; lens.iter().sum()];
        let table = CountTable::new(&lens, world, all.len())?;
        {
            let (mut mine_dummy, mut all_dummy) = ([0u8; 1], [0u8; 1]);
            let mine = non_dangling(mine, &mut mine_dummy);
            let all = non_dangling_mut(&mut all, &mut all_dummy);
            let mut partition = PartitionMut::new(all, &table.counts[..], &table.displs[..]);
            self.comm.all_gather_varcount_into(mine, &mut partition);
        }
        let mut out = Vec::with_capacity(world);
        let mut at = 0;
        for l in lens {
            out.push(all[at..at + l].to_vec());
            at += l;
        }
        Ok(out)
    }

    fn all_reduce_u64(&self, values: &mut [u64], op: ReduceOp) -> Result<()> {
        let input = values.to_vec();
        match op {
            ReduceOp::Sum => self.comm.all_reduce_into(&input[..], values, SystemOperation::sum()),
            ReduceOp::Max => self.comm.all_reduce_into(&input[..], values, SystemOperation::max()),
            ReduceOp::Min => self.comm.all_reduce_into(&input[..], values, SystemOperation::min()),
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.comm.barrier();
        Ok(())
    }

    fn split(&self, color: usize) -> Result<Box<dyn Transport>> {
        let c = i32::try_from(color).map_err(|_| Error::Transport(format!("color {color} does not fit a C int")))?;
        let comm = self
            .comm
            .split_by_color(::mpi::topology::Color::with_value(c))
            .ok_or_else(|| Error::Transport("MPI_Comm_split returned no communicator".into()))?;
        Ok(Box::new(MpiTransport { comm, max_round_bytes: self.max_round_bytes }))
    }

    fn dup(&self) -> Result<Box<dyn Transport>> {
        Ok(Box::new(MpiTransport { comm: self.comm.duplicate(), max_round_bytes: self.max_round_bytes }))
    }

    fn concurrent(&self) -> bool {
        ::mpi::environment::threading_support() == ::mpi::Threading::Multiple
    }
}
