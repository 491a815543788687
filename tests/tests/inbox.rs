//! The web inbox in a real browser: headless Chromium driven over WebDriver, against real
//! nats-server, redis-server, gateway and worker processes (one fleet and key prefix per test).
//!
//! Every wait polls a condition with a timeout; nothing sleeps to assert. A failing test leaves
//! a screenshot and the page source in `<target>/browser-artifacts/` (or `DELTA_ARTIFACTS_DIR`);
//! `DELTA_INBOX_SCREENSHOTS=1` saves screenshots of passing tests too. Chromium and chromedriver
//! come from `deploy/install-browser.sh`: without them these tests fail, naming it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use delta_e2e::browser::{Browser, Screen};
use delta_e2e::fleet::{Fleet, pending};
use delta_e2e::gateways::Client;
use delta_protocol::{ActionStatus, Event, HumanInputReceived, RunId, RunStatus};
use delta_store::RunStore;
use serde_json::{Value, json};

/// WebDriver's codes for keys.
const TAB: &str = "\u{E004}";
const ENTER: &str = "\u{E007}";
const ESCAPE: &str = "\u{E00C}";

/// The CSS selector of a question's card.
fn card(rid: &str) -> String {
    format!(r#"article[data-request-id="{rid}"]"#)
}

/// An agent that asks (`ask` is the YAML of its `ask_human` step, indented six spaces), echoes
/// the answer and finishes with it.
fn add_asker(fleet: &Fleet, name: &str, ask: &str) {
    fleet.add_agent(
        name,
        &format!(
            "name: {name}\nbrain: scripted\ntools:\n  - name: echo\n    exec: \"echo ${{text}}\"\n    idempotent: true\n"
        ),
        &format!(
            "steps:\n  - ask_human:\n{ask}\n  - tool: echo\n    args: {{text: \"got ${{answer}}\"}}\n  - finish: \"done: ${{answer}}\"\n"
        ),
    );
}

fn answers(run: &delta_store::StoredRun) -> Vec<HumanInputReceived> {
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::HumanInputReceived(h) => Some(h.clone()),
            _ => None,
        })
        .collect()
}

fn results(run: &delta_store::StoredRun) -> Vec<(ActionStatus, String)> {
    run.journal
        .iter()
        .filter_map(|e| match &e.event {
            Event::ActionResult(r) => Some((r.status, r.observation_content.clone())),
            _ => None,
        })
        .collect()
}

async fn open_inbox(browser: &Browser, fleet: &Fleet) {
    browser.goto(&format!("{}/", fleet.gateways[0].url)).await;
}

async fn wait_live(browser: &Browser) {
    browser
        .wait_for(
            "the live stream to connect",
            "return document.getElementById('conn').dataset.state === 'live';",
            vec![],
        )
        .await;
}

/// Waits until the card of `rid` says `text` in its outcome line; returns that line.
async fn wait_outcome(browser: &Browser, rid: &str, text: &str) -> String {
    browser
        .wait_for(
            &format!("the card of {rid} to say {text:?}"),
            "const o = document.querySelector(arguments[0] + ' .outcome'); \
             return o && !o.hidden && o.textContent.includes(arguments[1]) ? o.textContent : null;",
            vec![json!(card(rid)), json!(text)],
        )
        .await
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn wait_gone(browser: &Browser, rid: &str, within: Duration) {
    browser
        .wait_for_within(
            within,
            &format!("the card of {rid} to leave the page"),
            "return document.querySelector(arguments[0]) === null;",
            vec![json!(card(rid))],
        )
        .await;
}

async fn interaction_state(client: &Client, rid: &str) -> Value {
    let (_, ix) = client
        .get(&format!("/v1/interactions/{rid}"))
        .await
        .expect("get interaction");
    ix["state"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_free_text_answer_in_the_inbox_completes_the_run() {
    let fleet = Fleet::start("iba", 1, 1).await;
    add_asker(
        &fleet,
        "asker",
        "      prompt: \"What is your name?\"\n      timeout_seconds: 600",
    );
    let browser = Browser::start(
        "a_free_text_answer_in_the_inbox_completes_the_run",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let run = fleet.submit("asker", "greet").await;
            let rid = fleet.pending(run).await;
            open_inbox(&browser, &fleet).await;
            let c = card(&rid);
            browser.find(&c).await;
            // What the card shows: agent, a link to its run, its age, the time left (ticking).
            let head = browser
                .text(&format!("{c} .card-head"))
                .await
                .expect("card head");
            let id = run.to_string();
            let short = &id[id.len() - 8..];
            for part in [
                "Question",
                "asker",
                &format!("run {short}"),
                "asked",
                "left, then the run fails",
            ] {
                assert!(head.contains(part), "{part:?} not in {head:?}");
            }
            let href = browser
                .js(
                    "return document.querySelector(arguments[0] + ' .run-link').getAttribute('href');",
                    vec![json!(c)],
                )
                .await;
            assert_eq!(href, json!(format!("/runs/{run}")));
            let left = browser
                .text(&format!("{c} .deadline"))
                .await
                .expect("deadline");
            assert!(left.starts_with("9 min") || left.starts_with("10 min"), "{left}");
            browser
                .wait_for(
                    "the time left to tick",
                    "return document.querySelector(arguments[0] + ' .deadline').textContent !== arguments[1];",
                    vec![json!(c), json!(left)],
                )
                .await;
            // A name for answers (the gateway has no tokens), then the answer: Enter sends.
            browser.click("#settings-toggle").await;
            browser.type_into("#responder", "Ada Lovelace").await;
            browser.click("#settings-save").await;
            browser
                .wait_for(
                    "the settings to close",
                    "return document.getElementById('settings').hidden;",
                    vec![],
                )
                .await;
            browser
                .type_into(&format!("{c} textarea[name=input]"), "Ada\u{E007}")
                .await;
            wait_outcome(&browser, &rid, "Answer sent").await;
            // The focus is on what became of the answer, not dropped to the page's start.
            let focused = browser
                .js("return document.activeElement.className;", vec![])
                .await;
            assert!(
                focused.as_str().is_some_and(|c| c.contains("outcome")),
                "{focused}"
            );
            fleet.wait_status(run, RunStatus::Completed).await;
            let stored = fleet.store.load(run).await.expect("load");
            assert_eq!(stored.record.result.as_deref(), Some("done: Ada"));
            let got = answers(&stored);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].input.as_deref(), Some("Ada"));
            assert_eq!(
                (got[0].responder.id.as_str(), got[0].responder.via),
                ("Ada Lovelace", delta_protocol::Via::Http)
            );
            // Answered: the card leaves, and the inbox says nothing is waiting.
            wait_gone(&browser, &rid, Duration::from_secs(10)).await;
            browser
                .wait_for(
                    "the empty inbox",
                    "return !document.getElementById('empty').hidden;",
                    vec![],
                )
                .await;
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn approving_a_tool_call_runs_it_with_or_without_edited_args() {
    let fleet = Fleet::start("ibb", 1, 1).await;
    let browser = Browser::start(
        "approving_a_tool_call_runs_it_with_or_without_edited_args",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let plain = fleet.submit("gated", "shout").await;
            let plain_rid = fleet.pending(plain).await;
            let edited = fleet.submit("gated", "shout").await;
            let edited_rid = fleet.pending(edited).await;
            open_inbox(&browser, &fleet).await;
            let c = card(&plain_rid);
            browser.find(&c).await;
            browser.find(&card(&edited_rid)).await;
            // Oldest first.
            let order = browser
                .js(
                    "return [...document.querySelectorAll('#cards article')].map(a => a.dataset.requestId);",
                    vec![],
                )
                .await;
            assert_eq!(order, json!([plain_rid, edited_rid]));
            // The call: tool, command, arguments as JSON; terminate set apart as dangerous.
            let facts = browser
                .text(&format!("{c} .tool-facts"))
                .await
                .expect("facts");
            assert!(facts.contains("shout") && facts.contains("echo hello"), "{facts}");
            let args = browser.text(&format!("{c} pre.args")).await.expect("args");
            assert_eq!(
                serde_json::from_str::<Value>(&args).expect("args JSON"),
                json!({"text": "hello"})
            );
            let grouped = browser
                .js(
                    "const c = document.querySelector(arguments[0]); \
                     return [!!c.querySelector('.options-danger [data-option-id=terminate]'), \
                             !!c.querySelector('.options-danger [data-option-id=approve]')];",
                    vec![json!(c)],
                )
                .await;
            assert_eq!(grouped, json!([true, false]));
            browser.snapshot("-desktop").await;

            // As asked.
            browser
                .click(&format!("{c} [data-option-id=approve]"))
                .await;
            wait_outcome(&browser, &plain_rid, "Answer sent").await;
            fleet.wait_status(plain, RunStatus::Completed).await;
            let stored = fleet.store.load(plain).await.expect("load");
            assert_eq!(
                results(&stored),
                [(ActionStatus::Success, "hello\n".to_owned())]
            );
            assert_eq!(answers(&stored)[0].option_id.as_deref(), Some("approve"));

            // With edited arguments: JSON that is not an object is refused in the page.
            let c = card(&edited_rid);
            browser
                .click(&format!("{c} .args-head button"))
                .await;
            let editor = format!("{c} textarea.args-edit");
            browser.find(&editor).await.clear().await.expect("clear");
            browser.type_into(&editor, "{\"text\": ").await;
            browser
                .click(&format!("{c} [data-option-id=approve]"))
                .await;
            let error = browser
                .wait_for(
                    "the JSON error",
                    "return document.querySelector(arguments[0] + ' .field-error').textContent;",
                    vec![json!(c)],
                )
                .await;
            assert!(error.as_str().unwrap_or_default().contains("JSON object"), "{error}");
            assert_eq!(interaction_state(&fleet.client, &edited_rid).await, "PENDING");
            browser.find(&editor).await.clear().await.expect("clear");
            browser
                .type_into(&editor, "{\"text\": \"edited hello\"}")
                .await;
            browser
                .click(&format!("{c} [data-option-id=approve]"))
                .await;
            wait_outcome(&browser, &edited_rid, "Answer sent").await;
            fleet.wait_status(edited, RunStatus::Completed).await;
            let stored = fleet.store.load(edited).await.expect("load");
            assert_eq!(
                results(&stored),
                [(ActionStatus::Success, "edited hello\n".to_owned())]
            );
            let got = answers(&stored);
            assert_eq!(
                got[0].data.as_ref().map(|d| d["args"].clone()),
                Some(json!({"text": "edited hello"}))
            );
            assert!(got[0].edited_args.is_some(), "{:?}", got[0]);
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rejecting_a_tool_call_journals_the_reason() {
    let fleet = Fleet::start("ibc", 1, 1).await;
    let browser =
        Browser::start("rejecting_a_tool_call_journals_the_reason", Screen::Desktop).await;
    browser
        .checked(async {
            let run = fleet.submit("gated", "shout").await;
            let rid = fleet.pending(run).await;
            open_inbox(&browser, &fleet).await;
            let c = card(&rid);
            browser.click(&format!("{c} [data-option-id=reject]")).await;
            // The reason's box, labelled with the option's prompt, has the focus.
            let focused = browser
                .js(
                    "const a = document.activeElement; \
                     return [a.name, document.querySelector('label[for=\"' + a.id + '\"]').textContent];",
                    vec![],
                )
                .await;
            assert_eq!(focused, json!(["input", "Why is it rejected?"]));
            // Sending without a reason is refused in the page.
            browser.click(&format!("{c} [data-confirm=reject]")).await;
            wait_outcome(&browser, &rid, "needs text").await;
            assert_eq!(interaction_state(&fleet.client, &rid).await, "PENDING");
            browser
                .type_into(&format!("{c} .step textarea[name=input]"), "not on a Friday")
                .await;
            browser.click(&format!("{c} [data-confirm=reject]")).await;
            wait_outcome(&browser, &rid, "Answer sent").await;
            fleet.wait_status(run, RunStatus::Completed).await;
            let stored = fleet.store.load(run).await.expect("load");
            let got = answers(&stored);
            assert_eq!(got[0].option_id.as_deref(), Some("reject"));
            assert_eq!(got[0].input.as_deref(), Some("not on a Friday"));
            assert_eq!(
                results(&stored),
                [(
                    ActionStatus::Rejected,
                    "rejected: not on a Friday".to_owned()
                )]
            );
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dangerous_option_is_confirmed_in_the_page_first() {
    let fleet = Fleet::start("ibd", 1, 1).await;
    let browser = Browser::start(
        "a_dangerous_option_is_confirmed_in_the_page_first",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let run = fleet.submit("chooser", "Q4 report").await;
            let rid = fleet.pending(run).await;
            open_inbox(&browser, &fleet).await;
            let c = card(&rid);
            // Production is dangerous: set apart, and a click only asks for confirmation.
            browser
                .find(&format!("{c} .options-danger [data-option-id=production]"))
                .await;
            browser
                .click(&format!("{c} [data-option-id=production]"))
                .await;
            let step = browser
                .wait_for(
                    "the confirmation step",
                    "const s = document.querySelector(arguments[0] + ' .step'); return s && !s.hidden ? s.textContent : null;",
                    vec![json!(c)],
                )
                .await;
            assert!(step.as_str().unwrap_or_default().contains("Confirm: Production"), "{step}");
            browser.snapshot("-confirm").await;
            // Back: nothing was sent, the step is gone and the focus is back on the option.
            browser.click(&format!("{c} .step .btn:not([data-confirm])")).await;
            let back = browser
                .js(
                    "return [document.querySelector(arguments[0] + ' .step').hidden, document.activeElement.dataset.optionId];",
                    vec![json!(c)],
                )
                .await;
            assert_eq!(back, json!([true, "production"]));
            assert_eq!(interaction_state(&fleet.client, &rid).await, "PENDING");

            // The same with the keyboard only: Tab from the run link goes through the options
            // in reading order, Enter opens the confirmation with the focus on its button,
            // Escape closes it (the focus back on the option), Enter twice sends.
            browser
                .js(
                    "document.querySelector(arguments[0] + ' .run-link').focus(); return true;",
                    vec![json!(c)],
                )
                .await;
            let mut order = vec![];
            for _ in 0..4 {
                browser.press(TAB).await;
                order.push(
                    browser
                        .js("return document.activeElement.dataset.optionId || null;", vec![])
                        .await,
                );
            }
            assert_eq!(order, [json!("staging"), json!("other"), json!("stop"), json!("production")]);
            let focus_ring = browser
                .js(
                    "return getComputedStyle(document.activeElement).outlineStyle;",
                    vec![],
                )
                .await;
            assert_eq!(focus_ring, json!("solid"), "the focus is visible");
            browser.press(ENTER).await;
            let focused = browser
                .js("return document.activeElement.dataset.confirm || null;", vec![])
                .await;
            assert_eq!(focused, json!("production"));
            browser.press(ESCAPE).await;
            let back = browser
                .js(
                    "return [document.querySelector(arguments[0] + ' .step').hidden, document.activeElement.dataset.optionId];",
                    vec![json!(c)],
                )
                .await;
            assert_eq!(back, json!([true, "production"]));
            browser.press(ENTER).await;
            browser.press(ENTER).await;
            wait_outcome(&browser, &rid, "Answer sent").await;
            fleet.wait_status(run, RunStatus::Completed).await;
            let stored = fleet.store.load(run).await.expect("load");
            assert_eq!(
                stored.record.result.as_deref(),
                Some("production is ready")
            );
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_question_answered_elsewhere_leaves_the_open_inbox() {
    let fleet = Fleet::start("ibe", 1, 1).await;
    let browser = Browser::start(
        "a_question_answered_elsewhere_leaves_the_open_inbox",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let by_bot = fleet.submit("hello", "one").await;
            let bot_rid = fleet.pending(by_bot).await;
            let by_http = fleet.submit("hello", "two").await;
            let http_rid = fleet.pending(by_http).await;
            open_inbox(&browser, &fleet).await;
            browser.find(&card(&bot_rid)).await;
            browser.find(&card(&http_rid)).await;
            wait_live(&browser).await;
            // A bot answers over NATS: the card leaves within a few seconds, the other stays.
            let nc = fleet.nats().await;
            let reply = nc
                .request(
                    format!("ibe.interactions.respond.{bot_rid}"),
                    json!({"input": "Robo", "responder": {"id": "robo"}})
                        .to_string()
                        .into(),
                )
                .await
                .expect("bot reply");
            let reply: Value = serde_json::from_slice(&reply.payload).expect("reply JSON");
            assert_eq!(reply["ok"], json!(true), "{reply}");
            wait_gone(&browser, &bot_rid, Duration::from_secs(3)).await;
            assert!(
                browser.text(&card(&http_rid)).await.is_some(),
                "the other question stays"
            );
            let toast = browser
                .wait_for(
                    "a note of who answered",
                    "const t = document.getElementById('toast'); return t.hidden ? null : t.textContent;",
                    vec![],
                )
                .await;
            assert!(
                toast.as_str().unwrap_or_default().contains("answered by robo (nats)"),
                "{toast}"
            );
            // An HTTP answer from outside the page, the same.
            let (status, body) = fleet
                .answer(&http_rid, json!({"input": "Curl", "responder": {"id": "carol"}}))
                .await;
            assert_eq!(status, 200, "{body}");
            wait_gone(&browser, &http_rid, Duration::from_secs(3)).await;
            fleet.wait_status(by_bot, RunStatus::Completed).await;
            fleet.wait_status(by_http, RunStatus::Completed).await;
        })
        .await;
    browser.close().await;
}

/// A card stands still before it answers, and what leaves the page takes no keys with it: the
/// focus of a question answered elsewhere goes to the next card itself (not into its controls);
/// an answer sent while a card just came or went is not sent (another question's button could be
/// under the click); a typed question whose fields are named like a form's own methods renders
/// and answers (a form's named controls would shadow `addEventListener`).
#[tokio::test(flavor = "multi_thread")]
async fn cards_answer_only_once_they_stand_still_and_take_no_keys_along() {
    let fleet = Fleet::start("ibs", 1, 1).await;
    fleet.add_agent(
        "clobber",
        "name: clobber\nbrain: scripted\n",
        "steps:\n  - ask_human:\n      prompt: \"Fill in\"\n      response_schema:\n        type: object\n        properties:\n          addEventListener: {type: string, title: One}\n          querySelectorAll: {type: string, title: Two}\n        required: [addEventListener, querySelectorAll]\n  - finish: \"got ${answer.addEventListener} ${answer.querySelectorAll}\"\n",
    );
    fleet.add_agent(
        "sneaky",
        "name: sneaky\nbrain: scripted\ntools:\n  - name: run\n    exec: \"echo ${file}\"\n    approval: always\n    dangerous: true\n",
        "steps:\n  - tool: run\n    args: {file: \"report\\u202Efdp.exe\\U000E0041\"}\n  - finish: done\n",
    );
    let browser = Browser::start(
        "cards_answer_only_once_they_stand_still_and_take_no_keys_along",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let first = fleet.submit("hello", "one").await;
            let first_rid = fleet.pending(first).await;
            let typed = fleet.submit("clobber", "two").await;
            let typed_rid = fleet.pending(typed).await;
            open_inbox(&browser, &fleet).await;
            browser.find(&card(&first_rid)).await;
            let t = card(&typed_rid);
            browser.find(&format!("{t} input[data-field=addEventListener]")).await;
            wait_live(&browser).await;

            // The person types into the first card; someone else answers it.
            browser
                .type_into(&format!("{} textarea", card(&first_rid)), "Ad")
                .await;
            let (status, body) = fleet
                .answer(&first_rid, json!({"input": "Elsewhere"}))
                .await;
            assert_eq!(status, 200, "{body}");
            wait_gone(&browser, &first_rid, Duration::from_secs(5)).await;
            let focused = browser
                .js(
                    "const e = document.activeElement; return [e.tagName, e.dataset.requestId || null];",
                    vec![],
                )
                .await;
            assert_eq!(focused, json!(["ARTICLE", typed_rid]), "the focus is on the next card, not in it");
            assert_eq!(interaction_state(&fleet.client, &typed_rid).await, "PENDING");

            // The typed card is filled in; an answer sent right as another card arrives is held.
            browser
                .type_into(&format!("{t} input[data-field=addEventListener]"), "a")
                .await;
            browser
                .type_into(&format!("{t} input[data-field=querySelectorAll]"), "b")
                .await;
            let mut held = false;
            for i in 0..5 {
                let run = fleet.submit("hello", &format!("more-{i}")).await;
                let rid = fleet.pending(run).await;
                // In one script: as soon as the new card is there, and if the typed card is not
                // answering yet (a slow poll might come later than that), send the typed card.
                let r = browser
                    .wait_for(
                        "the new card",
                        "if (!document.querySelector(arguments[0])) return null; \
                         const t = document.querySelector(arguments[1]); \
                         if ('armed' in t.dataset) return 'late'; \
                         t.querySelector('form').requestSubmit(); return 'sent';",
                        vec![json!(card(&rid)), json!(t)],
                    )
                    .await;
                if r == json!("sent") {
                    held = true;
                    break;
                }
            }
            assert!(held, "never caught the typed card while cards moved");
            let said = wait_outcome(&browser, &typed_rid, "just appeared or moved").await;
            assert!(said.contains("answer again"), "{said}");
            assert_eq!(interaction_state(&fleet.client, &typed_rid).await, "PENDING");
            // Once it stands still, the same button sends.
            browser.click(&format!("{t} button[type=submit]")).await;
            wait_outcome(&browser, &typed_rid, "Answer sent").await;
            fleet.wait_status(typed, RunStatus::Completed).await;
            let stored = fleet.store.load(typed).await.expect("load");
            assert_eq!(stored.record.result.as_deref(), Some("got a b"));

            // What is approved shows its hidden characters: a right-to-left override in the
            // arguments cannot make the call read as another.
            let sneaky = fleet.submit("sneaky", "x").await;
            let sneaky_rid = fleet.pending(sneaky).await;
            let s = card(&sneaky_rid);
            browser.find(&s).await;
            let shown = browser
                .js(
                    "const c = document.querySelector(arguments[0]); \
                     return [c.querySelector('.tool-facts').textContent, c.querySelector('pre.args').textContent];",
                    vec![json!(s)],
                )
                .await;
            for text in shown.as_array().expect("texts") {
                let text = text.as_str().unwrap_or_default();
                assert!(!text.contains('\u{202e}'), "the override itself: {text:?}");
                assert!(text.contains("\\u202e"), "shown as \\u202e: {text:?}");
                // A tag character (beyond U+FFFF) too, as its UTF-16 pair.
                assert!(!text.contains('\u{e0041}'), "the tag itself: {text:?}");
                assert!(text.contains("\\udb40\\udc41"), "the tag shown: {text:?}");
            }
            // Its approval is dangerous: the confirmation says what runs, the same way.
            browser.click(&format!("{s} [data-option-id=approve]")).await;
            let step = browser
                .wait_for(
                    "the confirmation step",
                    "const e = document.querySelector(arguments[0] + ' .step'); return e && !e.hidden ? e.textContent : null;",
                    vec![json!(s)],
                )
                .await;
            let step = step.as_str().unwrap_or_default();
            assert!(
                step.contains("Runs: echo 'report\\u202efdp.exe\\udb40\\udc41'"),
                "{step:?}"
            );
            browser.click(&format!("{s} [data-confirm=approve]")).await;
            fleet.wait_status(sneaky, RunStatus::Completed).await;
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_run_page_follows_the_run_live() {
    let fleet = Fleet::start("ibf", 1, 1).await;
    let browser = Browser::start("the_run_page_follows_the_run_live", Screen::Desktop).await;
    browser
        .checked(async {
            let run = fleet.submit("hello", "greet").await;
            let rid = fleet.pending(run).await;
            browser
                .goto(&format!("{}/runs/{run}", fleet.gateways[0].url))
                .await;
            browser
                .wait_for(
                    "the run to show as waiting",
                    "return document.getElementById('run-status').textContent === 'WAITING_FOR_INPUT';",
                    vec![],
                )
                .await;
            browser.find(&card(&rid)).await;
            let lines = browser
                .wait_for(
                    "the journal up to the pause",
                    "const l = document.querySelectorAll('#journal li'); \
                     return l.length && l[l.length - 1].dataset.type === 'ENGINE_END' ? l.length : 0;",
                    vec![],
                )
                .await;
            browser.snapshot("-waiting").await;
            // Marks this page: a reload would lose it.
            browser.js("window.deltaNoReload = true; return true;", vec![]).await;
            let (status, body) = fleet
                .answer(&rid, json!({"input": "Zed", "responder": {"id": "zoe"}}))
                .await;
            assert_eq!(status, 200, "{body}");
            browser
                .wait_for(
                    "the run to show as completed",
                    "return document.getElementById('run-status').textContent === 'COMPLETED';",
                    vec![],
                )
                .await;
            let after = browser
                .wait_for(
                    "the journal to the end",
                    "const l = document.querySelectorAll('#journal li'); \
                     return l.length > arguments[0] && l[l.length - 1].dataset.type === 'ENGINE_END' ? \
                       [...l].map(x => x.dataset.type) : null;",
                    vec![lines.clone()],
                )
                .await;
            let types: Vec<&str> = after
                .as_array()
                .expect("types")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(types.contains(&"HUMAN_INPUT_RECEIVED"), "{types:?}");
            // Every event once, in order.
            let seqs = browser
                .js(
                    "return [...document.querySelectorAll('#journal li')].map(x => Number(x.dataset.seq));",
                    vec![],
                )
                .await;
            let stored = fleet.store.load(run).await.expect("load");
            let expected: Vec<u64> = stored.journal.iter().map(|e| e.seq).collect();
            assert_eq!(seqs, json!(expected));
            let page = browser
                .js(
                    "return [window.deltaNoReload === true, document.getElementById('conn').dataset.state, \
                             document.querySelector(arguments[0]) === null, document.getElementById('run-facts').textContent];",
                    vec![json!(card(&rid))],
                )
                .await;
            assert_eq!(page[0], json!(true), "the page was not reloaded");
            assert_eq!(page[1], json!("ended"));
            assert_eq!(page[2], json!(true), "the question left the run page");
            assert!(page[3].as_str().unwrap_or_default().contains("Greeted Zed."), "{page}");
            browser.snapshot("-completed").await;
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_page_answers_its_own_question() {
    let fleet = Fleet::start("ibg", 1, 1).await;
    let browser = Browser::start("a_run_page_answers_its_own_question", Screen::Desktop).await;
    browser
        .checked(async {
            let run = fleet.submit("chooser", "Q1").await;
            let rid = fleet.pending(run).await;
            browser
                .goto(&format!("{}/runs/{run}", fleet.gateways[0].url))
                .await;
            browser
                .click(&format!("{} [data-option-id=staging]", card(&rid)))
                .await;
            browser
                .wait_for(
                    "the run to complete",
                    "return document.getElementById('run-status').textContent === 'COMPLETED';",
                    vec![],
                )
                .await;
            let stored = fleet.store.load(run).await.expect("load");
            assert_eq!(stored.record.result.as_deref(), Some("staging is ready"));
            assert_eq!(answers(&stored)[0].option_id.as_deref(), Some("staging"));
        })
        .await;
    browser.close().await;
}

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

#[tokio::test(flavor = "multi_thread")]
async fn with_tokens_the_page_asks_for_one_and_refuses_a_wrong_one() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = tokens_file(dir.path());
    let fleet = Fleet::start_with("ibh", 1, 1, |s| s.tokens_file = Some(tokens.clone())).await;
    let browser = Browser::start(
        "with_tokens_the_page_asks_for_one_and_refuses_a_wrong_one",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            // The static files need no token; the API does.
            let http = reqwest::Client::new();
            for (path, kind) in [
                ("/", "text/html"),
                ("/inbox.js", "text/javascript"),
                ("/inbox.css", "text/css"),
                ("/runs/0196d3c8-0000-7000-8000-000000000000", "text/html"),
            ] {
                let r = http
                    .get(format!("{}{path}", fleet.gateways[0].url))
                    .send()
                    .await
                    .expect("get");
                assert_eq!(r.status(), 200, "{path}");
                let h = |k: &str| {
                    r.headers()
                        .get(k)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                assert!(h("content-type").starts_with(kind), "{path}: {}", h("content-type"));
                assert_eq!(h("cache-control"), "no-cache", "{path}");
            }
            let ci = fleet.client.with_token(Some("ci-token-0123456789abcd"));
            let ops = fleet.client.with_token(Some("ops-token-0123456789abc"));
            let (status, body) = ci
                .post("/v1/runs", &json!({"agent": "hello", "task": "t"}))
                .await
                .expect("submit");
            assert_eq!(status, 202, "{body}");
            let run: RunId = body["run_id"].as_str().expect("id").parse().expect("uuid");
            let rid = pending(&ops, run).await;
            // Only alice may answer this one.
            let (status, body) = ci
                .post("/v1/runs", &json!({"agent": "guarded", "task": "budget"}))
                .await
                .expect("submit");
            assert_eq!(status, 202, "{body}");
            let guarded: RunId = body["run_id"].as_str().expect("id").parse().expect("uuid");
            let guarded_rid = pending(&ops, guarded).await;

            open_inbox(&browser, &fleet).await;
            let reason = browser
                .wait_for(
                    "the token prompt",
                    "const s = document.getElementById('settings'); \
                     return s.hidden ? null : document.getElementById('settings-reason').textContent;",
                    vec![],
                )
                .await;
            assert!(reason.as_str().unwrap_or_default().contains("needs a token"), "{reason}");
            let focus = browser.js("return document.activeElement.id;", vec![]).await;
            assert_eq!(focus, json!("token"), "the token box has the focus");
            browser.snapshot("-prompt").await;
            // A wrong token (Enter saves): refused, and said so.
            browser.type_into("#token", "wrong-token-00000000\u{E007}").await;
            browser
                .wait_for(
                    "the refusal of the wrong token",
                    "return document.getElementById('settings-reason').textContent.includes('refused');",
                    vec![],
                )
                .await;
            assert!(browser.text(&card(&rid)).await.is_none());
            // Bob's: the questions show, live; the one only alice may answer refuses him (403).
            browser.find("#token").await.clear().await.expect("clear");
            browser.type_into("#token", "bob-token-0123456789ab\u{E007}").await;
            browser.find(&card(&rid)).await;
            wait_live(&browser).await;
            browser
                .wait_for(
                    "the settings to close",
                    "return document.getElementById('settings').hidden;",
                    vec![],
                )
                .await;
            browser
                .type_into(
                    &format!("{} textarea[name=input]", card(&guarded_rid)),
                    "Bob here\u{E007}",
                )
                .await;
            let said = wait_outcome(&browser, &guarded_rid, "Not allowed").await;
            assert!(said.contains("`bob` may not answer"), "{said}");
            assert_eq!(interaction_state(&ops, &guarded_rid).await, "PENDING");
            // Alice's (through the Token button): answered as alice.
            browser.click("#settings-toggle").await;
            browser.find("#token").await.clear().await.expect("clear");
            browser.type_into("#token", "alice-token-0123456789\u{E007}").await;
            browser
                .wait_for(
                    "the settings to close",
                    "return document.getElementById('settings').hidden;",
                    vec![],
                )
                .await;
            browser
                .type_into(
                    &format!("{} textarea[name=input]", card(&rid)),
                    "Alice here\u{E007}",
                )
                .await;
            wait_outcome(&browser, &rid, "Answer sent").await;
            fleet.wait_status(run, RunStatus::Completed).await;
            let stored = fleet.store.load(run).await.expect("load");
            assert_eq!(answers(&stored)[0].responder.id, "alice");
            // The token stays in this browser: a reload goes straight to the questions.
            let stored_token = browser
                .js("return localStorage.getItem('delta.inbox.token');", vec![])
                .await;
            assert_eq!(stored_token, json!("alice-token-0123456789"));
            // A link that carries another token (as `delta dev` prints one): taken out of the
            // address bar before anything else happens, and only offered: the token this
            // browser keeps stays until the person saves the link's. (A page first: going from
            // the inbox to the inbox with only a fragment would not load it again.)
            browser.goto("about:blank").await;
            browser
                .goto(&format!("{}/#token=ops-token-0123456789abc", fleet.gateway_spec.url()))
                .await;
            wait_live(&browser).await;
            let (hash, kept) = (
                browser.js("return location.hash;", vec![]).await,
                browser
                    .js("return localStorage.getItem('delta.inbox.token');", vec![])
                    .await,
            );
            assert_eq!((hash, kept), (json!(""), json!("alice-token-0123456789")));
            let offered = browser
                .js(
                    "return [document.getElementById('settings').hidden, document.getElementById('token').value, document.getElementById('settings-reason').textContent];",
                    vec![],
                )
                .await;
            assert_eq!(offered[0], json!(false), "{offered}");
            assert_eq!(offered[1], json!("ops-token-0123456789abc"), "{offered}");
            assert!(
                offered[2].as_str().is_some_and(|r| r.contains("another token")),
                "{offered}"
            );
            browser.click("#settings-save").await;
            browser
                .wait_for(
                    "the link's token saved",
                    "return localStorage.getItem('delta.inbox.token') === 'ops-token-0123456789abc';",
                    vec![],
                )
                .await;

            // Forgetting the token clears what was read with it.
            let ops = fleet.client.with_token(Some("ops-token-0123456789abc"));
            let run = delta_e2e::fleet::submit_as(&ops, "hello", "shown").await;
            let rid = pending(&ops, run).await;
            browser.find(&card(&rid)).await;
            browser.click("#settings-toggle").await;
            browser.click("#settings-forget").await;
            browser
                .wait_for(
                    "the page cleared",
                    "return document.querySelectorAll('article[data-request-id]').length === 0 \
                     && localStorage.getItem('delta.inbox.token') === null;",
                    vec![],
                )
                .await;

            // A browser that keeps no token is offered a link's too, never signed in by it.
            browser.goto("about:blank").await;
            browser
                .goto(&format!("{}/#token=alice-token-0123456789", fleet.gateway_spec.url()))
                .await;
            let offered = browser
                .wait_for(
                    "the link's token offered",
                    "const s = document.getElementById('settings'); \
                     return !s.hidden && document.getElementById('token').value \
                       ? [location.hash, localStorage.getItem('delta.inbox.token'), \
                          document.getElementById('token').value, \
                          document.getElementById('settings-reason').textContent] : null;",
                    vec![],
                )
                .await;
            assert_eq!(offered[0], json!(""), "{offered}");
            assert_eq!(offered[1], Value::Null, "not kept before Save: {offered}");
            assert_eq!(offered[2], json!("alice-token-0123456789"), "{offered}");
            assert!(
                offered[3].as_str().is_some_and(|r| r.contains("if you trust")),
                "{offered}"
            );
            assert_eq!(
                browser
                    .js("return document.querySelectorAll('article[data-request-id]').length;", vec![])
                    .await,
                json!(0),
                "nothing read without a token"
            );
            // Closed without Save (Escape), the offer is gone: the box opened again is empty.
            browser.press(ESCAPE).await;
            browser.click("#settings-toggle").await;
            let again = browser
                .js("return document.getElementById('token').value;", vec![])
                .await;
            assert_eq!(again, json!(""), "the link's token is not offered twice");
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_shown_plainly_on_the_card() {
    let fleet = Fleet::start("ibi", 1, 1).await;
    add_asker(
        &fleet,
        "soon",
        "      prompt: \"Go?\"\n      timeout_seconds: 5\n      default_option_id: later\n      options:\n        - {id: now, label: Now}\n        - {id: later, label: Later}",
    );
    let browser = Browser::start("refusals_are_shown_plainly_on_the_card", Screen::Desktop).await;
    browser
        .checked(async {
            let answered = fleet.submit("hello", "one").await;
            let answered_rid = fleet.pending(answered).await;
            let expiring = fleet.submit("soon", "two").await;
            let expiring_rid = fleet.pending(expiring).await;
            // This page's live stream cannot connect, so it keeps showing what it first loaded
            // (as a page on a broken connection would) and learns the news only by answering.
            browser.block_urls(&["*/v1/interactions/stream*"]).await;
            open_inbox(&browser, &fleet).await;
            browser.find(&card(&answered_rid)).await;
            browser.find(&card(&expiring_rid)).await;
            let conn = browser
                .js("return document.getElementById('conn').dataset.state;", vec![])
                .await;
            assert_ne!(conn, json!("live"));

            // Answered elsewhere first: 409, shown with who answered and when.
            let (status, body) = fleet
                .answer(&answered_rid, json!({"input": "Bob", "responder": {"id": "bob"}}))
                .await;
            assert_eq!(status, 200, "{body}");
            let c = card(&answered_rid);
            browser
                .type_into(&format!("{c} textarea[name=input]"), "Me")
                .await;
            browser.click(&format!("{c} button[type=submit]")).await;
            let said = wait_outcome(&browser, &answered_rid, "Already answered by bob (http)").await;
            assert!(said.contains(" ago") || said.contains("just now"), "{said}");
            browser.snapshot("-409").await;
            let disabled = browser
                .js(
                    "return [...document.querySelectorAll(arguments[0] + ' form button, ' + arguments[0] + ' form textarea')].every(b => b.disabled);",
                    vec![json!(c)],
                )
                .await;
            assert_eq!(disabled, json!(true), "a settled card cannot be sent again");
            browser.click(&format!("{c} .dismiss")).await;
            wait_gone(&browser, &answered_rid, Duration::from_secs(3)).await;

            // Past its deadline (the reconciler applied the default): 410, "expired".
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while interaction_state(&fleet.client, &expiring_rid).await != "EXPIRED" {
                assert!(std::time::Instant::now() < deadline, "never expired");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            browser
                .click(&format!("{} [data-option-id=now]", card(&expiring_rid)))
                .await;
            wait_outcome(&browser, &expiring_rid, "Expired").await;
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sensitive_answer_is_a_password_box_cleared_after_sending() {
    let key = "5f2b9c0e7a1d4f8b3c6e9a2d5f8b1c4e7a0d3f6b9c2e5a8d1f4b7c0e3a6d9f2b".to_owned();
    let fleet = Fleet::start_with("ibj", 1, 1, |s| s.secrets_key_hex = Some(key.clone())).await;
    let browser = Browser::start(
        "a_sensitive_answer_is_a_password_box_cleared_after_sending",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let run = fleet.submit("secret", "key").await;
            let rid = fleet.pending(run).await;
            open_inbox(&browser, &fleet).await;
            let c = card(&rid);
            let input = format!("{c} input[name=input]");
            browser.find(&input).await;
            let attrs = browser
                .js(
                    "const i = document.querySelector(arguments[0]); return [i.type, i.getAttribute('autocomplete')];",
                    vec![json!(input)],
                )
                .await;
            assert_eq!(attrs, json!(["password", "off"]));
            let canary = "canary-9f8e7d6c5b4a";
            browser.type_into(&input, canary).await;
            browser.click(&format!("{c} button[type=submit]")).await;
            let after = browser
                .wait_for(
                    "the answer to be sent",
                    "const o = document.querySelector(arguments[0] + ' .outcome'); \
                     const i = document.querySelector(arguments[0] + ' input[name=input]'); \
                     return o && o.textContent.includes('Answer sent') ? [i.value] : null;",
                    vec![json!(c)],
                )
                .await;
            assert_eq!(after, json!([""]), "the secret is cleared from the box");
            let source = browser.client.source().await.expect("source");
            assert!(!source.contains(canary), "the secret is nowhere in the page");
            fleet.wait_status(run, RunStatus::Completed).await;
            let stored = fleet.store.load(run).await.expect("load");
            assert_eq!(answers(&stored)[0].input.as_deref(), Some("***"));
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn at_phone_width_nothing_overflows() {
    let fleet = Fleet::start("ibk", 1, 1).await;
    fleet.add_example("deployer");
    let browser = Browser::start("at_phone_width_nothing_overflows", Screen::Phone).await;
    browser
        .checked(async {
            let plan = fleet.submit("deployer", "1.4.2").await;
            let approval = fleet.submit("gated", "shout").await;
            let choice = fleet
                .submit("chooser", "a rather long task name for a phone")
                .await;
            let free = fleet.submit("hello", "greet").await;
            let typed = fleet.submit("intake", "a form on a phone").await;
            let mut rids = vec![];
            for run in [plan, approval, choice, free, typed] {
                rids.push(fleet.pending(run).await);
            }
            open_inbox(&browser, &fleet).await;
            for rid in &rids {
                browser.find(&card(rid)).await;
            }
            let width = browser.js("return window.innerWidth;", vec![]).await;
            assert_eq!(
                width,
                json!(Screen::Phone.size().0),
                "the viewport is a phone's"
            );
            let overflow = "return [document.documentElement.scrollWidth, window.innerWidth];";
            let fits = |v: &Value| v[0].as_u64() <= v[1].as_u64();
            let inbox = browser.js(overflow, vec![]).await;
            assert!(fits(&inbox), "the inbox overflows: {inbox}");
            // The plan is an ordered list of its tasks.
            let tasks = browser
                .js(
                    "return document.querySelectorAll(arguments[0] + ' ol.plan li').length;",
                    vec![json!(card(&rids[0]))],
                )
                .await;
            assert_eq!(tasks, json!(3));
            for (i, rid) in rids.iter().enumerate() {
                browser
                    .js(
                        "document.querySelector(arguments[0]).scrollIntoView({block: 'center'}); return true;",
                        vec![json!(card(rid))],
                    )
                    .await;
                browser.snapshot(&format!("-card{i}")).await;
            }
            // Open states too: the argument editor and a confirmation step.
            browser
                .click(&format!("{} .args-head button", card(&rids[1])))
                .await;
            browser
                .click(&format!("{} [data-option-id=production]", card(&rids[2])))
                .await;
            let open = browser.js(overflow, vec![]).await;
            assert!(fits(&open), "the inbox overflows with editors open: {open}");
            browser.snapshot("-inbox").await;
            browser
                .goto(&format!("{}/runs/{approval}", fleet.gateways[0].url))
                .await;
            browser.find(&card(&rids[1])).await;
            browser
                .wait_for(
                    "the journal",
                    "return document.querySelectorAll('#journal li').length > 2;",
                    vec![],
                )
                .await;
            let run_page = browser.js(overflow, vec![]).await;
            assert!(fits(&run_page), "the run page overflows: {run_page}");
            browser.snapshot("-run").await;
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_typed_question_is_a_form_whose_refusal_names_the_field() {
    let fleet = Fleet::start("ibt", 1, 1).await;
    let browser = Browser::start(
        "a_typed_question_is_a_form_whose_refusal_names_the_field",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let run = fleet.submit("intake", "q3").await;
            let rid = fleet.pending(run).await;
            open_inbox(&browser, &fleet).await;
            let c = card(&rid);
            browser.find(&c).await;
            // One control per field, of its kind, with its bounds; the required ones marked.
            let shape = browser
                .js(
                    "const f = document.querySelector(arguments[0] + ' form'); \
                     const q = (s) => f.querySelector(s); \
                     return { \
                       email: q('input[data-field=email]').type + ' ' + q('input[data-field=email]').required, \
                       copies: [q('input[data-field=copies]').type, q('input[data-field=copies]').min, q('input[data-field=copies]').max, q('input[data-field=copies]').value], \
                       env: [...q('select[data-field=env]').options].map(o => o.textContent), \
                       urgent: q('input[data-field=urgent]').type, \
                       topics: f.querySelectorAll('input[data-field=topics][type=checkbox]').length, \
                       note: q('input[data-field=note]').maxLength, \
                       required: f.querySelectorAll('.req').length, \
                       order: [...f.querySelectorAll('[data-field]')].map(e => e.dataset.field).filter((n, i, a) => a.indexOf(n) === i) \
                     };",
                    vec![json!(c)],
                )
                .await;
            assert_eq!(
                shape,
                json!({
                    "email": "email true",
                    "copies": ["number", "1", "5", "1"],
                    "env": ["Choose…", "Staging", "Production"],
                    "urgent": "checkbox",
                    "topics": 3,
                    "note": 80,
                    "required": 3,
                    "order": ["email", "copies", "env", "note", "topics", "urgent"]
                })
            );
            // A bad email: the gateway's 422 is shown, and the field it names is flagged.
            browser
                .type_into(&format!("{c} input[data-field=email]"), "ada")
                .await;
            browser
                .find(&format!("{c} select[data-field=env]"))
                .await
                .select_by_value("staging")
                .await
                .expect("select");
            browser.click(&format!("{c} button[type=submit]")).await;
            let said = wait_outcome(&browser, &rid, "Not accepted").await;
            assert!(said.contains("field `email`"), "{said}");
            let flagged = browser
                .js(
                    "const i = document.querySelector(arguments[0] + ' input[data-field=email]'); \
                     return [i.getAttribute('aria-invalid'), document.getElementById(i.getAttribute('aria-describedby').split(' ').pop()).textContent];",
                    vec![json!(c)],
                )
                .await;
            assert_eq!(flagged[0], json!("true"), "{flagged}");
            assert!(
                flagged[1].as_str().is_some_and(|t| t.contains("not a valid email")),
                "{flagged}"
            );
            browser.snapshot("-422").await;
            assert_eq!(interaction_state(&fleet.client, &rid).await, json!("PENDING"));

            // Fixed, with a few more fields filled in: the run gets the object.
            let email = browser.find(&format!("{c} input[data-field=email]")).await;
            email.clear().await.expect("clear");
            email.send_keys("ada@example.com").await.expect("type");
            let copies = browser.find(&format!("{c} input[data-field=copies]")).await;
            copies.clear().await.expect("clear");
            copies.send_keys("3").await.expect("type");
            browser
                .find(&format!("{c} select[data-field=env]"))
                .await
                .select_by_value("production")
                .await
                .expect("select");
            browser
                .click(&format!("{c} input[data-field=topics][value=security]"))
                .await;
            browser.click(&format!("{c} input[data-field=urgent]")).await;
            browser.click(&format!("{c} button[type=submit]")).await;
            wait_outcome(&browser, &rid, "Answer sent").await;
            fleet.wait_status(run, RunStatus::Completed).await;
            let stored = fleet.store.load(run).await.expect("load");
            assert_eq!(
                stored.record.result.as_deref(),
                Some("ada@example.com gets 3 on production")
            );
            assert_eq!(
                answers(&stored)[0].data,
                Some(json!({"email": "ada@example.com", "copies": 3, "env": "production",
                            "topics": ["security"], "urgent": true}))
            );
        })
        .await;
    browser.close().await;
}

/// A question that needs two approvals: the card says so, shows another person's claim live
/// (and a refusal while it holds), takes and gives back a claim of its own, counts its vote
/// ("1 of 2 approvals"), and sends the hash of what it showed.
#[tokio::test(flavor = "multi_thread")]
async fn claims_and_votes_show_and_work_on_the_card() {
    let fleet = Fleet::start("ibq", 1, 1).await;
    add_asker(
        &fleet,
        "council",
        "      prompt: \"Ship the release?\"\n      approvals: {min: 2}\n      options:\n        - {id: approve, label: Approve, action: APPROVE_AND_EXECUTE}\n        - {id: reject, label: Reject, action: REJECT_WITH_REASON}",
    );
    let browser = Browser::start(
        "claims_and_votes_show_and_work_on_the_card",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let run = fleet.submit("council", "ship").await;
            let rid = fleet.pending(run).await;
            let c = card(&rid);
            open_inbox(&browser, &fleet).await;
            wait_live(&browser).await;
            browser.click("#settings-toggle").await;
            browser.type_into("#responder", "ann").await;
            browser.click("#settings-save").await;
            let rule = browser.text(&format!("{c} .human .rule")).await.expect("rule");
            assert!(rule.contains("Needs 2 approvals"), "{rule}");
            let claim_path = format!("/v1/interactions/{rid}/claim");
            // Someone else claims it: the card shows it live, and an answer is held off.
            let (s, b) = fleet
                .client
                .post(&claim_path, &json!({"responder": {"id": "bob"}}))
                .await
                .expect("claim");
            assert_eq!(s, 200, "{b}");
            browser
                .wait_for(
                    "bob's claim on the card",
                    "const l = document.querySelector(arguments[0] + ' .human .claim'); \
                     return l && !l.hidden && l.textContent.includes('Claimed by bob until');",
                    vec![json!(c)],
                )
                .await;
            browser.click(&format!(r#"{c} button[data-option-id="approve"]"#)).await;
            let said = wait_outcome(&browser, &rid, "Claimed").await;
            assert!(said.contains("bob"), "{said}");
            // Given back: the card shows nobody; ann claims it herself.
            let (s, _) = fleet
                .client
                .post(&claim_path, &json!({"release": true, "responder": {"id": "bob"}}))
                .await
                .expect("release");
            assert_eq!(s, 200);
            browser
                .wait_for(
                    "the claim to go",
                    "return document.querySelector(arguments[0] + ' .human .claim').hidden;",
                    vec![json!(c)],
                )
                .await;
            browser.click(&format!("{c} .claim-btn")).await;
            browser
                .wait_for(
                    "ann's claim on the card",
                    "const b = document.querySelector(arguments[0] + ' .claim-btn'); \
                     return b.textContent === 'Release' && document.querySelector(arguments[0] + ' .human .claim').textContent.includes('ann');",
                    vec![json!(c)],
                )
                .await;
            let (_, view) = fleet.client.get(&format!("/v1/interactions/{rid}")).await.expect("get");
            assert_eq!(view["claim"]["by"], "ann");
            // Her vote is counted, not decisive.
            browser.click(&format!(r#"{c} button[data-option-id="approve"]"#)).await;
            let said = wait_outcome(&browser, &rid, "Your vote is counted").await;
            assert!(said.contains("1 of 2 approvals (ann)"), "{said}");
            let (s, b) = fleet
                .answer(&rid, json!({"option_id": "approve", "responder": {"id": "bob"}}))
                .await;
            assert_eq!((s, &b["status"]), (200, &json!("accepted")), "{b}");
            fleet.wait_status(run, RunStatus::Completed).await;
            let stored = fleet.store.load(run).await.expect("load");
            let votes: Vec<(String, String)> = stored
                .journal
                .iter()
                .filter_map(|e| match &e.event {
                    Event::HumanVote(v) => Some((v.responder.id.clone(), v.request_hash.clone())),
                    _ => None,
                })
                .collect();
            let hash = view["request_hash"].as_str().expect("hash").to_owned();
            assert_eq!(votes, [("ann".to_owned(), hash.clone()), ("bob".to_owned(), hash)]);
        })
        .await;
    browser.close().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn always_allow_makes_a_grant_that_the_inbox_lists_and_revokes() {
    let fleet = Fleet::start("ibg", 1, 1).await;
    let browser = Browser::start(
        "always_allow_makes_a_grant_that_the_inbox_lists_and_revokes",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let first = fleet.submit("gated", "shout").await;
            let rid = fleet.pending(first).await;
            open_inbox(&browser, &fleet).await;
            let c = card(&rid);
            browser.find(&c).await;
            // Approve with "always allow" for every run of the agent.
            browser.click(&format!("{c} input[name=grant]")).await;
            browser
                .js(
                    "const s = document.querySelector(arguments[0] + ' select[name=grant-scope]'); \
                     s.value = 'agent'; s.dispatchEvent(new Event('change'));",
                    vec![json!(c)],
                )
                .await;
            browser.click(&format!("{c} [data-option-id=approve]")).await;
            wait_outcome(&browser, &rid, "Answer sent").await;
            fleet.wait_status(first, RunStatus::Completed).await;
            let stored = fleet.store.load(first).await.expect("load");
            assert_eq!(
                answers(&stored)[0].data,
                Some(json!({"grant": {"scope": "agent"}}))
            );
            // The grant is listed, with what it approves; the next run asks nothing.
            let row = format!(r#"li.grant[data-grant-id="{rid}"]"#);
            browser.find(&row).await;
            let text = browser.text(&row).await.expect("row");
            assert!(
                text.contains("shout") && text.contains("text = \"hello\"") && text.contains("every run of gated"),
                "{text}"
            );
            let second = fleet.submit("gated", "shout").await;
            fleet.wait_status(second, RunStatus::Completed).await;
            browser.click("#grants-refresh").await;
            browser
                .wait_for(
                    "the use to show",
                    "const r = document.querySelector(arguments[0]); return r && r.textContent.includes('1 use');",
                    vec![json!(row)],
                )
                .await;
            browser.snapshot("-grants").await;
            // Revoke it from the page: it leaves the list, and the agent asks again.
            browser.click(&format!("{row} button[data-grant-id]")).await;
            browser
                .wait_for(
                    "the revoked grant to leave the list",
                    "return document.querySelector(arguments[0]) === null;",
                    vec![json!(row)],
                )
                .await;
            let (_, all) = fleet.client.get("/v1/grants?state=all").await.expect("list");
            assert_eq!(all["grants"][0]["state"], "REVOKED", "{all}");
            let third = fleet.submit("gated", "shout").await;
            let again = fleet.pending(third).await;
            browser.find(&card(&again)).await;
        })
        .await;
    browser.close().await;
}

/// What an MCP client of the 2026 protocol gets when it calls `agent`: the first question's
/// elicitation (a plain JSON-RPC call here; the protocol itself is tested with the official
/// SDK in tests/mcp.rs).
async fn mcp_call(url: &str, token: &str, agent: &str) -> Value {
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "inbox-test", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}, "url": {}}},
    });
    let params = json!({"name": agent, "arguments": {"task": "now"}, "_meta": meta});
    let message = delta_e2e::mcp_tools_call(url, Some(token), agent, params).await;
    assert!(message.get("result").is_some(), "a result in {message}");
    message["result"].clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_link_opens_its_one_question_and_works_once() {
    let dir = tempfile::tempdir().expect("tmp");
    let tokens = dir.path().join("tokens.yaml");
    std::fs::write(
        &tokens,
        "- name: alice\n  token: alice-token-0123456789\n  roles: [submit, answer]\n",
    )
    .expect("tokens");
    let key = "7a".repeat(32);
    let fleet = Fleet::start_with("ibl", 1, 1, |s| {
        s.tokens_file = Some(tokens.clone());
        s.secrets_key_hex = Some(key.clone());
    })
    .await;
    let browser = Browser::start(
        "an_answer_link_opens_its_one_question_and_works_once",
        Screen::Desktop,
    )
    .await;
    browser
        .checked(async {
            let url = &fleet.gateways[0].url;
            let result = mcp_call(url, "alice-token-0123456789", "secret").await;
            assert_eq!(result["resultType"], "input_required", "{result}");
            let (rid, request) = result["inputRequests"]
                .as_object()
                .and_then(|m| m.iter().next())
                .expect("one input request");
            assert_eq!(request["params"]["mode"], "url", "{request}");
            let link = request["params"]["url"].as_str().expect("a URL").to_owned();
            assert!(link.starts_with(&format!("{url}/answer#link=")), "{link}");
            let run: RunId =
                serde_json::from_str::<Value>(result["requestState"].as_str().expect("state"))
                    .expect("JSON state")["run"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .expect("the run");

            // No token in this browser: the link alone opens its question, as alice.
            browser.goto(&link).await;
            let c = card(rid);
            let input = format!("{c} input[name=input]");
            browser.find(&input).await;
            let shown = browser
                .js(
                    "return [location.hash, document.getElementById('link-who').textContent, \
                     document.querySelector(arguments[0]).type];",
                    vec![json!(input)],
                )
                .await;
            assert_eq!(shown[0], "", "the link leaves the address bar at once");
            assert!(
                shown[1].as_str().is_some_and(|t| t.contains("alice")),
                "{shown}"
            );
            assert_eq!(shown[2], "password");
            let canary = "canary-link-5b4a3c2d1e";
            browser.type_into(&input, canary).await;
            browser.click(&format!("{c} button[type=submit]")).await;
            wait_outcome(&browser, rid, "Answer sent").await;
            fleet.wait_status(run, RunStatus::Completed).await;
            let stored = fleet.store.load(run).await.expect("load");
            let a = answers(&stored);
            assert_eq!(a.len(), 1);
            assert_eq!(a[0].input.as_deref(), Some("***"));
            assert_eq!(
                (a[0].responder.id.as_str(), a[0].responder.via),
                ("alice", delta_protocol::Via::Mcp)
            );
            assert!(
                !serde_json::to_string(&stored.journal)
                    .expect("json")
                    .contains(canary)
            );

            // Spent: opened again, it says so and shows no question.
            browser.goto(&link).await;
            let said = browser
                .wait_for(
                    "the spent link to be refused",
                    "const b = document.getElementById('link-error'); \
                     return b && !b.hidden ? b.textContent : null;",
                    vec![],
                )
                .await;
            assert!(
                said.as_str()
                    .is_some_and(|t| t.contains("unknown, used or expired")),
                "{said}"
            );
        })
        .await;
    browser.close().await;
}
