//! How the gateway's JSON is shown to people by the operator commands. Everything here reads
//! the API's documents (PROTOCOL.md §6) and returns text; nothing talks to the network.

use chrono::{DateTime, Local, Utc};
use serde_json::Value;

use delta_protocol::{
    ActionStatus, Event, InteractionRequest, InteractionType, JournalEvent, OptionAction, PlanTask,
};

use crate::table::{ago, short, table, until};

/// A timestamp field of a document, if it has one.
pub fn time(v: &Value) -> Option<DateTime<Utc>> {
    v.as_str()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|t| t.with_timezone(&Utc))
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

/// `delta runs ls`: RUN, AGENT, STATUS, AGE, TASK.
pub fn runs_table(runs: &[Value], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                text(r, "run_id").to_owned(),
                text(r, "agent").to_owned(),
                text(r, "status").to_owned(),
                time(&r["created_at"])
                    .map(|t| ago(t, now))
                    .unwrap_or_default(),
                short(text(r, "task"), 50),
            ]
        })
        .collect();
    table(&["RUN", "AGENT", "STATUS", "AGE", "TASK"], &rows)
}

/// `delta pending ls`: REQUEST, AGENT, TYPE, AGE, EXPIRES IN, PROMPT.
pub fn pending_table(items: &[Value], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|ix| {
            vec![
                text(ix, "request_id").to_owned(),
                text(ix, "agent").to_owned(),
                text(ix, "type").to_owned(),
                time(&ix["created_at"])
                    .map(|t| ago(t, now))
                    .unwrap_or_default(),
                time(&ix["expires_at"])
                    .map(|t| until(t, now))
                    .unwrap_or_else(|| "-".into()),
                short(ix["request"]["prompt"].as_str().unwrap_or(""), 60),
            ]
        })
        .collect();
    table(
        &["REQUEST", "AGENT", "TYPE", "AGE", "EXPIRES IN", "PROMPT"],
        &rows,
    )
}

/// `delta dlq ls`: SEQ, AGENT, RUN, RUN STATUS, AGE, REASON.
pub fn dlq_table(letters: &[Value], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|l| {
            let status = match (l["run_status"].as_str(), l["run_id"].is_null()) {
                (Some(s), _) if l["retryable"] == true => format!("{s} (retryable)"),
                (Some(s), _) => s.to_owned(),
                (None, true) => "(not a job)".to_owned(),
                (None, false) => "(no such run)".to_owned(),
            };
            vec![
                l["seq"].as_u64().map(|n| n.to_string()).unwrap_or_default(),
                text(l, "agent").to_owned(),
                text(l, "run_id").to_owned(),
                status,
                time(&l["dead_lettered_at"])
                    .map(|t| ago(t, now))
                    .unwrap_or_default(),
                short(text(l, "reason"), 60),
            ]
        })
        .collect();
    table(
        &["SEQ", "AGENT", "RUN", "RUN STATUS", "AGE", "REASON"],
        &rows,
    )
}

/// `delta queue`: the JetStream figures, then the workers seen lately.
pub fn queue(q: &Value, now: DateTime<Utc>) -> String {
    let n = |k: &str| q[k].as_u64().map(|n| n.to_string()).unwrap_or_default();
    let workers = q["workers"].as_array().cloned().unwrap_or_default();
    let mut out = table(
        &[
            "PENDING",
            "IN FLIGHT",
            "REDELIVERED",
            "DEAD-LETTERED",
            "WORKERS",
        ],
        &[vec![
            n("jobs_pending"),
            n("jobs_in_flight"),
            n("jobs_redelivered"),
            n("dead_lettered"),
            workers.len().to_string(),
        ]],
    );
    if !workers.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = workers
            .iter()
            .map(|w| {
                vec![
                    text(w, "worker_id").to_owned(),
                    time(&w["last_seen"])
                        .map(|t| ago(t, now))
                        .unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(&["WORKER", "LAST SEEN"], &rows));
    }
    out
}

/// `delta runs show` (and `submit --wait`): the record's fields, then its pending question.
pub fn run(r: &Value, now: DateTime<Utc>) -> String {
    let mut s = String::new();
    let mut field = |k: &str, v: String| s.push_str(&format!("{k:<9}{v}\n"));
    field("run:", text(r, "run_id").to_owned());
    field("agent:", text(r, "agent").to_owned());
    field("status:", text(r, "status").to_owned());
    field("task:", text(r, "task").to_owned());
    if let Some(t) = time(&r["created_at"]) {
        field("created:", format!("{} ({})", local(t), ago(t, now)));
    }
    if let Some(t) = time(&r["updated_at"]) {
        field("updated:", format!("{} ({})", local(t), ago(t, now)));
    }
    if !r["input"].is_null() {
        field("input:", r["input"].to_string());
    }
    if let Some(res) = r["result"].as_str() {
        field("result:", res.to_owned());
    }
    if let Some(e) = r["error"].as_str() {
        field("error:", e.to_owned());
    }
    let ix = &r["pending_interaction"];
    if ix.is_object() {
        let rid = text(ix, "request_id");
        let mut line = format!(
            "{} {}",
            text(ix, "type"),
            short(ix["request"]["prompt"].as_str().unwrap_or(""), 80)
        );
        if let Some(t) = time(&ix["expires_at"]) {
            line.push_str(&format!(" (expires in {})", until(t, now)));
        }
        field("pending:", line);
        field("", format!("request {rid}"));
        field("", format!("see it:   delta pending show {rid}"));
        field("", format!("answer:   {}", answer_hint(ix)));
    }
    s
}

/// The command that answers this interaction view, as an example.
fn answer_hint(ix: &Value) -> String {
    let rid = text(ix, "request_id");
    let options = ix["request"]["options"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let sensitive = ix["request"]["sensitive"].as_bool().unwrap_or(false)
        || ix["request"]["input_type"] == "password";
    match options.first() {
        Some(o) => format!(
            "delta answer {rid} --option {}",
            o["option_id"].as_str().unwrap_or("ID")
        ),
        None if sensitive => format!("delta answer {rid}   (asks for it without echo)"),
        None => format!("delta answer {rid} --input TEXT"),
    }
}

fn local(t: DateTime<Utc>) -> String {
    t.with_timezone(&Local)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// `delta pending show`: the question as a person reads it, then its state and how to answer.
pub fn interaction(view: &Value, now: DateTime<Utc>) -> String {
    let mut s = String::new();
    let rid = text(view, "request_id");
    let state = text(view, "state");
    s.push_str(&format!("request:  {rid} ({state})\n"));
    s.push_str(&format!(
        "run:      {} (agent {})\n",
        text(view, "run_id"),
        text(view, "agent")
    ));
    let mut asked = text(view, "type").to_owned();
    if let Some(t) = time(&view["created_at"]) {
        asked.push_str(&format!(", asked {}", ago(t, now)));
    }
    s.push_str(&format!("type:     {asked}\n"));
    let q: Option<InteractionRequest> = serde_json::from_value(view["request"].clone()).ok();
    let Some(q) = q else {
        // A request this CLI cannot read (a newer gateway?): its prompt at least.
        s.push_str(&format!(
            "\n? {}\n",
            view["request"]["prompt"].as_str().unwrap_or("")
        ));
        return s;
    };
    if let Some(e) = q.expires_at {
        let then = q
            .default_option_id
            .as_deref()
            .map(|d| format!("then the default applies: {d}"))
            .unwrap_or_else(|| "then the run fails".into());
        let left = until(e.as_datetime(), now);
        if left == "expired" {
            s.push_str(&format!(
                "expires:  expired at {} ({then})\n",
                local(e.as_datetime())
            ));
        } else {
            s.push_str(&format!("expires:  in {left} ({then})\n"));
        }
    }
    s.push('\n');
    if let Some(t) = &q.title {
        s.push_str(&format!("== {t} ==\n"));
    }
    s.push_str(&format!("? {}\n", q.prompt));
    for line in q.details.iter().flat_map(|d| d.lines()) {
        s.push_str(&format!("  {line}\n"));
    }
    let ctx = &q.context;
    if q.kind == InteractionType::ToolApproval
        && let Some(tool) = ctx.get("tool").and_then(Value::as_str)
    {
        s.push_str(&format!("  tool:    {tool}\n"));
    }
    if let Some(cmd) = ctx.get("command_line").and_then(Value::as_str) {
        s.push_str(&format!("  command: {cmd}\n"));
    }
    if let Some(args) = ctx.get("args").filter(|a| a.is_object()) {
        s.push_str(&format!("  args:    {args}\n"));
    }
    if q.details.is_none()
        && let Some(plan) = ctx
            .get("plan")
            .and_then(|p| serde_json::from_value::<Vec<PlanTask>>(p.clone()).ok())
    {
        s.push_str("  plan:\n");
        for t in plan {
            s.push_str(&format!("    {}\n", t.line()));
        }
    }
    if let Some(risk) = ctx.get("risk_level").and_then(Value::as_str) {
        let why = ctx
            .get("dangerous_because")
            .and_then(Value::as_str)
            .map(|w| format!(" ({w})"))
            .unwrap_or_default();
        s.push_str(&format!("  risk:    {risk}{why}\n"));
    }
    if q.is_sensitive() {
        s.push_str("  sensitive: the answer is asked for hidden and never shown\n");
    }
    if !q.options.is_empty() {
        s.push_str("options:\n");
    }
    for (i, o) in q.options.iter().enumerate() {
        let mut line = format!("  {}) {} [{}]", i + 1, o.label, o.option_id);
        if let Some(d) = &o.description {
            line.push_str(&format!(" - {d}"));
        }
        if o.is_dangerous {
            line.push_str("  !! dangerous");
        }
        if o.is_default || q.default_option_id.as_deref() == Some(o.option_id.as_str()) {
            line.push_str("  (default)");
        }
        if o.requires_input {
            let p = o.input_prompt.as_deref().unwrap_or("text");
            line.push_str(&format!("  (needs --input: {p})"));
        }
        s.push_str(&line);
        s.push('\n');
    }
    match state {
        "PENDING" => {
            s.push_str(&format!("\nanswer:   {}\n", answer_hint(view)));
            let approve = q
                .options
                .iter()
                .find(|o| o.action == OptionAction::ApproveAndExecute);
            if q.kind == InteractionType::ToolApproval
                && ctx.contains_key("args")
                && let Some(o) = approve
            {
                s.push_str(&format!(
                    "          with edited args: delta answer {rid} --option {} --data '{{\"args\": {{…}}}}'\n",
                    o.option_id
                ));
            }
        }
        _ => {
            let r = &view["response"];
            let mut line = format!("\n{}", state.to_lowercase());
            if r.is_object() {
                line.push_str(&format!(
                    " by {} via {}",
                    text(&r["responder"], "id"),
                    text(&r["responder"], "via")
                ));
            }
            if let Some(t) = time(&view["answered_at"]) {
                line.push_str(&format!(" {}", ago(t, now)));
            }
            if let Some(o) = r["option_id"].as_str() {
                line.push_str(&format!(": option {o}"));
            }
            if let Some(i) = r["input"].as_str() {
                line.push_str(&format!(", input {}", short(i, 80)));
            }
            s.push_str(&line);
            s.push('\n');
        }
    }
    s
}

/// `delta runs journal`: `seq  time  TYPE  summary`, one line per event.
pub fn journal_line(e: &Value) -> String {
    let seq = e["seq"].as_u64().unwrap_or(0);
    let at = time(&e["timestamp"])
        .map(|t| t.with_timezone(&Local).format("%H:%M:%S").to_string())
        .unwrap_or_default();
    let kind = text(e, "type");
    let summary = serde_json::from_value::<JournalEvent>(e.clone())
        .map(|je| summary(&je.event))
        .unwrap_or_default();
    format!("{seq:>4}  {at}  {kind:<20}  {summary}")
        .trim_end()
        .to_owned()
}

fn summary(e: &Event) -> String {
    match e {
        Event::EngineStart(s) => format!("worker {}, attempt {}", s.worker, s.attempt),
        Event::Thought(t) => short(&t.content, 100),
        Event::Plan(p) => {
            let tasks: Vec<String> = p.tasks.iter().map(PlanTask::line).collect();
            short(&tasks.join("; "), 100)
        }
        Event::ActionRequest(a) => format!("{} {}", a.tool, short(&a.args.to_string(), 80)),
        Event::ActionResult(r) => {
            let tag = match r.status {
                ActionStatus::Success => "ok",
                ActionStatus::Error => "error",
                ActionStatus::Skipped => "skipped",
                ActionStatus::Rejected => "rejected",
            };
            format!(
                "{tag} ({}ms) {}",
                r.duration_ms,
                short(&r.observation_content, 80)
            )
        }
        Event::HumanInputRequest(q) => format!("{} {}", q.request_id, short(&q.prompt, 80)),
        Event::HumanInputReceived(r) => {
            let via = serde_json::to_value(r.responder.via)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let mut s = format!("from {} via {via}", r.responder.id);
            if let Some(o) = &r.option_id {
                s.push_str(&format!(": option {o}"));
            }
            if let Some(i) = &r.input {
                s.push_str(&format!(", input {}", short(i, 60)));
            }
            if let Some(edits) = &r.edited_args {
                s.push_str(&format!(", edited args: {}", short(&edits_line(edits), 80)));
            }
            s
        }
        Event::SystemMessage(m) => format!(
            "{}: {}",
            format!("{:?}", m.level).to_lowercase(),
            short(&m.content, 100)
        ),
        Event::EngineEnd(end) => {
            let mut s = end.status.to_string();
            if let Some(r) = &end.result {
                s.push_str(&format!(": {}", short(r, 80)));
            }
            if let Some(e) = &end.error {
                s.push_str(&format!(": {}", short(e, 80)));
            }
            s
        }
    }
}

/// `edited_args` (`{"changed": {k: {"from", "to"}}, "added": {k: v}, "removed": [k]}`) as
/// `env: "production" → "prod-eu", +region: "eu", -dry_run`.
fn edits_line(edits: &Value) -> String {
    let mut parts = vec![];
    for (k, d) in edits["changed"].as_object().into_iter().flatten() {
        parts.push(format!("{k}: {} → {}", d["from"], d["to"]));
    }
    for (k, v) in edits["added"].as_object().into_iter().flatten() {
        parts.push(format!("+{k}: {v}"));
    }
    for k in edits["removed"].as_array().into_iter().flatten() {
        parts.push(format!("-{}", k.as_str().unwrap_or("?")));
    }
    parts.join(", ")
}

/// The last line of `--follow`: the run's final status.
pub fn final_status(v: &Value) -> String {
    let mut s = format!("run {}", text(v, "status"));
    if let Some(r) = v["result"].as_str() {
        s.push_str(&format!(": {r}"));
    }
    if let Some(e) = v["error"].as_str() {
        s.push_str(&format!(": {e}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_journal_line_has_seq_time_type_and_summary() {
        let e = json!({
            "seq": 7, "timestamp": "2026-01-02T03:04:05.000000Z", "type": "ACTION_REQUEST",
            "payload": {"action_id": "a1", "tool": "echo", "args": {"text": "hi"}}
        });
        let line = journal_line(&e);
        assert!(line.starts_with("   7  "), "{line}");
        assert!(line.contains("ACTION_REQUEST"), "{line}");
        assert!(line.ends_with(r#"echo {"text":"hi"}"#), "{line}");
    }

    #[test]
    fn edited_args_read_as_changes() {
        let e = json!({"changed": {"env": {"from": "production", "to": "prod-eu"}},
                       "added": {"region": "eu"}, "removed": ["dry_run"]});
        assert_eq!(
            edits_line(&e),
            r#"env: "production" → "prod-eu", +region: "eu", -dry_run"#
        );
    }

    #[test]
    fn an_unknown_event_still_shows_its_seq_and_type() {
        let e = json!({"seq": 3, "timestamp": "x", "type": "SOMETHING_NEW", "payload": {}});
        assert_eq!(journal_line(&e), "   3    SOMETHING_NEW");
    }
}
