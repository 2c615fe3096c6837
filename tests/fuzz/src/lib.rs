//! Bodies of the fuzz targets in `fuzz_targets/`, one public function per target.
//!
//! Each is a thin call into meshfeed's public API that must never panic, whatever the
//! input: errors are fine, panics (including arithmetic overflow, which fuzz builds check)
//! are bugs. They live in a library so that `tests/replay.rs` can replay the kept corpus
//! and the crash artifacts on stable Rust with plain `cargo test`.
//!
//! The file targets write the input to a fixed path under [`std::env::temp_dir`] that
//! includes the process id (`meshfeed-fuzz-<pid>/<target>/`), so parallel fuzzing jobs (`-jobs`,
//! `-fork`) do not overwrite each other's files. It is removed at exit (not after a
//! crash, so the crashing file can be looked at); [`cleanup`] removes one target's files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use meshfeed::config::{parse_pair, ByteSize, MeshSpec, ShardSpec, Stage};
use meshfeed::dataset::npy_header::{parse_preamble, parse_py_literal};
use meshfeed::dataset::{gen, raw, scan_file, Dataset, DatasetOptions, DType, Field, FieldKind, Format};
use meshfeed::plan::{sharding, Mesh};
use meshfeed::types::Rank;

/// Names of the targets, in the order of `fuzz_targets/`.
pub const TARGETS: [(&str, fn(&[u8])); 5] = [
    ("npy_header", npy_header),
    ("npy_file", npy_file),
    ("arrow_file", arrow_file),
    ("raw_schema", raw_schema),
    ("specs", specs),
];

/// libfuzzer-sys installs a panic hook that aborts on every panic, also on one that
/// would be caught. meshfeed deliberately catches the panics of arrow-ipc's record batch
/// decoder (corrupt batches it asserts on instead of returning an error) and turns them
/// into errors; its own panic hooks (`cli::run`) let those pass by checking
/// [`meshfeed::dataset::arrow::decoding_untrusted_input`]. Do the same here, so that only
/// panics that would reach the caller count as crashes.
fn let_caught_decoder_panics_pass() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !meshfeed::dataset::arrow::decoding_untrusted_input() {
                previous(info);
            }
        }));
    });
}

/// `.npy` preamble parser and the Python-literal parser, on the bytes as given.
pub fn npy_header(data: &[u8]) {
    if let Ok(p) = parse_preamble(data) {
        // Documented contract: the data starts inside what was given (the header is
        // bound-checked against the bytes supplied).
        assert!(p.data_offset <= data.len() as u64, "data_offset {} > {} bytes", p.data_offset, data.len());
    }
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_py_literal(text);
    }
}

/// The whole `.npy` path: scan, open, read rows 0, middle and last.
pub fn npy_file(data: &[u8]) {
    let path = work_dir("npy_file").join("x.npy");
    write(&path, data);
    read_file(&path, Format::Npy);
}

/// The whole Arrow IPC path: scan (footer, batch headers), open, read rows 0, middle, last.
pub fn arrow_file(data: &[u8]) {
    let_caught_decoder_panics_pass();
    let path = work_dir("arrow_file").join("x.arrow");
    write(&path, data);
    read_file(&path, Format::Arrow);
}

/// Contents of the fixed raw file used by [`raw_schema`]: 120 bytes, a whole number of
/// records for every record size dividing 120 (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 24,
/// 30, 40, 60, 120), so most valid schemas get rows to read.
pub const RAW_FILE: [u8; 120] = {
    let mut b = [0u8; 120];
    let mut i = 0;
    while i < 120 {
        b[i] = i as u8;
        i += 1;
    }
    b
};

/// The input as `schema.json` next to a fixed 120-byte `x.raw`, then scan, open and read.
pub fn raw_schema(data: &[u8]) {
    let dir = work_dir("raw_schema");
    let path = dir.join("x.raw");
    if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(RAW_FILE.len() as u64) {
        write(&path, &RAW_FILE);
    }
    write(&dir.join(raw::SCHEMA_FILE), data);
    read_file(&path, Format::Raw);
}

/// Spec parsers, one input line at a time: meshes ([`MeshSpec`]), `--field`
/// ([`gen::parse_field`]), byte sizes ([`ByteSize`]), and [`sharding::resolve`] with a few
/// fixed fields plus every field a line parsed to, the sharding specs of lines `f=spec` and
/// the stages of lines `@f=stage` (each parsed as the command line does), on
/// the mesh `dp=2,tp=2,pp=2` and on every line's mesh that passes the checks `meshfeed run`
/// makes on an 8-rank world (`--mesh-order` reversed, `--pipeline-axis`, `check_world`, as
/// in `loader::layout`). The batch size is the first line that parses as a byte size
/// (default 64).
pub fn specs(data: &[u8]) {
    const WORLD: usize = 8;
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mesh = |spec: &MeshSpec| Mesh::from_spec(spec);
    let mut meshes = vec![mesh(&"dp=2,tp=2,pp=2".parse().expect("fixed mesh parses"))];
    let mut fields = vec![
        Field::tensor("x", DType::F32, vec![8, 6]),
        Field::tensor("y", DType::I64, vec![]),
        Field { name: "t".into(), kind: FieldKind::Bytes { utf8: false, elem: None } },
        Field::tensor("z", DType::U8, vec![4, 2, 6]),
    ];
    let (mut shards, mut stages) = (BTreeMap::new(), BTreeMap::new());
    let mut batch: Option<usize> = None;
    for line in text.lines() {
        if let Ok(m) = line.parse::<MeshSpec>() {
            let _ = m.to_string();
            let m = mesh(&m);
            let reversed: Vec<String> = m.names().iter().rev().cloned().collect();
            let m = m.with_rank_order(&reversed).expect("every axis once");
            let m = m.with_pipeline_axis(&reversed[0]).expect("an axis of the mesh");
            if m.check_world(WORLD, 1).is_ok() {
                let _ = m.coords(Rank(WORLD - 1));
                if meshes.len() < 4 {
                    meshes.push(m);
                }
            }
        }
        if let Ok(f) = gen::parse_field(line) {
            if fields.len() < 12 {
                fields.push(f);
            }
        }
        if let Ok(n) = line.parse::<ByteSize>() {
            if batch.is_none() {
                batch = usize::try_from(n.0).ok();
            }
        }
        match line.strip_prefix('@') {
            Some(pair) => stages.extend(parse_pair::<Stage>(pair)),
            None => shards.extend(parse_pair::<ShardSpec>(line)),
        }
    }
    for mesh in &meshes {
        let Ok(out) = sharding::resolve(mesh, &fields, batch.unwrap_or(64), &shards, &stages) else { continue };
        assert_eq!(out.len(), fields.len());
        for (f, s) in fields.iter().zip(&out) {
            let ndim = match &f.kind {
                FieldKind::Tensor { shape, .. } => shape.len() + 1,
                FieldKind::Bytes { .. } => 1,
            };
            // Documented: `dims` is always as long as the batch array has dimensions.
            assert_eq!(s.dims.len(), ndim, "field {}: {:?}", f.name, s.dims);
        }
    }
}

/// Removes this process's scratch files of one target (`meshfeed-fuzz-<pid>/<target>/`),
/// and the process's directory once it is empty.
pub fn cleanup(target: &str) {
    let _ = std::fs::remove_dir_all(base_dir().join(target));
    let _ = std::fs::remove_dir(base_dir());
}

fn base_dir() -> PathBuf {
    std::env::temp_dir().join(format!("meshfeed-fuzz-{}", std::process::id()))
}

extern "C" {
    fn atexit(callback: extern "C" fn()) -> std::os::raw::c_int;
}

extern "C" fn remove_scratch() {
    let _ = std::fs::remove_dir_all(base_dir());
}

fn work_dir(kind: &str) -> PathBuf {
    // libFuzzer leaves through exit() at the end of a run (and in every -fork/-merge
    // child): remove the scratch files then. A crash leaves them for inspection.
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a plain extern "C" function taking no arguments.
    AT_EXIT.call_once(|| unsafe {
        atexit(remove_scratch);
    });
    let dir = base_dir().join(kind);
    std::fs::create_dir_all(&dir).expect("create the fuzz scratch directory");
    dir
}

fn write(path: &Path, data: &[u8]) {
    std::fs::write(path, data).expect("write the fuzz input file");
}

/// Scan a file; if that works, build a one-file dataset, open a reader and read rows 0,
/// middle and last, checking what the reader contract promises about the returned chunk.
fn read_file(path: &Path, format: Format) {
    let Ok(info) = scan_file(path, format, &DatasetOptions::default()) else { return };
    let samples = info.samples;
    let Ok(ds) = Dataset::from_files(vec![info], DatasetOptions::default()) else { return };
    let Ok(mut reader) = ds.open_reader(0) else { return };
    let mut rows: Vec<u64> = if samples == 0 { vec![] } else { vec![0, samples / 2, samples - 1] };
    rows.dedup();
    let Ok(chunk) = reader.read_rows(&rows) else { return };
    let fields = ds.fields();
    if fields.is_empty() {
        return;
    }
    // "The returned chunk holds them in the same order."
    assert_eq!(chunk.rows(), rows.len(), "rows {rows:?}");
    for r in 0..chunk.rows() {
        for (fi, f) in fields.iter().enumerate() {
            let v = chunk.value(r, fi);
            if let Some(n) = f.fixed_bytes() {
                assert_eq!(v.len(), n, "row {} field {}", rows[r], f.name);
            }
        }
    }
}
