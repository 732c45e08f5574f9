//! `cargo xtask readme-crate`: a crate outside the workspace, made from the
//! README's snippets alone, must build and pass its test. Each snippet the
//! README marks with `<!-- readme-crate: PATH -->` on the line before its
//! fence becomes the file PATH of a crate named `shop` under
//! `<target>/readme-crate/`; the `Cargo.toml` snippet (the README's
//! dependency block) gets a `[package]` header, and its paths
//! `../outbox/...` point at this checkout. The crate shares the workspace's
//! target directory and lock file, so what the workspace already compiled is
//! not compiled again.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::step::{cargo, root, run};

/// The marker before a snippet's fence.
const MARKER: &str = "<!-- readme-crate: ";

/// The marked snippets of `readme`: (path, text).
fn snippets(readme: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut lines = readme.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(rest) = line.trim().strip_prefix(MARKER) else {
            continue;
        };
        let path = rest
            .strip_suffix("-->")
            .map(str::trim)
            .with_context(|| format!("README.md:{}: a marker without `-->`", n + 1))?;
        if path.is_empty() || path.starts_with('/') || path.split('/').any(|p| p == "..") {
            bail!(
                "README.md:{}: the snippet path {path:?} is not a path inside the crate",
                n + 1
            );
        }
        match lines.next() {
            Some((_, fence)) if fence.starts_with("```") => {}
            _ => bail!(
                "README.md:{}: the marker is not followed by a fenced block",
                n + 1
            ),
        }
        let mut text = String::new();
        loop {
            match lines.next() {
                Some((_, l)) if l.trim_end() == "```" => break,
                Some((_, l)) => {
                    text.push_str(l);
                    text.push('\n');
                }
                None => bail!("README.md:{}: the block of {path} is not closed", n + 1),
            }
        }
        out.push((path.to_owned(), text));
    }
    Ok(out)
}

/// The crate's manifest: a package header, then the README's block with
/// its `../outbox/` paths pointing at `checkout`.
fn manifest(block: &str, checkout: &Path) -> String {
    let here = format!("{}/", checkout.display());
    format!(
        "[package]\nname = \"shop\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
         # A workspace of its own, not a member of the checkout's.\n[workspace]\n\n{}",
        block.replace("../outbox/", &here)
    )
}

pub(crate) fn readme_crate() -> Result<()> {
    let root = root();
    let readme = fs::read_to_string(root.join("README.md")).context("reading README.md")?;
    let files = snippets(&readme)?;
    let has = |p: &str| files.iter().any(|(f, _)| f == p);
    if !has("Cargo.toml") || !has("src/lib.rs") || !files.iter().any(|(f, _)| f.starts_with("tests/")) {
        bail!("README.md must mark a Cargo.toml, a src/lib.rs and a tests/*.rs snippet for the readme crate");
    }
    let target: PathBuf = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let dir = target.join("readme-crate");
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    for (path, text) in &files {
        let file = dir.join(path);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        let text = if path == "Cargo.toml" {
            manifest(text, &root)
        } else {
            text.clone()
        };
        fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).context("copying Cargo.lock")?;
    let mut test = cargo();
    test.current_dir(&dir)
        .env("CARGO_TARGET_DIR", &target)
        .args(["test", "--offline", "--quiet"]);
    run(
        &format!("cargo test of the README's crate ({})", dir.display()),
        test,
    )?;
    eprintln!("ok: a crate made from the README's snippets builds and passes its test");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_blocks_become_files() {
        let readme = "text\n<!-- readme-crate: src/lib.rs -->\n```rust\nfn a() {}\n```\nmore\n\
                      <!-- readme-crate: Cargo.toml -->\n```toml\n[dependencies]\nx = { path = \"../outbox/crates/x\" }\n```\n";
        let files = snippets(readme).unwrap();
        assert_eq!(files[0], ("src/lib.rs".into(), "fn a() {}\n".into()));
        let m = manifest(&files[1].1, Path::new("/co"));
        assert!(
            m.contains("x = { path = \"/co/crates/x\" }") && m.contains("[workspace]"),
            "{m}"
        );
        assert!(snippets("<!-- readme-crate: ../x -->\n```\n```\n").is_err());
        assert!(snippets("<!-- readme-crate: a.rs -->\nno fence\n").is_err());
    }
}
