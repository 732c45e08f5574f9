//! A throwaway PostgreSQL cluster for tests: initdb into a temporary
//! directory, listen on a Unix socket only (no TCP), run as a non-root user,
//! and stop (and delete) it when dropped, even when the tests failed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// A running throwaway cluster.
pub(crate) struct Server {
    dir: PathBuf,
    bin: PathBuf,
    user: Option<String>,
}

const PG_USER: &str = "outbox-pg";

fn find_bin() -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        candidates.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<PathBuf> = entries.flatten().map(|e| e.path().join("bin")).collect();
        versions.sort();
        candidates.extend(versions.into_iter().rev());
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path));
    }
    candidates
        .into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
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

fn ensure_user() -> Result<()> {
    let exists = Command::new("id")
        .arg(PG_USER)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?
        .success();
    if !exists {
        let ok = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                PG_USER,
            ])
            .status()
            .context("useradd")?
            .success();
        if !ok {
            bail!("could not create the system user {PG_USER} to run postgres as");
        }
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
        let bin = match find_bin() {
            Some(b) => b,
            None => {
                install_postgres()?;
                find_bin().context("postgres binaries still missing after installing the package")?
            }
        };
        let root = is_root();
        let dir = std::env::temp_dir().join(format!("outbox-pg-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir).ok();
        }
        fs::create_dir_all(dir.join("data"))?;
        let user = if root {
            ensure_user()?;
            let ok = Command::new("chown")
                .args(["-R", PG_USER])
                .arg(&dir)
                .status()?
                .success();
            if !ok {
                bail!("chown of {} failed", dir.display());
            }
            Some(PG_USER.to_owned())
        } else {
            None
        };
        let server = Server { dir, bin, user };
        server.pg(
            "initdb",
            &[
                "-D",
                &server.data(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        )?;
        let fsync = match durability {
            Durability::Fast => "off",
            Durability::Durable => "on",
        };
        let opts = format!(
            "-c listen_addresses='' -c unix_socket_directories={} -c fsync={fsync} -c max_connections=200 -c shared_buffers=128MB",
            server.dir.display()
        );
        let log = server.dir.join("postgres.log");
        server.pg(
            "pg_ctl",
            &[
                "-D",
                &server.data(),
                "-o",
                &opts,
                "-l",
                &log.display().to_string(),
                "-w",
                "-t",
                "60",
                "start",
            ],
        )?;
        eprintln!("postgres running on socket dir {}", server.dir.display());
        Ok(server)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// A connection URL over the Unix socket.
    pub(crate) fn url(&self) -> String {
        format!(
            "postgres://postgres@localhost/postgres?host={}",
            self.dir.display()
        )
    }

    fn pg(&self, tool: &str, args: &[&str]) -> Result<()> {
        let exe = self.bin.join(tool);
        let status = match &self.user {
            Some(u) => Command::new("runuser")
                .args(["-u", u, "--"])
                .arg(&exe)
                .args(args)
                .current_dir(&self.dir)
                .stdout(Stdio::null())
                .status(),
            None => Command::new(&exe)
                .args(args)
                .current_dir(&self.dir)
                .stdout(Stdio::null())
                .status(),
        }
        .with_context(|| format!("running {}", exe.display()))?;
        if !status.success() {
            let log = fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
            bail!("{tool} failed ({status}); server log:\n{log}");
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let data = self.data();
        if let Err(e) = self.pg("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]) {
            eprintln!("warning: stopping postgres failed: {e:#}");
        }
        let _ = fs::remove_dir_all(Path::new(&self.dir));
    }
}
