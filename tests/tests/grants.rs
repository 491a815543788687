//! Scoped grants through a real fleet (nats-server, redis-server, gateway and worker processes):
//! an approval with `data.grant` over HTTP and over a NATS bot, later runs of the agent approved
//! by it without a question (journaled with the grant and its creator), bad grants refused at the
//! gateway, listing and revoking over HTTP with its roles, and questions again once revoked or used
//! up.

use std::path::{Path, PathBuf};

use delta_e2e::fleet::{Fleet, bot_answer, pending};
use delta_e2e::gateways::{CallError, Client};
use delta_protocol::{Event, RunId, RunStatus};
use delta_store::RunStore;
use serde_json::{Value, json};

const AGENT: &str = "name: shipit\nbrain: scripted\ntools:\n  - name: deploy\n    exec: \"echo deployed ${env}\"\n    approval: always\n";
const SCRIPT: &str =
    "steps:\n  - tool: deploy\n    args: {env: \"${task}\"}\n  - finish: \"${observation}\"\n";

fn tokens_file(dir: &Path) -> PathBuf {
    let f = dir.join("tokens.yaml");
    std::fs::write(
        &f,
        "- name: alice\n  token: alice-token-0123456789\n  roles: [answer]\n\
         - name: bob\n  token: bob-token-0123456789ab\n  roles: [answer]\n\
         - name: ci\n  token: ci-token-0123456789abcd\n  roles: [submit]\n\
         - name: ops\n  token: ops-token-0123456789abc\n  roles: [operate]\n",
    )
    .expect("tokens");
    f
}

/// `DELETE path`: the status and body.
async fn delete(c: &Client, path: &str) -> (u16, Value) {
    match c.delete_as::<Value>(path).await {
        Ok(v) => (200, v),
        Err(CallError::Refused { status, error }) => {
            (status, serde_json::to_value(&error).unwrap_or_default())
        }
        Err(e) => panic!("DELETE {path}: {e:?}"),
    }
}

/// The notes (`SYSTEM_MESSAGE`s) of a run's journal.
async fn notes(fleet: &Fleet, run: RunId) -> Vec<String> {
    let stored = fleet.store.load(run).await.expect("load");
    stored
        .journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::SystemMessage(m) => Some(m.content.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn grants_made_over_http_and_nats_approve_later_runs_until_revoked_or_used_up() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path());
    let fleet = Fleet::start_with("gra", 1, 1, |s| s.tokens_file = Some(tokens.clone())).await;
    fleet.add_agent("shipit", AGENT, SCRIPT);
    let anon = fleet.client.clone();
    let ci = anon.with_token(Some("ci-token-0123456789abcd"));
    let alice = anon.with_token(Some("alice-token-0123456789"));
    let bob = anon.with_token(Some("bob-token-0123456789ab"));
    let ops = anon.with_token(Some("ops-token-0123456789abc"));
    let submit = |task: &'static str| {
        let ci = ci.clone();
        async move {
            let (s, b) = ci
                .post("/v1/runs", &json!({"agent": "shipit", "task": task}))
                .await
                .expect("submit");
            assert_eq!(s, 202, "{b}");
            b["run_id"]
                .as_str()
                .expect("id")
                .parse::<RunId>()
                .expect("uuid")
        }
    };

    // 1. Over HTTP: the question says the tool is grantable; a bad grant is refused and changes
    //    nothing; alice approves with a grant for every run of the agent.
    let run1 = submit("staging").await;
    let rid1 = pending(&ops, run1).await;
    let (_, q) = alice
        .get(&format!("/v1/interactions/{rid1}"))
        .await
        .expect("question");
    assert_eq!(q["request"]["context"]["grantable"], json!(true), "{q}");
    let path = format!("/v1/interactions/{rid1}/response");
    for bad in [
        json!({"option_id": "approve", "data": {"grant": {"args": {"region": "eu"}}}}),
        json!({"option_id": "approve", "data": {"grant": {"args": {"env": {"regex": "("}}}}}),
        json!({"option_id": "reject", "input": "no", "data": {"grant": {}}}),
        json!({"option_id": "approve", "data": {"grant": {"scope": "world"}}}),
    ] {
        let (s, b) = alice.post(&path, &bad).await.expect("answer");
        assert_eq!(
            (s, &b["error"]["code"]),
            (422, &json!("invalid_args")),
            "{bad}: {b}"
        );
    }
    let (_, q) = alice
        .get(&format!("/v1/interactions/{rid1}"))
        .await
        .expect("question");
    assert_eq!(q["state"], "PENDING", "refused answers leave it pending");
    let (s, b) = alice
        .post(
            &path,
            &json!({"option_id": "approve", "data": {"grant": {"scope": "agent", "args": {"env": {"regex": "staging|qa"}}}}}),
        )
        .await
        .expect("answer");
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(run1, RunStatus::Completed).await;
    let created = format!("grant {rid1} created by alice via http: scope agent");
    assert!(
        notes(&fleet, run1)
            .await
            .iter()
            .any(|n| n.starts_with(&created)),
        "{:#?}",
        notes(&fleet, run1).await
    );

    // 2. A later run of the agent that the grant covers runs without a question.
    let run2 = submit("qa").await;
    fleet.wait_status(run2, RunStatus::Completed).await;
    let n = notes(&fleet, run2).await;
    assert!(
        n.iter()
            .any(|m| m.contains(&format!("approved by grant {rid1}"))
                && m.contains("created by alice via http")),
        "{n:#?}"
    );
    // One the grant does not cover asks.
    let run_prod = submit("production").await;
    let rid_prod = pending(&ops, run_prod).await;

    // 3. Listing: answerers may, submitters may not; by agent, by run, by state.
    let (s, b) = ci.get("/v1/grants").await.expect("list");
    assert_eq!((s, &b["error"]["code"]), (403, &json!("forbidden")), "{b}");
    let (s, list) = bob.get("/v1/grants?agent=shipit").await.expect("list");
    assert_eq!(s, 200, "{list}");
    let grants = list["grants"].as_array().expect("grants");
    assert_eq!(grants.len(), 1, "{list}");
    assert_eq!(grants[0]["grant_id"], json!(rid1));
    assert_eq!(grants[0]["state"], "ACTIVE");
    assert_eq!(grants[0]["uses"], 1);
    assert_eq!(grants[0]["created_by"]["id"], "alice");
    assert_eq!(grants[0]["args"]["env"], json!({"regex": "staging|qa"}));
    let (_, by_run) = bob
        .get(&format!("/v1/grants?run={run_prod}"))
        .await
        .expect("list");
    assert_eq!(by_run["grants"].as_array().map(Vec::len), Some(1));
    let (s, b) = bob.get("/v1/grants?state=someday").await.expect("list");
    assert_eq!((s, &b["error"]["code"]), (400, &json!("bad_request")));

    // 4. Revoking: not by another answerer; by its creator. Then the agent asks again.
    let (s, b) = delete(&bob, &format!("/v1/grants/{rid1}")).await;
    assert_eq!((s, &b["error"]["code"]), (403, &json!("forbidden")), "{b}");
    let (s, b) = delete(&alice, &format!("/v1/grants/{rid1}")).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(
        (&b["state"], &b["revoked_by"]),
        (&json!("REVOKED"), &json!("alice"))
    );
    let (s, b) = delete(&alice, &format!("/v1/grants/{}", RunId::new())).await;
    assert_eq!((s, &b["error"]["code"]), (404, &json!("not_found")));
    let run3 = submit("staging").await;
    let rid3 = pending(&ops, run3).await;

    // 5. Over a NATS bot (bob): a grant of one use, for the exact call.
    let nc = fleet.nats().await;
    let body =
        json!({"option_id": "approve", "data": {"grant": {"scope": "agent", "max_uses": 1}}});
    let reply = bot_answer(
        &nc,
        "gra",
        &rid3,
        body.to_string().into_bytes(),
        Some("bob-token-0123456789ab"),
    )
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    fleet.wait_status(run3, RunStatus::Completed).await;
    let run4 = submit("staging").await;
    fleet.wait_status(run4, RunStatus::Completed).await;
    assert!(
        notes(&fleet, run4)
            .await
            .iter()
            .any(|m| m.contains(&format!("approved by grant {rid3}"))
                && m.contains("created by bob via nats")
                && m.ends_with("use 1 of 1)")),
        "{:#?}",
        notes(&fleet, run4).await
    );
    let run5 = submit("staging").await;
    let _rid5 = pending(&ops, run5).await;
    let (_, used) = bob.get("/v1/grants?state=used_up").await.expect("list");
    assert_eq!(used["grants"][0]["grant_id"], json!(rid3), "{used}");

    // 6. An operator may revoke anyone's grant; everything listed with state=all.
    let (s, b) = delete(&ops, &format!("/v1/grants/{rid3}")).await;
    assert_eq!((s, &b["revoked_by"]), (200, &json!("ops")), "{b}");
    let (_, all) = ops.get("/v1/grants?state=all").await.expect("list");
    let states: Vec<&Value> = all["grants"]
        .as_array()
        .expect("grants")
        .iter()
        .map(|g| &g["state"])
        .collect();
    assert_eq!(states, [&json!("REVOKED"), &json!("REVOKED")], "{all}");
    let _ = rid_prod;
}

#[tokio::test(flavor = "multi_thread")]
async fn policy_and_grantable_false_are_enforced_in_the_fleet() {
    let fleet = Fleet::start("grb", 1, 1).await;
    fleet.add_agent(
        "guarded_ops",
        "name: guarded_ops\nbrain: scripted\ntools:\n  - name: deploy\n    exec: \"echo deployed ${env}\"\n    approval: always\n  - name: wipe\n    exec: \"echo wiped ${what}\"\n    grantable: false\n",
        "steps:\n  - tool: deploy\n    args: {env: production}\n  - tool: deploy\n    args: {env: staging}\n  - tool: wipe\n    args: {what: cache}\n  - finish: \"${observation}\"\n",
    );
    std::fs::write(
        fleet.gateway_spec.agents_dir.join("guarded_ops").join("policy.yaml"),
        "rules:\n  - {name: no-prod, tool: deploy, args: {env: \"prod.*\"}, effect: deny, reason: release team only}\n  - {name: staging-ok, tool: deploy, args: {env: staging}, effect: allow}\n  - {name: careful-wipe, tool: wipe, effect: require_approval}\n",
    )
    .expect("policy");
    let run = fleet.submit("guarded_ops", "t").await;
    let rid = fleet.pending(run).await;
    let (_, q) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("question");
    let ctx = &q["request"]["context"];
    assert_eq!(
        (&ctx["tool"], &ctx["policy_rule"], &ctx["grantable"]),
        (&json!("wipe"), &json!("careful-wipe"), &json!(false)),
        "{q}"
    );
    // A grant for a tool that is not grantable: refused at the gateway, the question stays.
    let (s, b) = fleet
        .answer(&rid, json!({"option_id": "approve", "data": {"grant": {}}}))
        .await;
    assert_eq!(
        (s, &b["error"]["code"]),
        (422, &json!("invalid_args")),
        "{b}"
    );
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("grantable: false")),
        "{b}"
    );
    let (s, b) = fleet.answer(&rid, json!({"option_id": "approve"})).await;
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let results: Vec<(String, String)> = stored
        .journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::ActionResult(r) => {
                Some((format!("{:?}", r.status), r.observation_content.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        [
            (
                "Rejected".to_owned(),
                "denied by policy rule `no-prod`: release team only; this call is not allowed, do something else".to_owned()
            ),
            ("Success".to_owned(), "deployed staging\n".to_owned()),
            ("Success".to_owned(), "wiped cache\n".to_owned()),
        ]
    );
    let n = notes(&fleet, run).await;
    for rule in ["no-prod", "staging-ok", "careful-wipe"] {
        assert!(
            n.iter()
                .any(|m| m.starts_with(&format!("policy.yaml rule `{rule}`"))),
            "{rule}: {n:#?}"
        );
    }
}
