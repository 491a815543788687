//! Issue 14, finding 3: Redis and NATS are the fleet's real trust boundary, so both run with a
//! login per role and the least rights each role needs, over TLS when configured. Each test runs
//! real servers: the launcher's (what `delta dev` and the tests run) and the files shipped for
//! docker-compose.yml (`deploy/redis/start.sh`, `deploy/nats/users.conf`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use delta_e2e::fleet::Fleet;
use delta_e2e::tls::TestCertificates;
use delta_e2e::{Nats, NatsRole, Redis, RedisRole};
use delta_launcher::servers::ServerOptions;
use delta_protocol::RunStatus;
use delta_queue::access::{Scope, authorization};
use delta_store::redis::access::{DEFAULT_USER, acl_line};
use futures_util::StreamExt;
use serde_json::json;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A command's outcome on Redis: `Ok` with the reply, or the server's error text.
async fn redis_try(url: &str, args: &[&str]) -> Result<redis::Value, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut c).await.map_err(|e| e.to_string())
}

/// What a fleet login may and may not do on a Redis whose users cover the prefix `delta`.
async fn check_redis_roles(url_as: impl Fn(RedisRole) -> String, anonymous: &str) {
    let refused = redis_try(anonymous, &["SET", "delta:x", "1"]).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_uppercase().contains("NOAUTH")),
        "a connection without a login wrote: {refused:?}"
    );
    for role in [RedisRole::Gateway, RedisRole::Worker] {
        let url = url_as(role);
        // What the fleet does: the store's scripts on its prefix.
        let store = delta_store::redis::RedisRunStore::connect(&url, "delta")
            .await
            .expect("store");
        let id = delta_protocol::RunId::new();
        let rec = delta_store::RunRecord::new(id, "hello", "t", RunStatus::Queued);
        delta_store::RunStore::create(&store, rec)
            .await
            .unwrap_or_else(|e| panic!("{role:?} cannot create a run: {e}"));
        delta_store::RunStore::load(&store, id)
            .await
            .unwrap_or_else(|e| panic!("{role:?} cannot load a run: {e}"));
        // What it must not do.
        for args in [
            &["CONFIG", "GET", "*"][..],
            &["ACL", "LIST"],
            &["MONITOR"],
            &["KEYS", "*"],
            &["SCAN", "0"],
            // Another prefix's key names (a Redis shared by several fleets) and their count.
            &["RANDOMKEY"],
            &["DBSIZE"],
            &["SELECT", "1"],
            &["FLUSHALL"],
            &["SCRIPT", "FLUSH"],
            &["CLIENT", "LIST"],
            &["SHUTDOWN"],
            &["SET", "other:x", "1"],
            &["GET", "other:x"],
            &["PUBLISH", "delta:x", "1"],
        ] {
            let r = redis_try(&url, args).await;
            assert!(
                r.as_ref()
                    .is_err_and(|e| e.to_uppercase().contains("NOPERM")),
                "{role:?} may run {args:?}: {r:?}"
            );
        }
    }
    // The admin may.
    redis_try(&url_as(RedisRole::Admin), &["CONFIG", "GET", "appendonly"])
        .await
        .expect("the admin administers");
}

#[tokio::test]
async fn redis_logins_are_per_role_and_fleet_roles_cannot_administer_or_leave_their_prefix() {
    let redis = Redis::start_with(&ServerOptions {
        prefix: Some("delta".into()),
        ..Default::default()
    })
    .expect("redis");
    check_redis_roles(|r| redis.url_as(r), &redis.anonymous_url()).await;
}

/// A `redis-server` started by `deploy/redis/start.sh` (as docker-compose.yml does), killed on
/// drop.
struct ShippedServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for ShippedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} never opened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

const PASSWORD: &str = "0123456789abcdef0123456789abcdef";

fn password_of(role: &str) -> String {
    // Distinct per role, so a test notices one role logging in with another's password.
    format!("{PASSWORD}{role}")
}

fn shipped_redis() -> ShippedServer {
    let dir = tempfile::tempdir().expect("tmp");
    let port = delta_e2e::free_port().expect("port");
    let programs = delta_launcher::ServerPrograms::find(Some(&repo())).expect("servers");
    let bin = programs.redis.parent().expect("dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("sh");
    cmd.arg(repo().join("deploy/redis/start.sh"))
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "yes"])
        .arg("--dir")
        .arg(dir.path())
        .env("PATH", path)
        .env("DELTA_REDIS_ACL_FILE", dir.path().join("users.acl"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for role in ["GATEWAY", "WORKER", "ADMIN"] {
        cmd.env(
            format!("DELTA_REDIS_{role}_PASSWORD"),
            password_of(&role.to_lowercase()),
        );
    }
    let child = cmd.spawn().expect("deploy/redis/start.sh");
    wait_port(port);
    ShippedServer {
        child,
        port,
        _dir: dir,
    }
}

#[tokio::test]
async fn the_shipped_redis_users_are_the_stores_and_hold_on_a_real_server() {
    // The script writes what the store's code says, for the prefix `delta`.
    let script = std::fs::read_to_string(repo().join("deploy/redis/start.sh")).expect("script");
    assert!(script.contains(DEFAULT_USER), "start.sh: {DEFAULT_USER}");
    for role in RedisRole::ALL {
        let line = acl_line(
            Some("delta"),
            role,
            &format!("delta-{}", role.name()),
            &format!(
                "${}",
                format_args!("DELTA_REDIS_{}_PASSWORD", role.name().to_uppercase())
            ),
        );
        assert!(
            script.contains(&line),
            "deploy/redis/start.sh lacks, or differs from, `{line}`"
        );
    }
    // And a real server started by it behaves so.
    let server = shipped_redis();
    let url = |r: RedisRole| {
        format!(
            "redis://delta-{}:{}@127.0.0.1:{}",
            r.name(),
            password_of(r.name()),
            server.port
        )
    };
    check_redis_roles(url, &format!("redis://127.0.0.1:{}", server.port)).await;
    // A wrong password is refused.
    let wrong = format!(
        "redis://delta-worker:{}@127.0.0.1:{}",
        password_of("admin"),
        server.port
    );
    assert!(redis_try(&wrong, &["PING"]).await.is_err());
}

#[test]
fn the_shipped_redis_script_refuses_a_missing_or_unsafe_password() {
    let out = Command::new("sh")
        .arg(repo().join("deploy/redis/start.sh"))
        .env("DELTA_REDIS_GATEWAY_PASSWORD", "has space")
        .env("DELTA_REDIS_WORKER_PASSWORD", "abc")
        .env("DELTA_REDIS_ADMIN_PASSWORD", "abc")
        .env("DELTA_REDIS_ACL_FILE", "/nonexistent/never-written")
        .output()
        .expect("sh");
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("DELTA_REDIS_GATEWAY_PASSWORD"), "{err}");
}

/// A client logged in as `url` says, and the errors the server sent it (a permissions violation
/// is one: NATS reports a refused subscription or publish to the client that tried it).
async fn watched_client(
    url: &str,
) -> (
    async_nats::Client,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    let addr: async_nats::ServerAddr = url.parse().expect("url");
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let seen = errors.clone();
    let client = async_nats::ConnectOptions::with_user_and_password(
        addr.username().unwrap_or_default().to_owned(),
        addr.password().unwrap_or_default().to_owned(),
    )
    .event_callback(move |event| {
        let seen = seen.clone();
        async move {
            if let async_nats::Event::ServerError(e) = event {
                seen.lock().expect("errors").push(e.to_string());
            }
        }
    })
    .connect(addr)
    .await
    .expect("connect");
    (client, errors)
}

/// Whether the server refused `client` what it just tried: a permissions violation arrives
/// within a few seconds (it is sent as soon as the server reads the request).
async fn violation(
    client: &async_nats::Client,
    errors: &std::sync::Mutex<Vec<String>>,
    subject: &str,
) -> bool {
    let _ = client.flush().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if errors
            .lock()
            .expect("errors")
            .iter()
            .any(|e| e.contains("Permissions Violation") && e.contains(subject))
        {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `url`'s user may subscribe to `subject` (in `group`): refused subscriptions are
/// reported as permissions violations.
async fn may_subscribe(url: &str, subject: &str, group: Option<&str>) -> bool {
    let (client, errors) = watched_client(url).await;
    let _sub = match group {
        Some(g) => client
            .queue_subscribe(subject.to_owned(), g.to_owned())
            .await
            .expect("subscribe"),
        None => client
            .subscribe(subject.to_owned())
            .await
            .expect("subscribe"),
    };
    !violation(&client, &errors, subject).await
}

/// Whether `url`'s user may publish on `subject`.
async fn may_publish(url: &str, subject: &str) -> bool {
    let (client, errors) = watched_client(url).await;
    let _ = client.publish(subject.to_owned(), "x".into()).await;
    !violation(&client, &errors, subject).await
}

/// Whether a subscriber logged in at `listener` receives what one at `sender` publishes on
/// `subject` (within a few seconds).
async fn delivers(listener: &str, group: Option<&str>, sender: &str, subject: &str) -> bool {
    let listener = delta_e2e::nats_client(listener).await;
    let sender = delta_e2e::nats_client(sender).await;
    let mut sub = match group {
        Some(g) => listener
            .queue_subscribe(subject.to_owned(), g.to_owned())
            .await
            .expect("subscribe"),
        None => listener
            .subscribe(subject.to_owned())
            .await
            .expect("subscribe"),
    };
    listener.flush().await.expect("flush");
    // Published again until it arrives (or 5 s pass): a flush only writes the subscription out,
    // and the server may take the sender's message, on another connection, before it has it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        sender
            .publish(subject.to_owned(), "x".into())
            .await
            .expect("publish");
        sender.flush().await.expect("flush");
        if let Ok(m) = tokio::time::timeout(Duration::from_millis(250), sub.next()).await {
            return m.is_some();
        }
    }
    false
}

/// What each NATS role may and may not do, on a server whose users cover the prefix `delta`.
/// Asserts that `login`'s change of a stream (`change` with `config`, a stream that would capture
/// bots' answers) does not go through, and that NATS refused it by permissions on `subject`.
async fn refused_stream_change<F, Fut, E>(
    login: &str,
    subject: &str,
    change: F,
    config: async_nats::jetstream::stream::Config,
) where
    F: FnOnce(async_nats::jetstream::Context, async_nats::jetstream::stream::Config) -> Fut,
    Fut: std::future::Future<Output = Result<(), E>>,
{
    let (client, errors) = watched_client(login).await;
    let js = async_nats::jetstream::new(client.clone());
    let outcome = tokio::time::timeout(Duration::from_secs(8), change(js, config)).await;
    assert!(
        !matches!(outcome, Ok(Ok(()))),
        "a change of a stream went through ({subject})"
    );
    assert!(
        violation(&client, &errors, subject).await,
        "{subject} was refused by permissions"
    );
}

async fn check_nats_roles(url_as: impl Fn(NatsRole) -> String, anonymous: &str) {
    let refused = delta_e2e::try_nats_client(anonymous, None).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("uthoriz")),
        "a client without a login connected: {:?}",
        refused.map(|_| ())
    );
    let (admin, bot, worker) = (
        url_as(NatsRole::Admin),
        url_as(NatsRole::Bot),
        url_as(NatsRole::Worker),
    );
    // The Slack bridge may create no stream, its bucket's included: NATS checks only a stream's
    // name, so a login that could create the bucket's stream before the bridge does could make
    // it capture bots' answers (their tokens in the headers) and read them back.
    let slack = url_as(NatsRole::Slack);
    refused_stream_change(
        &slack,
        "$JS.API.STREAM.CREATE.KV_DELTA_SLACK",
        |js, config| async move { js.create_stream(config).await.map(|_| ()) },
        async_nats::jetstream::stream::Config {
            name: "KV_DELTA_SLACK".into(),
            subjects: vec!["delta.interactions.respond.*".into()],
            ..Default::default()
        },
    )
    .await;
    // The gateway's and workers' own connections, with their own inboxes, as the programs make
    // them: the gateway creates the streams (and the Slack bridge's bucket), a worker finds them
    // and sets up its consumer.
    let settings = delta_queue::Settings::default();
    let as_gateway = delta_queue::Queue::connect_as(
        &url_as(NatsRole::Gateway),
        "delta",
        &settings,
        delta_queue::Role::Gateway,
    )
    .await
    .expect("a gateway sets up the streams");
    let as_worker = delta_queue::Queue::connect(&url_as(NatsRole::Worker), "delta", &settings)
        .await
        .expect("a worker finds the streams and sets up its consumer");
    let gateway = url_as(NatsRole::Gateway);
    // The bucket the gateway made is the bridge's to use.
    let as_slack = delta_queue::connect_client(
        &slack,
        &settings,
        Some(("delta", delta_queue::access::NatsRole::Slack)),
    )
    .await
    .expect("the bridge's connection, with its inbox");
    let bucket = async_nats::jetstream::new(as_slack)
        .get_key_value("DELTA_SLACK")
        .await
        .expect("the gateway created the Slack bridge's bucket");
    bucket
        .put("r1", "posted".into())
        .await
        .expect("the bridge writes its bucket");
    assert_eq!(
        bucket.get("r1").await.expect("read").as_deref(),
        Some(&b"posted"[..]),
        "the bridge reads its bucket"
    );

    let respond = "delta.interactions.respond.r1";
    // Only the gateway hears answers (and the bearer tokens in their headers).
    assert!(
        delivers(&gateway, Some("delta-gateway"), &bot, respond).await,
        "the gateway hears a bot's answer"
    );
    for (name, listener) in [("a bot", &bot), ("a worker", &worker)] {
        for group in [None, Some("delta-gateway")] {
            assert!(
                !may_subscribe(listener, respond, group).await,
                "{name} (queue group {group:?}) may listen to bots' answers"
            );
        }
    }
    assert!(
        may_subscribe(&admin, respond, None).await,
        "the check itself"
    );
    // Workers cannot answer; bots may.
    assert!(
        !may_publish(&worker, respond).await,
        "a worker may publish an answer"
    );
    assert!(may_publish(&bot, respond).await, "a bot answers");
    // Bots read questions; they cannot make them, nor announce answers or cancellations, nor
    // publish jobs. Neither may a worker publish a job.
    let requested = "delta.interactions.requested.hello.run1";
    assert!(delivers(&bot, None, &worker, requested).await);
    for subject in [
        requested,
        "delta.interactions.resolved.hello.run1",
        "delta.events.cancelled",
        "delta.jobs.hello",
    ] {
        assert!(
            !may_publish(&bot, subject).await,
            "a bot may publish on {subject}"
        );
    }
    assert!(
        !may_publish(&worker, "delta.jobs.hello").await,
        "a worker may publish a job"
    );
    // A gateway announces a question whose worker died before announcing it, as it is answered.
    assert!(
        may_publish(&gateway, requested).await,
        "a gateway announces a question"
    );
    // A worker cannot change what a stream keeps: one that added `respond.*` to a stream could
    // read bots' answers, tokens and all, back from it.
    refused_stream_change(
        &worker,
        "$JS.API.STREAM.UPDATE.DELTA_JOBS",
        |js, config| async move { js.update_stream(config).await.map(|_| ()) },
        async_nats::jetstream::stream::Config {
            name: "DELTA_JOBS".into(),
            subjects: vec!["delta.jobs.>".into(), "delta.interactions.respond.*".into()],
            retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        },
    )
    .await;
    let js_admin = async_nats::jetstream::new(delta_e2e::nats_client(&admin).await);
    let jobs_before = js_admin
        .get_stream("DELTA_JOBS")
        .await
        .expect("jobs")
        .info()
        .await
        .expect("info")
        .state
        .messages;
    let job = delta_protocol::Job::start(delta_protocol::RunId::new());
    as_gateway
        .publish_job("hello", &job, None)
        .await
        .expect("the gateway publishes a job");
    let jobs_after = js_admin
        .get_stream("DELTA_JOBS")
        .await
        .expect("jobs")
        .info()
        .await
        .expect("info")
        .state
        .messages;
    assert_eq!(jobs_after, jobs_before + 1);
    // No fleet role may purge or delete a stream.
    for (name, url) in [
        ("a worker", &worker),
        ("a bot", &bot),
        ("the gateway", &gateway),
    ] {
        let js = async_nats::jetstream::new(delta_e2e::nats_client(url).await);
        let purged = tokio::time::timeout(
            Duration::from_secs(3),
            js.delete_stream("DELTA_INTERACTIONS"),
        )
        .await;
        assert!(
            !matches!(purged, Ok(Ok(_))),
            "{name} deleted the interactions stream"
        );
    }
    drop(as_worker);
}

#[tokio::test(flavor = "multi_thread")]
async fn nats_logins_are_per_role_with_least_subject_permissions() {
    let nats = Nats::start_with(&ServerOptions {
        prefix: Some("delta".into()),
        ..Default::default()
    })
    .expect("nats");
    check_nats_roles(|r| nats.url_as(r), &nats.anonymous_url()).await;
}

/// `nats-server` on `deploy/nats/nats.conf` (with its users.conf), as docker-compose.yml runs it.
fn shipped_nats() -> ShippedServer {
    let dir = tempfile::tempdir().expect("tmp");
    let port = delta_e2e::free_port().expect("port");
    let monitor = delta_e2e::free_port().expect("port");
    let programs = delta_launcher::ServerPrograms::find(Some(&repo())).expect("servers");
    // The shipped files as they are, but for where JetStream stores (a flag may not override a
    // store_dir the file sets).
    let conf = std::fs::read_to_string(repo().join("deploy/nats/nats.conf")).expect("conf");
    assert!(conf.contains("store_dir: /data"), "nats.conf: store_dir");
    let store = format!(
        "store_dir: {:?}",
        dir.path().join("js").display().to_string()
    );
    std::fs::write(
        dir.path().join("nats.conf"),
        conf.replace("store_dir: /data", &store),
    )
    .expect("conf");
    std::fs::copy(
        repo().join("deploy/nats/users.conf"),
        dir.path().join("users.conf"),
    )
    .expect("users");
    let mut cmd = Command::new(&programs.nats);
    cmd.arg("-c")
        .arg(dir.path().join("nats.conf"))
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .args(["-m", &monitor.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for role in NatsRole::ALL {
        cmd.env(
            format!("DELTA_NATS_{}_PASSWORD", role.name().to_uppercase()),
            password_of(role.name()),
        );
    }
    let child = cmd.spawn().expect("nats-server");
    wait_port(port);
    ShippedServer {
        child,
        port,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shipped_nats_users_are_the_queues_and_hold_on_a_real_server() {
    let shipped = std::fs::read_to_string(repo().join("deploy/nats/users.conf")).expect("users");
    let body: String = shipped
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let expected = authorization(&Scope::Prefix("delta".into()), |r| {
        format!("$DELTA_NATS_{}_PASSWORD", r.name().to_uppercase())
    });
    assert_eq!(
        body, expected,
        "deploy/nats/users.conf differs from what delta_queue::access gives"
    );
    let server = shipped_nats();
    let url = |r: NatsRole| {
        format!(
            "nats://delta-{}:{}@127.0.0.1:{}",
            r.name(),
            password_of(r.name()),
            server.port
        )
    };
    // JetStream is up once a login can reach its API.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = delta_e2e::nats_client(&url(NatsRole::Admin)).await;
        if async_nats::jetstream::new(c).query_account().await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "JetStream never came up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    check_nats_roles(url, &format!("nats://127.0.0.1:{}", server.port)).await;
}

/// A whole fleet over TLS: Redis and NATS serve TLS only, with certificates made here; the
/// gateway and worker trust the test's CA and a run goes through. Plain connections and clients
/// that do not trust the CA are refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_fleet_runs_over_tls_to_redis_and_nats() {
    let dir = tempfile::tempdir().expect("tmp");
    let certs = TestCertificates::make(dir.path());
    let options = ServerOptions {
        tls: Some(certs.server()),
        ..Default::default()
    };
    let redis = Redis::start_with(&options).expect("redis over TLS");
    let nats = Nats::start_with(&options).expect("nats over TLS");
    assert!(redis.url().starts_with("rediss://") && nats.url().starts_with("tls://"));

    // Refused: plain text, and TLS without trusting the test's CA.
    let plain = format!("redis://{}", redis.url().split_once("://").expect("url").1);
    assert!(redis_try(&plain, &["PING"]).await.is_err());
    let untrusted = delta_store::redis::RedisRunStore::connect(&redis.url(), "tls").await;
    let untrusted = match untrusted {
        Ok(store) => delta_store::RunStore::load(&store, delta_protocol::RunId::new())
            .await
            .map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(
        matches!(untrusted, Err(delta_store::Error::Backend(_))),
        "a client without the CA reached Redis: {untrusted:?}"
    );
    let plain_nats = format!("nats://{}", nats.url().split_once("://").expect("url").1);
    assert!(delta_e2e::try_nats_client(&plain_nats, None).await.is_err());
    assert!(
        delta_e2e::try_nats_client(&nats.url(), None).await.is_err(),
        "a NATS client without the CA connected"
    );

    let mut fleet = Fleet::start_on(redis, nats, Some(certs.ca.clone()), "tls", 1, 0, |_| {}).await;
    fleet.add_worker("w0");
    let run = fleet.submit("hello", "over TLS").await;
    let rid = fleet.pending(run).await;
    let (status, body) = fleet.answer(&rid, json!({"input": "Ada"})).await;
    assert_eq!(status, 200, "{body}");
    fleet.wait_status(run, RunStatus::Completed).await;
}

/// Finding 7: a write that precedes an irreversible step is on disk before the fleet goes on.
/// The launcher's Redis (`delta dev`, `delta bench`, every test) and the compose file's fsync
/// every write before answering it, which is what the default `DELTA_REDIS_DURABILITY`
/// (`fsync-always`) relies on; before the fix they fsynced once a second.
#[tokio::test]
async fn redis_fsyncs_every_write_where_the_fleet_relies_on_it() {
    let redis = Redis::start().expect("redis");
    let reply = redis_try(&redis.url(), &["CONFIG", "GET", "appendfsync"])
        .await
        .expect("config");
    assert_eq!(
        reply,
        redis::Value::Array(vec![
            redis::Value::BulkString(b"appendfsync".to_vec()),
            redis::Value::BulkString(b"always".to_vec()),
        ]),
        "the launcher's Redis"
    );
    let compose = std::fs::read_to_string(repo().join("docker-compose.yml")).expect("compose");
    assert!(
        compose.contains("      - --appendfsync\n      - always\n"),
        "docker-compose.yml runs Redis with appendfsync always"
    );
    assert!(
        !compose.contains("DELTA_REDIS_DURABILITY:"),
        "docker-compose.yml keeps the default durability, which its Redis matches"
    );
}

/// `DELTA_REDIS_DURABILITY=waitaof` waits for Redis's AOF after an irreversible step's write;
/// a Redis that cannot (before 7.2) is refused when the store is opened, with what to do.
#[tokio::test]
async fn waitaof_durability_works_where_redis_has_it_and_is_refused_where_not() {
    let redis = Redis::start().expect("redis");
    let info = redis_try(&redis.url(), &["INFO", "server"])
        .await
        .expect("info");
    let text = match info {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO: {other:?}"),
    };
    let version: Vec<u32> = text
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .expect("redis_version")
        .trim()
        .split('.')
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    let has_waitaof = version.as_slice() >= [7, 2].as_slice();
    let store = delta_store::redis::RedisRunStore::connect(&redis.url_as(RedisRole::Worker), "d")
        .await
        .expect("store");
    let waitaof = delta_store::redis::Durability::parse("waitaof").expect("parse");
    match store.with_durability(waitaof).await {
        Ok(store) => {
            assert!(
                has_waitaof,
                "Redis {version:?} has no WAITAOF, yet it was accepted"
            );
            delta_store::RunStore::sync(&store, delta_protocol::RunId::new())
                .await
                .expect("WAITAOF confirms the AOF");
        }
        Err(e) => {
            assert!(!has_waitaof, "Redis {version:?} has WAITAOF, yet: {e}");
            let text = format!("{e}: {:?}", std::error::Error::source(&e));
            assert!(
                text.contains("Redis 7.2") && text.contains("fsync-always"),
                "the refusal says what to do: {text}"
            );
        }
    }
    assert!(delta_store::redis::Durability::parse("sometimes").is_err());
    // A Redis without a replica cannot keep `replica` durability: refused at the start.
    let store = delta_store::redis::RedisRunStore::connect(&redis.url_as(RedisRole::Worker), "d")
        .await
        .expect("store");
    let replica = delta_store::redis::Durability::parse("replica").expect("parse");
    let refused = store.with_durability(replica).await.err().expect("refused");
    let text = format!("{refused}: {:?}", std::error::Error::source(&refused));
    assert!(
        text.contains("no replica") && text.contains("fsync-always"),
        "the refusal says what to do: {text}"
    );
}
