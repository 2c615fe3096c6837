//! The container image recipe as the image tests read it: the Dockerfile parsed (the
//! instructions it may use), the build context (.dockerignore), the files a stage holds
//! (its COPYs), the Debian packages of this machine that stand for the image's, and the
//! runtime stage's files written out under a temporary root (`Image`). Shared by
//! tests/emulation/image.rs (the recipe's checks) and tests/emulation/mpijob.rs (the
//! MPIJob on the image).
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::common::*;

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The YAML documents of a manifest (PyYAML, from the tests' venv, with
/// kubernetes-validate), as JSON; empty documents left out.
pub fn yaml_docs(path: &Path) -> Vec<serde_json::Value> {
    let script = "import json, sys, yaml\n\
        print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d is not None]))";
    let json = output(Command::new(python()).arg("-c").arg(script).arg(path), &format!("reading {}", path.display()));
    serde_json::from_str(&json).unwrap()
}

/// Runs a command to its end; its stdout when it succeeds, else a failure naming it.
pub fn output(cmd: &mut Command, what: &str) -> String {
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
pub const MODELLED: [&str; 9] = ["FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "USER", "ENTRYPOINT", "LABEL"];

/// The PATH of the debian base images (their config sets it), and Docker's default.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Clone, Debug)]
pub struct Instr {
    pub line: usize,
    pub kw: String,
    pub args: String,
    /// The working directory this instruction runs in (WORKDIR before it; `/` by default,
    /// as neither base image sets one).
    pub workdir: String,
}

#[derive(Debug)]
pub struct Stage {
    pub name: Option<String>,
    pub base: String,
    pub instrs: Vec<Instr>,
}

#[derive(Debug)]
pub struct Dockerfile {
    pub text: String,
    /// ARGs declared before the first FROM, with their defaults.
    pub args: BTreeMap<String, String>,
    pub stages: Vec<Stage>,
}

pub fn dockerfile() -> &'static Dockerfile {
    static DF: OnceLock<Dockerfile> = OnceLock::new();
    DF.get_or_init(|| {
        let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("a Dockerfile at the repository root");
        parse_dockerfile(&text)
    })
}

/// `${NAME}` and `$NAME` from `vars`; an unknown name fails (it would be empty at build time).
pub fn substitute(s: &str, vars: &BTreeMap<String, String>) -> String {
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
pub fn abs_join(base: &str, path: &str) -> String {
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

pub fn parse_dockerfile(text: &str) -> Dockerfile {
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
            "Dockerfile:{line}: {kw} is not modelled by tests/emulation/image.rs: teach the test what it does first"
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
pub struct Copy {
    pub line: usize,
    pub from: Option<String>,
    pub srcs: Vec<String>,
    /// Absolute, resolved against the WORKDIR; a trailing `/` kept (a directory).
    pub dest: String,
}

pub fn parse_copy(i: &Instr) -> Copy {
    let mut from = None;
    let mut rest = i.args.trim();
    while rest.starts_with("--") {
        let (flag, r) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
        match flag.strip_prefix("--from=") {
            Some(stage) => from = Some(stage.to_string()),
            // --chmod/--chown/--link change modes and owners the run below depends on.
            None => panic!("Dockerfile:{}: COPY {flag} is not modelled by tests/emulation/image.rs", i.line),
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
pub fn run_commands(i: &Instr) -> Vec<String> {
    assert!(!i.args.starts_with('['), "Dockerfile:{}: exec-form RUN is not modelled", i.line);
    i.args
        .split("&&")
        .flat_map(|s| s.split(';'))
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .collect()
}

impl Dockerfile {
    pub fn runtime(&self) -> &Stage {
        self.stages.last().expect("a FROM")
    }

    pub fn stage(&self, name: &str) -> &Stage {
        self.stages
            .iter()
            .find(|s| s.name.as_deref() == Some(name))
            .unwrap_or_else(|| panic!("no stage named {name} (COPY --from names a stage of this file)"))
    }

    /// The build stage: the one the runtime stage copies from.
    pub fn builder(&self) -> &Stage {
        let froms: BTreeSet<String> = self.runtime().copies().into_iter().filter_map(|c| c.from).collect();
        assert_eq!(froms.len(), 1, "the runtime stage copies from exactly one build stage: {froms:?}");
        self.stage(froms.first().unwrap())
    }

    /// The tag the usage comment builds (`docker build -t TAG .`).
    pub fn tag(&self) -> String {
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
    pub fn all(&self, kw: &str) -> impl Iterator<Item = &Instr> {
        let kw = kw.to_string();
        self.instrs.iter().filter(move |i| i.kw == kw)
    }

    pub fn copies(&self) -> Vec<Copy> {
        self.all("COPY").map(parse_copy).collect()
    }

    pub fn last(&self, kw: &str) -> Option<&Instr> {
        self.all(kw).last()
    }

    /// The image's environment: the base's PATH, then this stage's ENV in order.
    pub fn env(&self) -> BTreeMap<String, String> {
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

    pub fn workdir(&self) -> String {
        self.last("WORKDIR").map(|i| abs_join(&i.workdir, &i.args)).unwrap_or_else(|| "/".into())
    }
}

/// Whitespace-separated words, double quotes grouping (ENV values).
pub fn shell_words(s: &str) -> Vec<String> {
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
pub fn host_codename() -> String {
    let os = std::fs::read_to_string("/etc/os-release").expect("/etc/os-release");
    os.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_string())
        .expect("VERSION_CODENAME in /etc/os-release")
}

/// The packages the runtime stage installs (its one `apt-get install`).
pub fn runtime_packages(df: &Dockerfile) -> Vec<String> {
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

pub struct Ignore {
    /// (negated, pattern segments), in file order: the last match decides.
    pub patterns: Vec<(bool, Vec<String>)>,
}

pub fn dockerignore() -> &'static Ignore {
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
pub fn seg_match(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => seg_match(&p[1..], s) || (!s.is_empty() && seg_match(p, &s[1..])),
        (Some(b'?'), Some(_)) => seg_match(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => seg_match(&p[1..], &s[1..]),
        _ => false,
    }
}

pub fn path_match(p: &[String], s: &[&str]) -> bool {
    match p.first() {
        None => s.is_empty(),
        Some(x) if x == "**" => (0..=s.len()).any(|k| path_match(&p[1..], &s[k..])),
        Some(x) => !s.is_empty() && seg_match(x.as_bytes(), s[0].as_bytes()) && path_match(&p[1..], &s[1..]),
    }
}

impl Ignore {
    /// Docker's rule: a pattern excludes a path when it matches the path or one of its
    /// parent directories; the last pattern that does decides.
    pub fn excluded(&self, rel: &str) -> bool {
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
    pub fn reopens_below(&self, rel: &str) -> bool {
        let prefix: Vec<&str> = rel.split('/').collect();
        self.patterns
            .iter()
            .any(|(neg, p)| *neg && p.len() > prefix.len() && p.iter().zip(&prefix).all(|(a, b)| a == b))
    }
}

/// The build context: every file of the repository Docker would send, as relative paths.
pub fn context() -> &'static BTreeSet<String> {
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
pub fn context_below(rel: &str) -> Vec<&'static str> {
    context()
        .iter()
        .map(String::as_str)
        .filter(|f| rel.is_empty() || *f == rel || f.strip_prefix(rel).is_some_and(|r| r.starts_with('/')))
        .collect()
}

/// A COPY source in the context, normalised (`./a/` → `a`, `.` → ``); it must send something.
pub fn context_source(src: &str, line: usize) -> String {
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
pub struct Layout {
    pub files: BTreeMap<String, PathBuf>,
    pub dirs: BTreeSet<String>,
}

/// The cargo target directory this test was built in (`<target>/release/meshfeed`).
pub fn target_dir() -> &'static Path {
    Path::new(bin()).parent().and_then(Path::parent).unwrap()
}

/// The stage's one `cargo build` RUN.
pub fn cargo_build(st: &Stage) -> &Instr {
    let cargo: Vec<&Instr> =
        st.all("RUN").filter(|i| run_commands(i).iter().any(|c| c.starts_with("cargo build"))).collect();
    assert_eq!(cargo.len(), 1, "the build stage runs one cargo build");
    cargo[0]
}

/// The files `st` has before its instruction at `until` (a line; `usize::MAX`: all), from
/// its COPY instructions: from the build context, or from the build stage, whose
/// `cargo build` output in `<workdir>/target` stands for what cargo built here from the
/// same sources (in this build's target directory).
pub fn layout(df: &Dockerfile, st: &Stage, until: usize) -> Layout {
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
pub fn layout_file(df: &Dockerfile, st: &Stage, path: &str, line: usize) -> PathBuf {
    layout(df, st, usize::MAX)
        .files
        .remove(path)
        .unwrap_or_else(|| panic!("Dockerfile:{line}: {path} is neither copied into its stage nor cargo's output"))
}

pub fn runtime_layout(df: &Dockerfile) -> Layout {
    layout(df, df.runtime(), usize::MAX)
}

/// The layout written out under `root` (a copy of every file, modes kept).
pub fn materialise(layout: &Layout, root: &Path) {
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

pub struct Package {
    pub essential: bool,
    /// Depends and Pre-Depends: groups of alternatives.
    pub depends: Vec<Vec<String>>,
}

pub struct Dpkg {
    pub installed: BTreeMap<String, Package>,
    /// Virtual package → installed packages providing it.
    pub providers: BTreeMap<String, Vec<String>>,
}

pub fn dep_name(alt: &str) -> String {
    let name = alt.trim().split([' ', '(']).next().unwrap();
    name.split(':').next().unwrap().to_string()
}

pub fn dpkg() -> &'static Dpkg {
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
    pub fn closure<'a>(&self, roots: impl IntoIterator<Item = &'a str>) -> BTreeSet<String> {
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
    pub fn base(&self) -> BTreeSet<String> {
        self.closure(self.installed.iter().filter(|(_, p)| p.essential).map(|(n, _)| n.as_str()))
    }
}

/// The packages owning each path (`dpkg -S`), trying the /usr-merged and resolved forms
/// of the name as dpkg may know either.
pub fn owners(paths: &[PathBuf]) -> BTreeMap<PathBuf, BTreeSet<String>> {
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
pub fn image_packages(df: &Dockerfile) -> BTreeSet<String> {
    let db = dpkg();
    let listed = runtime_packages(df);
    let mut all = db.base();
    all.extend(db.closure(listed.iter().map(String::as_str)));
    all
}

/// The runtime stage's PATH.
pub fn rt_path(df: &Dockerfile) -> String {
    df.runtime().env()["PATH"].clone()
}

/// Whether this test can run processes as the image's user (it runs as root, as CI does).
pub fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// The image's user and group ids (USER uid[:gid]).
pub fn image_user(df: &Dockerfile) -> (u32, u32) {
    let u = df.runtime().last("USER").expect("USER").args.clone();
    let mut it = u.split(':').map(|x| x.parse::<u32>().unwrap_or_else(|_| panic!("USER {u}: numeric ids")));
    let uid = it.next().unwrap();
    (uid, it.next().unwrap_or(uid))
}

/// The runtime stage's files under a temporary root, ready to run its ENTRYPOINT.
pub struct Image {
    pub work: tempfile::TempDir,
    pub root: PathBuf,
}

impl Image {
    pub fn new() -> Image {
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
    pub fn volume(&self, name: &str) -> PathBuf {
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
    pub fn entrypoint(&self, args: &[&str], env: &[(&str, String)]) -> Command {
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
