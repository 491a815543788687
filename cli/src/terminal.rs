//! `-i`: asking on the terminal. Prompts go to stderr (stdout stays clean for `--json`), answers
//! come from stdin: hidden when sensitive and stdin is a terminal, plain lines otherwise (so
//! `-i` works with piped input too).

use std::io::{BufRead, IsTerminal, Write};

use delta_protocol::{InteractionRequest, InteractionResponse, Timestamp, Via};
use tokio_util::sync::CancellationToken;

use crate::mailbox::{apply_edits, editable_args, find_option, local_responder};
use delta_protocol::OptionAction;

/// How a prompt ended.
pub enum Asked {
    Answer(InteractionResponse),
    /// stdin closed: nobody is there to answer.
    Eof,
    Cancelled,
    /// `expires_at` passed while waiting.
    Expired,
}

enum Line {
    Text(String),
    Eof,
    Cancelled,
    Expired,
}

async fn read_line(hidden: bool, cancel: &CancellationToken, deadline: Option<Timestamp>) -> Line {
    let task = tokio::task::spawn_blocking(move || -> Option<String> {
        if hidden && std::io::stdin().is_terminal() {
            return rpassword::read_password().ok();
        }
        let mut s = String::new();
        match std::io::stdin().lock().read_line(&mut s) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(s.trim_end_matches(['\n', '\r']).to_owned()),
        }
    });
    let wait = async {
        match deadline {
            Some(t) => {
                let left = (t.micros() - Timestamp::now().micros()).max(0) as u64;
                tokio::time::sleep(std::time::Duration::from_micros(left)).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        r = task => match r {
            Ok(Some(s)) => Line::Text(s),
            _ => Line::Eof,
        },
        () = cancel.cancelled() => Line::Cancelled,
        () = wait => Line::Expired,
    }
}

fn say(text: &str) {
    let mut e = std::io::stderr().lock();
    let _ = write!(e, "{text}");
    let _ = e.flush();
}

/// Shows the request and reads an answer, re-asking until it is well-formed for the request.
pub async fn ask(q: &InteractionRequest, cancel: &CancellationToken) -> Asked {
    let hidden = q.is_sensitive();
    let mut header = String::from("\n");
    if let Some(t) = &q.title {
        header.push_str(&format!("== {t} ==\n"));
    }
    header.push_str(&format!("? {}\n", q.prompt));
    for line in q.details.iter().flat_map(|d| d.lines()) {
        header.push_str(&format!("  {line}\n"));
    }
    if let Some(cmd) = q.context.get("command_line").and_then(|v| v.as_str()) {
        header.push_str(&format!("  command: {cmd}\n"));
    }
    if let Some(args) = q.context.get("args").filter(|a| a.is_object()) {
        header.push_str(&format!("  args:    {args}\n"));
    }
    if let Some(risk) = q.context.get("risk_level").and_then(|v| v.as_str()) {
        let why = q
            .context
            .get("dangerous_because")
            .and_then(|v| v.as_str())
            .map(|w| format!(" ({w})"))
            .unwrap_or_default();
        header.push_str(&format!("  risk:    {risk}{why}\n"));
    }
    if let Some(e) = q.expires_at {
        let default = q
            .default_option_id
            .as_deref()
            .unwrap_or("none: the run fails");
        header.push_str(&format!(
            "  (answer before {e}; then the default applies: {default})\n"
        ));
    }
    for (i, o) in q.options.iter().enumerate() {
        let mut line = format!("  {}) {}", i + 1, o.label);
        if o.label != o.option_id {
            line.push_str(&format!(" [{}]", o.option_id));
        }
        if let Some(d) = &o.description {
            line.push_str(&format!(" - {d}"));
        }
        if o.is_dangerous {
            line.push_str("  !! dangerous");
        }
        if o.is_default {
            line.push_str("  (default)");
        }
        if o.requires_input {
            line.push_str("  (asks for text)");
        }
        header.push_str(&line);
        header.push('\n');
    }
    if q.context.get("grantable") == Some(&serde_json::Value::Bool(true)) {
        header.push_str(&format!(
            "  always allow: add +run or +agent to the approval (`approve +agent`) to approve later calls like this one in this run, or in every run of {}\n",
            q.agent
        ));
    }
    say(&header);
    if q.is_expired_at(Timestamp::now()) {
        return Asked::Expired;
    }
    let mut resp = InteractionResponse::new(q.request_id, local_responder(Via::Stdin));
    if q.options.is_empty() {
        loop {
            say(if hidden { "(hidden) > " } else { "> " });
            match read_line(hidden, cancel, q.expires_at).await {
                Line::Text(t) if t.trim().is_empty() => {
                    say("  an answer is needed (Ctrl+C to stop)\n")
                }
                Line::Text(t) => {
                    resp.input = Some(t);
                    return Asked::Answer(resp);
                }
                Line::Eof => return Asked::Eof,
                Line::Cancelled => return Asked::Cancelled,
                Line::Expired => return Asked::Expired,
            }
        }
    }
    let (option, grant) = loop {
        say(&format!(
            "choose 1-{} (or an option id) > ",
            q.options.len()
        ));
        match read_line(false, cancel, q.expires_at).await {
            Line::Text(t) => {
                let (text, grant) = split_grant(t.trim());
                match find_option(q, text) {
                    Some(id) => break (id, grant),
                    None => say(&format!("  `{}` is not one of the options\n", t.trim())),
                }
            }
            Line::Eof => return Asked::Eof,
            Line::Cancelled => return Asked::Cancelled,
            Line::Expired => return Asked::Expired,
        }
    };
    let chosen = q.option(&option);
    // Feedback and reasons are text the engine needs, whether or not the option says so.
    let wants_text = chosen.is_some_and(|o| {
        o.requires_input
            || (o.input_prompt.is_some()
                && matches!(
                    o.action,
                    OptionAction::RetryWithFeedback | OptionAction::RejectWithReason
                ))
    });
    if wants_text {
        let prompt = chosen
            .and_then(|o| o.input_prompt.clone())
            .unwrap_or_else(|| "text".into());
        loop {
            say(&format!(
                "{prompt}{} > ",
                if hidden { " (hidden)" } else { "" }
            ));
            match read_line(hidden, cancel, q.expires_at).await {
                Line::Text(t) if t.trim().is_empty() => say("  this option needs text\n"),
                Line::Text(t) => {
                    resp.input = Some(t);
                    break;
                }
                Line::Eof => return Asked::Eof,
                Line::Cancelled => return Asked::Cancelled,
                Line::Expired => return Asked::Expired,
            }
        }
    }
    if let Some(args) = editable_args(q, &option) {
        match edit_args(args, cancel, q).await {
            Ok(Some(edited)) => resp.data = Some(serde_json::json!({ "args": edited })),
            Ok(None) => {}
            Err(stop) => return stop,
        }
    }
    if let Some(scope) = grant {
        // Checked with the rest of the answer (an option that does not approve, a tool that is
        // not grantable: refused, and asked again).
        let grant = serde_json::json!({ "scope": scope });
        match resp.data.as_mut().and_then(|d| d.as_object_mut()) {
            Some(obj) => {
                obj.insert("grant".into(), grant);
            }
            None => resp.data = Some(serde_json::json!({ "grant": grant })),
        }
    }
    resp.option_id = Some(option);
    Asked::Answer(resp)
}

/// An option line's "always allow" suffix: `approve +agent` is the option `approve` with a grant
/// of scope `agent` (`+run`: this run only).
fn split_grant(line: &str) -> (&str, Option<&'static str>) {
    for (suffix, scope) in [("+agent", "agent"), ("+run", "run")] {
        if let Some(rest) = line.strip_suffix(suffix) {
            return (rest.trim_end(), Some(scope));
        }
    }
    (line, None)
}

/// Editor-free argument editing: `key=value` lines until an empty one. `None`: unchanged.
async fn edit_args(
    args: &serde_json::Value,
    cancel: &CancellationToken,
    q: &InteractionRequest,
) -> Result<Option<serde_json::Value>, Asked> {
    say(
        "  edit the arguments? one key=value per line, an empty line to run (just Enter: as shown)\n",
    );
    let mut lines: Vec<String> = vec![];
    loop {
        say("edit > ");
        match read_line(false, cancel, q.expires_at).await {
            Line::Text(t) if t.trim().is_empty() => break,
            Line::Text(t) => match apply_edits(args, &[t.as_str()]) {
                Ok(_) => lines.push(t),
                Err(e) => say(&format!(
                    "  {e}: write key=value, or an empty line to finish\n"
                )),
            },
            // Nothing more to read: run with the edits given so far.
            Line::Eof => break,
            Line::Cancelled => return Err(Asked::Cancelled),
            Line::Expired => return Err(Asked::Expired),
        }
    }
    if lines.is_empty() {
        return Ok(None);
    }
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let edited = apply_edits(args, &refs).map_err(|_| Asked::Eof)?;
    say(&format!("  running with: {edited}\n"));
    Ok(Some(edited))
}
