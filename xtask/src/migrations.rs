//! `migrations/<dialect>/` at the root is the one source of truth for the SQL
//! schema. Each adapter crate carries a copy in
//! `crates/outbox-<dialect>/migrations/`, because `sqlx::migrate!` embeds a
//! folder of the crate being compiled and a packaged crate holds nothing
//! outside its own folder (ADR 0009). `sync` writes the copies, `check`
//! fails when one differs.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::step::root;

/// The source folder of one dialect and the adapter crate's copy of it.
struct Pair {
    source: PathBuf,
    copy: PathBuf,
}

/// One difference between a copy and its source, as a path relative to both.
enum Diff {
    Missing(PathBuf),
    Extra(PathBuf),
    Changed(PathBuf),
}

/// Every `migrations/<dialect>/` paired with `crates/outbox-<dialect>/migrations/`.
/// The pairing is derived from the folder names, so a new dialect needs no
/// list to be updated; a dialect without its adapter crate is an error.
fn pairs() -> Result<Vec<Pair>> {
    let root = root();
    let source_root = root.join("migrations");
    let mut pairs = Vec::new();
    for entry in sorted_entries(&source_root)? {
        if !entry.is_dir() {
            continue;
        }
        let dialect = entry
            .file_name()
            .and_then(|n| n.to_str())
            .context("a dialect folder name that is not UTF-8")?;
        let krate = root.join("crates").join(format!("outbox-{dialect}"));
        if !krate.is_dir() {
            bail!(
                "migrations/{dialect}/ has no adapter crate to carry it (expected crates/outbox-{dialect}/)"
            );
        }
        pairs.push(Pair {
            source: entry,
            copy: krate.join("migrations"),
        });
    }
    Ok(pairs)
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut entries = fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    entries.sort();
    Ok(entries)
}

/// Every file below `dir` (relative path to contents); empty if `dir` does
/// not exist.
fn files(dir: &Path) -> Result<BTreeMap<PathBuf, Vec<u8>>> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) -> Result<()> {
        for path in sorted_entries(dir)? {
            if path.is_dir() {
                walk(base, &path, out)?;
            } else {
                let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                let rel = path.strip_prefix(base).expect("below base").to_path_buf();
                out.insert(rel, bytes);
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    if dir.exists() {
        walk(dir, dir, &mut out)?;
    }
    Ok(out)
}

fn diff(pair: &Pair) -> Result<Vec<Diff>> {
    let source = files(&pair.source)?;
    let copy = files(&pair.copy)?;
    let mut diffs = Vec::new();
    for (rel, bytes) in &source {
        match copy.get(rel) {
            None => diffs.push(Diff::Missing(rel.clone())),
            Some(b) if b != bytes => diffs.push(Diff::Changed(rel.clone())),
            Some(_) => {}
        }
    }
    for rel in copy.keys().filter(|rel| !source.contains_key(*rel)) {
        diffs.push(Diff::Extra(rel.clone()));
    }
    Ok(diffs)
}

fn show(path: &Path) -> String {
    path.strip_prefix(root()).unwrap_or(path).display().to_string()
}

/// Fails, naming every differing file, when a crate's copy is not equal to
/// its source folder (a file missing, extra or changed).
pub(crate) fn check() -> Result<()> {
    eprintln!("\n==> migrations: every adapter's copy equals migrations/<dialect>/");
    let mut problems = Vec::new();
    let pairs = pairs()?;
    for pair in &pairs {
        let diffs = diff(pair)?;
        if diffs.is_empty() {
            eprintln!(
                "ok: {} = {} ({} files)",
                show(&pair.copy),
                show(&pair.source),
                files(&pair.source)?.len()
            );
        }
        for d in diffs {
            problems.push(match d {
                Diff::Missing(rel) => format!(
                    "{} is missing (the source is {})",
                    show(&pair.copy.join(&rel)),
                    show(&pair.source.join(&rel))
                ),
                Diff::Changed(rel) => format!(
                    "{} differs from {}",
                    show(&pair.copy.join(&rel)),
                    show(&pair.source.join(&rel))
                ),
                Diff::Extra(rel) => format!(
                    "{} has no source (no {})",
                    show(&pair.copy.join(&rel)),
                    show(&pair.source.join(&rel))
                ),
            });
        }
    }
    // A crate that carries migrations no root folder is the source of.
    for krate in sorted_entries(&root().join("crates"))? {
        let copy = krate.join("migrations");
        if copy.is_dir() && !pairs.iter().any(|p| p.copy == copy) {
            problems.push(format!("{} has no source folder in migrations/", show(&copy)));
        }
    }
    if !problems.is_empty() {
        bail!(
            "the adapters' copies of the migrations differ from migrations/ (the source of truth); \
             run `cargo xtask sync-migrations`:\n  {}",
            problems.join("\n  ")
        );
    }
    Ok(())
}

/// Makes every crate's copy equal to its source folder, touching only the
/// files that differ (so unchanged adapters are not rebuilt).
pub(crate) fn sync() -> Result<()> {
    for pair in pairs()? {
        let diffs = diff(&pair)?;
        if diffs.is_empty() {
            eprintln!("{}: up to date", show(&pair.copy));
        }
        for d in diffs {
            match d {
                Diff::Missing(rel) | Diff::Changed(rel) => {
                    let (from, to) = (pair.source.join(&rel), pair.copy.join(&rel));
                    if let Some(parent) = to.parent() {
                        fs::create_dir_all(parent)
                            .with_context(|| format!("creating {}", parent.display()))?;
                    }
                    fs::copy(&from, &to)
                        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
                    eprintln!("{}: written", show(&to));
                }
                Diff::Extra(rel) => {
                    let path = pair.copy.join(&rel);
                    fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
                    eprintln!("{}: removed (no source)", show(&path));
                    remove_empty_parents(&path, &pair.copy)?;
                }
            }
        }
    }
    Ok(())
}

fn remove_empty_parents(path: &Path, stop: &Path) -> Result<()> {
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d == stop || fs::read_dir(d)?.next().is_some() {
            break;
        }
        fs::remove_dir(d).with_context(|| format!("removing {}", d.display()))?;
        dir = d.parent();
    }
    Ok(())
}
