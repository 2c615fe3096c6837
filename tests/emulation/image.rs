//! The container image recipe (`Dockerfile`, `.dockerignore`) checked against the code it
//! packages. No container engine can run here, so nothing is built or pulled: the recipe
//! is parsed, and each of its claims is checked against this machine, a Debian of the
//! same release with the same packages the builder installs:
//!
//! * its build steps are the README's (launch/quickstart.sh's setup and cargo lines), its
//!   toolchain is new enough for the locked dependencies;
//! * its build context (.dockerignore) holds what cargo needs and nothing built here;
//! * its runtime packages own every shared library `ldd` reports for the binary built here;
//! * the Kubernetes manifests run paths that the runtime stage holds;
//! * and the runtime stage's ENTRYPOINT, run from a copy of the files that stage COPYs
//!   (same paths, under a temporary root), as the image's user and with only the image's
//!   and the Job's environment, runs a real 2-rank UCX job, and refuses a bad environment.
//!
//! The recipe may use only the instructions its parser (tests/emulation/recipe.rs) models;
//! anything else fails here, to be taught to the parser first, so that no step escapes the
//! checks. The MPIJob's run on the image is tests/emulation/mpijob.rs.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use crate::common::*;
use crate::recipe::*;

/// A builder stage and a slim runtime of the same Debian release as this machine (the
/// release whose packages and libraries the other checks read), on tagged images.
#[test]
fn stages_are_a_rust_builder_and_a_slim_runtime_of_this_debian() {
    let df = dockerfile();
    let codename = host_codename();
    assert_eq!(df.stages.len(), 2, "two stages, build and runtime");
    let builder = df.builder();
    let (image, tag) = builder.base.split_once(':').expect("the builder's base image has a tag");
    assert_eq!(image, "rust", "the builder starts from the official Rust image (cargo on PATH, as setup.sh needs)");
    assert!(
        tag.ends_with(&format!("-{codename}")),
        "the builder is Debian {codename}, as this machine: {}",
        builder.base
    );
    assert_eq!(df.runtime().base, format!("debian:{codename}-slim"), "the runtime stage is Debian {codename} slim");
    assert!(df.runtime().name.is_some() && builder.name.is_some(), "both stages are named (`--target` can pick one)");
}

/// The builder installs and builds exactly as the README's quickstart does, with a
/// setup.sh mode that exists, and a toolchain new enough for every locked dependency.
#[test]
fn builder_runs_the_readme_setup_and_build_steps() {
    let df = dockerfile();
    let builder = df.builder();
    let quick = std::fs::read_to_string(repo().join("launch/quickstart.sh")).unwrap();
    let step = |prefix: &str| -> String {
        let found: Vec<&str> = quick.lines().map(str::trim).filter(|l| l.starts_with(prefix)).collect();
        assert_eq!(found.len(), 1, "launch/quickstart.sh has one `{prefix} ...` line: {found:?}");
        found[0].split_whitespace().collect::<Vec<_>>().join(" ")
    };
    let (setup, build) = (step("bash launch/setup.sh"), step("cargo build"));

    let runs: Vec<(usize, String)> =
        builder.all("RUN").flat_map(|i| run_commands(i).into_iter().map(move |c| (i.line, c))).collect();
    let setup_at = runs
        .iter()
        .find(|(_, c)| *c == setup)
        .unwrap_or_else(|| panic!("the builder runs the quickstart's `{setup}`: {runs:?}"))
        .0;
    let build_at = runs
        .iter()
        .find(|(_, c)| {
            c.starts_with("cargo build") && build.split_whitespace().all(|w| c.split_whitespace().any(|x| x == w))
        })
        .unwrap_or_else(|| panic!("the builder runs the quickstart's `{build}` (more flags allowed): {runs:?}"))
        .0;
    assert!(setup_at < build_at, "setup.sh runs before cargo build");

    // Every option given to setup.sh is a mode the script tests for.
    let script = std::fs::read_to_string(repo().join("launch/setup.sh")).unwrap();
    for w in setup.split_whitespace().filter(|w| w.starts_with('-')) {
        assert!(script.contains(&format!("\"{w}\"")), "launch/setup.sh has no mode {w}");
    }
    // setup.sh is in the builder when it runs (copied before, at the path it is run by).
    let setup_run = builder.all("RUN").find(|i| i.line == setup_at).unwrap();
    let script_at = abs_join(&setup_run.workdir, "launch/setup.sh");
    assert!(
        layout(df, builder, setup_at).files.contains_key(&script_at),
        "Dockerfile:{setup_at}: {script_at} is not copied into the build stage before it runs"
    );

    // RUST_VERSION: at least the rust-version of every locked package (for this platform).
    let host = output(Command::new("rustc").arg("-vV"), "rustc -vV");
    let triple = host.lines().find_map(|l| l.strip_prefix("host: ")).unwrap().to_string();
    let meta = output(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["metadata", "--offline", "--locked", "--format-version", "1", "--filter-platform", &triple])
            .current_dir(repo()),
        "cargo metadata",
    );
    let meta: serde_json::Value = serde_json::from_str(&meta).unwrap();
    let version = |s: &str| -> Vec<u64> { s.split('.').map(|x| x.parse().unwrap()).collect() };
    let (need, who) = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["rust_version"].as_str().map(|v| (version(v), p["name"].as_str().unwrap().to_string())))
        .max()
        .expect("rust-version is declared");
    let have = df.args.get("RUST_VERSION").expect("ARG RUST_VERSION=<toolchain> before the first FROM");
    assert!(builder.base.contains(&format!(":{have}-")), "the builder uses RUST_VERSION: {}", builder.base);
    assert!(version(have) >= need, "RUST_VERSION {have} is older than {who}'s rust-version {need:?}");
}

/// The build context sends what the build needs (cargo's workspace with every target and
/// lock, files included by the sources, every COPY source) and nothing this checkout
/// built or ignores (target/, virtual environments, datasets).
#[test]
fn build_context_holds_the_workspace_and_nothing_built_here() {
    let df = dockerfile();
    // First (cheap, and before a leaky context is walked): nothing git ignores here
    // (build outputs, venvs, datasets, caches) reaches the engine.
    let ignored = output(
        Command::new("git")
            .args(["ls-files", "--others", "--ignored", "--exclude-standard", "--directory"])
            .current_dir(repo()),
        "git ls-files (the test needs the git checkout)",
    );
    let ig = dockerignore();
    let leaked: Vec<&str> = ignored.lines().map(|l| l.trim_end_matches('/')).filter(|l| !ig.excluded(l)).collect();
    assert!(leaked.is_empty(), "the build context sends paths git ignores (add them to .dockerignore): {leaked:?}");
    assert!(ig.excluded("target/release/meshfeed"), "a host build never reaches the image's build");

    for st in &df.stages {
        for c in st.copies().iter().filter(|c| c.from.is_none()) {
            for s in &c.srcs {
                context_source(s, c.line);
            }
        }
    }

    // What the build stage holds when cargo builds: cargo reads every manifest, target
    // and the lock of the workspace first, as `cargo fetch --locked --offline` does: run
    // it there, in a copy of those files.
    let builder = df.builder();
    let cargo = cargo_build(builder);
    let files = layout(df, builder, cargo.line).files;
    let root = tempdir();
    for (dest, host) in &files {
        let to = root.path().join(dest.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(host, &to).unwrap();
    }
    let host = output(Command::new("rustc").arg("-vV"), "rustc -vV");
    let triple = host.lines().find_map(|l| l.strip_prefix("host: ")).unwrap().to_string();
    let workdir = root.path().join(cargo.workdir.trim_start_matches('/'));
    std::fs::create_dir_all(&workdir).unwrap();
    output(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["fetch", "--offline", "--locked", "--target", &triple])
            .current_dir(&workdir),
        &format!("cargo fetch --locked in the build stage's {} (Dockerfile:{})", cargo.workdir, cargo.line),
    );

    // Files the sources include at compile time (the README is the library's docs).
    let mut included = 0;
    for (f, host) in files.iter().filter(|(f, _)| f.ends_with(".rs")) {
        let text = std::fs::read_to_string(host).unwrap();
        for mac in ["include_str!(\"", "include_bytes!(\""] {
            for (i, _) in text.match_indices(mac) {
                let lit = &text[i + mac.len()..];
                let lit = &lit[..lit.find('"').unwrap()];
                let target = abs_join(f.rsplit_once('/').unwrap().0, lit);
                assert!(files.contains_key(&target), "{f} includes {lit} ({target}), which the build stage lacks");
                included += 1;
            }
        }
    }
    assert!(included > 0, "the scan found the library's include_str!(README) (else it scans nothing)");
}

/// Every shared library the binary loads (`ldd`, transitively) belongs to a package the
/// runtime image has: the base (Essential and its dependencies), or the runtime stage's
/// packages and their dependencies. The packages are runtime ones of this release.
#[test]
fn runtime_packages_provide_every_library_the_binary_loads() {
    let df = dockerfile();
    let db = dpkg();
    let listed = runtime_packages(df);
    for p in &listed {
        assert!(db.installed.contains_key(p), "runtime package {p} is not installed here: not a package of this release, or not what the builder links against");
        assert!(!p.ends_with("-dev"), "runtime package {p}: headers and static libraries belong in the builder");
    }
    let ldd = output(Command::new("ldd").arg(bin()), "ldd");
    assert!(!ldd.contains("not found"), "the binary built here misses libraries:\n{ldd}");
    let libs: Vec<PathBuf> = ldd
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = l.split_once("=> ").map(|(_, r)| r).unwrap_or(l);
            let path = path.split(" (").next().unwrap().trim();
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect();
    assert!(libs.len() > 5, "ldd listed the libraries:\n{ldd}");
    let image = image_packages(df);
    let mut missing = Vec::new();
    for (lib, pkgs) in owners(&libs) {
        assert!(
            !pkgs.is_empty(),
            "{} belongs to no Debian package (a local build?): the image cannot get it",
            lib.display()
        );
        if pkgs.is_disjoint(&image) {
            missing.push(format!("{} ({})", lib.display(), pkgs.into_iter().collect::<Vec<_>>().join(", ")));
        }
    }
    assert!(missing.is_empty(), "libraries the runtime stage's packages do not bring: {missing:?}");
}

/// Common container lint rules (hadolint's), checked by reading the recipe.
#[test]
fn dockerfile_follows_the_usual_lint_rules() {
    let df = dockerfile();
    let stage_names: BTreeSet<&str> = df.stages.iter().filter_map(|s| s.name.as_deref()).collect();
    let mut bad = Vec::new();
    for st in &df.stages {
        if !stage_names.contains(st.base.as_str()) {
            match st.base.rsplit_once(':') {
                Some((_, tag)) if tag != "latest" && !tag.contains('/') => {}
                _ => bad.push(format!("DL3006/DL3007: FROM {} needs an explicit, non-latest tag", st.base)),
            }
        }
        for i in st.all("RUN") {
            let cmds = run_commands(i);
            if cmds.iter().any(|c| c.starts_with("cd ")) {
                bad.push(format!("DL3003: line {}: use WORKDIR, not cd", i.line));
            }
            if cmds.iter().any(|c| c.split_whitespace().any(|w| w == "sudo")) {
                bad.push(format!("DL3004: line {}: no sudo", i.line));
            }
            if cmds.iter().any(|c| c.split_whitespace().any(|w| w == "apt")) {
                bad.push(format!("DL3027: line {}: apt-get, not apt", i.line));
            }
            if i.args.replace("||", "").contains('|') {
                bad.push(format!("DL4006: line {}: a pipe hides failures without pipefail", i.line));
            }
            for c in cmds.iter().filter(|c| c.contains("apt-get install")) {
                if !c.contains("--no-install-recommends") {
                    bad.push(format!("DL3015: line {}: apt-get install --no-install-recommends", i.line));
                }
                if !c.split_whitespace().any(|w| w == "-y" || w == "--yes") {
                    bad.push(format!("DL3014: line {}: apt-get install -y", i.line));
                }
                if !cmds.iter().any(|c| c.starts_with("rm -rf /var/lib/apt/lists")) {
                    bad.push(format!("DL3009: line {}: remove /var/lib/apt/lists in the same RUN", i.line));
                }
            }
        }
    }
    let rt = df.runtime();
    match rt.last("USER").map(|u| u.args.clone()) {
        Some(u) => {
            let uid = u.split(':').next().unwrap();
            if uid.parse::<u32>().map_or(true, |n| n == 0) {
                bad.push(format!("DL3002: USER {u}: a numeric, non-root user (so runAsNonRoot can be verified)"));
            }
        }
        None => bad.push("DL3002: the runtime stage sets no USER (it would run as root)".into()),
    }
    match rt.last("ENTRYPOINT") {
        Some(e) if serde_json::from_str::<Vec<String>>(&e.args).is_ok() => {}
        _ => bad.push("DL3025: ENTRYPOINT in JSON (exec) form, so signals reach meshfeed".into()),
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The Kubernetes manifests run this image as it is: for every container of theirs that
/// names the image the Dockerfile builds, the working directory is the image's, and the
/// program it runs is a file of the image (copied by the recipe, or brought by one of its
/// packages).
#[test]
fn manifests_run_what_the_image_holds() {
    let df = dockerfile();
    let tag = df.tag();
    let layout = runtime_layout(df);
    let image = image_packages(df);
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(repo().join("launch/k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    manifests.sort();

    fn containers<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        match v {
            serde_json::Value::Object(o) => {
                if o.get("image").is_some_and(|i| i.is_string()) && o.contains_key("name") {
                    out.push(v);
                }
                o.values().for_each(|x| containers(x, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| containers(x, out)),
            _ => {}
        }
    }
    let path = rt_path(df);
    let in_image = |prog: &str| -> Result<(), String> {
        let candidates: Vec<String> = if prog.starts_with('/') {
            vec![prog.to_string()]
        } else {
            path.split(':').map(|d| format!("{}/{prog}", d.trim_end_matches('/'))).collect()
        };
        if candidates.iter().any(|c| layout.files.contains_key(c)) {
            return Ok(());
        }
        let on_host: Vec<PathBuf> = candidates.iter().map(PathBuf::from).filter(|p| p.exists()).collect();
        let owned = owners(&on_host);
        if owned.values().any(|pkgs| !pkgs.is_disjoint(&image)) {
            return Ok(());
        }
        Err(format!("{prog}: neither copied by the Dockerfile nor in its packages (owners here: {owned:?})"))
    };

    let mut checked = 0;
    let mut bad = Vec::new();
    for manifest in &manifests {
        let file = manifest.display();
        let docs = serde_json::Value::Array(yaml_docs(manifest));
        let mut found = Vec::new();
        containers(&docs, &mut found);
        for c in found.into_iter().filter(|c| c["image"] == tag.as_str()) {
            checked += 1;
            let name = c["name"].as_str().unwrap_or("?");
            if let Some(wd) = c.get("workingDir").and_then(|w| w.as_str()) {
                if wd != df.runtime().workdir() {
                    bad.push(format!(
                        "{file}: {name}: workingDir {wd}, the image's WORKDIR is {}",
                        df.runtime().workdir()
                    ));
                }
            }
            if let Some(prog) = c.get("command").and_then(|c| c[0].as_str()) {
                if let Err(e) = in_image(prog) {
                    bad.push(format!("{file}: {name}: {e}"));
                }
            }
        }
    }
    assert!(checked > 0, "no container in launch/k8s/*.yaml runs {tag}, the image the Dockerfile builds");
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The Job's environment for pod `index` (launch/k8s/meshfeed-job.yaml's contract, over
/// loopback as launch/k8s/emulate.sh runs it).
fn pod_env(index: usize, world: usize, port: u16, token: &str) -> Vec<(&'static str, String)> {
    vec![
        ("JOB_COMPLETION_INDEX", index.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("MASTER_ADDR", "127.0.0.1".into()),
        ("MASTER_PORT", port.to_string()),
        ("MESHFEED_JOB_TOKEN", token.to_string()),
        ("UCX_TLS", "tcp".into()),
        ("UCX_NET_DEVICES", "lo".into()),
    ]
}

fn token() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("image-test-{:x}-{}", t, std::process::id())
}

/// The image's ENTRYPOINT runs a real 2-rank UCX job as the Indexed Job's pods do (rank
/// from JOB_COMPLETION_INDEX, meshfeed from the image's PATH, as the image's user): every
/// sample of the HDF5 fixture arrives once per epoch with the contents numpy wrote.
#[test]
fn runtime_entrypoint_runs_a_job_from_the_image_layout() {
    let image = Image::new();
    let data = fixtures().join("hdf5");
    let want = expected(&data);
    let out = image.volume("out");
    let dump = out.join("dump");
    let (world, epochs, batch) = (2usize, 2u64, 8u64);
    let port = free_port();
    let token = token();
    let (epochs_s, batch_s) = (epochs.to_string(), batch.to_string());
    let args = [
        "run",
        "--transport",
        "ucx",
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        &batch_s,
        "--epochs",
        &epochs_s,
        "--dump",
        dump.to_str().unwrap(),
    ];
    let ranks: Vec<_> = (0..world)
        .map(|i| image.entrypoint(&args, &pod_env(i, world, port, &token)).spawn().expect("start the entrypoint"))
        .collect();
    let runs: Vec<Run> = ranks.into_iter().enumerate().map(|(i, c)| finish(c, &format!("pod {i}"))).collect();
    for r in &runs {
        ok(r);
    }
    let done = format!("meshfeed: done: {epochs} epoch(s) on {world} ranks");
    assert!(runs[0].stdout.lines().any(|l| l.starts_with(&done)), "rank 0 reports `{done}`:\n{}", runs[0].stdout);

    if as_root() {
        // The ranks ran as the image's user: their files are its.
        use std::os::unix::fs::MetadataExt;
        let (uid, _) = image_user(dockerfile());
        for r in 0..world {
            let owner = std::fs::metadata(dump.join(format!("rank-{r}.jsonl"))).unwrap().uid();
            assert_eq!(owner, uid, "rank {r} ran as uid {owner}, not the image's USER");
        }
    }
    let batches = global_batches(&read_dump(&dump, world));
    for epoch in 0..epochs {
        let rows: Vec<_> = batches.iter().filter(|((e, _), _)| *e == epoch).flat_map(|(_, rows)| rows).collect();
        let ids: BTreeSet<u64> = rows.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids.len(), rows.len(), "epoch {epoch}: a sample arrived twice");
        assert!(ids.iter().all(|id| *id < want.samples), "epoch {epoch}: ids beyond the dataset");
        assert!(rows.len() as u64 + batch > want.samples, "epoch {epoch}: {} of {} samples", rows.len(), want.samples);
        for (id, crcs) in rows {
            let fields: BTreeSet<&String> = crcs.keys().collect();
            assert_eq!(fields, want.fields.iter().collect(), "epoch {epoch}: sample {id}: the dataset's fields");
            for (f, c) in crcs {
                assert_eq!(*c, want.crc32[f][*id as usize], "epoch {epoch}: sample {id}, field {f}");
            }
        }
    }
}

/// Without WORLD_SIZE the entrypoint stops before meshfeed starts: exit 2 (meshfeed's
/// code for a bad command line), one line naming the variable, the token never printed.
#[test]
fn runtime_entrypoint_refuses_a_missing_world_size() {
    let image = Image::new();
    let token = token();
    let env: Vec<_> = pod_env(0, 1, free_port(), &token).into_iter().filter(|(k, _)| *k != "WORLD_SIZE").collect();
    let out = image.volume("out");
    let dump = out.join("dump");
    let data = fixtures().join("hdf5");
    let args = [
        "run",
        "--transport",
        "ucx",
        "--data",
        data.to_str().unwrap(),
        "--batch-size",
        "8",
        "--dump",
        dump.to_str().unwrap(),
    ];
    let run = finish(image.entrypoint(&args, &env).spawn().unwrap(), "entrypoint without WORLD_SIZE");
    assert_eq!(run.code, 2, "exit 2:\n{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line:\n{}", run.stderr);
    assert!(lines[0].starts_with("meshfeed entrypoint:") && lines[0].contains("WORLD_SIZE"), "{}", lines[0]);
    assert!(!run.stderr.contains(&token) && run.stdout.is_empty(), "nothing else, and never the token");
    assert!(!dump.exists(), "meshfeed did not start");
}
