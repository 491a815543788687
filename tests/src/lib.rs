//! What the end-to-end tests share: real servers and fleet processes from the one launcher
//! (`delta-launcher`: `redis-server` and `nats-server` on free loopback ports in temporary data
//! directories, the real `delta-gateway` and `delta-worker` programs, all killed on drop), the
//! fleet harness ([`fleet`]) on one server of each or, with `DELTA_TEST_CLUSTER=1`, on clusters
//! ([`servers`]), the browser driver ([`browser`]), the chaos suite's checker ([`chaos`]) and
//! checks on journals.
//!
//! The programs must be built first (`cargo build --bins`; `scripts/test.sh` does).

use std::time::{Duration, Instant};

pub use delta_launcher::{Nats, NatsRole, Redis, RedisRole, Signal, free_port, signal};

pub mod browser;
pub mod chaos;
pub mod fleet;
pub mod gateways;
pub mod servers;
pub mod tls;
pub mod workers;

/// A NATS client logged in as the URL says (`user:password@`, which async-nats itself ignores).
pub async fn nats_client(url: &str) -> async_nats::Client {
    try_nats_client(url, None)
        .await
        .unwrap_or_else(|e| panic!("connecting to NATS: {e}"))
}

/// A run's end as `COMPLETED` with result `ok`, as a test finishes a run through the store.
pub fn completed_ok() -> delta_store::StatusChange {
    delta_store::StatusChange::Finished {
        status: delta_store::Terminal::Completed,
        result: Some("ok".into()),
        error: None,
    }
}

/// Cancels run `id` through `store` as a gateway does: `why` journaled, the run `CANCELLED`.
pub async fn cancel_run(
    store: &delta_store::redis::RedisRunStore,
    id: delta_protocol::RunId,
    why: &str,
) {
    use delta_protocol::{EngineEnd, Event, MessageLevel, RunStatus, SystemMessage};
    use delta_store::RunStore;
    store
        .append(
            id,
            vec![
                Event::SystemMessage(SystemMessage {
                    level: MessageLevel::Warn,
                    content: why.to_owned(),
                }),
                Event::EngineEnd(EngineEnd {
                    status: RunStatus::Cancelled,
                    result: None,
                    error: Some(why.to_owned()),
                }),
            ],
            Some(delta_store::StatusChange::Finished {
                status: delta_store::Terminal::Cancelled,
                result: None,
                error: Some(why.to_owned()),
            }),
        )
        .await
        .expect("cancel");
}

/// The names of `stream`'s consumers.
pub async fn consumer_names(stream: &async_nats::jetstream::stream::Stream) -> Vec<String> {
    use futures_util::StreamExt;
    stream
        .consumer_names()
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .map(|n| n.expect("a consumer's name"))
        .collect()
}

/// Every message `stream` holds (the events stream's CloudEvents), in order, as JSON.
pub async fn stored_events(
    stream: &mut async_nats::jetstream::stream::Stream,
) -> Vec<serde_json::Value> {
    let state = stream.info().await.expect("info").state.clone();
    let mut out = vec![];
    for seq in state.first_sequence..=state.last_sequence {
        if let Ok(m) = stream.get_raw_message(seq).await {
            out.push(serde_json::from_slice(&m.payload).expect("an event"));
        }
    }
    out
}

/// A NATS client logged in as the URL says, trusting `ca` for TLS; the error with its causes.
pub async fn try_nats_client(
    url: &str,
    ca: Option<&std::path::Path>,
) -> Result<async_nats::Client, String> {
    let settings = delta_queue::Settings {
        ca_file: ca.map(std::path::Path::to_path_buf),
        ..Default::default()
    };
    delta_queue::connect_client(url, &settings, None)
        .await
        .map_err(|e| {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            text
        })
}

/// Waits (up to 20 s) until a run in Redis has `status`; fails the test with the status it has.
pub async fn wait_for_status(
    store: &delta_store::redis::RedisRunStore,
    id: delta_protocol::RunId,
    status: delta_protocol::RunStatus,
) {
    use delta_store::RunStore;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = store.load(id).await.expect("load").record.status;
        if now == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "run {id} is {now}, expected {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that a run's journal requested and resulted each step once, `steps` of them.
pub fn assert_each_step_once(run: &delta_store::StoredRun, steps: usize) {
    use delta_protocol::Event;
    let id = run.record.run_id;
    let (mut requested, mut resulted) = (
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    );
    for e in &run.journal {
        match &e.event {
            Event::ActionRequest(a) => assert!(
                requested.insert(a.action_id.clone()),
                "run {id}: step {} requested twice",
                a.action_id
            ),
            Event::ActionResult(r) => assert!(
                resulted.insert(r.action_id.clone()),
                "run {id}: step {} has two results",
                r.action_id
            ),
            _ => {}
        }
    }
    assert_eq!(resulted.len(), steps, "run {id}: {steps} steps");
}

/// A journal's events without what legitimately differs between two runs of the same agent
/// with the same answers: times, durations, ids, the worker's name, and request hashes (a hash
/// covers its request's ids and time).
pub fn journal_shape(journal: &[delta_protocol::JournalEvent]) -> Vec<serde_json::Value> {
    journal
        .iter()
        .map(|e| {
            let mut v = serde_json::to_value(&e.event).unwrap_or_default();
            let p = &mut v["payload"];
            for k in [
                "run_id",
                "request_id",
                "timestamp",
                "expires_at",
                "duration_ms",
                "worker",
                "request_hash",
            ] {
                if p.get(k).is_some() {
                    p[k] = serde_json::json!("*");
                }
            }
            serde_json::json!({"seq": e.seq, "event": v})
        })
        .collect()
}

/// The workers that ran a run, one per session (`ENGINE_START.worker`), in order.
pub fn workers_of(run: &delta_store::StoredRun) -> Vec<String> {
    use delta_protocol::Event;
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::EngineStart(s) => Some(s.worker.clone()),
            _ => None,
        })
        .collect()
}

/// The answers a run journaled (`HUMAN_INPUT_RECEIVED`), in order.
pub fn answers_of(run: &delta_store::StoredRun) -> Vec<delta_protocol::HumanInputReceived> {
    use delta_protocol::Event;
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::HumanInputReceived(h) => Some(h.clone()),
            _ => None,
        })
        .collect()
}

/// A plain connection to the Redis at `url`, for a test that reads or changes keys directly.
pub async fn redis_raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis")
}

/// A typed answer `input` to question `request_id`, from `ops` over HTTP (as a person in the
/// inbox gives it).
pub fn typed_answer(
    request_id: delta_protocol::RequestId,
    input: &str,
) -> delta_protocol::InteractionResponse {
    let mut a = delta_protocol::InteractionResponse::new(
        request_id,
        delta_protocol::Responder {
            id: "ops".into(),
            via: delta_protocol::Via::Http,
            on_behalf_of: None,
            relayed_by: None,
        },
    );
    a.input = Some(input.into());
    a
}

/// Pauses `run` on question `q` as the engine does: the question journaled, the run waiting on
/// it (through `store`, fenced or not).
pub async fn pause_on(
    store: &delta_store::redis::RedisRunStore,
    run: delta_protocol::RunId,
    q: &delta_protocol::InteractionRequest,
) {
    use delta_store::RunStore;
    store
        .append(
            run,
            vec![delta_protocol::Event::HumanInputRequest(Box::new(
                q.clone(),
            ))],
            Some(delta_store::StatusChange::Waiting(Box::new(q.clone()))),
        )
        .await
        .expect("pause");
}

/// Opens question `q` again as the engine does when it refuses its answer: with the write,
/// through `store` (a delivery's handle), that journals the refusal and pauses the run on it
/// again.
pub async fn reopen_refused(
    store: &delta_store::redis::RedisRunStore,
    q: &delta_protocol::InteractionRequest,
) {
    use delta_store::{AnswerStore, RunStore};
    store.reopen(q.run_id, q);
    let why = delta_protocol::Event::SystemMessage(delta_protocol::SystemMessage {
        level: delta_protocol::MessageLevel::Warn,
        content: format!("the answer to request {} was refused", q.request_id),
    });
    store
        .append(
            q.run_id,
            vec![why],
            Some(delta_store::StatusChange::Waiting(Box::new(q.clone()))),
        )
        .await
        .expect("the refusal's write");
}

/// How many times Redis ran `command` (lowercase, as `INFO commandstats` names it: `zrem`,
/// `hgetall`), scripts' inner calls included, since it started.
pub async fn command_calls(conn: &redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn.clone())
        .await
        .expect("info");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|l| l.split(',').next())
        .map_or(0, |n| n.parse::<u64>().expect("calls"))
}

/// [`command_calls`] of the Redis at `url`, or with several URLs (a Redis Cluster's nodes,
/// comma-separated) summed over its masters (a replica runs its master's writes again).
pub async fn command_calls_at(url: &str, command: &str) -> u64 {
    let mut calls = 0;
    for one in url.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let conn = redis_raw(one).await;
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query_async(&mut conn.clone())
            .await
            .expect("role");
        if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            calls += command_calls(&conn, command).await;
        }
    }
    calls
}

/// Every key matching `pattern` in Redis with its value, as text: hashes, streams, sorted sets,
/// sets, lists and strings read in clear (a `DUMP` is compressed, so a search could miss). With
/// several URLs (a Redis Cluster's nodes, comma-separated), the keys of every master.
pub async fn redis_dump(url: &str, pattern: &str) -> String {
    let mut out = String::new();
    for one in url.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let client = redis::Client::open(one).expect("url");
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut c).await.expect("role");
        // A replica holds its master's keys again.
        if !matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            continue;
        }
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut c)
            .await
            .expect("keys");
        for k in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&k)
                .query_async(&mut c)
                .await
                .expect("type");
            let read = match kind.as_str() {
                "hash" => redis::cmd("HGETALL").arg(&k).clone(),
                "stream" => redis::cmd("XRANGE").arg(&k).arg("-").arg("+").clone(),
                "zset" => redis::cmd("ZRANGE")
                    .arg(&k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .clone(),
                "set" => redis::cmd("SMEMBERS").arg(&k).clone(),
                "list" => redis::cmd("LRANGE").arg(&k).arg(0).arg(-1).clone(),
                "string" => redis::cmd("GET").arg(&k).clone(),
                _ => redis::cmd("DUMP").arg(&k).clone(),
            };
            let value: redis::Value = read.query_async(&mut c).await.expect("read key");
            out.push_str(&k);
            out.push_str(&format!(" {value:?}\n"));
            match kind.as_str() {
                "stream" => unpacked_entries(&value, &mut out),
                "hash" => unpacked_request(&value, &mut out),
                _ => {}
            }
        }
    }
    out
}

/// The events of a journal stream's packed entries (field `z`, docs/protocol.md), in clear: a
/// search of the dump must see what they hold.
fn unpacked_entries(stream: &redis::Value, out: &mut String) {
    use redis::Value;
    let Value::Array(entries) = stream else {
        return;
    };
    for entry in entries {
        let Value::Array(parts) = entry else { continue };
        let Some(Value::Array(fields)) = parts.get(1) else {
            continue;
        };
        for pair in fields.chunks(2) {
            if let [Value::BulkString(name), Value::BulkString(z)] = pair
                && name == b"z"
            {
                let lines = delta_store::redis::unpack_entry(z).expect("a packed entry");
                out.push_str(&lines);
                out.push('\n');
            }
        }
    }
}

/// A question's packed `request` (`z:…`, docs/protocol.md), in clear.
fn unpacked_request(hash: &redis::Value, out: &mut String) {
    use redis::Value;
    let pairs: Vec<(&[u8], &[u8])> = match hash {
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| match (k, v) {
                (Value::BulkString(k), Value::BulkString(v)) => Some((k.as_slice(), v.as_slice())),
                _ => None,
            })
            .collect(),
        Value::Array(a) => a
            .chunks(2)
            .filter_map(|p| match p {
                [Value::BulkString(k), Value::BulkString(v)] => Some((k.as_slice(), v.as_slice())),
                _ => None,
            })
            .collect(),
        _ => return,
    };
    for (k, v) in pairs {
        if k == b"request" && v.starts_with(b"z:") {
            let json = delta_store::redis::request_json(&String::from_utf8_lossy(v))
                .expect("a packed request");
            out.push_str(&json);
            out.push('\n');
        }
    }
}

/// A connection for a test's own commands to the Redis at `url`: one server, or with several
/// URLs (comma-separated) the Redis Cluster they are nodes of, each command sent to the master
/// of its key's slot.
pub async fn redis_connection(url: &str) -> RedisConnection {
    let urls: Vec<&str> = url.split(',').map(str::trim).collect();
    match urls[..] {
        [one] => RedisConnection::One(
            redis::Client::open(one)
                .expect("redis url")
                .get_multiplexed_async_connection()
                .await
                .expect("redis"),
        ),
        _ => RedisConnection::Cluster(
            redis::cluster::ClusterClient::new(urls)
                .expect("cluster urls")
                .get_async_connection()
                .await
                .expect("redis cluster"),
        ),
    }
}

/// See [`redis_connection`].
#[derive(Clone)]
pub enum RedisConnection {
    One(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            RedisConnection::One(c) => c.req_packed_command(cmd),
            RedisConnection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            RedisConnection::One(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// File `name` of every run's work directory under a worker's `DELTA_WORK_DIR` (`<root>/<run
/// id>/<name>`, issue 14 finding 11), as `(run directory name, text)` sorted by directory; runs
/// without the file are left out.
pub fn run_files(root: &std::path::Path, name: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join(name)).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), text))
        })
        .collect();
    out.sort();
    out
}

/// The lines of file `name` in every run's work directory under `root` (see [`run_files`]).
pub fn run_file_lines(root: &std::path::Path, name: &str) -> Vec<String> {
    run_files(root, name)
        .into_iter()
        .flat_map(|(_, text)| text.lines().map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

/// A server that could not be started.
#[derive(Debug)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// CRC16-CCITT (XMODEM), the checksum Redis Cluster takes of a key's hash tag.
pub fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of `key`, as `CLUSTER KEYSLOT` computes it: the CRC16 of the text between
/// the first `{` and the next `}` when that is not empty, else of the whole key, mod 16384.
pub fn cluster_slot(key: &str) -> u16 {
    let tagged = key.find('{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.find('}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16(tagged.unwrap_or(key).as_bytes()) % 16384
}

/// The Python with the independent libraries the tests check channels against (standardwebhooks,
/// cloudevents, jsonschema), as `deploy/install-test-python.sh` installs it; the test fails with
/// that command when it is missing.
pub fn test_python() -> std::path::PathBuf {
    let root = delta_launcher::repo_root().expect("the tests run inside the checkout");
    let tools = std::env::var_os("DELTA_TOOLS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| root.join(".tools"));
    let python = tools.join("venv/bin/python");
    let ok = std::process::Command::new(&python)
        .args([
            "-c",
            "import standardwebhooks, cloudevents, jsonschema, mcp",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "{} lacks standardwebhooks, cloudevents, jsonschema or mcp: run {}",
        python.display(),
        root.join("deploy/install-test-python.sh").display()
    );
    python
}

/// The directory of the tests' Python scripts (`tests/py/`).
/// A file or directory of Delta Engine's agents kept as fixtures
/// (`shared/engine/tests/fixtures/delta-engine`).
pub fn delta_engine_fixture(rel: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is in the workspace")
        .join("shared/engine/tests/fixtures/delta-engine")
        .join(rel)
}

/// Copies the directory `from` to `to`, recursively.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).expect("copy");
        }
    }
}

pub fn python_scripts() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("py")
}

/// One MCP `tools/call` of agent `agent` at `url`'s `/mcp`, as a client of the 2026-07-28
/// protocol sends it without a session (the `_meta` in `params` is the caller's), with `token`
/// if any: the JSON-RPC message it answers (from the SSE `data:` line, or the plain body).
pub async fn mcp_tools_call(
    url: &str,
    token: Option<&str>,
    agent: &str,
    params: serde_json::Value,
) -> serde_json::Value {
    let body =
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
    let mut request = reqwest::Client::new()
        .post(format!("{url}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", agent);
    if let Some(t) = token {
        request = request.bearer_auth(t);
    }
    let text = request
        .body(body.to_string())
        .send()
        .await
        .expect("the gateway answers")
        .text()
        .await
        .expect("a body");
    // The response to the call: the message with a `result` or an `error` (notifications may
    // come first on the stream).
    let is_response = |v: &serde_json::Value| v.get("result").is_some() || v.get("error").is_some();
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain([text.as_str()])
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
        .find(is_response)
        .unwrap_or_else(|| panic!("a JSON-RPC response in {text}"))
}
