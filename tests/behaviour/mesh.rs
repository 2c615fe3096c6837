//! Device-mesh placement, over MPI and UCX: every rank's delivered slices equal the
//! slices of a reference global batch cut out by an independent oracle (below) from the
//! bytes numpy wrote (`xyz_rows/*.bin`), for npy, HDF5 and Arrow inputs, with the fused
//! and the two-phase exchange.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;

const B: usize = 8;

/// Field shapes and element sizes of the xyz fixtures: x f32[4], y i64[], z u8[2,3].
fn xyz() -> Vec<(&'static str, Vec<usize>, usize)> {
    vec![("x", vec![4], 4), ("y", vec![], 8), ("z", vec![2, 3], 1)]
}

struct Case {
    np: usize,
    /// Mesh devices per process (`--devices-per-process`).
    k: usize,
    mesh: &'static str,
    order: Option<&'static str>,
    shard: &'static [(&'static str, &'static str)],
    stages: &'static [(&'static str, &'static str)],
}

const CASES: &[Case] = &[
    Case { np: 4, k: 1, mesh: "dp=4", order: None, shard: &[], stages: &[] },
    // Sequence/feature dims split over tp, labels (y) replicated over tp.
    Case { np: 4, k: 1, mesh: "dp=2,tp=2", order: None, shard: &[("x", "dp,tp"), ("z", "dp,tp")], stages: &[] },
    Case { np: 4, k: 1, mesh: "dp=2,tp=2", order: Some("tp,dp"), shard: &[("x", "dp,tp")], stages: &[] },
    // Batch not split at all.
    Case { np: 4, k: 1, mesh: "tp=4", order: None, shard: &[("x", "-,tp"), ("y", "-"), ("z", "-")], stages: &[] },
    Case {
        np: 4,
        k: 1,
        mesh: "dp=2,pp=2",
        order: None,
        shard: &[],
        stages: &[("x", "first"), ("z", "first"), ("y", "last")],
    },
    // Tuple split of the batch dimension.
    Case {
        np: 4,
        k: 1,
        mesh: "dp=2,fsdp=2",
        order: None,
        shard: &[("x", "dp+fsdp"), ("y", "dp+fsdp"), ("z", "dp+fsdp")],
        stages: &[],
    },
    // Middle pipeline stages receive nothing but step in lockstep.
    Case {
        np: 8,
        k: 1,
        mesh: "dp=2,pp=4",
        order: None,
        shard: &[],
        stages: &[("x", "first"), ("z", "first"), ("y", "last")],
    },
    Case {
        np: 8,
        k: 1,
        mesh: "dp=2,tp=2,pp=2",
        order: None,
        shard: &[("x", "dp,tp"), ("z", "dp,tp")],
        stages: &[("x", "first"), ("z", "first"), ("y", "last")],
    },
    // Several devices per process (JAX's one process per host): a process receives the
    // union of its devices' shards. Here each process drives one dp row: its rows, whole
    // fields.
    Case { np: 2, k: 2, mesh: "dp=2,tp=2", order: None, shard: &[("x", "dp,tp"), ("z", "dp,tp")], stages: &[] },
    // Each process drives one tp column: every row, its half of x and z.
    Case { np: 2, k: 2, mesh: "tp=2,dp=2", order: None, shard: &[("x", "dp,tp"), ("z", "dp,tp")], stages: &[] },
    // Pipeline stages and a process of four devices across them.
    Case {
        np: 2,
        k: 4,
        mesh: "dp=2,tp=2,pp=2",
        order: None,
        shard: &[("x", "dp,tp"), ("z", "dp,tp")],
        stages: &[("x", "first"), ("z", "first"), ("y", "last")],
    },
    Case { np: 1, k: 4, mesh: "dp=4", order: None, shard: &[], stages: &[] },
];

/// The oracle: JAX PartitionSpec semantics written out directly.
struct Oracle {
    names: Vec<String>,
    sizes: Vec<usize>,
    order: Vec<usize>,
}

impl Oracle {
    fn new(mesh: &str, order: Option<&str>) -> Oracle {
        let (names, sizes): (Vec<String>, Vec<usize>) = mesh
            .split(',')
            .map(|a| a.split_once('=').unwrap())
            .map(|(n, s)| (n.to_string(), s.parse::<usize>().unwrap()))
            .unzip();
        let order = match order {
            Some(o) => o.split(',').map(|n| names.iter().position(|m| m == n).unwrap()).collect(),
            None => (0..names.len()).collect(),
        };
        Oracle { names, sizes, order }
    }

    fn coords(&self, rank: usize) -> Vec<usize> {
        let mut c = vec![0; self.names.len()];
        let mut rest = rank;
        for &a in self.order.iter().rev() {
            c[a] = rest % self.sizes[a];
            rest /= self.sizes[a];
        }
        c
    }

    /// (block, blocks) of a dimension split over `axes` ("dp+fsdp", "-").
    fn block(&self, c: &[usize], axes: &str) -> (usize, usize) {
        if axes == "-" {
            return (0, 1);
        }
        axes.split('+').fold((0, 1), |(i, n), name| {
            let a = self.names.iter().position(|m| m == name).unwrap();
            (i * self.sizes[a] + c[a], n * self.sizes[a])
        })
    }
}

/// The expected dump of one rank at one step: ids and, per field received, the CRC of
/// each row's slice. A rank driving several devices (`case.k`) receives, per dimension,
/// the smallest range covering its devices' ranges.
fn expected_line(
    o: &Oracle,
    case: &Case,
    rank: usize,
    global_ids: &[u64],
    rows_bin: &BTreeMap<String, Vec<u8>>,
) -> (Vec<u64>, BTreeMap<String, Vec<u32>>) {
    let spec_of = |f: &str| {
        case.shard.iter().find(|(g, _)| *g == f).map(|(_, s)| s.to_string()).unwrap_or_else(|| {
            if o.names.iter().any(|n| n == "dp") {
                "dp".into()
            } else {
                o.names.iter().filter(|n| *n != "pp").cloned().collect::<Vec<_>>().join("+")
            }
        })
    };
    let cover = |a: Option<std::ops::Range<usize>>, b: std::ops::Range<usize>| match a {
        Some(a) => a.start.min(b.start)..a.end.max(b.end),
        None => b,
    };
    let mut crcs = BTreeMap::new();
    let mut batch_rows = None;
    for (name, shape, elem) in xyz() {
        let spec = spec_of(name);
        let dims: Vec<&str> = spec.split(',').collect();
        let (mut rows, mut ranges) = (None, vec![None; shape.len()]);
        for device in rank * case.k..(rank + 1) * case.k {
            let c = o.coords(device);
            let (stage, stages) = match o.names.iter().position(|n| n == "pp") {
                Some(a) => (c[a], o.sizes[a]),
                None => (0, 1),
            };
            let st = case.stages.iter().find(|(g, _)| *g == name).map_or("all", |(_, s)| s);
            let included = match st {
                "first" => stage == 0,
                "last" => stage + 1 == stages,
                _ => true,
            };
            if !included {
                continue;
            }
            let (k, n) = o.block(&c, dims[0]);
            rows = Some(cover(rows, k * B / n..(k + 1) * B / n));
            for (d, &len) in shape.iter().enumerate() {
                let (k, n) = o.block(&c, dims.get(d + 1).copied().unwrap_or("-"));
                ranges[d] = Some(cover(ranges[d].take(), k * len / n..(k + 1) * len / n));
            }
        }
        let Some(rows) = rows else { continue };
        let ranges: Vec<std::ops::Range<usize>> = ranges.into_iter().map(|r| r.unwrap()).collect();
        batch_rows = Some(rows.clone());
        let value_bytes = shape.iter().product::<usize>() * elem;
        let list = rows
            .map(|row| {
                let id = global_ids[row] as usize;
                let value = &rows_bin[name][id * value_bytes..(id + 1) * value_bytes];
                // Select the elements inside the slice, in C order.
                let mut out = Vec::new();
                let count: usize = shape.iter().product();
                for e in 0..count {
                    let mut rem = e;
                    let mut idx = vec![0; shape.len()];
                    for d in (0..shape.len()).rev() {
                        idx[d] = rem % shape[d];
                        rem /= shape[d];
                    }
                    if idx.iter().zip(&ranges).all(|(i, r)| r.contains(i)) {
                        out.extend_from_slice(&value[e * elem..(e + 1) * elem]);
                    }
                }
                crc32fast::hash(&out)
            })
            .collect();
        crcs.insert(name.to_string(), list);
    }
    let ids = batch_rows.map_or(vec![], |rows| global_ids[rows].to_vec());
    (ids, crcs)
}

fn run_case(t: Transport, data: &Path, case: &Case, exchange: &str, dump: &Path) {
    let mut job = Job::new(data).batch(8).seed(9).epochs(2).mesh(case.mesh).exchange(exchange).window("1K").dump(dump);
    if let Some(o) = case.order {
        job = job.opt("--mesh-order", o);
    }
    if case.k > 1 {
        job = job.opt("--devices-per-process", case.k);
    }
    for (f, s) in case.shard {
        job = job.shard(&format!("{f}={s}"));
    }
    for (f, s) in case.stages {
        job = job.stages(&format!("{f}={s}"));
    }
    ok(&job.over(t, case.np));
}

fn check_format(t: Transport, format: &str, exchanges: &[&str]) {
    let fx = fixtures();
    let data = fx.join(format);
    let rows_bin: BTreeMap<String, Vec<u8>> = ["x", "y", "z"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(fx.join(format!("xyz_rows/{f}.bin"))).unwrap()))
        .collect();
    // The reference global batches: one process, data parallel.
    let out = tempdir();
    let refdump = out.path().join("ref");
    ok(&Job::new(&data).batch(8).seed(9).epochs(2).dump(&refdump).over(t, 1));
    let reference = read_dump(&refdump, 1).remove(0);
    assert_eq!(reference.len(), 2 * (101 / B));
    for case in CASES {
        let o = Oracle::new(case.mesh, case.order);
        let mut first: Option<Vec<Vec<u8>>> = None;
        for &exchange in exchanges {
            let dump = out.path().join(format!("{}-{}-{}-{exchange}", case.mesh, case.order.unwrap_or(""), case.k));
            run_case(t, &data, case, exchange, &dump);
            let lines = read_dump(&dump, case.np);
            for (rank, rank_lines) in lines.iter().enumerate() {
                assert_eq!(rank_lines.len(), reference.len(), "{} rank {rank}: one line per step", case.mesh);
                for (line, reference) in rank_lines.iter().zip(&reference) {
                    assert_eq!((line.epoch, line.step), (reference.epoch, reference.step));
                    let (ids, crcs) = expected_line(&o, case, rank, &reference.ids, &rows_bin);
                    let what = format!(
                        "{format} {} {exchange} rank {rank} epoch {} step {}",
                        case.mesh, line.epoch, line.step
                    );
                    assert_eq!(line.ids, ids, "{what}: ids");
                    let got: BTreeMap<String, Vec<u32>> = line.crc32.iter().cloned().collect();
                    assert_eq!(got, crcs, "{what}: slices");
                    if case.mesh == "dp=2,pp=4" && ![0, 3].contains(&(rank % 4)) {
                        assert!(line.ids.is_empty() && line.crc32.is_empty(), "{what}: middle stage gets nothing");
                    }
                }
            }
            let bytes: Vec<Vec<u8>> = dump_bytes(&dump, case.np);
            match &first {
                None => first = Some(bytes),
                Some(f) => assert!(f == &bytes, "{} {exchange}: dump differs from the fused exchange's", case.mesh),
            }
        }
    }
}

over_transports! {
    fn meshes_on_npy_fused_and_two_phase(t: Transport) {
        check_format(t, "npy_struct", &["fused", "two-phase"]);
    }

    fn meshes_on_hdf5(t: Transport) {
        check_format(t, "hdf5", &["fused"]);
    }

    fn meshes_on_arrow(t: Transport) {
        check_format(t, "arrow", &["auto"]);
    }

    fn verify_with_meshes_on_generated_data(t: Transport) {
        let out = tempdir();
        let data =
            Dataset::gen("arrow", 500).files(2).field("x:f32:4x6").field("y:i64").field("t:bytes").write(&out.path().join("g"));
        // (ranks, mesh, --shard specs, devices per process, --stages specs)
        let cases: [(usize, &str, &[&str], usize, &[&str]); 5] = [
            (4, "dp=2,tp=2", &["x=dp,-,tp"], 1, &[]),
            (4, "dp=2,fsdp=2", &["x=dp+fsdp", "y=dp+fsdp", "t=dp+fsdp"], 1, &[]),
            (2, "dp=2,tp=2", &["x=dp,-,tp"], 2, &[]),
            (2, "tp=2,dp=2", &["x=dp,-,tp"], 2, &[]),
            (8, "dp=2,tp=2,pp=2", &["x=dp,tp,-"], 1, &["x=first", "t=first", "y=last"]),
        ];
        for (np, mesh, shards, k, stages) in cases {
            for exchange in ["fused", "two-phase"] {
                let mut job = Job::new(&data).batch(16).mesh(mesh).exchange(exchange).verify().window("2K");
                job = shards.iter().fold(job, |job, s| job.shard(s));
                if k > 1 {
                    job = job.opt("--devices-per-process", k);
                }
                job = stages.iter().fold(job, |job, s| job.stages(s));
                let run = job.over(t, np);
                ok(&run);
                assert!(run.stdout.contains("contents match the generator"), "{}", run.stdout);
                assert!(run.stdout.contains(&format!("{exchange} exchange")), "{}", run.stdout);
            }
        }
    }

    fn invalid_layouts_fail_cleanly_on_every_rank(t: Transport) {
        let data = fixtures().join("npy_struct");
        // The invalid options as given (the failure messages show them).
        for (np, extra, needle) in [
            (4, vec!["--mesh", "dp=2,tp=3"], "mesh dp=2,tp=3 has 6 devices but the world has 4 ranks"),
            (4, vec!["--mesh", "dp=2,tp=2", "--shard", "x=dp,zz"], "unknown mesh axis 'zz'"),
            (4, vec!["--mesh", "dp=2,tp=2", "--shard", "q=dp"], "unknown field 'q'"),
            (4, vec!["--mesh", "dp=2,tp=2", "--shard", "x=dp,tp+tp"], "axis 'tp' is used twice"),
            (4, vec!["--mesh", "dp=2,tp=2", "--shard", "z=dp,-,tp"], "dimension 2 (size 3) is not divisible by tp (2)"),
            (4, vec!["--mesh", "dp=2,tp=2", "--shard", "x=dp+tp"], "split the batch dimension differently"),
            (
                2,
                vec!["--mesh", "dp=2,tp=2", "--devices-per-process", "3"],
                "mesh dp=2,tp=2 has 4 devices but the world has 2 ranks × 3 devices per process",
            ),
            (
                3,
                vec!["--mesh", "dp=2,tp=3", "--devices-per-process", "2"],
                "process 1 would hold rows 0..8 of the batch, which overlap rows 0..4 of another process",
            ),
        ] {
            let run = Job::new(&data).batch(8).args(&extra).over(t, np);
            assert_ne!(run.code, 0, "{extra:?} must fail");
            let line = agreed_failure(&run, np);
            assert!(line.contains(needle), "{extra:?}: {line}");
        }
        // What the command line itself can tell is wrong stops the job before MPI starts, with
        // the parser's message and exit code 2 (mpirun stops the other ranks as soon as the
        // first one exits, so the message may appear fewer than 4 times). The options are
        // literal: what the parser makes of them is the test.
        for (extra, needle) in [
            (vec!["--mesh", "dp=2,pp=2", "--stages", "x=middle"], "stage 'middle': expected first, last or all"),
            (vec!["--mesh", "dp=4", "--exchange", "magic"], "[possible values: auto, fused, two-phase, broadcast]"),
            (vec!["--mesh", "dp=2,dp=2"], "axis 'dp' appears twice"),
            (vec!["--shard", "x=dp,t p"], "bad axis name 't p'"),
        ] {
            let run = Job::new(&data).batch(8).args(&extra).over(t, 4);
            assert_eq!(run.code, 2, "{extra:?} is a command-line error:\n{}", run.stderr);
            assert!(run.stderr.contains(needle), "{extra:?}: the parser says why:\n{}", run.stderr);
        }
        // A variable-length field split beyond the batch dimension.
        let var = fixtures().join("arrow_var");
        let run = Job::new(&var).batch(4).mesh("dp=1,tp=2").shard("t=dp,tp").over(t, 2);
        assert_ne!(run.code, 0);
        assert!(run.stderr.contains("variable-length field can only be split along the batch dimension"), "{}", run.stderr);
    }

    fn config_file_and_flag_overrides(t: Transport) {
        let fx = fixtures();
        let out = tempdir();
        let job = out.path().join("job.toml");
        std::fs::write(
            &job,
            format!(
                "data = [{:?}]\nbatch_size = 8\nepochs = 2\nseed = 9\nwindow_bytes = \"1K\"\nmesh = \"dp=2,tp=2\"\nexchange = \"fused\"\n[shard]\nx = \"dp,tp\"\nz = \"dp,tp\"\n",
                fx.join("npy_struct").to_str().unwrap()
            ),
        )
        .unwrap();
        let d1 = out.path().join("from-config");
        ok(&Job::config(&job).dump(&d1).over(t, 4));
        let d2 = out.path().join("from-flags");
        run_case(t, &fx.join("npy_struct"), &CASES[1], "fused", &d2);
        for r in 0..4 {
            let f = format!("rank-{r}.jsonl");
            assert_eq!(std::fs::read(d1.join(&f)).unwrap(), std::fs::read(d2.join(&f)).unwrap(), "config file = flags");
        }
        // Flags override the file: a mesh of 4 ranks run on 2 is rejected, --mesh fixes it.
        let run = Job::config(&job).over(t, 2);
        assert!(run.code != 0 && run.stderr.contains("has 4 devices but the world has 2 ranks"), "{}", run.stderr);
        ok(&Job::config(&job).mesh("dp=1,tp=2").over(t, 2));
        // The same validation applies to the file.
        std::fs::write(&job, "data = [\"x\"]\nbatch_size = 8\nmesh = \"dp=4\"\nbogus = 1\n").unwrap();
        let run = Job::config(&job).over(t, 2);
        assert!(
            run.code != 0 && run.stderr.contains("job.toml: invalid job file") && run.stderr.contains("bogus"),
            "{}",
            run.stderr
        );
    }
}

#[test]
fn bench_compares_fused_two_phase_and_naive() {
    let out = tempdir();
    let data = Dataset::gen("npy", 2000).files(2).field("x:f32:8x16").field("y:i64").write(&out.path().join("g"));
    let run = mpirun(
        4,
        &[
            "bench",
            "--data",
            data.to_str().unwrap(),
            "--batch-size",
            "32",
            "--mesh",
            "dp=2,tp=2",
            "--shard",
            "x=dp,-,tp",
            "--epochs",
            "1",
            "--json",
        ],
    );
    ok(&run);
    let rows: Vec<serde_json::Value> = run.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["fused", "two-phase", "naive"]);
    let get = |i: usize, k: &str| rows[i][k].as_u64().unwrap();
    // Every mode delivers the same bytes: 62 steps × 32 rows × (512 bytes of x split in two + 8 of y) × 2 replicas.
    let delivered = 62 * 32 * (256 + 8) * 2;
    for i in 0..3 {
        assert_eq!(get(i, "delivered_bytes"), delivered, "{}", modes[i]);
        assert!(rows[i]["epoch_s"].as_f64().unwrap() > 0.0);
    }
    // Fused moves each slice once; two-phase moves whole rows to leaders first; naive
    // sends every batch from rank 0 to every rank.
    assert!(get(0, "total_sent") < get(1, "total_sent"));
    assert!(get(1, "total_sent") < get(2, "total_sent"));
    assert_eq!(get(2, "max_sent_per_rank"), 3 * get(2, "max_received_per_rank"));
}

over_transports! {
    /// The zigzag context-parallel split (`zigzag:cp`) of packed sequences, with the fused
    /// and two-phase exchanges: each rank's tokens are chunks i and 2·cp − 1 − i of the 2·cp
    /// chunks of each sample's inputs (i its cp coordinate), cut here from the inputs an
    /// independent packing wrote (make_fixtures.py); every rank of a dp group gets the
    /// same samples, and the dp groups share out each batch.
    fn zigzag_context_parallel_split_of_packed_sequences(t: Transport) {
        let data = fixtures().join("megatron_packed");
        let exp: serde_json::Value =
            serde_json::from_slice(&std::fs::read(data.join("expected.json")).unwrap()).unwrap();
        let inputs: Vec<Vec<u16>> = exp["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u16).collect())
            .collect();
        for (mesh, dp, cp, spec, exchange) in [
            ("dp=2,cp=2", 2, 2, "dp,zigzag:cp", "fused"),
            ("dp=2,cp=2", 2, 2, "dp,zigzag:cp", "two-phase"),
            ("cp=4", 1, 4, "-,zigzag:cp", "fused"),
        ] {
            let out = tempdir();
            let dump = out.path().join("d");
            let job = Job::new(&data).batch(4).seed(2).epochs(2).window("1K").mesh(mesh).dump(&dump);
            let tokens = format!("tokens={spec}");
            let labels = format!("labels={spec}");
            ok(&job.pack("tokens:16,eos=0").shard(&tokens).shard(&labels).exchange(exchange).over(t, 4));
            let lines = read_dump(&dump, 4);
            let chunk = 16 / (2 * cp);
            for (r, rank_lines) in lines.iter().enumerate() {
                let i = r % cp; // cp is the fastest axis
                for l in rank_lines {
                    assert_eq!(l.ids.len(), 4 / dp, "{mesh}: rank {r}: rows of its dp block");
                    let crcs = &l.crc32.iter().find(|(f, _)| f == "tokens").unwrap().1;
                    for (id, crc) in l.ids.iter().zip(crcs) {
                        let s = &inputs[*id as usize];
                        let mut want: Vec<u8> = Vec::new();
                        for t in s[i * chunk..(i + 1) * chunk].iter().chain(&s[(2 * cp - 1 - i) * chunk..(2 * cp - i) * chunk]) {
                            want.extend(t.to_le_bytes());
                        }
                        assert_eq!(*crc, crc32fast::hash(&want), "{mesh} {exchange}: rank {r} (cp {i}) sample {id}");
                    }
                }
            }
            for (step, first) in lines[0].iter().enumerate() {
                assert_eq!(first.step, lines[3][step].step);
                let ids = |r: usize| &lines[r][step].ids;
                for r in 0..4 {
                    assert_eq!(ids(r), ids(r - r % cp), "{mesh}: a dp group's ranks hold the same samples");
                }
                let mut all: Vec<u64> = (0..4).step_by(cp).flat_map(|r| ids(r).clone()).collect();
                all.sort_unstable();
                all.dedup();
                assert_eq!(all.len(), 4, "{mesh}: step {step}: the dp groups share out the batch");
            }
        }
    }
}
