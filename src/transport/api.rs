//! The interface every transport implements: [`Transport`], byte-level collectives over a
//! fixed group of ranks, and the reductions it offers ([`ReduceOp`]).

use crate::error::Result;
use crate::types::Rank;

/// Reduction applied by [`Transport::all_reduce_u64`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// Byte-level collectives over a fixed group of ranks.
///
/// A transport is `Send` (a loader moves its own communicator to its producer thread) but
/// not shared: one thread at a time uses it.
pub trait Transport: Send {
    /// This process's rank.
    fn rank(&self) -> Rank;

    /// Number of ranks.
    fn size(&self) -> usize;

    /// All-to-all with variable counts. `send` is the concatenation of one segment per
    /// destination rank, `send_counts[d]` bytes for rank `d`. Returns the concatenation of
    /// the segments received from every source rank and their lengths.
    ///
    /// The send buffer is given, not lent: a transport may keep it until every peer has
    /// read it, even past a failure (see the UCX transport's cancellation rule).
    fn all_to_all_v(&self, send: Vec<u8>, send_counts: &[usize]) -> Result<(Vec<u8>, Vec<usize>)>;

    /// The non-blocking all-to-all-v: starts the exchange of `send`, runs `during` while
    /// it is in flight, then waits for it. `during` may run collectives of its own on this
    /// transport; every rank orders them after this exchange. The default is the blocking
    /// exchange followed by `during` (no overlap); MPI (`MPI_Ialltoallv`) and UCX overlap.
    /// On an error `during` may not have run.
    fn all_to_all_v_overlapped(
        &self,
        send: Vec<u8>,
        send_counts: &[usize],
        during: &mut dyn FnMut(),
    ) -> Result<(Vec<u8>, Vec<usize>)> {
        let exchanged = self.all_to_all_v(send, send_counts)?;
        during();
        Ok(exchanged)
    }

    /// Every rank contributes `mine`; every rank gets all contributions in rank order.
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;

    /// Element-wise reduction of `values` across ranks, in place.
    fn all_reduce_u64(&self, values: &mut [u64], op: ReduceOp) -> Result<()>;

    /// Waits until every rank has arrived.
    fn barrier(&self) -> Result<()>;

    /// Splits the ranks into groups of equal `color` (ranks keep their relative order) and
    /// returns this rank's group. Collective.
    fn split(&self, color: usize) -> Result<Box<dyn Transport>>;

    /// A new communicator over the same ranks (`MPI_Comm_dup`), whose collectives never
    /// match this one's: a loader runs on its own duplicate so that its collectives cannot
    /// interleave with the caller's. Collective.
    fn dup(&self) -> Result<Box<dyn Transport>>;

    /// Whether a duplicate may run collectives on another thread while the caller keeps
    /// using this transport (MPI: only at thread level `MPI_THREAD_MULTIPLE`).
    fn concurrent(&self) -> bool {
        true
    }
}
