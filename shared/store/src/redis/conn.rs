//! One Redis or a Redis Cluster, behind one connection type (docs/operations.md#redis-cluster).
//!
//! [`Conn`] is what every store method sends its commands on: a [`ConnectionManager`] to one
//! Redis, or the redis crate's cluster connection, which routes each command to the master of
//! its key's slot and follows `MOVED`/`ASK`, failovers and reconnects by itself. Each state
//! change is one script on one slot (the bucket layout, `redis.rs`), so the cluster connection
//! routes it as it is. What differs between the two:
//!
//! - A pipeline whose commands are in several slots (the listings, one command per bucket) is
//!   sent as one request per command, all at once: the cluster connection sends each to its
//!   slot's master, and the replies come back in the pipeline's order. A pipeline within one
//!   slot goes as one request, in order, as on one Redis.
//! - A command without a key that concerns every master (`INFO`, `PING`, `WAIT` probes) is
//!   sent to each master ([`Conn::on_masters`]).
//! - A blocking read gets a cluster connection of its own, without a response timeout
//!   ([`Client::dedicated`]).

use std::path::Path;
use std::time::Duration;

use futures_util::future::try_join_all;
use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
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
    Cluster(ClusterConnection),
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
            Client::Cluster(c) => Conn::Cluster(c.shared.get_async_connection().await?),
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
            Client::Cluster(c) => Conn::Cluster(c.blocking.get_async_connection().await?),
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
                match c.route_command(cmd.clone(), routing).await? {
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
                c.route_command(
                    cmd.clone(),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
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
            Conn::Cluster(c) => c.req_packed_command(cmd),
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
                match c.req_packed_commands(pipeline, offset, count).await {
                    // The crate refuses a pipeline over several slots before sending anything:
                    // each command then goes on its own, all at once, replies in order.
                    Err(e)
                        if e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot)
                            && !pipeline.is_transaction() =>
                    {
                        let c = c.clone();
                        try_join_all(pipeline.cmd_iter().map(|cmd| {
                            let mut c = c.clone();
                            async move { c.req_packed_command(cmd).await }
                        }))
                        .await
                    }
                    other => other,
                }
            }),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}
