//! A question as Block Kit, built with slack-morphism's types: what the web inbox's card shows
//! (docs/inbox.md), within Slack's limits. Everything a question says comes from an agent, a
//! model or a tool's arguments, so every piece of it put in `mrkdwn` is escaped (`&`, `<`, `>`):
//! nothing in it can become a link, a mention or a `<!channel>`.

use std::fmt::Write as _;

use delta_protocol::human::{Claim, Tally};
use delta_protocol::{
    InteractionOption, InteractionRequest, InteractionState, OptionAction, Resolved, Via,
};
use serde_json::Value;
use slack_morphism::prelude::*;

/// Slack's limits: a section's text, a header, a button's text, a button's value.
const SECTION_MAX: usize = 3000;
const HEADER_MAX: usize = 150;
const BUTTON_TEXT_MAX: usize = 75;
const MAX_BUTTONS: usize = 20;
/// The fallback `text` of a message (notifications).
const TEXT_MAX: usize = 3000;

/// What the buttons' `action_id`s start with: answer at once, or open a modal for text.
pub const ACT_ANSWER: &str = "delta.answer";
pub const ACT_MODAL: &str = "delta.modal";
pub const ACT_EDIT: &str = "delta.edit";

/// `&`, `<` and `>` as Slack's entities: the three characters mrkdwn reads as markup.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

/// At most `max` characters, `…` at the end when cut (on a character boundary).
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Escaped text, cut to `max` characters without cutting an entity in two.
fn escaped(s: &str, max: usize) -> String {
    let mut out = String::new();
    let mut count = 0;
    for c in s.chars() {
        let piece = match c {
            '&' => "&amp;".to_owned(),
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            c => c.to_string(),
        };
        let n = piece.chars().count();
        if count + n > max.saturating_sub(1) {
            out.push('…');
            return out;
        }
        count += n;
        out.push_str(&piece);
    }
    out
}

/// Whether [`escaped`] cuts `s` at `max`.
fn is_cut(s: &str, max: usize) -> bool {
    escape(s).chars().count() > max.saturating_sub(1)
}

/// A code block of `s`, escaped, with no ``` inside to end it early, cut to fit.
fn code_block(s: &str, max: usize) -> String {
    let inner = s.replace("```", "`\u{200b}``");
    format!("```{}```", escaped(&inner, max.saturating_sub(6)))
}

/// Escaped text as `mrkdwn`, `verbatim`: Slack then makes no link of a bare URL or a channel
/// name in it (the agent's text could otherwise show a live link in an approval message).
pub fn mrkdwn(text: String) -> SlackBlockText {
    SlackBlockText::MarkDown(SlackBlockMarkDownText::new(text).with_verbatim(true))
}

fn section(text: String) -> SlackBlock {
    SlackSectionBlock::new()
        .with_text(mrkdwn(truncate(&text, SECTION_MAX)))
        .into()
}

fn context(text: String) -> SlackBlock {
    let text = SlackBlockMarkDownText::new(truncate(&text, SECTION_MAX)).with_verbatim(true);
    SlackContextBlock::new(vec![SlackContextBlockElement::MarkDown(text)]).into()
}

/// Where a question stands, as the bridge last heard.
#[derive(Clone, Debug, Default)]
pub struct Standing<'a> {
    pub tally: Option<&'a Tally>,
    pub claim: Option<&'a Claim>,
    pub settled: Option<&'a Resolved>,
    /// Who escalation steps let answer besides `allowed_responders`.
    pub added: &'a [String],
}

/// Whether an option is one to think twice about: red, with a confirmation.
pub fn is_dangerous(o: &InteractionOption) -> bool {
    o.is_dangerous
        || matches!(
            o.action,
            OptionAction::Terminate | OptionAction::ApproveAndExecute
        )
}

/// Whether picking `o` needs text first (a modal): its own input, a typed answer (a
/// `response_schema`).
pub fn needs_modal(q: &InteractionRequest, o: &InteractionOption) -> bool {
    o.requires_input || q.response_schema.is_some()
}

fn via_name(v: Via) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// "12 s", "3 min", "2 h" between two instants.
fn span(secs: i64) -> String {
    let secs = secs.max(0);
    match secs {
        0..=119 => format!("{secs} s"),
        120..=7199 => format!("{} min", secs / 60),
        _ => format!("{} h", secs / 3600),
    }
}

/// The line that replaces the buttons once the question is settled.
pub fn settled_line(q: &InteractionRequest, r: &Resolved) -> String {
    let after = span((r.resolved_at.micros() - q.timestamp.micros()) / 1_000_000);
    let option = r
        .option_id
        .as_deref()
        .map(|o| {
            let label = q.option(o).map(|x| x.label.as_str()).unwrap_or(o);
            format!(" — *{}*", escaped(label, 200))
        })
        .unwrap_or_default();
    match r.state {
        InteractionState::Answered | InteractionState::Pending => {
            let mut who = format!("*{}*", escaped(&r.responder.id, 200));
            if let Some(b) = &r.responder.on_behalf_of {
                let _ = write!(who, " on behalf of *{}*", escaped(b, 200));
            }
            format!(
                ":white_check_mark: Answered by {who} via {}{option}, {after} after it was asked.",
                via_name(r.responder.via)
            )
        }
        InteractionState::Expired => match &r.option_id {
            Some(_) => format!(":hourglass: Expired after {after}: its default applied{option}."),
            None => format!(":hourglass: Expired after {after} with no default: the run fails."),
        },
        InteractionState::Cancelled => {
            format!(":no_entry_sign: Cancelled: the run was cancelled after {after}.")
        }
    }
}

/// The rule line: approvals and where the votes stand, and who holds a claim.
fn rule_line(q: &InteractionRequest, s: &Standing<'_>) -> Option<String> {
    let mut parts = vec![];
    if let Some(a) = &q.approvals {
        let summary = match s.tally {
            Some(t) => t.summary(),
            None => format!("0 of {} approvals", a.min),
        };
        let mut rule = format!(":ballot_box_with_ballot: Needs {} approval(s)", a.min);
        if !a.of.is_empty() {
            let _ = write!(rule, " from {}", escaped(&a.of.join(", "), 300));
        }
        if a.veto {
            rule.push_str(", one rejection decides");
        }
        parts.push(format!("{rule}: {}", escaped(&summary, 500)));
    }
    if let Some(c) = s.claim {
        parts.push(format!(
            ":lock: Claimed by *{}* until <!date^{}^{{time}}|{}>",
            escaped(&c.by, 200),
            c.until.micros() / 1_000_000,
            c.until.as_datetime().format("%H:%M UTC")
        ));
    }
    if !q.allowed_responders.is_empty() {
        let mut who = q.allowed_responders.clone();
        who.extend(
            s.added
                .iter()
                .filter(|a| !who.contains(a))
                .cloned()
                .collect::<Vec<_>>(),
        );
        parts.push(format!(
            ":bust_in_silhouette: Who may answer: {}",
            escaped(&who.join(", "), 300)
        ));
    }
    (!parts.is_empty()).then(|| parts.join("\n"))
}

/// `s` on one line: line breaks as spaces.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// The plan of a plan confirmation, as a numbered list (each step's tool too, as the inbox
/// shows it).
fn plan_lines(plan: &Value) -> Option<(String, bool)> {
    let tasks = plan.get("tasks")?.as_array()?;
    let mut out = String::from("*Plan*\n");
    let mut whole = true;
    for (i, t) in tasks.iter().enumerate() {
        let index = t
            .get("index")
            .and_then(Value::as_u64)
            .unwrap_or(i as u64 + 1);
        // One line each: a line break or list markup in the agent's text would show as more
        // steps (or another risk) than the plan has.
        let desc = one_line(t.get("description").and_then(Value::as_str).unwrap_or(""));
        let risk = one_line(t.get("risk").and_then(Value::as_str).unwrap_or(""));
        let tool = t.get("tool").and_then(Value::as_str).map(one_line);
        whole &= !is_cut(&desc, 300);
        let _ = write!(out, "{index}. {}", escaped(&desc, 300));
        if let Some(tool) = tool.filter(|t| !t.is_empty()) {
            let tool = tool.replace('`', "'");
            whole &= !is_cut(&tool, 100);
            let _ = write!(out, " `{}`", escaped(&tool, 100));
        }
        let risk = risk.replace('_', " ");
        whole &= !is_cut(&risk, 20);
        let _ = writeln!(out, " _({})_", escaped(&risk, 20));
    }
    Some((out, whole))
}

/// How a button names its option: the option's id, or `#<index>` for an id too long for Slack's
/// `action_id` (255) or that starts with `#` itself.
pub fn option_key(q: &InteractionRequest, option_id: &str) -> String {
    let index = q.options.iter().position(|o| o.option_id == option_id);
    match index {
        Some(i) if option_id.len() > 100 || option_id.starts_with('#') => format!("#{i}"),
        _ => option_id.to_owned(),
    }
}

/// The option id a button's key names (see [`option_key`]).
pub fn option_of_key(q: &InteractionRequest, key: &str) -> String {
    key.strip_prefix('#')
        .and_then(|i| i.parse::<usize>().ok())
        .and_then(|i| q.options.get(i))
        .map(|o| o.option_id.clone())
        .unwrap_or_else(|| key.to_owned())
}

/// What a button carries for a question with no `request_hash` (asked before hashes existed).
pub const NO_HASH: &str = "-";

/// The button value: `<request_id> <request_hash> <option key>`. The hash is that of the version
/// of the question the message shows, so that a click answers what was shown: the gateway
/// refuses it as `stale` when the question changed since (docs/protocol.md §3, "What the
/// approver saw").
pub fn button_value(q: &InteractionRequest, option_id: &str) -> String {
    format!(
        "{} {} {}",
        q.request_id,
        q.request_hash.as_deref().unwrap_or(NO_HASH),
        option_key(q, option_id)
    )
}

/// What a button does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// Answer at once with the option.
    Answer,
    /// Open a modal for the option's text (or a typed answer).
    Modal,
    /// Open a modal to edit the tool call's arguments, then approve.
    Edit,
}

impl Act {
    /// The `action_id` prefix of the kind.
    pub fn prefix(self) -> &'static str {
        match self {
            Act::Answer => ACT_ANSWER,
            Act::Modal => ACT_MODAL,
            Act::Edit => ACT_EDIT,
        }
    }
}

/// The version of the question a click or a modal was shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shown {
    /// Its `request_hash`.
    Hash(String),
    /// A question with no `request_hash`.
    NoHash,
    /// Not known: a button or modal of a bridge from before buttons carried the hash.
    Unknown,
}

impl Shown {
    /// From a value's hash field (`""`: not there).
    pub fn parse(token: &str) -> Shown {
        match token {
            "" => Shown::Unknown,
            NO_HASH => Shown::NoHash,
            h => Shown::Hash(h.to_owned()),
        }
    }

    /// As a value's hash field.
    pub fn token(&self) -> &str {
        match self {
            Shown::Hash(h) => h,
            Shown::NoHash => NO_HASH,
            Shown::Unknown => "",
        }
    }

    /// The `request_hash` an answer echoes: the one shown; for a button older than the hash
    /// in it, the question's as the bridge holds it (what such buttons always sent).
    pub fn echo(&self, current: Option<&str>) -> Option<String> {
        match self {
            Shown::Hash(h) => Some(h.clone()),
            Shown::NoHash => None,
            Shown::Unknown => current.map(str::to_owned),
        }
    }
}

/// A click on one of the bridge's buttons, read from its `action_id` and `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Click {
    pub act: Act,
    pub request_id: delta_protocol::RequestId,
    pub shown: Shown,
    /// The option's key ([`option_key`]; empty: none).
    pub key: String,
}

fn is_hash(s: &str) -> bool {
    s == NO_HASH || (s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Reads a click; `None` for a button that is not the bridge's. The kind comes from the
/// `action_id`'s known prefixes (an option id may contain `.`), the rest from the value
/// (`<request_id> <request_hash> <key>`, or `<request_id> <key>` from an older bridge).
pub fn parse_click(action_id: &str, value: &str) -> Option<Click> {
    let act = [Act::Answer, Act::Modal, Act::Edit].into_iter().find(|a| {
        action_id
            .strip_prefix(a.prefix())
            .is_some_and(|rest| rest.starts_with('.'))
    })?;
    let (rid, rest) = value.split_once(' ')?;
    let request_id = rid.parse().ok()?;
    let (shown, key) = match rest.split_once(' ') {
        Some((h, key)) if is_hash(h) => (Shown::parse(h), key),
        _ => (Shown::Unknown, rest),
    };
    Some(Click {
        act,
        request_id,
        shown,
        key: key.to_owned(),
    })
}

fn button(q: &InteractionRequest, o: &InteractionOption) -> SlackActionBlockElement {
    let act = if needs_modal(q, o) {
        ACT_MODAL
    } else {
        ACT_ANSWER
    };
    let shown = if o.label.trim().is_empty() {
        &o.option_id
    } else {
        &o.label
    };
    let mut label = truncate(shown, BUTTON_TEXT_MAX);
    if needs_modal(q, o) {
        label = truncate(&format!("{label}…"), BUTTON_TEXT_MAX);
    }
    let mut b = SlackBlockButtonElement::new(pt!(label))
        .with_action_id(SlackActionId::new(format!(
            "{act}.{}",
            option_key(q, &o.option_id)
        )))
        .with_value(button_value(q, &o.option_id));
    if is_dangerous(o) {
        let mut what = format!("*{}*", escaped(&o.label, 200));
        if let Some(d) = &o.description {
            let _ = write!(what, ": {}", escaped(d, 300));
        }
        if let Some(tool) = q.context.get("tool").and_then(Value::as_str) {
            let _ = write!(what, "\nTool call: `{}`", escaped(tool, 100));
        }
        b = b.with_style(SlackBlockButtonStyle::Danger).with_confirm(
            SlackBlockConfirmItem::new(
                pt!("Are you sure?"),
                mrkdwn(truncate(&what, 300)),
                pt!(truncate(&o.label, 30)),
                pt!("Cancel"),
            )
            .with_style("danger".to_owned()),
        );
    } else if o.is_default {
        b = b.with_style(SlackBlockButtonStyle::Primary);
    }
    SlackActionBlockElement::Button(b)
}

/// The blocks of a question and the message's fallback text.
pub fn question(
    q: &InteractionRequest,
    s: &Standing<'_>,
    inbox_url: Option<&str>,
) -> (Vec<SlackBlock>, String) {
    let mut blocks: Vec<SlackBlock> = vec![];
    // Nothing is shown empty: Slack refuses a block with no text (and the whole message).
    let title = q
        .title
        .clone()
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| format!("{} asks", q.agent));
    blocks.push(SlackHeaderBlock::new(pt!(truncate(&title, HEADER_MAX))).into());
    // Whether all of what an answer is about is shown: the prompt, the details, the plan and a
    // tool call's name, arguments and danger. Anything cut, and the question is answered only in
    // the inbox: an approval in Slack would approve arguments (or a plan) no one saw, and a
    // model can pad a harmless field to push the dangerous one past the cut.
    let mut whole = !is_cut(&q.prompt, SECTION_MAX);
    blocks.push(section(escaped(&q.prompt, SECTION_MAX)));
    if let Some(d) = q.details.as_ref().filter(|d| !d.trim().is_empty()) {
        whole &= !is_cut(d, SECTION_MAX);
        blocks.push(section(escaped(d, SECTION_MAX)));
    }
    if let Some(plan_value) = q.context.get("plan") {
        match plan_lines(plan_value) {
            Some((plan, plan_whole)) => {
                whole &= plan_whole && plan.chars().count() <= SECTION_MAX;
                blocks.push(section(plan));
            }
            None => whole = false,
        }
    }
    if let Some(tool) = q.context.get("tool").and_then(Value::as_str) {
        let tool = one_line(tool).replace('`', "'");
        whole &= !is_cut(&tool, 100);
        let mut text = format!("*Tool call:* `{}`", escaped(&tool, 100));
        if let Some(args) = q.context.get("args") {
            let pretty = serde_json::to_string_pretty(args).unwrap_or_default();
            let inner = pretty.replace("```", "`\u{200b}``");
            whole &= !is_cut(&inner, SECTION_MAX - 200 - 6);
            let _ = write!(text, "\n{}", code_block(&pretty, SECTION_MAX - 200));
        }
        if let Some(why) = q.context.get("dangerous_because").and_then(Value::as_str) {
            whole &= !is_cut(why, 300);
            let _ = write!(text, "\n:warning: {}", escaped(why, 300));
        }
        whole &= text.chars().count() <= SECTION_MAX;
        blocks.push(section(text));
    }
    if let Some(rule) = rule_line(q, s) {
        blocks.push(context(rule));
    }
    let mut meta = format!(
        "Agent *{}* · run `{}` · question `{}`",
        escaped(&q.agent, 100),
        q.run_id,
        q.request_id
    );
    if let Some(e) = q.expires_at {
        let _ = write!(
            meta,
            " · expires <!date^{}^{{date_short_pretty}} {{time}}|{}>",
            e.micros() / 1_000_000,
            e.as_datetime().format("%Y-%m-%d %H:%M UTC")
        );
    }
    blocks.push(context(meta));
    let inbox_link = |text: &str| match inbox_url {
        Some(u) => format!("<{}|{text}>", escape(u)),
        None => text.to_owned(),
    };
    if let Some(r) = s.settled {
        blocks.push(section(settled_line(q, r)));
    } else if q.is_sensitive() {
        blocks.push(section(format!(
            ":closed_lock_with_key: This question is sensitive: it is never answered in Slack. Answer it in the {}.",
            inbox_link("web inbox")
        )));
    } else if !whole {
        blocks.push(section(format!(
            ":scissors: This question is longer than a Slack message holds, and part of it is cut above: it is answered only where it is shown whole, in the {}.",
            inbox_link("web inbox")
        )));
    } else {
        let mut buttons: Vec<SlackActionBlockElement> = q
            .options
            .iter()
            .take(MAX_BUTTONS - 2)
            .map(|o| button(q, o))
            .collect();
        // A tool call's arguments may be edited before approving them.
        if let (Some(approve), Some(_)) = (
            q.options
                .iter()
                .find(|o| o.action == OptionAction::ApproveAndExecute),
            q.context.get("args").filter(|a| a.is_object()),
        ) && q.response_schema.is_none()
        {
            buttons.push(SlackActionBlockElement::Button(
                SlackBlockButtonElement::new(pt!("Edit arguments…"))
                    .with_action_id(SlackActionId::new(format!(
                        "{ACT_EDIT}.{}",
                        option_key(q, &approve.option_id)
                    )))
                    .with_value(button_value(q, &approve.option_id)),
            ));
        }
        // A question with no options is answered with text (or a typed form).
        if q.options.is_empty() {
            buttons.push(SlackActionBlockElement::Button(
                SlackBlockButtonElement::new(pt!("Answer…"))
                    .with_action_id(SlackActionId::new(format!("{ACT_MODAL}.")))
                    .with_value(button_value(q, ""))
                    .with_style(SlackBlockButtonStyle::Primary),
            ));
        }
        blocks.push(
            SlackActionsBlock::new(buttons)
                .with_block_id(SlackBlockId::new(format!("delta.{}", q.request_id)))
                .into(),
        );
        if q.options.len() > MAX_BUTTONS - 2 {
            blocks.push(context(format!(
                "More options than Slack shows: see them all in the {}.",
                inbox_link("web inbox")
            )));
        }
    }
    let status = match s.settled {
        Some(r) => format!(" [{}]", r.state.as_str().to_lowercase()),
        None => String::new(),
    };
    // Notifications show the fallback text as mrkdwn too: escaped like the blocks.
    let text = escaped(&format!("{title}{status}: {}", q.prompt), TEXT_MAX);
    (blocks, text)
}

/// A reply in the question's thread for an escalation step.
pub fn escalation_line(e: &delta_protocol::human::Escalated) -> String {
    let mut out = format!(":rotating_light: Escalation step {} of {}", e.step, e.of);
    if e.what.remind {
        out.push_str(": still waiting for an answer.");
    }
    if !e.what.add_responders.is_empty() {
        let _ = write!(
            out,
            " Now also allowed to answer: {}.",
            escaped(&e.what.add_responders.join(", "), 500)
        );
    }
    if e.what.apply_default {
        out.push_str(" Its default is being applied.");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{InteractionType, RunId};
    use serde_json::json;

    /// The agent's text goes in `verbatim` mrkdwn: Slack makes no link of a bare URL or a
    /// channel name in it.
    #[test]
    fn text_blocks_are_verbatim() {
        for block in [
            section("see https://evil.example".into()),
            context("#general".into()),
        ] {
            let v = serde_json::to_value(&block).expect("json");
            let text = v
                .get("text")
                .cloned()
                .unwrap_or_else(|| v["elements"][0].clone());
            assert_eq!(text["type"], "mrkdwn", "{v}");
            assert_eq!(text["verbatim"], true, "{v}");
        }
    }

    /// A step's text cannot add steps, a risk or a code span of its own: each step is one line,
    /// its tool shown as the inbox shows it.
    #[test]
    fn a_plan_step_stays_one_step() {
        let plan = json!({"tasks": [
            {"index": 1, "description": "read config\n2. list files _(low)_", "tool": "cat`x", "risk": "high\n3. x"},
            {"index": 2, "description": "deploy <!channel>", "risk": "low"},
        ]});
        let (text, _) = plan_lines(&plan).expect("a plan");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(
            lines[1].starts_with("1. read config 2. list files"),
            "{text}"
        );
        assert!(
            lines[1].contains("`cat'x`") && lines[1].ends_with("_(high 3. x)_"),
            "{text}"
        );
        assert_eq!(lines[2], "2. deploy &lt;!channel&gt; _(low)_");
    }

    fn approval() -> InteractionRequest {
        let mut q = InteractionRequest::new(
            RunId::new(),
            "deployer",
            InteractionType::ToolApproval,
            "Deploy <!channel> & <https://evil.example|click> now?",
        );
        q.title = Some("Approve deploy".into());
        q.context.insert("tool".into(), json!("deploy"));
        q.context
            .insert("args".into(), json!({"version": "1.4.2 ``` <@U123>"}));
        let mut approve =
            InteractionOption::new("approve", "Approve", OptionAction::ApproveAndExecute);
        approve.is_default = false;
        let reject = InteractionOption::new("reject", "Reject", OptionAction::RejectWithReason);
        let mut feedback =
            InteractionOption::new("feedback", "Feedback", OptionAction::RetryWithFeedback);
        feedback.requires_input = true;
        q.options = vec![approve, reject, feedback];
        q
    }

    fn json_of(blocks: &[SlackBlock]) -> String {
        serde_json::to_string(blocks).expect("json")
    }

    #[test]
    fn untrusted_text_never_becomes_a_link_or_mention() {
        let (blocks, _) = question(&approval(), &Standing::default(), None);
        let j = json_of(&blocks);
        assert!(
            !j.contains("<!channel>") && !j.contains("<@U123>") && !j.contains("<https://evil")
        );
        assert!(j.contains("&lt;!channel&gt; &amp; &lt;https://evil.example|click&gt;"));
        // The arguments' ``` cannot close the code block early.
        assert_eq!(j.matches("```").count(), 2, "{j}");
        assert_eq!(escape("a<b>&c"), "a&lt;b&gt;&amp;c");
    }

    #[test]
    fn a_click_names_its_kind_the_version_shown_and_the_option() {
        let mut q = approval();
        q.request_hash = Some("ab".repeat(32));
        q.options[0].option_id = "v1.2".into();
        let value = button_value(&q, "v1.2");
        let c = parse_click("delta.answer.v1.2", &value).expect("click");
        assert_eq!(c.act, Act::Answer);
        assert_eq!(c.request_id, q.request_id);
        assert_eq!(c.shown, Shown::Hash("ab".repeat(32)));
        assert_eq!(option_of_key(&q, &c.key), "v1.2");
        let c = parse_click("delta.edit.v1.2", &value).expect("edit");
        assert_eq!(c.act, Act::Edit);
        // An option whose id has spaces keeps them.
        let c = parse_click("delta.modal.a b", &format!("{} - a b", q.request_id)).expect("modal");
        assert_eq!(
            (c.act, c.shown, c.key.as_str()),
            (Act::Modal, Shown::NoHash, "a b")
        );
        // A button of an older bridge: no hash in its value.
        let c = parse_click("delta.answer.x", &format!("{} x", q.request_id)).expect("old");
        assert_eq!((c.shown.clone(), c.key.as_str()), (Shown::Unknown, "x"));
        assert_eq!(c.shown.echo(Some("cur")), Some("cur".to_owned()));
        assert_eq!(
            parse_click("delta.modal.", &format!("{} - ", q.request_id)).map(|c| c.key),
            Some(String::new())
        );
        assert!(parse_click("delta.answered.x", &value).is_none());
        assert!(parse_click("other.answer.x", &value).is_none());
        assert!(parse_click("delta.answer.x", "not-an-id x").is_none());
    }

    #[test]
    fn who_may_answer_names_the_people_escalation_added() {
        let mut q = approval();
        q.allowed_responders = vec!["alice".into()];
        let added = vec!["bob".into(), "alice".into()];
        let s = Standing {
            added: &added,
            ..Default::default()
        };
        let (blocks, _) = question(&q, &s, None);
        assert!(json_of(&blocks).contains("Who may answer: alice, bob\""));
    }

    #[test]
    fn the_fallback_text_is_escaped_too() {
        let mut q = approval();
        q.title = Some("<!here> title".into());
        q.prompt = "<!channel> <https://evil|x> & more".into();
        let (_, text) = question(&q, &Standing::default(), None);
        assert!(!text.contains('<') && !text.contains('>'), "{text}");
        assert_eq!(
            text,
            "&lt;!here&gt; title: &lt;!channel&gt; &lt;https://evil|x&gt; &amp; more"
        );
    }

    #[test]
    fn dangerous_options_are_red_with_a_confirmation_and_text_options_open_a_modal() {
        let (blocks, _) = question(&approval(), &Standing::default(), None);
        let v: Value = serde_json::to_value(&blocks).expect("json");
        let actions = v
            .as_array()
            .and_then(|a| a.iter().find(|b| b["type"] == "actions"))
            .expect("actions");
        let els = actions["elements"].as_array().expect("elements");
        assert_eq!(els[0]["style"], "danger");
        assert_eq!(els[0]["confirm"]["confirm"]["text"], "Approve");
        assert_eq!(els[0]["action_id"], "delta.answer.approve");
        assert!(els[1].get("style").is_none());
        assert_eq!(els[2]["action_id"], "delta.modal.feedback");
        assert_eq!(els[3]["action_id"], "delta.edit.approve");
    }

    #[test]
    fn a_sensitive_question_has_no_buttons_and_links_to_the_inbox() {
        let mut q = approval();
        q.sensitive = true;
        let (blocks, _) = question(&q, &Standing::default(), Some("https://d.example/inbox"));
        let j = json_of(&blocks);
        assert!(!j.contains("\"actions\""), "{j}");
        assert!(j.contains("<https://d.example/inbox|web inbox>"));
    }

    #[test]
    fn a_question_cut_to_fit_is_answered_only_in_the_inbox() {
        // Arguments padded past what a message holds: the dangerous key would be cut off.
        let mut q = approval();
        q.context.insert(
            "args".into(),
            json!({"note": "x".repeat(4000), "target": "production"}),
        );
        let (blocks, _) = question(&q, &Standing::default(), Some("https://d.example/inbox"));
        let j = json_of(&blocks);
        assert!(!j.contains("\"actions\""), "{j}");
        assert!(j.contains("answered only where it is shown whole"), "{j}");
        assert!(j.contains("<https://d.example/inbox|web inbox>"), "{j}");
        // A plan step, a prompt or details cut: the same.
        for cut in ["plan", "prompt", "details"] {
            let mut q = approval();
            match cut {
                "plan" => {
                    q.context.insert(
                        "plan".into(),
                        json!({"tasks": [{"description": "d".repeat(400), "risk": "low"}]}),
                    );
                }
                "prompt" => q.prompt = "p".repeat(3500),
                _ => q.details = Some("d".repeat(3500)),
            }
            let (blocks, _) = question(&q, &Standing::default(), None);
            assert!(!json_of(&blocks).contains("\"actions\""), "{cut}");
        }
        // Everything shown whole: the buttons are there.
        let mut q = approval();
        q.context.insert(
            "plan".into(),
            json!({"tasks": [{"description": "ship it", "tool": "deploy", "risk": "high"}]}),
        );
        let (blocks, _) = question(&q, &Standing::default(), None);
        assert!(json_of(&blocks).contains("\"actions\""));
    }

    /// Slack refuses a block with no text, and with it the whole message: nothing is empty.
    #[test]
    fn nothing_is_shown_empty() {
        let mut q = approval();
        q.title = Some(" ".into());
        q.details = Some(String::new());
        q.options[1].label = String::new();
        let (blocks, _) = question(&q, &Standing::default(), None);
        let v: Value = serde_json::to_value(&blocks).expect("json");
        let j = v.to_string();
        assert!(j.contains("deployer asks"), "{j}");
        for b in v.as_array().expect("blocks") {
            if let Some(t) = b["text"]["text"].as_str() {
                assert!(!t.trim().is_empty(), "an empty block: {b}");
            }
            for e in b["elements"].as_array().into_iter().flatten() {
                if let Some(t) = e["text"]["text"].as_str() {
                    assert!(!t.trim().is_empty(), "an empty button: {e}");
                }
            }
        }
        assert!(j.contains("\"text\":\"reject\""), "the id stands in: {j}");
    }

    #[test]
    fn a_long_option_id_is_named_by_its_index() {
        let mut q = approval();
        q.options[1].option_id = "r".repeat(300);
        let (blocks, _) = question(&q, &Standing::default(), None);
        let v: Value = serde_json::to_value(&blocks).expect("json");
        let j = v.to_string();
        assert!(j.contains("\"delta.answer.#1\""), "{j}");
        assert_eq!(option_of_key(&q, "#1"), "r".repeat(300));
        assert_eq!(option_of_key(&q, "approve"), "approve");
    }

    #[test]
    fn long_text_is_cut_within_slacks_limits() {
        let mut q = approval();
        q.prompt = "<".repeat(5000);
        q.title = Some("t".repeat(500));
        let (blocks, text) = question(&q, &Standing::default(), None);
        let v: Value = serde_json::to_value(&blocks).expect("json");
        for b in v.as_array().expect("blocks") {
            if let Some(t) = b["text"]["text"].as_str() {
                let max = if b["type"] == "header" {
                    HEADER_MAX
                } else {
                    SECTION_MAX
                };
                assert!(t.chars().count() <= max, "{} chars", t.chars().count());
                assert!(!t.ends_with("&l…") && !t.contains("&…"));
            }
        }
        assert!(text.chars().count() <= TEXT_MAX);
    }
}
