//! `cargo xtask`'s throwaway PostgreSQL server (the tests', `pg-shell`'s and
//! the benchmark's): the cluster code the tests' own clusters use
//! (`cluster.rs` of outbox-testkit, included by path so that xtask builds
//! without the testkit's dependencies), with what only xtask does: install
//! the binaries when they are missing, and the server's settings.

use std::process::Command;

use anyhow::{Context, Result, anyhow, bail};

// `stop_immediate` is for the tests' restarts: xtask stops its server by
// dropping it.
#[allow(dead_code)]
#[path = "../../crates/outbox-testkit/src/pg/cluster.rs"]
mod cluster;

pub(crate) use cluster::is_root;

/// A running throwaway cluster, stopped and deleted when dropped.
pub(crate) struct Server {
    cluster: cluster::Cluster,
}

fn install_postgres() -> Result<()> {
    eprintln!("postgres binaries not found; installing the Debian package");
    if !is_root() {
        bail!(
            "PostgreSQL binaries (initdb, pg_ctl) are missing and installing them needs root: apt-get install postgresql"
        );
    }
    let ok = Command::new("apt-get").arg("update").status()?.success()
        && Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "postgresql"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?
            .success();
    if !ok {
        bail!("apt-get install postgresql failed");
    }
    Ok(())
}

/// Whether a throwaway server syncs its writes to disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Durability {
    /// `fsync=off`: the tests' server, fast, and never meant to survive a
    /// power loss.
    Fast,
    /// `fsync=on`, as production runs: the benchmark's server, so that its
    /// figures are those of a durable Postgres (issue 43).
    Durable,
}

impl Server {
    /// The tests' server ([`Durability::Fast`]).
    pub(crate) fn start() -> Result<Server> {
        Self::start_with(Durability::Fast)
    }

    /// A server that syncs as `durability` says.
    pub(crate) fn start_with(durability: Durability) -> Result<Server> {
        let bin = match cluster::find_bin() {
            Some(b) => b,
            None => {
                install_postgres()?;
                cluster::find_bin().context("postgres binaries still missing after installing the package")?
            }
        };
        let dir = std::env::temp_dir().join(format!("outbox-pg-{}", std::process::id()));
        let fsync = match durability {
            Durability::Fast => "off",
            Durability::Durable => "on",
        };
        // A whole test run's connections (every test binary at once) and
        // the benchmark's working set.
        let settings = format!("-c fsync={fsync} -c max_connections=200 -c shared_buffers=128MB");
        let cluster = cluster::Cluster::create(dir.clone(), bin, &settings).map_err(|e| anyhow!(e))?;
        cluster.start().map_err(|e| anyhow!(e))?;
        eprintln!("postgres running on socket dir {}", dir.display());
        Ok(Server { cluster })
    }

    /// A connection URL over the Unix socket.
    pub(crate) fn url(&self) -> String {
        self.cluster.url()
    }
}
