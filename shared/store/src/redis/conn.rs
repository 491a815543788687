//! One Redis or a Redis Cluster, behind one connection type (docs/operations.md#redis-cluster).
//!
//! [`Conn`] is what every store method sends its commands on: a [`ConnectionManager`] to one
//! Redis, or the redis crate's cluster connection, which routes each command to the master of
//! its key's slot and follows `MOVED`/`ASK`, failovers and reconnects by itself. Each state
//! change is one script on one slot (the bucket layout, `redis.rs`), so the cluster connection
//! routes it as it is. What differs between the two:
//!
//! - A pipeline whose commands are in several slots (the listings, one command per bucket) is
//!   sent as one request per command, 32 at a time: the cluster connection sends each to its
//!   slot's master, and the replies come back in the pipeline's order. A pipeline within one
//!   slot goes as one request, in order, as on one Redis.
//! - A command without a key that concerns every master (`INFO`, `PING`, `WAIT` probes) is
//!   sent to each master ([`Conn::on_masters`]).
//! - A blocking read gets a cluster connection of its own, without a response timeout
//!   ([`Client::dedicated`]).
//! - A cluster connection that stops routing commands (one timed out, or nothing came back for
//!   a while and no master answers a `PING` through it) is replaced by a new one
//!   ([`ClusterConn`]): the redis crate's connection can get stuck for good after a failover
//!   (see there).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt, stream};
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value};

use crate::Error;

/// How long a command may wait for its reply: on a cluster, before the client gives up on that
/// node, looks at the cluster's slots again and retries (a master that stopped answering). The
/// durability waits (`WAIT`, `WAITAOF`) are shorter, so that they report a slow replica or disk
/// themselves.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a command may take on a cluster with its retries: a failover (node timeout plus
/// election) must fit in it.
const CLUSTER_OVERALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the store's Redis is: one server, or a cluster reached through seed nodes.
#[derive(Clone)]
pub enum Client {
    One(Box<redis::Client>),
    Cluster(Box<Clustered>),
}

/// The clients of a Redis Cluster.
#[derive(Clone)]
pub struct Clustered {
    /// For the shared connection: commands time out, so a stopped master is noticed.
    shared: ClusterClient,
    /// For blocking reads: no response timeout.
    blocking: ClusterClient,
}

/// A connection to one Redis or to a Redis Cluster; cheap to clone (both multiplex).
#[derive(Clone)]
pub enum Conn {
    One(ConnectionManager),
    /// One Redis, a connection of its own (for blocking reads).
    Plain(MultiplexedConnection),
    Cluster(ClusterConn),
}

/// How long making a new cluster connection may take (seeds, then the slots).
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a cluster connection may give nothing back while commands wait on it before it is
/// taken for stuck. Longer than a command takes when all is well (a `WAIT` is 1 s, a node's
/// reply at most [`RESPONSE_TIMEOUT`]); a connection replaced for nothing costs a new one.
const STALL: Duration = Duration::from_secs(5);

/// How often a waiting command looks whether its connection is stuck.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// How many commands of a pipeline split over slots are under way at once (a status read of
/// 400 runs is 400 commands): more than the buckets of a listing, few enough not to flood the
/// cluster connection's task, whose refresh can get stuck behind a burst (see [`ClusterConn`]).
const SPLIT_AT_ONCE: usize = 32;

/// The redis crate's cluster connection, replaced by a new one when it stops routing commands
/// (nothing came back through it for [`STALL`] while commands waited, and no master answers a
/// `PING` through it), or when a command timed out (the overall timeout, or every retry).
///
/// Why: that connection is one task that routes every command, and it can stop for good. While
/// it refreshes its view of the slots (after a `MOVED`, as at a failover) it polls nothing but
/// the refresh, which needs the write lock of its map of connections. A command already under
/// way, or the repair of a connection that dropped, can hold a permit of that lock unawares:
/// tokio's semaphore grants the permits and only then, when the task's cooperative budget is
/// spent, returns `Pending` (a burst spends it: a status read of many runs is one command per
/// run, and a master that wakes up answers every command queued while it was frozen at once).
/// That future is not polled again until the refresh ends, and the refresh waits for its
/// permit, so every later command times out, for good (redis 1.8.1, tokio 1.54; the chaos
/// suite's SIGSTOP of a master, scenario 9, showed it, in the gateway and in the test's own
/// store). A new connection has its own task and map; once the last command on the stuck one
/// has timed out, the crate aborts its task and closes its sockets. A master that stopped
/// answering (frozen) makes its commands wait too, but the other masters answer the `PING`:
/// those commands go on waiting, within the overall timeout, as before.
#[derive(Clone)]
pub struct ClusterConn(Arc<ClusterState>);

/// What the clones of a [`ClusterConn`] share.
struct ClusterState {
    /// To make a new connection.
    client: ClusterClient,
    /// The connection in use, and how many were made before it.
    current: Mutex<(u64, ClusterConnection)>,
    /// Held while a new connection is made, so that commands failing together make one.
    replacing: tokio::sync::Mutex<()>,
    /// Whether a stall replaces the connection: not for blocking reads, which wait on purpose.
    watched: bool,
    /// When a reply last came back (ms since `epoch`), or the connection was made.
    last_reply_ms: AtomicU64,
    epoch: Instant,
}

impl ClusterConn {
    async fn new(client: &ClusterClient, watched: bool) -> Result<Self, redis::RedisError> {
        let conn = client.get_async_connection().await?;
        Ok(Self(Arc::new(ClusterState {
            client: client.clone(),
            current: Mutex::new((0, conn)),
            replacing: tokio::sync::Mutex::new(()),
            watched,
            last_reply_ms: AtomicU64::new(0),
            epoch: Instant::now(),
        })))
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.0.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Awaits `command`, sent on connection `generation`, and passes its reply on. Replaces
    /// that connection when the command timed out, or when it stalls meanwhile (nothing came
    /// back through it for [`STALL`]) and turns out to route nothing any more: the command is
    /// then given up with a timeout error, as the overall timeout would give it up later.
    async fn watch<T>(
        &self,
        generation: u64,
        command: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        let started = self.now_ms();
        let mut command = std::pin::pin!(command);
        let reply = loop {
            match tokio::time::timeout(WATCH_EVERY, &mut command).await {
                Ok(reply) => break reply,
                Err(_) => {
                    // Quiet since this command was sent, or since the last reply after that.
                    let since = started.max(self.0.last_reply_ms.load(Ordering::Relaxed));
                    let quiet = self.now_ms().saturating_sub(since);
                    // Replaced because it stopped routing: given up here, as the overall
                    // timeout would give it up later, so that the caller tries again on the new
                    // connection now rather than in 20 s.
                    if self.0.watched
                        && u128::from(quiet) > STALL.as_millis()
                        && self.unstick(generation).await
                    {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the Redis Cluster connection stopped routing commands and was replaced",
                        )
                        .into());
                    }
                }
            }
        };
        match &reply {
            Err(e) if e.is_timeout() => self.replace(generation, "a command timed out").await,
            _ => self.0.last_reply_ms.store(self.now_ms(), Ordering::Relaxed),
        }
        reply
    }

    /// After a stall of connection `generation`: whether it was replaced because it stopped
    /// routing commands. It is asked to `PING` every master; if none answers in time, its
    /// task is stuck (a master that is only frozen leaves the others to answer) and a new
    /// connection takes its place. If one answers, commands just wait for a node: they go on
    /// waiting (the overall timeout still bounds them).
    async fn unstick(&self, generation: u64) -> bool {
        let _one_at_a_time = self.0.replacing.lock().await;
        let (now, mut conn) = self.current();
        if now != generation {
            return true;
        }
        let ping = redis::cmd("PING");
        let any_master = RoutingInfo::MultiNode((
            MultipleNodeRoutingInfo::AllMasters,
            Some(ResponsePolicy::OneSucceeded),
        ));
        // Twice a node's timeout: a slot refresh under way may first wait for a frozen node.
        let routes =
            tokio::time::timeout(2 * RESPONSE_TIMEOUT, conn.route_command(ping, any_master))
                .await
                .is_ok();
        if routes {
            self.0.last_reply_ms.store(self.now_ms(), Ordering::Relaxed);
            return false;
        }
        self.connect_anew(generation, "it stopped routing commands")
            .await
    }

    /// The connection in use and its generation.
    fn current(&self) -> (u64, ClusterConnection) {
        let guard = self.0.current.lock().unwrap_or_else(|p| p.into_inner());
        (guard.0, guard.1.clone())
    }

    /// Makes a new connection in place of `generation`, after a command on it timed out, unless
    /// that one was replaced already.
    async fn replace(&self, generation: u64, why: &str) {
        let _one_at_a_time = self.0.replacing.lock().await;
        if self.current().0 != generation {
            return;
        }
        self.connect_anew(generation, why).await;
    }

    /// Puts a new connection in place of `generation` (stuck because of `why`); whether it did.
    /// Should it fail, the old one stays (the next stall or timeout tries again). The caller
    /// holds `replacing`.
    async fn connect_anew(&self, generation: u64, why: &str) -> bool {
        tracing::warn!(
            why,
            "replacing the Redis Cluster connection: a master stopped answering, or the connection stopped routing"
        );
        match tokio::time::timeout(RECONNECT_TIMEOUT, self.0.client.get_async_connection()).await {
            Ok(Ok(conn)) => {
                *self.0.current.lock().unwrap_or_else(|p| p.into_inner()) = (generation + 1, conn);
                self.0.last_reply_ms.store(self.now_ms(), Ordering::Relaxed);
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "no new Redis Cluster connection yet; keeping the old one");
                false
            }
            Err(_) => {
                tracing::warn!(
                    "no new Redis Cluster connection within {RECONNECT_TIMEOUT:?}; keeping the old one"
                );
                false
            }
        }
    }
}

/// The error for a bad `DELTA_REDIS_URL` (never quoting it: it can hold a password).
fn bad_url(url: &str) -> Error {
    Error::Backend(
        format!(
            "DELTA_REDIS_URL is not a Redis URL ({}): write redis://[user:password@]host:port, or rediss:// for TLS",
            delta_protocol::without_credentials(url)
        )
        .into(),
    )
}

/// The PEM certificates in `ca_file`, for a `rediss://` URL (refused for a plain one).
fn root_cert(url: &str, ca_file: &Path) -> Result<Vec<u8>, Error> {
    if !url.starts_with("rediss://") {
        return Err(Error::Backend(
            format!(
                "a CA file ({}) is given but the Redis URL is not rediss://: use rediss:// to connect with TLS",
                ca_file.display()
            )
            .into(),
        ));
    }
    std::fs::read(ca_file).map_err(|e| {
        Error::Backend(format!("cannot read the CA file {}: {e}", ca_file.display()).into())
    })
}

impl Client {
    /// A client for `urls` (comma-separated): one Redis, or with `cluster` a Redis Cluster
    /// whose nodes the URLs name (seeds: one is enough, the client learns the others). With a
    /// `ca_file`, the servers' certificates are checked against it (`rediss://` only).
    pub fn open(urls: &str, cluster: bool, ca_file: Option<&Path>) -> Result<Client, Error> {
        let seeds: Vec<&str> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect();
        if !cluster {
            let [url] = seeds[..] else {
                return Err(Error::Backend(
                    format!(
                        "DELTA_REDIS_URL lists {} Redis URLs: several are seed nodes of a Redis Cluster, so set DELTA_REDIS_CLUSTER=1 (or give one URL for one Redis)",
                        seeds.len()
                    )
                    .into(),
                ));
            };
            return match ca_file {
                None => redis::Client::open(url).map_err(|_| bad_url(url)),
                Some(ca) => redis::Client::build_with_tls(
                    url,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(root_cert(url, ca)?),
                    },
                )
                .map_err(|_| bad_url(url)),
            }
            .map(|c| Client::One(Box::new(c)));
        }
        let Some(first) = seeds.first() else {
            return Err(bad_url(urls));
        };
        // Each URL alone first, so that a bad one is named (without its password).
        for url in &seeds {
            redis::Client::open(*url).map_err(|_| bad_url(url))?;
        }
        let builder = |timeout: Option<Duration>| -> Result<ClusterClient, Error> {
            let mut b = ClusterClientBuilder::new(seeds.clone())
                .connection_timeout(Duration::from_secs(2))
                .retries(12)
                .min_retry_wait(50)
                .max_retry_wait(1_000);
            b = match timeout {
                Some(t) => b
                    .response_timeout(t)
                    .overall_response_timeout(Some(CLUSTER_OVERALL_TIMEOUT)),
                None => b.overall_response_timeout(None),
            };
            if let Some(ca) = ca_file {
                b = b.certs(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert(first, ca)?),
                });
            }
            b.build().map_err(|e| {
                Error::Backend(
                    format!(
                        "the Redis Cluster seed URLs do not fit together ({}): every seed must be redis:// or rediss:// with the same user and password",
                        e.detail().unwrap_or("refused")
                    )
                    .into(),
                )
            })
        };
        Ok(Client::Cluster(Box::new(Clustered {
            shared: builder(Some(RESPONSE_TIMEOUT))?,
            blocking: builder(None)?,
        })))
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Client::Cluster(_))
    }

    /// The shared connection: reconnects by itself.
    pub async fn connect(&self) -> Result<Conn, redis::RedisError> {
        Ok(match self {
            Client::One(c) => {
                let config = redis::aio::ConnectionManagerConfig::new()
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_connection_timeout(Some(RESPONSE_TIMEOUT));
                Conn::One(ConnectionManager::new_with_config(c.as_ref().clone(), config).await?)
            }
            Client::Cluster(c) => Conn::Cluster(ClusterConn::new(&c.shared, true).await?),
        })
    }

    /// A connection of its own without a response timeout, for blocking reads.
    pub async fn dedicated(&self) -> Result<Conn, redis::RedisError> {
        Ok(match self {
            Client::One(c) => {
                let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
                Conn::Plain(
                    c.get_multiplexed_async_connection_with_config(&config)
                        .await?,
                )
            }
            Client::Cluster(c) => Conn::Cluster(ClusterConn::new(&c.blocking, false).await?),
        })
    }
}

impl Conn {
    /// `cmd` sent to every master; their replies by node address. On one Redis, its reply.
    pub async fn on_masters(
        &mut self,
        cmd: &Cmd,
    ) -> Result<Vec<(String, Value)>, redis::RedisError> {
        match self {
            Conn::One(c) => Ok(vec![(String::new(), cmd.query_async(c).await?)]),
            Conn::Plain(c) => Ok(vec![(String::new(), cmd.query_async(c).await?)]),
            Conn::Cluster(c) => {
                // No response policy: the crate returns each node's reply under its address.
                let routing = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
                let (generation, mut conn) = c.current();
                let reply = c
                    .watch(generation, conn.route_command(cmd.clone(), routing))
                    .await;
                match reply? {
                    Value::Map(pairs) => Ok(pairs
                        .into_iter()
                        .map(|(k, v)| {
                            let addr = match k {
                                Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
                                Value::SimpleString(s) => s,
                                other => format!("{other:?}"),
                            };
                            (addr, v)
                        })
                        .collect()),
                    other => Ok(vec![(String::new(), other)]),
                }
            }
        }
    }

    /// `cmd` sent to the master that holds `key` (on one Redis, to it).
    pub async fn on_master_of(&mut self, key: &str, cmd: &Cmd) -> Result<Value, redis::RedisError> {
        match self {
            Conn::One(c) => cmd.query_async(c).await,
            Conn::Plain(c) => cmd.query_async(c).await,
            Conn::Cluster(c) => {
                let route = Route::with_key(key.as_bytes(), SlotAddr::Master);
                let (generation, mut conn) = c.current();
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                c.watch(generation, conn.route_command(cmd.clone(), routing))
                    .await
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::One(c) => c.req_packed_command(cmd),
            Conn::Plain(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => Box::pin(async move {
                let (generation, mut conn) = c.current();
                c.watch(generation, conn.req_packed_command(cmd)).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::One(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Plain(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => Box::pin(async move {
                let (generation, mut conn) = c.current();
                let sent = async {
                    match conn.req_packed_commands(pipeline, offset, count).await {
                        // The crate refuses a pipeline over several slots before sending anything:
                        // each command then goes on its own, [`SPLIT_AT_ONCE`] at a time, replies
                        // in order.
                        Err(e)
                            if e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot)
                                && !pipeline.is_transaction() =>
                        {
                            let calls: Vec<_> = pipeline
                                .cmd_iter()
                                .map(|cmd| {
                                    let mut conn = conn.clone();
                                    async move { conn.req_packed_command(cmd).await }
                                })
                                .collect();
                            stream::iter(calls)
                                .buffered(SPLIT_AT_ONCE)
                                .try_collect()
                                .await
                        }
                        other => other,
                    }
                };
                c.watch(generation, sent).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}
