//! The human loop beyond one answer, against real servers, gateways and workers (issue 16,
//! docs/protocol.md §3 "Quorum", "Claims", "What the approver saw"): votes by groups over
//! HTTP and a NATS bot, a veto, claims on every channel, stale answers refused, and a storm of
//! concurrent votes, claims and answers that must resume every run exactly once.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use delta_e2e::fleet::{Fleet, bot_answer, pending, submit_as};
use delta_e2e::gateways::Client;
use delta_protocol::{Ballot, Event, OptionAction, RunStatus};
use delta_store::RunStore;
use futures_util::StreamExt;
use serde_json::{Value, json};

/// A tokens file: `(name, token, roles, groups)`.
fn tokens_file(dir: &std::path::Path, entries: &[(&str, &str, &str, &str)]) -> std::path::PathBuf {
    let file = dir.join("tokens.yaml");
    let text: String = entries
        .iter()
        .map(|(name, token, roles, groups)| {
            format!("- name: {name}\n  token: {token}\n  roles: [{roles}]\n  groups: [{groups}]\n")
        })
        .collect();
    std::fs::write(&file, text).expect("tokens");
    file
}

fn token(name: &str) -> String {
    format!("{name}-token-0123456789abcdef")
}

/// A fleet (`gateways`, `workers`) whose gateways take the tokens `entries`; the tokens file's
/// directory lives as long as the fleet.
async fn fleet_with_tokens(
    prefix: &str,
    gateways: usize,
    workers: usize,
    entries: &[(&str, &str, &str, &str)],
) -> (Fleet, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path(), entries);
    let fleet = Fleet::start_with(prefix, gateways, workers, |s| {
        s.tokens_file = Some(tokens.clone())
    })
    .await;
    (fleet, dir)
}

/// A bot's claim over NATS request-reply: the reply JSON.
async fn bot_claim(
    nc: &async_nats::Client,
    prefix: &str,
    rid: &str,
    body: Value,
    tok: &str,
) -> Value {
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Authorization", format!("Bearer {tok}").as_str());
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        nc.request_with_headers(
            format!("{prefix}.interactions.claim.{rid}"),
            headers,
            serde_json::to_vec(&body).expect("json").into(),
        ),
    )
    .await
    .expect("reply in time")
    .expect("reply");
    serde_json::from_slice(&reply.payload).expect("reply JSON")
}

fn votes(run: &delta_store::StoredRun) -> Vec<delta_protocol::Vote> {
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::HumanVote(v) => Some(v.clone()),
            _ => None,
        })
        .collect()
}

const COUNCIL_CONFIG: &str = "name: council\nbrain: scripted\ntools:\n  - name: deploy\n    exec: \"echo deploying ${env}\"\n    approval: always\n    approvals: {min: 2, of: [\"group:leads\"]}\n    parameters:\n      - {name: env, type: string}\n";
const COUNCIL_SCRIPT: &str =
    "steps:\n  - tool: deploy\n    args: {env: prod}\n  - finish: \"deployed\"\n";

/// Two of the group `leads` must approve a tool call; the submitter (a lead too) may not; a
/// person votes once; the count shows on HTTP and over NATS; the second approval, by a bot over
/// NATS, resumes the run once; every vote is journaled with the request's hash.
#[tokio::test(flavor = "multi_thread")]
async fn two_leads_approve_a_call_over_http_and_nats() {
    let (fleet, _tokens) = fleet_with_tokens(
        "hlq",
        1,
        1,
        &[
            ("sub", &token("sub"), "submit, answer", "leads"),
            ("alice", &token("alice"), "answer", "leads"),
            ("bob", &token("bob"), "answer", "leads, oncall"),
            ("carol", &token("carol"), "answer", "dev"),
        ],
    )
    .await;
    fleet.add_agent("council", COUNCIL_CONFIG, COUNCIL_SCRIPT);
    let who = |n: &str| fleet.client.with_token(Some(&token(n)));
    let (sub, alice, bob, carol) = (who("sub"), who("alice"), who("bob"), who("carol"));
    let nc = fleet.nats().await;
    let mut updates = nc
        .subscribe("hlq.interactions.updated.>")
        .await
        .expect("sub");

    let run = submit_as(&sub, "council", "go").await;
    let rid = pending(&sub, run).await;
    let path = format!("/v1/interactions/{rid}/response");
    let approve = json!({"option_id": "approve"});

    let (s, b) = sub.post(&path, &approve).await.expect("vote");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("submitted this run"),
        "{b}"
    );
    let (s, b) = carol.post(&path, &approve).await.expect("vote");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("group:leads"),
        "{b}"
    );

    let (s, b) = alice.post(&path, &approve).await.expect("vote");
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["status"], "counted");
    assert_eq!(b["tally"]["approvals"], 1);
    assert_eq!(b["tally"]["needed"], 2);
    assert_eq!(b["tally"]["approved_by"], json!(["alice"]));
    // The count shows to everyone, and the question is still pending.
    let (_, view) = bob
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(view["state"], "PENDING");
    assert_eq!(view["tally"]["approved_by"], json!(["alice"]));
    assert_eq!(view["request"]["approvals"]["min"], 2);
    let (_, listing) = bob.get("/v1/interactions").await.expect("list");
    assert_eq!(listing["interactions"][0]["tally"]["approvals"], 1);
    // A person votes once: the same vote again is acknowledged, another is refused.
    let (s, b) = alice.post(&path, &approve).await.expect("vote");
    assert_eq!((s, &b["status"]), (200, &json!("counted")), "{b}");
    let (s, b) = alice
        .post(
            &path,
            &json!({"option_id": "reject", "input": "changed my mind"}),
        )
        .await
        .expect("vote");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("already_voted")),
        "{b}"
    );
    // Each approver approves the call as shown: no edited arguments.
    let (s, b) = bob
        .post(
            &path,
            &json!({"option_id": "approve", "data": {"args": {"env": "dev"}}}),
        )
        .await
        .expect("vote");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (422, Some("invalid_args")),
        "{b}"
    );

    // The second lead approves as a bot over NATS: that decides it.
    let hash = view["request_hash"].as_str().expect("hash").to_owned();
    let body = json!({"option_id": "approve", "request_hash": hash});
    let reply = bot_answer(
        &nc,
        "hlq",
        &rid,
        serde_json::to_vec(&body).unwrap(),
        Some(&token("bob")),
    )
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(
        reply["status"], "accepted",
        "a vote's reply says whether it decided"
    );
    assert_eq!(reply["tally"]["approved_by"], json!(["alice", "bob"]));
    fleet.wait_status(run, RunStatus::Completed).await;

    // Late and repeated votes.
    let (s, b) = carol
        .post(&path, &json!({"option_id": "reject", "input": "no"}))
        .await
        .expect("vote");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("already_resolved")),
        "{b}"
    );
    let again = bot_answer(
        &nc,
        "hlq",
        &rid,
        serde_json::to_vec(&body).unwrap(),
        Some(&token("bob")),
    )
    .await;
    assert_eq!(
        again["ok"], true,
        "the same vote again is acknowledged: {again}"
    );

    let stored = fleet.store.load(run).await.expect("load");
    let cast = votes(&stored);
    assert_eq!(cast.len(), 2, "every vote is journaled, once");
    assert_eq!(
        cast.iter()
            .map(|v| (v.responder.id.as_str(), v.ballot))
            .collect::<Vec<_>>(),
        [("alice", Ballot::Approve), ("bob", Ballot::Approve)]
    );
    assert_eq!(
        serde_json::to_value(cast[1].responder.via).unwrap(),
        json!("nats")
    );
    assert!(cast.iter().all(|v| v.request_hash == hash));
    let decided = delta_e2e::answers_of(&stored);
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0].responder.id, "bob");
    assert_eq!(decided[0].request_hash.as_deref(), Some(hash.as_str()));
    delta_e2e::assert_each_step_once(&stored, 1);
    assert_eq!(stored.record.result.as_deref(), Some("deployed"));
    // Both votes were announced, with the count as it stood.
    let mut seen = vec![];
    while seen.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(5), updates.next())
            .await
            .expect("an update in time")
            .expect("message");
        let u: Value = delta_protocol::events::decode::<Value>(&m.payload)
            .expect("a CloudEvent of an update")
            .data;
        seen.push((
            u["change"].clone(),
            u["by"].clone(),
            u["tally"]["approvals"].clone(),
        ));
    }
    assert_eq!(
        seen,
        [
            (json!("voted"), json!("alice"), json!(1)),
            (json!("voted"), json!("bob"), json!(2))
        ]
    );
}

/// With `veto`, one rejection decides, whatever the approvals so far.
#[tokio::test(flavor = "multi_thread")]
async fn one_rejection_decides_under_a_veto() {
    let fleet = Fleet::start("hlv", 1, 1).await;
    fleet.add_agent(
        "vetoed",
        "name: vetoed\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"Ship it?\"\n      approvals: {min: 3, veto: true}\n      options:\n        - {id: ship, label: Ship, action: APPROVE_AND_EXECUTE}\n        - {id: stop, label: Stop, action: REJECT_WITH_REASON, requires_input: true}\n  - finish: \"answered ${answer}\"\n",
    );
    let run = fleet.submit("vetoed", "go").await;
    let rid = fleet.pending(run).await;
    let (s, b) = fleet
        .answer(
            &rid,
            json!({"option_id": "ship", "responder": {"id": "ann"}}),
        )
        .await;
    assert_eq!((s, &b["status"]), (200, &json!("counted")), "{b}");
    let (s, b) = fleet
        .answer(
            &rid,
            json!({"option_id": "stop", "input": "not on a Friday", "responder": {"id": "ben"}}),
        )
        .await;
    assert_eq!((s, &b["status"]), (200, &json!("accepted")), "{b}");
    assert_eq!(b["tally"]["rejected_by"], json!(["ben"]));
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let decided = delta_e2e::answers_of(&stored);
    assert_eq!(decided.len(), 1);
    assert_eq!(decided[0].option_id.as_deref(), Some("stop"));
    assert_eq!(decided[0].action, OptionAction::RejectWithReason);
    assert_eq!(decided[0].responder.id, "ben");
    let cast = votes(&stored);
    assert_eq!(cast.len(), 2);
    assert_eq!(cast[1].feedback.as_deref(), Some("not on a Friday"));
}

/// A claim holds others off on HTTP and NATS alike, shows on the question, is renewed,
/// released, taken over NATS, broken by an operator; every change is announced.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_holds_others_off_on_every_channel() {
    let (fleet, _tokens) = fleet_with_tokens(
        "hlc",
        1,
        1,
        &[
            ("sub", &token("sub"), "submit", ""),
            ("alice", &token("alice"), "answer", ""),
            ("bob", &token("bob"), "answer", ""),
            ("ops", &token("ops"), "operate", ""),
        ],
    )
    .await;
    let who = |n: &str| fleet.client.with_token(Some(&token(n)));
    let (sub, alice, bob, ops) = (who("sub"), who("alice"), who("bob"), who("ops"));
    let nc = fleet.nats().await;
    let mut updates = nc
        .subscribe("hlc.interactions.updated.>")
        .await
        .expect("sub");
    let run = submit_as(&sub, "hello", "go").await;
    let rid = pending(&sub, run).await;
    let claim = format!("/v1/interactions/{rid}/claim");
    let respond = format!("/v1/interactions/{rid}/response");

    let (s, b) = alice.post(&claim, &json!({})).await.expect("claim");
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["claim"]["by"], "alice");
    let (_, view) = bob
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(view["claim"]["by"], "alice");
    let (s, b) = bob
        .post(&respond, &json!({"input": "Bob"}))
        .await
        .expect("answer");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("claimed")),
        "{b}"
    );
    let msg = b["error"]["message"].as_str().unwrap_or("");
    assert!(msg.contains("alice") && msg.contains("until"), "{msg}");
    let over_nats = bot_answer(
        &nc,
        "hlc",
        &rid,
        br#"{"input": "Bob"}"#.to_vec(),
        Some(&token("bob")),
    )
    .await;
    assert_eq!(over_nats["error"]["code"], "claimed", "{over_nats}");
    let taken = bot_claim(&nc, "hlc", &rid, json!({}), &token("bob")).await;
    assert_eq!(taken["error"]["code"], "claimed", "{taken}");
    // Renewed for a minute, then given back.
    let (s, b) = alice
        .post(&claim, &json!({"ttl_seconds": 60}))
        .await
        .expect("renew");
    assert_eq!(s, 200, "{b}");
    let (s, b) = alice
        .post(&claim, &json!({"ttl_seconds": 5}))
        .await
        .expect("claim");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (400, Some("bad_request")),
        "{b}"
    );
    let (s, b) = alice
        .post(&claim, &json!({"release": true}))
        .await
        .expect("release");
    assert_eq!((s, &b["claim"]), (200, &Value::Null), "{b}");
    // Bob takes it over NATS; alice is held off; an operator breaks it.
    let taken = bot_claim(&nc, "hlc", &rid, json!({"ttl_seconds": 120}), &token("bob")).await;
    assert_eq!(taken["claim"]["by"], "bob", "{taken}");
    let (s, b) = alice
        .post(&respond, &json!({"input": "Alice"}))
        .await
        .expect("answer");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("claimed")),
        "{b}"
    );
    let (s, b) = alice
        .post(&claim, &json!({"release": true}))
        .await
        .expect("release");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("claimed")),
        "only bob or an operator: {b}"
    );
    let (s, b) = ops
        .post(&claim, &json!({"release": true}))
        .await
        .expect("break");
    assert_eq!((s, &b["claim"]), (200, &Value::Null), "{b}");
    let (s, b) = alice
        .post(&respond, &json!({"input": "Alice"}))
        .await
        .expect("answer");
    assert_eq!((s, &b["status"]), (200, &json!("accepted")), "{b}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let (s, b) = bob.post(&claim, &json!({})).await.expect("claim");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("already_resolved")),
        "{b}"
    );

    let mut changes = vec![];
    while changes.len() < 5 {
        let m = tokio::time::timeout(Duration::from_secs(5), updates.next())
            .await
            .expect("an update in time")
            .expect("message");
        let u: Value = delta_protocol::events::decode::<Value>(&m.payload)
            .expect("a CloudEvent of an update")
            .data;
        changes.push(format!(
            "{} {}",
            u["change"].as_str().unwrap_or(""),
            u["by"].as_str().unwrap_or("")
        ));
    }
    assert_eq!(
        changes,
        [
            "claimed alice",
            "claimed alice",
            "released alice",
            "claimed bob",
            "claim_broken ops"
        ]
    );
}

/// An answer that echoes the hash of another version of the question is refused (`409 stale`)
/// on both channels and changes nothing; the right hash is journaled with the decision.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_to_another_version_of_the_question_is_stale() {
    let fleet = Fleet::start("hls", 1, 1).await;
    let nc = fleet.nats().await;
    let run = fleet.submit("hello", "greet").await;
    let rid = fleet.pending(run).await;
    let (_, view) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    let hash = view["request_hash"].as_str().expect("hash").to_owned();
    assert_eq!(hash.len(), 64);
    assert_eq!(
        view["request"]["request_hash"].as_str(),
        Some(hash.as_str())
    );
    let other = "0".repeat(64);
    let (s, b) = fleet
        .answer(&rid, json!({"input": "Ada", "request_hash": other}))
        .await;
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("stale")),
        "{b}"
    );
    let body = json!({"input": "Ada", "request_hash": other});
    let reply = bot_answer(&nc, "hls", &rid, serde_json::to_vec(&body).unwrap(), None).await;
    assert_eq!(reply["error"]["code"], "stale", "{reply}");
    let (_, view) = fleet
        .client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(view["state"], "PENDING", "a stale answer changes nothing");
    let (s, b) = fleet
        .answer(&rid, json!({"input": "Ada", "request_hash": hash}))
        .await;
    assert_eq!(s, 200, "{b}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let asked = stored
        .journal
        .iter()
        .find_map(|e| match &e.event {
            Event::HumanInputRequest(q) => Some(q.clone()),
            _ => None,
        })
        .expect("asked");
    assert_eq!(asked.request_hash.as_deref(), Some(hash.as_str()));
    assert_eq!(
        asked.hash(),
        hash,
        "the journaled request hashes to what was shown"
    );
    assert_eq!(
        delta_e2e::answers_of(&stored)[0].request_hash.as_deref(),
        Some(hash.as_str())
    );
}

/// What one call of the storm got back.
#[derive(Debug)]
enum Got {
    /// 200 (answer: `accepted` or `counted`; claim: the claim).
    Ok,
    /// A refusal and its code.
    Refused(String),
}

/// 1,000 concurrent votes, claims and answers over HTTP and NATS on 50 questions that need 3
/// approvals: every run resumes exactly once, each question is decided by exactly one side
/// reaching the count, and every refusal carries the code its reason calls for.
#[tokio::test(flavor = "multi_thread")]
async fn a_storm_of_votes_and_claims_resumes_each_run_once() {
    const RUNS: usize = 50;
    const CALLS: usize = 1000;
    const VOTERS: usize = 8;
    let dir = tempfile::tempdir().expect("tmp");
    let names: Vec<String> = (0..VOTERS).map(|i| format!("v{i}")).collect();
    let toks: Vec<String> = names.iter().map(|n| token(n)).collect();
    let mut entries: Vec<(&str, &str, &str, &str)> = names
        .iter()
        .zip(&toks)
        .map(|(n, t)| (n.as_str(), t.as_str(), "answer", "leads"))
        .collect();
    let sub_token = token("sub");
    entries.push(("sub", &sub_token, "submit", ""));
    let tokens = tokens_file(dir.path(), &entries);
    let fleet = Fleet::start_with("hlr", 1, 2, |s| s.tokens_file = Some(tokens.clone())).await;
    fleet.add_agent(
        "storm",
        "name: storm\nbrain: scripted\ntools:\n  - name: after\n    exec: \"echo after\"\n",
        "steps:\n  - ask_human:\n      prompt: \"Go?\"\n      approvals: {min: 3, of: [\"group:leads\"]}\n      options:\n        - {id: yes, label: Yes, action: APPROVE_AND_EXECUTE}\n        - {id: no, label: No, action: REJECT_WITH_REASON}\n  - tool: after\n  - finish: \"${answer}\"\n",
    );
    let sub = fleet.client.with_token(Some(&sub_token));
    let mut runs = vec![];
    for _ in 0..RUNS {
        runs.push(submit_as(&sub, "storm", "go").await);
    }
    let mut rids = vec![];
    for run in &runs {
        rids.push(pending(&sub, *run).await);
    }
    let nc = fleet.nats().await;
    let clients: Vec<Client> = toks
        .iter()
        .map(|t| fleet.client.with_token(Some(t)))
        .collect();
    let limit = Arc::new(tokio::sync::Semaphore::new(48));
    let mut calls = tokio::task::JoinSet::new();
    // A fixed, varied plan: call i picks a question, a voter, a channel and what to do.
    for i in 0..CALLS {
        let rid = rids[(i * 7 + i / 13) % RUNS].clone();
        let voter = (i * 5 + i / 50) % VOTERS;
        let over_nats = i % 2 == 1;
        let what = i % 10;
        let client = clients[voter].clone();
        let nc = nc.clone();
        let tok = toks[voter].clone();
        let permit = limit.clone().acquire_owned().await.expect("permit");
        calls.spawn(async move {
            let _permit = permit;
            let (kind, body, path) = match what {
                // Claims, each given back at once (a claim kept would hold the others off).
                0 | 5 => ("claim", json!({"ttl_seconds": 30}), "claim"),
                1 => ("release", json!({"release": true}), "claim"),
                // Votes: mostly approvals, some rejections.
                3 | 7 => (
                    "vote",
                    json!({"option_id": "no", "input": "not now"}),
                    "response",
                ),
                _ => ("vote", json!({"option_id": "yes"}), "response"),
            };
            let got = if over_nats {
                let subject = format!(
                    "hlr.interactions.{}.{rid}",
                    if path == "claim" { "claim" } else { "respond" }
                );
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Authorization", format!("Bearer {tok}").as_str());
                let reply = nc
                    .request_with_headers(
                        subject,
                        headers,
                        serde_json::to_vec(&body).expect("json").into(),
                    )
                    .await
                    .expect("reply");
                let v: Value = serde_json::from_slice(&reply.payload).expect("reply JSON");
                match v["error"]["code"].as_str() {
                    Some(code) => Got::Refused(code.to_owned()),
                    None => Got::Ok,
                }
            } else {
                let (s, v) = client
                    .post(&format!("/v1/interactions/{rid}/{path}"), &body)
                    .await
                    .expect("call");
                match s {
                    200 => Got::Ok,
                    _ => Got::Refused(format!(
                        "{s} {}",
                        v["error"]["code"].as_str().unwrap_or("?")
                    )),
                }
            };
            if kind == "claim" && matches!(got, Got::Ok) {
                // Give it back: the storm goes on.
                let _ = client
                    .post(
                        &format!("/v1/interactions/{rid}/claim"),
                        &json!({"release": true}),
                    )
                    .await;
            }
            (kind, over_nats, got)
        });
    }
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    while let Some(done) = calls.join_next().await {
        let (kind, over_nats, got) = done.expect("call task");
        let key = match got {
            Got::Ok => format!("{kind} ok"),
            Got::Refused(code) => {
                let code = code.rsplit(' ').next().unwrap_or("").to_owned();
                let expected: &[&str] = match kind {
                    "vote" => &["already_voted", "already_resolved", "claimed"],
                    // A voter may not claim what they voted on.
                    _ => &["claimed", "already_resolved", "already_voted"],
                };
                assert!(
                    expected.contains(&code.as_str()),
                    "{kind} (nats: {over_nats}) refused with `{code}`"
                );
                format!("{kind} {code}")
            }
        };
        *tally.entry(key).or_default() += 1;
    }
    eprintln!("storm: {tally:?}");
    // The storm itself decided most questions (a fixed plan of about 14 votes each, against 3
    // needed): the runs below resume from concurrent calls, not from the top-up.
    let mut decided_in_storm = 0;
    for rid in &rids {
        let (status, view) = clients[0]
            .get(&format!("/v1/interactions/{rid}"))
            .await
            .expect("get");
        assert_eq!(status, 200, "{view}");
        if view["state"] != "PENDING" {
            decided_in_storm += 1;
        }
    }
    eprintln!("storm: {decided_in_storm} of {RUNS} questions decided");
    assert!(
        decided_in_storm >= RUNS / 2,
        "only {decided_in_storm} of {RUNS} questions decided by the storm"
    );
    // Whatever is still undecided gets the votes it lacks, from voters who have not voted.
    for (run, rid) in runs.iter().zip(&rids) {
        for (i, client) in clients.iter().enumerate() {
            let (_, view) = client
                .get(&format!("/v1/interactions/{rid}"))
                .await
                .expect("get");
            if view["state"] != "PENDING" {
                break;
            }
            let voted: Vec<&str> = view["tally"]["approved_by"]
                .as_array()
                .into_iter()
                .chain(view["tally"]["rejected_by"].as_array())
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if voted.contains(&names[i].as_str()) {
                continue;
            }
            let (s, b) = client
                .post(
                    &format!("/v1/interactions/{rid}/response"),
                    &json!({"option_id": "yes"}),
                )
                .await
                .expect("vote");
            assert!(
                s == 200 || b["error"]["code"] == "already_resolved",
                "{run}: {b}"
            );
        }
    }
    let mut decided_by: HashMap<&str, usize> = HashMap::new();
    for run in &runs {
        fleet.wait_status(*run, RunStatus::Completed).await;
        let stored = fleet.store.load(*run).await.expect("load");
        let cast = votes(&stored);
        let mut voters: Vec<&str> = cast.iter().map(|v| v.responder.id.as_str()).collect();
        voters.sort_unstable();
        voters.dedup();
        assert_eq!(voters.len(), cast.len(), "{run}: a voter counted twice");
        let approvals = cast.iter().filter(|v| v.ballot == Ballot::Approve).count();
        let rejections = cast.len() - approvals;
        let decisions = delta_e2e::answers_of(&stored);
        assert_eq!(decisions.len(), 1, "{run}: decided once");
        // Exactly one side reached 3, with the vote that decided it last.
        let side = match decisions[0].action {
            OptionAction::ApproveAndExecute => {
                assert_eq!((approvals, rejections < 3), (3, true), "{run}");
                "approved"
            }
            _ => {
                assert_eq!((rejections, approvals < 3), (3, true), "{run}");
                "rejected"
            }
        };
        *decided_by.entry(side).or_default() += 1;
        assert_eq!(
            cast.last().map(|v| v.responder.id.as_str()),
            Some(decisions[0].responder.id.as_str()),
            "{run}: the deciding vote is the last one counted"
        );
        // Resumed once: the question (an `ask_human` step) and the step after it, once each.
        delta_e2e::assert_each_step_once(&stored, 2);
        let starts = stored
            .journal
            .iter()
            .filter(|e| matches!(e.event, Event::EngineStart(_)))
            .count();
        assert_eq!(starts, 2, "{run}: started, then resumed once");
    }
    eprintln!("storm decisions: {decided_by:?}");
    assert!(tally.keys().any(|k| k.starts_with("vote ok")));
    assert!(tally.keys().any(|k| k.starts_with("claim ok")));
}

/// Escalation steps are carried out on time by the gateways alone (every worker stopped), each
/// once although two gateways run the reconciler: a reminder, more responders (who may then
/// answer and claim), the default applied; each is journaled and announced on NATS and the live
/// stream; the run resumes with the default when a worker is back.
#[tokio::test(flavor = "multi_thread")]
async fn escalation_steps_fire_on_time_with_every_worker_stopped() {
    let (mut fleet, _tokens) = fleet_with_tokens(
        "hle",
        2,
        1,
        &[
            ("sub", &token("sub"), "submit, answer", ""),
            ("alice", &token("alice"), "answer", ""),
            ("carol", &token("carol"), "answer", "oncall"),
        ],
    )
    .await;
    fleet.add_agent(
        "escalating",
        "name: escalating\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"Restart the database?\"\n      allowed_responders: [alice]\n      default_option_id: later\n      escalation:\n        - {after: 2s, remind: true}\n        - {after: 4s, add_responders: [\"group:oncall\"]}\n        - {after: 7s, apply_default: true}\n      options:\n        - {id: now, label: Now}\n        - {id: later, label: Later}\n  - finish: \"chose ${answer}\"\n",
    );
    let who = |n: &str| fleet.client.with_token(Some(&token(n)));
    let (sub, carol) = (who("sub"), who("carol"));
    let nc = fleet.nats().await;
    let mut escalated = nc
        .subscribe("hle.interactions.escalated.>")
        .await
        .expect("sub");
    let run = submit_as(&sub, "escalating", "go").await;
    let rid = pending(&sub, run).await;
    for w in &mut fleet.workers {
        delta_e2e::workers::stop(w);
    }
    let (_, view) = sub
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    let asked: delta_protocol::Timestamp =
        serde_json::from_value(view["created_at"].clone()).expect("created_at");
    assert_eq!(view["escalated"], 0);
    // Before the second step carol may not answer.
    let claim = format!("/v1/interactions/{rid}/claim");
    let (s, b) = carol.post(&claim, &json!({})).await.expect("claim");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );

    let mut steps = vec![];
    for expected in 1..=3 {
        let m = tokio::time::timeout(Duration::from_secs(15), escalated.next())
            .await
            .expect("a step in time")
            .expect("message");
        let seen_at = delta_protocol::Timestamp::now();
        let e: delta_protocol::Escalated = delta_protocol::events::decode(&m.payload)
            .expect("a CloudEvent of a step")
            .data;
        assert_eq!(
            (e.step, e.of, e.request_id.to_string()),
            (expected, 3, rid.clone())
        );
        let due = asked.micros() + i64::try_from(e.what.after.as_micros()).unwrap();
        assert_eq!(e.due_at.micros(), due);
        let late_ms = (seen_at.micros() - due) / 1000;
        assert!(
            (0..2000).contains(&late_ms),
            "step {expected} was announced {late_ms} ms after it was due"
        );
        if expected == 2 {
            // The on-call group may answer now: carol can claim it (and give it back).
            let (s, b) = carol.post(&claim, &json!({})).await.expect("claim");
            assert_eq!(s, 200, "{b}");
            let (s, _) = carol
                .post(&claim, &json!({"release": true}))
                .await
                .expect("release");
            assert_eq!(s, 200);
            let (_, v) = carol
                .get(&format!("/v1/interactions/{rid}"))
                .await
                .expect("get");
            assert_eq!(v["added_responders"], json!(["group:oncall"]));
        }
        steps.push(e);
    }
    assert!(steps[0].what.remind && !steps[1].what.add_responders.is_empty());
    assert!(steps[2].what.apply_default);
    let (_, v) = sub
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get");
    assert_eq!(
        (v["state"].as_str(), v["escalated"].as_u64()),
        (Some("EXPIRED"), Some(3))
    );
    // The live stream has them too.
    let mut live = sub
        .sse("/v1/interactions/stream", Some(0))
        .await
        .expect("sse");
    let mut on_stream = 0;
    while on_stream < 3 {
        let e = live.next(Duration::from_secs(10)).await.expect("an event");
        if e.event == "escalated" {
            on_stream += 1;
        }
    }
    // A worker again: the run goes on with the default.
    fleet.add_worker("back");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    assert_eq!(stored.record.result.as_deref(), Some("chose later"));
    let journaled: Vec<u32> = stored
        .journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::Escalated(x) => Some(x.step),
            _ => None,
        })
        .collect();
    assert_eq!(
        journaled,
        [1, 2, 3],
        "each step journaled once, with two gateways"
    );
    let note = stored
        .journal
        .iter()
        .find_map(|e| match &e.event {
            Event::SystemMessage(m) if m.content.contains("escalation") => Some(m.content.clone()),
            _ => None,
        })
        .expect("the default's note");
    assert!(
        note.contains("applied the default option `later`"),
        "{note}"
    );
}

/// A delegation lets bob answer what only alice may, over HTTP and NATS, recorded "bob on
/// behalf of alice"; it never lets bob approve his own run; once ended, bob is refused again;
/// only alice (or an operator) may delegate alice's authority.
#[tokio::test(flavor = "multi_thread")]
async fn a_delegation_lets_bob_answer_for_alice_but_never_approve_his_own_run() {
    let (fleet, _tokens) = fleet_with_tokens(
        "hld",
        1,
        1,
        &[
            ("alice", &token("alice"), "answer", "leads"),
            ("bob", &token("bob"), "submit, answer", ""),
            ("carol", &token("carol"), "submit", ""),
        ],
    )
    .await;
    fleet.add_agent(
        "budget",
        "name: budget\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"Approve the budget?\"\n      allowed_responders: [\"group:leads\"]\n      options:\n        - {id: yes, label: Yes, action: APPROVE_AND_EXECUTE}\n        - {id: no, label: No, action: REJECT_WITH_REASON}\n  - finish: \"${answer}\"\n",
    );
    let who = |n: &str| fleet.client.with_token(Some(&token(n)));
    let (alice, bob, carol) = (who("alice"), who("bob"), who("carol"));
    let nc = fleet.nats().await;
    let until = delta_protocol::Timestamp::from_micros(
        delta_protocol::Timestamp::now().micros() + 3_600_000_000,
    )
    .expect("time");

    // Carol's run: bob may not approve it on his own.
    let run = submit_as(&carol, "budget", "go").await;
    let rid = pending(&alice, run).await;
    let respond = format!("/v1/interactions/{rid}/response");
    let (s, b) = bob
        .post(&respond, &json!({"option_id": "yes"}))
        .await
        .expect("answer");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );
    // Bob cannot delegate alice's authority to himself; alice can.
    let (s, b) = bob
        .post(
            "/v1/delegations",
            &json!({"from": "alice", "to": "bob", "until": until}),
        )
        .await
        .expect("delegate");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );
    let (s, b) = alice
        .post("/v1/delegations", &json!({"to": "nobody", "until": until}))
        .await
        .expect("delegate");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (422, Some("invalid_args")),
        "{b}"
    );
    let (s, d) = alice
        .post(
            "/v1/delegations",
            &json!({"to": "bob", "until": until, "reason": "on leave"}),
        )
        .await
        .expect("delegate");
    assert_eq!(s, 201, "{d}");
    assert_eq!(
        (d["from"].as_str(), d["to"].as_str()),
        (Some("alice"), Some("bob"))
    );
    let (_, listed) = bob.get("/v1/delegations").await.expect("list");
    assert_eq!(listed["delegations"][0]["id"], d["id"]);
    // Now bob answers over NATS, on alice's behalf.
    let reply = bot_answer(
        &nc,
        "hld",
        &rid,
        br#"{"option_id": "yes"}"#.to_vec(),
        Some(&token("bob")),
    )
    .await;
    assert_eq!(reply["ok"], true, "{reply}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let decided = delta_e2e::answers_of(&stored);
    assert_eq!(
        (
            decided[0].responder.id.as_str(),
            decided[0].responder.on_behalf_of.as_deref()
        ),
        ("bob", Some("alice"))
    );

    // Bob's own run: the delegation does not let him approve it, but he may reject it.
    let own = submit_as(&bob, "budget", "go").await;
    let own_rid = pending(&alice, own).await;
    let own_path = format!("/v1/interactions/{own_rid}/response");
    let (s, b) = bob
        .post(&own_path, &json!({"option_id": "yes"}))
        .await
        .expect("answer");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("own run"),
        "{b}"
    );
    let (s, b) = bob
        .post(&own_path, &json!({"option_id": "no", "input": "too much"}))
        .await
        .expect("answer");
    assert_eq!(s, 200, "rejecting his own run is not approving it: {b}");
    // Ended: bob is refused again (a run of carol's).
    let id = d["id"].as_str().expect("id");
    let (s, b) = carol
        .delete(&format!("/v1/delegations/{id}"))
        .await
        .expect("delete");
    assert_eq!(s, 403, "carol may not end it: {b}");
    let (s, _) = alice
        .delete(&format!("/v1/delegations/{id}"))
        .await
        .expect("delete");
    assert_eq!(s, 200);
    let again = submit_as(&carol, "budget", "go").await;
    let again_rid = pending(&alice, again).await;
    let (s, b) = bob
        .post(
            &format!("/v1/interactions/{again_rid}/response"),
            &json!({"input": "x", "option_id": "no"}),
        )
        .await
        .expect("answer");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (403, Some("forbidden")),
        "{b}"
    );
}

/// One person's authority counts once in a quorum, however many delegates use it: alice's two
/// delegates cannot fill a 2-of-leads vote alone, nor can alice add her own vote to theirs; a
/// voter cannot then claim the question to hold the others off.
#[tokio::test(flavor = "multi_thread")]
async fn one_persons_authority_counts_once_in_a_quorum() {
    let (fleet, _tokens) = fleet_with_tokens(
        "hla",
        1,
        1,
        &[
            ("sub", &token("sub"), "submit", ""),
            ("alice", &token("alice"), "answer", "leads"),
            ("dave", &token("dave"), "answer", "leads"),
            ("bob", &token("bob"), "answer", ""),
            ("carol", &token("carol"), "answer", ""),
        ],
    )
    .await;
    fleet.add_agent("council", COUNCIL_CONFIG, COUNCIL_SCRIPT);
    let who = |n: &str| fleet.client.with_token(Some(&token(n)));
    let (sub, alice, dave, bob, carol) = (
        who("sub"),
        who("alice"),
        who("dave"),
        who("bob"),
        who("carol"),
    );
    let until = delta_protocol::Timestamp::from_micros(
        delta_protocol::Timestamp::now().micros() + 3_600_000_000,
    )
    .expect("time");
    for to in ["bob", "carol"] {
        let (s, b) = alice
            .post("/v1/delegations", &json!({"to": to, "until": until}))
            .await
            .expect("delegate");
        assert_eq!(s, 201, "{b}");
    }
    let run = submit_as(&sub, "council", "go").await;
    let rid = pending(&alice, run).await;
    let path = format!("/v1/interactions/{rid}/response");
    let approve = json!({"option_id": "approve"});
    let (s, b) = bob.post(&path, &approve).await.expect("vote");
    assert_eq!((s, &b["status"]), (200, &json!("counted")), "{b}");
    for (name, client) in [("carol", &carol), ("alice", &alice)] {
        let (s, b) = client.post(&path, &approve).await.expect("vote");
        assert_eq!(
            (s, b["error"]["code"].as_str()),
            (409, Some("already_voted")),
            "{name} would use alice's authority twice: {b}"
        );
    }
    let (s, b) = bob
        .post(&format!("/v1/interactions/{rid}/claim"), &json!({}))
        .await
        .expect("claim");
    assert_eq!(
        (s, b["error"]["code"].as_str()),
        (409, Some("already_voted")),
        "{b}"
    );
    let (s, b) = dave.post(&path, &approve).await.expect("vote");
    assert_eq!((s, &b["status"]), (200, &json!("accepted")), "{b}");
    fleet.wait_status(run, RunStatus::Completed).await;
    let stored = fleet.store.load(run).await.expect("load");
    let cast: Vec<(String, Option<String>)> = votes(&stored)
        .into_iter()
        .map(|v| (v.responder.id, v.responder.on_behalf_of))
        .collect();
    assert_eq!(
        cast,
        [
            ("bob".to_owned(), Some("alice".to_owned())),
            ("dave".to_owned(), None)
        ]
    );
}
