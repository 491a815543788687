//! `delta`: run agents locally (Delta Engine v1.2 compatible) and, later, operate the fleet.

use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

mod mailbox;
mod render;
mod run;
mod terminal;

#[derive(Parser)]
#[command(
    name = "delta",
    version,
    about = "Delta Fleet: AI-agent runs that stop to ask people things"
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
}

fn main() {
    let cli = Cli::parse();
    let rt = delta_worker::host::runtime();
    let telemetry = delta_worker::host::init_logging("warn", "delta", &rt);
    let code = rt.block_on(async {
        let cancel = CancellationToken::new();
        watch_signals(cancel.clone());
        match cli.command {
            Command::Run(args) => run::run(args, cancel).await,
        }
    });
    // Do not wait for a blocked stdin reader (an abandoned `-i` prompt).
    drop(telemetry);
    rt.shutdown_background();
    std::process::exit(code);
}

/// SIGINT/SIGTERM cancel the token (the run checkpoints as INTERRUPTED); a second one exits now.
fn watch_signals(cancel: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("warning: cannot watch SIGINT/SIGTERM; Ctrl+C will not checkpoint the run");
        return;
    };
    tokio::spawn(async move {
        for round in 0..2 {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            if round == 0 {
                cancel.cancel();
            } else {
                eprintln!("second signal: exiting without waiting");
                std::process::exit(130);
            }
        }
    });
}
