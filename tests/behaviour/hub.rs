//! Data as it sits on the Hub loads (issue 42, item 6): files written by Hugging Face
//! `datasets` (`save_to_disk`: Arrow IPC streams; `to_parquet`) and by pandas (`to_parquet`,
//! `to_feather`: LZ4-compressed Arrow) whose columns are plain numbers beside booleans,
//! nullable numbers, text, lists of text and structs.
//!
//! * `--fields` of the plain columns reads them, whatever the other columns hold: the
//!   delivered ids and bytes are the values Python wrote (also at 2 ranks).
//! * A boolean column is delivered as one byte per value, 0 or 1.
//! * A nullable column is delivered with `--nulls FIELD=fill:VALUE` (nulls as the value) or
//!   `--nulls FIELD=mask` (nulls as zeros, and `FIELD_valid`: 1 present, 0 null).
//! * Without a policy, nulls in a delivered column are an error naming the file, the column
//!   and both ways out; without `--fields`, an unsupported column is an error naming it and
//!   `--fields`; a policy for a field not delivered is refused, naming it.

use std::collections::BTreeMap;
use std::path::Path;

use crate::common::*;

const ROWS: u64 = 40;

/// Writes the datasets of every tool into `d`: `hf_disk` (save_to_disk, two shards),
/// `hf_parquet`, `pd_parquet`, `pd_feather`. Row `i` holds the values [`value`] gives.
fn write_hub_files(d: &Path) {
    let script = r#"
import os, sys
import datasets, pandas as pd
d = sys.argv[1]
n = 40
rows = {
    "x": [i * 0.5 for i in range(n)],
    "y": [i * 3 - 7 for i in range(n)],
    "flag": [i % 3 == 0 for i in range(n)],
    "maybe_i": [None if i % 4 == 1 else i * 10 for i in range(n)],
    "maybe_f": [None if i % 5 == 2 else i / 4 for i in range(n)],
    "text": [f"row {i}" for i in range(n)],
    "tags": [[f"t{i}", "u"] for i in range(n)],
    "meta": [{"a": i, "b": str(i)} for i in range(n)],
}
List = getattr(datasets, "List", datasets.Sequence)
features = datasets.Features({
    "x": datasets.Value("float32"), "y": datasets.Value("int64"), "flag": datasets.Value("bool"),
    "maybe_i": datasets.Value("int64"), "maybe_f": datasets.Value("float64"),
    "text": datasets.Value("string"), "tags": List(datasets.Value("string")),
    "meta": {"a": datasets.Value("int64"), "b": datasets.Value("string")},
})
ds = datasets.Dataset.from_dict(rows, features=features)
ds.save_to_disk(f"{d}/hf_disk", num_shards=2)
os.makedirs(f"{d}/hf_parquet")
ds.to_parquet(f"{d}/hf_parquet/part-0.parquet")
df = pd.DataFrame({
    "x": pd.Series(rows["x"], dtype="float32"), "y": pd.Series(rows["y"], dtype="int64"),
    "flag": pd.Series(rows["flag"], dtype="bool"),
    "maybe_i": pd.Series(rows["maybe_i"], dtype="Int64"),
    "maybe_f": pd.Series(rows["maybe_f"], dtype="Float64"),
    "text": rows["text"], "tags": rows["tags"], "meta": rows["meta"],
})
os.makedirs(f"{d}/pd_parquet"); os.makedirs(f"{d}/pd_feather")
df.to_parquet(f"{d}/pd_parquet/part-0.parquet")
df.to_feather(f"{d}/pd_feather/part-0.feather")
arrow = sorted(f for f in os.listdir(f"{d}/hf_disk") if f.endswith(".arrow"))
assert len(arrow) == 2, arrow
"#;
    let out = std::process::Command::new(python()).args(["-c", script, d.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

/// The datasets [`write_hub_files`] writes.
const DIRS: [&str; 4] = ["hf_disk", "hf_parquet", "pd_parquet", "pd_feather"];

/// The bytes meshfeed delivers for field `field` of row `i` (nulls as the tests' policies
/// say: `maybe_i` filled with -1, `maybe_f` masked).
fn value(field: &str, i: u64) -> Vec<u8> {
    match field {
        "x" => (i as f32 * 0.5).to_le_bytes().to_vec(),
        "y" => (i as i64 * 3 - 7).to_le_bytes().to_vec(),
        "flag" => vec![u8::from(i % 3 == 0)],
        "maybe_i" => (if i % 4 == 1 { -1 } else { i as i64 * 10 }).to_le_bytes().to_vec(),
        "maybe_f" => (if i % 5 == 2 { 0.0 } else { i as f64 / 4.0 }).to_le_bytes().to_vec(),
        "maybe_f_valid" => vec![u8::from(i % 5 != 2)],
        other => panic!("no expected value for {other}"),
    }
}

/// Runs `--fields fields` (plus `extra`) over `dir` at `np` ranks with a dump, and checks
/// that every row is delivered once with the bytes [`value`] gives for each of `want`
/// (the delivered fields, in order).
fn loads(root: &Path, dir: &str, np: usize, fields: &str, extra: &[&str], want: &[&str]) {
    let dump = root.join(format!("dump-{dir}-{np}-{}", fields.replace(',', "_")));
    let run = Job::new(root.join(dir)).batch(8).dump(&dump).args(["--fields", fields]).args(extra.iter()).mpirun(np);
    ok(&run);
    let mut seen: BTreeMap<u64, BTreeMap<String, u32>> = BTreeMap::new();
    for (_, rows) in global_batches(&read_dump(&dump, np)) {
        for (id, crcs) in rows {
            assert!(seen.insert(id, crcs).is_none(), "{dir}: row {id} delivered twice");
        }
    }
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), (0..ROWS).collect::<Vec<_>>(), "{dir}: every row once");
    for (id, crcs) in &seen {
        let names: Vec<&str> = crcs.keys().map(String::as_str).collect();
        let mut sorted = want.to_vec();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "{dir}: the fields delivered");
        for f in want {
            assert_eq!(crcs[*f], crc32fast::hash(&value(f, *id)), "{dir} ({fields} {extra:?}): field {f} of row {id}");
        }
    }
}

/// The plain columns load beside booleans, nullable numbers, text, lists of text and
/// structs, from every tool's files; `hf_disk` (two IPC streams) also at two ranks.
#[test]
fn hub_files_load_with_fields_beside_unsupported_columns() {
    let out = tempdir();
    write_hub_files(out.path());
    for dir in DIRS {
        loads(out.path(), dir, 1, "x,y", &[], &["x", "y"]);
    }
    loads(out.path(), "hf_disk", 2, "y,x", &[], &["x", "y"]);
    loads(out.path(), "pd_feather", 2, "x,y", &[], &["x", "y"]);
}

/// Booleans are one byte per value; nullable columns load with a fill value and with a
/// mask (the validity field right after its field), from every tool's files.
#[test]
fn booleans_and_nullable_columns_load_with_fill_and_mask() {
    let out = tempdir();
    write_hub_files(out.path());
    for dir in DIRS {
        loads(out.path(), dir, 1, "y,flag", &[], &["y", "flag"]);
        let nulls = ["--nulls", "maybe_i=fill:-1", "--nulls", "maybe_f=mask"];
        loads(out.path(), dir, 1, "maybe_i,maybe_f", &nulls, &["maybe_i", "maybe_f", "maybe_f_valid"]);
    }
    let nulls = ["--nulls", "maybe_i=fill:-1", "--nulls", "maybe_f=mask"];
    loads(out.path(), "hf_disk", 2, "flag,maybe_f,maybe_i", &nulls, &["flag", "maybe_f", "maybe_f_valid", "maybe_i"]);
    // The order delivered: the validity field follows its field.
    let dump = out.path().join("order");
    let run = Job::new(out.path().join("pd_feather"))
        .batch(8)
        .dump(&dump)
        .args(["--fields", "maybe_f,y", "--nulls", "maybe_f=mask"])
        .mpirun(1);
    ok(&run);
    let first = std::fs::read_to_string(dump.join("rank-0.jsonl")).unwrap();
    let line = first.lines().next().unwrap();
    let at = |k: &str| line.find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("{k} in {line}"));
    assert!(at("maybe_f") < at("maybe_f_valid") && at("maybe_f_valid") < at("y"), "{line}");
}

/// What is refused, and how: nulls without a policy (naming the file, the column and the
/// ways out), an unsupported column without `--fields` (naming it and `--fields`), a
/// policy for a field not delivered, a fill value not of the field's dtype.
#[test]
fn nulls_without_a_policy_and_unsupported_columns_are_refused_naming_the_way_out() {
    let out = tempdir();
    write_hub_files(out.path());
    for (dir, file, place) in [
        ("hf_disk", "data-00000-of-00002.arrow", "record batch 0"),
        ("hf_parquet", "part-0.parquet", "row group 0"),
        ("pd_parquet", "part-0.parquet", "row group 0"),
        ("pd_feather", "part-0.feather", "record batch 0"),
    ] {
        let run = Job::new(out.path().join(dir)).batch(8).args(["--fields", "x,maybe_i"]).mpirun(1);
        assert_ne!(run.code, 0, "{dir}: nulls must not load silently:\n{}", run.stdout);
        let line = error_line(&run, 0);
        assert!(line.contains(file) && line.contains(&format!("column 'maybe_i' has nulls in {place}")), "{line}");
        assert!(line.contains("--nulls maybe_i=mask") && line.contains("--nulls maybe_i=fill:VALUE"), "{line}");

        let run = Job::new(out.path().join(dir)).batch(8).mpirun(1);
        assert_ne!(run.code, 0, "{dir}: a list of text cannot be delivered:\n{}", run.stdout);
        let line = error_line(&run, 0);
        assert!(line.contains(file) && line.contains("column 'tags'"), "{line}");
        assert!(
            line.contains("--fields can leave it out (e.g. --fields x,y,flag,maybe_i,maybe_f,text,meta)"),
            "{line}"
        );

        let run = Job::new(out.path().join(dir)).batch(8).args(["--fields", "x,y", "--nulls", "zz=mask"]).mpirun(1);
        assert_ne!(run.code, 0);
        let line = error_line(&run, 0);
        assert!(line.contains("--nulls names field 'zz', which is not delivered (fields: x, y)"), "{line}");

        let run = Job::new(out.path().join(dir))
            .batch(8)
            .args(["--fields", "maybe_i", "--nulls", "maybe_i=fill:0.5"])
            .mpirun(1);
        assert_ne!(run.code, 0);
        let line = error_line(&run, 0);
        assert!(line.contains("'0.5' is not a value of dtype i64 (field 'maybe_i')"), "{line}");
    }
    // A policy that is neither mask nor fill is the command line's error.
    let data = out.path().join("hf_disk");
    let run = meshfeed(&["run", "--data", data.to_str().unwrap(), "--batch-size", "8", "--nulls", "x=zero"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("expected mask or fill:VALUE"), "{}", run.stderr);
}
