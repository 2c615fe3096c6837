//! Placement: which rows of a global batch each rank receives, and which part of each
//! field.
//!
//! A placement is a list of [`RowBlock`]s: contiguous row ranges of the global batch,
//! each with the ranks that receive those rows and, per rank, the [`FieldPart`]s it
//! receives. Data parallelism is one block per rank, every field whole. Device meshes
//! (replication, tensor-dimension splits, pipeline stages) are further placements of the
//! same shape: several receivers per block, partial fields, or none.

use std::ops::Range;

use super::mesh::Mesh;
use super::sharding::FieldSharding;
use crate::dataset::{Field, FieldKind};
use crate::error::{Error, Result};
use crate::types::Rank;

/// The part of one field a receiver gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPart {
    /// Index of the field in the dataset's field order.
    pub field: usize,
    /// For a tensor field split along non-batch dimensions: the ranges of each field
    /// dimension this receiver holds, ascending and disjoint (one range for a block split,
    /// two for the zigzag split), their elements held in that order. `None`: the whole
    /// value.
    pub slice: Option<Vec<Vec<Range<usize>>>>,
}

impl FieldPart {
    /// The whole value of a field.
    pub fn whole(field: usize) -> FieldPart {
        FieldPart { field, slice: None }
    }

    /// Shape of this part of one value (the field's shape, or the slice's extents).
    pub fn shape(&self, field: &Field) -> Vec<usize> {
        match (&self.slice, &field.kind) {
            (Some(s), _) => s.iter().map(|rs| rs.iter().map(Range::len).sum()).collect(),
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
        if slice.is_empty() {
            out.extend_from_slice(value);
            return;
        }
        if slice.iter().any(|rs| rs.iter().all(|r| r.is_empty())) {
            return;
        }
        // Byte strides of each dimension.
        let mut strides = vec![dtype.size(); shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        // Trailing dimensions held whole are contiguous with the one before them: its
        // ranges are the runs (a split of the first dimension of `[S, H]` copies one run).
        let mut last = slice.len() - 1;
        while last > 0 && slice[last].len() == 1 && slice[last][0] == (0..shape[last]) {
            last -= 1;
        }
        // One range per dimension (a block split, the common case): one run per index of
        // the outer dimensions, visited like an odometer.
        if slice[..=last].iter().all(|rs| rs.len() == 1) {
            let run = slice[last][0].start * strides[last]..slice[last][0].end * strides[last];
            let mut index: Vec<usize> = slice[..last].iter().map(|rs| rs[0].start).collect();
            loop {
                let at: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
                out.extend_from_slice(&value[at + run.start..at + run.end]);
                let mut d = last;
                loop {
                    if d == 0 {
                        return;
                    }
                    d -= 1;
                    index[d] += 1;
                    if index[d] < slice[d][0].end {
                        break;
                    }
                    index[d] = slice[d][0].start;
                }
            }
        }
        // Several ranges in some dimension (the zigzag split): per dimension, which of its
        // ranges and the index in it; the ranges of dimension `last` are contiguous runs.
        let first = |d: usize| slice[d].iter().position(|r| !r.is_empty()).expect("a non-empty range");
        let mut index: Vec<(usize, usize)> = (0..last).map(|d| (first(d), slice[d][first(d)].start)).collect();
        loop {
            let at: usize = index.iter().zip(&strides).map(|(&(_, i), s)| i * s).sum();
            for r in &slice[last] {
                out.extend_from_slice(&value[at + r.start * strides[last]..at + r.end * strides[last]]);
            }
            let mut d = last;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                let (mut k, mut i) = index[d];
                i += 1;
                while i >= slice[d][k].end {
                    k += 1;
                    if k == slice[d].len() {
                        break;
                    }
                    i = slice[d][k].start;
                }
                if k < slice[d].len() {
                    index[d] = (k, i);
                    break;
                }
                index[d] = (first(d), slice[d][first(d)].start);
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
                                .zip(s.dims[1..].iter().zip(&s.zigzag[1..]))
                                .map(|(&n, (axes, &zigzag))| {
                                    let (k, of) = mesh.block(&c, axes);
                                    if zigzag {
                                        zigzag_chunks(n, k, of)
                                    } else {
                                        vec![k * n / of..(k + 1) * n / of]
                                    }
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

    /// The placement of processes that each drive `k` devices of this (device) placement:
    /// process `p` drives devices `p·k .. (p+1)·k` and receives the union of their shards,
    /// the layout `jax.make_array_from_process_local_data` expects: the rows of its
    /// devices' row blocks, in batch order, and of each field any of its devices needs,
    /// per dimension, the union of their ranges. Each union must be one contiguous range,
    /// and two processes' rows must be equal or disjoint; anything else is an error naming
    /// the process and what it would hold.
    pub fn for_processes(&self, k: usize, fields: &[Field]) -> Result<Placement> {
        if k == 1 {
            return Ok(self.clone());
        }
        if k == 0 || self.world % k != 0 {
            return Err(Error::Config(format!(
                "devices_per_process {k} does not divide the mesh's {} devices",
                self.world
            )));
        }
        let contiguous = |p: usize, what: &str| {
            Error::Config(format!(
                "process {p} (devices {}..{}) would hold {what} that is not one contiguous range; number the \
                 mesh so that a process's devices are adjacent on the axes it is split over (mesh_order)",
                p * k,
                (p + 1) * k
            ))
        };
        let mut blocks: Vec<RowBlock> = Vec::new();
        let mut idle = Vec::new();
        for p in 0..self.world / k {
            let held: Vec<(&RowBlock, &Receiver)> =
                (p * k..(p + 1) * k).filter_map(|d| self.receiver(Rank(d))).collect();
            if held.is_empty() {
                idle.push(Receiver { rank: Rank(p), parts: vec![] });
                continue;
            }
            let rows =
                union(held.iter().map(|(b, _)| b.rows.clone())).ok_or_else(|| contiguous(p, "rows of the batch"))?;
            let mut wanted: Vec<usize> = held.iter().flat_map(|(_, rc)| rc.parts.iter().map(|q| q.field)).collect();
            wanted.sort_unstable();
            wanted.dedup();
            let mut parts = Vec::with_capacity(wanted.len());
            for field in wanted {
                let of_field: Vec<&FieldPart> =
                    held.iter().flat_map(|(_, rc)| rc.parts.iter().filter(|q| q.field == field)).collect();
                let mut slice = None;
                if let (Some(first), true) = (of_field[0].slice.as_ref(), of_field.iter().all(|q| q.slice.is_some())) {
                    // Per dimension, the union of the devices' ranges: one range, or (where the
                    // devices' own are zigzag chunks) the union's ascending runs.
                    let dims = (0..first.len())
                        .map(|d| {
                            let of_dim =
                                || of_field.iter().flat_map(|q| q.slice.as_ref().expect("all sliced")[d].clone());
                            match union(of_dim()) {
                                Some(r) => Some(vec![r]),
                                None if of_field.iter().any(|q| q.slice.as_ref().expect("sliced")[d].len() > 1) => {
                                    Some(runs(of_dim()))
                                }
                                None => None,
                            }
                        })
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| contiguous(p, &format!("a slice of field '{}'", fields[field].name)))?;
                    let whole = matches!(&fields[field].kind, FieldKind::Tensor { shape, .. }
                        if dims.iter().zip(shape).all(|(r, &n)| *r == [0..n]));
                    slice = (!whole).then_some(dims);
                }
                parts.push(FieldPart { field, slice });
            }
            let receiver = Receiver { rank: Rank(p), parts };
            if let Some(b) = blocks.iter_mut().find(|b| b.rows == rows) {
                b.receivers.push(receiver);
                continue;
            }
            if let Some(b) = blocks.iter().find(|b| b.rows.start < rows.end && rows.start < b.rows.end) {
                return Err(Error::Config(format!(
                    "process {p} would hold rows {rows:?} of the batch, which overlap rows {:?} of another process; \
                     processes must hold equal or disjoint rows",
                    b.rows
                )));
            }
            blocks.push(RowBlock { rows, receivers: vec![receiver] });
        }
        blocks.sort_by_key(|b| b.rows.start);
        if let Some(first) = blocks.first_mut() {
            first.receivers.extend(idle);
        }
        Placement::from_blocks(self.batch_size, self.world / k, blocks)
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

/// The zigzag split of a dimension of `n` over `of` ranks, for the rank at `k`: of `2·of`
/// equal chunks, chunks `k` and `2·of − 1 − k` (so that causal attention's work, which
/// grows along the sequence, is even over the ranks).
fn zigzag_chunks(n: usize, k: usize, of: usize) -> Vec<Range<usize>> {
    let c = n / (2 * of);
    vec![k * c..(k + 1) * c, (2 * of - 1 - k) * c..(2 * of - k) * c]
}

/// The union of ranges as ascending disjoint runs (touching ranges merged).
fn runs(ranges: impl Iterator<Item = Range<usize>>) -> Vec<Range<usize>> {
    let mut sorted: Vec<Range<usize>> = ranges.filter(|r| !r.is_empty()).collect();
    sorted.sort_by_key(|r| (r.start, r.end));
    let mut out: Vec<Range<usize>> = Vec::new();
    for r in sorted {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// The union of ranges when it is one contiguous range (ranges may repeat or touch).
fn union(ranges: impl Iterator<Item = Range<usize>>) -> Option<Range<usize>> {
    let mut sorted: Vec<Range<usize>> = ranges.collect();
    sorted.sort_by_key(|r| (r.start, r.end));
    let mut it = sorted.into_iter();
    let mut out = it.next()?;
    for r in it {
        if r.start > out.end {
            return None;
        }
        out.end = out.end.max(r.end);
    }
    Some(out)
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
        let part = FieldPart { field: 0, slice: Some(vec![vec![1..3], vec![2..4]]) };
        let mut out = Vec::new();
        part.copy(&f, &value, &mut out);
        assert_eq!(out, vec![6, 7, 10, 11]);
        assert_eq!((part.shape(&f), part.bytes(&f)), (vec![2, 2], Some(4)));
        let f16 = Field::tensor("h", DType::U16, vec![2, 2, 2]);
        let value: Vec<u8> = (0..16).collect();
        let mut out = Vec::new();
        FieldPart { field: 0, slice: Some(vec![vec![0..2], vec![1..2], vec![0..2]]) }.copy(&f16, &value, &mut out);
        assert_eq!(out, vec![4, 5, 6, 7, 12, 13, 14, 15]);
        // Several ranges in a dimension (zigzag chunks), inner and outer.
        let f = Field::tensor("s", DType::U8, vec![2, 8]);
        let value: Vec<u8> = (0..16).collect();
        let mut out = Vec::new();
        let part = FieldPart { field: 0, slice: Some(vec![vec![0..2], vec![0..2, 6..8]]) };
        part.copy(&f, &value, &mut out);
        assert_eq!((out, part.shape(&f)), (vec![0, 1, 6, 7, 8, 9, 14, 15], vec![2, 4]));
        let f = Field::tensor("t", DType::U8, vec![4, 2]);
        let value: Vec<u8> = (0..8).collect();
        let mut out = Vec::new();
        FieldPart { field: 0, slice: Some(vec![vec![0..1, 3..4], vec![1..2]]) }.copy(&f, &value, &mut out);
        assert_eq!(out, vec![1, 7]);
    }

    /// Copies of slices — one range per dimension (block splits), several in some (zigzag),
    /// trailing dimensions whole or not — against a brute-force selection of the elements
    /// they hold, in C order.
    #[test]
    fn multi_range_slices_copy_the_elements_they_hold() {
        use crate::dataset::DType;
        let f = Field::tensor("x", DType::U16, vec![3, 8, 4]);
        let value: Vec<u8> = (0..96u16).flat_map(|v| v.to_le_bytes()).collect();
        let slices: Vec<Vec<Vec<Range<usize>>>> = vec![
            vec![vec![0..3], vec![0..2, 6..8], vec![0..4]],
            vec![vec![0..1, 2..3], vec![1..2, 3..5], vec![1..2, 3..4]],
            vec![vec![1..2], vec![0..0, 4..6], vec![0..4]],
            vec![vec![0..3], vec![0..8], vec![0..1, 1..2, 2..4]],
            vec![vec![0..1, 2..3], vec![0..8], vec![0..4]],
            vec![vec![1..3], vec![2..6], vec![0..4]],
            vec![vec![0..3], vec![0..8], vec![1..3]],
            vec![vec![1..2], vec![0..8], vec![0..4]],
            vec![vec![0..3], vec![0..8], vec![0..4]],
            vec![vec![2..3], vec![5..6], vec![3..4]],
        ];
        for slice in slices {
            let mut want = Vec::new();
            for e in 0..96usize {
                let idx = [e / 32, e / 4 % 8, e % 4];
                if idx.iter().zip(&slice).all(|(i, rs)| rs.iter().any(|r| r.contains(i))) {
                    want.extend((e as u16).to_le_bytes());
                }
            }
            let part = FieldPart { field: 0, slice: Some(slice.clone()) };
            let mut out = Vec::new();
            part.copy(&f, &value, &mut out);
            assert_eq!(out, want, "{slice:?}");
            assert_eq!(part.bytes(&f), Some(want.len()), "{slice:?}");
        }
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
        assert_eq!(rc.parts[0].slice, Some(vec![vec![4..8]]));
        assert_eq!(rc.parts[1].slice, None);
        assert_eq!(p.block_of_row(1).receivers.iter().map(|r| r.rank.0).collect::<Vec<_>>(), vec![0, 1]);
        // tp=4: batch not split over tp when the spec says so; every rank gets all rows.
        let m = mesh("tp=4");
        let s = resolve(&m, &fields, 8, &pairs(&[("x", "-,tp"), ("y", "-")]), &stages(&[])).unwrap();
        let p = Placement::from_mesh(8, &m, &fields, &s).unwrap();
        assert_eq!(p.receiver(Rank(2)).unwrap().0.rows, 0..8);
        assert_eq!(p.receiver(Rank(2)).unwrap().1.parts[0].slice, Some(vec![vec![4..6]]));
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
    fn processes_of_several_devices_receive_the_union_of_their_shards() {
        use crate::dataset::DType;
        use crate::plan::mesh::tests::mesh;
        use crate::plan::sharding::resolve;
        use std::collections::BTreeMap;
        let fields = vec![Field::tensor("x", DType::F32, vec![8, 4]), Field::tensor("y", DType::I64, vec![])];
        let spec = |x: &str| [("x".to_string(), x.parse().unwrap())].into_iter().collect::<BTreeMap<_, _>>();
        let devices = |m: &str, x: &str| {
            let m = mesh(m);
            let s = resolve(&m, &fields, 8, &spec(x), &BTreeMap::new()).unwrap();
            Placement::from_mesh(8, &m, &fields, &s).unwrap()
        };
        let receiver = |p: &Placement, r: usize| {
            let (b, rc) = p.receiver(Rank(r)).unwrap();
            (b.rows.clone(), rc.parts.iter().map(|q| q.slice.clone()).collect::<Vec<_>>())
        };
        // dp=2,tp=2 on 2 processes: each drives one dp row of devices, so it gets its dp
        // block and the whole of x (both tp halves): whole fields, no slice.
        let p = devices("dp=2,tp=2", "dp,tp").for_processes(2, &fields).unwrap();
        assert_eq!((p.world(), p.blocks().len()), (2, 2));
        assert_eq!(receiver(&p, 1), (4..8, vec![None, None]));
        // tp=2,dp=2: process 0 drives (tp 0, dp 0..2): all rows, x's first tp half.
        let p = devices("tp=2,dp=2", "dp,tp").for_processes(2, &fields).unwrap();
        assert_eq!(p.blocks().len(), 1);
        assert_eq!(receiver(&p, 0), (0..8, vec![Some(vec![vec![0..4], vec![0..4]]), None]));
        assert_eq!(receiver(&p, 1), (0..8, vec![Some(vec![vec![4..8], vec![0..4]]), None]));
        // dp=8 on 2 processes of 4 devices: rows halves.
        let p = devices("dp=8", "dp").for_processes(4, &fields).unwrap();
        assert_eq!(receiver(&p, 1), (4..8, vec![None, None]));
        // Two processes of two devices with a 2-D split of x: dims unioned.
        let p = devices("dp=2,a=2,b=2", "dp,a,b").for_processes(2, &fields).unwrap();
        assert_eq!(receiver(&p, 3), (4..8, vec![Some(vec![vec![4..8], vec![0..4]]), None]));
        // k = 1 is the device placement itself.
        assert_eq!(devices("dp=4", "dp").for_processes(1, &fields).unwrap(), devices("dp=4", "dp"));
    }

    /// The zigzag split against a reference written out: a sequence of 32 in 2·cp equal
    /// chunks, the rank at cp coordinate i holding chunks i and 2·cp − 1 − i, in that order.
    #[test]
    fn zigzag_splits_hold_chunks_i_and_2cp_minus_1_minus_i() {
        use crate::dataset::DType;
        use crate::plan::mesh::tests::mesh;
        use crate::plan::sharding::resolve;
        use std::collections::BTreeMap;
        let fields = vec![Field::tensor("tokens", DType::I32, vec![32]), Field::tensor("y", DType::I64, vec![])];
        let value: Vec<u8> = (0..32i32).flat_map(|t| t.to_le_bytes()).collect();
        for cp in [1, 2, 4, 8] {
            let m = mesh(&format!("dp=2,cp={cp}"));
            let spec = [("tokens".to_string(), "dp,zigzag:cp".parse().unwrap())].into();
            let s = resolve(&m, &fields, 4, &spec, &BTreeMap::new()).unwrap();
            let p = Placement::from_mesh(4, &m, &fields, &s).unwrap();
            let chunk = 32 / (2 * cp);
            for r in 0..2 * cp {
                let i = m.coords(Rank(r))[1];
                let mut want: Vec<i32> = (i * chunk..(i + 1) * chunk).map(|t| t as i32).collect();
                want.extend(((2 * cp - 1 - i) * chunk..(2 * cp - i) * chunk).map(|t| t as i32));
                let (_, rc) = p.receiver(Rank(r)).unwrap();
                let mut out = Vec::new();
                rc.parts[0].copy(&fields[0], &value, &mut out);
                let got: Vec<i32> = out.chunks(4).map(|b| i32::from_le_bytes(b.try_into().unwrap())).collect();
                assert_eq!(got, want, "cp {cp}, rank {r}");
                assert_eq!(rc.parts[0].shape(&fields[0]), vec![2 * chunk]);
                assert_eq!(rc.parts[1].slice, None);
            }
            // Processes of two devices (two cp ranks): the union of their chunks, ascending.
            if cp >= 2 {
                let q = p.for_processes(2, &fields).unwrap();
                let (_, rc) = q.receiver(Rank(0)).unwrap();
                let want = if cp == 2 { vec![0..32] } else { vec![0..2 * chunk, 32 - 2 * chunk..32] };
                assert_eq!(rc.parts[0].slice.as_ref().map(|s| s[0].clone()), (cp != 2).then_some(want.clone()));
            }
        }
    }

    #[test]
    fn processes_whose_shards_are_not_one_range_are_refused() {
        use crate::dataset::DType;
        use crate::plan::mesh::tests::mesh;
        use crate::plan::sharding::resolve;
        use std::collections::BTreeMap;
        let fields = vec![Field::tensor("x", DType::F32, vec![8])];
        let place = |m: &crate::plan::mesh::Mesh, batch: &str| {
            let spec = [("x".to_string(), batch.parse().unwrap())].into();
            let s = resolve(m, &fields, 8, &spec, &BTreeMap::new()).unwrap();
            Placement::from_mesh(8, m, &fields, &s).unwrap()
        };
        let e = place(&mesh("dp=4"), "dp").for_processes(3, &fields).unwrap_err().to_string();
        assert!(e.contains("devices_per_process 3 does not divide the mesh's 4 devices"), "{e}");
        // a=2,dp=2 numbered with a fastest, batch over a+dp: devices 0 and 1 hold blocks
        // 0 and 2 (rows 0..2 and 4..6).
        let m = mesh("a=2,dp=2").with_rank_order(&["dp".into(), "a".into()]).unwrap();
        let e = place(&m, "a+dp").for_processes(2, &fields).unwrap_err().to_string();
        assert!(
            e.contains("process 0 (devices 0..2) would hold rows of the batch that is not one contiguous range"),
            "{e}"
        );
        // dp=2,tp=3 in pairs: process 0 holds rows 0..4 (dp 0), process 1 rows 0..8.
        let e = place(&mesh("dp=2,tp=3"), "dp").for_processes(2, &fields).unwrap_err().to_string();
        assert!(e.contains("process 1 would hold rows 0..8 of the batch, which overlap rows 0..4"), "{e}");
        // In threes, each process holds one dp block.
        assert_eq!(place(&mesh("dp=2,tp=3"), "dp").for_processes(3, &fields).unwrap().blocks().len(), 2);
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
