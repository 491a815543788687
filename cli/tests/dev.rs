//! `delta dev` as a new user runs it: the built binary in a subprocess, its banner read for the
//! gateway's URL, the demo's questions answered through the CLI, then Ctrl+C (SIGINT): every
//! process stops, the ports close, the data directory goes (or stays with `--keep`). And the
//! message when a server is missing.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// A `delta dev` running, its stdout and stderr collected as they come.
struct Dev {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Dev {
    fn spawn(args: &[&str]) -> Dev {
        let mut child = Command::new(env!("CARGO_BIN_EXE_delta"))
            .arg("dev")
            .args(args)
            .env("USER", "tester")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn delta dev");
        let collect = |pipe: Box<dyn tokio::io::AsyncRead + Unpin + Send>| {
            let text = Arc::new(Mutex::new(String::new()));
            let into = text.clone();
            tokio::spawn(async move {
                let mut lines = tokio::io::BufReader::new(pipe).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut t = into.lock().expect("lock");
                    t.push_str(&line);
                    t.push('\n');
                }
            });
            text
        };
        let stdout = collect(Box::new(child.stdout.take().expect("stdout")));
        let stderr = collect(Box::new(child.stderr.take().expect("stderr")));
        Dev {
            child,
            stdout,
            stderr,
        }
    }

    fn out(&self) -> String {
        self.stdout.lock().expect("lock").clone()
    }

    fn err(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Waits until stdout holds `needle`; returns stdout.
    async fn wait_for(&self, needle: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let out = self.out();
            if out.contains(needle) {
                return out;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "`{needle}` never printed.\nstdout:\n{out}\nstderr:\n{}",
                self.err()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ctrl+C, then its exit code (within 30 s).
    async fn interrupt(&mut self) -> i32 {
        let pid = Pid::from_raw(i32::try_from(self.child.id().expect("running")).expect("pid"));
        kill(pid, Signal::SIGINT).expect("SIGINT");
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("delta dev stops within 30 s of Ctrl+C")
            .expect("wait");
        // The readers get the last lines.
        tokio::time::sleep(Duration::from_millis(100)).await;
        status.code().unwrap_or(-1)
    }
}

impl Drop for Dev {
    /// A test that fails midway still stops the fleet: Ctrl+C makes `delta dev` stop its
    /// children (killing `delta dev` itself would leave them running).
    fn drop(&mut self) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGINT);
        }
    }
}

/// The value after `label` on the banner line that starts with it.
fn banner(out: &str, label: &str) -> String {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no `{label}` line in:\n{out}"))
        .to_owned()
}

async fn delta(url: &str, token: &str, args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_delta"))
        .args(args)
        .arg("--json")
        .env("DELTA_GATEWAY_URL", url)
        .env("DELTA_TOKEN", token)
        .env("USER", "tester")
        .output()
        .await
        .expect("delta");
    assert!(
        out.status.success(),
        "delta {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// `delta <args>` without a token, which must fail: its stderr.
async fn delta_fails(url: &str, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_delta"))
        .args(args)
        .env("DELTA_GATEWAY_URL", url)
        .env_remove("DELTA_TOKEN")
        .output()
        .await
        .expect("delta");
    assert!(
        !out.status.success(),
        "delta {args:?} without a token succeeded"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A plain `GET path` over HTTP/1.1: the whole response, headers and body.
async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("response");
    out
}

/// Whether something still listens on `host:port`.
async fn listening(addr: &str) -> bool {
    tokio::net::TcpStream::connect(addr).await.is_ok()
}

/// `host:port` of a URL, without its scheme and login (`***@` in the banner).
fn host_port(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    rest.trim_end_matches('/').to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_dev_runs_the_demo_and_ctrl_c_stops_and_cleans_everything() {
    let mut dev = Dev::spawn(&[]);
    let out = dev.wait_for("The live log:").await;
    let url = banner(&out, "gateway");
    let data = banner(&out, "data, logs");
    let (nats, redis) = (banner(&out, "nats"), banner(&out, "redis"));
    // Authentication is on: the session's token is printed, and the inbox link carries it once.
    let token = banner(&out, "export DELTA_TOKEN=");
    assert!(token.len() >= 32, "{out}");
    assert_eq!(banner(&out, "web inbox"), format!("{url}/#token={token}"));
    assert!(
        out.contains(&format!("export DELTA_GATEWAY_URL={url}")),
        "{out}"
    );
    for addr in [host_port(&nats), host_port(&redis)] {
        assert!(
            listening(&addr).await,
            "{addr} listens while the fleet runs"
        );
    }
    let anonymous = delta_fails(&url, &["pending", "ls"]).await;
    assert!(anonymous.contains("unauthorized"), "{anonymous}");
    for cmd in [
        "pending ls",
        "answer <request_id>",
        "runs journal <run_id> --follow",
    ] {
        assert!(out.contains(cmd), "the banner shows `{cmd}`: {out}");
    }
    assert!(
        std::path::Path::new(&data)
            .join("logs/gateway.log")
            .is_file()
    );

    // The web inbox answers at the printed URL.
    let html = http_get(&host_port(&url), "/").await;
    assert!(html.starts_with("HTTP/1.1 200"), "{html:.300}");
    assert!(html.contains("<title>Delta inbox</title>"), "{html:.600}");

    // The three demo runs pause on their questions, shown in the live log.
    for kind in ["USER_INPUT", "USER_CHOICE", "USER_CONFIRMATION"] {
        dev.wait_for(&format!("asks ({kind})")).await;
    }
    let pending = delta(&url, &token, &["pending", "ls", "--agent", "hello"]).await;
    let rid = pending["interactions"][0]["request_id"]
        .as_str()
        .expect("hello's question")
        .to_owned();
    let run = pending["interactions"][0]["run_id"]
        .as_str()
        .expect("run")
        .to_owned();
    delta(&url, &token, &["answer", &rid, "--input", "Ada"]).await;
    dev.wait_for(&format!("ok  request {rid} answered by operator via cli"))
        .await;
    dev.wait_for(&format!("run {run} hello     COMPLETED: Greeted Ada."))
        .await;
    let queue = delta(&url, &token, &["queue"]).await;
    let workers = queue["workers"].as_array().map(Vec::len);
    assert_eq!(workers, Some(2), "two workers seen: {queue}");

    // Ctrl+C: everything stops, nothing listens any more, the data is gone.
    assert_eq!(dev.interrupt().await, 0, "stderr: {}", dev.err());
    let err = dev.err();
    assert!(err.contains(&format!("stopped; removed {data}")), "{err}");
    assert!(!std::path::Path::new(&data).exists(), "{data} removed");
    for addr in [host_port(&url), host_port(&nats), host_port(&redis)] {
        assert!(!listening(&addr).await, "{addr} still listens after Ctrl+C");
    }
}

/// `delta dev --cluster`: the same demo on 3 NATS servers (R3) and a Redis Cluster of 3 masters
/// with a replica each; a question answered with the CLI completes its run; Ctrl+C stops every
/// node.
#[tokio::test(flavor = "multi_thread")]
async fn delta_dev_cluster_runs_the_demo_on_clusters() {
    let mut dev = Dev::spawn(&["--cluster"]);
    let out = dev.wait_for("The live log:").await;
    let url = banner(&out, "gateway");
    let token = banner(&out, "export DELTA_TOKEN=");
    let (nats, redis) = (banner(&out, "nats"), banner(&out, "redis"));
    assert_eq!(nats.split(',').count(), 3, "three NATS servers: {out}");
    assert_eq!(redis.split(',').count(), 6, "six Redis nodes: {out}");
    assert!(
        nats.split(',')
            .chain(redis.split(','))
            .all(|u| u.contains("://***@")),
        "logins are not shown: {out}"
    );
    for addr in nats.split(',').chain(redis.split(',')) {
        assert!(listening(&host_port(addr)).await, "{addr} listens");
    }
    for kind in ["USER_INPUT", "USER_CHOICE", "USER_CONFIRMATION"] {
        dev.wait_for(&format!("asks ({kind})")).await;
    }
    let pending = delta(&url, &token, &["pending", "ls", "--agent", "hello"]).await;
    let rid = pending["interactions"][0]["request_id"]
        .as_str()
        .expect("hello's question")
        .to_owned();
    let run = pending["interactions"][0]["run_id"]
        .as_str()
        .expect("run")
        .to_owned();
    delta(&url, &token, &["answer", &rid, "--input", "Ada"]).await;
    dev.wait_for(&format!("run {run} hello     COMPLETED: Greeted Ada."))
        .await;
    let runs = delta(&url, &token, &["runs", "ls"]).await;
    assert_eq!(
        runs["runs"].as_array().map(Vec::len),
        Some(3),
        "the three demo runs, listed across the cluster's buckets: {runs}"
    );
    assert_eq!(dev.interrupt().await, 0, "stderr: {}", dev.err());
    for addr in nats.split(',').chain(redis.split(',')) {
        let addr = host_port(addr);
        assert!(!listening(&addr).await, "{addr} still listens after Ctrl+C");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_dev_keep_leaves_the_data_and_logs() {
    let mut dev = Dev::spawn(&["--keep", "--no-demo", "--workers", "1"]);
    let out = dev.wait_for("The live log:").await;
    let data = banner(&out, "data, logs");
    assert!(out.contains("kept at exit"), "{out}");
    assert!(
        !out.contains("Demo runs"),
        "--no-demo submits nothing: {out}"
    );
    assert_eq!(dev.interrupt().await, 0, "stderr: {}", dev.err());
    assert!(
        dev.err().contains(&format!("kept in {data}")),
        "{}",
        dev.err()
    );
    let logs = std::path::Path::new(&data).join("logs");
    for name in ["redis", "nats", "gateway", "worker-1"] {
        assert!(
            logs.join(format!("{name}.log")).is_file(),
            "{name}.log kept"
        );
    }
    let gateway_log = std::fs::read_to_string(logs.join("gateway.log")).expect("log");
    assert!(gateway_log.contains("listening on"), "{gateway_log}");
    std::fs::remove_dir_all(&data).expect("clean up");
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_dev_names_a_missing_server_and_the_command_that_installs_it() {
    let empty = tempfile::tempdir().expect("tmp");
    let out = Command::new(env!("CARGO_BIN_EXE_delta"))
        .arg("dev")
        .env("PATH", empty.path())
        .env("DELTA_TOOLS_DIR", empty.path())
        .output()
        .await
        .expect("delta dev");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("redis-server and nats-server not found"),
        "{err}"
    );
    assert!(
        err.contains("deploy/install-servers.sh") && err.contains("--install"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing started");
}
