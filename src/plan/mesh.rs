//! Device meshes: named axes with sizes (`dp=2,tp=2,pp=2`) whose product is the world
//! size, and the mapping of ranks to mesh coordinates.
//!
//! Ranks map to coordinates in row-major order over the axes as written (the last axis
//! varies fastest), unless a rank order lists the axes from slowest to fastest. The axis
//! named `pp` (or one chosen explicitly) is the pipeline axis. Meshes are built from a
//! parsed [`MeshSpec`].

use std::fmt;

use crate::config::MeshSpec;
use crate::error::{Error, Result};
use crate::types::Rank;

/// A device mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    names: Vec<String>,
    sizes: Vec<usize>,
    /// Axis indices from slowest to fastest varying in the rank numbering.
    rank_order: Vec<usize>,
    pipeline: Option<usize>,
}

impl Mesh {
    /// The mesh a spec describes. The axis called `pp`, if any, is the pipeline axis.
    pub fn from_spec(spec: &MeshSpec) -> Mesh {
        let names: Vec<String> = spec.axes.iter().map(|a| a.name.clone()).collect();
        let pipeline = names.iter().position(|n| n == "pp");
        Mesh {
            rank_order: (0..names.len()).collect(),
            sizes: spec.axes.iter().map(|a| a.size).collect(),
            names,
            pipeline,
        }
    }

    /// A one-axis mesh `dp=world`.
    pub fn data_parallel(world: usize) -> Mesh {
        Mesh { names: vec!["dp".into()], sizes: vec![world], rank_order: vec![0], pipeline: None }
    }

    /// Numbers ranks with the axes in `order` (slowest first) instead of as written.
    pub fn with_rank_order(mut self, order: &[String]) -> Result<Mesh> {
        let idx: Vec<usize> = order.iter().map(|n| self.axis_or_err(n, "--mesh-order")).collect::<Result<_>>()?;
        let mut sorted = idx.clone();
        sorted.sort_unstable();
        if sorted != (0..self.names.len()).collect::<Vec<_>>() {
            return Err(Error::Config(format!(
                "--mesh-order must list every mesh axis ({}) once",
                self.names.join(",")
            )));
        }
        self.rank_order = idx;
        Ok(self)
    }

    /// Makes `name` the pipeline axis (instead of `pp`).
    pub fn with_pipeline_axis(mut self, name: &str) -> Result<Mesh> {
        self.pipeline = Some(self.axis_or_err(name, "--pipeline-axis")?);
        Ok(self)
    }

    fn axis_or_err(&self, name: &str, what: &str) -> Result<usize> {
        self.axis(name).ok_or_else(|| {
            Error::Config(format!("{what}: unknown mesh axis '{name}' (axes: {})", self.names.join(", ")))
        })
    }

    /// Index of an axis by name.
    pub fn axis(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Axis names, as written.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Axis sizes, as written.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The pipeline axis, if any.
    pub fn pipeline_axis(&self) -> Option<usize> {
        self.pipeline
    }

    /// Number of devices (product of the sizes).
    pub fn devices(&self) -> usize {
        self.sizes.iter().product()
    }

    /// Checks that the mesh has `per_rank` devices per rank.
    pub fn check_world(&self, world: usize, per_rank: usize) -> Result<()> {
        if self.devices() != world * per_rank {
            let of = if per_rank == 1 { String::new() } else { format!(" × {per_rank} devices per process") };
            return Err(Error::Config(format!(
                "mesh {self} has {} devices but the world has {world} ranks{of}",
                self.devices()
            )));
        }
        Ok(())
    }

    /// The coordinate of a rank, indexed by axis (as written).
    pub fn coords(&self, rank: Rank) -> Vec<usize> {
        let mut coords = vec![0; self.names.len()];
        let mut rest = rank.0;
        for &a in self.rank_order.iter().rev() {
            coords[a] = rest % self.sizes[a];
            rest /= self.sizes[a];
        }
        coords
    }

    /// Mixed-radix index of a coordinate over `axes` (the first axis slowest): the block a
    /// dimension split over `axes` assigns to the coordinate, and the number of blocks.
    pub fn block(&self, coords: &[usize], axes: &[usize]) -> (usize, usize) {
        axes.iter().fold((0, 1), |(idx, n), &a| (idx * self.sizes[a] + coords[a], n * self.sizes[a]))
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.names.iter().zip(&self.sizes).map(|(n, s)| format!("{n}={s}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A mesh from its written form (tests only: the core takes parsed specs).
    pub(crate) fn mesh(spec: &str) -> Mesh {
        Mesh::from_spec(&spec.parse().unwrap())
    }

    #[test]
    fn coordinates() {
        let m = mesh("dp=2,tp=2,pp=2");
        assert_eq!(m.devices(), 8);
        assert_eq!(m.pipeline_axis(), Some(2));
        // Row-major: the last axis varies fastest.
        assert_eq!(m.coords(Rank(0)), vec![0, 0, 0]);
        assert_eq!(m.coords(Rank(1)), vec![0, 0, 1]);
        assert_eq!(m.coords(Rank(2)), vec![0, 1, 0]);
        assert_eq!(m.coords(Rank(5)), vec![1, 0, 1]);
        let m = m.with_rank_order(&["pp".into(), "tp".into(), "dp".into()]).unwrap();
        assert_eq!(m.coords(Rank(1)), vec![1, 0, 0]);
        assert_eq!(m.coords(Rank(4)), vec![0, 0, 1]);
        assert_eq!(m.block(&[1, 1, 0], &[0, 1]), (3, 4));
        assert_eq!(m.block(&[1, 1, 0], &[]), (0, 1));
    }

    #[test]
    fn invalid_meshes() {
        let m = mesh("dp=2,tp=3");
        assert!(m
            .check_world(4, 1)
            .unwrap_err()
            .to_string()
            .contains("mesh dp=2,tp=3 has 6 devices but the world has 4 ranks"));
        assert!(m.clone().with_rank_order(&["dp".into()]).is_err());
        assert!(m.with_pipeline_axis("zz").unwrap_err().to_string().contains("unknown mesh axis 'zz'"));
    }
}
