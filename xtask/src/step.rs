//! What every xtask command needs to run its steps: the workspace root, a
//! `cargo` command and running a step. A leaf, so that the commands'
//! modules do not import main.rs, which dispatches to them.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The workspace's root directory.
pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// A `cargo` command (the one running xtask) in the workspace root.
pub(crate) fn cargo() -> Command {
    let mut c = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Runs `cmd` as the step named `step`: an error when it fails.
pub(crate) fn run(step: &str, mut cmd: Command) -> Result<()> {
    eprintln!("\n==> {step}");
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{step}`"))?;
    if !status.success() {
        bail!("`{step}` failed ({status})");
    }
    Ok(())
}
