//! `-i`: asking on the terminal. Prompts go to stderr (stdout stays clean for `--json`), answers
//! come from stdin: hidden when sensitive and stdin is a terminal, plain lines otherwise (so
//! `-i` works with piped input too).

use std::io::{BufRead, IsTerminal, Write};

use delta_shared::protocol::{InteractionRequest, InteractionResponse, Timestamp, Via};
use tokio_util::sync::CancellationToken;

use crate::mailbox::{find_option, local_responder};

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
    if let Some(d) = &q.details {
        header.push_str(&format!("  {d}\n"));
    }
    if let Some(cmd) = q.context.get("command_line").and_then(|v| v.as_str()) {
        header.push_str(&format!("  command: {cmd}\n"));
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
    say(&header);
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
    let option = loop {
        say(&format!(
            "choose 1-{} (or an option id) > ",
            q.options.len()
        ));
        match read_line(false, cancel, q.expires_at).await {
            Line::Text(t) => match find_option(q, t.trim()) {
                Some(id) => break id,
                None => say(&format!("  `{}` is not one of the options\n", t.trim())),
            },
            Line::Eof => return Asked::Eof,
            Line::Cancelled => return Asked::Cancelled,
            Line::Expired => return Asked::Expired,
        }
    };
    let needs_input = q.option(&option).is_some_and(|o| o.requires_input);
    if needs_input {
        let prompt = q
            .option(&option)
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
    resp.option_id = Some(option);
    Asked::Answer(resp)
}
