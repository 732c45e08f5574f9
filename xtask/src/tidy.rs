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
//! - **The architecture document** (`docs/architecture.md`) has at most
//!   [`ARCHITECTURE_WORDS`] words (whitespace-separated, as `wc -w` counts):
//!   a newcomer reads it in ten minutes; detail goes to the ADRs.
//! - **Dependencies.** Every direct dependency that a workspace Cargo.toml
//!   declares (`[workspace.dependencies]`, and each member's
//!   `[dependencies]`, `[dev-dependencies]`, `[build-dependencies]`, other
//!   than `outbox-*` and path crates) has a row in ADR 0004's table (a
//!   backticked name in the row's first cell, outside parentheses), and
//!   every name a row gives there is such a dependency.
//! - **Boundaries as text** (the "must not" lines of the architecture
//!   document that text can check): every member inherits the workspace
//!   lints (`unsafe_code = "forbid"`); the crates in [`NO_DEPS`] declare
//!   none of their forbidden dependencies; the Rust sources in [`NO_TEXT`]
//!   contain none of their forbidden calls.
//! - **Module cycles.** In every crate under [`CYCLE_DIRS`], no module
//!   imports a module that imports it back, directly or around a longer
//!   cycle (strongly connected sets, Tarjan's algorithm). A module imports
//!   another when its code names an item of it: `use crate::b::X`,
//!   `super::X`, `self::b::f()`, `b::f()` for a child `b`, followed through
//!   re-exports to the module that writes the item; declaring `mod b;` is no
//!   import, and `#[cfg(test)]` items and `macro_rules!` bodies are skipped.
//!   Each cycle is printed with where each import is; [`ALLOWED_CYCLES`]
//!   lists the few left, each with its reason.
//!
//! Stale intra-doc links are not checked here: `cargo doc` with
//! `RUSTDOCFLAGS=-D warnings` (a step of `cargo xtask ci`) refuses them.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::step::root;

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
    let docs = DocInputs::read(&root, &inputs.rust)?;
    problems.extend(doc_problems(&docs));
    problems.extend(cycle_problems(&read_crates(&root)?, ALLOWED_CYCLES));
    for p in &problems {
        eprintln!("tidy: {p}");
    }
    if !problems.is_empty() {
        bail!("tidy: {} problem(s)", problems.len());
    }
    eprintln!(
        "ok: variables, README table, conformance checks, the architecture doc's length, \
         ADR 0004's dependencies and the boundaries agree; no module cycles"
    );
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
// Documentation and manifests

const ARCHITECTURE: &str = "docs/architecture.md";
const DEPENDENCY_ADR: &str = "docs/adr/0004-dependencies.md";

/// The architecture document's word limit: ten minutes of reading.
const ARCHITECTURE_WORDS: usize = 2000;

/// Direct dependencies a crate must not declare (normal and build
/// dependencies; dev-dependencies may), as (manifest, names, why): the
/// "must not" lines of docs/architecture.md that a manifest shows.
const NO_DEPS: &[(&str, &[&str], &str)] = &[
    (
        "crates/outbox-core/Cargo.toml",
        &["tokio", "tokio-util", "sqlx", "rusqlite", "libsqlite3-sys", "mio"],
        "outbox-core does no I/O and names no driver",
    ),
    (
        "crates/outbox-sql/Cargo.toml",
        &["sqlx", "rusqlite", "libsqlite3-sys"],
        "outbox-sql holds the shared SQL, not a driver",
    ),
    (
        "crates/outbox-runtime/Cargo.toml",
        &["sqlx", "rusqlite", "libsqlite3-sys"],
        "the runtime reaches a database only through the ports (and the adapters of open.rs)",
    ),
];

/// Text that must not occur in the Rust sources under a folder, as (folder,
/// files allowed to, text, why).
const NO_TEXT: &[(&str, &[&str], &str, &str)] = &[
    (
        "crates/outbox-core/src/",
        &["crates/outbox-core/src/time.rs"],
        "SystemTime::now",
        "outbox-core reads the wall clock only in `SystemClock` (time.rs)",
    ),
    (
        "crates/outbox-core/src/",
        &[],
        "Instant::now",
        "outbox-core reads no clock but `SystemClock`",
    ),
    (
        "crates/outbox-core/src/",
        &[],
        "std::fs",
        "outbox-core does no I/O",
    ),
    (
        "crates/outbox-core/src/",
        &[],
        "std::net",
        "outbox-core does no I/O",
    ),
    (
        "crates/outbox-core/src/",
        &[],
        "thread::sleep",
        "outbox-core does not sleep",
    ),
    (
        "crates/outbox-runtime/src/",
        &[
            "crates/outbox-runtime/src/open.rs",
            "crates/outbox-runtime/src/testing.rs",
        ],
        ".journal()",
        "the runtime calls its journal through the bounded store (`inner.journal`, bounded.rs): \
         the public accessor is the application's, without the store deadline",
    ),
    (
        "crates/outbox-runtime/src/",
        &[
            "crates/outbox-runtime/src/open.rs",
            "crates/outbox-runtime/src/testing.rs",
        ],
        ".store()",
        "the runtime calls its projection store through the bounded store (`inner.store`, \
         bounded.rs): the public accessor is the application's, without the store deadline",
    ),
    (
        "crates/",
        &[],
        "pg_advisory_lock(",
        "Postgres locks are transaction-scoped (`pg_advisory_xact_lock`): a session lock outlives a failed call",
    ),
    (
        "crates/",
        &[],
        "pg_try_advisory_lock(",
        "Postgres locks are transaction-scoped (`pg_try_advisory_xact_lock`)",
    ),
    (
        "crates/",
        &[],
        "pg_advisory_lock_shared(",
        "Postgres locks are transaction-scoped (`pg_advisory_xact_lock_shared`)",
    ),
];

/// What the documentation and manifest checks read, and the boundary rules.
struct DocInputs {
    architecture: File,
    dependency_adr: File,
    /// The root Cargo.toml first, then each member's.
    manifests: Vec<File>,
    /// Every Rust source (but this file).
    rust: Vec<File>,
    /// [`NO_DEPS`], or a test's rules.
    no_deps: &'static [(&'static str, &'static [&'static str], &'static str)],
    /// [`NO_TEXT`], or a test's rules.
    no_text: &'static [(&'static str, &'static [&'static str], &'static str, &'static str)],
}

impl DocInputs {
    fn read(root: &Path, rust: &[File]) -> Result<Self> {
        let read = |rel: &str| -> Result<File> {
            let text = fs::read_to_string(root.join(rel)).with_context(|| format!("reading {rel}"))?;
            Ok(File {
                path: rel.into(),
                text,
            })
        };
        let workspace = read("Cargo.toml")?;
        let mut manifests = vec![];
        for member in members(&workspace.text) {
            match member.strip_suffix("/*") {
                Some(dir) => {
                    let mut subdirs: Vec<String> = fs::read_dir(root.join(dir))
                        .with_context(|| format!("reading {dir}"))?
                        .filter_map(|e| e.ok())
                        .map(|e| format!("{dir}/{}/Cargo.toml", e.file_name().to_string_lossy()))
                        .filter(|rel| root.join(rel).is_file())
                        .collect();
                    subdirs.sort();
                    for rel in subdirs {
                        manifests.push(read(&rel)?);
                    }
                }
                None => manifests.push(read(&format!("{member}/Cargo.toml"))?),
            }
        }
        manifests.insert(0, workspace);
        Ok(DocInputs {
            architecture: read(ARCHITECTURE)?,
            dependency_adr: read(DEPENDENCY_ADR)?,
            manifests,
            rust: rust.to_vec(),
            no_deps: NO_DEPS,
            no_text: NO_TEXT,
        })
    }
}

/// The documentation and manifest rules.
fn doc_problems(inputs: &DocInputs) -> Vec<String> {
    let mut problems = Vec::new();
    let words = inputs.architecture.text.split_whitespace().count();
    if words > ARCHITECTURE_WORDS {
        problems.push(format!(
            "{}: {words} words, more than {ARCHITECTURE_WORDS} (ten minutes of reading): \
             move detail that records a decision into its ADR",
            inputs.architecture.path
        ));
    }
    problems.extend(dependency_problems(&inputs.manifests, &inputs.dependency_adr));
    problems.extend(boundary_problems(inputs));
    problems
}

/// The `members = [..]` of a workspace Cargo.toml, as written (globs kept).
fn members(text: &str) -> Vec<String> {
    let Some(start) = text.find("members") else {
        return vec![];
    };
    let rest = &text[start..];
    let (Some(open), Some(close)) = (rest.find('['), rest.find(']')) else {
        return vec![];
    };
    rest[open + 1..close]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

/// One declared dependency.
#[derive(Clone, Debug, PartialEq)]
struct Dep {
    /// The crate's name (its `package = ".."` when renamed).
    name: String,
    /// `workspace.dependencies`, `dependencies`, `dev-dependencies` or
    /// `build-dependencies` (a `target.….` prefix dropped).
    kind: String,
    /// `path:line`.
    at: String,
    /// An `outbox-*` crate or a path dependency: part of the workspace.
    internal: bool,
}

/// The dependencies a Cargo.toml declares, read as text: one `name = ..`
/// (or `name.key = ..`) line per dependency under a dependency table, or a
/// `[dependencies.name]` table.
fn dependencies(f: &File) -> Vec<Dep> {
    let mut deps: Vec<Dep> = Vec::new();
    // The current table's kind when it lists dependencies.
    let mut kind: Option<String> = None;
    // Whether the current table is one dependency's (`[dependencies.name]`).
    let mut one_dep = false;
    // Brackets and braces still open from the lines before (a value over
    // several lines).
    let mut depth = 0i32;
    for (i, raw) in f.text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim_end();
        let at = format!("{}:{}", f.path, i + 1);
        if depth == 0 && line.starts_with('[') {
            let table = line.trim_matches(|c| c == '[' || c == ']').trim();
            // `target.'cfg(..)'.dependencies` counts as `dependencies`.
            let table = match table.rfind("'.") {
                Some(j) if table.starts_with("target.") => &table[j + 2..],
                _ => table,
            };
            kind = None;
            one_dep = false;
            for k in DEP_TABLES {
                if table == *k {
                    kind = Some((*k).to_owned());
                } else if let Some(name) = table.strip_prefix(k).and_then(|r| r.strip_prefix('.')) {
                    // `[dependencies.name]`: its keys follow; `path` may be among them.
                    one_dep = true;
                    deps.push(Dep {
                        name: name.trim_matches('"').to_owned(),
                        kind: (*k).to_owned(),
                        at: at.clone(),
                        internal: name.starts_with("outbox-"),
                    });
                }
            }
            continue;
        }
        let starts_value = depth == 0;
        for c in line.chars() {
            match c {
                '[' | '{' => depth += 1,
                ']' | '}' => depth -= 1,
                _ => {}
            }
        }
        if !starts_value {
            continue;
        }
        let Some(kind) = &kind else {
            // Keys of a `[dependencies.name]` table.
            if let Some(last) = deps.last_mut()
                && one_dep
                && line.trim_start().starts_with("path")
            {
                last.internal = true;
            }
            continue;
        };
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let name = key.split('.').next().unwrap_or(key).trim_matches('"');
        if name.is_empty() {
            continue;
        }
        let package = value
            .split_once("package")
            .and_then(|(_, r)| r.split('"').nth(1))
            .map(str::to_owned);
        let name = package.unwrap_or_else(|| name.to_owned());
        let internal = name.starts_with("outbox-")
            || value.contains("path =")
            || value.contains("path=")
            || key.ends_with(".path");
        deps.push(Dep {
            name,
            kind: kind.clone(),
            at,
            internal,
        });
    }
    deps
}

/// The tables whose keys are dependencies.
const DEP_TABLES: &[&str] = &[
    "workspace.dependencies",
    "dependencies",
    "dev-dependencies",
    "build-dependencies",
];

/// The crate names a dependency table of ADR 0004 gives: in each row's first
/// cell, the backticked names outside parentheses (`` `clap` (`derive`, ..) ``
/// names clap, not its features), with the row's 1-based line.
fn adr_dependency_names(text: &str) -> Vec<(usize, String)> {
    let mut names = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(inner) = line.trim().strip_prefix('|') else {
            continue;
        };
        let first = inner.split('|').next().unwrap_or("");
        if first
            .trim()
            .chars()
            .all(|c| c == '-' || c == ':' || c.is_whitespace())
        {
            continue;
        }
        let mut parens = 0i32;
        let mut in_code = false;
        let mut current = String::new();
        for c in first.chars() {
            match c {
                '`' if in_code => {
                    in_code = false;
                    if parens == 0 {
                        names.push((i + 1, std::mem::take(&mut current)));
                    }
                    current.clear();
                }
                '`' => in_code = true,
                _ if in_code => current.push(c),
                '(' => parens += 1,
                ')' => parens -= 1,
                _ => {}
            }
        }
    }
    names
}

/// ADR 0004 names every external direct dependency, and names no crate that
/// is none.
fn dependency_problems(manifests: &[File], adr: &File) -> Vec<String> {
    let mut problems = Vec::new();
    // Each external dependency and where it is declared.
    let mut declared: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in manifests {
        for d in dependencies(f) {
            if !d.internal {
                declared.entry(d.name).or_default().push(d.at);
            }
        }
    }
    let named = adr_dependency_names(&adr.text);
    if named.is_empty() {
        problems.push(format!(
            "{}: found no dependency table (rows whose first cell names crates in backticks)",
            adr.path
        ));
        return problems;
    }
    let named_set: BTreeSet<&str> = named.iter().map(|(_, n)| n.as_str()).collect();
    let missing: Vec<String> = declared
        .iter()
        .filter(|(name, _)| !named_set.contains(name.as_str()))
        .map(|(name, at)| match at.len() {
            1 => format!("`{name}` ({})", at[0]),
            n => format!("`{name}` ({} and {} more)", at[0], n - 1),
        })
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{}: no row for these direct dependencies (add one each, with why it is used): {}",
            adr.path,
            missing.join("; ")
        ));
    }
    for (line, name) in &named {
        if !declared.contains_key(name) {
            problems.push(format!(
                "{}:{line}: a row names `{name}`, which no Cargo.toml of the workspace declares \
                 (a removed dependency: say so in Consequences and drop the row)",
                adr.path
            ));
        }
    }
    problems
}

/// The boundaries that manifests and sources show as text.
fn boundary_problems(inputs: &DocInputs) -> Vec<String> {
    let (manifests, rust) = (&inputs.manifests, &inputs.rust);
    let mut problems = Vec::new();
    // Every member (not the root, which defines the lints) inherits them.
    for f in manifests.iter().filter(|f| f.path != "Cargo.toml") {
        let inherits = f
            .text
            .lines()
            .skip_while(|l| l.trim() != "[lints]")
            .nth(1)
            .map(str::trim)
            == Some("workspace = true");
        if !inherits {
            problems.push(format!(
                "{}: no `[lints]` with `workspace = true` right below it: the crate would escape \
                 `unsafe_code = \"forbid\"` and the other workspace lints",
                f.path
            ));
        }
    }
    for (manifest, names, why) in inputs.no_deps {
        let Some(f) = manifests.iter().find(|f| f.path == *manifest) else {
            problems.push(format!("{manifest}: not a workspace member (NO_DEPS in {SELF})"));
            continue;
        };
        for d in dependencies(f) {
            if d.kind != "dev-dependencies" && names.contains(&d.name.as_str()) {
                problems.push(format!("{}: declares `{}`, but {why}", d.at, d.name));
            }
        }
    }
    for (under, allowed, text, why) in inputs.no_text {
        for f in rust {
            if !f.path.starts_with(under) || allowed.contains(&f.path.as_str()) {
                continue;
            }
            for (i, line) in f.text.lines().enumerate() {
                if line.contains(text) {
                    problems.push(format!("{}:{}: `{text}`: {why}", f.path, i + 1));
                }
            }
        }
    }
    problems
}

// ---------------------------------------------------------------------------
// Module cycles

/// The directories whose crates' module graphs are checked for cycles: each
/// `src/lib.rs` and `src/main.rs` is a crate root.
const CYCLE_DIRS: &[&str] = &["crates/*", "xtask", "bench", "crash"];

/// Cycles known and accepted for now, as (crate, modules, why): a cycle is
/// allowed when all its modules are among an entry's. Each entry is a debt
/// that issue 42 names; a module an entry lists that is in no cycle any more
/// is a problem (the list only shrinks).
const ALLOWED_CYCLES: &[(&str, &[&str], &str)] = &[];

/// One crate root's modules: each module's path (`a::b`, `crate` for the
/// root) with the file it is written in.
struct CrateModules {
    /// The crate's directory, with ` (main.rs)` for a binary beside a library.
    name: String,
    modules: Vec<(String, File)>,
}

/// The crates under [`CYCLE_DIRS`]; a `src/main.rs` beside a `src/lib.rs` is
/// its own crate root.
fn read_crates(root: &Path) -> Result<Vec<CrateModules>> {
    let mut dirs = Vec::new();
    for dir in CYCLE_DIRS {
        match dir.strip_suffix("/*") {
            Some(parent) => {
                let mut subdirs: Vec<String> = fs::read_dir(root.join(parent))
                    .with_context(|| format!("reading {parent}"))?
                    .filter_map(|e| e.ok())
                    .map(|e| format!("{parent}/{}", e.file_name().to_string_lossy()))
                    .collect();
                subdirs.sort();
                dirs.extend(subdirs);
            }
            None => dirs.push((*dir).to_owned()),
        }
    }
    let read = |rel: &str| fs::read_to_string(root.join(rel)).ok();
    let mut crates = Vec::new();
    for dir in dirs {
        let lib = format!("{dir}/src/lib.rs");
        let has_lib = root.join(&lib).is_file();
        if has_lib {
            crates.push(CrateModules {
                name: dir.clone(),
                modules: crate_modules(&lib, &read),
            });
        }
        let main = format!("{dir}/src/main.rs");
        if root.join(&main).is_file() {
            crates.push(CrateModules {
                name: if has_lib {
                    format!("{dir} (main.rs)")
                } else {
                    dir.clone()
                },
                modules: crate_modules(&main, &read),
            });
        }
    }
    Ok(crates)
}

/// The modules reachable from the crate root `root_file` through `mod name;`
/// declarations (not `#[cfg(test)]` ones), read with `read`.
fn crate_modules(root_file: &str, read: &dyn Fn(&str) -> Option<String>) -> Vec<(String, File)> {
    let mut modules = Vec::new();
    let mut todo = vec![(Vec::<String>::new(), root_file.to_owned())];
    while let Some((module, path)) = todo.pop() {
        let Some(text) = read(&path) else { continue };
        // `a.rs` keeps its children in `a/`; lib.rs, main.rs and mod.rs in their folder.
        let (dir, stem) = path.rsplit_once('/').unwrap_or(("", path.as_str()));
        let child_dir = match stem {
            "lib.rs" | "main.rs" | "mod.rs" => dir.to_owned(),
            _ => format!("{dir}/{}", stem.trim_end_matches(".rs")),
        };
        let file = File { path, text };
        for (inline, child) in module_scan(&module, &lex(&file.text)).child_files {
            let rel: Vec<&str> = inline.iter().map(String::as_str).collect();
            let base = if rel.is_empty() {
                child_dir.clone()
            } else {
                format!("{child_dir}/{}", rel.join("/"))
            };
            let flat = format!("{base}/{child}.rs");
            let nested = format!("{base}/{child}/mod.rs");
            let path = if read(&flat).is_some() { flat } else { nested };
            let mut child_module = module.clone();
            child_module.extend(inline);
            child_module.push(child);
            todo.push((child_module, path));
        }
        modules.push((module_name(&module), file));
    }
    modules.sort_by(|a, b| a.0.cmp(&b.0));
    modules
}

/// `a::b`, or `crate` for the root.
fn module_name(module: &[String]) -> String {
    if module.is_empty() {
        "crate".into()
    } else {
        module.join("::")
    }
}

/// A path that a module's code names, as written.
#[derive(Clone, Debug, PartialEq)]
struct PathRef {
    /// The module whose code names it (an inline module's own path).
    module: Vec<String>,
    /// The segments, from the first (`crate`, `self`, `super` or a name).
    segments: Vec<String>,
    /// In a `use`: the name it binds (`as` or the last segment), `*` for a glob.
    binds: Option<String>,
    /// A macro's path (`crate::name!`): it leads to the module that defines
    /// the macro, not to the crate root that `#[macro_export]` puts it in.
    macro_call: bool,
    line: usize,
}

/// What one file declares and names.
#[derive(Debug, Default)]
struct ModuleScan {
    /// `mod name;` declarations, as (the inline modules around it, name).
    child_files: Vec<(Vec<String>, String)>,
    /// The inline `mod name { .. }` modules (full paths).
    inline_modules: Vec<Vec<String>>,
    /// The `macro_rules! name` defined, as (module, name).
    macros: Vec<(Vec<String>, String)>,
    paths: Vec<PathRef>,
}

/// Reads the declarations and paths of the file of `module`, skipping every
/// item under `#[cfg(test)]` (a test module may import its parent) and the
/// bodies of `macro_rules!` (their paths resolve where the macro expands).
fn module_scan(module: &[String], toks: &[Token]) -> ModuleScan {
    let mut scan = ModuleScan::default();
    // The inline modules open around the cursor, with the brace depth inside each.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let current = |inline: &[(String, usize)]| -> Vec<String> {
        module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(m, _)| m.clone()))
            .collect()
    };
    let punct = |i: usize, ch: char| toks.get(i).is_some_and(|t| t.tok == Tok::Punct(ch));
    let ident = |i: usize| match toks.get(i).map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s.as_str()),
        _ => None,
    };
    let path_sep = |i: usize| punct(i, ':') && punct(i + 1, ':');
    let mut i = 0;
    while i < toks.len() {
        if is_cfg_test(toks, i) {
            i = skip_item(toks, i);
            continue;
        }
        match &toks[i].tok {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(kw) if kw == "macro_rules" && punct(i + 1, '!') => {
                if let Some(name) = ident(i + 2) {
                    scan.macros.push((current(&inline), name.to_owned()));
                }
                i = skip_item(toks, i);
                continue;
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let Some(name) = ident(i + 1) {
                    if punct(i + 2, ';') {
                        let around = inline.iter().map(|(m, _)| m.clone()).collect();
                        scan.child_files.push((around, name.to_owned()));
                    } else if punct(i + 2, '{') {
                        inline.push((name.to_owned(), depth + 1));
                        scan.inline_modules.push(current(&inline));
                    }
                }
            }
            Tok::Ident(kw) if kw == "use" && !punct(i + 1, '$') => {
                // `use ::other::X` names another crate: use_tree reads nothing.
                let mut trees = Vec::new();
                let end = use_tree(toks, i + 1, Vec::new(), &mut trees);
                for (segments, binds) in trees {
                    scan.paths.push(PathRef {
                        module: current(&inline),
                        segments,
                        binds: Some(binds),
                        macro_call: false,
                        line: toks[i].line,
                    });
                }
                i = end;
                continue;
            }
            Tok::Ident(first) if path_sep(i + 1) => {
                // The start of a path: not a later segment, not `$crate`, not `pub(in crate::x)`.
                let starts = i == 0
                    || !(punct(i - 1, ':')
                        || punct(i - 1, '$')
                        || punct(i - 1, '.')
                        || ident(i - 1) == Some("in"));
                if starts && first.chars().next().is_some_and(|c| c.is_lowercase()) {
                    let line = toks[i].line;
                    let mut segments = vec![first.clone()];
                    let mut j = i + 1;
                    while path_sep(j)
                        && let Some(s) = ident(j + 2)
                    {
                        segments.push(s.to_owned());
                        j += 3;
                    }
                    scan.paths.push(PathRef {
                        module: current(&inline),
                        segments,
                        binds: None,
                        macro_call: punct(j, '!'),
                        line,
                    });
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// Whether `toks[i..]` starts with `#[cfg(test)]`.
fn is_cfg_test(toks: &[Token], i: usize) -> bool {
    let want = [
        Tok::Punct('#'),
        Tok::Punct('['),
        Tok::Ident("cfg".into()),
        Tok::Punct('('),
    ];
    let test = [Tok::Ident("test".into()), Tok::Punct(')'), Tok::Punct(']')];
    toks.len() >= i + 7
        && toks[i..i + 4].iter().zip(&want).all(|(t, w)| t.tok == *w)
        && toks[i + 4..i + 7].iter().zip(&test).all(|(t, w)| t.tok == *w)
}

/// The index after the item whose attributes start at `toks[i]`: after its
/// `;` or its closing brace at the item's own level.
fn skip_item(toks: &[Token], mut i: usize) -> usize {
    let mut depth = 0i32;
    // Attributes first: `#[..]` blocks.
    while toks.get(i).is_some_and(|t| t.tok == Tok::Punct('#')) {
        i += 1;
        let mut d = 0;
        while i < toks.len() {
            match toks[i].tok {
                Tok::Punct('[') => d += 1,
                Tok::Punct(']') => {
                    d -= 1;
                    if d == 0 {
                        i += 1;
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
    while i < toks.len() {
        match toks[i].tok {
            Tok::Punct('{' | '(' | '[') => depth += 1,
            Tok::Punct('}') if depth == 1 => return i + 1,
            Tok::Punct('}' | ')' | ']') => depth -= 1,
            Tok::Punct(';') if depth == 0 => return i + 1,
            _ => {}
        }
        i += 1;
    }
    i
}

/// Reads the use tree at `toks[i]` under `prefix` into `out` as (segments,
/// bound name), returning the index after it (after the `;` at the top).
fn use_tree(
    toks: &[Token],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) -> usize {
    let top = prefix.is_empty();
    let mut segments = prefix;
    let finish = |i: usize| -> usize {
        if !top {
            return i;
        }
        // The rest of the statement (`;`), or whatever could not be read.
        let mut i = i;
        while i < toks.len() && toks[i].tok != Tok::Punct(';') {
            i += 1;
        }
        i + 1
    };
    loop {
        match toks.get(i).map(|t| &t.tok) {
            Some(Tok::Ident(s)) => {
                segments.push(s.clone());
                i += 1;
                let sep = |k: usize| toks.get(k).is_some_and(|t| t.tok == Tok::Punct(':'));
                if sep(i) && sep(i + 1) {
                    i += 2;
                    continue;
                }
                if segments.last().is_some_and(|s| s == "self") {
                    segments.pop();
                }
                let mut binds = segments.last().cloned().unwrap_or_default();
                if let Some(Tok::Ident(kw)) = toks.get(i).map(|t| &t.tok)
                    && kw == "as"
                {
                    if let Some(Tok::Ident(alias)) = toks.get(i + 1).map(|t| &t.tok) {
                        binds = alias.clone();
                    }
                    i += 2;
                }
                out.push((segments, binds));
                return finish(i);
            }
            Some(Tok::Punct('*')) => {
                out.push((segments, "*".into()));
                return finish(i + 1);
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                while i < toks.len() {
                    match toks[i].tok {
                        Tok::Punct('}') => {
                            i += 1;
                            break;
                        }
                        Tok::Punct(',') => i += 1,
                        _ => {
                            let next = use_tree(toks, i, segments.clone(), out);
                            // A tree that could not be read: stop rather than loop.
                            if next == i {
                                return finish(i);
                            }
                            i = next;
                        }
                    }
                }
                return finish(i);
            }
            _ => return finish(i),
        }
    }
}

/// One import between two modules: where the first names the second.
#[derive(Clone, Debug)]
struct Edge {
    from: String,
    to: String,
    /// `path:line` of the first such reference.
    at: String,
}

/// The imports between the modules of one crate: module A imports B when
/// A's code names something of B (`use crate::b::X`, `super::X`,
/// `self::b::f()`, `b::f()` for a child `b`, through re-exports to where the
/// item is written). Declaring `mod b;` is no import.
fn module_edges(modules: &[(String, File)]) -> Vec<Edge> {
    let mut known: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut macros: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut scans = Vec::new();
    for (name, f) in modules {
        let module: Vec<String> = if name == "crate" {
            vec![]
        } else {
            name.split("::").map(str::to_owned).collect()
        };
        let scan = module_scan(&module, &lex(&f.text));
        known.insert(module.clone());
        known.extend(scan.inline_modules.iter().cloned());
        for (at, name) in &scan.macros {
            macros.insert(name.clone(), at.clone());
        }
        scans.push((f, scan));
    }
    // Turns a path as written into a path from the crate root, or None for
    // another crate's (or a local name's).
    let absolute =
        |p: &PathRef, uses: &BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>>| -> Option<Vec<String>> {
            let mut segs = p.segments.iter();
            let mut base: Vec<String> = match segs.next()?.as_str() {
                "crate" => vec![],
                "self" => p.module.clone(),
                "super" => p.module[..p.module.len().checked_sub(1)?].to_vec(),
                first => {
                    let mut child = p.module.clone();
                    child.push(first.to_owned());
                    if known.contains(&child) {
                        child
                    } else if p.binds.is_none()
                        && let Some(target) = uses.get(&p.module).and_then(|u| u.get(first))
                    {
                        target.clone()
                    } else {
                        return None;
                    }
                }
            };
            let mut rest: Vec<String> = segs.cloned().collect();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest.remove(0);
            }
            base.extend(rest);
            Some(base)
        };
    // What each module's `use` declarations bind (not globs), from the crate root.
    let mut uses: BTreeMap<Vec<String>, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let empty = BTreeMap::new();
    for (_, scan) in &scans {
        for p in &scan.paths {
            if let Some(binds) = &p.binds
                && binds != "*"
                && binds != "_"
                && let Some(abs) = absolute(p, &empty)
            {
                uses.entry(p.module.clone())
                    .or_default()
                    .insert(binds.clone(), abs);
            }
        }
    }
    // The module an absolute path leads to: its longest prefix that is a
    // module, followed through the `use` that brings the next name there.
    let resolve = |path: &[String]| -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let n = (0..=path.len())
                .rev()
                .find(|&n| known.contains(&path[..n]))
                .unwrap_or(0);
            let module = &path[..n];
            let Some(target) = path.get(n).and_then(|next| uses.get(module)?.get(next)) else {
                return module.to_vec();
            };
            let mut followed = target.clone();
            followed.extend_from_slice(&path[n + 1..]);
            if followed == path {
                break;
            }
            path = followed;
        }
        let n = (0..=path.len())
            .rev()
            .find(|&n| known.contains(&path[..n]))
            .unwrap_or(0);
        path[..n].to_vec()
    };
    let mut edges: BTreeMap<(String, String), String> = BTreeMap::new();
    for (f, scan) in &scans {
        for p in &scan.paths {
            let Some(abs) = absolute(p, &uses) else { continue };
            let defined = abs.last().filter(|_| p.macro_call).and_then(|m| macros.get(m));
            let to = defined.cloned().unwrap_or_else(|| resolve(&abs));
            // A path that only leads back into its own module or down into
            // one of its inline modules' own file is no import between files.
            if to == p.module {
                continue;
            }
            let key = (module_name(&p.module), module_name(&to));
            edges
                .entry(key)
                .or_insert_with(|| format!("{}:{}", f.path, p.line));
        }
    }
    edges
        .into_iter()
        .map(|((from, to), at)| Edge { from, to, at })
        .collect()
}

/// The cycles of a crate's imports, each as `crate: a -> b -> a (where each
/// edge is)`: every 2-cycle, then for each strongly connected set (Tarjan's
/// algorithm) the shortest cycle through each module no cycle named yet.
fn module_cycles(krate: &str, edges: &[Edge]) -> Vec<(BTreeSet<String>, String)> {
    let mut next: BTreeMap<&str, Vec<&Edge>> = BTreeMap::new();
    let mut nodes: BTreeSet<&str> = BTreeSet::new();
    for e in edges {
        next.entry(&e.from).or_default().push(e);
        nodes.insert(&e.from);
        nodes.insert(&e.to);
    }
    let edge = |a: &str, b: &str| next.get(a).and_then(|es| es.iter().find(|e| e.to == b).copied());
    let render = |cycle: &[&str]| -> (BTreeSet<String>, String) {
        let hops: Vec<&Edge> = cycle
            .iter()
            .zip(cycle.iter().cycle().skip(1))
            .map(|(a, b)| edge(a, b).expect("a cycle's hops are edges"))
            .collect();
        let names: Vec<&str> = cycle.iter().copied().chain([cycle[0]]).collect();
        let at: Vec<&str> = hops.iter().map(|e| e.at.as_str()).collect();
        let set = cycle.iter().map(|s| (*s).to_owned()).collect();
        (
            set,
            format!("{krate}: {} ({})", names.join(" -> "), at.join(", ")),
        )
    };
    let mut cycles = Vec::new();
    for scc in strongly_connected(&nodes, &next) {
        let mut covered: BTreeSet<&str> = BTreeSet::new();
        for a in &scc {
            for b in &scc {
                if a < b && edge(a, b).is_some() && edge(b, a).is_some() {
                    cycles.push(render(&[a, b]));
                    covered.extend([*a, *b]);
                }
            }
        }
        for start in &scc {
            if covered.contains(start) {
                continue;
            }
            let cycle = shortest_cycle(start, &scc, &next);
            covered.extend(cycle.iter().copied());
            cycles.push(render(&cycle));
        }
    }
    cycles
}

/// The strongly connected sets of more than one module (Tarjan's algorithm),
/// each sorted.
fn strongly_connected<'a>(
    nodes: &BTreeSet<&'a str>,
    next: &BTreeMap<&'a str, Vec<&'a Edge>>,
) -> Vec<Vec<&'a str>> {
    struct Tarjan<'a, 'n> {
        next: &'n BTreeMap<&'a str, Vec<&'a Edge>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    impl<'a> Tarjan<'a, '_> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for e in self.next.get(v).into_iter().flatten() {
                let w = e.to.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w);
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

/// The shortest cycle from `start` back to it inside `scc` (breadth first).
fn shortest_cycle<'a>(
    start: &'a str,
    scc: &[&'a str],
    next: &BTreeMap<&'a str, Vec<&'a Edge>>,
) -> Vec<&'a str> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for e in next.get(v).into_iter().flatten() {
            let w = e.to.as_str();
            if !scc.contains(&w) {
                continue;
            }
            if w == start {
                let mut cycle = vec![v];
                while let Some(&p) = came_from.get(cycle.last().expect("not empty")) {
                    cycle.push(p);
                }
                cycle.reverse();
                return cycle;
            }
            if w != start && !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    vec![start]
}

/// The cycles of every crate that [`ALLOWED_CYCLES`] does not allow, and the
/// entries that allow no cycle.
fn cycle_problems(crates: &[CrateModules], allowed: &[(&str, &[&str], &str)]) -> Vec<String> {
    let mut problems = Vec::new();
    // The modules of the cycles each entry allowed.
    let mut used: Vec<BTreeSet<String>> = vec![BTreeSet::new(); allowed.len()];
    for c in crates {
        for (set, line) in module_cycles(&c.name, &module_edges(&c.modules)) {
            let allows = allowed
                .iter()
                .position(|(k, mods, _)| *k == c.name && set.iter().all(|m| mods.contains(&m.as_str())));
            match allows {
                Some(n) => used[n].extend(set),
                None => problems.push(format!(
                    "{line}: a module cycle (move what both need into a module of its own, \
                     or pass a value instead of calling back)"
                )),
            }
        }
    }
    for ((krate, mods, _), used) in allowed.iter().zip(used) {
        let stale: Vec<&str> = mods.iter().copied().filter(|m| !used.contains(*m)).collect();
        if !stale.is_empty() {
            problems.push(format!(
                "{SELF}: ALLOWED_CYCLES allows `{krate}: {}`, in no cycle any more: drop them",
                stale.join(", ")
            ));
        }
    }
    problems
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

    const WORKSPACE: &str = r#"[workspace]
members = ["crates/*", "xtask"]

[workspace.dependencies]
outbox-core = { path = "crates/outbox-core", version = "0.1.0" }
tokio = { version = "1", default-features = false }
clap = { version = "4", features = [
    "derive",
] }

[workspace.lints.rust]
unsafe_code = "forbid"
"#;

    const MEMBER: &str = r#"[package]
name = "outbox-x"

[lib]
path = "src/lib.rs"

[dependencies]
outbox-core.workspace = true
tokio = { workspace = true, features = ["rt"] } # a comment with = in it
renamed = { package = "serde_json", version = "1" }

[target.'cfg(unix)'.dependencies]
libc = "0.2"

[dev-dependencies]
outbox-x = { path = ".", features = ["test-util"] }
mockall.workspace = true

[build-dependencies.cc]
version = "1"

[dependencies.local]
path = "../local"

[lints]
workspace = true
"#;

    const ADR: &str = "| dependency | where | why |\n\
        |---|---|---|\n\
        | `tokio` (`rt`, `macros`) | everywhere | the runtime |\n\
        | `clap` and `serde_json` 1 (`derive`) | cli | parsing |\n\
        | `libc`, `cc` | x | y |\n\
        | `mockall` | tests | doubles |\n";

    fn manifests() -> Vec<File> {
        vec![
            File::new("Cargo.toml", WORKSPACE),
            File::new("crates/outbox-x/Cargo.toml", MEMBER),
        ]
    }

    #[test]
    fn manifests_are_read_as_text() {
        assert_eq!(members(WORKSPACE), ["crates/*", "xtask"]);
        let names = |f: &File| -> Vec<(String, String, bool)> {
            dependencies(f)
                .into_iter()
                .map(|d| (d.name, d.kind, d.internal))
                .collect()
        };
        let dep = |n: &str, k: &str, i: bool| (n.to_owned(), k.to_owned(), i);
        assert_eq!(
            names(&manifests()[0]),
            [
                dep("outbox-core", "workspace.dependencies", true),
                dep("tokio", "workspace.dependencies", false),
                dep("clap", "workspace.dependencies", false),
            ]
        );
        assert_eq!(
            names(&manifests()[1]),
            [
                dep("outbox-core", "dependencies", true),
                dep("tokio", "dependencies", false),
                dep("serde_json", "dependencies", false),
                dep("libc", "dependencies", false),
                dep("outbox-x", "dev-dependencies", true),
                dep("mockall", "dev-dependencies", false),
                dep("cc", "build-dependencies", false),
                dep("local", "dependencies", true),
            ]
        );
        assert_eq!(
            adr_dependency_names(ADR)
                .into_iter()
                .map(|(_, n)| n)
                .collect::<Vec<_>>(),
            ["tokio", "clap", "serde_json", "libc", "cc", "mockall"]
        );
    }

    #[test]
    fn every_dependency_has_a_row_in_adr_0004() {
        let adr = |text: &str| File::new("docs/adr/0004-dependencies.md", text);
        assert_eq!(dependency_problems(&manifests(), &adr(ADR)), Vec::<String>::new());
        // A dependency without a row, named with where it is declared.
        one(
            dependency_problems(
                &manifests(),
                &adr(&ADR.replace("| `mockall` | tests | doubles |\n", "")),
            ),
            &[
                "0004-dependencies.md: no row",
                "`mockall` (crates/outbox-x/Cargo.toml:17)",
            ],
        );
        one(
            dependency_problems(&manifests(), &adr(&ADR.replace("`tokio` (", "Tokio ("))),
            &["`tokio` (Cargo.toml:6 and 1 more)"],
        );
        // A name in parentheses is not a row of its own.
        one(
            dependency_problems(&manifests(), &adr(&ADR.replace("`cc` |", "(`cc`) |"))),
            &["`cc` (crates/outbox-x/Cargo.toml:19)"],
        );
        // A row for a crate nothing declares any more.
        one(
            dependency_problems(
                &manifests(),
                &adr(&format!("{ADR}| `futures-util` | gone | x |\n")),
            ),
            &["0004-dependencies.md:7", "`futures-util`", "no Cargo.toml"],
        );
        one(
            dependency_problems(&manifests(), &adr("no table\n")),
            &["found no dependency table"],
        );
    }

    fn docs(edit: impl FnOnce(&mut DocInputs)) -> Vec<String> {
        let mut inputs = DocInputs {
            architecture: File::new(ARCHITECTURE, &"word ".repeat(ARCHITECTURE_WORDS)),
            dependency_adr: File::new(DEPENDENCY_ADR, ADR),
            manifests: manifests(),
            rust: vec![
                File::new("crates/outbox-core/src/time.rs", "let t = SystemTime::now();"),
                File::new("crates/outbox-core/src/lib.rs", "// no clock here"),
                File::new("crates/outbox-sql/src/d.rs", "SELECT pg_advisory_xact_lock($1)"),
            ],
            no_deps: &[(
                "crates/outbox-x/Cargo.toml",
                &["sqlx", "rusqlite"],
                "outbox-x holds no driver",
            )],
            no_text: NO_TEXT,
        };
        edit(&mut inputs);
        doc_problems(&inputs)
    }

    #[test]
    fn the_architecture_doc_has_at_most_its_words() {
        assert_eq!(docs(|_| {}), Vec::<String>::new());
        one(
            docs(|i| i.architecture.text.push_str("\n\tone-more")),
            &["docs/architecture.md: 2001 words, more than 2000"],
        );
    }

    #[test]
    fn boundaries_that_text_shows_hold() {
        // A member that does not inherit the workspace lints.
        one(
            docs(|i| i.manifests[1].text = MEMBER.replace("[lints]\nworkspace = true\n", "")),
            &["crates/outbox-x/Cargo.toml", "unsafe_code"],
        );
        // A forbidden dependency (the ADR lists it: only the boundary fails);
        // as a dev-dependency it is allowed.
        let with = |section: &str| {
            docs(|i| {
                i.manifests[1].text =
                    MEMBER.replace("[lints]", &format!("{section}\nsqlx = \"0.9\"\n\n[lints]"));
                i.dependency_adr.text.push_str("| `sqlx` | x | y |\n");
            })
        };
        one(
            with("[build-dependencies]"),
            &["crates/outbox-x/Cargo.toml:26: declares `sqlx`, but outbox-x holds no driver"],
        );
        assert_eq!(with("[dev-dependencies]"), Vec::<String>::new());
        // A rule for a manifest that is not a member.
        let p = docs(|i| i.no_deps = &[("crates/gone/Cargo.toml", &["sqlx"], "x")]);
        one(p, &["crates/gone/Cargo.toml: not a workspace member"]);
        // Forbidden text, outside the files allowed it.
        one(
            docs(|i| i.rust[1].text.push_str("\nlet t = std::time::SystemTime::now();")),
            &[
                "crates/outbox-core/src/lib.rs:2",
                "`SystemTime::now`",
                "SystemClock",
            ],
        );
        one(
            docs(|i| i.rust[2].text = "SELECT pg_advisory_lock($1)".into()),
            &["crates/outbox-sql/src/d.rs:1", "transaction-scoped"],
        );
    }

    /// The modules of an in-memory crate whose root is `src/lib.rs`.
    fn krate(files: &[(&str, &str)]) -> CrateModules {
        let files: BTreeMap<String, String> = files
            .iter()
            .map(|(p, t)| (format!("src/{p}"), (*t).to_owned()))
            .collect();
        CrateModules {
            name: "k".into(),
            modules: crate_modules("src/lib.rs", &|p: &str| files.get(p).cloned()),
        }
    }

    /// The imports of an in-memory crate, as `from -> to`.
    fn imports(files: &[(&str, &str)]) -> Vec<String> {
        module_edges(&krate(files).modules)
            .into_iter()
            .map(|e| format!("{} -> {}", e.from, e.to))
            .collect()
    }

    #[test]
    fn use_trees_are_read_into_paths() {
        let scan = module_scan(
            &["m".into()],
            &lex(
                "use crate::a::{self, b::{C, D as E}, *};\nuse ::ext::X;\nuse super::F;\n\
                  pub(in crate::a) fn f() { self::g::h(); x.y::<crate::T>(); $crate::z(); }",
            ),
        );
        let paths: Vec<(String, Option<String>, usize)> = scan
            .paths
            .iter()
            .map(|p| (p.segments.join("::"), p.binds.clone(), p.line))
            .collect();
        let bound = |p: &str, b: &str, l| (p.to_owned(), Some(b.to_owned()), l);
        assert_eq!(
            paths,
            [
                bound("crate::a", "a", 1),
                bound("crate::a::b::C", "C", 1),
                bound("crate::a::b::D", "E", 1),
                bound("crate::a", "*", 1),
                bound("super::F", "F", 3),
                ("self::g::h".to_owned(), None, 4),
                ("crate::T".to_owned(), None, 4),
            ]
        );
    }

    #[test]
    fn test_items_macro_bodies_and_declarations_are_no_imports() {
        let scan = module_scan(
            &[],
            &lex(
                "mod a;\n#[cfg(test)]\nmod tests { use super::*; }\n#[cfg(test)]\nmod more;\n\
                  macro_rules! m { () => { crate::a::f() }; }\nmod inline { mod deeper; fn f() { super::a::g(); } }",
            ),
        );
        assert_eq!(
            scan.child_files,
            [
                (vec![], "a".to_owned()),
                (vec!["inline".to_owned()], "deeper".to_owned())
            ]
        );
        assert_eq!(scan.inline_modules, [vec!["inline".to_owned()]]);
        assert_eq!(scan.macros, [(vec![], "m".to_owned())]);
        let paths: Vec<(Vec<String>, String)> = scan
            .paths
            .iter()
            .map(|p| (p.module.clone(), p.segments.join("::")))
            .collect();
        assert_eq!(paths, [(vec!["inline".to_owned()], "super::a::g".to_owned())]);
    }

    #[test]
    fn modules_are_found_through_their_declarations() {
        let k = krate(&[
            ("lib.rs", "mod a; mod b; #[cfg(test)] mod tests;"),
            ("a.rs", "mod c;"),
            ("a/c.rs", ""),
            ("b/mod.rs", "pub(crate) mod d;"),
            ("b/d.rs", ""),
            ("tests.rs", ""),
            ("unused.rs", ""),
        ]);
        let found: Vec<(&str, &str)> = k
            .modules
            .iter()
            .map(|(m, f)| (m.as_str(), f.path.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                ("a", "src/a.rs"),
                ("a::c", "src/a/c.rs"),
                ("b", "src/b/mod.rs"),
                ("b::d", "src/b/d.rs"),
                ("crate", "src/lib.rs"),
            ]
        );
    }

    #[test]
    fn imports_lead_to_where_items_are_written() {
        let edges = imports(&[
            // The root re-exports; `crate::Error` is error's, not the root's.
            ("lib.rs", "mod error; mod engine; mod db; pub use error::Error;"),
            (
                "error.rs",
                "pub struct Error;\n#[macro_export]\nmacro_rules! m { () => {} }",
            ),
            // A child is used by a path, a parent's item through `super`.
            ("engine/mod.rs", "mod turn; fn run() { turn::go(); }"),
            ("engine/turn.rs", "use super::run; use crate::Error;"),
            // A name imported, then used as a path; a macro to where it is written.
            ("db.rs", "use crate::engine; fn f() { engine::x(); crate::m!(); }"),
        ]);
        assert_eq!(
            edges,
            [
                "crate -> error",
                "db -> engine",
                "db -> error",
                "engine -> engine::turn",
                "engine::turn -> engine",
                "engine::turn -> error",
            ]
        );
    }

    #[test]
    fn cycles_are_reported_with_where_each_import_is() {
        let k = krate(&[
            ("lib.rs", "mod a; mod b; mod c; mod d; mod e;"),
            ("a.rs", "use crate::b::X;"),
            ("b.rs", "pub struct X;\nuse crate::a::Y;"),
            ("c.rs", "use crate::d::Z;"),
            ("d.rs", "use crate::e::W;"),
            ("e.rs", "\n\nuse crate::c::V;"),
        ]);
        let problems = cycle_problems(std::slice::from_ref(&k), &[]);
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems[0].starts_with("k: a -> b -> a (src/a.rs:1, src/b.rs:2): a module cycle"));
        assert!(
            problems[1]
                .starts_with("k: c -> d -> e -> c (src/c.rs:1, src/d.rs:1, src/e.rs:3): a module cycle")
        );
        // An allowed cycle passes; modules an entry names in no cycle are a problem.
        let allowed: &[(&str, &[&str], &str)] = &[
            ("k", &["a", "b"], "x"),
            ("k", &["c", "d", "e", "f"], "x"),
            ("k", &["q"], "x"),
        ];
        let problems = cycle_problems(&[k], allowed);
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(problems[0].ends_with("ALLOWED_CYCLES allows `k: f`, in no cycle any more: drop them"));
        assert!(problems[1].ends_with("ALLOWED_CYCLES allows `k: q`, in no cycle any more: drop them"));
    }
}
