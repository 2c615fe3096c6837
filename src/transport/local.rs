//! A transport for a single process: every collective is the identity.

use super::api::{ReduceOp, Transport};
use crate::error::Result;
use crate::types::Rank;

/// World of one rank, no communication.
#[derive(Clone, Debug, Default)]
pub struct LocalTransport;

impl LocalTransport {
    /// A world of one.
    pub fn new() -> LocalTransport {
        LocalTransport
    }
}

impl Transport for LocalTransport {
    fn rank(&self) -> Rank {
        Rank(0)
    }

    fn size(&self) -> usize {
        1
    }

    fn all_to_all_v(&self, send: Vec<u8>, send_counts: &[usize]) -> Result<(Vec<u8>, Vec<usize>)> {
        super::counts::check_send_table(send.len(), send_counts, 1)?;
        Ok((send, send_counts.to_vec()))
    }

    fn all_gather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(vec![mine.to_vec()])
    }

    fn all_reduce_u64(&self, _values: &mut [u64], _op: ReduceOp) -> Result<()> {
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        Ok(())
    }

    fn split(&self, _color: usize) -> Result<Box<dyn Transport>> {
        Ok(Box::new(LocalTransport))
    }

    fn dup(&self) -> Result<Box<dyn Transport>> {
        Ok(Box::new(LocalTransport))
    }
}
