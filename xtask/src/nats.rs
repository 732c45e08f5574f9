//! A NATS server for the sink tests: Debian's `nats-server` (installed when
//! missing, as root), started with JetStream on a loopback port and a
//! temporary store for as long as the tests run, and stopped (killed and
//! reaped, the store deleted) when dropped, even when the tests failed. The
//! tests also get the binary's path, to run servers of their own that they
//! kill and restart.

use anyhow::{Context, Result, bail};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::pg::is_root;

/// A running nats-server.
pub(crate) struct Server {
    child: Child,
    port: u16,
    bin: PathBuf,
    store: PathBuf,
}

/// The binary: on PATH, or where Debian puts it.
fn find() -> Option<PathBuf> {
    let works = |bin: &PathBuf| {
        Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    ["nats-server", "/usr/sbin/nats-server", "/usr/bin/nats-server"]
        .into_iter()
        .map(PathBuf::from)
        .find(works)
}

fn install() -> Result<()> {
    eprintln!("nats-server not found; installing the Debian package nats-server");
    if !is_root() {
        bail!("nats-server is missing and installing it needs root: apt-get install nats-server");
    }
    let ok = Command::new("apt-get").arg("update").status()?.success()
        && Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", "nats-server"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?
            .success();
    if !ok {
        bail!("apt-get install nats-server failed");
    }
    Ok(())
}

/// The binary, installing the package first when it is missing.
pub(crate) fn binary() -> Result<PathBuf> {
    match find() {
        Some(b) => Ok(b),
        None => {
            install()?;
            find().context("nats-server is still missing after installing it")
        }
    }
}

impl Server {
    /// Installs the package if needed and starts a server with JetStream
    /// on a free loopback port.
    pub(crate) fn start() -> Result<Server> {
        let bin = binary()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for nats-server")?
            .port();
        let store = std::env::temp_dir().join(format!("outbox-nats-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&store).with_context(|| format!("creating {}", store.display()))?;
        let child = Command::new(&bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(&store)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting nats-server")?;
        let mut server = Server {
            child,
            port,
            bin,
            store,
        };
        crate::browser::wait_listening(&mut server.child, port, "nats-server")?;
        eprintln!("nats-server (JetStream) listening on 127.0.0.1:{port}");
        Ok(server)
    }

    /// The URL (for `OUTBOX_TEST_NATS_URL`).
    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The binary (for `OUTBOX_TEST_NATS_SERVER`).
    pub(crate) fn bin(&self) -> &PathBuf {
        &self.bin
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.store);
    }
}
