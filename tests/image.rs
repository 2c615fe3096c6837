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
//! The recipe may use only the instructions the parser below models; anything else fails
//! here, to be taught to the test first, so that no step escapes the checks.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::*;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a command to its end; its stdout when it succeeds, else a failure naming it.
fn output(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

// ---------------------------------------------------------------------------------------
// The Dockerfile, as far as the recipe uses it
// ---------------------------------------------------------------------------------------

/// What the parser models. ADD (remote URLs, archives), VOLUME, ONBUILD, SHELL, ... would
/// each change what the image holds or how its steps run in ways not checked here.
const MODELLED: [&str; 9] = ["FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "USER", "ENTRYPOINT", "LABEL"];

/// The PATH of the debian base images (their config sets it), and Docker's default.
const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Clone, Debug)]
struct Instr {
    line: usize,
    kw: String,
    args: String,
    /// The working directory this instruction runs in (WORKDIR before it; `/` by default,
    /// as neither base image sets one).
    workdir: String,
}

#[derive(Debug)]
struct Stage {
    name: Option<String>,
    base: String,
    instrs: Vec<Instr>,
}

#[derive(Debug)]
struct Dockerfile {
    text: String,
    /// ARGs declared before the first FROM, with their defaults.
    args: BTreeMap<String, String>,
    stages: Vec<Stage>,
}

fn dockerfile() -> &'static Dockerfile {
    static DF: OnceLock<Dockerfile> = OnceLock::new();
    DF.get_or_init(|| {
        let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("a Dockerfile at the repository root");
        parse_dockerfile(&text)
    })
}

/// `${NAME}` and `$NAME` from `vars`; an unknown name fails (it would be empty at build time).
fn substitute(s: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, len) = if let Some(b) = after.strip_prefix('{') {
            let end = b.find('}').unwrap_or_else(|| panic!("unclosed ${{ in {s}"));
            (&b[..end], end + 2)
        } else {
            let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            (&after[..end], end)
        };
        out.push_str(vars.get(name).unwrap_or_else(|| panic!("{s}: ${name} is not a declared ARG/ENV")));
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// Joins `path` onto `base` as a container would (`/`-separated, `.` and `..` resolved).
fn abs_join(base: &str, path: &str) -> String {
    let joined = if path.starts_with('/') { path.to_string() } else { format!("{base}/{path}") };
    let mut parts: Vec<&str> = Vec::new();
    for p in joined.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

fn parse_dockerfile(text: &str) -> Dockerfile {
    // Logical lines: comments dropped (inside continuations too, as Docker does), lines
    // ending in a backslash continued.
    let mut logical: Vec<(usize, String)> = Vec::new();
    let mut cur: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let t = raw.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_none()) {
            continue;
        }
        let (body, cont) = match t.strip_suffix('\\') {
            Some(b) => (b.trim_end(), true),
            None => (t, false),
        };
        match &mut cur {
            Some((_, s)) => {
                s.push(' ');
                s.push_str(body);
            }
            None => cur = Some((i + 1, body.to_string())),
        }
        if !cont {
            logical.push(cur.take().unwrap());
        }
    }
    assert!(cur.is_none(), "the Dockerfile ends inside a continued line");

    let mut args = BTreeMap::new();
    let mut stages: Vec<Stage> = Vec::new();
    let mut workdir = String::from("/");
    for (line, l) in logical {
        let (kw, rest) = l.split_once(char::is_whitespace).unwrap_or((&l, ""));
        let (kw, rest) = (kw.to_ascii_uppercase(), rest.trim().to_string());
        assert!(
            MODELLED.contains(&kw.as_str()),
            "Dockerfile:{line}: {kw} is not modelled by tests/image.rs: teach the test what it does first"
        );
        if kw == "FROM" {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let (image, name) = match words[..] {
                [image] => (image, None),
                [image, as_, name] if as_.eq_ignore_ascii_case("as") => (image, Some(name.to_string())),
                _ => panic!("Dockerfile:{line}: FROM {rest}: expected `FROM image [AS name]`"),
            };
            workdir = "/".into();
            stages.push(Stage { name, base: substitute(image, &args), instrs: Vec::new() });
            continue;
        }
        let Some(stage) = stages.last_mut() else {
            assert_eq!(kw, "ARG", "Dockerfile:{line}: only ARG may come before the first FROM");
            let (name, default) = rest.split_once('=').unwrap_or((&rest, ""));
            args.insert(name.to_string(), default.trim_matches('"').to_string());
            continue;
        };
        stage.instrs.push(Instr { line, kw: kw.clone(), args: rest.clone(), workdir: workdir.clone() });
        if kw == "WORKDIR" {
            workdir = abs_join(&workdir, &rest);
        }
    }
    Dockerfile { text: text.to_string(), args, stages }
}

/// One COPY: `COPY [--from=STAGE] SRC... DEST` (shell or JSON form).
#[derive(Debug)]
struct Copy {
    line: usize,
    from: Option<String>,
    srcs: Vec<String>,
    /// Absolute, resolved against the WORKDIR; a trailing `/` kept (a directory).
    dest: String,
}

fn parse_copy(i: &Instr) -> Copy {
    let mut from = None;
    let mut rest = i.args.trim();
    while rest.starts_with("--") {
        let (flag, r) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        match flag.strip_prefix("--from=") {
            Some(stage) => from = Some(stage.to_string()),
            // --chmod/--chown/--link change modes and owners the run below depends on.
            None => panic!("Dockerfile:{}: COPY {flag} is not modelled by tests/image.rs", i.line),
        }
        rest = r.trim_start();
    }
    let mut words: Vec<String> = if rest.starts_with('[') {
        serde_json::from_str(rest).unwrap_or_else(|e| panic!("Dockerfile:{}: COPY {rest}: {e}", i.line))
    } else {
        rest.split_whitespace().map(String::from).collect()
    };
    assert!(words.len() >= 2, "Dockerfile:{}: COPY needs a source and a destination", i.line);
    let dest_raw = words.pop().unwrap();
    for s in &words {
        assert!(!s.contains(['*', '?', '[']), "Dockerfile:{}: COPY source {s}: wildcards are not modelled", i.line);
    }
    if !dest_raw.starts_with('/') {
        // hadolint DL3045: a relative destination depends on a WORKDIR set in this stage.
        assert_ne!(i.workdir, "/", "Dockerfile:{}: COPY to a relative path without a WORKDIR (DL3045)", i.line);
    }
    let mut dest = abs_join(&i.workdir, &dest_raw);
    if dest_raw.ends_with('/') || dest_raw == "." {
        dest.push('/');
    }
    Copy { line: i.line, from, srcs: words, dest }
}

/// The commands of a shell-form RUN, split at `&&`, `;` and newlines.
fn run_commands(i: &Instr) -> Vec<String> {
    assert!(!i.args.starts_with('['), "Dockerfile:{}: exec-form RUN is not modelled", i.line);
    i.args
        .split("&&")
        .flat_map(|s| s.split(';'))
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .collect()
}

impl Dockerfile {
    fn runtime(&self) -> &Stage {
        self.stages.last().expect("a FROM")
    }

    fn stage(&self, name: &str) -> &Stage {
        self.stages
            .iter()
            .find(|s| s.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no stage named {name} (COPY --from names a stage of this file)"))
    }

    /// The build stage: the one the runtime stage copies from.
    fn builder(&self) -> &Stage {
        let froms: BTreeSet<String> = self.runtime().copies().into_iter().filter_map(|c| c.from).collect();
        assert_eq!(froms.len(), 1, "the runtime stage copies from exactly one build stage: {froms:?}");
        self.stage(froms.first().unwrap())
    }

    /// The tag the usage comment builds (`docker build -t TAG .`).
    fn tag(&self) -> String {
        let tags: BTreeSet<&str> = self
            .text
            .lines()
            .filter_map(|l| l.split("build -t ").nth(1))
            .filter_map(|r| r.split_whitespace().next())
            .collect();
        assert_eq!(tags.len(), 1, "the Dockerfile's usage comment builds one tag (`docker build -t TAG .`): {tags:?}");
        tags.first().unwrap().to_string()
    }
}

impl Stage {
    fn all(&self, kw: &str) -> impl Iterator<Item = &Instr> {
        let kw = kw.to_string();
        self.instrs.iter().filter(move |i| i.kw == kw)
    }

    fn copies(&self) -> Vec<Copy> {
        self.all("COPY").map(parse_copy).collect()
    }

    fn last(&self, kw: &str) -> Option<&Instr> {
        self.all(kw).last()
    }

    /// The image's environment: the base's PATH, then this stage's ENV in order.
    fn env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::from([("PATH".to_string(), BASE_PATH.to_string())]);
        for i in self.all("ENV") {
            for word in shell_words(&i.args) {
                let (k, v) = word.split_once('=').unwrap_or_else(|| {
                    panic!("Dockerfile:{}: write ENV as KEY=VALUE (the legacy form is ambiguous)", i.line)
                });
                let v = substitute(v, &env);
                env.insert(k.to_string(), v);
            }
        }
        env
    }

    fn workdir(&self) -> String {
        self.last("WORKDIR").map(|i| abs_join(&i.workdir, &i.args)).unwrap_or_else(|| "/".into())
    }
}

/// Whitespace-separated words, double quotes grouping (ENV values).
fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let (mut cur, mut quoted, mut any) = (String::new(), false, false);
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    assert!(!quoted, "unbalanced quotes in {s}");
    if any {
        words.push(cur);
    }
    words
}

/// The Debian release of this machine: the checks against its packages and libraries
/// hold for an image of the same release only.
fn host_codename() -> String {
    let os = std::fs::read_to_string("/etc/os-release").expect("/etc/os-release");
    os.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .expect("VERSION_CODENAME in /etc/os-release")
}

/// The packages the runtime stage installs (its one `apt-get install`).
fn runtime_packages(df: &Dockerfile) -> Vec<String> {
    let installs: Vec<String> = df
        .runtime()
        .all("RUN")
        .flat_map(run_commands)
        .filter(|c| c.split_whitespace().collect::<Vec<_>>().windows(2).any(|w| w == ["apt-get", "install"]))
        .collect();
    assert_eq!(installs.len(), 1, "the runtime stage installs its packages in one apt-get install: {installs:?}");
    let words: Vec<&str> = installs[0].split_whitespace().collect();
    let at = words.iter().position(|w| *w == "install").unwrap();
    let pkgs: Vec<String> = words[at + 1..]
        .iter()
        .filter(|w| !w.starts_with('-'))
        .map(|w| w.split('=').next().unwrap().to_string())
        .collect();
    assert!(!pkgs.is_empty(), "apt-get install names no package");
    pkgs
}

// ---------------------------------------------------------------------------------------
// The build context: .dockerignore as Docker reads it
// ---------------------------------------------------------------------------------------

struct Ignore {
    /// (negated, pattern segments), in file order: the last match decides.
    patterns: Vec<(bool, Vec<String>)>,
}

fn dockerignore() -> &'static Ignore {
    static IG: OnceLock<Ignore> = OnceLock::new();
    IG.get_or_init(|| {
        let text = std::fs::read_to_string(repo().join(".dockerignore")).expect(".dockerignore at the repository root");
        let mut patterns = Vec::new();
        for l in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let (neg, p) = match l.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, l),
            };
            // The syntax modelled: path segments, `*` and `?` within one, `**` as a whole one.
            assert!(!p.contains(['[', '\\', '{']), ".dockerignore: {l}: only `*`, `?` and `**` are modelled");
            let segs: Vec<String> =
                p.trim_start_matches('/').split('/').filter(|s| !s.is_empty() && *s != ".").map(String::from).collect();
            for s in &segs {
                assert!(s == "**" || !s.contains("**"), ".dockerignore: {l}: `**` must be a whole path segment");
            }
            // Negations with wildcards would need Docker's walk in full; plain paths suffice.
            assert!(!neg || !p.contains(['*', '?']), ".dockerignore: {l}: negations are plain paths here");
            patterns.push((neg, segs));
        }
        Ignore { patterns }
    })
}

/// `*` and `?` within one path segment.
fn seg_match(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => seg_match(&p[1..], s) || (!s.is_empty() && seg_match(p, &s[1..])),
        (Some(b'?'), Some(_)) => seg_match(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => seg_match(&p[1..], &s[1..]),
        _ => false,
    }
}

fn path_match(p: &[String], s: &[&str]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some(x) if x == "**" => (0..=s.len()).any(|k| path_match(&p[1..], &s[k..])),
        Some(x) => !s.is_empty() && seg_match(x.as_bytes(), s[0].as_bytes()) && path_match(&p[1..], &s[1..]),
    }
}

impl Ignore {
    /// Docker's rule: a pattern excludes a path when it matches the path or one of its
    /// parent directories; the last pattern that does decides.
    fn excluded(&self, rel: &str) -> bool {
        let segs: Vec<&str> = rel.split('/').filter(|s| !s.is_empty()).collect();
        let mut excluded = false;
        for (neg, p) in &self.patterns {
            if (1..=segs.len()).any(|k| path_match(p, &segs[..k])) {
                excluded = !neg;
            }
        }
        excluded
    }

    /// Can a negation let something below the excluded directory `rel` back in?
    fn reopens_below(&self, rel: &str) -> bool {
        let prefix: Vec<&str> = rel.split('/').collect();
        self.patterns
            .iter()
            .any(|(neg, p)| *neg && p.len() > prefix.len() && p.iter().zip(&prefix).all(|(a, b)| a == b))
    }
}

/// The build context: every file of the repository Docker would send, as relative paths.
fn context() -> &'static BTreeSet<String> {
    static CTX: OnceLock<BTreeSet<String>> = OnceLock::new();
    CTX.get_or_init(|| {
        let ig = dockerignore();
        let mut files = BTreeSet::new();
        let mut stack = vec![String::new()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(repo().join(&dir)).unwrap() {
                let e = e.unwrap();
                let rel = if dir.is_empty() {
                    e.file_name().to_string_lossy().into_owned()
                } else {
                    format!("{dir}/{}", e.file_name().to_string_lossy())
                };
                let ty = e.file_type().unwrap();
                if ty.is_dir() {
                    if !ig.excluded(&rel) || ig.reopens_below(&rel) {
                        stack.push(rel);
                    }
                } else if !ig.excluded(&rel) {
                    files.insert(rel);
                }
            }
        }
        files
    })
}

/// The context's files at or below `rel` (a file or a directory; `""` is the root).
fn context_below(rel: &str) -> Vec<&'static str> {
    context()
        .iter()
        .map(String::as_str)
        .filter(|f| rel.is_empty() || *f == rel || f.strip_prefix(rel).is_some_and(|r| r.starts_with('/')))
        .collect()
}

/// A COPY source in the context, normalised (`./a/` → `a`, `.` → ``); it must send something.
fn context_source(src: &str, line: usize) -> String {
    let rel = abs_join("/", src).trim_start_matches('/').to_string();
    assert!(
        !context_below(&rel).is_empty(),
        "Dockerfile:{line}: COPY {src}: not in the build context (missing, or left out by .dockerignore)"
    );
    rel
}

// ---------------------------------------------------------------------------------------
// A stage's filesystem, as far as the recipe puts files in it
// ---------------------------------------------------------------------------------------

/// A stage's files as far as the recipe puts them there: image path → the file of this
/// machine that stands for it.
struct Layout {
    files: BTreeMap<String, PathBuf>,
    dirs: BTreeSet<String>,
}

/// The cargo target directory this test was built in (`<target>/release/meshfeed`).
fn target_dir() -> &'static Path {
    Path::new(bin()).parent().and_then(Path::parent).unwrap()
}

/// The stage's one `cargo build` RUN.
fn cargo_build(st: &Stage) -> &Instr {
    let cargo: Vec<&Instr> =
        st.all("RUN").filter(|i| run_commands(i).iter().any(|c| c.starts_with("cargo build"))).collect();
    assert_eq!(cargo.len(), 1, "the build stage runs one cargo build");
    cargo[0]
}

/// The files `st` has before its instruction at `until` (a line; `usize::MAX`: all), from
/// its COPY instructions: from the build context, or from the build stage, whose
/// `cargo build` output in `<workdir>/target` stands for what cargo built here from the
/// same sources (in this build's target directory).
fn layout(df: &Dockerfile, st: &Stage, until: usize) -> Layout {
    let mut layout = Layout { files: BTreeMap::new(), dirs: BTreeSet::new() };
    for i in st.instrs.iter().filter(|i| i.line < until) {
        if i.kw == "WORKDIR" {
            layout.dirs.insert(abs_join(&i.workdir, &i.args));
        }
        if i.kw != "COPY" {
            continue;
        }
        let c = parse_copy(i);
        let many = c.srcs.len() > 1;
        for src in &c.srcs {
            // (file of this machine, its path below the source), and whether the source is
            // a directory (whose contents land in the destination).
            let (entries, src_is_dir): (Vec<(PathBuf, String)>, bool) = match &c.from {
                None => {
                    let rel = context_source(src, c.line);
                    let files = context_below(&rel);
                    let is_dir = files.iter().any(|f| *f != rel);
                    let below = |f: &str| f.strip_prefix(rel.as_str()).unwrap_or(f).trim_start_matches('/').to_string();
                    (files.iter().map(|f| (repo().join(f), below(f))).collect(), is_dir)
                }
                Some(stage) => {
                    let from = df.stage(stage);
                    let path = abs_join("/", src);
                    let cargo = cargo_build(from);
                    assert!(!from.env().contains_key("CARGO_TARGET_DIR"), "CARGO_TARGET_DIR is not modelled");
                    let host = match path.strip_prefix(&format!("{}/target/", cargo.workdir.trim_end_matches('/'))) {
                        Some(rest) => {
                            // Where that cargo build puts its output: target/release with --release.
                            let release =
                                run_commands(cargo).iter().any(|c| c.split_whitespace().any(|w| w == "--release"));
                            let profile = if release { "release/" } else { "debug/" };
                            assert!(
                                rest.starts_with(profile),
                                "Dockerfile:{}: {path}: the cargo build writes target/{profile}",
                                c.line
                            );
                            target_dir().join(rest)
                        }
                        None => layout_file(df, from, &path, c.line),
                    };
                    assert!(
                        host.is_file(),
                        "Dockerfile:{}: COPY --from={stage} {src}: {} is not here",
                        c.line,
                        host.display()
                    );
                    (vec![(host, String::new())], false)
                }
            };
            for (host, rel) in entries {
                let dest = if src_is_dir {
                    abs_join(&c.dest, &rel)
                } else if many || c.dest.ends_with('/') {
                    abs_join(&c.dest, src.trim_end_matches('/').rsplit('/').next().unwrap())
                } else {
                    c.dest.clone()
                };
                layout.files.insert(dest, host);
            }
        }
    }
    layout
}

/// A file the stage copied in (a source, not a build output).
fn layout_file(df: &Dockerfile, st: &Stage, path: &str, line: usize) -> PathBuf {
    layout(df, st, usize::MAX)
        .files
        .remove(path)
        .unwrap_or_else(|| panic!("Dockerfile:{line}: {path} is neither copied into its stage nor cargo's output"))
}

fn runtime_layout(df: &Dockerfile) -> Layout {
    layout(df, df.runtime(), usize::MAX)
}

/// The layout written out under `root` (a copy of every file, modes kept).
fn materialise(layout: &Layout, root: &Path) {
    for d in &layout.dirs {
        std::fs::create_dir_all(root.join(d.trim_start_matches('/'))).unwrap();
    }
    for (dest, host) in &layout.files {
        let to = root.join(dest.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(host, &to).unwrap_or_else(|e| panic!("copy {} -> {}: {e}", host.display(), to.display()));
    }
    // Directories as an image's are: world-readable, owned by root.
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Debian packages of this machine
// ---------------------------------------------------------------------------------------

struct Package {
    essential: bool,
    /// Depends and Pre-Depends: groups of alternatives.
    depends: Vec<Vec<String>>,
}

struct Dpkg {
    installed: BTreeMap<String, Package>,
    /// Virtual package → installed packages providing it.
    providers: BTreeMap<String, Vec<String>>,
}

fn dep_name(alt: &str) -> String {
    let name = alt.trim().split([' ', '(']).next().unwrap();
    name.split(':').next().unwrap().to_string()
}

fn dpkg() -> &'static Dpkg {
    static DB: OnceLock<Dpkg> = OnceLock::new();
    DB.get_or_init(|| {
        let text = output(
            Command::new("dpkg-query").args([
                "-W",
                "-f=${Package}\t${db:Status-Abbrev}\t${Essential}\t${Provides}\t${Pre-Depends}, ${Depends}\n",
            ]),
            "dpkg-query",
        );
        let mut installed = BTreeMap::new();
        let mut providers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for l in text.lines() {
            let f: Vec<&str> = l.split('\t').collect();
            if f.len() != 5 || !f[1].starts_with("ii") {
                continue;
            }
            for p in f[3].split(',').filter(|p| !p.trim().is_empty()) {
                providers.entry(dep_name(p)).or_default().push(f[0].to_string());
            }
            let depends = f[4]
                .split(',')
                .filter(|g| !g.trim().is_empty())
                .map(|g| g.split('|').map(dep_name).collect())
                .collect();
            installed.insert(f[0].to_string(), Package { essential: f[2] == "yes", depends });
        }
        Dpkg { installed, providers }
    })
}

impl Dpkg {
    /// What installing `roots` with `--no-install-recommends` brings: their Depends and
    /// Pre-Depends, recursively, taking for each group the alternative apt takes (the
    /// first; a virtual one through its installed providers). An alternative this machine
    /// does not have contributes nothing: the check can only fail by it, never pass.
    fn closure<'a>(&self, roots: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<String> = roots.into_iter().map(String::from).collect();
        while let Some(p) = todo.pop() {
            let Some(pkg) = self.installed.get(&p) else { continue };
            if !seen.insert(p) {
                continue;
            }
            for group in &pkg.depends {
                let first = &group[0];
                if self.installed.contains_key(first) {
                    todo.push(first.clone());
                } else if let Some(ps) = self.providers.get(first) {
                    todo.extend(ps.iter().cloned());
                }
            }
        }
        seen
    }

    /// What every Debian image has, the slim ones included: the Essential packages and
    /// their dependencies (Debian policy 3.8).
    fn base(&self) -> BTreeSet<String> {
        self.closure(self.installed.iter().filter(|(_, p)| p.essential).map(|(n, _)| n.as_str()))
    }
}

/// The packages owning each path (`dpkg -S`), trying the /usr-merged and resolved forms
/// of the name as dpkg may know either.
fn owners(paths: &[PathBuf]) -> BTreeMap<PathBuf, BTreeSet<String>> {
    let variants = |p: &Path| -> Vec<String> {
        let mut v = vec![p.to_path_buf()];
        if let Ok(c) = std::fs::canonicalize(p) {
            v.push(c);
        }
        let mut out = Vec::new();
        for x in v {
            let s = x.to_string_lossy().into_owned();
            if let Some(r) = s.strip_prefix("/usr") {
                out.push(r.to_string());
            } else {
                out.push(format!("/usr{s}"));
            }
            out.push(s);
        }
        out
    };
    let all: BTreeSet<String> = paths.iter().flat_map(|p| variants(p)).collect();
    // dpkg -S exits 1 when some name is unknown (expected for the other variants).
    let out = Command::new("dpkg").arg("-S").args(&all).output().expect("dpkg -S");
    let mut by_path: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        if l.starts_with("diversion by") {
            continue;
        }
        if let Some((pkgs, path)) = l.rsplit_once(": ") {
            let set = by_path.entry(path.to_string()).or_default();
            set.extend(pkgs.split(", ").map(|p| p.split(':').next().unwrap().to_string()));
        }
    }
    paths
        .iter()
        .map(|p| (p.clone(), variants(p).iter().filter_map(|v| by_path.get(v)).flatten().cloned().collect()))
        .collect()
}

/// Every package the runtime image has: the base, the listed packages, their closure.
fn image_packages(df: &Dockerfile) -> BTreeSet<String> {
    let db = dpkg();
    let listed = runtime_packages(df);
    let mut all = db.base();
    all.extend(db.closure(listed.iter().map(String::as_str)));
    all
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

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
    // PyYAML (in the tests' venv, with kubernetes-validate) reads the YAML.
    let script = "import json, sys, yaml\n\
        print(json.dumps([[f, [d for d in yaml.safe_load_all(open(f)) if d is not None]] for f in sys.argv[1:]]))";
    let json = output(Command::new(python()).arg("-c").arg(script).args(&manifests), "reading launch/k8s/*.yaml");
    let docs: serde_json::Value = serde_json::from_str(&json).unwrap();

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
    for entry in docs.as_array().unwrap() {
        let file = entry[0].as_str().unwrap();
        let mut found = Vec::new();
        containers(&entry[1], &mut found);
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

/// The runtime stage's PATH.
fn rt_path(df: &Dockerfile) -> String {
    df.runtime().env()["PATH"].clone()
}

/// Whether this test can run processes as the image's user (it runs as root, as CI does).
fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The image's user and group ids (USER uid[:gid]).
fn image_user(df: &Dockerfile) -> (u32, u32) {
    let u = df.runtime().last("USER").expect("USER").args.clone();
    let mut it = u.split(':').map(|x| x.parse::<u32>().unwrap_or_else(|_| panic!("USER {u}: numeric ids")));
    let uid = it.next().unwrap();
    (uid, it.next().unwrap_or(uid))
}

/// The runtime stage's files under a temporary root, ready to run its ENTRYPOINT.
struct Image {
    work: tempfile::TempDir,
    root: PathBuf,
}

impl Image {
    fn new() -> Image {
        let df = dockerfile();
        let work = tempdir();
        let root = work.path().join("root");
        materialise(&runtime_layout(df), &root);
        std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // `meshfeed` is found on the image's PATH (the manifests do not set MESHFEED_BIN);
        // a meshfeed of this machine on those directories would hide a missing one.
        for d in rt_path(df).split(':') {
            assert!(
                !Path::new(d).join("meshfeed").exists(),
                "{d}/meshfeed exists on this machine: the test could not tell the image's binary from it"
            );
        }
        Image { work, root }
    }

    /// A directory the image's user can write (a volume).
    fn volume(&self, name: &str) -> PathBuf {
        let (uid, gid) = image_user(dockerfile());
        let d = self.work.path().join(name);
        std::fs::create_dir(&d).unwrap();
        if as_root() {
            std::os::unix::fs::chown(&d, Some(uid), Some(gid)).unwrap();
        }
        d
    }

    /// The ENTRYPOINT with `args`, as the container runs it: in the image's WORKDIR, as its
    /// user (when this test runs as root, as CI does), with only the image's environment
    /// and `env` (the pod's). The image's PATH directories come first, under the root;
    /// then the same directories of this machine stand for the base image's programs
    /// (sh, sed: Essential packages of the same release).
    fn entrypoint(&self, args: &[&str], env: &[(&str, String)]) -> Command {
        let df = dockerfile();
        let rt = df.runtime();
        let ep: Vec<String> = serde_json::from_str(&rt.last("ENTRYPOINT").expect("an ENTRYPOINT").args).unwrap();
        let mut cmd = Command::new(self.root.join(ep[0].trim_start_matches('/')));
        cmd.args(&ep[1..]).args(args);
        cmd.env_clear();
        for (k, v) in rt.env() {
            if k == "PATH" {
                let mapped: Vec<String> = v
                    .split(':')
                    .map(|d| self.root.join(d.trim_start_matches('/')).to_string_lossy().into_owned())
                    .collect();
                cmd.env("PATH", format!("{}:{v}", mapped.join(":")));
            } else {
                cmd.env(k, v);
            }
        }
        // HOME: `/`, what a pod run as another uid (runAsUser) gets; not writable, the
        // worst case.
        cmd.env("HOME", "/");
        cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        cmd.current_dir(self.root.join(rt.workdir().trim_start_matches('/')));
        if as_root() {
            let (uid, gid) = image_user(df);
            cmd.uid(uid).gid(gid);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }
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
