//! A headless browser for the web monitor's browser test: Debian's
//! `chromium` and `chromium-driver` (installed when missing, as root), and a
//! chromedriver on a loopback port for as long as the tests run, stopped
//! (killed and reaped) when dropped, even when the tests failed.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::pg::is_root;

/// How long chromedriver may take to listen.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// A running chromedriver.
pub(crate) struct Driver {
    child: Child,
    port: u16,
}

fn installed() -> bool {
    let found = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    found("chromedriver") && (found("chromium") || found("chromium-browser"))
}

fn install() -> Result<()> {
    eprintln!(
        "chromium or chromedriver not found; installing the Debian packages chromium and chromium-driver"
    );
    if !is_root() {
        bail!(
            "chromium and chromedriver are missing and installing them needs root: apt-get install chromium chromium-driver"
        );
    }
    let ok = Command::new("apt-get").arg("update").status()?.success()
        && Command::new("apt-get")
            .args([
                "install",
                "-y",
                "--no-install-recommends",
                "chromium",
                "chromium-driver",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()?
            .success();
    if !ok {
        bail!("apt-get install chromium chromium-driver failed");
    }
    Ok(())
}

impl Driver {
    /// Installs the packages if needed and starts chromedriver on a free
    /// loopback port (chromedriver accepts local connections only).
    pub(crate) fn start() -> Result<Driver> {
        if !installed() {
            install()?;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for chromedriver")?
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting chromedriver")?;
        let mut driver = Driver { child, port };
        wait_listening(&mut driver.child, port, "chromedriver")?;
        eprintln!("chromedriver listening on 127.0.0.1:{port}");
        Ok(driver)
    }

    /// The WebDriver URL (for `OUTBOX_TEST_WEBDRIVER_URL`).
    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

/// Waits until `child` (called `what`) listens on loopback `port`, for at
/// most 30 s; an error when it exits first or takes longer.
pub(crate) fn wait_listening(child: &mut Child, port: u16, what: &str) -> Result<()> {
    let deadline = Instant::now() + START_PATIENCE;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited at start ({status})");
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on port {port} within {START_PATIENCE:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
