//! Hostile input: truncated, bit-flipped and oversized-header files of every format, and
//! arbitrary strings for every spec parser. Nothing may panic, hang or allocate what a
//! file merely claims; every failure is an error naming the file.

use std::path::{Path, PathBuf};

use meshfeed::dataset::{gen, DType, Dataset, DatasetOptions, Field, FieldKind, Format};
use proptest::prelude::*;

use crate::common::fixtures;

/// A small valid dataset of one file in `format`; returns its path.
fn valid_file(dir: &Path, format: Format) -> PathBuf {
    let mut fields = vec![Field::tensor("x", DType::F32, vec![3]), Field::tensor("y", DType::I64, vec![])];
    if format == Format::Arrow {
        fields.push(Field { name: "t".into(), kind: FieldKind::Bytes { utf8: false, elem: None } });
    }
    let spec = gen::GenSpec { format, samples: 40, files: 1, fields, out: dir.into(), arrow_batch_rows: 16 };
    gen::write_file(&spec, 0).unwrap();
    gen::write_side_files(&spec).unwrap();
    spec.file_path(0)
}

/// Opens and reads every row; returns the error text, if any. Must not panic.
fn open_and_read(dir: &Path) -> Option<String> {
    open_and_read_with(dir, Default::default())
}

/// [`open_and_read`] with dataset options (a field selection, packing).
fn open_and_read_with(dir: &Path, options: DatasetOptions) -> Option<String> {
    let result = (|| -> meshfeed::Result<()> {
        let ds = Dataset::open_local(&[dir.into()], options)?;
        for f in 0..ds.files().len() {
            let mut r = ds.open_reader(f)?;
            let n = ds.files()[f].samples;
            // Read in bounded slices: a file's claimed size is not trusted.
            let mut start = 0;
            while start < n {
                let rows: Vec<u64> = (start..(start + 64).min(n)).collect();
                r.read_rows(&rows)?;
                start += 64;
            }
        }
        Ok(())
    })();
    result.err().map(|e| e.to_string())
}

#[derive(Clone, Debug)]
enum Mutation {
    Flip { at: usize, bit: u8 },
    Truncate { keep: usize },
    Overwrite { at: usize, bytes: [u8; 4] },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        any::<usize>().prop_map(|keep| Mutation::Truncate { keep }),
        (any::<usize>(), any::<[u8; 4]>()).prop_map(|(at, bytes)| Mutation::Overwrite { at, bytes }),
    ]
}

fn apply(bytes: &mut Vec<u8>, muts: &[Mutation]) {
    for m in muts {
        if bytes.is_empty() {
            return;
        }
        let len = bytes.len();
        match m {
            Mutation::Flip { at, bit } => bytes[at % len] ^= 1 << bit,
            Mutation::Truncate { keep } => bytes.truncate(keep % len),
            Mutation::Overwrite { at, bytes: b } => {
                let at = at % len;
                let end = (at + 4).min(len);
                bytes[at..end].copy_from_slice(&b[..end - at]);
            }
        }
    }
}

fn mutated_reads_never_panic(format: Format, muts: &[Mutation]) {
    let dir = tempfile::tempdir().unwrap();
    let path = valid_file(dir.path(), format);
    let mut bytes = std::fs::read(&path).unwrap();
    apply(&mut bytes, muts);
    std::fs::write(&path, &bytes).unwrap();
    if let Some(err) = open_and_read(dir.path()) {
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(err.contains(name) || err.contains("schema.json"), "error does not name the file: {err}");
    }
}

/// Files the real tools wrote (tests/fixtures), one of them mutated: `files` of fixture
/// `fixture` are copied to a new directory and the first is mutated. Opening and reading
/// every row (packed, with `pack`) must not panic, and an error names one of the files.
fn mutated_fixture_reads_never_panic(fixture: &str, files: &[&str], pack: Option<&str>, muts: &[Mutation]) {
    let dir = tempfile::tempdir().unwrap();
    for f in files {
        std::fs::copy(fixtures().join(fixture).join(f), dir.path().join(f)).unwrap();
    }
    let path = dir.path().join(files[0]);
    let mut bytes = std::fs::read(&path).unwrap();
    apply(&mut bytes, muts);
    std::fs::write(&path, &bytes).unwrap();
    let options = DatasetOptions { pack: pack.map(|p| p.parse().unwrap()), ..Default::default() };
    if let Some(err) = open_and_read_with(dir.path(), options) {
        assert!(files.iter().any(|f| err.contains(f)), "{fixture}: error does not name the file: {err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn mutated_parquet_files(muts in prop::collection::vec(mutation(), 1..4)) {
        mutated_fixture_reads_never_panic("parquet", &["part-0.parquet"], None, &muts);
        mutated_fixture_reads_never_panic("parquet_lists", &["train-00000-of-00002.parquet"], None, &muts);
    }

    #[test]
    fn mutated_arrow_streams_and_compressed_files(muts in prop::collection::vec(mutation(), 1..4)) {
        mutated_fixture_reads_never_panic("arrow_lists", &["data-00000-of-00002.arrow"], None, &muts);
        mutated_fixture_reads_never_panic("arrow_lz4", &["part-0.feather"], None, &muts);
        mutated_fixture_reads_never_panic("arrow_zstd", &["part-1.arrow"], None, &muts);
    }

    #[test]
    fn mutated_webdataset_shards(muts in prop::collection::vec(mutation(), 1..4)) {
        mutated_fixture_reads_never_panic("wds", &["shard-000000.tar"], None, &muts);
    }

    #[test]
    fn mutated_megatron_indexes_and_tokens(muts in prop::collection::vec(mutation(), 1..4)) {
        for (first, second) in [("corpus-0.idx", "corpus-0.bin"), ("corpus-0.bin", "corpus-0.idx")] {
            mutated_fixture_reads_never_panic("megatron", &[first, second], None, &muts);
            let pack = Some("tokens:8,eos=0,position_ids,cu_seqlens");
            mutated_fixture_reads_never_panic("megatron", &[first, second], pack, &muts);
        }
        let pack = Some("tokens:8,cu_seqlens");
        mutated_fixture_reads_never_panic("parquet_lists", &["train-00001-of-00002.parquet"], pack, &muts);
    }

    #[test]
    fn mutated_npy_files(muts in prop::collection::vec(mutation(), 1..4)) {
        mutated_reads_never_panic(Format::Npy, &muts);
    }

    #[test]
    fn mutated_arrow_files(muts in prop::collection::vec(mutation(), 1..4)) {
        mutated_reads_never_panic(Format::Arrow, &muts);
    }

    #[test]
    fn mutated_raw_files(muts in prop::collection::vec(mutation(), 1..3)) {
        mutated_reads_never_panic(Format::Raw, &muts);
    }

    #[test]
    fn raw_schemas_are_parsed_safely(text in ".{0,200}") {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.raw"), [0u8; 64]).unwrap();
        std::fs::write(dir.path().join("schema.json"), &text).unwrap();
        if let Some(err) = open_and_read(dir.path()) {
            prop_assert!(err.contains("schema.json") || err.contains("a.raw"), "{}", err);
        }
    }

    #[test]
    fn spec_parsers_never_panic(s in "\\PC{0,40}", t in "[a-z+,=0-9\\-]{0,30}") {
        for line in [&s, &t] {
            specs_never_panic(line);
            for f in ["x", "t", "q"] {
                specs_never_panic(&format!("{f}={line}"));
            }
        }
    }

    #[test]
    fn npy_preambles_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut with_magic = b"\x93NUMPY\x01\x00".to_vec();
        with_magic.extend(&bytes);
        let _ = meshfeed::dataset::npy_header::parse_preamble(&bytes);
        let _ = meshfeed::dataset::npy_header::parse_preamble(&with_magic);
    }
}

/// Fixed fixtures: the classic corruptions of each format give a clear error.
#[test]
fn truncated_flipped_and_oversized_headers_of_every_format() {
    let cases: Vec<(Format, &str, Box<dyn Fn(&mut Vec<u8>)>, &str)> = vec![
        (Format::Npy, "truncated data", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() - 3)), "truncated"),
        (Format::Npy, "truncated header", Box::new(|b: &mut Vec<u8>| b.truncate(20)), "truncated header"),
        (Format::Npy, "flipped magic", Box::new(|b: &mut Vec<u8>| b[1] ^= 0x20), "not a .npy file"),
        (
            Format::Npy,
            "oversized header length",
            Box::new(|b: &mut Vec<u8>| {
                b[6] = 2;
                b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
            }),
            "exceeds",
        ),
        (
            Format::Npy,
            "header claims too many samples",
            Box::new(|b: &mut Vec<u8>| {
                let text = String::from_utf8_lossy(&b[10..]).into_owned();
                let pos = text.find("(40,)").unwrap() + 10;
                b[pos..pos + 5].copy_from_slice(b"(99,)");
            }),
            "truncated",
        ),
        (Format::Arrow, "truncated", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() / 2)), "corrupt"),
        (Format::Arrow, "flipped magic", Box::new(|b: &mut Vec<u8>| b[0] ^= 1), "not an Arrow IPC file"),
        (
            Format::Arrow,
            "oversized footer length",
            Box::new(|b: &mut Vec<u8>| {
                let n = b.len();
                b[n - 10..n - 6].copy_from_slice(&i32::MAX.to_le_bytes());
            }),
            "footer length",
        ),
        (Format::Raw, "truncated", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() - 1)), "not a whole number"),
        (Format::Hdf5, "truncated", Box::new(|b: &mut Vec<u8>| b.truncate(b.len() / 3)), "part-00000.h5"),
        (Format::Hdf5, "flipped signature", Box::new(|b: &mut Vec<u8>| b[1] ^= 0x40), "cannot open as HDF5"),
    ];
    for (format, what, corrupt, needle) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = valid_file(dir.path(), format);
        let mut bytes = std::fs::read(&path).unwrap();
        corrupt(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        let err = open_and_read(dir.path()).unwrap_or_else(|| panic!("{format:?} {what}: no error"));
        assert!(err.contains(needle), "{format:?} {what}: {err}");
        assert!(err.contains(path.file_name().unwrap().to_str().unwrap()), "{format:?} {what}: {err}");
    }
}

/// HDF5 is parsed by the C library: mutated files go through the binary in a separate
/// process, so that a crash would show as a failure here instead of killing the tests.
#[test]
fn mutated_hdf5_files_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let path = valid_file(dir.path(), Format::Hdf5);
    let clean = std::fs::read(&path).unwrap();
    let mut rng = 0x9e3779b97f4a7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for case in 0..40 {
        let mut bytes = clean.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] ^= 1 << (next() % 8);
        }
        if case % 5 == 0 {
            bytes.truncate((next() % bytes.len() as u64) as usize);
        }
        std::fs::write(&path, &bytes).unwrap();
        let run = crate::common::meshfeed(&["inspect", "--data", dir.path().to_str().unwrap()]);
        assert!(run.code == 0 || run.code == 1, "case {case}: exit {} (crash?)\n{}", run.code, run.stderr);
        if run.code == 1 {
            assert!(run.stderr.contains("part-00000.h5"), "case {case}: {}", run.stderr);
        }
    }
}

/// Every input the fuzzers keep (tests/fuzz/corpus) or found crashing (tests/fuzz/artifacts)
/// is replayed on stable Rust: an error or a clean read, never a panic.
#[test]
fn fuzz_corpus_and_crash_inputs_replay_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut replayed = 0;
    for (target, name) in [("npy_file", "x.npy"), ("arrow_file", "x.arrow")] {
        for kind in ["corpus", "artifacts"] {
            let Ok(entries) = std::fs::read_dir(root.join(kind).join(target)) else { continue };
            for entry in entries {
                let path = entry.unwrap().path();
                let dir = tempfile::tempdir().unwrap();
                std::fs::copy(&path, dir.path().join(name)).unwrap();
                let outcome = std::panic::catch_unwind(|| open_and_read(dir.path()));
                assert!(outcome.is_ok(), "{} panicked", path.display());
                replayed += 1;
            }
        }
    }
    assert!(replayed >= 10, "expected the kept corpus to be replayed, found {replayed} inputs");
}

/// Every spec parser on one input line (as a flag value or a job file value would give
/// it), then what parses through validation against a mesh and fields.
fn specs_never_panic(line: &str) {
    use meshfeed::config::{parse_pair, ByteSize, MeshSpec, ShardSpec, Stage};
    use meshfeed::plan::{sharding, Mesh};
    use std::collections::BTreeMap;
    let fields = vec![
        Field::tensor("x", DType::F32, vec![4, 6]),
        Field { name: "t".into(), kind: FieldKind::Bytes { utf8: true, elem: None } },
    ];
    let fixed = Mesh::from_spec(&"dp=2,tp=2,pp=2".parse::<MeshSpec>().unwrap());
    let mut meshes = vec![fixed];
    if let Ok(m) = line.parse::<MeshSpec>() {
        let mesh = Mesh::from_spec(&m);
        if mesh.check_world(8, 1).is_ok() {
            meshes.push(mesh);
        }
    }
    let _ = gen::parse_field(line);
    let _ = line.parse::<ByteSize>();
    let _ = meshfeed::dataset::npy_header::parse_py_literal(line);
    let stages: BTreeMap<String, Stage> = parse_pair::<Stage>(line).into_iter().collect();
    let shards: BTreeMap<String, ShardSpec> = parse_pair::<ShardSpec>(line).into_iter().collect();
    for mesh in &meshes {
        let _ = sharding::resolve(mesh, &fields, 8, &shards, &stages);
    }
}

/// The spec fuzzer's kept and crashing inputs, line by line, through every parser.
#[test]
fn fuzz_spec_inputs_replay_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut lines = 0;
    for kind in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(root.join(kind).join("specs")) else { continue };
        for entry in entries {
            let text = String::from_utf8_lossy(&std::fs::read(entry.unwrap().path()).unwrap()).into_owned();
            for line in text.lines() {
                specs_never_panic(line);
                lines += 1;
            }
        }
    }
    assert!(lines > 0, "no spec inputs found");
}
