//! `cargo xtask package-check`: every publishable crate is packaged with
//! `cargo package --no-verify`, and the packages are compiled from their
//! unpacked `.crate` files, so a file a crate needs but does not carry (the
//! migrations before ADR 0009) fails here instead of at `cargo publish`.
//!
//! The packages are compiled in a scratch workspace under
//! `<target>/package-check/`, with the workspace's `Cargo.lock` and
//! `[profile.*]` sections and the workspace's target directory, so registry
//! dependencies are not compiled again. `[patch.crates-io]` points every
//! `outbox-*` dependency at its unpacked package.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::step::{cargo, root, run};

/// A publishable workspace member, as `cargo metadata` describes it.
struct Crate {
    name: String,
    version: String,
    /// Names of the workspace's own crates this one depends on (any kind).
    internal_deps: Vec<String>,
    /// Those of them it needs to build (normal and build dependencies, not
    /// dev-dependencies): the order `cargo publish` must follow.
    build_deps: Vec<String>,
}

impl Crate {
    fn dir_name(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }
}

struct Workspace {
    target_dir: PathBuf,
    crates: Vec<Crate>,
}

/// The crates to check: every workspace member whose `publish` is not
/// `false`. Missing crates.io metadata is reported here rather than by
/// `cargo package`, whose warning also asks for a homepage or repository URL
/// the project does not have yet.
fn workspace() -> Result<Workspace> {
    let out = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .stderr(Stdio::inherit())
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed");
    }
    let meta: Value = serde_json::from_slice(&out.stdout).context("cargo metadata output")?;
    let target_dir = PathBuf::from(
        meta["target_directory"]
            .as_str()
            .context("cargo metadata: no target_directory")?,
    );
    let packages = meta["packages"]
        .as_array()
        .context("cargo metadata: no packages")?;
    let publishable: Vec<&Value> = packages
        .iter()
        .filter(|p| p["publish"].as_array().is_none_or(|r| !r.is_empty()))
        .collect();
    let names: Vec<&str> = publishable.iter().filter_map(|p| p["name"].as_str()).collect();

    let mut crates = Vec::new();
    let mut missing = Vec::new();
    for p in &publishable {
        let name = p["name"].as_str().context("a package without a name")?;
        for field in ["description", "license", "readme"] {
            if p[field].as_str().is_none_or(str::is_empty) {
                missing.push(format!("{name}: no `{field}`"));
            }
        }
        for field in ["keywords", "categories"] {
            if p[field].as_array().is_none_or(Vec::is_empty) {
                missing.push(format!("{name}: no `{field}`"));
            }
        }
        if p["metadata"]["docs"]["rs"].is_null() {
            missing.push(format!("{name}: no `[package.metadata.docs.rs]`"));
        }
        let mut internal_deps: Vec<String> = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["name"].as_str())
            .filter(|d| *d != name && names.contains(d))
            .map(String::from)
            .collect();
        internal_deps.sort();
        internal_deps.dedup();
        let mut build_deps: Vec<String> = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str())
            .filter(|d| *d != name && names.contains(d))
            .map(String::from)
            .collect();
        build_deps.sort();
        build_deps.dedup();
        crates.push(Crate {
            name: name.to_owned(),
            version: p["version"]
                .as_str()
                .context("a package without a version")?
                .to_owned(),
            internal_deps,
            build_deps,
        });
    }
    if !missing.is_empty() {
        bail!(
            "publishable crates lack crates.io metadata:\n  {}",
            missing.join("\n  ")
        );
    }
    crates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Workspace { target_dir, crates })
}

/// `cargo package` of `crates` (sources only, offline, at the locked
/// versions), together: each may depend on those before it.
fn package<'a>(crates: impl Iterator<Item = &'a str>) -> Command {
    let mut c = cargo();
    c.args([
        "package",
        "--no-verify",
        "--allow-dirty",
        "--no-metadata",
        "--locked",
        "--offline",
        "--quiet",
    ]);
    for name in crates {
        c.args(["-p", name]);
    }
    c
}

/// The crates `name` needs to build, transitively (not itself).
fn build_closure<'a>(crates: &'a [Crate], name: &str) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    let mut todo = vec![name.to_owned()];
    while let Some(n) = todo.pop() {
        let Some(c) = crates.iter().find(|c| c.name == n) else {
            continue;
        };
        for d in &c.build_deps {
            if let Some(dep) = crates.iter().find(|c| &c.name == d)
                && !out.contains(&dep.name.as_str())
            {
                out.push(dep.name.as_str());
                todo.push(dep.name.clone());
            }
        }
    }
    out
}

/// The crates' names, each after the crates it depends on.
fn dependency_order(crates: &[Crate]) -> Result<Vec<&str>> {
    let mut done: Vec<&str> = Vec::new();
    while done.len() < crates.len() {
        let ready: Vec<&str> = crates
            .iter()
            .filter(|c| !done.contains(&c.name.as_str()))
            .filter(|c| c.build_deps.iter().all(|d| done.contains(&d.as_str())))
            .map(|c| c.name.as_str())
            .collect();
        if ready.is_empty() {
            bail!("the workspace's crates depend on each other in a cycle");
        }
        done.extend(ready);
    }
    Ok(done)
}

pub(crate) fn package_check() -> Result<()> {
    let started = Instant::now();
    // Downloads (once) what the lock file names, so that the steps below can
    // run offline: `cargo package` otherwise updates the index per crate.
    let mut fetch = cargo();
    fetch.args(["fetch", "--locked", "--quiet"]);
    run("cargo fetch", fetch)?;

    let ws = workspace()?;
    run(
        "cargo package --no-verify",
        package(ws.crates.iter().map(|c| c.name.as_str())),
    )?;
    // Each crate with only what it needs to build, in dependency order, as
    // `cargo publish` will take them (each after the crates it depends
    // on): a dependency of any kind on a sibling published after it (a
    // dev-dependency naming a version, say) fails here (issue 45).
    for name in dependency_order(&ws.crates)? {
        run(
            &format!("cargo package -p {name} (with what it builds on)"),
            package(std::iter::once(name).chain(build_closure(&ws.crates, name))),
        )?;
    }

    let scratch = ws.target_dir.join("package-check");
    if scratch.exists() {
        fs::remove_dir_all(&scratch).with_context(|| format!("removing {}", scratch.display()))?;
    }
    fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    for c in &ws.crates {
        let file = ws
            .target_dir
            .join("package")
            .join(format!("{}.crate", c.dir_name()));
        // `--touch`: fresh mtimes, so cargo never takes an unpacked file for
        // one it has already compiled.
        let status = Command::new("tar")
            .arg("-xzf")
            .arg(&file)
            .arg("-C")
            .arg(&scratch)
            .arg("--touch")
            .status()
            .context("could not start `tar`")?;
        if !status.success() {
            bail!("could not unpack {} ({status})", file.display());
        }
    }
    fs::write(scratch.join("Cargo.toml"), scratch_manifest(&ws.crates)?)
        .context("writing the scratch manifest")?;
    fs::copy(root().join("Cargo.lock"), scratch.join("Cargo.lock")).context("copying Cargo.lock")?;

    eprintln!(
        "\n==> cargo build of the unpacked packages (in {})",
        scratch.display()
    );
    let built = check_unpacked(&ws, &scratch)?;
    check_patched(&ws.crates, &scratch)?;

    let mut failed = Vec::new();
    for c in &ws.crates {
        if built.contains(&c.name) {
            eprintln!("ok: {} {} compiles from its .crate", c.name, c.version);
        } else {
            eprintln!(
                "FAILED: {} {} does not compile from its .crate",
                c.name, c.version
            );
            failed.push(c.name.as_str());
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} did not compile from the packaged sources in {}; cargo's errors above name the \
             file (an error here but not in the workspace means the crate needs a file its \
             package does not carry, such as one outside the crate's folder)",
            failed.join(", "),
            scratch.display()
        );
    }
    eprintln!(
        "ok: {} crates packaged and compiled from their .crate files in {:.1}s",
        ws.crates.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The scratch workspace: the unpacked packages as members, each one patched
/// in for the crates.io dependency its packaged dependents declare, and the
/// root manifest's profiles (so the workspace's compiled dependencies match).
fn scratch_manifest(crates: &[Crate]) -> Result<String> {
    let mut toml = String::from(
        "# Written by `cargo xtask package-check`: the packaged crates, unpacked.\n\
         [workspace]\nresolver = \"3\"\nmembers = [\n",
    );
    for c in crates {
        toml.push_str(&format!("    \"{}\",\n", c.dir_name()));
    }
    toml.push_str("]\n\n[patch.crates-io]\n");
    for c in crates {
        // Only what something depends on: an unused patch is a warning.
        if crates.iter().any(|d| d.internal_deps.contains(&c.name)) {
            toml.push_str(&format!("{} = {{ path = \"{}\" }}\n", c.name, c.dir_name()));
        }
    }
    let root_manifest = fs::read_to_string(root().join("Cargo.toml")).context("reading Cargo.toml")?;
    toml.push_str(&profiles(&root_manifest));
    Ok(toml)
}

/// The `[profile.*]` tables of a manifest, verbatim.
fn profiles(manifest: &str) -> String {
    let mut out = String::new();
    let mut in_profile = false;
    for line in manifest.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            in_profile = trimmed.starts_with("[profile.");
            if in_profile {
                out.push('\n');
            }
        }
        if in_profile && !line.trim().is_empty() {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// `cargo build` of every unpacked library, in one invocation (one feature
/// resolution). The build runs everything that reads files at compile time
/// (build scripts, `sqlx::migrate!`, `include_str!`, module files) and
/// produces the libraries a user of the published crates would link.
/// Returns the crates whose library built.
fn check_unpacked(ws: &Workspace, scratch: &Path) -> Result<BTreeSet<String>> {
    let out = cargo()
        .current_dir(scratch)
        .env("CARGO_TARGET_DIR", &ws.target_dir)
        .args([
            "build",
            "--workspace",
            "--lib",
            "--offline",
            "--keep-going",
            "--message-format",
            "json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .context("could not start `cargo build` in the scratch workspace")?;
    let mut built = BTreeSet::new();
    for line in out.stdout.split(|b| *b == b'\n') {
        let Ok(msg) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let is_lib = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == "lib"));
        let Some(manifest) = msg["manifest_path"].as_str() else {
            continue;
        };
        let manifest = Path::new(manifest);
        if let Some(c) = ws
            .crates
            .iter()
            .find(|c| manifest == scratch.join(c.dir_name()).join("Cargo.toml"))
            && is_lib
        {
            built.insert(c.name.clone());
        }
    }
    Ok(built)
}

/// Every `outbox-*` crate in the scratch lock file must be an unpacked
/// package, never a crates.io crate of the same name (crates.io has
/// unrelated crates named `outbox-core` and `outbox-postgres`).
fn check_patched(crates: &[Crate], scratch: &Path) -> Result<()> {
    let lock = fs::read_to_string(scratch.join("Cargo.lock")).context("reading the scratch lock")?;
    let mut from_registry = Vec::new();
    for entry in lock.split("[[package]]") {
        let name = entry
            .lines()
            .find_map(|l| l.strip_prefix("name = "))
            .map(|n| n.trim_matches('"'));
        if let Some(name) = name
            && crates.iter().any(|c| c.name == name)
            && entry.lines().any(|l| l.starts_with("source = "))
        {
            from_registry.push(name.to_owned());
        }
    }
    if !from_registry.is_empty() {
        bail!(
            "the scratch workspace resolved {} from a registry instead of the unpacked package",
            from_registry.join(", ")
        );
    }
    Ok(())
}
