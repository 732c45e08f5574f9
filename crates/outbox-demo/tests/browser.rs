//! The web monitor in a real headless browser (Chromium through
//! chromedriver, driven with fantoccini): the overview's counts are
//! `outbox report --json`'s; with a wrong token, and on the read-only
//! monitor, nothing changes; at 3 a.m.: a dead row found by the search box,
//! its page, its error group requeued with the token (a dry run first), and
//! the banner of an overview left refreshing itself in another window
//! clears. Saves a
//! screenshot of each page into `target/screenshots/`, or the directory
//! `OUTBOX_TEST_SCREENSHOT_DIR` names (`docs/img` for the runbook's).
//!
//! The WebDriver: `OUTBOX_TEST_WEBDRIVER_URL` (`cargo xtask ci` starts
//! chromedriver and sets it), else a `chromedriver` on PATH started here.
//! Without either the test is skipped with a printed reason, unless `CI` is
//! set: then it fails.

mod support;

use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use fantoccini::{Client, ClientBuilder, Locator};
use support::{Server, Site, TOKEN, eventually};

/// A chromedriver this test started, in a process group of its own,
/// stopped when dropped with every browser it started (a failed test never
/// closes its session, and the browsers would outlive the driver).
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The WebDriver URL, and the driver process if this test started it.
/// `None`: skip (reason printed).
fn webdriver() -> Option<(String, Option<Driver>)> {
    if let Ok(url) = std::env::var("OUTBOX_TEST_WEBDRIVER_URL") {
        return Some((url, None));
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    match Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => {
            let driver = Driver(child);
            eventually("chromedriver to listen", || {
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
            Some((format!("http://127.0.0.1:{port}"), Some(driver)))
        }
        Err(e) => {
            let reason = format!(
                "no WebDriver: OUTBOX_TEST_WEBDRIVER_URL is unset and chromedriver cannot be started ({e}); \
                 install the Debian packages chromium and chromium-driver, or run `cargo xtask ci`"
            );
            assert!(std::env::var_os("CI").is_none(), "CI is set: {reason}");
            println!("skipped: {reason}");
            None
        }
    }
}

async fn browser(url: &str) -> Client {
    let mut caps = serde_json::Map::new();
    let mut chrome = serde_json::json!({
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,900", "--no-first-run"]
    });
    if std::path::Path::new("/usr/bin/chromium").exists() {
        chrome["binary"] = "/usr/bin/chromium".into();
    }
    caps.insert("goog:chromeOptions".into(), chrome);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot start a browser session at {url}: {e}"))
}

/// Where a screenshot goes: `OUTBOX_TEST_SCREENSHOT_DIR` (relative to the
/// workspace root; `docs/img` refreshes the runbook's), else
/// `target/screenshots`, so a test run leaves the tracked files alone.
fn img(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::var("OUTBOX_TEST_SCREENSHOT_DIR")
        .ok()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "target/screenshots".into());
    root.join(dir).join(name)
}

async fn text(c: &Client, css: &str) -> String {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .text()
        .await
        .expect("text")
}

async fn count(c: &Client, id: &str) -> u64 {
    let t = text(c, &format!("#{id}")).await;
    t.trim()
        .parse()
        .unwrap_or_else(|_| panic!("#{id} is not a count: {t:?}"))
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    let path = img(name);
    std::fs::create_dir_all(path.parent().unwrap()).expect("the screenshot directory");
    std::fs::write(&path, png).expect("write screenshot");
}

/// Fills the token of the first form posting to `action` and submits it;
/// returns the answer page's text once it is loaded (`#result` on success,
/// the browser's `<pre>` of a plain-text refusal; neither is on the form's
/// page).
async fn submit(c: &Client, action: &str, token: &str) -> String {
    let form = format!("form[action='{action}']");
    c.find(Locator::Css(&format!("{form} input[name=token]")))
        .await
        .expect("token box")
        .send_keys(token)
        .await
        .expect("type the token");
    let button = c
        .find(Locator::Css(&format!("{form} button")))
        .await
        .expect("button");
    button.clone().click().await.expect("submit");
    // The answer is another page: wait until the form's page is gone (its
    // button stale), so an answer element already on that page (a dry
    // run's) is never taken for the answer.
    let deadline = std::time::Instant::now() + support::PATIENCE;
    while button.is_displayed().await.is_ok() {
        assert!(std::time::Instant::now() < deadline, "the form's page stayed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    c.wait()
        .at_most(support::PATIENCE)
        .for_element(Locator::Css("#result, pre"))
        .await
        .expect("the answer page")
        .text()
        .await
        .expect("text")
}

#[test]
fn the_monitor_in_a_headless_browser() {
    let Some((url, _driver)) = webdriver() else {
        return;
    };
    let site = Site::migrated();
    site.seed_with_dead(&[
        ("campaign-cursed", true),
        ("campaign-a", false),
        ("campaign-b", false),
    ]);
    // A run to show on the runs page.
    site.ok(&["rebuild", "--projection", "roster"]);
    let env = [("OUTBOX_SERVE_TOKEN", TOKEN)];
    let server = Server::start(&site, &["serve", "--addr", "127.0.0.1:0"], &env, "serving the");
    let read_only = Server::start(&site, &["serve", "--addr", "127.0.0.1:0"], &[], "serving the");
    let base = format!("http://{}", server.addr);

    support::block_on(async {
        let c = browser(&url).await;

        // The overview's counts are the report's.
        c.goto(&format!("{base}/")).await.expect("overview");
        let report = site.report();
        for (id, key) in [
            ("count-pending", "pending"),
            ("count-processing", "processing"),
            ("count-failed", "failed"),
            ("count-dead", "dead"),
            ("count-total", "total"),
        ] {
            assert_eq!(count(&c, id).await, report[key].as_u64().unwrap(), "{id}");
        }
        assert_eq!(count(&c, "count-dead").await, 1);
        screenshot(&c, "serve-overview.png").await;

        c.goto(&format!("{base}/runs?digests=1")).await.expect("runs");
        assert!(text(&c, "#runs").await.contains("roster"));
        screenshot(&c, "serve-runs.png").await;

        // The read-only monitor offers no action at all.
        c.goto(&format!("http://{}/blocked", read_only.addr))
            .await
            .expect("blocked");
        assert!(text(&c, "#blocked").await.contains("campaign-cursed"));
        assert!(
            c.find_all(Locator::Css("form[method=post]"))
                .await
                .expect("forms")
                .is_empty()
        );

        // A wrong token is refused and changes nothing.
        c.goto(&format!("{base}/blocked")).await.expect("blocked");
        screenshot(&c, "serve-blocked.png").await;
        let answer = submit(&c, "/actions/requeue", "not-the-token-at-all").await;
        assert!(answer.contains("wrong operator token"), "{answer}");
        assert_eq!(site.counts(), [3, 0, 0, 1], "a refused requeue changes nothing");

        // The operator keeps the overview open, refreshing itself (a meta
        // refresh: the CSP allows no script, and none is needed); the
        // banner names the dead row.
        let watching = c.window().await.expect("this window");
        c.goto(&format!("{base}/?refresh=5")).await.expect("overview");
        assert!(
            c.find(Locator::Css("meta[http-equiv=refresh][content='5']"))
                .await
                .is_ok()
        );
        assert!(text(&c, "#health").await.contains("1 dead row(s)"));

        // In another window: the dead rows by error, then the dead row
        // found by the search box, its page, and its error group requeued
        // from there with the token (a dry run first, which changes nothing).
        let working = c.new_window(false).await.expect("a second window").handle;
        c.switch_to_window(working).await.expect("to the second window");
        c.goto(&format!("{base}/dead")).await.expect("dead rows by error");
        assert!(
            text(&c, "#dead-groups")
                .await
                .contains("cursed die on {stream}/#")
        );
        screenshot(&c, "serve-dead.png").await;
        c.find(Locator::Css("nav input[name=stream]"))
            .await
            .expect("the search box")
            .send_keys("campaign-cursed")
            .await
            .expect("type the stream");
        c.find(Locator::Css("nav button"))
            .await
            .expect("Find")
            .click()
            .await
            .expect("search");
        let rows = c
            .wait()
            .at_most(support::PATIENCE)
            .for_element(Locator::Css("#stream-rows"))
            .await
            .expect("the stream's page");
        assert!(rows.text().await.expect("rows").contains("dead"));
        c.find(Locator::Css("#stream-rows a[href^='/row?']"))
            .await
            .expect("a link to its head row")
            .click()
            .await
            .expect("open the row");
        let payload = c
            .wait()
            .at_most(support::PATIENCE)
            .for_element(Locator::Css("#payload"))
            .await
            .expect("the row page");
        assert!(!payload.text().await.expect("payload").is_empty());
        assert!(text(&c, "#row").await.contains("cursed die on campaign-cursed/4"));
        assert!(
            text(&c, "#error-group")
                .await
                .contains("cursed die on {stream}/#")
        );
        screenshot(&c, "serve-row.png").await;
        let answer = submit(&c, "/actions/requeue-group", TOKEN).await;
        assert!(answer.contains("Dry run: 1 dead row(s)"), "{answer}");
        assert_eq!(site.counts(), [3, 0, 0, 1], "a dry run changes nothing");
        let answer = submit(&c, "/actions/requeue-group", TOKEN).await;
        assert!(answer.contains("requeued 1 dead row(s)"), "{answer}");
        assert!(!answer.contains(TOKEN), "the token is never shown");
        assert_eq!(site.counts(), [4, 0, 0, 0]);

        // Back at the overview, untouched: its refresh clears the banner.
        c.switch_to_window(watching).await.expect("back to the overview");
        let deadline = std::time::Instant::now() + support::PATIENCE;
        loop {
            let banner = match c.find(Locator::Css("#health")).await {
                Ok(e) => e.text().await.unwrap_or_default(),
                // Caught between two loads.
                Err(_) => String::new(),
            };
            if banner.contains("no live worker") && !banner.contains("dead row") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the refreshing overview still says: {banner}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        assert!(
            c.current_url()
                .await
                .expect("url")
                .as_str()
                .ends_with("/?refresh=5"),
            "the page reloaded itself"
        );
        site.ok(&["work", "--once"]);
        c.goto(&format!("{base}/")).await.expect("overview");
        assert_eq!(count(&c, "count-total").await, 0, "the requeued row was applied");
        c.goto(&format!("{base}/blocked")).await.expect("blocked");
        assert!(c.find(Locator::Css("#none-blocked")).await.is_ok());

        c.close().await.expect("close the browser");
    });
}
