//! Placement: which rows of a global batch each rank receives, and which part of each
//! field.
//!
//! A placement is a list of [`RowBlock`]s: contiguous row ranges of the global batch,
//! each with the ranks that receive those rows and, per rank, the [`FieldPart`]s it
//! receives. Data parallelism is one block per rank, every field whole. Device meshes
//! (replication, tensor-dimension splits, pipeline stages) are further placements of the
//! same shape: several receivers per block, partial fields, or none.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::types::Rank;

/// The part of one field a receiver gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPart {
    /// Index of the field in the dataset's field order.
    pub field: usize,
}

/// A rank that receives the rows of a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receiver {
    pub rank: Rank,
    /// Parts it receives, in field order; empty when it needs nothing.
    pub parts: Vec<FieldPart>,
}

/// Contiguous rows of every global batch and the ranks that receive them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowBlock {
    pub rows: Range<usize>,
    pub receivers: Vec<Receiver>,
}

/// Who receives what of each global batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    batch_size: usize,
    world: usize,
    blocks: Vec<RowBlock>,
    /// The block each rank receives from (every rank receives from at most one block).
    block_of: Vec<Option<usize>>,
    /// For each row of the batch, its block.
    row_block: Vec<u32>,
}

impl Placement {
    /// Data parallelism: rank `r` of `P` receives rows `[r·B/P, (r+1)·B/P)`, every field.
    pub fn data_parallel(batch_size: usize, world: usize, fields: usize) -> Result<Placement> {
        if world == 0 || batch_size % world != 0 {
            return Err(Error::Config(format!(
                "batch size {batch_size} is not divisible by the number of ranks {world}"
            )));
        }
        let per = batch_size / world;
        let blocks = (0..world)
            .map(|r| RowBlock {
                rows: r * per..(r + 1) * per,
                receivers: vec![Receiver {
                    rank: Rank(r),
                    parts: (0..fields).map(|field| FieldPart { field }).collect(),
                }],
            })
            .collect();
        Placement::from_blocks(batch_size, world, blocks)
    }

    /// Builds a placement from blocks, checking that they tile the batch and that each
    /// rank appears at most once.
    pub fn from_blocks(batch_size: usize, world: usize, blocks: Vec<RowBlock>) -> Result<Placement> {
        let mut block_of = vec![None; world];
        let mut row_block = vec![u32::MAX; batch_size];
        for (b, block) in blocks.iter().enumerate() {
            if block.rows.end > batch_size {
                return Err(Error::Config(format!("row block {:?} exceeds the batch size {batch_size}", block.rows)));
            }
            for row in block.rows.clone() {
                if row_block[row] != u32::MAX {
                    return Err(Error::Config(format!("row {row} is in two row blocks")));
                }
                row_block[row] = b as u32;
            }
            for rc in &block.receivers {
                let slot = block_of
                    .get_mut(rc.rank.0)
                    .ok_or_else(|| Error::Config(format!("rank {} is outside the world", rc.rank)))?;
                if slot.replace(b).is_some() {
                    return Err(Error::Config(format!("rank {} receives two row blocks", rc.rank)));
                }
            }
        }
        if let Some(row) = row_block.iter().position(|&b| b == u32::MAX) {
            return Err(Error::Config(format!("row {row} of the batch is in no row block")));
        }
        Ok(Placement { batch_size, world, blocks, block_of, row_block })
    }

    /// Global batch size.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The blocks.
    pub fn blocks(&self) -> &[RowBlock] {
        &self.blocks
    }

    /// The block holding row `row` of a batch.
    pub fn block_of_row(&self, row: usize) -> &RowBlock {
        &self.blocks[self.row_block[row] as usize]
    }

    /// What rank `r` receives: its rows and parts, or `None` when it receives nothing.
    pub fn receiver(&self, r: Rank) -> Option<(&RowBlock, &Receiver)> {
        let block = &self.blocks[self.block_of[r.0]?];
        let rc = block.receivers.iter().find(|rc| rc.rank == r).expect("block_of is consistent");
        (!rc.parts.is_empty()).then_some((block, rc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_parallel_splits_rows_evenly() {
        let p = Placement::data_parallel(12, 3, 2).unwrap();
        let (b, rc) = p.receiver(Rank(1)).unwrap();
        assert_eq!(b.rows, 4..8);
        assert_eq!(rc.parts.len(), 2);
        assert_eq!(p.block_of_row(11).receivers[0].rank, Rank(2));
        let err = Placement::data_parallel(10, 3, 1).unwrap_err().to_string();
        assert!(err.contains("not divisible") && err.contains("10") && err.contains('3'), "{err}");
    }

    #[test]
    fn blocks_must_tile_the_batch() {
        let rc = |r| Receiver { rank: Rank(r), parts: vec![FieldPart { field: 0 }] };
        let gap =
            vec![RowBlock { rows: 0..2, receivers: vec![rc(0)] }, RowBlock { rows: 3..4, receivers: vec![rc(1)] }];
        assert!(Placement::from_blocks(4, 2, gap).unwrap_err().to_string().contains("row 2"));
        let twice =
            vec![RowBlock { rows: 0..2, receivers: vec![rc(0)] }, RowBlock { rows: 2..4, receivers: vec![rc(0)] }];
        assert!(Placement::from_blocks(4, 2, twice).unwrap_err().to_string().contains("two row blocks"));
    }
}
