//! Who may publish and subscribe to what on NATS: the least each of the fleet's roles needs
//! (docs/security.md). The launcher writes these into the configuration of the `nats-server` it
//! starts (`delta dev`, the tests), and `deploy/nats/nats.conf` spells out the same lists for
//! the prefix `delta`; a test checks both against a real server.
//!
//! - The **gateway** serves the respond and claim subjects (the only role that may subscribe to
//!   them, so a bot's bearer token in a header reaches no one else), publishes jobs, `resolved`,
//!   `updated` (claims, votes) and `escalated` announcements and cancellations, a `requested`
//!   announcement its worker died before making (when the question is answered), and reads the
//!   streams for its views (and the questions it keeps to answer them without reading them,
//!   through a consumer of its own).
//!   It also delivers webhooks (docs/webhooks.md): it creates, reads, pulls from, acknowledges
//!   and deletes the durable consumers `<p>-webhook-<id>` on the events stream, which its rights
//!   to read that stream through consumers of its own already cover (a consumer's name is one
//!   subject token: NATS cannot grant a name prefix, so nothing narrower can be written).
//! - A **worker** takes jobs from its two consumers (`<p>-workers`: starts, `<p>-resumes`), publishes `requested` announcements, dead
//!   letters and resumes, and hears cancellations. It may not answer, announce an answer,
//!   publish a job, or create or change a stream (a stream's subjects decide what it keeps: a
//!   worker that could add `respond.*` to one could read bots' tokens from it).
//! - A **bot** reads questions and what happens to them (live, or from the interactions stream
//!   with a consumer of its own) and publishes answers and claims to the respond and claim
//!   subjects, and nothing else.
//! - The **slack** bridge (`delta slack`) reads the events stream through one durable consumer
//!   of its own (`<p>-slack`) and keeps where it posted each question in a KV bucket of its own
//!   (`<P>_SLACK`), which the gateway creates: NATS checks a stream's name against a user's
//!   rights, not the subjects it captures, so a user that may create a stream (the bucket's,
//!   before the bridge has) may make it capture bots' answers, tokens and all. It answers through
//!   the gateway's HTTP API, never on NATS.
//! - The **admin** may do everything: operators' tools and the tests' own checks.
//!
//! The gateway and workers receive replies on an inbox of their own role
//! ([`inbox_prefix`]), so no other client can read the JetStream API's answers to them (jobs,
//! dead letters); bots keep NATS's default `_INBOX.`.

/// A role's permissions, as NATS's `permissions` block holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    /// Whether it may reply to the requests it receives (the gateway answering bots).
    pub allow_responses: bool,
}

/// A role on NATS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NatsRole {
    Gateway,
    Worker,
    Bot,
    Admin,
    Slack,
}

impl NatsRole {
    pub const ALL: [NatsRole; 5] = [
        NatsRole::Gateway,
        NatsRole::Worker,
        NatsRole::Bot,
        NatsRole::Admin,
        NatsRole::Slack,
    ];

    /// Its name in user names and inbox prefixes.
    pub fn name(self) -> &'static str {
        match self {
            NatsRole::Gateway => "gateway",
            NatsRole::Worker => "worker",
            NatsRole::Bot => "bot",
            NatsRole::Admin => "admin",
            NatsRole::Slack => "slack",
        }
    }
}

/// Which prefixes the permissions cover: one (`delta`), or any (a server of the tests' own,
/// where each test names its prefix only after the server started).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    Prefix(String),
    Any,
}

impl Scope {
    /// The subject token of the prefix.
    fn p(&self) -> &str {
        match self {
            Scope::Prefix(p) => p,
            Scope::Any => "*",
        }
    }

    /// A stream's name (`<P>_<SUFFIX>`), or `*`.
    fn stream(&self, suffix: &str) -> String {
        match self {
            Scope::Prefix(p) => format!("{}_{suffix}", p.to_uppercase()),
            Scope::Any => "*".into(),
        }
    }

    /// A durable consumer's name (`<p>-<suffix>`), or `*`.
    fn consumer(&self, suffix: &str) -> String {
        match self {
            Scope::Prefix(p) => format!("{p}-{suffix}"),
            Scope::Any => "*".into(),
        }
    }
}

/// Where replies to a role's requests arrive: `_DELTA_INBOX.<prefix>.<role>`.
pub fn inbox_prefix(prefix: &str, role: NatsRole) -> String {
    format!("_DELTA_INBOX.{prefix}.{}", role.name())
}

/// The JetStream API subjects that create, update and read one stream.
fn stream_admin(s: &str) -> Vec<String> {
    ["CREATE", "UPDATE", "INFO"]
        .iter()
        .map(|verb| format!("$JS.API.STREAM.{verb}.{s}"))
        .collect()
}

/// The JetStream API subjects a client needs to read a stream through consumers it creates
/// (ordered ones, with generated names) and to acknowledge what they deliver.
fn stream_reader(s: &str) -> Vec<String> {
    vec![
        format!("$JS.API.STREAM.INFO.{s}"),
        format!("$JS.API.CONSUMER.CREATE.{s}"),
        format!("$JS.API.CONSUMER.CREATE.{s}.>"),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{s}.*"),
        format!("$JS.API.CONSUMER.INFO.{s}.*"),
        format!("$JS.API.CONSUMER.DELETE.{s}.*"),
        format!("$JS.API.CONSUMER.MSG.NEXT.{s}.*"),
        format!("$JS.ACK.{s}.>"),
        format!("$JS.FC.{s}.>"),
    ]
}

/// The JetStream API subjects that create, update and read one durable consumer.
fn durable(s: &str, c: &str) -> Vec<String> {
    vec![
        format!("$JS.API.CONSUMER.CREATE.{s}.{c}"),
        format!("$JS.API.CONSUMER.CREATE.{s}.{c}.>"),
        format!("$JS.API.CONSUMER.DURABLE.CREATE.{s}.{c}"),
        format!("$JS.API.CONSUMER.INFO.{s}.{c}"),
    ]
}

/// The subjects that pull from one durable consumer and acknowledge what it delivers.
fn pull(s: &str, c: &str) -> Vec<String> {
    vec![
        format!("$JS.API.CONSUMER.MSG.NEXT.{s}.{c}"),
        format!("$JS.ACK.{s}.{c}.>"),
    ]
}

/// What `role` may do under `scope`.
pub fn permissions(scope: &Scope, role: NatsRole) -> Permissions {
    let p = scope.p();
    let jobs = scope.stream("JOBS");
    let dlq = scope.stream("DLQ");
    let interactions = scope.stream("INTERACTIONS");
    let exhausted = scope.stream("EXHAUSTED");
    let workers = scope.consumer("workers");
    let resumes = scope.consumer("resumes");
    let exhausted_consumer = scope.consumer("exhausted");
    let inbox = |r: NatsRole| format!("_DELTA_INBOX.{p}.{}.>", r.name());
    let all_streams = [&jobs, &dlq, &interactions, &exhausted];
    // Gateways create and update the streams; workers only read them (a stream's subjects decide
    // what it captures, so whoever may update a stream could make it keep bots' answers). Both
    // set up the three durable consumers (starts, resumes, exhausted), whichever comes first.
    let setup = |admin: bool| {
        let mut v = vec!["$JS.API.INFO".to_owned()];
        for s in all_streams {
            if admin {
                v.extend(stream_admin(s));
            } else {
                v.push(format!("$JS.API.STREAM.INFO.{s}"));
            }
        }
        v.extend(durable(&jobs, &workers));
        v.extend(durable(&jobs, &resumes));
        v.extend(durable(&exhausted, &exhausted_consumer));
        v
    };
    let (publish, subscribe, allow_responses) = match role {
        NatsRole::Gateway => {
            let mut publish = setup(true);
            // The Slack bridge's bucket, made here so that the bridge may create no stream.
            let kv = match scope {
                Scope::Prefix(p) => format!("KV_{}_SLACK", p.to_uppercase()),
                Scope::Any => "*".to_owned(),
            };
            publish.extend([
                format!("$JS.API.STREAM.CREATE.{kv}"),
                format!("$JS.API.STREAM.INFO.{kv}"),
            ]);
            publish.extend(stream_reader(&dlq));
            publish.extend(stream_reader(&interactions));
            publish.extend([
                format!("$JS.API.STREAM.MSG.GET.{jobs}"),
                format!("$JS.API.STREAM.MSG.GET.{dlq}"),
                format!("$JS.API.STREAM.MSG.DELETE.{dlq}"),
                // Whether a cancelled run's end was announced (a retried cancel).
                format!("$JS.API.STREAM.MSG.GET.{interactions}"),
                format!("{p}.jobs.>"),
                // A question its worker died before announcing, announced as it is answered.
                format!("{p}.interactions.requested.>"),
                format!("{p}.interactions.resolved.>"),
                format!("{p}.interactions.updated.>"),
                format!("{p}.interactions.escalated.>"),
                format!("{p}.runs.cancelled.>"),
                format!("{p}.events.cancelled"),
            ]);
            let subscribe = vec![
                format!("{p}.interactions.respond.*"),
                format!("{p}.interactions.claim.*"),
                format!("{p}.events.resumed"),
                inbox(NatsRole::Gateway),
            ];
            (publish, subscribe, true)
        }
        NatsRole::Worker => {
            let mut publish = setup(false);
            publish.extend(pull(&jobs, &workers));
            publish.extend(pull(&jobs, &resumes));
            publish.extend(pull(&exhausted, &exhausted_consumer));
            publish.extend([
                format!("$JS.API.STREAM.MSG.GET.{jobs}"),
                format!("$JS.API.STREAM.MSG.DELETE.{jobs}"),
                format!("{p}.dlq.>"),
                format!("{p}.interactions.requested.>"),
                format!("{p}.runs.>"),
                format!("{p}.events.resumed"),
            ]);
            let subscribe = vec![format!("{p}.events.cancelled"), inbox(NatsRole::Worker)];
            (publish, subscribe, false)
        }
        NatsRole::Bot => {
            let mut publish = vec!["$JS.API.INFO".to_owned()];
            publish.extend(stream_reader(&interactions));
            publish.push(format!("{p}.interactions.respond.*"));
            publish.push(format!("{p}.interactions.claim.*"));
            let subscribe = vec![
                format!("{p}.interactions.requested.>"),
                format!("{p}.interactions.resolved.>"),
                format!("{p}.interactions.updated.>"),
                format!("{p}.interactions.escalated.>"),
                format!("{p}.runs.>"),
                "_INBOX.>".to_owned(),
            ];
            (publish, subscribe, false)
        }
        NatsRole::Admin => (vec![">".to_owned()], vec![">".to_owned()], false),
        NatsRole::Slack => {
            // Its KV bucket `<P>_SLACK` is the stream `KV_<P>_SLACK`.
            let (bucket, kv) = match scope {
                Scope::Prefix(p) => {
                    let b = format!("{}_SLACK", p.to_uppercase());
                    (b.clone(), format!("KV_{b}"))
                }
                Scope::Any => ("*".to_owned(), "*".to_owned()),
            };
            let slack = scope.consumer("slack");
            let mut publish = vec![
                "$JS.API.INFO".to_owned(),
                format!("$JS.API.STREAM.INFO.{interactions}"),
            ];
            publish.extend(durable(&interactions, &slack));
            publish.extend(pull(&interactions, &slack));
            // Not `STREAM.CREATE` on its bucket: the gateway makes it (see the module's doc).
            publish.extend([
                format!("$JS.API.STREAM.INFO.{kv}"),
                format!("$JS.API.STREAM.MSG.GET.{kv}"),
                format!("$JS.API.DIRECT.GET.{kv}.>"),
                format!("$KV.{bucket}.>"),
            ]);
            (publish, vec![inbox(NatsRole::Slack)], false)
        }
    };
    Permissions {
        publish: unique(publish),
        subscribe: unique(subscribe),
        allow_responses,
    }
}

/// `v` without repeats, in its order.
fn unique(v: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    v.into_iter().filter(|s| seen.insert(s.clone())).collect()
}

/// A string quoted for a `nats-server` configuration.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// A user's entry in a `nats-server` configuration's `authorization.users` list. `password` is
/// written as given: a [`quote`]d string, or a variable (`$DELTA_NATS_WORKER_PASSWORD`) that the
/// server takes from its environment.
pub fn user_entry(scope: &Scope, role: NatsRole, user: &str, password: &str) -> String {
    let list = |v: &[String]| {
        v.iter()
            .map(|s| format!("          {}\n", quote(s)))
            .collect::<String>()
    };
    let perms = permissions(scope, role);
    let mut out = format!(
        "    {{\n      user: {}\n      password: {}\n      permissions: {{\n        publish: {{ allow: [\n{}        ] }}\n        subscribe: {{ allow: [\n{}        ] }}\n",
        quote(user),
        password,
        list(&perms.publish),
        list(&perms.subscribe),
    );
    if perms.allow_responses {
        out.push_str("        allow_responses: true\n");
    }
    out.push_str("      }\n    }\n");
    out
}

/// The `authorization` block of a `nats-server` configuration: a user `delta-<role>` per role,
/// with the password `password(role)` gives (written as [`user_entry`] says).
pub fn authorization(scope: &Scope, password: impl Fn(NatsRole) -> String) -> String {
    let mut conf = String::from("authorization {\n  users = [\n");
    for role in NatsRole::ALL {
        conf.push_str(&user_entry(
            scope,
            role,
            &format!("delta-{}", role.name()),
            &password(role),
        ));
    }
    conf.push_str("  ]\n}\n");
    conf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_gateway_may_hear_answers_and_only_bots_and_the_gateway_send_them() {
        let scope = Scope::Prefix("delta".into());
        let respond = "delta.interactions.respond.*".to_owned();
        for role in NatsRole::ALL {
            let p = permissions(&scope, role);
            let hears = p.subscribe.contains(&respond) || p.subscribe.contains(&">".to_owned());
            assert_eq!(
                hears,
                matches!(role, NatsRole::Gateway | NatsRole::Admin),
                "{role:?}"
            );
        }
        let worker = permissions(&scope, NatsRole::Worker);
        assert!(!worker.publish.iter().any(|s| s.contains("respond")));
        assert!(
            !worker
                .publish
                .iter()
                .any(|s| s.contains("STREAM.UPDATE") || s.contains("STREAM.CREATE"))
        );
        assert!(!worker.publish.iter().any(|s| s.starts_with("delta.jobs")));
        let bot = permissions(&scope, NatsRole::Bot);
        assert!(!bot.publish.iter().any(|s| s.starts_with("delta.jobs")));
    }

    /// Whether NATS would let `subject` through `allowed` (`*` one token, `>` the rest).
    fn allows(allowed: &[String], subject: &str) -> bool {
        allowed.iter().any(|pattern| {
            let (mut p, mut s) = (pattern.split('.'), subject.split('.'));
            loop {
                match (p.next(), s.next()) {
                    (Some(">"), Some(_)) => return true,
                    (Some("*"), Some(_)) => {}
                    (Some(a), Some(b)) if a == b => {}
                    (None, None) => return true,
                    _ => return false,
                }
            }
        })
    }

    #[test]
    fn the_gateway_may_run_its_webhook_consumers_and_workers_may_not() {
        let scope = Scope::Prefix("delta".into());
        let c = "delta-webhook-0193a7b2-0000-7000-8000-000000000000";
        let needs = [
            format!("$JS.API.CONSUMER.CREATE.DELTA_INTERACTIONS.{c}"),
            format!("$JS.API.CONSUMER.INFO.DELTA_INTERACTIONS.{c}"),
            format!("$JS.API.CONSUMER.DELETE.DELTA_INTERACTIONS.{c}"),
            format!("$JS.API.CONSUMER.MSG.NEXT.DELTA_INTERACTIONS.{c}"),
            format!("$JS.ACK.DELTA_INTERACTIONS.{c}.1.7.7.1795971601000000000.0"),
        ];
        let gateway = permissions(&scope, NatsRole::Gateway);
        let worker = permissions(&scope, NatsRole::Worker);
        for subject in &needs {
            assert!(allows(&gateway.publish, subject), "{subject}");
            assert!(!allows(&worker.publish, subject), "{subject}");
        }
    }

    #[test]
    fn the_slack_bridge_reads_events_and_its_bucket_and_nothing_else() {
        let p = permissions(&Scope::Prefix("delta".into()), NatsRole::Slack);
        for must in [
            "$JS.API.CONSUMER.MSG.NEXT.DELTA_INTERACTIONS.delta-slack",
            "$JS.API.CONSUMER.DURABLE.CREATE.DELTA_INTERACTIONS.delta-slack",
            "$JS.API.STREAM.INFO.KV_DELTA_SLACK",
            "$KV.DELTA_SLACK.>",
        ] {
            assert!(p.publish.contains(&must.to_owned()), "{must}");
        }
        // Not even its bucket's stream: the gateway makes it (a stream's subjects are not
        // checked against the creator's rights).
        assert!(
            !p.publish.iter().any(|s| s.contains("STREAM.CREATE")),
            "{:?}",
            p.publish
        );
        let g = permissions(&Scope::Prefix("delta".into()), NatsRole::Gateway);
        assert!(
            g.publish
                .contains(&"$JS.API.STREAM.CREATE.KV_DELTA_SLACK".to_owned())
        );
        // No job, no answer, no announcement, no other consumer, no other stream's changes.
        assert!(
            !p.publish.iter().any(|s| s.starts_with("delta.")),
            "{:?}",
            p.publish
        );
        assert!(
            !p.publish
                .iter()
                .any(|s| s.contains("delta-workers") || s.contains("STREAM.UPDATE"))
        );
        assert!(
            !p.publish
                .iter()
                .any(|s| s.contains("STREAM.CREATE.DELTA_") || s.contains(".*.*"))
        );
        assert_eq!(p.subscribe, ["_DELTA_INBOX.delta.slack.>"]);
        assert!(!p.allow_responses);
    }

    #[test]
    fn workers_pull_from_both_job_consumers_and_the_gateway_from_neither() {
        let scope = Scope::Prefix("delta".into());
        let worker = permissions(&scope, NatsRole::Worker);
        let gateway = permissions(&scope, NatsRole::Gateway);
        for c in ["delta-workers", "delta-resumes"] {
            let next = format!("$JS.API.CONSUMER.MSG.NEXT.DELTA_JOBS.{c}");
            let ack = format!("$JS.ACK.DELTA_JOBS.{c}.1.7.7.1795971601000000000.0");
            let create = format!("$JS.API.CONSUMER.DURABLE.CREATE.DELTA_JOBS.{c}");
            let info = format!("$JS.API.CONSUMER.INFO.DELTA_JOBS.{c}");
            for subject in [&next, &ack, &create, &info] {
                assert!(allows(&worker.publish, subject), "worker: {subject}");
            }
            // The gateway sets the consumers up and reads their figures, but takes no job.
            for subject in [&create, &info] {
                assert!(allows(&gateway.publish, subject), "gateway: {subject}");
            }
            for subject in [&next, &ack] {
                assert!(!allows(&gateway.publish, subject), "gateway: {subject}");
            }
        }
        // Both job subjects are the gateway's to publish, and no worker's.
        for subject in ["delta.jobs.hello", "delta.jobs.hello.resume"] {
            assert!(allows(&gateway.publish, subject), "{subject}");
            assert!(!allows(&worker.publish, subject), "{subject}");
        }
    }

    #[test]
    fn any_scope_names_no_prefix() {
        let p = permissions(&Scope::Any, NatsRole::Worker);
        assert!(p.publish.contains(&"*.dlq.>".to_owned()));
        assert!(
            p.publish
                .contains(&"$JS.API.CONSUMER.MSG.NEXT.*.*".to_owned())
        );
        assert!(p.subscribe.contains(&"_DELTA_INBOX.*.worker.>".to_owned()));
    }
}
