//! `delta`: run agents locally (Delta Engine compatible: v1.2's human interaction, v1.10's agent
//! directories) and operate the fleet through its gateway.

/// mimalloc: under load, glibc malloc took about a quarter of a worker's CPU (perf).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

mod bench;
mod client;
mod dev;
mod dotenv;
mod grants;
mod init;
use delta_cli::mailbox;
mod migrate;
mod ops;
mod render;
mod run;
mod show;
mod slack;
mod table;
mod terminal;
mod webhooks;

#[derive(Parser)]
#[command(
    name = "delta",
    version,
    about = "Delta Fleet: AI-agent runs that stop to ask people things",
    after_help = "\
Operator commands (submit, runs, pending, answer, claim, cancel, queue, dlq, grants, delegations,
webhooks) talk to a gateway:
DELTA_GATEWAY_URL or --gateway-url (default http://127.0.0.1:8080), DELTA_TOKEN or --token,
DELTA_GATEWAY_CA or --gateway-ca (a PEM CA to trust for an https:// gateway).
--json prints the gateway's JSON as is.

Exit codes of the operator commands:
  0  ok
  1  refused by the gateway (any 4xx but not_found): `error: <code>: <message>`
  2  usage (bad flags or arguments)
  4  not found (no such run or request)
  5  gateway unreachable (no connection, timeout, or 5xx `unavailable`)
  70 an internal error (a bug), for every command
`delta run` has its own exit codes (delta run --help); docs/cli.md lists every command's."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an agent on a task here, or resume the latest run (exit 0 completed, 1 failed,
    /// 2 usage, 3 cancelled, 74 a file not readable or writable, 101 waiting for input,
    /// 130 interrupted).
    Run(run::RunArgs),
    /// Create an agent directory from a template (this project's example agents):
    /// `delta init my-agent -t openai-tools`.
    Init(init::InitArgs),
    /// The whole fleet on this machine for trying it: servers, a gateway, two workers and demo
    /// runs that ask questions; prints the web inbox URL and CLI commands. Ctrl+C stops it.
    Dev(dev::DevArgs),
    /// Benchmarks against a fleet started on this machine; each prints one JSON line.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Move a fleet's Redis keys to the bucketed layout (docs/operations.md#redis-buckets):
    /// stop the fleet first; safe to run again.
    MigrateRedis(migrate::MigrateArgs),
    /// The Slack bridge: posts questions to Slack, answers from its buttons and forms through
    /// the gateway, keeps every message up to date (docs/slack.md).
    Slack(slack::SlackArgs),
    #[command(flatten)]
    Ops(ops::Command),
}

fn main() {
    let cli = Cli::parse();
    let terminal = Terminal::save();
    let rt = delta_host::runtime();
    let telemetry = delta_host::init_logging("warn", "delta", &rt);
    // A panic is a bug, never an outcome: without this it would exit 101, which `delta run`
    // means as "waiting for input" (scripts would read a crash as a pause).
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(main_task(cli, terminal.clone()))
    }))
    .unwrap_or_else(|_| {
        eprintln!("error: delta stopped on an internal error (a bug; the message is above): exit {EXIT_BUG}");
        delta_launcher::process::kill_all_now();
        EXIT_BUG
    });
    // Do not wait for a blocked stdin reader (an abandoned `-i` prompt).
    drop(telemetry);
    rt.shutdown_background();
    terminal.restore();
    std::process::exit(code);
}

/// The terminal's settings when `delta` started (stdin a terminal), put back on the way out: a
/// prompt without echo abandoned by Ctrl+C (its reading thread left blocked) would otherwise
/// leave the shell without echo.
#[derive(Clone)]
struct Terminal(Option<nix::sys::termios::Termios>);

impl Terminal {
    fn save() -> Self {
        use std::io::IsTerminal;
        let stdin = std::io::stdin();
        Terminal(if stdin.is_terminal() {
            nix::sys::termios::tcgetattr(&stdin).ok()
        } else {
            None
        })
    }

    /// Only when something changed them: setting a terminal's attributes from a background
    /// process group (`delta … &`) would stop the process (SIGTTOU); reading them would not.
    fn restore(&self) {
        let Some(saved) = &self.0 else { return };
        let stdin = std::io::stdin();
        if nix::sys::termios::tcgetattr(&stdin).is_ok_and(|now| now != *saved) {
            let _ = nix::sys::termios::tcsetattr(&stdin, nix::sys::termios::SetArg::TCSANOW, saved);
        }
    }
}

/// The exit code of a panic (`EX_SOFTWARE`): not 101, `delta run`'s "waiting for input".
const EXIT_BUG: i32 = 70;

async fn main_task(cli: Cli, terminal: Terminal) -> i32 {
    let cancel = CancellationToken::new();
    watch_signals(cancel.clone(), terminal);
    match cli.command {
        Command::Run(args) => run::run(args, cancel).await,
        Command::Init(args) => init::run(args),
        Command::Dev(args) => dev::run(args, cancel).await,
        Command::Bench(cmd) => bench::run(cmd, cancel).await,
        Command::MigrateRedis(args) => migrate::run(args, cancel).await,
        Command::Slack(args) => slack::run(args, cancel).await,
        Command::Ops(cmd) => ops::run(cmd, cancel).await,
    }
}

/// SIGINT, SIGTERM and SIGHUP (the terminal closed) cancel the token (a run checkpoints as
/// INTERRUPTED, `delta dev` stops its fleet in order); a second one exits now, killing whatever
/// `delta dev` or `delta bench` started.
fn watch_signals(cancel: CancellationToken, terminal: Terminal) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        eprintln!("warning: cannot watch SIGINT/SIGTERM; Ctrl+C will not checkpoint the run");
        return;
    };
    tokio::spawn(async move {
        for round in 0..2 {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
            }
            if round == 0 {
                cancel.cancel();
            } else {
                eprintln!("second signal: exiting without waiting");
                delta_launcher::process::kill_all_now();
                terminal.restore();
                std::process::exit(130);
            }
        }
    });
}
