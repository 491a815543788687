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
Operator commands (submit, runs, pending, answer, cancel, queue, dlq, grants) talk to a gateway:
DELTA_GATEWAY_URL or --gateway-url (default http://127.0.0.1:8080), DELTA_TOKEN or --token,
DELTA_GATEWAY_CA or --gateway-ca (a PEM CA to trust for an https:// gateway).
--json prints the gateway's JSON as is.

Exit codes of the operator commands:
  0  ok
  1  refused by the gateway (any 4xx but not_found): `error: <code>: <message>`
  2  usage (bad flags or arguments)
  4  not found (no such run or request)
  5  gateway unreachable (no connection, timeout, or 5xx `unavailable`)
`delta run` has its own exit codes (delta run --help)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run an agent on a task here, or resume the latest run (exit 0 completed, 1 failed,
    /// 2 usage, 3 cancelled, 101 waiting for input, 130 interrupted).
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
    let rt = delta_host::runtime();
    let telemetry = delta_host::init_logging("warn", "delta", &rt);
    let code = rt.block_on(async {
        let cancel = CancellationToken::new();
        watch_signals(cancel.clone());
        match cli.command {
            Command::Run(args) => run::run(args, cancel).await,
            Command::Init(args) => init::run(args),
            Command::Dev(args) => dev::run(args, cancel).await,
            Command::Bench(cmd) => bench::run(cmd, cancel).await,
            Command::MigrateRedis(args) => migrate::run(args).await,
            Command::Slack(args) => slack::run(args, cancel).await,
            Command::Ops(cmd) => ops::run(cmd, cancel).await,
        }
    });
    // Do not wait for a blocked stdin reader (an abandoned `-i` prompt).
    drop(telemetry);
    rt.shutdown_background();
    std::process::exit(code);
}
/// SIGINT, SIGTERM and SIGHUP (the terminal closed) cancel the token (a run checkpoints as
/// INTERRUPTED, `delta dev` stops its fleet in order); a second one exits now, killing whatever
/// `delta dev` or `delta bench` started.
fn watch_signals(cancel: CancellationToken) {
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
                std::process::exit(130);
            }
        }
    });
}
