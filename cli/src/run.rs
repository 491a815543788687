//! `delta run`: the local host of the engine (docs/protocol.md §7).
//!
//! Async mode (default): a question is written to `.delta/interaction/request.json`, the run is
//! parked as `WAITING_FOR_INPUT` and the process exits 101; the next `delta run` in the same
//! directory ingests `response.txt`/`response.json` and goes on. `-i`: the question is asked on
//! the terminal and the run goes on in the same process. SIGINT/SIGTERM checkpoint the run as
//! `INTERRUPTED` (exit 130). The latest run (`.delta/runs/LATEST`) is resumed when it is waiting,
//! interrupted, or was left `RUNNING` by a process that died (its lock is free).

use std::path::{Path, PathBuf};

use delta_engine::agent::{Agent, BrainKind};
use delta_engine::brain::AnyBrain;
use delta_engine::engine::{self, Engine, Outcome, PauseMode, Settings};
use delta_protocol::{Event, InteractionRequest, InteractionType, RunId, RunStatus};
use delta_store::file::FileRunStore;
use delta_store::{self as store, RunRecord, RunStore};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::mailbox::Mailbox;
use crate::render;
use crate::table::{for_terminal, shell_word};
use crate::terminal::{self, Asked};

pub const EXIT_COMPLETED: i32 = 0;
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_CANCELLED: i32 = 3;
pub const EXIT_WAITING: i32 = 101;
pub const EXIT_INTERRUPTED: i32 = 130;
/// A file or directory of the run could not be read or written (`EX_IOERR`): the machine's
/// doing, not the run's (which would be `1`, FAILED).
pub const EXIT_IO: i32 = 74;

/// The options of `delta run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The agent directory (holds agent.yaml or config.yaml). Optional when resuming: the run
    /// remembers it.
    #[arg(short, long)]
    pub agent: Option<PathBuf>,
    /// What the agent should do. Needed to start a run; ignored when one is resumed.
    /// `-m/--message` is Delta Engine's name for it.
    #[arg(short, long, visible_alias = "message", visible_short_alias = 'm')]
    pub task: Option<String>,
    /// Delta Engine's layout: run in `<agent>/workspaces/W001`, `W002`… The last one used
    /// (`workspaces/LAST_USED`) is taken again (resuming its latest run), unless `--new` or `-y`
    /// asks for a new workspace.
    #[arg(long, conflicts_with = "work_dir")]
    pub workspaces: bool,
    /// Brain decisions allowed in this run, instead of the agent's `max_iterations` (Delta
    /// Engine's flag).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_iterations: Option<u32>,
    /// Ask nothing before starting (Delta Engine's `-y`); with `--workspaces`: a new workspace.
    #[arg(short = 'y', long = "yes")]
    pub yes: bool,
    /// Ask questions on this terminal and go on in the same process (no mailbox, no exit 101).
    #[arg(short, long)]
    pub interactive: bool,
    /// The directory holding `.delta/` where tools run (default: the current directory).
    #[arg(short, long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Start a new run even if the latest one could be resumed.
    #[arg(long)]
    pub new: bool,
    /// Print one JSON object with the outcome on stdout (for scripts).
    #[arg(long)]
    pub json: bool,
    /// Do not print the run's events on stderr.
    #[arg(short, long)]
    pub quiet: bool,
}

/// An error that ends the command with an exit code.
struct Stop(i32, String);

fn usage(msg: impl Into<String>) -> Stop {
    Stop(EXIT_USAGE, msg.into())
}

fn store_err(e: store::Error) -> Stop {
    let code = match e {
        store::Error::Journal(_) | store::Error::Record { .. } | store::Error::Locked { .. } => {
            EXIT_USAGE
        }
        store::Error::Io { .. } => EXIT_IO,
        _ => EXIT_FAILED,
    };
    Stop(code, delta_host::Chain(&e).to_string())
}

/// Runs `delta run`; returns the exit code. Errors are printed here.
pub async fn run(args: RunArgs, cancel: CancellationToken) -> i32 {
    match run_inner(&args, cancel).await {
        Ok(code) => code,
        Err(Stop(code, msg)) => {
            eprintln!("error: {}", for_terminal(&msg));
            if args.json {
                crate::ops::out(&format!(
                    "{}\n",
                    json!({"status": null, "error": msg, "exit_code": code})
                ));
            }
            code
        }
    }
}

/// Shows `path` relative to the current directory when it is below it.
fn shown(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

/// `W001`, `W002`…: the workspaces of Delta Engine's layout.
fn workspace_number(name: &str) -> Option<u32> {
    let digits = name.strip_prefix('W')?;
    (digits.len() == 3 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// `name` is a plain name (no `/`, not `.` or `..`) of a real directory in `root` (a symlink
/// to a directory elsewhere is not a workspace).
fn plain_workspace_dir(root: &Path, name: &str) -> bool {
    !name.is_empty()
        && !name.contains('/')
        && name != "."
        && name != ".."
        && std::fs::symlink_metadata(root.join(name)).is_ok_and(|m| m.is_dir())
}

/// The work directory under `<agent>/workspaces/` (created), remembered in `LAST_USED`.
fn workspace(agent_dir: &Path, fresh: bool) -> Result<PathBuf, Stop> {
    let root = agent_dir.join("workspaces");
    let cannot = |what: &str, e: std::io::Error| {
        Stop(EXIT_IO, format!("{}: cannot {what} ({e})", root.display()))
    };
    std::fs::create_dir_all(&root).map_err(|e| cannot("create it", e))?;
    // Bounded, and a regular file only (a FIFO or a symlink is not read).
    let last = delta_engine::files::read_text(&root.join("LAST_USED"), 4096)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| plain_workspace_dir(&root, s));
    let name = match last {
        Some(last) if !fresh => last,
        _ => {
            let highest = std::fs::read_dir(&root)
                .map_err(|e| cannot("list it", e))?
                .filter_map(|e| e.ok())
                // A real directory, not a symlink to one.
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| workspace_number(&e.file_name().to_string_lossy()))
                .max()
                .unwrap_or(0);
            format!("W{:03}", highest + 1)
        }
    };
    let dir = root.join(&name);
    std::fs::create_dir_all(&dir).map_err(|e| cannot(&format!("create {name}"), e))?;
    // Written aside and renamed over: a symlink planted as LAST_USED is replaced, not followed.
    let tmp = root.join(format!(".LAST_USED.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| std::io::Write::write_all(&mut f, name.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, root.join("LAST_USED")))
        .map_err(|e| cannot("write LAST_USED", e))?;
    dir.canonicalize()
        .map_err(|e| cannot(&format!("resolve {name}"), e))
}

async fn run_inner(args: &RunArgs, cancel: CancellationToken) -> Result<i32, Stop> {
    let work_dir = match &args.work_dir {
        None if args.workspaces => {
            let agent = args.agent.as_ref().ok_or_else(|| {
                usage(
                    "--workspaces needs --agent <dir>: the workspaces live in the agent directory",
                )
            })?;
            let dir = workspace(agent, args.new || args.yes)?;
            if !args.quiet {
                eprintln!("workspace: {}", shown(&dir));
            }
            dir
        }
        Some(d) => {
            std::fs::create_dir_all(d).map_err(|e| {
                usage(format!(
                    "--work-dir {}: cannot create it ({e})",
                    d.display()
                ))
            })?;
            d.canonicalize()
                .map_err(|e| usage(format!("--work-dir {}: {e}", d.display())))?
        }
        None => std::env::current_dir().map_err(|e| usage(format!("current directory: {e}")))?,
    };
    let delta_dir = work_dir.join(".delta");
    let store = FileRunStore::new(&delta_dir);
    let mailbox = Mailbox::new(&delta_dir);

    // Resume the latest run, or start one.
    let latest = if args.new {
        None
    } else {
        store.latest().map_err(store_err)?
    };
    let mut resumable = None;
    if let Some(id) = latest {
        match store.load(id).await {
            Ok(run) => {
                let status = run.record.status;
                let open = matches!(
                    status,
                    RunStatus::WaitingForInput | RunStatus::Interrupted | RunStatus::Running
                );
                if open {
                    resumable = Some(run);
                }
            }
            Err(store::Error::NotFound(_)) => {}
            Err(e) => return Err(store_err(e)),
        }
    }
    let agent_dir = match (&args.agent, &resumable) {
        (Some(dir), _) => dir.clone(),
        (None, Some(run)) => run
            .record
            .agent_dir
            .as_ref()
            .map(PathBuf::from)
            .ok_or_else(|| {
                usage("--agent is required (the run does not record its agent directory)")
            })?,
        (None, None) => {
            return Err(usage(
                "--agent <dir> is required: the directory holding the agent's agent.yaml (or config.yaml)",
            ));
        }
    };
    let mut agent =
        Agent::load(&agent_dir).map_err(|e| usage(delta_host::Chain(&e).to_string()))?;
    if let Some(n) = args.max_iterations {
        agent.config.max_iterations = Some(n);
    }
    // What the agent declares but this engine does not use is said, whatever `-q` says.
    for w in &agent.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(run) = &resumable
        && run.record.agent != agent.name()
    {
        if !args.quiet {
            eprintln!(
                "note: the latest run {} belongs to agent `{}`, not `{}`: starting a new run \
                 (it stays {} in .delta/runs)",
                run.record.run_id,
                run.record.agent,
                agent.name(),
                run.record.status
            );
        }
        resumable = None;
    }
    let brain = if agent.brain == BrainKind::Openai {
        // Delta Engine's `.env` files may hold the LLM's key and endpoint.
        let mut wanted = vec!["DELTA_API_KEY", "DELTA_BASE_URL", "OPENAI_API_KEY"];
        if let Some(own) = agent
            .config
            .llm
            .as_ref()
            .and_then(|l| l.api_key_env.as_deref())
        {
            wanted.push(own);
        }
        let own_endpoint = agent
            .config
            .llm
            .as_ref()
            .is_some_and(|l| l.base_url.is_some());
        let dotenv = crate::dotenv::DotEnv::load(&work_dir, &agent.dir, &wanted, own_endpoint);
        for w in &dotenv.warnings {
            eprintln!("warning: {w}");
        }
        // Where the key goes is said whenever a file chose it.
        if !own_endpoint && let Some((url, Some(file))) = dotenv.lookup("DELTA_BASE_URL") {
            eprintln!(
                "note: LLM endpoint DELTA_BASE_URL={} from {} (sent only a key from that file)",
                crate::client::shown_url(&url),
                file.display()
            );
        }
        AnyBrain::for_agent_with(&agent, &|name| dotenv.get(name))
    } else {
        AnyBrain::for_agent(&agent)
    }
    .map_err(|e| usage(delta_host::Chain(&e).to_string()))?;

    let run = match resumable {
        Some(run) => {
            if let Some(task) = &args.task
                && task != &run.record.task
                && !args.quiet
            {
                eprintln!(
                    "note: resuming run {} ({}, task: {:?}); --task is ignored. Use --new to start another run.",
                    run.record.run_id, run.record.status, run.record.task
                );
            }
            run
        }
        None => {
            let task = args
                .task
                .clone()
                .filter(|t| !t.trim().is_empty())
                .ok_or_else(|| {
                    usage("--task (or -m) \"<what to do>\" is required to start a run")
                })?;
            let mut rec = RunRecord::new(RunId::new(), agent.name(), &task, RunStatus::Running);
            rec.agent_dir = Some(agent.dir.display().to_string());
            let id = rec.run_id;
            store.create(rec).await.map_err(store_err)?;
            store.set_latest(id).map_err(store_err)?;
            // A new run has no question: whatever the mailbox holds belongs to an older one.
            mailbox.clear();
            store.load(id).await.map_err(store_err)?
        }
    };
    let run_id = run.record.run_id;
    let _lock = store.lock(run_id).map_err(store_err)?;
    // Re-read under the lock: another process may have moved the run since.
    let run = store.load(run_id).await.map_err(store_err)?;

    let settings = Settings {
        worker: "local".into(),
        work_dir: work_dir.clone(),
        pause: if args.interactive {
            PauseMode::Hold
        } else {
            PauseMode::Park
        },
    };
    let quiet = args.quiet;
    // An answer read from the mailbox is removed as soon as it is journaled, before any tool
    // runs: a sensitive one must not sit in `.delta/` while the run goes on (it is journaled
    // as "***" and kept only in this process's memory).
    let answered = Mailbox::new(&delta_dir);
    let mut engine =
        Engine::new(&agent, &brain, &store, run, settings, cancel.clone()).observe(move |e| {
            if matches!(e.event, Event::HumanInputReceived(_)) {
                answered.clear_responses();
            }
            if !quiet && let Some(line) = render::line(e) {
                eprintln!("{}", for_terminal(&line));
            }
        });

    let outcome = if args.interactive {
        interactive(&mut engine, &cancel).await?
    } else {
        mailbox_mode(&mut engine, &mailbox).await?
    };
    let mut resume = format!("delta run --agent {}", shown(&agent_dir));
    if args.workspaces {
        resume.push_str(" --workspaces");
    }
    Ok(report(args, &engine, &mailbox, &outcome, &resume))
}

type LocalEngine<'a> = Engine<'a, FileRunStore, AnyBrain>;

async fn mailbox_mode(engine: &mut LocalEngine<'_>, mailbox: &Mailbox) -> Result<Outcome, Stop> {
    let mut answer = None;
    if let Some(q) = engine.pending().cloned() {
        if mailbox.request_on_file() == Some(q.request_id) {
            match mailbox.read_answer(&q) {
                Ok(a) => answer = a,
                Err(e) => {
                    eprintln!("error: {}", for_terminal(&e.to_string()));
                    eprintln!("The run stays waiting; fix the answer and run again.");
                    return Ok(Outcome::Paused(Box::new(q)));
                }
            }
        } else {
            // Answers beside another request's file are stale: that request is already answered.
            mailbox.clear_responses();
        }
    }
    let had_answer = answer.is_some();
    let outcome = match engine.advance(answer).await {
        Ok(o) => o,
        Err(engine::Error::Answer(e)) if e.code() == "expired" => {
            eprintln!(
                "note: {}; the request resolves by its timeout rule instead",
                for_terminal(&e.to_string())
            );
            mailbox.clear_responses();
            engine.advance(None).await.map_err(engine_err)?
        }
        Err(engine::Error::Answer(e)) => {
            eprintln!(
                "error: the answer was refused ({}): {}",
                e.code(),
                for_terminal(&e.to_string())
            );
            eprintln!(
                "The run stays waiting; the mailbox is untouched. Fix the answer and run again."
            );
            let q = engine
                .pending()
                .cloned()
                .ok_or_else(|| Stop(EXIT_FAILED, e.to_string()))?;
            return Ok(Outcome::Paused(Box::new(q)));
        }
        Err(e) => return Err(engine_err(e)),
    };
    if had_answer {
        mailbox.clear_responses();
    }
    match &outcome {
        Outcome::Paused(q) => {
            // An answer file already there was not written for this question (it is asked only
            // now): a tool of this run may have put it there. The person writes theirs after.
            if mailbox.request_on_file() != Some(q.request_id) {
                mailbox.clear_responses();
            }
            mailbox
                .write_request(q)
                .map_err(|e| Stop(EXIT_IO, format!("writing the question: {e}")))?;
        }
        _ if !matches!(outcome, Outcome::Interrupted) => mailbox.clear(),
        _ => {}
    }
    Ok(outcome)
}

fn engine_err(e: engine::Error) -> Stop {
    match e {
        engine::Error::Store(s) => store_err(s),
        engine::Error::Answer(a) => Stop(EXIT_FAILED, a.to_string()),
    }
}

async fn interactive(
    engine: &mut LocalEngine<'_>,
    cancel: &CancellationToken,
) -> Result<Outcome, Stop> {
    let mut answer = None;
    loop {
        let outcome = match engine.advance(answer.take()).await {
            Ok(o) => o,
            Err(engine::Error::Answer(e)) => {
                eprintln!("  refused ({}): {}", e.code(), for_terminal(&e.to_string()));
                continue;
            }
            Err(e) => return Err(engine_err(e)),
        };
        let Outcome::Paused(q) = outcome else {
            return Ok(outcome);
        };
        match terminal::ask(&q, cancel).await {
            Asked::Answer(a) => answer = Some(a),
            Asked::Expired => {}
            Asked::Cancelled => return engine.interrupt().await.map_err(engine_err),
            Asked::Eof => {
                eprintln!(
                    "\nstdin closed before an answer: the run now waits for one in the mailbox."
                );
                return engine.park().await.map_err(engine_err);
            }
        }
    }
}

fn report(
    args: &RunArgs,
    engine: &LocalEngine<'_>,
    mailbox: &Mailbox,
    outcome: &Outcome,
    resume: &str,
) -> i32 {
    let run_id = engine.record().run_id;
    let code = match outcome {
        Outcome::Completed { .. } => EXIT_COMPLETED,
        Outcome::Failed { .. } => EXIT_FAILED,
        Outcome::Cancelled { .. } => EXIT_CANCELLED,
        Outcome::Paused(_) => EXIT_WAITING,
        Outcome::Interrupted => EXIT_INTERRUPTED,
    };
    if args.json {
        let mut v = json!({"run_id": run_id, "status": outcome.status(), "exit_code": code});
        match outcome {
            Outcome::Completed { result } => v["result"] = json!(result),
            Outcome::Failed { error } => v["error"] = json!(error),
            Outcome::Cancelled { reason } => v["error"] = json!(reason),
            Outcome::Paused(q) => {
                v["request"] = serde_json::to_value(q).unwrap_or_default();
                v["request_file"] = json!(mailbox.request_path());
            }
            Outcome::Interrupted => {}
        }
        crate::ops::out(&format!("{v}\n"));
        return code;
    }
    match outcome {
        Outcome::Completed { result } => {
            eprintln!("\nCOMPLETED run {run_id}");
            crate::ops::out_data(&format!("{result}\n"));
        }
        Outcome::Failed { error } => {
            eprintln!("\nFAILED run {run_id}: {}", for_terminal(error));
        }
        Outcome::Cancelled { reason } => {
            eprintln!("\nCANCELLED run {run_id}: {}", for_terminal(reason));
        }
        Outcome::Interrupted => eprintln!(
            "\nINTERRUPTED run {run_id}: checkpointed; run the same command again to resume"
        ),
        Outcome::Paused(q) => explain_pause(q, mailbox, resume),
    }
    code
}

fn explain_pause(q: &InteractionRequest, mailbox: &Mailbox, resume: &str) {
    let txt = shell_word(&shown(&mailbox.txt_path()));
    let mut s = format!(
        "\nWAITING_FOR_INPUT run {}\n  question: {}\n",
        q.run_id, q.prompt
    );
    for line in q.details.iter().flat_map(|d| d.lines()) {
        s.push_str(&format!("            {line}\n"));
    }
    if let Some(cmd) = q.context.get("command_line").and_then(|v| v.as_str()) {
        s.push_str(&format!("  command: {cmd}\n"));
    }
    if let Some(risk) = q.context.get("risk_level").and_then(|v| v.as_str()) {
        s.push_str(&format!("  risk:    {risk}\n"));
    }
    if q.is_sensitive() {
        s.push_str("  (sensitive: the answer is read once, then removed; it is never stored)\n");
    }
    for (i, o) in q.options.iter().enumerate() {
        s.push_str(&format!(
            "    {}) {} [{}]{}{}\n",
            i + 1,
            o.label,
            o.option_id,
            if o.requires_input { " + text" } else { "" },
            if o.is_dangerous { "  !! dangerous" } else { "" }
        ));
    }
    if let Some(e) = q.expires_at {
        s.push_str(&format!(
            "  expires: {e} (then: {})\n",
            q.default_option_id.as_deref().unwrap_or("the run fails")
        ));
    }
    let fields = crate::mailbox::typed_fields(q);
    if !fields.is_empty() {
        s.push_str("  fields:\n");
        for f in fields {
            s.push_str(&format!("    {f}\n"));
        }
        s.push_str(&format!(
            "  request: {}\n  answer:  echo {} > {}\n  resume:  {resume}\n",
            shown(&mailbox.request_path()),
            shell_word(&format!(
                "{{\"data\": {}}}",
                crate::mailbox::typed_example(q)
            )),
            shell_word(&shown(&mailbox.json_path())),
        ));
        eprint!("{}", for_terminal(&s));
        return;
    }
    let example = if q.options.is_empty() {
        "your answer".to_owned()
    } else {
        q.options[0].option_id.clone()
    };
    let example = shell_word(&example);
    s.push_str(&format!(
        "  request: {}\n  answer:  echo {example} > {txt}\n           (or the full response in {})\n",
        shown(&mailbox.request_path()),
        shown(&mailbox.json_path()),
    ));
    if q.kind == InteractionType::ToolApproval && q.context.contains_key("args") {
        s.push_str(&format!(
            "           edit the arguments when approving: printf 'approve\\nkey=value\\n' > {txt}\n"
        ));
    }
    if q.is_plan_confirmation() && q.option("modify").is_some() {
        s.push_str(&format!(
            "           change the plan: echo 'modify: what to change' > {txt}\n           \
             (or {{\"option_id\": \"modify\", \"data\": {{\"tasks\": [\"…\"]}}}} in {})\n",
            shown(&mailbox.json_path())
        ));
    }
    s.push_str(&format!("  resume:  {resume}\n"));
    eprint!("{}", for_terminal(&s));
}
