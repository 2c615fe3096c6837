//! Checks of what a person reads about the command line against the one declaration of
//! its options (clap's): the synopsis in docs/cli.md names every flag of every command and
//! no other, and `run`'s help is grouped by heading, `-h` a screen's worth, `--help` all.

use std::collections::BTreeSet;

use clap::{CommandFactory, Parser};

use crate::Cli;

/// A command of the job description's flags alone (what `bench` shares with `run`).
#[derive(clap::Parser)]
struct JobOnly {
    #[command(flatten)]
    job: crate::job::JobArgs,
}

/// The options of `cmd` a person may give, each by its names (`--verbose`, `-v`): the
/// visible ones, help and version aside.
fn declared_options(cmd: &clap::Command) -> Vec<BTreeSet<String>> {
    cmd.get_arguments()
        .filter(|a| !a.is_positional() && !a.is_hide_set())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .map(|a| {
            let long = a.get_long().map(|l| format!("--{l}"));
            let short = a.get_short().map(|s| format!("-{s}"));
            long.into_iter().chain(short).collect()
        })
        .collect()
}

/// The flags written in `text`: words that start with `-` or `--` and a letter, after a
/// space, `[`, `|` or `(`.
fn written_flags(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut flags = BTreeSet::new();
    for (i, _) in text.match_indices('-') {
        let starts_word = i == 0 || matches!(bytes[i - 1], b' ' | b'[' | b'|' | b'(');
        let dashes = if text[i..].starts_with("--") { 2 } else { 1 };
        let rest = &text[i + dashes..];
        if !starts_word || !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
        flags.insert(format!("{}{name}", &text[i..i + dashes]));
    }
    flags
}

/// The synopsis of docs/cli.md (the `text` block under "## Synopsis": a synopsis, not
/// commands to run, which tests/docs would run) by command path (`run`, `bench
/// report`): each entry's text after the command's name, continuation lines joined.
fn synopsis() -> Vec<(String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let block = text
        .split("## Synopsis\n\n```text\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("docs/cli.md has a synopsis: a text block under ## Synopsis");
    let mut entries: Vec<String> = Vec::new();
    for line in block.lines() {
        match (line.starts_with(' '), entries.last_mut()) {
            (true, Some(last)) => last.push_str(line),
            _ => entries.push(line.to_string()),
        }
    }
    let root = Cli::command();
    entries
        .iter()
        .map(|entry| {
            let (_, after) = entry.split_once("meshfeed ").unwrap_or_else(|| panic!("no `meshfeed` in: {entry}"));
            // The command's path: the words that name subcommands, from the root down.
            let mut cmd = &root;
            let mut names = Vec::new();
            let mut rest = after;
            while let Some((word, tail)) = rest.split_once(' ').or(Some((rest, ""))) {
                match cmd.find_subcommand(word) {
                    Some(sub) => {
                        names.push(word);
                        cmd = sub;
                        rest = tail;
                    }
                    None => break,
                }
            }
            assert!(!names.is_empty(), "no command named in: {entry}");
            (names.join(" "), rest.to_string())
        })
        .collect()
}

/// Every command (and subcommand) of the command line with options, by path.
fn commands() -> Vec<(String, clap::Command)> {
    fn walk(prefix: &str, cmd: &clap::Command, out: &mut Vec<(String, clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let path =
                if prefix.is_empty() { sub.get_name().to_string() } else { format!("{prefix} {}", sub.get_name()) };
            out.push((path.clone(), sub.clone()));
            walk(&path, sub, out);
        }
    }
    let mut out = Vec::new();
    walk("", &Cli::command(), &mut out);
    out
}

/// The synopsis names exactly the flags clap declares, for every command: a flag added
/// to the code and not to the synopsis (or left there after it went) fails here.
/// `bench`'s `<the same job options>` stands for `run`'s job description flags.
#[test]
fn the_synopsis_names_every_flag_of_every_command() {
    let synopsis = synopsis();
    let job_flags: BTreeSet<String> = declared_options(&JobOnly::command()).into_iter().flatten().collect();
    let mut problems = Vec::new();
    for (path, cmd) in commands() {
        let written: Vec<&String> = synopsis.iter().filter(|(p, _)| *p == path).map(|(_, t)| t).collect();
        if written.len() != 1 {
            problems.push(format!("{} entries for `meshfeed {path}`", written.len()));
            continue;
        }
        let text = written[0];
        let mut named = written_flags(text);
        if text.contains("<the same job options>") {
            named.extend(job_flags.iter().cloned());
        }
        let declared = declared_options(&cmd);
        // An option is documented by either of its names (`-n N` for `--ranks`).
        let missing: Vec<String> = declared
            .iter()
            .filter(|names| names.is_disjoint(&named))
            .map(|names| names.iter().next().unwrap().clone())
            .collect();
        let unknown: Vec<&String> = named.iter().filter(|f| !declared.iter().any(|n| n.contains(*f))).collect();
        if !missing.is_empty() {
            problems.push(format!("`meshfeed {path}` lacks {missing:?}"));
        }
        if !unknown.is_empty() {
            problems.push(format!("`meshfeed {path}` names {unknown:?}, which it has not"));
        }
    }
    // And no entry is for a command that does not exist.
    let paths: BTreeSet<String> = commands().into_iter().map(|(p, _)| p).collect();
    for (p, _) in &synopsis {
        if !paths.contains(p) {
            problems.push(format!("`meshfeed {p}` is documented, and does not exist"));
        }
    }
    assert!(problems.is_empty(), "docs/cli.md's synopsis:\n{}", problems.join("\n"));
}

/// What `meshfeed ARGS` prints for help (`-h` or `--help`).
fn help(args: &[&str]) -> String {
    let Err(e) = Cli::try_parse_from([&["meshfeed"], args].concat()) else { panic!("help is an early exit") };
    assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp, "{e}");
    e.to_string()
}

/// The headings `run`'s options are grouped under.
const HEADINGS: [&str; 7] = [
    "Data:",
    "Batches and epochs:",
    "Mesh and placement:",
    "Reading and memory:",
    "Transport and exchange:",
    "Checking and output:",
    "Resumption:",
];

/// `run -h` fits a screen (40 lines) and shows the everyday options under their
/// headings; `run --help` shows every option, grouped the same way, with the details.
#[test]
fn run_help_is_grouped_and_its_short_form_fits_a_screen() {
    let short = help(&["run", "-h"]);
    let long = help(&["run", "--help"]);
    let lines = short.lines().count();
    assert!(lines <= 40, "`run -h` is {lines} lines:\n{short}");
    assert!(long.lines().count() > 2 * lines, "`run --help` is the long form:\n{long}");
    for h in HEADINGS {
        assert!(short.lines().any(|l| l == h), "`run -h` lacks the heading {h}:\n{short}");
        assert!(long.lines().any(|l| l == h), "`run --help` lacks the heading {h}:\n{long}");
    }
    let root = Cli::command();
    let run = root.find_subcommand("run").unwrap();
    for a in run.get_arguments().filter(|a| !a.is_hide_set()) {
        let Some(long_name) = a.get_long() else { continue };
        let flag = format!("--{long_name}");
        // An option's line: `--name <VALUE>  summary` or `-s, --name ...`.
        let listed = |text: &str| {
            text.lines().any(|l| {
                let l = l.trim_start();
                let l = if l.len() > 4 && l.starts_with('-') && l[2..].starts_with(", ") { &l[4..] } else { l };
                l.split_whitespace().next() == Some(flag.as_str())
            })
        };
        assert!(listed(&long), "`run --help` lacks {flag}:\n{long}");
        // `-h` lists exactly the options not marked for `--help` only.
        assert_eq!(listed(&short), !a.is_hide_short_help_set(), "{flag} in `run -h`:\n{short}");
        // Every option is under a heading (a new one lands in a group, not at the end).
        if long_name != "help" {
            let heading = a.get_help_heading().unwrap_or_else(|| panic!("{flag} has no help heading"));
            assert!(HEADINGS.contains(&format!("{heading}:").as_str()), "{flag}: unknown heading {heading}");
        }
    }
    // `-h`'s lines are one an option: its summary, not the details.
    assert!(short.lines().all(|l| l.chars().count() <= 120), "a long line in `run -h`:\n{short}");
    let batch = short.lines().find(|l| l.trim_start().starts_with("--batch-size <B> ")).expect("--batch-size in -h");
    assert!(batch.ends_with(" Global batch size B"), "{batch}");
    assert!(long.contains("B must be divisible by the batch dimension's split"), "{long}");
}
