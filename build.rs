// Tiny by design (as in rsmpi): MPI is found by mpi-sys through `mpicc -show`, HDF5 by
// hdf5-sys through pkg-config. We only record the git revision for `meshfeed --version`.
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=MESHFEED_GIT_REV");
    let rev = match std::env::var("MESHFEED_GIT_REV") {
        Ok(rev) if !rev.trim().is_empty() => rev.trim().to_string(),
        _ => git_revision().unwrap_or_else(|| "not built from a git checkout".into()),
    };
    println!("cargo:rustc-env=MESHFEED_GIT_REV={rev}");
}

/// `<short hash> <commit date>`, with `-dirty` after the hash when tracked files differ
/// from the commit; `None` when this crate's directory is not the top of a git checkout
/// (a source archive, a `pip install` of an sdist, a copy inside another repository).
///
/// Reruns when HEAD moves: the checkout's HEAD, the branch it points to and packed-refs
/// are watched (a commit, a checkout, a pull), and the library's sources (they rebuild the
/// library anyway). Edits elsewhere after that do not rerun it: `-dirty` is as of the last
/// rerun. (Watching the index would rebuild the library after every `git status`, which
/// rewrites it.)
fn git_revision() -> Option<String> {
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let git = |args: &[&str]| -> Option<String> {
        // No optional locks: `status` would otherwise rewrite the index, a change to watch.
        let out = Command::new("git").arg("-C").arg(&dir).args(["--no-optional-locks"]).args(args).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let top = git(&["rev-parse", "--show-toplevel"])?;
    if !same_dir(Path::new(&top), &dir) {
        return None;
    }
    // Only files that exist: cargo reruns a build script on every build while a watched
    // path is missing (packed-refs may not exist; a branch may live only in packed-refs).
    let watch = |p: &str| {
        if Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    };
    for name in ["HEAD", "packed-refs"] {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", name]) {
            watch(&path);
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &branch]) {
            watch(&path);
        }
    }
    watch(&dir.join("src").to_string_lossy());
    let described = git(&["show", "-s", "--format=%h %cd", "--date=short", "HEAD"])?;
    let (hash, date) = described.split_once(' ')?;
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(format!("{hash}{} {date}", if dirty { "-dirty" } else { "" }))
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
