//! `delta bench hitl-basic` runs end to end on a small scale and prints the workload's JSON line
//! (what BENCHMARKS.md and the README promise), for both ways the human answers. Its figures
//! are not judged here: performance lives in the benchmark, not in tests.

use serde_json::Value;

async fn bench(args: &[&str]) -> (i32, Value, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_delta"))
        .args(["bench", "hitl-basic"])
        .args(args)
        .output()
        .await
        .expect("delta bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "one JSON line on stdout: {stdout}\nstderr: {stderr}"
    );
    let line =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    (out.status.code().unwrap_or(-1), line, stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_bench_prints_the_workload_line_with_every_run_checked() {
    // Each worker's slots and those kept for resumes: given on one pass, the defaults on the
    // other (a quarter of 64).
    for (via, slots, expected) in [
        (
            "http",
            &["--worker-concurrency", "8", "--resume-slots", "6"][..],
            (8, 6),
        ),
        ("nats", &[][..], (64, 16)),
    ] {
        let mut args = vec![
            "--runs",
            "24",
            "--concurrency",
            "4",
            "--workers",
            "2",
            "--answer-via",
            via,
            "--journal-len",
            "3",
            "--paused-probe",
            "5",
        ];
        args.extend_from_slice(slots);
        let (code, line, stderr) = bench(&args).await;
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(line["worker_concurrency"], expected.0, "{line}");
        assert_eq!(line["resume_slots"], expected.1, "{line}");
        assert_eq!(line["workload"], "hitl-basic");
        assert_eq!(line["runs"], 24);
        assert_eq!(line["concurrency"], 4);
        assert_eq!(line["workers"], 2);
        assert_eq!(line["answer_via"], via);
        assert_eq!(line["journal_len"], 3);
        assert_eq!(line["completed"], 24, "{line}");
        assert_eq!(line["failed"], 0);
        assert_eq!(line["lost"], 0);
        for field in [
            "wall_s",
            "runs_per_s",
            "resume_p50_ms",
            "resume_p95_ms",
            "resume_p99_ms",
            "submit_to_pause_p50_ms",
            "question_heard_p50_ms",
            "redis_commands_per_run",
            "redis_round_trips_per_run_workers",
            "redis_round_trips_per_run_gateway",
            "worker_rss_max_mib",
            "gateway_rss_max_mib",
        ] {
            let v = line[field]
                .as_f64()
                .unwrap_or_else(|| panic!("{field}: {line}"));
            assert!(v > 0.0, "{field} is measured: {line}");
        }
        // A share (the gateway logged it as it stopped): how many depends on who wins the race
        // between the bench's answer and the gateway's copy of the question.
        let share = line["answers_from_memory_share"]
            .as_f64()
            .unwrap_or_else(|| panic!("answers_from_memory_share: {line}"));
        assert!((0.0..=1.0).contains(&share), "{line}");
        // A resume's two parts: each measured, and neither longer than the slowest resume.
        let p99 = line["resume_p99_ms"].as_f64().unwrap_or_default();
        for part in ["answer_to_settled", "settled_to_step5"] {
            let v = line["resume_parts_p50_ms"][part]
                .as_f64()
                .unwrap_or_else(|| panic!("{part}: {line}"));
            assert!(v > 0.0 && v <= p99, "{part}: {line}");
        }
        // NATS's messages per run: each run publishes at least five (its start job, its
        // question, the answer, the resume job, its end), and each of those is acknowledged.
        for way in ["in", "out"] {
            let v = line["nats_messages_per_run"][way]
                .as_f64()
                .unwrap_or_else(|| panic!("nats_messages_per_run.{way}: {line}"));
            assert!(v >= 5.0, "nats_messages_per_run.{way}: {line}");
        }
        let p50 = line["resume_p50_ms"].as_f64().unwrap_or_default();
        assert!(p50 <= p99, "percentiles in order: {line}");
        assert!(
            line["redis_bytes_per_paused_run"].as_u64().is_some(),
            "{line}"
        );
        // Every paused run has a record (with its snapshot: scripted brain), a journal and a
        // question.
        let by_key = &line["redis_bytes_per_paused_run_by_key"];
        for key in ["record", "journal", "question"] {
            assert!(by_key[key].as_u64().unwrap_or(0) > 0, "{key}: {line}");
        }
        assert!(by_key.get("snapshot").is_none(), "in the record: {line}");
        assert!(by_key["listings_and_keyspace"].is_u64(), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_bench_flags_are_usage_errors() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_delta"))
        .args(["bench", "hitl-basic", "--runs", "0"])
        .output()
        .await
        .expect("delta bench");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--runs"));
    assert!(out.stdout.is_empty());
}

/// Resume slots that leave start jobs none are refused before anything starts, with what to
/// give instead.
#[tokio::test(flavor = "multi_thread")]
async fn resume_slots_must_leave_start_jobs_a_slot() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_delta"))
        .args([
            "bench",
            "hitl-basic",
            "--worker-concurrency",
            "4",
            "--resume-slots",
            "4",
        ])
        .output()
        .await
        .expect("delta bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--resume-slots 4") && stderr.contains("fewer resume slots"),
        "{stderr}"
    );
    assert!(!stderr.contains("starting"), "nothing started: {stderr}");
    assert!(out.stdout.is_empty());
}
