//! Sharding specs: for each field, which mesh axes split each dimension of its batch
//! array `[batch, *field_shape]`, and which pipeline stages receive it.
//!
//! Semantics follow JAX `PartitionSpec`: `--shard x=dp,-,tp` splits dimension 0 (the batch)
//! over `dp`, leaves dimension 1 whole and splits dimension 2 over `tp`; `dp+fsdp` splits a
//! dimension over the tuple `(dp, fsdp)`: `size(dp)·size(fsdp)` contiguous blocks, the
//! rank at `(c_dp, c_fsdp)` holding block `c_dp·size(fsdp) + c_fsdp`. Omitted trailing
//! dimensions are not split; axes a field does not use replicate it.

use std::collections::BTreeMap;

use super::mesh::Mesh;
use crate::config::ShardSpec;
pub use crate::config::Stage;
use crate::dataset::{Field, FieldKind};
use crate::error::{Error, Result};

/// The sharding of one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldSharding {
    /// Mesh axes splitting each dimension of `[batch, *shape]` (empty: not split). Always as
    /// long as the batch array has dimensions.
    pub dims: Vec<Vec<usize>>,
    /// Per dimension, whether its split is the zigzag one (as long as `dims`).
    pub zigzag: Vec<bool>,
    pub stage: Stage,
}

/// Resolves the axis names of one field's spec against the mesh.
fn axes_of(field: &str, spec: &ShardSpec, mesh: &Mesh) -> Result<Vec<Vec<usize>>> {
    let bad = |why: String| Error::Config(format!("sharding of '{field}' ({spec}): {why}"));
    let mut used = Vec::new();
    let mut dims = Vec::with_capacity(spec.dims.len());
    for names in &spec.dims {
        let mut axes = Vec::with_capacity(names.len());
        for name in names {
            let a = mesh
                .axis(name)
                .ok_or_else(|| bad(format!("unknown mesh axis '{name}' (axes: {})", mesh.names().join(", "))))?;
            if used.contains(&a) {
                return Err(bad(format!("axis '{name}' is used twice")));
            }
            if mesh.pipeline_axis() == Some(a) {
                return Err(bad(format!("the pipeline axis '{name}' cannot split a field (use stages)")));
            }
            used.push(a);
            axes.push(a);
        }
        dims.push(axes);
    }
    Ok(dims)
}

/// Resolves and validates the sharding of every field against the mesh, the fields and
/// the batch size: `shards` and `stages` name fields (others get the defaults).
pub fn resolve(
    mesh: &Mesh,
    fields: &[Field],
    batch_size: usize,
    shards: &BTreeMap<String, ShardSpec>,
    stages: &BTreeMap<String, Stage>,
) -> Result<Vec<FieldSharding>> {
    let known = |what: &str, name: &str| -> Result<usize> {
        fields.iter().position(|f| f.name == name).ok_or_else(|| {
            let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
            Error::Config(format!("{what} names unknown field '{name}' (fields: {})", names.join(", ")))
        })
    };
    // Default: the batch dimension over dp if the mesh has it, else over every
    // non-pipeline axis.
    let default_batch: Vec<usize> = match mesh.axis("dp") {
        Some(dp) if mesh.pipeline_axis() != Some(dp) => vec![dp],
        _ => (0..mesh.names().len()).filter(|&a| Some(a) != mesh.pipeline_axis()).collect(),
    };
    let mut out: Vec<FieldSharding> = fields
        .iter()
        .map(|f| {
            let ndim = match &f.kind {
                FieldKind::Tensor { shape, .. } => shape.len() + 1,
                FieldKind::Bytes { .. } => 1,
            };
            let mut dims = vec![vec![]; ndim];
            dims[0] = default_batch.clone();
            FieldSharding { dims, zigzag: vec![false; ndim], stage: Stage::All }
        })
        .collect();
    for (name, spec) in shards {
        let i = known("shard", name)?;
        let dims = axes_of(name, spec, mesh)?;
        let f = &fields[i];
        let ndim = out[i].dims.len();
        if dims.len() > ndim {
            let shape = match &f.kind {
                FieldKind::Tensor { shape, .. } => {
                    format!("[batch{}]", shape.iter().map(|d| format!(", {d}")).collect::<String>())
                }
                FieldKind::Bytes { .. } => "[batch] (variable length)".into(),
            };
            if matches!(f.kind, FieldKind::Bytes { .. }) {
                return Err(Error::Config(format!(
                    "sharding of '{name}' ({spec}): a variable-length field can only be split along the batch dimension"
                )));
            }
            return Err(Error::Config(format!(
                "sharding of '{name}' ({spec}): {} dimensions given but the batch array of '{name}' has {ndim}: {shape}",
                dims.len()
            )));
        }
        let mut full = vec![vec![]; ndim];
        full[..dims.len()].clone_from_slice(&dims);
        out[i].dims = full;
        out[i].zigzag = (0..ndim).map(|d| spec.zigzag.get(d).copied().unwrap_or(false)).collect();
        if out[i].zigzag[0] {
            return Err(Error::Config(format!(
                "sharding of '{name}' ({spec}): the batch dimension cannot be split zigzag (a sequence dimension can)"
            )));
        }
    }
    for (name, stage) in stages {
        let i = known("stages", name)?;
        out[i].stage = *stage;
    }
    // Divisibility, and one batch split shared by every field.
    let axes_name = |axes: &[usize]| -> String {
        if axes.is_empty() {
            "-".into()
        } else {
            axes.iter().map(|&a| mesh.names()[a].as_str()).collect::<Vec<_>>().join("+")
        }
    };
    let product = |axes: &[usize]| axes.iter().map(|&a| mesh.sizes()[a]).product::<usize>();
    for (f, s) in fields.iter().zip(&out) {
        if s.dims[0] != out[0].dims[0] {
            return Err(Error::Config(format!(
                "fields '{}' and '{}' split the batch dimension differently ({} vs {}); all fields must share the batch split",
                fields[0].name,
                f.name,
                axes_name(&out[0].dims[0]),
                axes_name(&s.dims[0])
            )));
        }
        if let FieldKind::Tensor { shape, .. } = &f.kind {
            for (d, axes) in s.dims.iter().enumerate().skip(1) {
                let p = product(axes);
                if s.zigzag[d] && shape[d - 1] % (2 * p) != 0 {
                    return Err(Error::Config(format!(
                        "field '{}': dimension {d} (size {}) is not divisible by 2·{} ({}), the zigzag split's chunks",
                        f.name,
                        shape[d - 1],
                        axes_name(axes),
                        2 * p
                    )));
                }
                if shape[d - 1] % p != 0 {
                    return Err(Error::Config(format!(
                        "field '{}': dimension {d} (size {}) is not divisible by {} ({p})",
                        f.name,
                        shape[d - 1],
                        axes_name(axes)
                    )));
                }
            }
        }
    }
    let p = product(&out[0].dims[0]);
    if batch_size % p != 0 {
        return Err(Error::Config(format!(
            "batch size {batch_size} is not divisible by {} = {p} (the batch dimension's split)",
            axes_name(&out[0].dims[0])
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::DType;
    use crate::plan::mesh::tests::mesh;

    fn fields() -> Vec<Field> {
        vec![
            Field::tensor("x", DType::F32, vec![8, 6]),
            Field::tensor("y", DType::I64, vec![]),
            Field { name: "t".into(), kind: FieldKind::Bytes { utf8: false, elem: None } },
        ]
    }

    fn shards(p: &[(&str, &str)]) -> BTreeMap<String, ShardSpec> {
        p.iter().map(|(a, b)| (a.to_string(), b.parse().unwrap())).collect()
    }

    fn stages(p: &[(&str, Stage)]) -> BTreeMap<String, Stage> {
        p.iter().map(|(a, b)| (a.to_string(), *b)).collect()
    }

    #[test]
    fn defaults_and_specs() {
        let m = mesh("dp=2,tp=2,pp=2");
        let s = resolve(&m, &fields(), 8, &shards(&[("x", "dp,tp")]), &stages(&[("y", Stage::Last)])).unwrap();
        assert_eq!(s[0].dims, vec![vec![0], vec![1], vec![]]);
        assert_eq!(s[1].dims, vec![vec![0]]);
        assert_eq!((s[1].stage, s[2].stage), (Stage::Last, Stage::All));
        // Without dp, the batch is split over every non-pipeline axis.
        let m = mesh("tp=2,pp=2");
        assert_eq!(resolve(&m, &fields(), 8, &shards(&[]), &stages(&[])).unwrap()[0].dims[0], vec![0]);
        let m = mesh("dp=2,fsdp=2");
        let s =
            resolve(&m, &fields(), 8, &shards(&[("x", "dp+fsdp"), ("y", "dp+fsdp"), ("t", "dp+fsdp")]), &stages(&[]))
                .unwrap();
        assert_eq!(s[0].dims[0], vec![0, 1]);
    }

    #[test]
    fn invalid_specs_are_rejected_with_clear_messages() {
        let m = mesh("dp=2,tp=4,pp=2");
        let err = |sh: &[(&str, &str)], st: &[(&str, Stage)], b: usize| {
            resolve(&m, &fields(), b, &shards(sh), &stages(st)).unwrap_err().to_string()
        };
        assert!(err(&[("x", "dp,zz")], &[], 8).contains("unknown mesh axis 'zz'"));
        assert!(err(&[("q", "dp")], &[], 8).contains("unknown field 'q'"));
        assert!(err(&[("x", "dp,tp,tp")], &[], 8).contains("axis 'tp' is used twice"));
        assert!(err(&[("x", "dp,-,tp")], &[], 8).contains("dimension 2 (size 6) is not divisible by tp (4)"));
        assert!(err(&[("x", "dp,-,-,-")], &[], 8).contains("4 dimensions given but the batch array of 'x' has 3"));
        assert!(err(&[("t", "dp,tp")], &[], 8).contains("variable-length field can only be split along the batch"));
        assert!(err(&[("x", "dp+tp")], &[], 8).contains("split the batch dimension differently"));
        assert!(err(&[("x", "pp")], &[], 8).contains("pipeline axis 'pp' cannot split"));
        assert!(err(&[], &[("q", Stage::Last)], 8).contains("stages names unknown field 'q'"));
        assert!(err(&[], &[], 7).contains("batch size 7 is not divisible by dp = 2"));
        assert!(err(&[("x", "zigzag:dp")], &[], 8).contains("the batch dimension cannot be split zigzag"));
        assert!(err(&[("x", "dp,-,zigzag:tp")], &[], 8).contains("dimension 2 (size 6) is not divisible by 2·tp (8)"));
        let m = mesh("dp=2,cp=2");
        let s = resolve(&m, &fields(), 8, &shards(&[("x", "dp,zigzag:cp")]), &stages(&[])).unwrap();
        assert_eq!(
            (s[0].dims.clone(), s[0].zigzag.clone()),
            (vec![vec![0], vec![1], vec![]], vec![false, true, false])
        );
    }
}
