//! The NATS server of the tests.
//!
//! NATS-backed tests read the `nats-server` binary from [`NATS_SERVER_VAR`]
//! and start a server of their own with JetStream on a loopback port
//! ([`NatsServer`]), which they can kill and restart; `cargo xtask test`
//! (and `cargo xtask ci`) installs the Debian package when the binary is
//! missing and sets the variable, and also runs one shared server whose URL
//! is in [`NATS_URL_VAR`]. Plain `cargo test` without them skips those
//! tests and says so in one line; in CI (the `CI` variable set) a missing
//! server fails them instead.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

/// The variable naming the `nats-server` binary of the tests.
pub const NATS_SERVER_VAR: &str = "OUTBOX_TEST_NATS_SERVER";

/// The variable naming the shared NATS server (`nats://127.0.0.1:PORT`).
pub const NATS_URL_VAR: &str = "OUTBOX_TEST_NATS_URL";

fn required(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => return Some(v),
        Err(std::env::VarError::NotUnicode(v)) => panic!("{var} is not Unicode: {v:?}"),
        _ => {}
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "{var} is not set and CI is: in CI the NATS tests must run, never be skipped. \
             `cargo xtask ci` installs nats-server and sets it; run the tests through it"
        );
    }
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        eprintln!(
            "note: skipping the NATS tests: {var} is not set. Run them with `cargo xtask test` \
             (it installs nats-server if missing and starts one)"
        );
    });
    None
}

/// The `nats-server` binary, or `None` (one line on stderr) when unset.
///
/// # Panics
///
/// When unset and `CI` is set.
pub fn test_nats_server() -> Option<PathBuf> {
    required(NATS_SERVER_VAR).map(PathBuf::from)
}

/// The shared server's URL, or `None` (one line on stderr) when unset.
///
/// # Panics
///
/// When unset and `CI` is set.
pub fn test_nats_url() -> Option<String> {
    required(NATS_URL_VAR)
}

/// A `nats-server` of one test's own: JetStream on, listening on a loopback
/// port, its store in a temporary directory kept across restarts. Dropping
/// it kills it.
pub struct NatsServer {
    bin: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts one and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// When it cannot be started or does not listen within 30 s.
    pub fn start(bin: PathBuf) -> NatsServer {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let mut server = NatsServer {
            bin,
            port,
            dir: tempfile::tempdir().expect("a directory for the JetStream store"),
            child: None,
        };
        server.restart();
        server
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills it (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again (after [`NatsServer::kill`]) on the same port and
    /// store, and waits until it accepts connections.
    ///
    /// # Panics
    ///
    /// As [`NatsServer::start`].
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new(&self.bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &self.port.to_string(), "-sd"])
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.bin.display()));
        self.child = Some(child);
        let start = Instant::now();
        while TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "nats-server did not listen on port {} within 30 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}
