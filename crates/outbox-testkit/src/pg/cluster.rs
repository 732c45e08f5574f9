//! A throwaway PostgreSQL cluster: `initdb` into a directory of its own, a
//! Unix socket in that directory and no TCP (so no port is taken), run as
//! the system user `outbox-pg` when the caller is root (Postgres refuses to
//! run as root). Dropping it stops the server (`-m immediate`) and deletes
//! the directory, even while a failed test unwinds.
//!
//! One implementation for two users: the tests' own clusters (`OwnCluster`,
//! pg.rs) and `cargo xtask`'s server (xtask/src/pg.rs, which includes this
//! file with `#[path]`). It uses nothing but `std`, so
//! xtask stays a small build: depending on outbox-testkit would compile
//! tokio and outbox-core into every `cargo xtask` run, and a crate of its
//! own would have to be published with the testkit. Errors are messages
//! for a person (the tests panic with them, xtask prints them).

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The system user a root process runs its clusters as.
const CLUSTER_USER: &str = "outbox-pg";

/// A cluster in a directory of its own; its server runs between
/// [`Cluster::start`] and [`Cluster::stop_immediate`] (or the drop).
pub(crate) struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    /// The user the server runs as (`None`: this process's).
    user: Option<String>,
    /// The server's `-c name=value` settings beyond the socket-only ones.
    settings: String,
}

/// The directory of the newest installed PostgreSQL binaries (`initdb`,
/// `pg_ctl`): `pg_config --bindir`, then `/usr/lib/postgresql/*/bin`
/// (newest first), then `PATH`.
pub(crate) fn find_bin() -> Option<PathBuf> {
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

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Creates [`CLUSTER_USER`] unless it exists.
fn ensure_user() -> Result<(), String> {
    let exists = Command::new("id")
        .arg(CLUSTER_USER)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if exists {
        return Ok(());
    }
    let created = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            CLUSTER_USER,
        ])
        .status()
        .is_ok_and(|s| s.success());
    if created {
        Ok(())
    } else {
        Err(format!(
            "could not create the system user {CLUSTER_USER} to run postgres as"
        ))
    }
}

impl Cluster {
    /// Makes a new cluster in `dir` (emptied first) with the binaries in
    /// `bin`; its server, once started, runs with `settings` (`-c
    /// name=value ...`) besides listening on the socket only.
    pub(crate) fn create(dir: PathBuf, bin: PathBuf, settings: &str) -> Result<Cluster, String> {
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("data"))
            .map_err(|e| format!("creating the cluster directory {}: {e}", dir.display()))?;
        let user = if is_root() {
            ensure_user()?;
            let owned = Command::new("chown")
                .args(["-R", CLUSTER_USER])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            if !owned {
                return Err(format!("chown of {} to {CLUSTER_USER} failed", dir.display()));
            }
            Some(CLUSTER_USER.to_owned())
        } else {
            None
        };
        let cluster = Cluster {
            dir,
            bin,
            user,
            settings: settings.to_owned(),
        };
        cluster.pg(
            "initdb",
            &[
                "-D",
                &cluster.data(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        )?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// The connection URL (over the Unix socket in the cluster's directory).
    pub(crate) fn url(&self) -> String {
        format!(
            "postgres://postgres@localhost/postgres?host={}",
            self.dir.display()
        )
    }

    /// Starts the (stopped) server and waits until it accepts connections.
    pub(crate) fn start(&self) -> Result<(), String> {
        let opts = format!(
            "-c listen_addresses='' -c unix_socket_directories={} {}",
            self.dir.display(),
            self.settings
        );
        let log = self.dir.join("postgres.log").display().to_string();
        self.pg(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-o",
                &opts,
                "-l",
                &log,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
    }

    /// Stops the server the way a crash or a kill does: `pg_ctl stop -m
    /// immediate` (every backend is killed; crash recovery at the next start).
    pub(crate) fn stop_immediate(&self) -> Result<(), String> {
        self.pg("pg_ctl", &["-D", &self.data(), "-m", "immediate", "-w", "stop"])
    }

    /// The command running `tool` of the cluster's binaries as its user.
    fn command(&self, tool: &str) -> Command {
        let exe = self.bin.join(tool);
        let mut cmd = match &self.user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.current_dir(&self.dir).stdout(Stdio::null());
        cmd
    }

    /// Runs `tool`; its failure comes with the server's log.
    fn pg(&self, tool: &str, args: &[&str]) -> Result<(), String> {
        let status = self
            .command(tool)
            .args(args)
            .status()
            .map_err(|e| format!("running {}: {e}", self.bin.join(tool).display()))?;
        if status.success() {
            return Ok(());
        }
        let log = fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        Err(format!("{tool} failed ({status}); server log:\n{log}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Quietly, and whether or not the server still runs (a test may have
        // stopped it): a drop must not panic while a failed test unwinds.
        let _ = self
            .command("pg_ctl")
            .args(["-D", &self.data(), "-m", "immediate", "-w", "stop"])
            .stderr(Stdio::null())
            .status();
        let _ = fs::remove_dir_all(&self.dir);
    }
}
