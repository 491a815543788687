//! Headless Chromium for the web inbox's tests, driven over WebDriver: a `chromedriver` child
//! process on a free port (in its own process group, killed with the browser on drop), a
//! fresh profile directory, and a [`fantoccini`] session.
//!
//! Binaries: `DELTA_CHROMEDRIVER` / `DELTA_CHROMIUM`, else `chromedriver` / `chromium` on `PATH`
//! (Debian's `/usr/bin`), installed by `deploy/install-browser.sh`. A missing one fails the test
//! with that command: browser tests are never skipped silently.
//!
//! [`Browser::checked`] runs a test body and, when it panics, saves a screenshot and the page
//! source to [`artifacts_dir`] before the panic goes on.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::FutureExt;
use serde_json::{Value, json};

use crate::Error;

/// What the page is shown on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    /// A 1280×900 window.
    Desktop,
    /// A 390×844 phone in portrait (iPhone 12–15 class), emulated by Chromium: headless windows
    /// are at least 500 px wide, and a phone also has touch and its own device pixel ratio.
    Phone,
}

impl Screen {
    /// The viewport's CSS pixels.
    pub fn size(self) -> (u32, u32) {
        match self {
            Screen::Desktop => (1280, 900),
            Screen::Phone => (390, 844),
        }
    }
}

/// How long [`Browser::wait_for`] polls before failing.
pub const WAIT: Duration = Duration::from_secs(10);

const INSTALL: &str = "run deploy/install-browser.sh (scripts/test.sh does)";

/// Where failure screenshots and page sources go: `DELTA_ARTIFACTS_DIR`, else
/// `<target dir>/browser-artifacts` (the target dir found from the test binary's path, so it
/// follows `CARGO_TARGET_DIR`).
pub fn artifacts_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DELTA_ARTIFACTS_DIR") {
        return PathBuf::from(d);
    }
    // <target>/debug/deps/<test binary>
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("browser-artifacts")
}

fn find(name: &str, env_var: &str) -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os(env_var) {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(Error(format!(
                "{env_var}={} does not exist: {INSTALL}, or fix {env_var}",
                p.display()
            )))
        };
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.exists())
        .ok_or_else(|| {
            Error(format!(
                "{name} not found: the browser tests need chromium and chromedriver; {INSTALL} (or set {env_var})"
            ))
        })
}

/// A headless Chromium session for one test.
pub struct Browser {
    pub client: Client,
    /// The test's name: names its artifacts.
    name: String,
    /// chromedriver's URL, for the Chrome DevTools commands WebDriver has no word for.
    driver_url: String,
    http: reqwest::Client,
    // Field order is drop order: the session's client before the driver, then the profile.
    /// chromedriver and whatever it started (the browser), killed as a process group on drop.
    _driver: delta_launcher::Process,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a `size` window. Panics (failing the
    /// test) with the install command when either is missing.
    pub async fn start(test: &str, screen: Screen) -> Browser {
        match Self::try_start(test, screen).await {
            Ok(b) => b,
            Err(e) => panic!("cannot start the browser for {test}: {e}"),
        }
    }

    async fn try_start(test: &str, screen: Screen) -> Result<Browser, Error> {
        // A failure's artifacts from an earlier run would mislead: they go now.
        let old = artifacts_dir().join(test);
        for ext in ["png", "html", "console.txt"] {
            let _ = std::fs::remove_file(old.with_extension(ext));
        }
        let driver_bin = find("chromedriver", "DELTA_CHROMEDRIVER")?;
        let chromium = find("chromium", "DELTA_CHROMIUM")?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        let profile = tempfile::tempdir().map_err(|e| Error(format!("tempdir: {e}")))?;
        let mut last = Error("not tried".into());
        for _ in 0..3 {
            let port = crate::free_port().map_err(|e| Error(e.chain()))?;
            let mut driver = spawn_driver(&driver_bin, port, profile.path())?;
            let url = format!("http://127.0.0.1:{port}");
            if let Err(e) = wait_ready(&http, &url, &mut driver).await {
                last = e;
                continue;
            }
            let client = connect(&url, &chromium, profile.path(), screen).await?;
            return Ok(Browser {
                client,
                name: test.to_owned(),
                driver_url: url,
                http,
                _driver: driver,
                _profile: profile,
            });
        }
        Err(last)
    }

    /// Runs a test body; if it panics, saves a screenshot and the page source (see
    /// [`artifacts_dir`]) and then lets the panic go on, so the test fails as it would have.
    pub async fn checked<F: Future<Output = ()>>(&self, body: F) {
        if let Err(panic) = AssertUnwindSafe(body).catch_unwind().await {
            match self.save_artifacts("").await {
                Ok(saved) => eprintln!("{}: saved {}", self.name, saved.join(", ")),
                Err(e) => eprintln!("{}: could not save browser artifacts: {e}", self.name),
            }
            std::panic::resume_unwind(panic);
        }
    }

    /// Saves `<dir>/<test><suffix>.png` and `.html`; returns their paths.
    pub async fn save_artifacts(&self, suffix: &str) -> Result<Vec<String>, Error> {
        let dir = artifacts_dir();
        std::fs::create_dir_all(&dir).map_err(|e| Error(format!("{}: {e}", dir.display())))?;
        let base = dir.join(format!("{}{suffix}", self.name));
        let mut saved = vec![];
        let png = base.with_extension("png");
        match self.client.screenshot().await {
            Ok(bytes) => {
                std::fs::write(&png, bytes)
                    .map_err(|e| Error(format!("{}: {e}", png.display())))?;
                saved.push(png.display().to_string());
            }
            Err(e) => eprintln!("{}: no screenshot: {e}", self.name),
        }
        let html = base.with_extension("html");
        match self.client.source().await {
            Ok(source) => {
                std::fs::write(&html, source)
                    .map_err(|e| Error(format!("{}: {e}", html.display())))?;
                saved.push(html.display().to_string());
            }
            Err(e) => eprintln!("{}: no page source: {e}", self.name),
        }
        let log = base.with_extension("console.txt");
        let lines = self.console().await;
        std::fs::write(&log, lines.join("\n"))
            .map_err(|e| Error(format!("{}: {e}", log.display())))?;
        saved.push(log.display().to_string());
        Ok(saved)
    }

    /// The browser console's messages so far (errors, warnings, `console.log`), one per line.
    pub async fn console(&self) -> Vec<String> {
        let Ok(Some(session)) = self.client.session_id().await else {
            return vec![];
        };
        let resp = self
            .http
            .post(format!("{}/session/{session}/se/log", self.driver_url))
            .json(&json!({"type": "browser"}))
            .send()
            .await;
        let Ok(body) = resp else { return vec![] };
        let body: Value = body.json().await.unwrap_or_default();
        body["value"]
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|e| format!("{} {}", e["level"], e["message"]))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// With `DELTA_INBOX_SCREENSHOTS=1`, saves a screenshot now (for looking at the page).
    pub async fn snapshot(&self, suffix: &str) {
        if std::env::var_os("DELTA_INBOX_SCREENSHOTS").is_some() {
            if let Err(e) = self.save_artifacts(suffix).await {
                eprintln!("{}: snapshot: {e}", self.name);
            }
        }
    }

    /// Ends the session (the browser quits) and then the driver.
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.client.clone().close()).await;
    }

    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Runs `script` (a function body: `return …`) in the page with `args`.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.client
            .execute(script, args)
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Polls `script` until it returns something truthy (not null, false, 0 or ""), which it
    /// returns; fails the test after [`WAIT`], naming `what` and the last value.
    pub async fn wait_for(&self, what: &str, script: &str, args: Vec<Value>) -> Value {
        self.wait_for_within(WAIT, what, script, args).await
    }

    /// [`Browser::wait_for`] with its own timeout.
    pub async fn wait_for_within(
        &self,
        within: Duration,
        what: &str,
        script: &str,
        args: Vec<Value>,
    ) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let v = self.js(script, args.clone()).await;
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "waited {within:?} for {what}; last value: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The element `css` once it is shown and enabled, and its question's card (if it is in
    /// one) answers (`data-armed`: the card stood still long enough, docs/inbox.md), scrolled to
    /// the middle of the window (as a person would before touching it: not under the page's
    /// sticky bar).
    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        self.wait_for(
            &format!("`{css}` to be shown"),
            "const e = document.querySelector(arguments[0]); \
             if (!e || e.offsetParent === null || e.disabled) return false; \
             const card = e.closest('article[data-request-id]'); \
             if (card && !('armed' in card.dataset)) return false; \
             e.scrollIntoView({block: 'center', inline: 'nearest'}); return true;",
            vec![json!(css)],
        )
        .await;
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("find {css}: {e}"))
    }

    /// Clicks the element `css` (as a person would: it must be visible and enabled).
    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Types `text` into the element `css` (WebDriver key codes such as `\u{E007}`, Enter, work).
    pub async fn type_into(&self, css: &str, text: &str) {
        self.find(css)
            .await
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Presses `keys` (WebDriver key codes: `\u{E004}` Tab, `\u{E007}` Enter, `\u{E00C}`
    /// Escape) on whatever has the focus, as a keyboard would.
    pub async fn press(&self, keys: &str) {
        // As a person reading it: not before the focused element's card answers.
        self.wait_for(
            "the focused card to answer",
            "const e = document.activeElement; \
             const card = e && e.closest ? e.closest('article[data-request-id]') : null; \
             return !card || 'armed' in card.dataset;",
            vec![],
        )
        .await;
        let focused = self
            .client
            .active_element()
            .await
            .unwrap_or_else(|e| panic!("the focused element: {e}"));
        focused
            .send_keys(keys)
            .await
            .unwrap_or_else(|e| panic!("press {keys:?}: {e}"));
    }

    /// The text of the element `css`, or `None` when there is none.
    pub async fn text(&self, css: &str) -> Option<String> {
        self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
            vec![json!(css)],
        )
        .await
        .as_str()
        .map(str::to_owned)
    }

    /// Blocks requests whose URL matches one of `patterns` (`*` wildcards) from now on, through
    /// the Chrome DevTools protocol: a live stream that cannot (re)connect, deterministically.
    pub async fn block_urls(&self, patterns: &[&str]) {
        self.cdp("Network.enable", json!({})).await;
        self.cdp("Network.setBlockedURLs", json!({"urls": patterns}))
            .await;
    }

    /// Runs a Chrome DevTools protocol command (`Network.…`, `Emulation.…`) in this session.
    pub async fn cdp(&self, cmd: &str, params: Value) {
        let session = self
            .client
            .session_id()
            .await
            .ok()
            .flatten()
            .expect("a WebDriver session");
        let resp = self
            .http
            .post(format!(
                "{}/session/{session}/goog/cdp/execute",
                self.driver_url
            ))
            .json(&json!({"cmd": cmd, "params": params}))
            .send()
            .await
            .unwrap_or_else(|e| panic!("{cmd}: {e}"));
        assert!(resp.status().is_success(), "{cmd}: {}", resp.status());
    }
}

fn spawn_driver(bin: &Path, port: u16, profile: &Path) -> Result<delta_launcher::Process, Error> {
    // `DELTA_CHROMEDRIVER_LOG=1` keeps chromedriver's log in the profile dir (debugging).
    let log = std::env::var_os("DELTA_CHROMEDRIVER_LOG")
        .map(|_| format!("--log-path={}", profile.join("chromedriver.log").display()));
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--port={port}")).args(log);
    // Its own process group: the browser it starts is killed with it.
    let out = delta_launcher::Output {
        own_group: true,
        ..Default::default()
    };
    delta_launcher::Process::spawn("chromedriver", &mut cmd, &out)
        .map_err(|e| Error(format!("{}; {INSTALL}", e.chain())))
}

async fn wait_ready(
    http: &reqwest::Client,
    url: &str,
    driver: &mut delta_launcher::Process,
) -> Result<(), Error> {
    let status = format!("{url}/status");
    let ready = || async {
        match http.get(&status).send().await {
            Ok(r) => r
                .json::<Value>()
                .await
                .is_ok_and(|v| v["value"]["ready"] == json!(true)),
            Err(_) => false,
        }
    };
    driver
        .wait_ready_async(Duration::from_secs(20), ready)
        .await
        .map_err(|e| Error(format!("{} (chromedriver on {url})", e.chain())))
}

async fn connect(
    url: &str,
    chromium: &Path,
    profile: &Path,
    screen: Screen,
) -> Result<Client, Error> {
    let (width, height) = screen.size();
    // The machine may have no network: everything that would look something up is off.
    let args = [
        "--headless".to_owned(),
        "--no-sandbox".to_owned(),
        "--disable-gpu".to_owned(),
        "--disable-quic".to_owned(),
        "--no-first-run".to_owned(),
        "--no-default-browser-check".to_owned(),
        "--disable-background-networking".to_owned(),
        "--disable-component-update".to_owned(),
        "--disable-sync".to_owned(),
        "--disable-extensions".to_owned(),
        "--disable-dev-shm-usage".to_owned(),
        "--password-store=basic".to_owned(),
        "--mute-audio".to_owned(),
        match screen {
            Screen::Desktop => format!("--window-size={width},{height}"),
            Screen::Phone => "--window-size=600,1000".to_owned(),
        },
        format!("--user-data-dir={}", profile.join("chromium").display()),
    ];
    let mut options = json!({"binary": chromium, "args": args});
    if screen == Screen::Phone {
        options["mobileEmulation"] = json!({
            "deviceMetrics": {"width": width, "height": height, "pixelRatio": 2, "touch": true, "mobile": true},
            "userAgent": "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/156.0 Mobile Safari/537.36",
        });
    }
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": options,
        "goog:loggingPrefs": {"browser": "ALL"},
    });
    let Value::Object(caps) = caps else {
        unreachable!("a JSON object")
    };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    tokio::time::timeout(
        Duration::from_secs(60),
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(url),
    )
    .await
    .map_err(|_| Error("Chromium did not start within 60 s".into()))?
    .map_err(|e| Error(format!("cannot start a Chromium session: {e}")))
}
