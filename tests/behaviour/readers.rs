//! Readers keep their memory bound and accept what the tools write (issue 41, item 6), with
//! files written by the tools themselves: Python's `tarfile`, pyarrow, pandas and
//! megatron-core.
//!
//! * A WebDataset shard cut exactly between two members (no end-of-archive blocks) is
//!   refused naming the shard; one cut inside the padding after the marker reads whole.

use std::path::Path;

use crate::common::*;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `script` with the test venv's Python, `d` (the output directory) as its first
/// argument; returns its stdout.
fn py(dir: &Path, script: &str) -> String {
    let out = std::process::Command::new(python()).args(["-c", script, s(dir)]).output().unwrap();
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The last epoch's summary of a successful run.
fn summary(run: &Run) -> serde_json::Value {
    ok(run);
    serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap()
}

/// A shard of 40 samples (`.cls` and `.txt` members) written by `tarfile` (as
/// `webdataset.TarWriter` writes them), and the same shard cut at the start of sample 20's
/// first member (no end-of-archive marker: every header before the cut reads) and inside
/// the record padding after the marker.
#[test]
fn a_webdataset_shard_cut_between_members_is_refused_naming_it() {
    let out = tempdir();
    let offsets = py(
        out.path(),
        r#"
import io, os, sys, tarfile
d = sys.argv[1]
os.makedirs(d + "/whole"); os.makedirs(d + "/cut"); os.makedirs(d + "/padding")
path = d + "/whole/shard-0.tar"
with tarfile.open(path, "w") as t:
    for i in range(40):
        for ext, data in (("cls", str(i % 10).encode()), ("txt", b"sample %d" % i * 50)):
            info = tarfile.TarInfo(f"{i:06d}.{ext}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
with tarfile.open(path) as t:
    members = t.getmembers()
    cut = members[40].offset  # sample 20's first header
    end = members[-1].offset_data + (members[-1].size + 511) // 512 * 512
data = open(path, "rb").read()
assert len(data) % 10240 == 0 and len(data) > end + 1024, (len(data), end)
open(d + "/cut/shard-0.tar", "wb").write(data[:cut])
open(d + "/padding/shard-0.tar", "wb").write(data[:end + 1024 + 100])
print(cut, end)
"#,
    );
    let cut = offsets.split_whitespace().next().unwrap();
    for dir in ["whole", "padding"] {
        let run = mpirun(2, &["run", "--data", s(&out.path().join(dir)), "--batch-size", "4", "--json"]);
        assert_eq!(summary(&run)["samples"], 40, "{dir}: {}", run.stdout);
    }
    let run = mpirun(2, &["run", "--data", s(&out.path().join("cut")), "--batch-size", "4"]);
    assert_ne!(run.code, 0, "a cut shard must not read as 20 samples:\n{}", run.stdout);
    let line = agreed_failure(&run, 2);
    let want = format!("truncated: the shard ends at byte {cut} after member '000019.txt' without the end-of-archive");
    assert!(line.contains("shard-0.tar") && line.contains(&want), "{line}");
}
