//! The operator commands: `delta submit`, `runs ls|show|journal`, `pending ls|show`, `answer`,
//! `cancel`, `queue`. Each is one or a few calls to the gateway's HTTP API (docs/protocol.md §6).
//!
//! Replies are read as the API's types (`delta-api`). Output: tables and relative times for
//! people on stdout (hints and spinners on stderr); `--json` prints the gateway's JSON as is, one
//! document per command (with `--follow`, one JSON event per line; a journal read in pages, or
//! questions filtered here with `--older-than`, is one document made of the pages' typed bodies). Exit codes: [`EXIT_OK`], [`EXIT_REFUSED`], 2 (usage, clap's or ours),
//! [`EXIT_NOT_FOUND`], [`EXIT_UNREACHABLE`]; 130 when interrupted during a wait.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use delta_api::{
    AnswerAccepted, AnswerBody, AnswerStatus, CancelBody, CancelResult, ClaimBody, ClaimState,
    ClaimedResponder, DeadLetterDropped, DeadLetterPage, DeadLetterRetried, Delegation,
    DelegationBody, DelegationPage, DlqQuery, ErrorCode, InteractionPage, InteractionState,
    InteractionView, InteractionsQuery, Journal, JournalEvent, JournalQuery, QueueStats,
    RunAccepted, RunDetail, RunEnded, RunPage, RunStatus, RunsQuery, Submission, Via, sse,
};
use delta_protocol::{RequestId, RunId};

use crate::client::{self, Client, Reply};
use crate::mailbox::find_option;
use crate::show;
use crate::table::parse_duration;

pub const EXIT_OK: i32 = 0;
/// The gateway refused: any 4xx other than `not_found`.
pub const EXIT_REFUSED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
/// No such run, request or endpoint.
pub const EXIT_NOT_FOUND: i32 = 4;
/// No connection, a timeout, or a 5xx (`unavailable`).
pub const EXIT_UNREACHABLE: i32 = 5;
/// Ctrl+C during `--wait` or `--follow`.
pub const EXIT_INTERRUPTED: i32 = 130;

const RUN_STATUSES: [&str; 7] = [
    "QUEUED",
    "RUNNING",
    "WAITING_FOR_INPUT",
    "INTERRUPTED",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
];
const INTERACTION_TYPES: [&str; 6] = [
    "TOOL_APPROVAL",
    "MISSING_INFO",
    "USER_CONFIRMATION",
    "USER_CHOICE",
    "USER_INPUT",
    "CUSTOM",
];

/// Where the gateway is, who is calling, and how to print: on every operator command.
#[derive(Debug, Clone, clap::Args)]
pub struct Remote {
    /// The gateway's URL.
    #[arg(
        long,
        env = "DELTA_GATEWAY_URL",
        default_value = "http://127.0.0.1:8080",
        value_name = "URL"
    )]
    pub gateway_url: String,
    /// Bearer token for a gateway with authentication on (prefer DELTA_TOKEN: `ps` shows flags).
    #[arg(
        long,
        env = "DELTA_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// A CA certificate (PEM) to trust for an https:// gateway, besides the system's roots (a
    /// gateway with a certificate of your own CA: DELTA_GATEWAY_TLS_CERT).
    #[arg(long, env = "DELTA_GATEWAY_CA", value_name = "FILE")]
    pub gateway_ca: Option<std::path::PathBuf>,
    /// Print the gateway's JSON as is: one document (`--follow`: one JSON event per line).
    #[arg(long)]
    pub json: bool,
}

/// The operator commands (they go through a gateway).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Submit a run to the fleet; prints its id (and, with --wait, where it paused or ended).
    Submit(SubmitArgs),
    /// Runs in the fleet: list, show one, read or follow its journal.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Questions waiting for a person: list them, show one.
    #[command(subcommand)]
    Pending(PendingCommand),
    /// Answer a pending question (asks for a sensitive answer without echoing it); on a
    /// question that needs several approvals, cast your vote.
    Answer(AnswerArgs),
    /// Claim a pending question (others' answers are refused while you hold it), renew your
    /// claim, or give it back (--release; an operator's --release breaks anyone's).
    Claim(ClaimArgs),
    /// Let someone answer what you may while you are away: add, list, remove delegations.
    #[command(subcommand)]
    Delegations(DelegationsCommand),
    /// Cancel a run that has not ended (its pending question is closed).
    Cancel(CancelArgs),
    /// The job queue: jobs pending, in flight, redelivered, dead-lettered; workers seen.
    Queue(QueueArgs),
    /// Dead-lettered jobs: list them, put their runs back in the queue, or drop them.
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Scoped grants ("always allow" approvals): list them, revoke them.
    #[command(subcommand)]
    Grants(crate::grants::GrantsCommand),
    /// Signed webhooks (operators): subscribe URLs to the fleet's events, list, rotate secrets,
    /// enable, disable, delete.
    #[command(subcommand)]
    Webhooks(crate::webhooks::WebhooksCommand),
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum DlqCommand {
    /// List dead-lettered jobs, oldest first, with why and their runs' status.
    Ls(DlqLsArgs),
    /// Put the runs of dead letters back in the queue (FAILED → QUEUED) once the cause is mended.
    Retry(DlqPickArgs),
    /// Remove dead letters without retrying them.
    Drop(DlqPickArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct DlqLsArgs {
    /// Only this agent's dead letters.
    #[arg(long)]
    pub agent: Option<String>,
    #[command(flatten)]
    pub page: Paging,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DlqPickArgs {
    /// The dead letters' sequence numbers (the SEQ column of `delta dlq ls`).
    #[arg(value_name = "SEQ", required_unless_present = "all", value_parser = clap::value_parser!(u64).range(1..))]
    pub seqs: Vec<u64>,
    /// Every dead letter (retry: every retryable one), of --agent if given.
    #[arg(long, conflicts_with = "seqs")]
    pub all: bool,
    /// With --all: only this agent's dead letters.
    #[arg(long, requires = "all")]
    pub agent: Option<String>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SubmitArgs {
    /// The agent's name (a directory of the fleet's agents directory).
    #[arg(short, long)]
    pub agent: String,
    /// What the agent should do.
    #[arg(short, long)]
    pub task: String,
    /// Structured input for the run, as JSON.
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    pub input: Option<Value>,
    /// Submitting again with the same key returns the same run instead of starting another.
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Wait (spinner on stderr) until the run pauses for a question or ends, then show it.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum RunsCommand {
    /// List runs, newest first.
    Ls(RunsLsArgs),
    /// Show a run and its pending question.
    Show(RunArg),
    /// A run's journal, one line per event; --follow streams it live until the run ends.
    Journal(JournalArgs),
}

/// The paging flags of every `ls`.
#[derive(Debug, Clone, clap::Args)]
pub struct Paging {
    /// At most this many.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=500))]
    pub limit: u16,
    /// Go on from where an earlier listing stopped (its `next_cursor`).
    #[arg(long)]
    pub cursor: Option<String>,
}

impl Paging {
    /// `limit` as the queries take it.
    fn limit(&self) -> Option<usize> {
        Some(usize::from(self.limit))
    }
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunsLsArgs {
    /// Only runs with this status.
    #[arg(long, ignore_case = true, value_parser = clap::builder::PossibleValuesParser::new(RUN_STATUSES))]
    pub status: Option<String>,
    /// Only runs of this agent.
    #[arg(long)]
    pub agent: Option<String>,
    #[command(flatten)]
    pub page: Paging,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RunArg {
    pub run_id: RunId,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct JournalArgs {
    pub run_id: RunId,
    /// Stream events live (reconnecting where it left off) and stop when the run ends.
    #[arg(short, long)]
    pub follow: bool,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum PendingCommand {
    /// List pending questions, oldest first.
    Ls(PendingLsArgs),
    /// Show one question as a person would answer it.
    Show(RequestArg),
}

#[derive(Debug, Clone, clap::Args)]
pub struct PendingLsArgs {
    /// Only questions of this agent.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only questions of this type.
    #[arg(long = "type", ignore_case = true, value_parser = clap::builder::PossibleValuesParser::new(INTERACTION_TYPES))]
    pub kind: Option<String>,
    /// Only questions asked at least this long ago: 90s, 5m, 2h, 1d.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub older_than: Option<Duration>,
    #[command(flatten)]
    pub page: Paging,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RequestArg {
    pub request_id: RequestId,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct AnswerArgs {
    pub request_id: RequestId,
    /// The option chosen: its id, label or number (as `delta pending show` lists them).
    #[arg(long, value_name = "ID")]
    pub option: Option<String>,
    /// Free text: the answer, or what an option asks for. Left out for a sensitive question,
    /// it is asked for on the terminal without echo (a flag would show in `ps` and history).
    #[arg(long, value_name = "TEXT")]
    pub input: Option<String>,
    /// Why (e.g. the reason of a rejection).
    #[arg(long, value_name = "TEXT")]
    pub feedback: Option<String>,
    /// Structured data as JSON, e.g. '{"args": {...}}' to edit a tool call's arguments; `-`
    /// reads it from stdin (one line; without echo on a terminal), for a sensitive typed
    /// answer that a flag would show in `ps` and history.
    #[arg(long, value_name = "JSON", value_parser = parse_data)]
    pub data: Option<DataArg>,
    /// With an approval: also approve later calls like this one, in this run (`run`) or in
    /// every run of the agent (`agent`); `data.grant` gives more (docs/protocol.md "Grants").
    #[arg(long, value_name = "SCOPE", value_parser = ["run", "agent"])]
    pub grant: Option<String>,
    /// The question's hash as you read it (`hash:` of `delta pending show`): the answer is
    /// refused (`stale`) if the question is not that one any more. Without it, the version
    /// this command reads just before answering.
    #[arg(long, value_name = "HASH")]
    pub request_hash: Option<String>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum DelegationsCommand {
    /// Until --until, --to may answer (and vote on) what --from may (you, unless you operate).
    Add(DelegationAddArgs),
    /// The delegations in force.
    Ls(RemoteArgs),
    /// End a delegation (yours, one you made, or any for an operator).
    Rm(DelegationRmArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct DelegationAddArgs {
    /// Whose authority (default: yours, the token's name).
    #[arg(long)]
    pub from: Option<String>,
    /// Who may answer in their place.
    #[arg(long)]
    pub to: String,
    /// Until when: a time (RFC 3339, e.g. 2026-12-01T09:00:00Z) or how long from now (8h, 3d).
    #[arg(long, value_parser = parse_until)]
    pub until: delta_protocol::Timestamp,
    /// Why (shown with it).
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DelegationRmArgs {
    /// The delegation's id (`delta delegations ls`).
    #[arg(value_parser = crate::table::path_id)]
    pub id: String,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RemoteArgs {
    #[command(flatten)]
    pub remote: Remote,
}

/// `--until`: an RFC 3339 time, or a duration from now.
fn parse_until(s: &str) -> Result<delta_protocol::Timestamp, String> {
    if let Ok(t) = s.parse::<delta_protocol::Timestamp>() {
        return Ok(t);
    }
    let d = parse_duration(s).map_err(|_| {
        format!("`{s}` is neither a time (2026-12-01T09:00:00Z) nor a duration (8h, 3d)")
    })?;
    let us = i64::try_from(d.as_micros()).map_err(|_| "too far ahead".to_owned())?;
    delta_protocol::Timestamp::from_micros(delta_protocol::Timestamp::now().micros() + us)
        .ok_or_else(|| "too far ahead".to_owned())
}

#[derive(Debug, Clone, clap::Args)]
pub struct ClaimArgs {
    pub request_id: RequestId,
    /// How long the claim lasts (10 to 3600 seconds).
    #[arg(long, value_name = "SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..=3600))]
    pub ttl: u64,
    /// Give your claim back (an operator: break anyone's).
    #[arg(long)]
    pub release: bool,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CancelArgs {
    pub run_id: RunId,
    /// Why: journaled with the cancellation.
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
    #[command(flatten)]
    pub remote: Remote,
}

#[derive(Debug, Clone, clap::Args)]
pub struct QueueArgs {
    #[command(flatten)]
    pub remote: Remote,
}

fn parse_json(s: &str) -> Result<Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

/// `--data`: a JSON document, or `-` for one read from stdin.
#[derive(Debug, Clone)]
pub enum DataArg {
    Json(Value),
    Stdin,
}

fn parse_data(s: &str) -> Result<DataArg, String> {
    if s == "-" {
        return Ok(DataArg::Stdin);
    }
    parse_json(s).map(DataArg::Json)
}

impl Command {
    fn remote(&self) -> &Remote {
        match self {
            Command::Submit(a) => &a.remote,
            Command::Runs(RunsCommand::Ls(a)) => &a.remote,
            Command::Runs(RunsCommand::Show(a)) => &a.remote,
            Command::Runs(RunsCommand::Journal(a)) => &a.remote,
            Command::Pending(PendingCommand::Ls(a)) => &a.remote,
            Command::Pending(PendingCommand::Show(a)) => &a.remote,
            Command::Answer(a) => &a.remote,
            Command::Claim(a) => &a.remote,
            Command::Delegations(DelegationsCommand::Add(a)) => &a.remote,
            Command::Delegations(DelegationsCommand::Ls(a)) => &a.remote,
            Command::Delegations(DelegationsCommand::Rm(a)) => &a.remote,
            Command::Cancel(a) => &a.remote,
            Command::Queue(a) => &a.remote,
            Command::Dlq(DlqCommand::Ls(a)) => &a.remote,
            Command::Dlq(DlqCommand::Retry(a) | DlqCommand::Drop(a)) => &a.remote,
            Command::Grants(g) => g.remote(),
            Command::Webhooks(w) => w.remote(),
        }
    }
}

/// Why a command stopped short.
enum Failure {
    Gateway(client::Error),
    Usage(String),
    Interrupted,
}

impl From<client::Error> for Failure {
    fn from(e: client::Error) -> Self {
        Failure::Gateway(e)
    }
}

type Result<T, E = Failure> = std::result::Result<T, E>;

/// Runs an operator command; returns its exit code. Errors are printed here: `error: …` on
/// stderr and, with `--json`, the error document on stdout.
pub async fn run(cmd: Command, cancel: CancellationToken) -> i32 {
    let remote = cmd.remote().clone();
    let client = match Client::new(
        &remote.gateway_url,
        remote.token.clone(),
        remote.gateway_ca.as_deref(),
    ) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("error: {msg}");
            return EXIT_USAGE;
        }
    };
    if client.has_token() && client.token_in_clear() {
        eprintln!(
            "warning: the token goes to {} over plain HTTP, readable on the network: use an https:// gateway URL (docs/security.md)",
            client.url()
        );
    }
    let json = remote.json;
    let work = async {
        match cmd {
            Command::Submit(a) => submit(&client, a, json, &cancel).await,
            Command::Runs(RunsCommand::Ls(a)) => runs_ls(&client, a, json).await,
            Command::Runs(RunsCommand::Show(a)) => runs_show(&client, a.run_id, json).await,
            Command::Runs(RunsCommand::Journal(a)) if a.follow => {
                follow(&client, a.run_id, json, &cancel).await
            }
            Command::Runs(RunsCommand::Journal(a)) => journal(&client, a.run_id, json).await,
            Command::Pending(PendingCommand::Ls(a)) => pending_ls(&client, a, json).await,
            Command::Pending(PendingCommand::Show(a)) => {
                pending_show(&client, a.request_id, json).await
            }
            Command::Answer(a) => answer(&client, a, json).await,
            Command::Claim(a) => claim(&client, a, json).await,
            Command::Delegations(DelegationsCommand::Add(a)) => {
                delegation_add(&client, a, json).await
            }
            Command::Delegations(DelegationsCommand::Ls(_)) => delegations_ls(&client, json).await,
            Command::Delegations(DelegationsCommand::Rm(a)) => {
                delegation_rm(&client, a, json).await
            }
            Command::Cancel(a) => cancel_run(&client, a, json).await,
            Command::Queue(_) => queue(&client, json).await,
            Command::Dlq(DlqCommand::Ls(a)) => dlq_ls(&client, a, json).await,
            Command::Dlq(DlqCommand::Retry(a)) => dlq_pick(&client, a, Pick::Retry, json).await,
            Command::Dlq(DlqCommand::Drop(a)) => dlq_pick(&client, a, Pick::Drop, json).await,
            Command::Grants(g) => crate::grants::run(&client, g, json)
                .await
                .map_err(Failure::from),
            Command::Webhooks(w) => crate::webhooks::run(&client, w, json)
                .await
                .map_err(Failure::from),
        }
    };
    // Ctrl+C stops any command at once. Waits and streams watch for it themselves (to clear
    // the spinner), so they are polled first.
    let outcome = tokio::select! {
        biased;
        o = work => o,
        () = cancel.cancelled() => Err(Failure::Interrupted),
    };
    match outcome {
        Ok(()) => EXIT_OK,
        Err(Failure::Usage(msg)) => {
            eprintln!("error: {}", crate::table::for_terminal(&msg));
            EXIT_USAGE
        }
        Err(Failure::Interrupted) => {
            eprintln!("interrupted");
            EXIT_INTERRUPTED
        }
        Err(Failure::Gateway(e)) => {
            // The gateway's (or a proxy's) words: never trusted with the terminal.
            eprintln!("error: {}", crate::table::for_terminal(&e.to_string()));
            if json {
                out(&format!("{}\n", e.json()));
            }
            match e {
                client::Error::Refused { .. } => EXIT_REFUSED,
                client::Error::NotFound { .. } => EXIT_NOT_FOUND,
                client::Error::Unreachable { .. } => EXIT_UNREACHABLE,
            }
        }
    }
}

/// Writes to stdout. A reader that went away (`| head`) is not an error: the caller just
/// stops (`false`), where `print!` would panic. What it writes is
/// [`crate::table::for_terminal`]'s: no escape sequence from an agent, a tool or the network
/// reaches a terminal (JSON documents stay valid and mean the same). A run's own result goes
/// through [`out_data`] instead.
pub(crate) fn out(text: &str) -> bool {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(crate::table::for_terminal(text).as_bytes())
        .and_then(|()| stdout.flush())
        .is_ok()
}

/// Writes a run's result (data, not the CLI's words) to stdout: as [`out`] at a terminal, and
/// as it is into a pipe or a file, where escaping would change the data.
pub(crate) fn out_data(text: &str) -> bool {
    if std::io::stdout().is_terminal() {
        return out(text);
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .is_ok()
}

/// Prints a JSON document on one line.
fn print_json(v: &Value) -> bool {
    out(&format!("{v}\n"))
}

/// Prints a typed document on one line, as the API writes it.
fn print_typed<T: serde::Serialize>(v: &T) -> bool {
    print_json(&serde_json::to_value(v).unwrap_or_default())
}

async fn submit(
    client: &Client,
    a: SubmitArgs,
    json: bool,
    cancel: &CancellationToken,
) -> Result<()> {
    let body = Submission {
        agent: a.agent,
        task: a.task,
        input: a.input,
    };
    let headers: Vec<(&str, &str)> = a
        .idempotency_key
        .as_deref()
        .map(|k| ("idempotency-key", k))
        .into_iter()
        .collect();
    let accepted: Reply<RunAccepted> = client.post_as("v1/runs", &body, &headers).await?;
    let run_id = accepted.body.run_id;
    if !a.wait {
        if json {
            print_json(&accepted.json);
        } else {
            out(&format!("run {run_id} {}\n", accepted.body.status));
            eprintln!("follow it: delta runs journal {run_id} --follow");
        }
        return Ok(());
    }
    let record = wait_for_pause(client, run_id, cancel).await?;
    if json {
        print_json(&record.json);
    } else {
        out(&show::run(&record.body, Utc::now()));
    }
    Ok(())
}

/// Polls the run until it waits for a person or ends; a spinner on stderr when it is a terminal.
async fn wait_for_pause(
    client: &Client,
    run_id: RunId,
    cancel: &CancellationToken,
) -> Result<Reply<RunDetail>> {
    const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
    let tty = std::io::stderr().is_terminal();
    let path = format!("v1/runs/{run_id}");
    let mut record: Option<Reply<RunDetail>> = None;
    let mut tick = 0usize;
    let result = loop {
        // Poll every 5th frame (0.5 s); draw a frame every 100 ms.
        if tick % 5 == 0 {
            let r: Reply<RunDetail> = match client.get_as(&path, &[]).await {
                Ok(r) => r,
                Err(e) => break Err(e.into()),
            };
            let status = r.body.run.status;
            record = Some(r);
            if status == RunStatus::WaitingForInput || status.is_terminal() {
                break Ok(());
            }
        }
        if tty {
            let status = record
                .as_ref()
                .map(|r| r.body.run.status.to_string())
                .unwrap_or_default();
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\r{} run {run_id}: {status}   ",
                FRAMES[tick % FRAMES.len()],
            );
            let _ = err.flush();
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = cancel.cancelled() => break Err(Failure::Interrupted),
        }
        tick += 1;
    };
    if tty {
        eprint!("\r\x1b[2K");
    }
    // The loop ends on a poll's answer, so there is a record when it succeeded.
    result.and_then(|()| {
        record.ok_or_else(|| Failure::Usage(format!("no answer about run {run_id}")))
    })
}

async fn runs_ls(client: &Client, a: RunsLsArgs, json: bool) -> Result<()> {
    let command = listing_command(
        "delta runs ls",
        &[("--status", a.status.clone()), ("--agent", a.agent.clone())],
        &a.page,
    );
    let query = RunsQuery {
        status: a.status.map(|s| s.to_uppercase()),
        agent: a.agent,
        limit: a.page.limit(),
        cursor: a.page.cursor,
    };
    let page: Reply<RunPage> = client.get_with("v1/runs", &query).await?;
    print_page(
        &page.json,
        json,
        &page.body.runs,
        page.body.next_cursor.as_deref(),
        "no runs",
        &command,
        show::runs_table,
    );
    Ok(())
}

async fn runs_show(client: &Client, run_id: RunId, json: bool) -> Result<()> {
    let record: Reply<RunDetail> = client.get_as(&format!("v1/runs/{run_id}"), &[]).await?;
    if json {
        print_json(&record.json);
    } else {
        out(&show::run(&record.body, Utc::now()));
    }
    Ok(())
}

/// The whole journal, page by page; with `--json` one document with every event.
async fn journal(client: &Client, run_id: RunId, json: bool) -> Result<()> {
    const PAGE: usize = 1000;
    let path = format!("v1/runs/{run_id}/journal");
    let mut from = 1u64;
    let mut all: Option<Journal> = None;
    loop {
        let query = JournalQuery {
            from_seq: Some(from),
            limit: Some(PAGE),
        };
        let page: Reply<Journal> = client.get_with(&path, &query).await?;
        let page = page.body;
        if !json {
            for e in &page.events {
                if !out(&format!("{}\n", show::journal_line(e))) {
                    return Ok(());
                }
            }
        }
        let n = page.events.len();
        from = page.next_seq;
        match &mut all {
            None => all = Some(page),
            Some(doc) => {
                doc.events.extend(page.events);
                doc.next_seq = page.next_seq;
                doc.status = page.status;
            }
        }
        if n < PAGE {
            break;
        }
    }
    if json && let Some(doc) = all {
        print_typed(&doc);
    }
    Ok(())
}

/// `--follow`: the SSE stream of the run's journal, reconnecting with `Last-Event-ID` after a
/// drop, until the `status` event that ends it.
async fn follow(
    client: &Client,
    run_id: RunId,
    json: bool,
    cancel: &CancellationToken,
) -> Result<()> {
    /// Reconnects in a row without an event before giving up (about a minute of backoff).
    const MAX_RETRIES: u32 = 15;
    let path = format!("v1/runs/{run_id}/events");
    let mut last: Option<u64> = None;
    let mut retries = 0u32;
    let mut connected_once = false;
    // One note per outage, not one per attempt.
    let mut noted = false;
    loop {
        let opened = tokio::select! {
            r = client.sse(&path, last) => r,
            () = cancel.cancelled() => return Err(Failure::Interrupted),
        };
        match opened {
            Ok(mut stream) => {
                connected_once = true;
                noted = false;
                retries = 0;
                loop {
                    let next = tokio::select! {
                        e = stream.next() => e,
                        () = cancel.cancelled() => return Err(Failure::Interrupted),
                    };
                    let Some(ev) = next else {
                        eprintln!("note: the event stream of run {run_id} ended; reconnecting");
                        break;
                    };
                    match ev.event.as_str() {
                        sse::JOURNAL => {
                            let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
                                // Not JSON (a proxy's doing): nothing to show, and `--json`'s
                                // lines stay documents of events.
                                eprintln!(
                                    "note: an event of run {run_id} that is not JSON, skipped"
                                );
                                continue;
                            };
                            let event = JournalEvent::deserialize(&v).ok();
                            if let Some(seq) = ev
                                .id
                                .as_deref()
                                .and_then(|i| i.parse().ok())
                                .or_else(|| event.as_ref().map(|e| e.seq))
                            {
                                last = Some(seq);
                            }
                            let written = if json {
                                print_json(&v)
                            } else {
                                let line = match &event {
                                    Some(e) => show::journal_line(e),
                                    None => show::unknown_journal_line(&v),
                                };
                                out(&format!("{line}\n"))
                            };
                            if !written {
                                return Ok(());
                            }
                        }
                        sse::STATUS => {
                            let v: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
                            if json {
                                print_json(&v);
                            } else if let Ok(ended) = RunEnded::deserialize(&v) {
                                out(&format!("{}\n", show::final_status(&ended)));
                            }
                            return Ok(());
                        }
                        _ => {}
                    }
                }
            }
            // The first connection fails fast: a wrong URL should not hang.
            Err(e @ client::Error::Unreachable { .. })
                if connected_once && retries < MAX_RETRIES =>
            {
                if !noted {
                    eprintln!("note: {e}; retrying");
                    noted = true;
                }
            }
            Err(e) => return Err(e.into()),
        }
        retries += 1;
        if retries > MAX_RETRIES {
            return Err(Failure::Gateway(client::Error::Unreachable {
                url: client.url(),
                what: format!(
                    "the event stream of run {run_id} at {} kept breaking; gave up after {MAX_RETRIES} reconnects",
                    client.url()
                ),
                body: None,
            }));
        }
        let pause = Duration::from_millis(250u64 << retries.min(5)).min(Duration::from_secs(5));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = cancel.cancelled() => return Err(Failure::Interrupted),
        }
    }
}

async fn pending_ls(client: &Client, a: PendingLsArgs, json: bool) -> Result<()> {
    let want = usize::from(a.page.limit);
    let query = InteractionsQuery {
        state: Some("pending".to_owned()),
        agent: a.agent.clone(),
        kind: a.kind.as_ref().map(|k| k.to_uppercase()),
        limit: a.page.limit(),
        cursor: a.page.cursor.clone(),
    };
    let doc: Reply<InteractionPage> = match a.older_than {
        // The gateway's page as is.
        None => client.get_with("v1/interactions", &query).await?,
        // Filtered here, on `created_at`, over as many pages as it takes.
        Some(age) => {
            // A duration past chrono's range goes back to its earliest date: every question
            // is younger.
            let cutoff = chrono::Duration::from_std(age)
                .ok()
                .and_then(|d| Utc::now().checked_sub_signed(d))
                .unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
            // Pending questions are listed oldest first (by when they were asked): those old
            // enough come first, and the first one too young ends the listing. Pages of what is
            // still wanted, so that each page's cursor follows the last question kept.
            let mut kept = vec![];
            let mut cursor = a.page.cursor.clone();
            'pages: loop {
                let q = InteractionsQuery {
                    limit: Some(want - kept.len()),
                    cursor: cursor.clone(),
                    ..query.clone()
                };
                let page: Reply<InteractionPage> = client.get_with("v1/interactions", &q).await?;
                for ix in page.body.interactions {
                    if show::time(ix.created_at) > cutoff {
                        cursor = None;
                        break 'pages;
                    }
                    kept.push(ix);
                }
                cursor = page.body.next_cursor;
                if cursor.is_none() || kept.len() >= want {
                    break;
                }
            }
            let body = InteractionPage {
                interactions: kept,
                next_cursor: cursor,
            };
            let json = serde_json::to_value(&body).unwrap_or_default();
            Reply { body, json }
        }
    };
    let command = listing_command(
        "delta pending ls",
        &[
            ("--agent", a.agent.clone()),
            ("--type", a.kind.clone()),
            (
                "--older-than",
                a.older_than.map(|d| format!("{}s", d.as_secs())),
            ),
        ],
        &a.page,
    );
    print_page(
        &doc.json,
        json,
        &doc.body.interactions,
        doc.body.next_cursor.as_deref(),
        "no pending questions",
        &command,
        show::pending_table,
    );
    Ok(())
}

/// The command that lists the next page: `base` with the filters given (each value quoted for
/// the shell) and `--limit`; the cursor is added by [`print_page`]. Without the filters, the
/// cursor (which belongs to the filtered listing) would list something else.
fn listing_command(base: &str, filters: &[(&str, Option<String>)], page: &Paging) -> String {
    let mut command = base.to_owned();
    for (flag, value) in filters {
        if let Some(v) = value {
            command.push_str(&format!(" {flag} {}", crate::table::shell_word(v)));
        }
    }
    if page.limit != 50 {
        command.push_str(&format!(" --limit {}", page.limit));
    }
    command
}

/// A listing page: `doc` as is with `--json`, else a table of its items and how to get the next
/// page.
fn print_page<T>(
    doc: &Value,
    json: bool,
    items: &[T],
    next_cursor: Option<&str>,
    empty: &str,
    command: &str,
    table: fn(&[T], DateTime<Utc>) -> String,
) {
    if json {
        print_json(doc);
        return;
    }
    if items.is_empty() {
        eprintln!("{empty}");
        return;
    }
    out(&table(items, Utc::now()));
    if let Some(c) = next_cursor {
        eprintln!("more: {command} --cursor {}", crate::table::shell_word(c));
    }
}

async fn pending_show(client: &Client, rid: RequestId, json: bool) -> Result<()> {
    let view: Reply<InteractionView> = client
        .get_as(&format!("v1/interactions/{rid}"), &[])
        .await?;
    if json {
        print_json(&view.json);
    } else {
        out(&show::interaction(&view.body, Utc::now()));
    }
    Ok(())
}

async fn answer(client: &Client, a: AnswerArgs, json: bool) -> Result<()> {
    let rid = a.request_id;
    // The question first: which option a number names, and whether the answer is sensitive.
    let view: Reply<InteractionView> = client
        .get_as(&format!("v1/interactions/{rid}"), &[])
        .await?;
    let q = &view.body.request;
    let pending = view.body.state == InteractionState::Pending;
    let option = a
        .option
        .as_ref()
        .map(|o| find_option(q, o.trim()).unwrap_or_else(|| o.clone()));
    let input_given = a.input.is_some();
    let mut input = a.input;
    if input.is_none() && pending && q.is_sensitive() {
        let chosen = option.as_deref().and_then(|o| q.option(o));
        // A typed answer is its `--data`, not text.
        let needs_text = (q.options.is_empty() && q.response_schema.is_none())
            || chosen.is_some_and(|o| o.requires_input);
        if needs_text {
            let prompt = chosen
                .and_then(|o| o.input_prompt.clone())
                .unwrap_or_else(|| q.prompt.clone());
            input = Some(read_hidden(&prompt).await?);
        }
    }
    let given_as_flag = input_given || matches!(a.data, Some(DataArg::Json(_)));
    if pending && q.is_sensitive() && given_as_flag {
        eprintln!(
            "warning: this question is sensitive and its answer was given as a flag, which `ps` and the shell's history keep: leave --input out to be asked without echo, or give --data - to read it from stdin"
        );
    }
    let mut data = match a.data {
        None => None,
        Some(DataArg::Json(v)) => Some(v),
        Some(DataArg::Stdin) => {
            let text = read_hidden("the answer's data, as one line of JSON").await?;
            // Not quoted back: it may be the secret.
            let v = serde_json::from_str(&text).map_err(|e| {
                Failure::Usage(format!(
                    "--data -: what stdin gave is not JSON ({}, at line {} column {})",
                    match e.classify() {
                        serde_json::error::Category::Eof => "it ends too soon",
                        serde_json::error::Category::Syntax => "a syntax error",
                        serde_json::error::Category::Data => "unexpected data",
                        serde_json::error::Category::Io => "it could not be read",
                    },
                    e.line(),
                    e.column()
                ))
            })?;
            Some(v)
        }
    };
    if let Some(scope) = a.grant {
        let mut obj = match data.take() {
            None => serde_json::Map::new(),
            Some(Value::Object(o)) => o,
            Some(_) => {
                return Err(Failure::Usage(
                    "--data must be a JSON object to go with --grant".into(),
                ));
            }
        };
        let grant = obj.entry("grant").or_insert_with(|| json!({}));
        if let Some(g) = grant.as_object_mut() {
            g.insert("scope".into(), json!(scope));
        }
        data = Some(Value::Object(obj));
    }
    if option.is_none() && input.is_none() && a.feedback.is_none() && data.is_none() {
        return Err(Failure::Usage(format!(
            "say what the answer is: --option ID or --input TEXT (`delta pending show {rid}` shows the question)"
        )));
    }
    // Without a token the gateway takes the id we give; with one, it sets it itself.
    let id = local_id(client);
    let body = AnswerBody {
        option_id: option,
        input,
        feedback: a.feedback,
        data,
        responder: Some(ClaimedResponder {
            id,
            via: Some(Via::Cli),
        }),
        request_hash: a
            .request_hash
            .or_else(|| Some(view.body.request_hash.clone())),
        ..AnswerBody::default()
    };
    let reply: Reply<AnswerAccepted> = client
        .post_as(&format!("v1/interactions/{rid}/response"), &body, &[])
        .await?;
    if json {
        print_json(&reply.json);
    } else {
        match (reply.body.status, &reply.body.tally) {
            (AnswerStatus::Counted, Some(t)) => out(&format!(
                "vote counted: {}; the question waits for more\n",
                t.summary()
            )),
            (_, Some(t)) => out(&format!(
                "accepted: {}; run {} resumes\n",
                t.summary(),
                reply.body.run_id
            )),
            _ => out(&format!("accepted: run {} resumes\n", reply.body.run_id)),
        };
    }
    Ok(())
}

/// The local user, as the responder id named to a gateway without authentication (with a
/// token, the gateway sets it itself).
fn local_id(client: &Client) -> Option<String> {
    (!client.has_token()).then(|| {
        std::env::var("USER")
            .ok()
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| "operator".into())
    })
}

async fn delegation_add(client: &Client, a: DelegationAddArgs, json: bool) -> Result<()> {
    let body = DelegationBody {
        from: a.from.or_else(|| local_id(client)),
        to: a.to,
        until: a.until,
        reason: a.reason,
    };
    let reply: Reply<Delegation> = client.post_as("v1/delegations", &body, &[]).await?;
    if json {
        print_json(&reply.json);
    } else {
        let d = &reply.body;
        out(&format!(
            "delegated: {} may answer what {} may until {} (id {})\n",
            d.to,
            d.from,
            show::local(show::time(d.until)),
            d.id
        ));
    }
    Ok(())
}

async fn delegations_ls(client: &Client, json: bool) -> Result<()> {
    let reply: Reply<DelegationPage> = client.get_as("v1/delegations", &[]).await?;
    if json {
        print_json(&reply.json);
    } else if reply.body.delegations.is_empty() {
        eprintln!("no delegations in force");
    } else {
        out(&show::delegations_table(
            &reply.body.delegations,
            Utc::now(),
        ));
    }
    Ok(())
}

async fn delegation_rm(client: &Client, a: DelegationRmArgs, json: bool) -> Result<()> {
    let reply: Reply<Delegation> = client
        .delete_as(&format!("v1/delegations/{}", a.id))
        .await?;
    if json {
        print_json(&reply.json);
    } else {
        out(&format!(
            "ended: {} no longer answers for {}\n",
            reply.body.to, reply.body.from
        ));
    }
    Ok(())
}

async fn claim(client: &Client, a: ClaimArgs, json: bool) -> Result<()> {
    let rid = a.request_id;
    let body = ClaimBody {
        ttl_seconds: Some(a.ttl),
        release: a.release,
        responder: Some(ClaimedResponder {
            id: local_id(client),
            via: Some(Via::Cli),
        }),
    };
    let reply: Reply<ClaimState> = client
        .post_as(&format!("v1/interactions/{rid}/claim"), &body, &[])
        .await?;
    if json {
        print_json(&reply.json);
    } else {
        match &reply.body.claim {
            Some(c) => out(&format!(
                "claimed: {rid} is yours ({}) until {}; others' answers are refused until then\n",
                c.by,
                show::local(show::time(c.until))
            )),
            None => out(&format!("released: nobody holds {rid} now\n")),
        };
    }
    Ok(())
}

/// Reads a sensitive answer: without echo on a terminal, a plain line from a pipe. It is never
/// printed or logged.
async fn read_hidden(prompt: &str) -> Result<String> {
    let prompt = format!("{} (hidden) > ", crate::table::for_terminal(prompt.trim()));
    let read = tokio::task::spawn_blocking(move || -> Option<String> {
        {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{prompt}");
            let _ = err.flush();
        }
        if std::io::stdin().is_terminal() {
            return rpassword::read_password().ok();
        }
        let mut s = String::new();
        let line = match std::io::stdin().lock().read_line(&mut s) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(s.trim_end_matches(['\n', '\r']).to_owned()),
        };
        // Nothing was echoed: end the prompt's line.
        eprintln!();
        line
    })
    .await
    .ok()
    .flatten();
    match read {
        Some(s) if !s.trim().is_empty() => Ok(s),
        _ => Err(Failure::Usage(
            "this question is sensitive and no answer was typed: run the command on a terminal \
             and type it at the prompt (or pipe it on stdin)"
                .into(),
        )),
    }
}

async fn cancel_run(client: &Client, a: CancelArgs, json: bool) -> Result<()> {
    let body = CancelBody { reason: a.reason };
    let reply: Reply<CancelResult> = client
        .post_as(&format!("v1/runs/{}/cancel", a.run_id), &body, &[])
        .await?;
    if json {
        print_json(&reply.json);
    } else {
        out(&format!("run {} {}\n", a.run_id, reply.body.status));
    }
    Ok(())
}

async fn queue(client: &Client, json: bool) -> Result<()> {
    let q: Reply<QueueStats> = client.get_as("v1/queue", &[]).await?;
    if json {
        print_json(&q.json);
    } else {
        out(&show::queue(&q.body, Utc::now()));
    }
    Ok(())
}

async fn dlq_ls(client: &Client, a: DlqLsArgs, json: bool) -> Result<()> {
    let command = listing_command("delta dlq ls", &[("--agent", a.agent.clone())], &a.page);
    let query = DlqQuery {
        agent: a.agent,
        limit: a.page.limit(),
        cursor: a.page.cursor,
    };
    let page: Reply<DeadLetterPage> = client.get_with("v1/dlq", &query).await?;
    print_page(
        &page.json,
        json,
        &page.body.dead_letters,
        page.body.next_cursor.as_deref(),
        "no dead letters",
        &command,
        show::dlq_table,
    );
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pick {
    Retry,
    Drop,
}

/// The letters `--all` names: every one (of the agent), or for a retry every retryable one.
async fn all_letters(client: &Client, agent: Option<&str>, pick: Pick) -> Result<Vec<u64>> {
    let mut seqs = vec![];
    let mut cursor: Option<String> = None;
    loop {
        let query = DlqQuery {
            agent: agent.map(str::to_owned),
            limit: Some(500),
            cursor: cursor.clone(),
        };
        let page: Reply<DeadLetterPage> = client.get_with("v1/dlq", &query).await?;
        for l in page.body.dead_letters {
            if pick == Pick::Drop || l.retryable {
                seqs.push(l.seq);
            }
        }
        match page.body.next_cursor {
            Some(c) => cursor = Some(c),
            None => return Ok(seqs),
        }
    }
}

/// `delta dlq retry|drop`: one call per letter, in order, stopping at the first refusal.
/// People see a line per letter (and a progress bar for many); `--json` prints one document:
/// `{"done": [replies…]}`, with `"error"` too when one was refused.
async fn dlq_pick(client: &Client, a: DlqPickArgs, pick: Pick, json: bool) -> Result<()> {
    let seqs = if a.all {
        all_letters(client, a.agent.as_deref(), pick).await?
    } else {
        a.seqs
    };
    if seqs.is_empty() {
        if json {
            print_json(&json!({"done": []}));
        } else {
            eprintln!(
                "no dead letters to {}",
                if pick == Pick::Retry { "retry" } else { "drop" }
            );
        }
        return Ok(());
    }
    let bar = (!json && seqs.len() > 1 && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(seqs.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut done = vec![];
    for seq in seqs {
        // The reply as is (for `--json`) and, for people, the run a retry requeued.
        let reply: std::result::Result<(Value, Option<RunId>), client::Error> = match pick {
            Pick::Retry => client
                .post_as(&format!("v1/dlq/{seq}/retry"), &json!({}), &[])
                .await
                .map(|r: Reply<DeadLetterRetried>| (r.json, Some(r.body.run_id))),
            Pick::Drop => client
                .delete_as(&format!("v1/dlq/{seq}"))
                .await
                .map(|r: Reply<DeadLetterDropped>| (r.json, None)),
        };
        let reply = match reply {
            Ok(r) => r,
            // With --all, a letter that turned out not retryable (a second letter of a run
            // already retried, say) is skipped, not the end of the batch.
            Err(client::Error::Refused { code, message, .. })
                if a.all && code == Some(ErrorCode::NotRetryable) =>
            {
                let note = format!("dead letter {seq}: skipped: {message}");
                match &bar {
                    Some(bar) => bar.println(&note),
                    None => eprintln!("{note}"),
                }
                if let Some(bar) = &bar {
                    bar.inc(1);
                }
                continue;
            }
            Err(e) => {
                if let Some(bar) = &bar {
                    bar.finish_and_clear();
                }
                if json && !done.is_empty() {
                    print_json(&json!({"done": done}));
                }
                return Err(e.into());
            }
        };
        let (reply, requeued) = reply;
        let line = match requeued {
            Some(run_id) => format!("dead letter {seq}: run {run_id} requeued\n"),
            None => format!("dead letter {seq}: dropped\n"),
        };
        match &bar {
            Some(bar) => {
                bar.inc(1);
                bar.println(line.trim_end());
            }
            None if !json => {
                out(&line);
            }
            None => {}
        }
        done.push(reply);
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if json {
        print_json(&json!({"done": done}));
    }
    Ok(())
}
