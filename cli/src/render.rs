//! One readable line per journal event, for people watching a run on stderr.

use delta_protocol::{ActionStatus, Event, JournalEvent, PlanTask};

fn short(s: &str, n: usize) -> String {
    let one_line = s.trim().replace('\n', " | ");
    if one_line.chars().count() > n {
        format!("{}…", one_line.chars().take(n).collect::<String>())
    } else {
        one_line
    }
}

/// The line shown for `e`, or `None` for events people need not see.
pub fn line(e: &JournalEvent) -> Option<String> {
    Some(match &e.event {
        Event::EngineStart(s) => format!(
            "[start] run {} (agent {}, attempt {})",
            s.run_id, s.agent, s.attempt
        ),
        Event::Thought(t) if !t.content.trim().is_empty() => {
            format!("[think] {}", short(&t.content, 160))
        }
        Event::Thought(_) => return None,
        Event::Plan(p) => {
            let tasks: Vec<String> = p.tasks.iter().map(PlanTask::line).collect();
            format!("[plan]  {} (risk {:?})", tasks.join("; "), p.risk_level)
        }
        Event::ActionRequest(a) => {
            format!("[call]  {} {}", a.tool, short(&a.args.to_string(), 120))
        }
        Event::ActionResult(r) => {
            let tag = match r.status {
                ActionStatus::Success => "ok",
                ActionStatus::Error => "ERROR",
                ActionStatus::Skipped => "skipped",
                ActionStatus::Rejected => "rejected",
            };
            format!(
                "[{tag}] ({}ms) {}",
                r.duration_ms,
                short(&r.observation_content, 160)
            )
        }
        Event::HumanInputRequest(q) => format!("[ask]   {}", short(&q.prompt, 160)),
        Event::HumanInputReceived(r) => format!(
            "[answer] from {} via {:?}{}",
            crate::show::who(&r.responder),
            r.responder.via,
            r.option_id
                .as_ref()
                .map(|o| format!(": option {o}"))
                .unwrap_or_default()
        ),
        Event::HumanVote(v) => format!(
            "[vote]  {} by {} via {:?}: option {}",
            match v.ballot {
                delta_protocol::Ballot::Approve => "approve",
                delta_protocol::Ballot::Reject => "reject",
            },
            v.responder.id,
            v.responder.via,
            v.option_id
        ),
        Event::Escalated(x) => format!(
            "[escalate] step {} of {} on {}{}",
            x.step,
            x.of,
            x.request_id,
            escalation_what(&x.what)
        ),
        Event::SystemMessage(m) => {
            format!(
                "[{}] {}",
                format!("{:?}", m.level).to_lowercase(),
                m.content
            )
        }
        Event::EngineEnd(end) => format!("[end]   {}", end.status),
    })
}

/// What an escalation step did, as `: reminded, added group:oncall, applied the default`.
pub fn escalation_what(s: &delta_protocol::EscalationStep) -> String {
    let mut parts = vec![];
    if s.remind {
        parts.push("reminded".to_owned());
    }
    if !s.add_responders.is_empty() {
        parts.push(format!("added {}", s.add_responders.join(", ")));
    }
    if s.apply_default {
        parts.push("applied the default".to_owned());
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join(", "))
    }
}
