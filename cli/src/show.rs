//! How the gateway's replies are shown to people by the operator commands. Everything here reads
//! the API's types (`delta-api`, docs/protocol.md §6) and returns text; nothing talks to the network.

use chrono::{DateTime, Local, Utc};
use serde_json::Value;

use delta_api::{
    DeadLetterView, InteractionState, InteractionView, QueueStats, Run, RunDetail, RunEnded,
};
use delta_protocol::{
    ActionStatus, Event, InteractionType, JournalEvent, OptionAction, PlanTask, Timestamp,
};

use crate::table::{ago, short, table, until};

/// A timestamp as chrono's.
pub fn time(t: Timestamp) -> DateTime<Utc> {
    t.as_datetime()
}

/// The contract's spelling of a value that serializes to a string (`WAITING_FOR_INPUT`, `cli`).
fn spelled<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// `delta runs ls`: RUN, AGENT, STATUS, AGE, TASK.
pub fn runs_table(runs: &[Run], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|r| {
            vec![
                r.run_id.to_string(),
                r.agent.clone(),
                r.status.to_string(),
                ago(time(r.created_at), now),
                short(&r.task, 50),
            ]
        })
        .collect();
    table(&["RUN", "AGENT", "STATUS", "AGE", "TASK"], &rows)
}

/// `delta pending ls`: REQUEST, AGENT, TYPE, AGE, EXPIRES IN, PROMPT.
pub fn pending_table(items: &[InteractionView], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|ix| {
            vec![
                ix.request_id.to_string(),
                ix.agent.clone(),
                spelled(&ix.kind),
                ago(time(ix.created_at), now),
                ix.expires_at
                    .map(|t| until(time(t), now))
                    .unwrap_or_else(|| "-".into()),
                human_state(ix, now),
                short(&ix.request.prompt, 60),
            ]
        })
        .collect();
    table(
        &[
            "REQUEST",
            "AGENT",
            "TYPE",
            "AGE",
            "EXPIRES IN",
            "CLAIM / VOTES",
            "PROMPT",
        ],
        &rows,
    )
}

/// Who holds a claim on a pending question and where its votes stand, in a few words:
/// `alice (4m)`, `1/2 approvals`, or `-`.
pub fn human_state(ix: &InteractionView, now: DateTime<Utc>) -> String {
    let mut parts = vec![];
    if let Some(c) = &ix.claim {
        parts.push(format!("{} ({})", c.by, until(time(c.until), now)));
    }
    if let Some(t) = &ix.tally {
        let mut v = format!("{}/{} approvals", t.approvals, t.needed);
        if t.rejections > 0 {
            v.push_str(&format!(", {} rejected", t.rejections));
        }
        parts.push(v);
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join("; ")
    }
}

/// `delta delegations ls`: ID, FROM, TO, UNTIL, IN, REASON.
pub fn delegations_table(items: &[delta_api::Delegation], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|d| {
            vec![
                d.id.clone(),
                d.from.clone(),
                d.to.clone(),
                local(time(d.until)),
                until(time(d.until), now),
                short(d.reason.as_deref().unwrap_or("-"), 50),
            ]
        })
        .collect();
    table(&["ID", "FROM", "TO", "UNTIL", "IN", "REASON"], &rows)
}

/// `delta dlq ls`: SEQ, AGENT, RUN, RUN STATUS, AGE, REASON.
pub fn dlq_table(letters: &[DeadLetterView], now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|l| {
            let status = match (l.run_status, l.run_id) {
                (Some(s), _) if l.retryable => format!("{s} (retryable)"),
                (Some(s), _) => s.to_string(),
                (None, None) => "(not a job)".to_owned(),
                (None, Some(_)) => "(no such run)".to_owned(),
            };
            vec![
                l.seq.to_string(),
                l.agent.clone(),
                l.run_id.map(|r| r.to_string()).unwrap_or_default(),
                status,
                ago(time(l.dead_lettered_at), now),
                short(&l.reason, 60),
            ]
        })
        .collect();
    table(
        &["SEQ", "AGENT", "RUN", "RUN STATUS", "AGE", "REASON"],
        &rows,
    )
}

/// `delta queue`: the JetStream figures, then the workers seen lately.
pub fn queue(q: &QueueStats, now: DateTime<Utc>) -> String {
    let workers = &q.workers;
    let mut out = table(
        &[
            "PENDING",
            "IN FLIGHT",
            "REDELIVERED",
            "DEAD-LETTERED",
            "WORKERS",
        ],
        &[vec![
            q.jobs_pending.to_string(),
            q.jobs_in_flight.to_string(),
            q.jobs_redelivered.to_string(),
            q.dead_lettered.to_string(),
            workers.len().to_string(),
        ]],
    );
    if !workers.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = workers
            .iter()
            .map(|w| {
                vec![
                    w.worker_id.clone(),
                    w.last_seen.map(|t| ago(time(t), now)).unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(&["WORKER", "LAST SEEN"], &rows));
    }
    out
}

/// `delta runs show` (and `submit --wait`): the record's fields, then its pending question.
pub fn run(detail: &RunDetail, now: DateTime<Utc>) -> String {
    let r = &detail.run;
    let mut s = String::new();
    let mut field = |k: &str, v: String| s.push_str(&format!("{k:<9}{v}\n"));
    field("run:", r.run_id.to_string());
    field("agent:", r.agent.clone());
    field("status:", r.status.to_string());
    field("task:", r.task.clone());
    let t = time(r.created_at);
    field("created:", format!("{} ({})", local(t), ago(t, now)));
    let t = time(r.updated_at);
    field("updated:", format!("{} ({})", local(t), ago(t, now)));
    if let Some(input) = r.input.as_ref().filter(|i| !i.is_null()) {
        field("input:", input.to_string());
    }
    if let Some(res) = &r.result {
        field("result:", res.clone());
    }
    if let Some(e) = &r.error {
        field("error:", e.clone());
    }
    if let Some(ix) = &detail.pending_interaction {
        let rid = ix.request_id;
        let mut line = format!("{} {}", spelled(&ix.kind), short(&ix.request.prompt, 80));
        if let Some(t) = ix.expires_at {
            line.push_str(&format!(" (expires in {})", until(time(t), now)));
        }
        field("pending:", line);
        field("", format!("request {rid}"));
        field("", format!("see it:   delta pending show {rid}"));
        field("", format!("answer:   {}", answer_hint(ix)));
    }
    s
}

/// The command that answers this interaction view, as an example.
fn answer_hint(ix: &InteractionView) -> String {
    let rid = ix.request_id;
    let sensitive = ix.request.is_sensitive();
    if ix.request.response_schema.is_some() && sensitive {
        return format!("delta answer {rid} --data -   (reads the JSON from stdin, without echo)");
    }
    if ix.request.response_schema.is_some() {
        return format!(
            "delta answer {rid} --data {}",
            crate::table::shell_word(&crate::mailbox::typed_example(&ix.request))
        );
    }
    match ix.request.options.first() {
        Some(o) => format!(
            "delta answer {rid} --option {}",
            crate::table::shell_word(&o.option_id)
        ),
        None if sensitive => format!("delta answer {rid}   (asks for it without echo)"),
        None => format!("delta answer {rid} --input TEXT"),
    }
}

pub fn local(t: DateTime<Utc>) -> String {
    t.with_timezone(&Local)
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

/// `delta pending show`: the question as a person reads it, then its state and how to answer.
pub fn interaction(view: &InteractionView, now: DateTime<Utc>) -> String {
    let mut s = String::new();
    let rid = view.request_id;
    let state = spelled(&view.state);
    s.push_str(&format!("request:  {rid} ({state})\n"));
    s.push_str(&format!(
        "run:      {} (agent {})\n",
        view.run_id, view.agent
    ));
    let asked = format!(
        "{}, asked {}",
        spelled(&view.kind),
        ago(time(view.created_at), now)
    );
    s.push_str(&format!("type:     {asked}\n"));
    let q = &view.request;
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
    if let Some(c) = &view.claim {
        s.push_str(&format!(
            "claimed:  by {} until {} (in {})\n",
            c.by,
            local(time(c.until)),
            until(time(c.until), now)
        ));
    }
    if let Some(t) = &view.tally {
        s.push_str(&format!("votes:    {}\n", t.summary()));
    }
    if let Some(a) = &q.approvals {
        let of = if a.of.is_empty() {
            "anyone who may answer".to_owned()
        } else {
            a.of.join(", ")
        };
        let mut rule = format!("approvals: {} of {of}", a.min);
        if a.veto {
            rule.push_str("; one rejection decides");
        }
        if a.exclude_requester {
            rule.push_str("; not the run's submitter");
        }
        s.push_str(&format!("{rule}\n"));
    }
    s.push_str(&format!("hash:     {}\n", view.request_hash));
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
    if let Some(rule) = ctx.get("policy_rule").and_then(Value::as_str) {
        s.push_str(&format!(
            "  policy:  asked because of rule `{rule}` (policy.yaml)\n"
        ));
    }
    if q.is_sensitive() {
        s.push_str("  sensitive: the answer is asked for hidden and never shown\n");
    }
    if !q.options.is_empty() {
        s.push_str("options:\n");
    }
    let fields = crate::mailbox::typed_fields(q);
    if !fields.is_empty() {
        s.push_str("fields (answer with --data, a JSON object):\n");
        for f in fields {
            s.push_str(&format!("  {f}\n"));
        }
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
    match view.state {
        InteractionState::Pending => {
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
                if ctx.get("grantable") == Some(&Value::Bool(true)) {
                    s.push_str(&format!(
                        "          and always allow it: delta answer {rid} --option {} --grant run|agent\n",
                        o.option_id
                    ));
                }
            }
        }
        _ => {
            let r = view.response.as_ref();
            let mut line = format!("\n{}", state.to_lowercase());
            if let Some(r) = r {
                line.push_str(&format!(
                    " by {} via {}",
                    r.responder.id,
                    spelled(&r.responder.via)
                ));
            }
            if let Some(t) = view.answered_at {
                line.push_str(&format!(" {}", ago(time(t), now)));
            }
            if let Some(o) = r.and_then(|r| r.option_id.as_deref()) {
                line.push_str(&format!(": option {o}"));
            }
            if let Some(i) = r.and_then(|r| r.input.as_deref()) {
                line.push_str(&format!(", input {}", short(i, 80)));
            }
            s.push_str(&line);
            s.push('\n');
        }
    }
    s
}

/// `delta runs journal`: `seq  time  TYPE  summary`, one line per event.
pub fn journal_line(e: &JournalEvent) -> String {
    let at = time(e.timestamp)
        .with_timezone(&Local)
        .format("%H:%M:%S")
        .to_string();
    line(e.seq, &at, e.event.type_name(), &summary(&e.event))
}

/// A journal event this CLI cannot read (a newer gateway's event type, say, on a live stream):
/// its `seq` and `type` at least, read from the raw JSON.
pub fn unknown_journal_line(e: &Value) -> String {
    let seq = e.get("seq").and_then(Value::as_u64).unwrap_or(0);
    let kind = e.get("type").and_then(Value::as_str).unwrap_or("");
    line(seq, "", kind, "")
}

fn line(seq: u64, at: &str, kind: &str, summary: &str) -> String {
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
            let via = spelled(&r.responder.via);
            let mut s = format!("from {} via {via}", who(&r.responder));
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
        Event::HumanVote(v) => {
            let side = match v.ballot {
                delta_protocol::Ballot::Approve => "approves",
                delta_protocol::Ballot::Reject => "rejects",
            };
            let mut s = format!(
                "{} {side} via {} (option {})",
                who(&v.responder),
                spelled(&v.responder.via),
                v.option_id
            );
            if let Some(f) = &v.feedback {
                s.push_str(&format!(": {}", short(f, 60)));
            }
            s
        }
        Event::Escalated(x) => format!(
            "step {} of {} (after {}){}",
            x.step,
            x.of,
            humantime::format_duration(x.what.after),
            crate::render::escalation_what(&x.what)
        ),
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
pub fn final_status(v: &RunEnded) -> String {
    let mut s = format!("run {}", v.status);
    if let Some(r) = &v.result {
        s.push_str(&format!(": {r}"));
    }
    if let Some(e) = &v.error {
        s.push_str(&format!(": {e}"));
    }
    s
}

/// A responder's id, with whom they answered for: `bob on behalf of alice`.
pub fn who(r: &delta_protocol::Responder) -> String {
    match &r.on_behalf_of {
        Some(from) => format!("{} on behalf of {from}", r.id),
        None => r.id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_journal_line_has_seq_time_type_and_summary() {
        let e: JournalEvent = serde_json::from_value(json!({
            "seq": 7, "timestamp": "2026-01-02T03:04:05.000000Z", "type": "ACTION_REQUEST",
            "payload": {"action_id": "a1", "tool": "echo", "args": {"text": "hi"}}
        }))
        .expect("a journal event");
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
        assert_eq!(unknown_journal_line(&e), "   3    SOMETHING_NEW");
    }
}
