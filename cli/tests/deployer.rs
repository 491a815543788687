//! `examples/agents/deployer` driven through every option of every question it asks, as a user
//! would: `delta run` subprocesses answering through the mailbox files and, with `-i`, on stdin.
//! After each answer the journal is checked, and a canary secret is looked for everywhere.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::{Value, json};

const DELTA: &str = env!("CARGO_BIN_EXE_delta");
const CANARY: &str = "canary-7c1d9e4b2a";
const VERSION: &str = "1.4.2";

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/agents/deployer")
}

/// A scratch directory with a copy of the deployer (so a test may change its config) and a work
/// directory where `.delta/` and `deployments.log` live.
struct Deployer {
    dir: tempfile::TempDir,
    /// Everything every `delta` invocation printed on stderr.
    stderr: std::cell::RefCell<String>,
}

impl Deployer {
    fn new() -> Self {
        Self::with_config(|c| c)
    }

    /// A deployer whose config.yaml is `patch(config.yaml)`.
    fn with_config(patch: impl Fn(String) -> String) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let agent = dir.path().join("deployer");
        std::fs::create_dir_all(&agent).expect("mkdir");
        for f in ["config.yaml", "script.yaml", "check_key.sh", "deploy.sh"] {
            std::fs::copy(example().join(f), agent.join(f)).expect("copy the example");
        }
        let config = std::fs::read_to_string(agent.join("config.yaml")).expect("config");
        std::fs::write(agent.join("config.yaml"), patch(config)).expect("write");
        std::fs::create_dir_all(dir.path().join("work")).expect("mkdir");
        Deployer {
            dir,
            stderr: Default::default(),
        }
    }

    fn agent(&self) -> String {
        self.dir.path().join("deployer").display().to_string()
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// `delta run --agent <deployer> [--task VERSION] args…`, stdin from `input` (or closed).
    fn delta(&self, args: &[&str], input: Option<&str>) -> Output {
        let agent = self.agent();
        let mut argv = vec!["run", "--agent", agent.as_str()];
        argv.extend_from_slice(args);
        let mut child = Command::new(DELTA)
            .args(&argv)
            .current_dir(self.work())
            .env("USER", "tester")
            .env("DELTA_LOG", "debug")
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn delta");
        if let Some(text) = input {
            let mut sink = child.stdin.take().expect("stdin");
            sink.write_all(text.as_bytes()).expect("write stdin");
        }
        let out = child.wait_with_output().expect("delta runs");
        self.stderr
            .borrow_mut()
            .push_str(&String::from_utf8_lossy(&out.stderr));
        out
    }

    /// Starts the run (async mode): it stops at the plan.
    fn start(&self) -> Value {
        let out = self.delta(&["--task", VERSION], None);
        assert_eq!(code(&out), 101, "{}", stderr(&out));
        self.request()
    }

    /// Writes `response.txt` and resumes; returns the process output.
    fn answer_txt(&self, text: &str) -> Output {
        std::fs::write(self.mailbox("response.txt"), text).expect("write response.txt");
        self.delta(&[], None)
    }

    fn answer_json(&self, v: Value) -> Output {
        std::fs::write(self.mailbox("response.json"), v.to_string()).expect("write response.json");
        self.delta(&[], None)
    }

    fn mailbox(&self, file: &str) -> PathBuf {
        self.work().join(".delta/interaction").join(file)
    }

    fn request(&self) -> Value {
        let text = std::fs::read_to_string(self.mailbox("request.json")).expect("request.json");
        serde_json::from_str(&text).expect("json")
    }

    fn run_dir(&self) -> PathBuf {
        let latest =
            std::fs::read_to_string(self.work().join(".delta/runs/LATEST")).expect("LATEST");
        self.work()
            .join(".delta/runs")
            .join(latest.trim())
            .join("execution")
    }

    fn status(&self) -> String {
        let text = std::fs::read_to_string(self.run_dir().join("metadata.json")).expect("metadata");
        let v: Value = serde_json::from_str(&text).expect("json");
        v["status"].as_str().unwrap_or_default().to_owned()
    }

    fn journal(&self) -> Vec<Value> {
        std::fs::read_to_string(self.run_dir().join("journal.jsonl"))
            .expect("journal")
            .lines()
            .map(|l| serde_json::from_str(l).expect("event"))
            .collect()
    }

    /// The payloads of the journal's events of type `ty`.
    fn events(&self, ty: &str) -> Vec<Value> {
        self.journal()
            .into_iter()
            .filter(|e| e["type"] == ty)
            .map(|e| e["payload"].clone())
            .collect()
    }

    fn last(&self, ty: &str) -> Value {
        self.events(ty)
            .pop()
            .unwrap_or_else(|| panic!("no {ty} event"))
    }

    fn deployments(&self) -> Vec<String> {
        std::fs::read_to_string(self.work().join("deployments.log"))
            .map(|s| s.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Async mode up to the environment question: plan confirmed, the canary key given.
    fn up_to_the_choice(&self) -> Value {
        self.start();
        let out = self.answer_txt("confirm\n");
        assert_eq!(code(&out), 101, "{}", stderr(&out));
        let q = self.request();
        assert_eq!(q["type"], "USER_INPUT");
        assert_eq!(q["sensitive"], true);
        assert_eq!(q["input_type"], "password");
        let out = self.answer_txt(&format!("{CANARY}\n"));
        assert_eq!(code(&out), 101, "{}", stderr(&out));
        assert!(
            !self.mailbox("response.txt").exists(),
            "the key was removed"
        );
        let received = self.last("HUMAN_INPUT_RECEIVED");
        assert_eq!(received["input"], "***");
        let checked = self.last("ACTION_RESULT");
        assert_eq!(checked["status"], "SUCCESS");
        let fingerprint = checked["observation_content"].as_str().unwrap_or_default();
        assert!(
            fingerprint.starts_with("API key accepted: ****** (17 characters, sha256 "),
            "{fingerprint}"
        );
        let q = self.request();
        assert_eq!(q["type"], "USER_CHOICE");
        q
    }

    /// Async mode up to the approval of the production deploy.
    fn up_to_the_approval(&self) -> Value {
        self.up_to_the_choice();
        let out = self.answer_txt("production\n");
        assert_eq!(code(&out), 101, "{}", stderr(&out));
        let q = self.request();
        assert_eq!(q["type"], "TOOL_APPROVAL");
        q
    }

    /// The canary is in no file under `.delta/`, no stderr line and no journal event.
    fn assert_no_canary(&self) {
        let mut stack = vec![self.work().join(".delta")];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("dir").flatten() {
                if e.path().is_dir() {
                    stack.push(e.path());
                } else {
                    let text = std::fs::read(e.path()).expect("read");
                    assert!(
                        !String::from_utf8_lossy(&text).contains(CANARY),
                        "the secret is in {}",
                        e.path().display()
                    );
                }
            }
        }
        assert!(
            !self.stderr.borrow().contains(CANARY),
            "the secret was printed"
        );
        assert!(!self.stderr.borrow().is_empty(), "stderr was captured");
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn option_ids(q: &Value) -> Vec<String> {
    q["options"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|o| o["option_id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

// -- async mode (the mailbox) ----------------------------------------------------------------

#[test]
fn mailbox_the_plan_is_put_to_a_person_first() {
    let d = Deployer::new();
    let q = d.start();
    assert_eq!(q["type"], "USER_CONFIRMATION");
    assert_eq!(option_ids(&q), ["confirm", "modify", "cancel"]);
    assert_eq!(
        q["context"]["risk_level"], "high",
        "deploy may be dangerous"
    );
    assert_eq!(q["context"]["plan"][2]["description"], "Deploy 1.4.2");
    assert_eq!(q["default_option_id"], "cancel");
    assert_eq!(q["timeout_seconds"], 3600);
    assert!(d.events("ACTION_REQUEST").is_empty(), "nothing ran yet");
    assert_eq!(d.events("PLAN").len(), 1);

    // modify with feedback (response.txt): the script's revised plan, round 2.
    let out = d.answer_txt("modify: after the smoke tests\n");
    assert_eq!(code(&out), 101, "{}", stderr(&out));
    let r = d.last("HUMAN_INPUT_RECEIVED");
    assert_eq!(
        (r["option_id"].as_str(), r["action"].as_str()),
        (Some("modify"), Some("RETRY_WITH_FEEDBACK"))
    );
    assert_eq!(r["input"], "after the smoke tests");
    let plan = d.last("PLAN");
    assert_eq!(plan["round"], 2);
    assert_eq!(
        plan["tasks"][2]["description"],
        "Deploy 1.4.2 (after the smoke tests)"
    );
    let q = d.request();
    assert_eq!(q["context"]["round"], 2);

    // modify with an edited task list (response.json): the person's plan, round 3, the last.
    let out = d.answer_json(json!({"option_id": "modify", "data": {"tasks": [
        "Ask for the API key",
        {"description": "Deploy to staging only", "tool": "deploy"}]}}));
    assert_eq!(code(&out), 101, "{}", stderr(&out));
    assert_eq!(
        d.last("HUMAN_INPUT_RECEIVED")["data"]["tasks"][1]["tool"],
        "deploy"
    );
    let plan = d.last("PLAN");
    assert_eq!(plan["round"], 3);
    assert_eq!(
        plan["tasks"][1],
        json!({"index": 2, "description": "Deploy to staging only", "tool": "deploy", "risk": "high"})
    );
    let q = d.request();
    assert_eq!(option_ids(&q), ["confirm", "cancel"], "max_plan_rounds: 3");

    // cancel: the run ends CANCELLED, exit 3, nothing deployed.
    let out = d.answer_txt("Cancel the run\n");
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(d.status(), "CANCELLED");
    let end = d.last("ENGINE_END");
    assert_eq!(end["status"], "CANCELLED");
    assert_eq!(end["error"], "plan cancelled by tester");
    assert!(d.deployments().is_empty());
    assert!(!d.mailbox("request.json").exists());
}

#[test]
fn mailbox_approval_options_each_do_what_they_say() {
    struct Case {
        answer: &'static str,
        json: Option<Value>,
        exit: i32,
        deployed: &'static [&'static str],
        action: &'static str,
        result: (&'static str, &'static str),
        edited: Option<Value>,
    }
    let cases = [
        Case {
            answer: "approve\n",
            json: None,
            exit: 0,
            deployed: &["production 1.4.2"],
            action: "APPROVE_AND_EXECUTE",
            result: ("SUCCESS", "deployed 1.4.2 to production\n"),
            edited: None,
        },
        Case {
            answer: "approve\nversion=1.4.3\n",
            json: None,
            exit: 0,
            deployed: &["production 1.4.3"],
            action: "APPROVE_AND_EXECUTE",
            result: ("SUCCESS", "deployed 1.4.3 to production\n"),
            edited: Some(
                json!({"changed": {"version": {"from": "1.4.2", "to": "1.4.3"}}, "added": {}, "removed": []}),
            ),
        },
        Case {
            answer: "",
            json: Some(
                json!({"option_id": "approve", "data": {"args": {"env": "staging", "version": "1.4.2"}}}),
            ),
            exit: 0,
            deployed: &["staging 1.4.2"],
            action: "APPROVE_AND_EXECUTE",
            result: ("SUCCESS", "deployed 1.4.2 to staging\n"),
            edited: Some(
                json!({"changed": {"env": {"from": "production", "to": "staging"}}, "added": {}, "removed": []}),
            ),
        },
        Case {
            answer: "Retry with feedback: staging first\n",
            json: None,
            exit: 0,
            deployed: &[],
            action: "RETRY_WITH_FEEDBACK",
            result: (
                "REJECTED",
                "not run; tester asks you to think again: staging first",
            ),
            edited: None,
        },
        Case {
            answer: "reject\nnot on a Friday\n",
            json: None,
            exit: 0,
            deployed: &[],
            action: "REJECT_WITH_REASON",
            result: ("REJECTED", "rejected: not on a Friday"),
            edited: None,
        },
        Case {
            answer: "4\n",
            json: None,
            exit: 3,
            deployed: &[],
            action: "TERMINATE",
            result: ("REJECTED", "terminated by tester"),
            edited: None,
        },
    ];
    for case in cases {
        let d = Deployer::new();
        let q = d.up_to_the_approval();
        assert_eq!(option_ids(&q), ["approve", "retry", "reject", "terminate"]);
        assert_eq!(q["context"]["tool"], "deploy");
        assert_eq!(
            q["context"]["args"],
            json!({"env": "production", "version": VERSION})
        );
        assert_eq!(q["context"]["risk_level"], "high");
        let cmd = q["context"]["command_line"].as_str().unwrap_or_default();
        assert!(
            cmd.starts_with("sh ") && cmd.ends_with("/deploy.sh production 1.4.2"),
            "{cmd}"
        );
        let out = match &case.json {
            Some(v) => d.answer_json(v.clone()),
            None => d.answer_txt(case.answer),
        };
        let label = format!("{:?}/{:?}", case.answer, case.json);
        assert_eq!(code(&out), case.exit, "{label}: {}", stderr(&out));
        assert_eq!(d.deployments(), case.deployed, "{label}");
        let r = d.last("HUMAN_INPUT_RECEIVED");
        assert_eq!(r["action"], case.action, "{label}");
        assert_eq!(r.get("edited_args").cloned(), case.edited, "{label}");
        let result = d.last("ACTION_RESULT");
        assert_eq!(result["status"], case.result.0, "{label}");
        assert_eq!(result["observation_content"], case.result.1, "{label}");
        let status = if case.exit == 3 {
            "CANCELLED"
        } else {
            "COMPLETED"
        };
        assert_eq!(d.status(), status, "{label}");
        assert!(!d.mailbox("response.txt").exists() && !d.mailbox("response.json").exists());
        d.assert_no_canary();
    }
}

#[test]
fn mailbox_choices_take_their_branch() {
    // Staging: the deploy is not dangerous and runs without a question.
    let d = Deployer::new();
    let q = d.up_to_the_choice();
    assert_eq!(option_ids(&q), ["staging", "production", "other"]);
    assert_eq!(q["options"][1]["is_dangerous"], true);
    let out = d.answer_txt("staging\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "deployed 1.4.2 to staging");
    assert_eq!(d.deployments(), ["staging 1.4.2"]);
    assert_eq!(
        d.events("HUMAN_INPUT_REQUEST").len(),
        3,
        "plan, key, environment: no approval"
    );

    // Another one, by label, with its text on the next line.
    let d = Deployer::new();
    d.up_to_the_choice();
    let out = d.answer_txt("Another one\nqa-east\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.deployments(), ["qa-east 1.4.2"]);
    assert_eq!(d.last("HUMAN_INPUT_RECEIVED")["input"], "qa-east");

    // Another one that matches dangerous_if: asked for approval like production.
    let d = Deployer::new();
    d.up_to_the_choice();
    let out = d.answer_txt("other: prod-eu\n");
    assert_eq!(code(&out), 101, "{}", stderr(&out));
    let q = d.request();
    assert_eq!(q["type"], "TOOL_APPROVAL");
    assert_eq!(q["context"]["args"]["env"], "prod-eu");
    assert_eq!(q["context"]["dangerous_because"], "`env` matches /^prod/");
    let out = d.answer_txt("approve\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(d.deployments(), ["prod-eu 1.4.2"]);
    d.assert_no_canary();
}

#[test]
fn mailbox_bad_answers_are_refused_and_nothing_is_journaled() {
    let d = Deployer::new();
    d.start();
    let tasks_not_a_list = json!({"option_id": "modify", "data": {"tasks": "deploy everything"}});
    let unknown_tool =
        json!({"option_id": "modify", "data": {"tasks": [{"description": "wipe", "tool": "rm"}]}});
    refuse_all(
        &d,
        &[
            Refusal::txt(
                "maybe\n",
                "invalid_option",
                "`maybe` is not an option of this request; write one of: confirm (Confirm, or 1)",
            ),
            Refusal::txt(
                "modify\n",
                "input_required",
                "option `modify` needs a non-empty input",
            ),
            Refusal::json(
                tasks_not_a_list,
                "invalid_args",
                "data.tasks: a task list is a JSON list of tasks, e.g. [{\"description\"",
            ),
            Refusal::json(
                unknown_tool,
                "invalid_args",
                "data.tasks: task 1 names the unknown tool `rm`; the agent's tools: check_key, deploy",
            ),
            Refusal::json(
                json!({"option_id": "nope"}),
                "invalid_option",
                "`nope` is not an option of this request; choose one of: confirm, modify, cancel",
            ),
        ],
    );

    let out = d.answer_txt("confirm\n");
    assert_eq!(code(&out), 101, "{}", stderr(&out));
    refuse_all(
        &d,
        &[Refusal::txt(" \n", "input_required", "the answer is empty")],
    );
    let out = d.answer_txt(&format!("{CANARY}\n"));
    assert_eq!(code(&out), 101, "{}", stderr(&out));
    refuse_all(
        &d,
        &[Refusal::txt(
            "other\n",
            "input_required",
            "option `other` needs a non-empty input",
        )],
    );
    let out = d.answer_txt("production\n");
    assert_eq!(code(&out), 101, "{}", stderr(&out));
    let missing = json!({"option_id": "approve", "data": {"args": {"env": "production"}}});
    refuse_all(
        &d,
        &[
            Refusal::txt(
                "reject\n",
                "input_required",
                "option `reject` needs a non-empty input",
            ),
            Refusal::txt(
                "approve\nforce=yes\n",
                "invalid_args",
                "unknown parameter `force` (parameters: env, version)",
            ),
            Refusal::txt(
                "approve\nplease\n",
                "invalid_args",
                "`please` is not key=value",
            ),
            Refusal::json(
                missing,
                "invalid_args",
                "missing required parameter `version`",
            ),
            Refusal::txt("launch\n", "invalid_option", "`launch` is not an option"),
        ],
    );
    assert!(d.deployments().is_empty());
    d.assert_no_canary();
}

/// A bad answer: the mailbox file, what is written in it, its code and what the message says.
struct Refusal {
    file: &'static str,
    content: String,
    code: &'static str,
    says: &'static str,
}

impl Refusal {
    fn txt(content: &str, code: &'static str, says: &'static str) -> Self {
        Refusal {
            file: "response.txt",
            content: content.to_owned(),
            code,
            says,
        }
    }

    fn json(v: Value, code: &'static str, says: &'static str) -> Self {
        Refusal {
            file: "response.json",
            content: v.to_string(),
            code,
            says,
        }
    }
}

/// Each answer is refused with its code and message: exit 101, the journal, request and answer
/// files unchanged, the run still waiting.
fn refuse_all(d: &Deployer, cases: &[Refusal]) {
    let journal = d.journal();
    let request = std::fs::read(d.mailbox("request.json")).expect("request");
    for Refusal {
        file,
        content,
        code: want,
        says,
    } in cases
    {
        let path = d.mailbox(file);
        std::fs::write(&path, content).expect("write");
        let out = d.delta(&[], None);
        let err = stderr(&out);
        assert_eq!(code(&out), 101, "{file} {content:?}: {err}");
        assert!(
            err.contains(&format!("refused ({want})")),
            "{file} {content:?}: {err}"
        );
        assert!(err.contains(says), "{file} {content:?}: {err}");
        assert!(err.contains("The run stays waiting"), "{err}");
        assert_eq!(
            &std::fs::read_to_string(&path).expect("left alone"),
            content
        );
        assert_eq!(d.journal(), journal, "nothing journaled for {content:?}");
        assert_eq!(
            std::fs::read(d.mailbox("request.json")).expect("request"),
            request
        );
        assert_eq!(d.status(), "WAITING_FOR_INPUT");
        std::fs::remove_file(&path).expect("rm");
    }
}

#[test]
fn mailbox_an_unanswered_plan_takes_plan_default() {
    for (default, exit, status) in [
        ("cancel", 3, "CANCELLED"),
        ("confirm", 101, "WAITING_FOR_INPUT"),
    ] {
        let d = Deployer::with_config(|c| {
            c.replace("plan_timeout_seconds: 3600", "plan_timeout_seconds: 0")
                .replace("plan_default: cancel", &format!("plan_default: {default}"))
        });
        let q = d.start();
        assert_eq!(q["default_option_id"], default);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let out = d.delta(&[], None);
        assert_eq!(code(&out), exit, "{default}: {}", stderr(&out));
        assert_eq!(d.status(), status);
        let r = d.last("HUMAN_INPUT_RECEIVED");
        assert_eq!(r["option_id"], default);
        assert_eq!(r["responder"], json!({"id": "timeout", "via": "timeout"}));
        let warned = d.events("SYSTEM_MESSAGE");
        assert!(warned.iter().any(|m| {
            m["content"]
                .as_str()
                .unwrap_or("")
                .contains("applied the default option")
        }));
        if default == "confirm" {
            assert_eq!(
                d.request()["type"],
                "USER_INPUT",
                "the run went on to the key"
            );
        }
    }
}

// -- interactive mode (-i) ---------------------------------------------------------------------

/// `delta run -i` with `lines` on stdin.
fn interactive(d: &Deployer, lines: &str) -> Output {
    d.delta(&["-i", "--task", VERSION], Some(lines))
}

#[test]
fn interactive_every_question_is_asked_on_the_terminal() {
    let d = Deployer::new();
    let out = interactive(
        &d,
        &format!("9\nconfirm\n{CANARY}\n2\napprove\nforce\nversion=1.4.3\n\n"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    for shown in [
        "== Confirm the plan (round 1 of 3) ==",
        "3. Deploy 1.4.2 (tool deploy) [risk high]",
        "1) Confirm [confirm] - Carry out the plan as shown  !! dangerous",
        "`9` is not one of the options",
        "(hidden) > ",
        "2) Production [production] - Live traffic: the deploy asks for approval  !! dangerous",
        "== Approve tool call: deploy ==",
        "risk:    high (`env` matches /^prod/)",
        "`force` is not key=value",
        "running with: {\"env\":\"production\",\"version\":\"1.4.3\"}",
    ] {
        assert!(err.contains(shown), "missing {shown:?} in:\n{err}");
    }
    assert_eq!(stdout(&out), "deployed 1.4.3 to production");
    assert_eq!(d.deployments(), ["production 1.4.3"]);
    assert_eq!(
        d.last("HUMAN_INPUT_RECEIVED")["edited_args"],
        json!({"changed": {"version": {"from": "1.4.2", "to": "1.4.3"}}, "added": {}, "removed": []})
    );
    let vias: Vec<Value> = d
        .events("HUMAN_INPUT_RECEIVED")
        .iter()
        .map(|r| r["responder"]["via"].clone())
        .collect();
    assert_eq!(vias, vec![json!("stdin"); 4]);
    assert!(!d.mailbox("request.json").exists(), "no mailbox in -i mode");
    d.assert_no_canary();
}

#[test]
fn interactive_refused_edits_ask_again_and_nothing_is_journaled() {
    let d = Deployer::new();
    let out = interactive(
        &d,
        &format!("confirm\n{CANARY}\nproduction\napprove\nreplicas=3\n\nreject\nwrong flags\n"),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(
            "refused (invalid_args): edited arguments refused: unknown parameter `replicas`"
        ),
        "{err}"
    );
    let answers = d.events("HUMAN_INPUT_RECEIVED");
    assert_eq!(answers.len(), 4, "the refused approval is not journaled");
    assert_eq!(answers[3]["action"], "REJECT_WITH_REASON");
    assert_eq!(
        d.last("ACTION_RESULT")["observation_content"],
        "rejected: wrong flags"
    );
    assert!(d.deployments().is_empty());
    d.assert_no_canary();
}

#[test]
fn interactive_each_option_of_each_question() {
    struct Case {
        stdin: String,
        exit: i32,
        deployed: &'static [&'static str],
        last_action: &'static str,
    }
    let key = CANARY;
    let cases = [
        // plan: modify, then confirm the revised plan; choice: another environment.
        Case {
            stdin: format!("modify\nsmoke tests first\nconfirm\n{key}\n3\nqa-west\n"),
            exit: 0,
            deployed: &["qa-west 1.4.2"],
            last_action: "PROVIDE_INFO",
        },
        // plan: cancel.
        Case {
            stdin: "3\n".into(),
            exit: 3,
            deployed: &[],
            last_action: "TERMINATE",
        },
        // choice: staging, no approval.
        Case {
            stdin: format!("1\n{key}\nStaging\n"),
            exit: 0,
            deployed: &["staging 1.4.2"],
            last_action: "PROVIDE_INFO",
        },
        // approval: approve as shown.
        Case {
            stdin: format!("1\n{key}\nproduction\n1\n\n"),
            exit: 0,
            deployed: &["production 1.4.2"],
            last_action: "APPROVE_AND_EXECUTE",
        },
        // approval: retry with feedback.
        Case {
            stdin: format!("1\n{key}\nproduction\nretry\ntry staging first\n"),
            exit: 0,
            deployed: &[],
            last_action: "RETRY_WITH_FEEDBACK",
        },
        // approval: terminate.
        Case {
            stdin: format!("1\n{key}\nproduction\nterminate\n"),
            exit: 3,
            deployed: &[],
            last_action: "TERMINATE",
        },
    ];
    for case in cases {
        let d = Deployer::new();
        let out = interactive(&d, &case.stdin);
        let label = case.stdin.replace(key, "KEY");
        assert_eq!(code(&out), case.exit, "{label}: {}", stderr(&out));
        assert_eq!(d.deployments(), case.deployed, "{label}");
        assert_eq!(
            d.last("HUMAN_INPUT_RECEIVED")["action"],
            case.last_action,
            "{label}"
        );
        let status = if case.exit == 3 {
            "CANCELLED"
        } else {
            "COMPLETED"
        };
        assert_eq!(d.status(), status, "{label}");
        assert_eq!(d.last("ENGINE_END")["status"], status, "{label}");
        d.assert_no_canary();
    }
}

#[test]
fn interactive_an_unanswered_plan_takes_plan_default() {
    let d = Deployer::with_config(|c| {
        c.replace("plan_timeout_seconds: 3600", "plan_timeout_seconds: 0")
    });
    // Nobody types: the prompt expires at once and the default (cancel) applies.
    let out = d.delta(&["-i", "--task", VERSION], Some(""));
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let r = d.last("HUMAN_INPUT_RECEIVED");
    assert_eq!(
        (r["option_id"].as_str(), r["responder"]["via"].as_str()),
        (Some("cancel"), Some("timeout"))
    );
    assert_eq!(d.status(), "CANCELLED");
}

// -- the same agent on the openai brain ----------------------------------------------------------

/// An OpenAI-compatible endpoint served by the test on its own thread: it records every request
/// and answers with `replies` in order. `SECRET_REF` in a reply is replaced by the `{{secret:…}}`
/// reference the conversation last mentioned, as a model would copy it.
fn fake_llm(replies: Vec<Value>) -> (String, Recorded) {
    use axum::Json;
    use axum::extract::State;
    async fn completions(State(s): State<Recorded>, Json(body): Json<Value>) -> Json<Value> {
        let mut s = s.lock().expect("lock");
        let secret_ref = body["messages"].as_array().and_then(|m| {
            m.iter().rev().find_map(|m| {
                let c = m["content"].as_str()?;
                let at = c.find("{{secret:")?;
                Some(c[at..].split("}}").next().unwrap_or("").to_owned() + "}}")
            })
        });
        s.requests.push(body);
        let reply = if s.replies.is_empty() {
            json!({"choices": [{"message": {"role": "assistant", "content": "out of replies"}}]})
        } else {
            s.replies.remove(0)
        };
        let text = reply
            .to_string()
            .replace("SECRET_REF", secret_ref.as_deref().unwrap_or("none"));
        Json(serde_json::from_str(&text).expect("reply"))
    }
    let shared: Recorded = std::sync::Arc::new(std::sync::Mutex::new(Exchange {
        requests: vec![],
        replies,
    }));
    let state = shared.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // The server outlives the test's subprocesses; the thread ends with the test process.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            let app = axum::Router::new()
                .route("/v1/chat/completions", axum::routing::post(completions))
                .with_state(state);
            let _ = axum::serve(listener, app).await;
        });
    });
    let addr = rx.recv().expect("the fake endpoint started");
    (format!("http://{addr}/v1"), shared)
}

/// What the fake endpoint received, and what it answers next.
struct Exchange {
    requests: Vec<Value>,
    replies: Vec<Value>,
}

type Recorded = std::sync::Arc<std::sync::Mutex<Exchange>>;

fn llm_calls(calls: Value) -> Value {
    let calls: Vec<Value> = calls
        .as_array()
        .expect("calls")
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({"id": format!("call{i}"), "type": "function",
                   "function": {"name": c[0], "arguments": c[1].to_string()}})
        })
        .collect();
    json!({"choices": [{"message": {"role": "assistant", "content": "", "tool_calls": calls}}]})
}

#[test]
fn openai_brain_the_secret_never_reaches_the_model_or_any_file() {
    let (url, requests) = fake_llm(vec![
        llm_calls(json!([["plan", {"tasks": [
            {"description": "check the key", "tool": "check_key"},
            {"description": "deploy", "tool": "deploy"}]}]])),
        llm_calls(json!([["ask_human", {"prompt": "API key?", "sensitive": true}]])),
        llm_calls(json!([["check_key", {"key": "SECRET_REF"}]])),
        llm_calls(json!([["ask_human", {"prompt": "Where to?", "options": [
            {"id": "staging", "label": "Staging"},
            {"id": "other", "label": "Another one", "requires_input": true}]}]])),
        llm_calls(json!([["deploy", {"env": "prod-eu", "version": "1.4.2"}]])),
        json!({"choices": [{"message": {"role": "assistant", "content": "deployed to prod-eu"}}]}),
    ]);
    let d = Deployer::with_config(|c| {
        c.replace(
            "brain: scripted",
            &format!("llm:\n  model: fake\n  base_url: {url}\n  max_retries: 1"),
        )
    });
    let q = d.start();
    assert!(
        q["context"]["plan"].is_array(),
        "the plan tool's plan is confirmed first"
    );
    for (answer, exit) in [
        ("confirm\n".to_owned(), 101),
        (format!("{CANARY}\n"), 101),
        ("other: prod-eu\n".to_owned(), 101),
        ("approve\n".to_owned(), 0),
    ] {
        let out = d.answer_txt(&answer);
        assert_eq!(code(&out), exit, "{}", stderr(&out));
    }
    assert_eq!(d.deployments(), ["prod-eu 1.4.2"]);
    let check = d
        .events("ACTION_REQUEST")
        .into_iter()
        .find(|a| a["tool"] == "check_key")
        .expect("check_key was called");
    assert!(
        check["args"]["key"]
            .as_str()
            .unwrap_or("")
            .starts_with("{{secret:")
    );

    let requests = requests.lock().expect("lock").requests.clone();
    assert_eq!(requests.len(), 6, "one request per decision");
    for r in &requests {
        assert!(
            !r.to_string().contains(CANARY),
            "the secret was sent to the model"
        );
    }
    let tool_said = |i: usize| -> Vec<String> {
        requests[i]["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter(|m| m["role"] == "tool")
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect()
    };
    // The key reached the tool (it checked it) and only its fingerprint came back.
    assert!(
        tool_said(3)
            .iter()
            .any(|m| m.starts_with("API key accepted: ****** (17 characters")),
        "{:?}",
        tool_said(3)
    );
    assert!(
        tool_said(4).contains(&"chose \"Another one\" (option other): prod-eu".to_owned()),
        "{:?}",
        tool_said(4)
    );
    d.assert_no_canary();
}
