//! The library's floors: which module may name which, and no circle between files.
//!
//! The top-level modules of `src/` stand on floors, lowest first ([`FLOORS`]). A file may
//! name items defined in its own module or in a module on a lower floor, never a higher
//! one, so that each floor can be read, tested and changed knowing only the floors under
//! it (`no_import_runs_back_up`). No files name each other's items in a circle, directly
//! or through others, within a module too (`no_circle_between_files`). Every module has a
//! floor (`every_module_has_a_floor`). The crate root (`src/lib.rs`) is exempt from the
//! floors: it declares the modules and re-exports, and what it defines itself (`VERSION`)
//! any file may name.
//!
//! An edge is a file naming an item another file defines. To find them, every
//! `src/**/*.rs` file is read without its comments, strings and character literals (a path
//! in a doc or a message does not count), and each path the rest names is resolved to the
//! file defining the item:
//!
//! * The paths: `use` trees (nested braces, `as`, `self`, globs), and paths in code that
//!   start with `crate::`, `super::`, `self::`, a child module or a name a `use` bound.
//! * The longest prefix that is a module names the module (inline `mod NAME { ... }`
//!   blocks count, so `super` in a `mod tests` is the file's own module); the next segment
//!   is followed through that module's `use`s (re-exports, `as` renames, the private
//!   imports its children see) to where it is defined. A name nothing explains (an item a
//!   macro defines, `named_enum!(Stage, ...)`) is taken to be the module's own.
//! * Not edges: `mod x;`; a re-export (`pub use`, `pub(crate) use`: a module's face hands
//!   names on), unless the file's own code names what it binds; a `use` of a module the
//!   file goes through (`use crate::dataset::gen;` then `gen::Manifest` is an edge to where
//!   `Manifest` is defined, not to `gen`). A `use` of a module the file never goes through
//!   is an edge to the module's file.
//! * A glob (`use x::*`) is an edge to x's file, named `*`; a name it brings in is followed
//!   where a path goes through it (`Error::Remote`), not where it stands alone.
//! * A name used only in `#[cfg(test)]` code is shown as `Name (test)`.
//!
//! To see the whole graph, every edge (`file -> file: names`) and each file's module and
//! floor: `MESHFEED_FLOORS=print cargo test --test floors no_circle_between_files -- --nocapture`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The floors, lowest first, each with why it stands there. A module may name items of
/// the modules before it in this list, never of those after it. A new module must be
/// placed here (`every_module_has_a_floor`).
const FLOORS: &[(&str, &str)] = &[
    ("types", "newtypes for ranks, sample ids, epochs and steps: the vocabulary of every floor"),
    ("error", "the one error type every floor returns"),
    ("buffers", "recycled buffers of the hot path: plain memory, no knowledge of the data"),
    ("config", "the typed job description, parsed once at the edge; what every floor above reads"),
    ("transport", "the narrow byte-level all-to-all-v and the failure agreement; knows no dataset"),
    ("dataset", "files to rows: formats, schemas, headers; knows nothing of ranks' plans"),
    ("plan", "pure decisions from config and dataset: permutation, homes, placement, windows"),
    ("runtime", "how a process joins its job (MPI, UCX rendezvous), is asked to stop, panics; over transports"),
    ("telemetry", "typed records of a run; written by the loader, so it may not need the loader"),
    ("feed", "the shared feeder and its client: serves datasets, a source the loader reads from"),
    ("loader", "read, pack, exchange and assemble batches: uses every floor below"),
    ("verify", "checks of what the loader delivered, and the dump format"),
];

/// How many re-exports and `use` bindings are followed before giving up (a loop).
const MAX_HOPS: usize = 24;

/// The keywords that define a named item (`macro_rules!` names it one token later).
const DEFINING: &[&str] = &["fn", "struct", "enum", "trait", "type", "const", "static", "mod", "union", "macro_rules"];

// ---- Reading the source ----

/// `src/` of the package: beside `Cargo.toml` under cargo, in the current directory when
/// the test is compiled alone with rustc.
fn src_dir() -> PathBuf {
    Path::new(option_env!("CARGO_MANIFEST_DIR").unwrap_or(".")).join("src")
}

/// Every `.rs` file under `dir`, as `src/...` paths with `/` separators.
fn rust_files(dir: &Path, rel: &str, out: &mut Vec<String>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.path().is_dir() {
            rust_files(&entry.path(), &format!("{rel}/{name}"), out);
        } else if name.ends_with(".rs") {
            out.push(format!("{rel}/{name}"));
        }
    }
}

/// The module a file holds: `src/a/b.rs` is `a::b`, `src/a/mod.rs` is `a`, `src/lib.rs` the root.
fn module_of(file: &str) -> Vec<String> {
    let inner = file.trim_start_matches("src/").trim_end_matches(".rs");
    let mut module: Vec<String> = inner.split('/').map(String::from).collect();
    if module.last().is_some_and(|last| last == "mod") || module == ["lib"] {
        module.pop();
    }
    module
}

// ---- Tokens, without comments, strings and characters ----

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Word(String),
    /// `::`
    Sep,
    Punct(char),
}

/// The tokens of `src`, leaving out comments (nested block comments too), string literals
/// (plain, byte, C, raw) and character literals. A lifetime or a label (`'a`) stays: a
/// `'` and a word.
fn lex(src: &str) -> Vec<Tok> {
    let s: Vec<char> = src.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let (c, rest) = (s[i], &s[i..]);
        i = if rest.starts_with(&['/', '/']) {
            rest.iter().position(|&c| c == '\n').map_or(s.len(), |n| i + n)
        } else if rest.starts_with(&['/', '*']) {
            block_comment_end(&s, i)
        } else if c == '"' {
            string_end(&s, i + 1)
        } else if c == '\'' {
            char_literal_end(&s, i).unwrap_or_else(|| {
                toks.push(Tok::Punct('\''));
                i + 1
            })
        } else if is_word_char(c) {
            let end = i + rest.iter().take_while(|&&c| is_word_char(c)).count();
            let word: String = s[i..end].iter().collect();
            match (word.as_str(), raw_string_end(&s, end)) {
                ("r" | "br" | "cr", Some(close)) => close,
                ("b" | "c", _) if s.get(end) == Some(&'"') => string_end(&s, end + 1),
                _ => {
                    toks.push(Tok::Word(word));
                    end
                }
            }
        } else if rest.starts_with(&[':', ':']) {
            toks.push(Tok::Sep);
            i + 2
        } else {
            if !c.is_whitespace() {
                toks.push(Tok::Punct(c));
            }
            i + 1
        };
    }
    toks
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The end of the (possibly nested) block comment opening at `s[i]`.
fn block_comment_end(s: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < s.len() {
        if s[i..].starts_with(&['/', '*']) || s[i..].starts_with(&['*', '/']) {
            depth += if s[i] == '/' { 1 } else { -1 };
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    s.len()
}

/// The end of the string literal whose contents start at `s[i]`.
fn string_end(s: &[char], mut i: usize) -> usize {
    while i < s.len() {
        match s[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    s.len()
}

/// The end of the raw string whose hashes or quote start at `s[i]` (after `r`), or None
/// when there is none (`r#ident`).
fn raw_string_end(s: &[char], i: usize) -> Option<usize> {
    let hashes = s[i..].iter().take_while(|&&c| c == '#').count();
    if s.get(i + hashes) != Some(&'"') {
        return None;
    }
    let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
    let body = i + hashes + 1;
    Some((body..s.len()).find(|&j| s[j..].starts_with(&close)).map_or(s.len(), |j| j + close.len()))
}

/// The end of the character literal opening at `s[i] == '\''`, or None for a lifetime or
/// a label: a character literal is one character or one escape between quotes.
fn char_literal_end(s: &[char], i: usize) -> Option<usize> {
    match s.get(i + 1)? {
        '\\' => (i + 3..s.len()).find(|&j| s[j] == '\'').map(|j| j + 1),
        _ if s.get(i + 2) == Some(&'\'') => Some(i + 3),
        _ => None,
    }
}

fn is_word(tok: Option<&Tok>, word: &str) -> bool {
    matches!(tok, Some(Tok::Word(w)) if w == word)
}

// ---- What a file says ----

/// One leaf of a `use` tree: `use a::{b as c}` is the path `a::b` bound to `c`.
#[derive(Clone, Debug, PartialEq)]
struct Use {
    /// The module (file or inline) the `use` sits in.
    scope: Vec<String>,
    /// As written; a leading `::` (another crate) is kept as a segment.
    path: Vec<String>,
    /// The name it binds; None for a glob.
    binding: Option<String>,
    /// `pub use` or `pub(...) use`: a re-export.
    public: bool,
}

/// What one file says: the items each of its modules defines, the modules it marks
/// `#[cfg(test)]`, its `use`s, the `a::b` paths in its code (with the module each sits
/// in), and the bare words its code names (not a field, a method or a name being defined).
#[derive(Default)]
struct Facts {
    defines: BTreeMap<Vec<String>, BTreeSet<String>>,
    tests: BTreeSet<Vec<String>>,
    uses: Vec<Use>,
    paths: Vec<(Vec<String>, Vec<String>)>,
    words: BTreeSet<String>,
}

/// Reads a file's tokens, tracking inline `mod NAME { ... }` blocks by their braces.
fn scan(module: &[String], toks: &[Tok]) -> Facts {
    let mut facts = Facts::default();
    facts.defines.insert(module.to_vec(), BTreeSet::new());
    let (mut scope, mut depth, mut opened) = (module.to_vec(), 0, Vec::<usize>::new());
    let mut i = 0;
    while i < toks.len() {
        let item_depth = opened.last().map_or(0, |d| d + 1);
        match &toks[i] {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if opened.last() == Some(&depth) {
                    opened.pop();
                    scope.pop();
                }
            }
            Tok::Word(w) if w == "use" => {
                i = read_use(toks, i, &scope, &mut facts.uses);
                continue;
            }
            Tok::Word(w) if depth == item_depth && DEFINING.contains(&w.as_str()) => {
                let at = if w == "macro_rules" { i + 2 } else { i + 1 };
                if let Some(Tok::Word(name)) = toks.get(at) {
                    facts.defines.entry(scope.clone()).or_default().insert(name.clone());
                    let child = [scope.clone(), vec![name.clone()]].concat();
                    if w == "mod" && cfg_test_before(toks, i) {
                        facts.tests.insert(child.clone());
                    }
                    if w == "mod" && toks.get(at + 1) == Some(&Tok::Punct('{')) {
                        facts.defines.entry(child.clone()).or_default();
                        (scope, i) = (child, at + 1);
                        opened.push(depth);
                        continue;
                    }
                }
            }
            Tok::Word(_) if starts_path(toks, i) => {
                let (path, end) = read_path(toks, i);
                facts.paths.push((scope.clone(), path));
                i = end;
                continue;
            }
            Tok::Word(w) if is_bare(toks, i) => {
                facts.words.insert(w.clone());
            }
            _ => {}
        }
        i += 1;
    }
    facts
}

/// Where the visibility (`pub`, `pub(crate)`, `pub(super)`) of the item whose keyword is
/// `toks[i]` starts: `i` when it has none.
fn visibility_start(toks: &[Tok], i: usize) -> usize {
    match i.checked_sub(1).map(|b| &toks[b]) {
        Some(Tok::Word(w)) if w == "pub" => i - 1,
        Some(Tok::Punct(')')) if i >= 4 && is_word(Some(&toks[i - 4]), "pub") => i - 4,
        _ => i,
    }
}

/// Whether the item whose keyword is `toks[i]` is marked `#[cfg(test)]`.
fn cfg_test_before(toks: &[Tok], i: usize) -> bool {
    let end = visibility_start(toks, i);
    let attr = [Tok::Punct('#'), Tok::Punct('['), Tok::Word("cfg".into()), Tok::Punct('(')];
    let attr = [&attr[..], &[Tok::Word("test".into()), Tok::Punct(')'), Tok::Punct(']')]].concat();
    end >= attr.len() && toks[end - attr.len()..end] == attr[..]
}

/// Whether a path `a::b` starts at `toks[i]`: not the tail of one, not a method's
/// turbofish (`.gen::<T>`), not a visibility (`pub(in crate::a)`).
fn starts_path(toks: &[Tok], i: usize) -> bool {
    let before = i.checked_sub(1).map(|b| &toks[b]);
    toks.get(i + 1) == Some(&Tok::Sep)
        && matches!(toks.get(i + 2), Some(Tok::Word(_)))
        && !matches!(before, Some(Tok::Sep | Tok::Punct('.')))
        && !is_word(before, "in")
}

/// Whether the word at `toks[i]` names something in scope: not a field or a method
/// (`.name`, `name: value`), not a macro's variable (`$name`), not being defined.
fn is_bare(toks: &[Tok], i: usize) -> bool {
    let before = i.checked_sub(1).map(|b| &toks[b]);
    let defining = matches!(before, Some(Tok::Word(w)) if DEFINING.contains(&w.as_str()));
    !defining && !matches!(before, Some(Tok::Punct('.' | '$'))) && toks.get(i + 1) != Some(&Tok::Punct(':'))
}

/// The words of the path starting at `toks[i]`, and the index after it.
fn read_path(toks: &[Tok], mut i: usize) -> (Vec<String>, usize) {
    let mut path = Vec::new();
    while let Some(Tok::Word(w)) = toks.get(i) {
        path.push(w.clone());
        if toks.get(i + 1) != Some(&Tok::Sep) || !matches!(toks.get(i + 2), Some(Tok::Word(_))) {
            return (path, i + 1);
        }
        i += 2;
    }
    (path, i)
}

/// Reads the `use` at `toks[at]` up to its `;`, pushing its leaves; returns the index after.
fn read_use(toks: &[Tok], at: usize, scope: &[String], out: &mut Vec<Use>) -> usize {
    let public = visibility_start(toks, at) < at;
    let mut leaves = Vec::new();
    let mut i = use_tree(toks, at + 1, Vec::new(), &mut leaves);
    while i < toks.len() && toks[i] != Tok::Punct(';') {
        i += 1;
    }
    for (path, binding) in leaves {
        out.push(Use { scope: scope.to_vec(), path, binding, public });
    }
    i + 1
}

/// Reads the use tree at `toks[i]` under `prefix`, pushing each leaf (path, binding);
/// returns the index after the tree. `a::{self}` is `a`; a leading `::` is kept.
fn use_tree(
    toks: &[Tok],
    mut i: usize,
    mut prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    if prefix.is_empty() && toks.get(i) == Some(&Tok::Sep) {
        prefix.push("::".into());
        i += 1;
    }
    loop {
        match toks.get(i) {
            Some(Tok::Word(w)) => prefix.push(w.clone()),
            Some(Tok::Punct('*')) => {
                out.push((prefix, None));
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while !matches!(toks.get(i), Some(Tok::Punct('}')) | None) {
                    let next = use_tree(toks, i, prefix.clone(), out);
                    i = if toks.get(next) == Some(&Tok::Punct(',')) || next == i { next + 1 } else { next };
                }
                return i + 1;
            }
            _ => return i,
        }
        i += 1;
        if toks.get(i) == Some(&Tok::Sep) {
            i += 1;
            continue;
        }
        if prefix.len() > 1 && prefix.last().is_some_and(|last| last == "self") {
            prefix.pop();
        }
        let (binding, end) = match toks.get(i + 1) {
            Some(Tok::Word(alias)) if is_word(toks.get(i), "as") => (alias.clone(), i + 2),
            _ => (prefix.last().cloned().unwrap_or_default(), i),
        };
        out.push((prefix, Some(binding)));
        return end;
    }
}

// ---- The crate: modules, resolution, edges ----

/// Where a path leads: the file defining the item it names and the item's name there
/// (for a path naming a module, the module's file and name).
#[derive(Clone, Debug, PartialEq)]
struct Target {
    file: String,
    name: String,
    module: bool,
    /// Found by a definition, a `use` or a module, not only assumed (a name nothing explains).
    sure: bool,
}

#[derive(Default)]
struct Crate {
    /// Each module (file or inline) and the file that holds it.
    modules: BTreeMap<Vec<String>, String>,
    /// Each file's module and what it says.
    files: BTreeMap<String, (Vec<String>, Facts)>,
    /// The names defined at each module's top level, and the `use`s sitting in it.
    defines: BTreeMap<Vec<String>, BTreeSet<String>>,
    uses: BTreeMap<Vec<String>, Vec<Use>>,
    /// The modules marked `#[cfg(test)]`.
    tests: BTreeSet<Vec<String>>,
}

/// Edges between files: (from, to) → each name `from` uses, and whether it uses it
/// outside `#[cfg(test)]` code.
type Edges = BTreeMap<(String, String), BTreeMap<String, bool>>;

impl Crate {
    fn read() -> Crate {
        let dir = src_dir();
        let mut files = Vec::new();
        rust_files(&dir, "src", &mut files);
        Crate::from_sources(files.into_iter().map(|file| {
            let path = dir.join(file.trim_start_matches("src/"));
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            (file, text)
        }))
    }

    fn from_sources(sources: impl IntoIterator<Item = (String, String)>) -> Crate {
        let mut krate = Crate::default();
        for (file, text) in sources {
            let module = module_of(&file);
            let facts = scan(&module, &lex(&text));
            for (scope, names) in &facts.defines {
                krate.modules.insert(scope.clone(), file.clone());
                krate.defines.entry(scope.clone()).or_default().extend(names.iter().cloned());
            }
            for u in &facts.uses {
                krate.uses.entry(u.scope.clone()).or_default().push(u.clone());
            }
            krate.tests.extend(facts.tests.iter().cloned());
            krate.files.insert(file, (module, facts));
        }
        krate
    }

    /// `segs`, written in module `scope`, as a path from the crate root; None for a path
    /// into another crate or to something local that is no module (an enum's variants).
    fn absolute(&self, scope: &[String], segs: &[String], hops: usize) -> Option<Vec<String>> {
        let first = segs.first()?;
        let mut base = match first.as_str() {
            "crate" => return Some(segs[1..].to_vec()),
            "::" => return None,
            "self" | "super" => scope.to_vec(),
            _ => return self.relative(scope, first, hops).map(|base| [base, segs[1..].to_vec()].concat()),
        };
        let k = segs.iter().take_while(|s| *s == "self" || *s == "super").count();
        for _ in segs[..k].iter().filter(|s| *s == "super") {
            base.pop()?;
        }
        Some([base, segs[k..].to_vec()].concat())
    }

    /// What the bare `name` means in `scope` (or a module around it in the same file, as a
    /// `use super::*` in a `mod tests` sees): a child module, the path a `use` bound, or a
    /// name a glob brings in.
    fn relative(&self, scope: &[String], name: &str, hops: usize) -> Option<Vec<String>> {
        let file = self.modules.get(scope).filter(|_| hops <= MAX_HOPS)?;
        let mut s = scope.to_vec();
        while self.modules.get(&s) == Some(file) {
            let child = [s.clone(), vec![name.to_string()]].concat();
            if self.modules.contains_key(&child) {
                return Some(child);
            }
            let uses = self.uses.get(&s).into_iter().flatten();
            if let Some(u) = uses.clone().find(|u| u.binding.as_deref() == Some(name)) {
                return self.absolute(&s, &u.path, hops + 1);
            }
            for glob in uses.filter(|u| u.binding.is_none()) {
                let path = self.absolute(&s, &glob.path, hops + 1).map(|m| [m, vec![name.to_string()]].concat());
                if let Some(path) = path.filter(|p| self.target(p, hops + 1).is_some_and(|t| t.sure)) {
                    return Some(path);
                }
            }
            s.pop()?;
        }
        None
    }

    /// The file defining what the crate path `path` names, following the `use`s of the
    /// module it is named through; None when they lead out of the crate.
    fn target(&self, path: &[String], hops: usize) -> Option<Target> {
        let k = (0..=path.len()).rev().find(|&k| self.modules.contains_key(&path[..k]))?;
        let (module, file) = (&path[..k], self.modules[&path[..k]].clone());
        let Some(name) = path.get(k).cloned() else {
            let name = module.last().map_or("crate", |m| m.as_str()).to_string();
            return Some(Target { file, name, module: true, sure: true });
        };
        if self.defines[module].contains(&name) || hops > MAX_HOPS {
            return Some(Target { file, name, module: false, sure: true });
        }
        let uses = self.uses.get(module).into_iter().flatten();
        if let Some(u) = uses.clone().find(|u| u.binding.as_ref() == Some(&name)) {
            let origin = self.absolute(module, &u.path, hops + 1)?;
            let found = self.target(&[origin, path[k + 1..].to_vec()].concat(), hops + 1);
            return found.map(|t| Target { sure: true, ..t });
        }
        for glob in uses.filter(|u| u.binding.is_none()) {
            let origin = self.absolute(module, &glob.path, hops + 1);
            let found = origin.and_then(|o| self.target(&[o, path[k..].to_vec()].concat(), hops + 1));
            if let Some(found) = found.filter(|t| t.sure) {
                return Some(found);
            }
        }
        Some(Target { file, name, module: false, sure: false })
    }

    /// Every edge between two different files.
    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (file, (_, facts)) in &self.files {
            let mut add = |t: Target, name: &str, scope: &[String]| {
                let outside_tests = !(1..=scope.len()).any(|k| self.tests.contains(&scope[..k]));
                if t.file != *file {
                    *edges.entry((file.clone(), t.file)).or_default().entry(name.to_string()).or_default() |=
                        outside_tests;
                }
            };
            let mut gone_through = BTreeSet::new();
            for (scope, path) in &facts.paths {
                if let Some(t) = self.absolute(scope, path, 0).and_then(|abs| self.target(&abs, 0)) {
                    gone_through.insert(path[0].clone());
                    add(t.clone(), &t.name, scope);
                }
            }
            gone_through.extend(facts.uses.iter().filter_map(|u| u.path.first().cloned()));
            // A re-export is no edge, but the file's own use of the name it binds is.
            let counted = |u: &&Use| !u.public || u.binding.as_ref().is_some_and(|b| facts.words.contains(b));
            for u in facts.uses.iter().filter(counted) {
                let Some(t) = self.absolute(&u.scope, &u.path, 0).and_then(|abs| self.target(&abs, 0)) else {
                    continue;
                };
                match &u.binding {
                    None => add(t, "*", &u.scope),
                    Some(alias) if t.module && gone_through.contains(alias) => {}
                    Some(_) => add(t.clone(), &t.name, &u.scope),
                }
            }
        }
        edges
    }

    /// The top-level module of a file; None for the crate root.
    fn top_module(&self, file: &str) -> Option<&str> {
        self.files[file].0.first().map(String::as_str)
    }
}

// ---- Floors and circles ----

fn floor(module: &str) -> Option<usize> {
    FLOORS.iter().position(|(name, _)| *name == module)
}

/// `A, B (test)`: the names, those used only in tests marked.
fn names(used: &BTreeMap<String, bool>) -> String {
    let shown = used.iter().map(|(name, outside)| if *outside { name.clone() } else { format!("{name} (test)") });
    shown.collect::<Vec<_>>().join(", ")
}

/// Whether `from` names an item of a module on a higher floor than its own.
fn runs_up(krate: &Crate, from: &str, to: &str) -> bool {
    let floor_of = |file| krate.top_module(file).and_then(floor);
    matches!((floor_of(from), floor_of(to)), (Some(x), Some(y)) if y > x)
}

/// The edges running up, one line each (floors counted from 1).
fn upward(krate: &Crate, edges: &Edges) -> Vec<String> {
    let mut found = Vec::new();
    for ((from, to), used) in edges.iter().filter(|((f, t), _)| runs_up(krate, f, t)) {
        let (x, y) = (krate.top_module(from).unwrap_or_default(), krate.top_module(to).unwrap_or_default());
        let (fx, fy) = (floor(x).unwrap_or_default() + 1, floor(y).unwrap_or_default() + 1);
        found.push(format!(
            "{from} -> {to}: {} (module {x}, floor {fx}, may not use module {y}, floor {fy})",
            names(used)
        ));
    }
    found
}

/// The strongly connected components of more than one file (Tarjan's algorithm), sorted.
fn circles(files: &[String], edges: &Edges) -> Vec<Vec<String>> {
    struct Tarjan {
        next: Vec<Vec<usize>>,
        index: Vec<Option<(usize, usize)>>,
        stack: Vec<usize>,
        seen: usize,
        found: Vec<Vec<usize>>,
    }
    impl Tarjan {
        fn visit(&mut self, v: usize) {
            self.index[v] = Some((self.seen, self.seen));
            self.seen += 1;
            self.stack.push(v);
            for u in self.next[v].clone() {
                let low = match self.index[u] {
                    None => {
                        self.visit(u);
                        self.index[u].map(|(_, low)| low)
                    }
                    Some((i, _)) => self.stack.contains(&u).then_some(i),
                };
                if let (Some(low), Some(entry)) = (low, self.index[v].as_mut()) {
                    entry.1 = entry.1.min(low);
                }
            }
            if self.index[v].is_some_and(|(i, low)| i == low) {
                let at = self.stack.iter().rposition(|&x| x == v).expect("a visited file is on the stack");
                let component = self.stack.split_off(at);
                if component.len() > 1 {
                    self.found.push(component);
                }
            }
        }
    }
    let id = |f: &str| files.iter().position(|x| x == f);
    let mut next = vec![Vec::new(); files.len()];
    for (a, b) in edges.keys().filter_map(|(f, t)| id(f).zip(id(t))) {
        next[a].push(b);
    }
    let mut t = Tarjan { next, index: vec![None; files.len()], stack: Vec::new(), seen: 0, found: Vec::new() };
    for v in 0..files.len() {
        if t.index[v].is_none() {
            t.visit(v);
        }
    }
    let mut found: Vec<Vec<String>> = t.found.iter().map(|c| c.iter().map(|&v| files[v].clone()).collect()).collect();
    found.iter_mut().for_each(|c| c.sort());
    found.sort();
    found
}

/// Each circle's files and the edges inside it, those running up a floor marked; then the
/// circles within one module, which stay once no import runs back up.
fn circle_report(krate: &Crate, edges: &Edges) -> Vec<String> {
    let files: Vec<String> = krate.files.keys().cloned().collect();
    let same_module =
        |f: &String, t: &String| krate.top_module(f).is_some() && krate.top_module(f) == krate.top_module(t);
    let within: Edges =
        edges.iter().filter(|((f, t), _)| same_module(f, t)).map(|(e, n)| (e.clone(), n.clone())).collect();
    let mut report = Vec::new();
    for (title, graph) in [("", edges), ("within one module ", &within)] {
        for circle in circles(&files, graph) {
            report.push(format!("circle {title}of {} files: {}", circle.len(), circle.join(", ")));
            for ((from, to), used) in graph.iter().filter(|((f, t), _)| circle.contains(f) && circle.contains(t)) {
                let mark = if runs_up(krate, from, to) { " (runs up a floor)" } else { "" };
                report.push(format!("    {from} -> {to}: {}{mark}", names(used)));
            }
        }
    }
    report
}

fn print_graph(krate: &Crate, edges: &Edges) {
    println!("floors, lowest first:");
    for (i, (name, why)) in FLOORS.iter().enumerate() {
        println!("  {}. {name}: {why}", i + 1);
    }
    println!("files:");
    for file in krate.files.keys() {
        let module = krate.top_module(file);
        let floor = module.and_then(floor).map_or("exempt".to_string(), |f| format!("floor {}", f + 1));
        println!("  {file}: module {}, {floor}", module.unwrap_or("(the crate root)"));
    }
    println!("edges:");
    for ((from, to), used) in edges {
        println!("  {from} -> {to}: {}", names(used));
    }
}

#[test]
fn no_import_runs_back_up() {
    let krate = Crate::read();
    let found = upward(&krate, &krate.edges());
    assert!(found.is_empty(), "{} edges run up a floor:\n{}\n", found.len(), found.join("\n"));
}

#[test]
fn no_circle_between_files() {
    let krate = Crate::read();
    let edges = krate.edges();
    if std::env::var("MESHFEED_FLOORS").is_ok_and(|v| v == "print") {
        print_graph(&krate, &edges);
    }
    let report = circle_report(&krate, &edges);
    assert!(report.is_empty(), "files name each other's items in a circle:\n{}\n", report.join("\n"));
}

#[test]
fn every_module_has_a_floor() {
    let krate = Crate::read();
    let present: BTreeSet<&str> = krate.files.keys().filter_map(|f| krate.top_module(f)).collect();
    let listed: BTreeSet<&str> = FLOORS.iter().map(|(name, _)| *name).collect();
    let unplaced: Vec<_> = present.difference(&listed).copied().collect();
    let missing: Vec<_> = listed.difference(&present).copied().collect();
    assert!(unplaced.is_empty(), "modules without a floor (place them in FLOORS): {}", unplaced.join(", "));
    assert!(missing.is_empty(), "FLOORS lists modules src/ does not have: {}", missing.join(", "));
}

// ---- The reader itself, on small sources ----

fn edge_list(sources: &[(&str, &str)]) -> Vec<String> {
    let edges = Crate::from_sources(sources.iter().map(|(f, t)| (f.to_string(), t.to_string()))).edges();
    edges.iter().map(|((from, to), used)| format!("{from} -> {to}: {}", names(used))).collect()
}

#[test]
fn use_trees_expand_with_nesting_and_as() {
    let toks = lex("pub(crate) use crate::a::{b, c::{d, e as f}, self};\nuse ::ext::*;");
    let leaves: Vec<(String, Option<String>, bool)> =
        scan(&[], &toks).uses.into_iter().map(|u| (u.path.join("::"), u.binding, u.public)).collect();
    let leaf = |path: &str, binding: Option<&str>, public| (path.to_string(), binding.map(String::from), public);
    let expected = [
        leaf("crate::a::b", Some("b"), true),
        leaf("crate::a::c::d", Some("d"), true),
        leaf("crate::a::c::e", Some("f"), true),
        leaf("crate::a", Some("a"), true),
        leaf("::::ext", None, false),
    ];
    assert_eq!(leaves, expected);
}

#[test]
fn comments_strings_and_chars_hide_paths_but_lifetimes_stay() {
    let toks = lex(concat!(
        "/// crate::doc::A\n/* outer /* crate::nested::B */ still */ let s = \"crate::string::C \\\" \";\n",
        "let r = r#\"crate::raw::D \"quoted\"\"#; let b = b\"crate::bytes::E\"; let q = '\"'; let e = '\\'';\n",
        "fn f<'a>(x: &'a str) -> crate::real::F { 'outer: loop {} }"
    ));
    let words: Vec<&str> =
        toks.iter().filter_map(|t| if let Tok::Word(w) = t { Some(w.as_str()) } else { None }).collect();
    let kept = "let s let r let b let q let e fn f a x a str crate real F outer loop";
    assert_eq!(words, kept.split(' ').collect::<Vec<_>>());
    assert!(toks.windows(2).any(|w| w == [Tok::Punct('\''), Tok::Word("a".into())]), "{toks:?}");
    let paths: Vec<String> = scan(&[], &toks).paths.iter().map(|(_, p)| p.join("::")).collect();
    assert_eq!(paths, ["crate::real::F"]);
}

#[test]
fn super_in_an_inline_test_module_is_the_file_module() {
    let edges = edge_list(&[
        ("src/lib.rs", "pub mod a;"),
        ("src/a/mod.rs", "pub mod b; pub fn g() {}"),
        (
            "src/a/b.rs",
            "pub struct S;\n#[cfg(test)]\npub(crate) mod tests {\n use super::*;\n use super::super::g;\n fn t() { super::S; }\n}",
        ),
    ]);
    assert_eq!(edges, ["src/a/b.rs -> src/a/mod.rs: g (test)"]);
}

#[test]
fn reexports_and_module_aliases_are_followed_to_the_definition() {
    let edges = edge_list(&[
        ("src/lib.rs", "pub mod a; pub mod b; pub mod c; pub use a::Renamed;"),
        ("src/a/mod.rs", "mod inner; pub use inner::Thing as Renamed; pub use crate::c::*;"),
        ("src/a/inner.rs", "pub struct Thing; impl Thing { fn f(&self) -> Vec<&'static str> { vec![] } }"),
        ("src/b.rs", "use crate::Renamed;\nuse crate::a;\nfn f() { a::Globbed; let _ = a::Renamed::f; }"),
        ("src/c.rs", "pub struct Globbed;"),
    ]);
    assert_eq!(edges, ["src/b.rs -> src/a/inner.rs: Thing", "src/b.rs -> src/c.rs: Globbed"]);
}

#[test]
fn a_relative_use_of_a_child_module_counts_and_another_crate_does_not() {
    let edges = edge_list(&[
        ("src/lib.rs", "pub mod loader;"),
        (
            "src/loader/mod.rs",
            "mod engine;\npub use engine::start;\nuse engine::Engine;\nuse std::sync::Arc;\nuse mpi::Thing;",
        ),
        ("src/loader/engine.rs", "pub struct Engine; pub fn start() {} use crate::loader;"),
    ]);
    let expected =
        ["src/loader/engine.rs -> src/loader/mod.rs: loader", "src/loader/mod.rs -> src/loader/engine.rs: Engine"];
    assert_eq!(edges, expected);
}

#[test]
fn circles_are_the_files_that_reach_each_other() {
    let files: Vec<String> = ["a", "b", "c", "d", "e"].iter().map(|f| f.to_string()).collect();
    let graph: Edges = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d")]
        .iter()
        .map(|(f, t)| ((f.to_string(), t.to_string()), BTreeMap::new()))
        .collect();
    assert_eq!(circles(&files, &graph), [vec!["a", "b", "c"], vec!["d", "e"]]);
}
