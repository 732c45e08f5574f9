//! `cargo xtask tidy`: cheap checks that keep the repository honest, in the
//! manner of rust-analyzer's tidy tests. They read the sources as text (no
//! compilation) and print one line per problem.
//!
//! - **Environment variables.** Each `OUTBOX_*` variable is defined once: the
//!   runtime's in `env_vars! { .. }` of `crates/outbox-runtime/src/config.rs`,
//!   the `outbox` command's in `env_vars! { .. }` of
//!   `crates/outbox-cli/src/cli.rs`, and the ones only tests and benchmarks
//!   read in [`TEST_VARS`] below. README.md's configuration table must be the
//!   table generated from them (`cargo xtask tidy --fix` writes it); every
//!   `OUTBOX_*` name in a Rust source (crates/, examples/, xtask/) or a
//!   Markdown file must be a variable of that table; every variable of the
//!   table must occur in Rust code outside its definition; a table of
//!   variables elsewhere in the docs must give the same defaults.
//! - **Conformance checks.** Every `pub async fn` in
//!   `crates/outbox-testkit/src/checks/` whose signature names `Harness` is
//!   listed exactly once in `for_each_check!` (checks/mod.rs), and every name
//!   listed there is such a function: a check that is not listed never runs.
//!
//! Stale intra-doc links are not checked here: `cargo doc` with
//! `RUSTDOCFLAGS=-D warnings` (a step of `cargo xtask ci`) refuses them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::root;

/// The files whose `env_vars! { .. }` define variables.
const DEFINITIONS: &[&str] = &[
    "crates/outbox-runtime/src/config.rs",
    "crates/outbox-cli/src/cli.rs",
];

/// This file: the only Rust source not searched for variable names (its
/// tables and test inputs name variables without reading them).
const SELF: &str = "xtask/src/tidy.rs";

/// Variables that only tests, benchmarks and xtask read, as `(name, default,
/// meaning)`: they belong to no library crate, so they are defined here.
const TEST_VARS: &[(&str, &str, &str)] = &[
    (
        "OUTBOX_TEST_DATABASE_URL",
        "(a throwaway cluster)",
        "Postgres for the tests, instead of the one `cargo xtask ci` starts",
    ),
    (
        "OUTBOX_TEST_NATS_URL",
        "(a throwaway server)",
        "NATS (JetStream) for the sink tests, instead of the one `cargo xtask ci` starts; set `OUTBOX_TEST_NATS_SERVER` with it",
    ),
    (
        "OUTBOX_TEST_NATS_SERVER",
        "(the installed `nats-server`)",
        "the `nats-server` binary the sink tests start, kill and restart servers of their own with",
    ),
    (
        "OUTBOX_TEST_SEED",
        "(time)",
        "replays a randomized test with the seed it printed",
    ),
    (
        "OUTBOX_TEST_KEEP_SCHEMAS",
        "(unset)",
        "set: the Postgres tests keep their schemas for inspection instead of dropping them",
    ),
    (
        "OUTBOX_TEST_WEBDRIVER_URL",
        "(unset)",
        "a WebDriver (chromedriver) for the browser test of `outbox serve`; `cargo xtask ci` starts one and sets it; unset and `CI` unset: the test is skipped, with `CI` set it fails",
    ),
    (
        "OUTBOX_TEST_SCREENSHOT_DIR",
        "`target/screenshots`",
        "where the browser test of `outbox serve` saves its screenshots; `docs/img` refreshes the runbook's",
    ),
    (
        "OUTBOX_CRASH_AT",
        "(unset)",
        "`point:N`: a build with the runtime's `failpoints` feature (only `cargo xtask crash` makes one) aborts at the N-th hit of that crash point (docs/crash-testing.md)",
    ),
    (
        "OUTBOX_BENCH_DATABASE_URL",
        "(`OUTBOX_TEST_DATABASE_URL`)",
        "Postgres for `cargo bench -p outbox-postgres`",
    ),
    (
        "OUTBOX_BENCH_RATE",
        "200",
        "events per second appended by `cargo bench -p outbox-runtime --bench lag`",
    ),
    (
        "OUTBOX_BENCH_SECONDS",
        "5",
        "seconds the lag benchmark appends for",
    ),
];

const README: &str = "README.md";
const CHECKS_DIR: &str = "crates/outbox-testkit/src/checks";
const CHECK_LIST: &str = "crates/outbox-testkit/src/checks/mod.rs";

/// The header of README.md's configuration table (under `## Configuration`).
const TABLE_HEADER: &str = "| variable | default | meaning |";

/// `cargo xtask tidy [--fix]`.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let fix = match args {
        [] => false,
        [a] if a == "--fix" => true,
        _ => bail!("usage: cargo xtask tidy [--fix]"),
    };
    eprintln!("\n==> tidy");
    let root = root();
    let mut problems = Vec::new();
    let mut inputs = Inputs::read(&root, &mut problems)?;
    // Only from definitions read whole: a table without an unreadable file's
    // variables would be wrong (the problems are printed below).
    let (vars, unreadable) = definitions(&inputs.definitions, TEST_VARS);
    if fix && unreadable.is_empty() {
        match generate_readme(&inputs.readme.text, &vars) {
            Some(text) if text != inputs.readme.text => {
                fs::write(root.join(README), &text).context("writing README.md")?;
                eprintln!("tidy --fix: wrote the configuration table of {README}");
                inputs.readme.text = text;
            }
            Some(_) => {}
            None => bail!(
                "{README} has no configuration table to write (`{TABLE_HEADER}` under `## Configuration`)"
            ),
        }
    }
    problems.extend(env_problems(&inputs, TEST_VARS));
    problems.extend(check_problems(&inputs.checks, &inputs.check_list));
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    if !problems.is_empty() {
        bail!("tidy: {} problem(s)", problems.len());
    }
    eprintln!("ok: variables, README table and conformance checks agree");
    Ok(())
}

/// A file's path (relative to the workspace, with `/`) and text.
#[derive(Clone, Debug)]
struct File {
    path: String,
    text: String,
}

impl File {
    #[cfg(test)]
    fn new(path: &str, text: &str) -> Self {
        File {
            path: path.into(),
            text: text.into(),
        }
    }
}

/// Everything the checks read.
struct Inputs {
    /// The files with `env_vars! { .. }`.
    definitions: Vec<File>,
    /// Every Rust source (but this file).
    rust: Vec<File>,
    /// Every Markdown file but README.md.
    markdown: Vec<File>,
    readme: File,
    /// The files under checks/ but mod.rs.
    checks: Vec<File>,
    check_list: File,
}

impl Inputs {
    fn read(root: &Path, problems: &mut Vec<String>) -> Result<Self> {
        let read = |rel: &str| -> Result<File> {
            let text = fs::read_to_string(root.join(rel)).with_context(|| format!("reading {rel}"))?;
            Ok(File {
                path: rel.into(),
                text,
            })
        };
        let mut all = Vec::new();
        for dir in ["crates", "examples", "xtask", "crash", "docs"] {
            walk(root, &root.join(dir), &mut all)?;
        }
        let mut rust = Vec::new();
        let mut markdown = Vec::new();
        let mut checks = Vec::new();
        for rel in all {
            if rel.ends_with(".rs") && rel != SELF {
                if rel.starts_with(&format!("{CHECKS_DIR}/")) && rel != CHECK_LIST {
                    checks.push(read(&rel)?);
                }
                rust.push(read(&rel)?);
            } else if rel.ends_with(".md") {
                markdown.push(read(&rel)?);
            }
        }
        if rust.is_empty() {
            problems.push("found no Rust sources under crates/, examples/ or xtask/".into());
        }
        Ok(Inputs {
            definitions: DEFINITIONS.iter().map(|p| read(p)).collect::<Result<_>>()?,
            rust,
            markdown,
            readme: read(README)?,
            checks,
            check_list: read(CHECK_LIST)?,
        })
    }
}

/// Collects the `.rs` and `.md` files under `dir` (paths relative to `root`),
/// skipping `target` and hidden directories.
fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    let mut entries: Vec<_> = entries.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        if e.file_type()?.is_dir() {
            if name != "target" && !name.starts_with('.') {
                walk(root, &path, out)?;
            }
        } else if name.ends_with(".rs") || name.ends_with(".md") {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Environment variables

/// One defined variable.
#[derive(Clone, Debug, PartialEq)]
struct Var {
    name: String,
    default: String,
    meaning: String,
    /// Where it is defined (`path:line`).
    at: String,
}

/// The definitions, in order (runtime, CLI, tests), and the problems found
/// reading them.
fn definitions(files: &[File], test_vars: &[(&str, &str, &str)]) -> (Vec<Var>, Vec<String>) {
    let mut vars = Vec::new();
    let mut problems = Vec::new();
    for f in files {
        match parse_env_vars(f) {
            Ok((v, _)) => vars.extend(v),
            Err(e) => problems.push(e),
        }
    }
    for (name, default, meaning) in test_vars {
        vars.push(Var {
            name: (*name).into(),
            default: (*default).into(),
            meaning: (*meaning).into(),
            at: format!("{SELF} (TEST_VARS)"),
        });
    }
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for v in &vars {
        if let Some(first) = seen.insert(&v.name, &v.at) {
            problems.push(format!(
                "{}: `{}` is defined twice (also at {first})",
                v.at, v.name
            ));
        }
    }
    (vars, problems)
}

/// Reads `env_vars! { NAME = "default", "meaning"; ... }` of `f`: the
/// variables and the (1-based, inclusive) lines of the block.
fn parse_env_vars(f: &File) -> Result<(Vec<Var>, (usize, usize)), String> {
    let tokens = lex(&f.text);
    let start = (0..tokens.len())
        .find(|&i| {
            tokens[i].tok.is_ident("env_vars")
                && tokens.get(i + 1).is_some_and(|t| t.tok == Tok::Punct('!'))
                && tokens.get(i + 2).is_some_and(|t| t.tok == Tok::Punct('{'))
        })
        .ok_or_else(|| format!("{}: found no `env_vars! {{ .. }}` defining variables", f.path))?;
    let mut vars = Vec::new();
    let mut i = start + 3;
    loop {
        let line = tokens.get(i).map_or(0, |t| t.line);
        let row: Vec<&Tok> = tokens[i..].iter().take(6).map(|t| &t.tok).collect();
        match row.as_slice() {
            [Tok::Punct('}'), ..] => {
                if vars.is_empty() {
                    return Err(format!("{}:{line}: env_vars! defines no variable", f.path));
                }
                return Ok((vars, (tokens[start].line, line)));
            }
            [
                Tok::Ident(name),
                Tok::Punct('='),
                Tok::Str(default),
                Tok::Punct(','),
                Tok::Str(meaning),
                Tok::Punct(';'),
            ] => {
                if !name.starts_with("OUTBOX_") {
                    return Err(format!("{}:{line}: `{name}` does not start with OUTBOX_", f.path));
                }
                vars.push(Var {
                    name: name.clone(),
                    default: default.clone(),
                    meaning: meaning.clone(),
                    at: format!("{}:{line}", f.path),
                });
                i += 6;
            }
            _ => {
                return Err(format!(
                    "{}:{line}: cannot read this row of env_vars! as `NAME = \"default\", \"meaning\";`",
                    f.path
                ));
            }
        }
    }
}

/// A default as a table cell: a description in parentheses as it is, a value
/// in backticks.
fn default_cell(default: &str) -> String {
    if default.starts_with('(') {
        default.to_owned()
    } else {
        format!("`{default}`")
    }
}

/// The configuration table generated from the definitions.
fn render_table(vars: &[Var]) -> Vec<String> {
    let mut lines = vec![TABLE_HEADER.to_owned(), "|---|---|---|".to_owned()];
    for v in vars {
        lines.push(format!(
            "| `{}` | {} | {} |",
            v.name,
            default_cell(&v.default),
            v.meaning
        ));
    }
    lines
}

/// The 0-based line range of README's configuration table: the first table
/// with [`TABLE_HEADER`] under `## Configuration`.
fn table_range(readme: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = readme.lines().collect();
    let section = lines.iter().position(|l| l.trim_end() == "## Configuration")?;
    let mut start = None;
    for (i, l) in lines.iter().enumerate().skip(section + 1) {
        if l.starts_with("## ") {
            break;
        }
        if l.trim_end() == TABLE_HEADER {
            start = Some(i);
            break;
        }
    }
    let start = start?;
    let end = (start..lines.len())
        .find(|&i| !lines[i].starts_with('|'))
        .unwrap_or(lines.len());
    Some((start, end))
}

/// README with its configuration table replaced by the generated one.
fn generate_readme(readme: &str, vars: &[Var]) -> Option<String> {
    let (start, end) = table_range(readme)?;
    let lines: Vec<&str> = readme.lines().collect();
    let mut out: Vec<String> = lines[..start].iter().map(|l| (*l).to_owned()).collect();
    out.extend(render_table(vars));
    out.extend(lines[end..].iter().map(|l| (*l).to_owned()));
    let mut text = out.join("\n");
    if readme.ends_with('\n') {
        text.push('\n');
    }
    Some(text)
}

/// A row of a Markdown table whose first cell is a backticked `OUTBOX_*`
/// name: (1-based line, name, default cell, meaning cell).
fn table_rows(text: &str) -> Vec<(usize, String, String, String)> {
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(inner) = line.trim().strip_prefix('|').and_then(|l| l.strip_suffix('|')) else {
            continue;
        };
        let cells: Vec<&str> = inner.split('|').map(str::trim).collect();
        let [first, default, rest @ ..] = cells.as_slice() else {
            continue;
        };
        let Some(name) = first.strip_prefix('`').and_then(|c| c.strip_suffix('`')) else {
            continue;
        };
        if name.starts_with("OUTBOX_") {
            rows.push((i + 1, name.to_owned(), (*default).to_owned(), rest.join(" | ")));
        }
    }
    rows
}

/// Every `OUTBOX_*` variable name in `text`, with its 1-based line. A bare
/// prefix (`OUTBOX_`, `OUTBOX_*`) is not a name.
fn env_names(text: &str) -> Vec<(usize, String)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\n' {
            line += 1;
        }
        if b[i..].starts_with(b"OUTBOX_")
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let mut j = i + "OUTBOX_".len();
            while j < b.len() && (b[j].is_ascii_uppercase() || b[j].is_ascii_digit() || b[j] == b'_') {
                j += 1;
            }
            let lower_follows = j < b.len() && b[j].is_ascii_lowercase();
            let name = text[i..j].trim_end_matches('_');
            if name.len() > "OUTBOX".len() && !lower_follows {
                out.push((line, name.to_owned()));
            }
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The environment-variable rules over `inputs`.
fn env_problems(inputs: &Inputs, test_vars: &[(&str, &str, &str)]) -> Vec<String> {
    let (vars, mut problems) = definitions(&inputs.definitions, test_vars);
    let defined: BTreeMap<&str, &Var> = vars.iter().map(|v| (v.name.as_str(), v)).collect();
    // The lines of each definition block: a name there is defined, not read.
    let blocks: BTreeMap<&str, (usize, usize)> = inputs
        .definitions
        .iter()
        .filter_map(|f| parse_env_vars(f).ok().map(|(_, lines)| (f.path.as_str(), lines)))
        .collect();

    // README.md's table is the generated one.
    let readme = &inputs.readme;
    let mut rows: BTreeMap<String, usize> = BTreeMap::new();
    match table_range(&readme.text) {
        None => problems.push(format!(
            "{README}: no configuration table (`{TABLE_HEADER}` under `## Configuration`)"
        )),
        Some((start, end)) => {
            let lines: Vec<&str> = readme.text.lines().collect();
            let table = lines[start..end].join("\n");
            let before = problems.len();
            for (line, name, default, meaning) in table_rows(&table) {
                let line = start + line;
                if let Some(first) = rows.insert(name.clone(), line) {
                    problems.push(format!(
                        "{README}:{line}: `{name}` is listed twice (also at line {first})"
                    ));
                }
                match defined.get(name.as_str()) {
                    None => problems.push(format!(
                        "{README}:{line}: `{name}` is in the configuration table but defined nowhere \
                         (env_vars! in {}, or TEST_VARS in {SELF})",
                        DEFINITIONS.join(" or ")
                    )),
                    Some(v) => {
                        if default != default_cell(&v.default) {
                            problems.push(format!(
                                "{README}:{line}: `{name}`: default {default} in the table, {} in {}",
                                default_cell(&v.default),
                                v.at
                            ));
                        } else if meaning != v.meaning {
                            problems.push(format!(
                                "{README}:{line}: `{name}`: meaning differs from {} (run `cargo xtask tidy --fix`)",
                                v.at
                            ));
                        }
                    }
                }
            }
            for v in &vars {
                if !rows.contains_key(&v.name) {
                    problems.push(format!(
                        "{README}: `{}` (defined at {}) is missing from the configuration table \
                         (run `cargo xtask tidy --fix`)",
                        v.name, v.at
                    ));
                }
            }
            if problems.len() == before && lines[start..end] != render_table(&vars)[..] {
                problems.push(format!(
                    "{README}:{}: the configuration table is not the one generated from the definitions \
                     (order or layout; run `cargo xtask tidy --fix`)",
                    start + 1
                ));
            }
        }
    }
    let known = |name: &str| rows.contains_key(name) || defined.contains_key(name);

    // Every name in Rust code is a variable of the table; every variable of
    // the table is read somewhere outside its definition.
    let mut read: BTreeSet<String> = BTreeSet::new();
    for f in &inputs.rust {
        let block = blocks.get(f.path.as_str());
        let mut reported = BTreeSet::new();
        for (line, name) in env_names(&f.text) {
            if !known(&name) && reported.insert(name.clone()) {
                problems.push(format!(
                    "{}:{line}: `{name}` is not in {README}'s configuration table (define it in env_vars! \
                     or TEST_VARS, then `cargo xtask tidy --fix`)",
                    f.path
                ));
            }
            if !block.is_some_and(|&(a, b)| (a..=b).contains(&line)) {
                read.insert(name);
            }
        }
    }
    for (name, line) in &rows {
        if defined.contains_key(name.as_str()) && !read.contains(name) {
            problems.push(format!(
                "{README}:{line}: `{name}` occurs in no Rust source outside its definition (nothing reads it?)"
            ));
        }
    }

    // The docs name only variables of the table, with its defaults.
    for f in &inputs.markdown {
        let mut reported = BTreeSet::new();
        for (line, name) in env_names(&f.text) {
            if !known(&name) && reported.insert(name.clone()) {
                problems.push(format!(
                    "{}:{line}: `{name}` is not in {README}'s configuration table",
                    f.path
                ));
            }
        }
        for (line, name, default, _) in table_rows(&f.text) {
            if let Some(v) = defined.get(name.as_str())
                && !default.starts_with(&default_cell(&v.default))
            {
                problems.push(format!(
                    "{}:{line}: `{name}`: default {default}, but {} in {}",
                    f.path,
                    default_cell(&v.default),
                    v.at
                ));
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// Conformance checks

/// The registration rules: `checks` are the files under checks/ but mod.rs,
/// `list` is checks/mod.rs.
fn check_problems(checks: &[File], list: &File) -> Vec<String> {
    let mut problems = Vec::new();
    let mut defined: BTreeMap<String, String> = BTreeMap::new();
    for f in checks {
        for (line, name) in check_fns(&f.text) {
            let at = format!("{}:{line}", f.path);
            if let Some(first) = defined.insert(name.clone(), at.clone()) {
                problems.push(format!(
                    "{at}: conformance check `{name}` is defined twice (also at {first})"
                ));
            }
        }
    }
    if defined.is_empty() {
        problems.push(format!(
            "{CHECKS_DIR}: found no conformance check (`pub async fn name<H: Harness>(h: &H)`)"
        ));
    }
    let listed = match check_list(&list.text) {
        Ok(listed) => listed,
        Err(e) => {
            problems.push(format!("{}: {e}", list.path));
            return problems;
        }
    };
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for (line, name) in &listed {
        if let Some(first) = seen.insert(name, *line) {
            problems.push(format!(
                "{}:{line}: for_each_check! lists `{name}` twice (also at line {first})",
                list.path
            ));
        }
        if !defined.contains_key(name) {
            problems.push(format!(
                "{}:{line}: for_each_check! lists `{name}`, which is no `pub async fn` check in {CHECKS_DIR}",
                list.path
            ));
        }
    }
    for (name, at) in &defined {
        if !seen.contains_key(name.as_str()) {
            problems.push(format!(
                "{at}: conformance check `{name}` is not listed in for_each_check! ({}), so no adapter runs it",
                list.path
            ));
        }
    }
    problems
}

/// The `pub async fn`s of `text` whose signature names `Harness`, with lines.
fn check_fns(text: &str) -> Vec<(usize, String)> {
    let tokens = lex(text);
    let mut out = Vec::new();
    for i in 0..tokens.len() {
        let is = |k: usize, s: &str| tokens.get(i + k).is_some_and(|t| t.tok.is_ident(s));
        if !(is(0, "pub") && is(1, "async") && is(2, "fn")) {
            continue;
        }
        let Some(Tok::Ident(name)) = tokens.get(i + 3).map(|t| &t.tok) else {
            continue;
        };
        let names_harness = tokens[i + 3..]
            .iter()
            .take_while(|t| t.tok != Tok::Punct('{') && t.tok != Tok::Punct(';'))
            .any(|t| t.tok.is_ident("Harness"));
        if names_harness {
            out.push((tokens[i + 3].line, name.clone()));
        }
    }
    out
}

/// The names listed by `for_each_check!`: the identifiers after the first `;`
/// of the macro's body (`$m!($arg; check_a, check_b, ...)`), with lines.
fn check_list(text: &str) -> Result<Vec<(usize, String)>, String> {
    let tokens = lex(text);
    let cannot = "cannot read the list of for_each_check! (`macro_rules! for_each_check` with \
                  `$m!($arg; check_a, check_b, ...)`)";
    let start = (0..tokens.len())
        .find(|&i| {
            tokens[i].tok.is_ident("macro_rules")
                && tokens.get(i + 1).is_some_and(|t| t.tok == Tok::Punct('!'))
                && tokens
                    .get(i + 2)
                    .is_some_and(|t| t.tok.is_ident("for_each_check"))
        })
        .ok_or(cannot)?;
    let semi = (start..tokens.len())
        .find(|&i| tokens[i].tok == Tok::Punct(';'))
        .ok_or(cannot)?;
    let mut names = Vec::new();
    let mut i = semi + 1;
    loop {
        match tokens.get(i).map(|t| &t.tok) {
            Some(Tok::Ident(name)) => {
                names.push((tokens[i].line, name.clone()));
                match tokens.get(i + 1).map(|t| &t.tok) {
                    Some(Tok::Punct(',')) => i += 2,
                    Some(Tok::Punct(')')) => break,
                    _ => return Err(cannot.into()),
                }
            }
            Some(Tok::Punct(')')) => break,
            _ => return Err(cannot.into()),
        }
    }
    if names.is_empty() {
        return Err("for_each_check! lists no check".into());
    }
    Ok(names)
}

// ---------------------------------------------------------------------------
// A small Rust lexer: identifiers, string literals and punctuation, without
// comments, char literals, lifetimes and numbers' meaning.

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    /// An identifier, keyword or number.
    Ident(String),
    /// A string literal's value (escapes resolved; raw and byte strings too).
    Str(String),
    Punct(char),
}

impl Tok {
    fn is_ident(&self, s: &str) -> bool {
        matches!(self, Tok::Ident(i) if i == s)
    }
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    /// 1-based line of the token's start.
    line: usize,
}

fn lex(src: &str) -> Vec<Token> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Advances over c[from..to], counting newlines.
    let count = |from: usize, to: usize, line: &mut usize| {
        *line += c[from..to.min(c.len())].iter().filter(|&&ch| ch == '\n').count();
    };
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        let start_line = line;
        if ch.is_whitespace() {
            if ch == '\n' {
                line += 1;
            }
            i += 1;
        } else if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            let from = i;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            count(from, i, &mut line);
        } else if let Some((value, end)) = string_at(&c, i) {
            count(i, end, &mut line);
            out.push(Token {
                tok: Tok::Str(value),
                line: start_line,
            });
            i = end;
        } else if ch == '\'' {
            // A char literal ('x', '\n', '\u{1F600}') or a lifetime ('a).
            if next == Some('\\') {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let from = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Token {
                tok: Tok::Ident(c[from..i].iter().collect()),
                line: start_line,
            });
        } else {
            out.push(Token {
                tok: Tok::Punct(ch),
                line: start_line,
            });
            i += 1;
        }
    }
    out
}

/// The string literal starting at `c[i]` (`"…"`, `b"…"`, `r"…"`, `r#"…"#`,
/// `br#"…"#`), as its value and the index after it.
fn string_at(c: &[char], i: usize) -> Option<(String, usize)> {
    let mut j = i;
    // Only at the start of a token: `br"` inside an identifier is not a string.
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) == Some(&'r') {
        j += 1;
        let hashes = c[j..].iter().take_while(|&&ch| ch == '#').count();
        j += hashes;
        if c.get(j) != Some(&'"') {
            return None;
        }
        j += 1;
        let from = j;
        while j < c.len() {
            if c[j] == '"' && c[j + 1..].iter().take(hashes).filter(|&&ch| ch == '#').count() == hashes {
                return Some((c[from..j].iter().collect(), j + 1 + hashes));
            }
            j += 1;
        }
        return Some((c[from..].iter().collect(), c.len()));
    }
    if c.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    let mut value = String::new();
    while j < c.len() {
        match c[j] {
            '"' => return Some((value, j + 1)),
            '\\' => {
                j += 1;
                match c.get(j) {
                    Some('n') => value.push('\n'),
                    Some('t') => value.push('\t'),
                    Some('r') => value.push('\r'),
                    Some('0') => value.push('\0'),
                    Some('\n') => {
                        // A line continuation: the newline and the next line's indentation.
                        while c.get(j + 1).is_some_and(|ch| ch.is_whitespace()) {
                            j += 1;
                        }
                    }
                    Some(&other) => value.push(other),
                    None => {}
                }
                j += 1;
            }
            other => {
                value.push(other);
                j += 1;
            }
        }
    }
    Some((value, c.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNTIME: &str = r#"
macro_rules! env_vars {
    ($($name:ident = $default:literal, $meaning:literal;)*) => {};
}
env_vars! {
    OUTBOX_A = "1", "the \"a\" knob";
    OUTBOX_B = "(none)", "the b knob";
}
fn read() { get(Self::OUTBOX_A); get(Self::OUTBOX_B); }
"#;

    const README_OK: &str = "# X\n\n## Configuration\n\n\
        | variable | default | meaning |\n\
        |---|---|---|\n\
        | `OUTBOX_A` | `1` | the \"a\" knob |\n\
        | `OUTBOX_B` | (none) | the b knob |\n\
        | `OUTBOX_T` | (unset) | a test knob |\n\
        \nMore text.\n";

    const TEST: &[(&str, &str, &str)] = &[("OUTBOX_T", "(unset)", "a test knob")];

    /// Inputs that pass, changed by `edit`.
    fn env(edit: impl FnOnce(&mut Inputs)) -> Vec<String> {
        let mut inputs = Inputs {
            definitions: vec![File::new("rt/config.rs", RUNTIME)],
            rust: vec![
                File::new("rt/config.rs", RUNTIME),
                File::new(
                    "tests/t.rs",
                    "std::env::var(\"OUTBOX_T\"); // OUTBOX_* and OUTBOX_ are prefixes",
                ),
            ],
            markdown: vec![File::new(
                "docs/ops.md",
                "| `OUTBOX_A` | `1` (more) | x |\nSet OUTBOX_B.\n",
            )],
            readme: File::new("README.md", README_OK),
            checks: vec![],
            check_list: File::new("mod.rs", ""),
        };
        edit(&mut inputs);
        env_problems(&inputs, TEST)
    }

    /// `problems` is one line that contains every one of `want`.
    #[track_caller]
    fn one(problems: Vec<String>, want: &[&str]) {
        assert_eq!(problems.len(), 1, "{problems:#?}");
        for w in want {
            assert!(problems[0].contains(w), "{:?} lacks {w:?}", problems[0]);
        }
    }

    #[test]
    fn consistent_inputs_pass() {
        assert_eq!(env(|_| {}), Vec::<String>::new());
    }

    #[test]
    fn a_name_in_code_missing_from_the_table_fails() {
        let p = env(|i| {
            i.rust.push(File::new(
                "src/new.rs",
                "\n\nvar(\"OUTBOX_NEW\"); var(\"OUTBOX_NEW\")",
            ))
        });
        one(p, &["src/new.rs:3", "`OUTBOX_NEW`", "not in README.md"]);
    }

    #[test]
    fn a_row_nothing_reads_fails() {
        // OUTBOX_B is only defined (and named in a comment of another file's block).
        let p = env(|i| {
            i.rust[0].text = RUNTIME.replace("get(Self::OUTBOX_B); ", "");
            i.definitions[0].text = i.rust[0].text.clone();
        });
        one(p, &["README.md:8", "`OUTBOX_B`", "outside its definition"]);
        // A test variable no code reads.
        let p = env(|i| {
            i.rust.pop();
        });
        one(p, &["`OUTBOX_T`", "outside its definition"]);
    }

    #[test]
    fn a_table_row_defined_nowhere_fails() {
        let readme = README_OK.replace("\n\nMore", "\n| `OUTBOX_OLD` | `x` | gone |\n\nMore");
        let p = env(|i| i.readme.text = readme);
        assert!(
            p.iter().any(|l| l.contains("README.md:10")
                && l.contains("`OUTBOX_OLD`")
                && l.contains("defined nowhere")),
            "{p:#?}"
        );
    }

    #[test]
    fn a_definition_missing_from_the_table_fails() {
        let p = env(|i| i.readme.text = README_OK.replace("| `OUTBOX_B` | (none) | the b knob |\n", ""));
        one(
            p,
            &[
                "`OUTBOX_B`",
                "rt/config.rs:7",
                "missing from the configuration table",
            ],
        );
    }

    #[test]
    fn a_default_that_differs_fails() {
        let p = env(|i| i.readme.text = README_OK.replace("| `1` |", "| `2` |"));
        one(
            p,
            &[
                "README.md:7",
                "`OUTBOX_A`",
                "default `2` in the table, `1` in rt/config.rs:6",
            ],
        );
        // Also in another document's table.
        let p = env(|i| i.markdown[0].text = "| `OUTBOX_A` | `10` | x |\n".into());
        one(p, &["docs/ops.md:1", "`OUTBOX_A`", "default `10`"]);
    }

    #[test]
    fn a_meaning_or_order_that_differs_fails_and_fix_repairs_it() {
        let p = env(|i| i.readme.text = README_OK.replace("the b knob", "the B knob"));
        one(p, &["README.md:8", "`OUTBOX_B`", "meaning differs"]);
        let swapped = README_OK.replace(
            "| `OUTBOX_A` | `1` | the \"a\" knob |\n| `OUTBOX_B` | (none) | the b knob |",
            "| `OUTBOX_B` | (none) | the b knob |\n| `OUTBOX_A` | `1` | the \"a\" knob |",
        );
        let p = env(|i| i.readme.text = swapped.clone());
        one(p, &["README.md:5", "not the one generated"]);

        let (vars, problems) = definitions(&[File::new("rt/config.rs", RUNTIME)], TEST);
        assert!(problems.is_empty(), "{problems:?}");
        let fixed = generate_readme(&swapped, &vars).unwrap();
        assert_eq!(fixed, README_OK);
        assert_eq!(env(|i| i.readme.text = fixed), Vec::<String>::new());
    }

    #[test]
    fn a_docs_name_that_is_no_variable_fails() {
        let p = env(|i| i.markdown[0].text.push_str("\nexport OUTBOX_TYPO=1\n"));
        one(p, &["docs/ops.md:4", "`OUTBOX_TYPO`"]);
    }

    #[test]
    fn a_variable_defined_twice_fails() {
        let p = env(|i| {
            i.definitions
                .push(File::new("cli.rs", "env_vars! { OUTBOX_T = \"1\", \"again\"; }"))
        });
        assert!(
            p.iter().any(|l| l.contains("`OUTBOX_T` is defined twice")),
            "{p:#?}"
        );
    }

    #[test]
    fn an_unreadable_definition_fails() {
        let p = env(|i| i.definitions[0].text = RUNTIME.replace("OUTBOX_A = \"1\",", "OUTBOX_A = 1,"));
        assert!(
            p.iter().any(|l| l.contains("rt/config.rs:6: cannot read")),
            "{p:#?}"
        );
        let p = env(|i| i.definitions[0].text = "const X: &str = \"OUTBOX_A\";".into());
        assert!(p.iter().any(|l| l.contains("found no `env_vars!")), "{p:#?}");
        let p = env(|i| i.readme.text = "# no table\n".into());
        assert!(p.iter().any(|l| l.contains("no configuration table")), "{p:#?}");
    }

    const CHECKS: &str = "
/// ```
/// pub async fn in_a_doc_comment<H: Harness>(h: &H) {}
/// ```
pub async fn first<H: Harness>(h: &H) {}
pub(crate) async fn helper<H: Harness>(h: &H) {}
pub async fn not_a_check(x: u8) {}
/* pub async fn commented_out<H: Harness>(h: &H) {} */
pub async fn second<H: Harness + Send>(h: &H) { let s = \"pub async fn in_a_string<H: Harness>\"; }
";

    fn list(names: &str) -> File {
        File::new(
            "checks/mod.rs",
            &format!(
                "macro_rules! for_each_check {{\n    ($m:path, $arg:expr) => {{\n        $m!($arg;\n{names}\n        );\n    }};\n}}"
            ),
        )
    }

    fn checks(names: &str) -> Vec<String> {
        check_problems(&[File::new("checks/a.rs", CHECKS)], &list(names))
    }

    #[test]
    fn registered_checks_pass() {
        assert_eq!(checks("first,\nsecond,"), Vec::<String>::new());
        assert_eq!(checks("second, first"), Vec::<String>::new());
    }

    #[test]
    fn an_unlisted_check_fails() {
        one(
            checks("first,"),
            &["checks/a.rs:9", "`second` is not listed in for_each_check!"],
        );
    }

    #[test]
    fn a_listed_name_without_a_check_fails() {
        one(
            checks("first,\nsecond,\nhelper,"),
            &["checks/mod.rs:6", "`helper`", "no `pub async fn` check"],
        );
    }

    #[test]
    fn a_name_listed_twice_fails() {
        one(
            checks("first,\nsecond,\nfirst,"),
            &["checks/mod.rs:6", "`first` twice (also at line 4)"],
        );
    }

    #[test]
    fn an_unreadable_list_or_no_checks_fails() {
        one(checks("first, second: [third]"), &["cannot read the list"]);
        let p = check_problems(&[File::new("checks/a.rs", "fn x() {}")], &list("first,"));
        assert!(
            p.iter().any(|l| l.contains("found no conformance check")),
            "{p:#?}"
        );
    }

    #[test]
    fn the_lexer_skips_comments_chars_and_lifetimes() {
        let toks: Vec<Tok> = lex("a /* x /* y */ \" */ 'b' '\\'' &'static r#\"q\"\"# b\"z\\\"\" // c\nd")
            .into_iter()
            .map(|t| t.tok)
            .collect();
        assert_eq!(
            toks,
            [
                Tok::Ident("a".into()),
                Tok::Punct('&'),
                Tok::Ident("static".into()),
                Tok::Str("q\"".into()),
                Tok::Str("z\"".into()),
                Tok::Ident("d".into()),
            ]
        );
        assert_eq!(
            env_names("OUTBOX_A XOUTBOX_B OUTBOX_ OUTBOX_* OUTBOX_Cx\nOUTBOX_D_"),
            [(1, "OUTBOX_A".to_owned()), (2, "OUTBOX_D".to_owned())]
        );
    }
}
