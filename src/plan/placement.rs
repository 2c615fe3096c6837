//! Placement: which rows of a global batch each rank receives, and which part of each
//! field.
//!
//! A placement is a list of [`RowBlock`]s: contiguous row ranges of the global batch,
//! each with the ranks that receive those rows and, per rank, the [`FieldPart`]s it
//! receives. Data parallelism is one block per rank, every field whole. Device meshes
//! (replication, tensor-dimension splits, pipeline stages) are further placements of the
//! same shape: several receivers per block, partial fields, or none.

use std::ops::Range;

use super::sharding::FieldSharding;
use super::Mesh;
use crate::dataset::{Field, FieldKind};
use crate::error::{Error, Result};
use crate::types::Rank;

/// The part of one field a receiver gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPart {
    /// Index of the field in the dataset's field order.
    pub field: usize,
    /// For a tensor field split along non-batch dimensions: the range of each field
    /// dimension this receiver holds. `None`: the whole value.
    pub slice: Option<Vec<Range<usize>>>,
}

impl FieldPart {
    /// The whole value of a field.
    pub fn whole(field: usize) -> FieldPart {
        FieldPart { field, slice: None }
    }

    /// Shape of this part of one value (the field's shape, or the slice's extents).
    pub fn shape(&self, field: &Field) -> Vec<usize> {
        match (&self.slice, &field.kind) {
            (Some(s), _) => s.iter().map(|r| r.len()).collect(),
            (None, FieldKind::Tensor { shape, .. }) => shape.clone(),
            (None, FieldKind::Bytes { .. }) => vec![],
        }
    }

    /// Bytes of this part of one value; `None` for variable-length fields.
    pub fn bytes(&self, field: &Field) -> Option<usize> {
        match &field.kind {
            FieldKind::Tensor { dtype, .. } => Some(dtype.size() * self.shape(field).iter().product::<usize>()),
            FieldKind::Bytes { .. } => None,
        }
    }

    /// Appends this part of `value` (one value of `field`, C order) to `out`: the whole
    /// value, or the hyperslab of the slice, copied in contiguous innermost runs.
    pub fn copy(&self, field: &Field, value: &[u8], out: &mut Vec<u8>) {
        let (Some(slice), FieldKind::Tensor { dtype, shape }) = (&self.slice, &field.kind) else {
            out.extend_from_slice(value);
            return;
        };
        // Byte strides of each dimension, and the innermost contiguous run.
        let mut strides = vec![dtype.size(); shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        let Some(last) = slice.len().checked_sub(1) else {
            out.extend_from_slice(value);
            return;
        };
        let run = slice[last].len() * dtype.size();
        let mut index: Vec<usize> = slice.iter().map(|r| r.start).collect();
        loop {
            let at: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
            out.extend_from_slice(&value[at..at + run]);
            // Advance the outer dimensions like an odometer.
            let mut d = last;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                index[d] += 1;
                if index[d] < slice[d].end {
                    break;
                }
                index[d] = slice[d].start;
            }
        }
    }
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
                receivers: vec![Receiver { rank: Rank(r), parts: (0..fields).map(FieldPart::whole).collect() }],
            })
            .collect();
        Placement::from_blocks(batch_size, world, blocks)
    }

    /// The placement of a device mesh: each rank receives the rows of its block of the
    /// batch dimension and, of every field its pipeline stage receives, the slice its
    /// coordinate selects. Ranks with equal batch blocks share a [`RowBlock`].
    pub fn from_mesh(
        batch_size: usize,
        mesh: &Mesh,
        fields: &[Field],
        sharding: &[FieldSharding],
    ) -> Result<Placement> {
        let world = mesh.devices();
        let batch_axes = &sharding[0].dims[0];
        let (_, blocks_n) = mesh.block(&vec![0; mesh.names().len()], batch_axes);
        // Block b holds rows [b·B/n, (b+1)·B/n): equal blocks when n divides B (checked
        // for the batch size by the sharding), as even as possible otherwise (a partial
        // last batch).
        let stages = mesh.pipeline_axis().map_or(1, |a| mesh.sizes()[a]);
        let mut blocks: Vec<RowBlock> = (0..blocks_n)
            .map(|b| RowBlock { rows: b * batch_size / blocks_n..(b + 1) * batch_size / blocks_n, receivers: vec![] })
            .collect();
        for r in 0..world {
            let c = mesh.coords(Rank(r));
            let stage = mesh.pipeline_axis().map_or(0, |a| c[a]);
            let parts = fields
                .iter()
                .zip(sharding)
                .enumerate()
                .filter(|(_, (_, s))| s.stage.includes(stage, stages))
                .map(|(i, (f, s))| {
                    let slice = match &f.kind {
                        FieldKind::Tensor { shape, .. } if s.dims[1..].iter().any(|a| !a.is_empty()) => Some(
                            shape
                                .iter()
                                .zip(&s.dims[1..])
                                .map(|(&n, axes)| {
                                    let (k, of) = mesh.block(&c, axes);
                                    k * n / of..(k + 1) * n / of
                                })
                                .collect(),
                        ),
                        _ => None,
                    };
                    FieldPart { field: i, slice }
                })
                .collect();
            blocks[mesh.block(&c, batch_axes).0].receivers.push(Receiver { rank: Rank(r), parts });
        }
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
    fn slices_copy_hyperslabs_in_c_order() {
        use crate::dataset::DType;
        let f = Field::tensor("x", DType::U8, vec![3, 4]);
        let value: Vec<u8> = (0..12).collect();
        let part = FieldPart { field: 0, slice: Some(vec![1..3, 2..4]) };
        let mut out = Vec::new();
        part.copy(&f, &value, &mut out);
        assert_eq!(out, vec![6, 7, 10, 11]);
        assert_eq!((part.shape(&f), part.bytes(&f)), (vec![2, 2], Some(4)));
        let f16 = Field::tensor("h", DType::U16, vec![2, 2, 2]);
        let value: Vec<u8> = (0..16).collect();
        let mut out = Vec::new();
        FieldPart { field: 0, slice: Some(vec![0..2, 1..2, 0..2]) }.copy(&f16, &value, &mut out);
        assert_eq!(out, vec![4, 5, 6, 7, 12, 13, 14, 15]);
    }

    #[test]
    fn mesh_placements() {
        use crate::dataset::DType;
        use crate::plan::sharding::resolve;
        let fields = vec![Field::tensor("x", DType::F32, vec![8]), Field::tensor("y", DType::I64, vec![])];
        use crate::plan::mesh::tests::mesh;
        use crate::plan::sharding::Stage;
        use std::collections::BTreeMap;
        let pairs =
            |p: &[(&str, &str)]| p.iter().map(|(a, b)| (a.to_string(), b.parse().unwrap())).collect::<BTreeMap<_, _>>();
        let stages = |p: &[(&str, Stage)]| p.iter().map(|(a, b)| (a.to_string(), *b)).collect::<BTreeMap<_, _>>();
        let none = BTreeMap::new();
        // dp=2,tp=2: x's feature dim split over tp, y replicated over tp.
        let m = mesh("dp=2,tp=2");
        let s = resolve(&m, &fields, 8, &pairs(&[("x", "dp,tp")]), &stages(&[])).unwrap();
        let p = Placement::from_mesh(8, &m, &fields, &s).unwrap();
        assert_eq!(p.blocks().len(), 2);
        let (b, rc) = p.receiver(Rank(3)).unwrap(); // dp 1, tp 1
        assert_eq!(b.rows, 4..8);
        assert_eq!(rc.parts[0].slice, Some(vec![4..8]));
        assert_eq!(rc.parts[1].slice, None);
        assert_eq!(p.block_of_row(1).receivers.iter().map(|r| r.rank.0).collect::<Vec<_>>(), vec![0, 1]);
        // tp=4: batch not split over tp when the spec says so; every rank gets all rows.
        let m = mesh("tp=4");
        let s = resolve(&m, &fields, 8, &pairs(&[("x", "-,tp"), ("y", "-")]), &stages(&[])).unwrap();
        let p = Placement::from_mesh(8, &m, &fields, &s).unwrap();
        assert_eq!(p.receiver(Rank(2)).unwrap().0.rows, 0..8);
        assert_eq!(p.receiver(Rank(2)).unwrap().1.parts[0].slice, Some(vec![4..6]));
        // dp=2,pp=2 with stages: x on the first stage, y on the last.
        let m = mesh("dp=2,pp=2");
        let s = resolve(&m, &fields, 8, &none, &stages(&[("x", Stage::First), ("y", Stage::Last)])).unwrap();
        let p = Placement::from_mesh(8, &m, &fields, &s).unwrap();
        assert_eq!(p.receiver(Rank(2)).unwrap().1.parts, vec![FieldPart::whole(0)]); // dp 1, pp 0
        assert_eq!(p.receiver(Rank(3)).unwrap().1.parts, vec![FieldPart::whole(1)]); // dp 1, pp 1
                                                                                     // dp=2,tp=2,pp=4: middle stages receive nothing.
        let m = mesh("dp=2,tp=2,pp=4");
        let s = resolve(&m, &fields, 8, &none, &stages(&[("x", Stage::First), ("y", Stage::Last)])).unwrap();
        let p = Placement::from_mesh(8, &m, &fields, &s).unwrap();
        assert!(p.receiver(Rank(1)).is_none() && p.receiver(Rank(2)).is_none());
        assert!(p.receiver(Rank(0)).is_some() && p.receiver(Rank(3)).is_some());
    }

    #[test]
    fn blocks_must_tile_the_batch() {
        let rc = |r| Receiver { rank: Rank(r), parts: vec![FieldPart::whole(0)] };
        let gap =
            vec![RowBlock { rows: 0..2, receivers: vec![rc(0)] }, RowBlock { rows: 3..4, receivers: vec![rc(1)] }];
        assert!(Placement::from_blocks(4, 2, gap).unwrap_err().to_string().contains("row 2"));
        let twice =
            vec![RowBlock { rows: 0..2, receivers: vec![rc(0)] }, RowBlock { rows: 2..4, receivers: vec![rc(0)] }];
        assert!(Placement::from_blocks(4, 2, twice).unwrap_err().to_string().contains("two row blocks"));
    }
}
