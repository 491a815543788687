//! `delta-worker`'s configuration: flags win over `DELTA_*` environment variables, and every bad
//! value is reported at once (exit 64) rather than the first one only.

use std::collections::HashMap;
use std::path::PathBuf;

use delta_host::settings::{Setting, Settings};

use crate::fleet::Config;
use delta_queue as queue;

/// The settings, by their environment names (docs/protocol.md §9), with defaults.
pub const SETTINGS: &[Setting] = &[
    ("DELTA_NATS_URL", "nats-url", "nats://127.0.0.1:4222"),
    ("DELTA_REDIS_URL", "redis-url", "redis://127.0.0.1:6379"),
    ("DELTA_NATS_CA_FILE", "nats-ca-file", ""),
    ("DELTA_REDIS_CA_FILE", "redis-ca-file", ""),
    ("DELTA_REDIS_CLUSTER", "redis-cluster", "0"),
    ("DELTA_REDIS_DURABILITY", "redis-durability", ""),
    ("DELTA_REDIS_BUCKETS", "redis-buckets", ""),
    ("DELTA_STREAM_REPLICAS", "stream-replicas", "1"),
    ("DELTA_KEY_PREFIX", "key-prefix", "delta"),
    ("DELTA_AGENTS_DIR", "agents-dir", "./agents"),
    ("DELTA_WORK_DIR", "work-dir", "."),
    ("DELTA_WORKER_CONCURRENCY", "concurrency", "16"),
    ("DELTA_RESUME_SLOTS", "resume-slots", ""),
    ("DELTA_ACK_WAIT_S", "ack-wait-s", "30"),
    ("DELTA_MAX_DELIVER", "max-deliver", "5"),
    ("DELTA_WORKER_ID", "worker-id", ""),
    ("DELTA_GRACE_S", "grace-s", "20"),
    ("DELTA_SECRETS_KEY", "secrets-key", ""),
    ("DELTA_RETENTION", "retention", "7d"),
    ("DELTA_WORK_SWEEP_S", "work-sweep-s", "600"),
];

/// Builds the config from `--name value` / `--name=value` flags and an environment map.
pub fn parse(args: &[String], env: &HashMap<String, String>) -> Result<Config, Vec<String>> {
    let mut s = Settings::parse(SETTINGS, args, env);
    let concurrency = s.number_at_most(
        "DELTA_WORKER_CONCURRENCY",
        1,
        100_000,
        "is more runs than one worker holds at once (at most 100000)",
    );
    let resume_slots = resume_slots(&mut s, concurrency);
    // A job redelivered after a lost ack announces its question again, which the events stream
    // drops as a duplicate only within its 2-minute window; a worker extends a long step's
    // deadline itself, so a longer `ack_wait` buys nothing.
    let ack_wait = s.seconds_at_most(
        "DELTA_ACK_WAIT_S",
        1.0,
        120.0,
        "is more than 120 seconds: a job redelivered after a lost ack must announce its question again within the events stream's 2-minute duplicate window, or subscribers get it twice; keep it at most 120 (a worker extends a long step's deadline itself)",
    );
    let max_deliver = s.number("DELTA_MAX_DELIVER", 1);
    let grace = s.seconds("DELTA_GRACE_S", 0.0);
    let servers = s.servers();
    let agents_dir = s.dir("DELTA_AGENTS_DIR", "agents");
    let (work_dir, _) = s.get("DELTA_WORK_DIR");
    let (worker_id, _) = s.get("DELTA_WORKER_ID");
    let secrets_key = s.secrets_key("DELTA_SECRETS_KEY");
    let retention = s.period("DELTA_RETENTION");
    let sweep_every = s.seconds("DELTA_WORK_SWEEP_S", 0.1);
    s.finish()?;
    let worker_id = if worker_id.is_empty() {
        format!(
            "worker-{}",
            &uuid::Uuid::now_v7().simple().to_string()[20..]
        )
    } else {
        worker_id
    };
    Ok(Config {
        nats_url: servers.nats_url,
        redis_url: servers.redis_url,
        redis_ca: servers.redis_ca,
        prefix: servers.prefix,
        agents_dir,
        work_dir: PathBuf::from(work_dir),
        concurrency: usize::try_from(concurrency).unwrap_or(usize::MAX),
        resume_slots: usize::try_from(resume_slots).unwrap_or(usize::MAX),
        queue: queue::Settings {
            ca_file: servers.nats_ca,
            replicas: servers.stream_replicas,
            ack_wait,
            max_deliver: i64::try_from(max_deliver).unwrap_or(i64::MAX),
            ..Default::default()
        },
        worker_id,
        grace,
        secrets_key,
        durability: servers.durability,
        redis_cluster: servers.redis_cluster,
        redis_buckets: servers.redis_buckets,
        retention,
        sweep_every,
    })
}

/// `DELTA_RESUME_SLOTS`: the slots start jobs may not take, so that a resume job finds one free
/// (docs/protocol.md §9). Unset: [`fleet::default_resume_slots`]. Start jobs keep at least one
/// slot, so it is less than the concurrency.
fn resume_slots(s: &mut Settings, concurrency: u64) -> u64 {
    let (v, _) = s.get("DELTA_RESUME_SLOTS");
    if v.trim().is_empty() {
        let c = usize::try_from(concurrency).unwrap_or(usize::MAX);
        return crate::fleet::default_resume_slots(c) as u64;
    }
    let most = concurrency.saturating_sub(1);
    s.number_at_most(
        "DELTA_RESUME_SLOTS",
        0,
        most,
        &format!(
            "is not less than DELTA_WORKER_CONCURRENCY ({concurrency}): start jobs need a slot (at most {most})"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_win_over_the_environment() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path().display().to_string();
        let env: HashMap<String, String> = [
            ("DELTA_WORKER_CONCURRENCY", "3"),
            ("DELTA_AGENTS_DIR", d.as_str()),
            ("DELTA_KEY_PREFIX", "env"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let c = parse(
            &args(&["--key-prefix", "flag", "--ack-wait-s=7", "--grace-s", "0.5"]),
            &env,
        )
        .expect("valid");
        assert_eq!((c.concurrency, c.prefix.as_str()), (3, "flag"));
        assert_eq!(c.queue.ack_wait, Duration::from_secs(7));
        assert_eq!(c.grace, Duration::from_millis(500));
        assert!(c.worker_id.starts_with("worker-"));
        assert_eq!(c.retention, Some(Duration::from_secs(7 * 24 * 3600)));
        assert_eq!(c.sweep_every, Duration::from_secs(600));
        let off: HashMap<String, String> = [("DELTA_RETENTION", "off"), ("DELTA_AGENTS_DIR", &d)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let c = parse(&args(&["--work-sweep-s", "0.5"]), &off).expect("valid");
        assert_eq!(c.retention, None);
        assert_eq!(c.sweep_every, Duration::from_millis(500));
    }

    #[test]
    fn debug_output_hides_the_servers_passwords() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path().display().to_string();
        let env: HashMap<String, String> = [
            ("DELTA_AGENTS_DIR", d.as_str()),
            ("DELTA_NATS_URL", "nats://w:nats-s3cret@10.0.0.1:4222"),
            (
                "DELTA_REDIS_URL",
                "redis://w:redis-s3cret@10.0.0.2:6379,redis://w:redis-s3cret@10.0.0.3:6379",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let c = parse(&[], &env).expect("valid");
        assert!(c.nats_url.contains("nats-s3cret"), "the config keeps it");
        let shown = format!("{c:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("10.0.0.3:6379"), "{shown}");
    }

    #[test]
    fn resume_slots_default_to_a_quarter_and_leave_starts_a_slot() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path().display().to_string();
        let with = |pairs: &[(&str, &str)]| -> Result<Config, Vec<String>> {
            let env: HashMap<String, String> = pairs
                .iter()
                .chain([("DELTA_AGENTS_DIR", d.as_str())].iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            parse(&[], &env)
        };
        let slots = |c: &str| {
            with(&[("DELTA_WORKER_CONCURRENCY", c)])
                .expect("valid")
                .resume_slots
        };
        assert_eq!(slots("16"), 4);
        assert_eq!(slots("5"), 1);
        assert_eq!(slots("2"), 1);
        assert_eq!(
            slots("1"),
            0,
            "one slot: starts keep it, resumes are asked first"
        );
        let c = with(&[
            ("DELTA_WORKER_CONCURRENCY", "8"),
            ("DELTA_RESUME_SLOTS", "0"),
        ])
        .expect("valid");
        assert_eq!(c.resume_slots, 0);
        let c = parse(&args(&["--resume-slots", "7", "--concurrency", "8"]), &{
            let mut e = HashMap::new();
            e.insert("DELTA_AGENTS_DIR".to_owned(), d.clone());
            e
        })
        .expect("valid");
        assert_eq!(c.resume_slots, 7);
        for bad in ["8", "-1", "many"] {
            let errs = with(&[
                ("DELTA_WORKER_CONCURRENCY", "8"),
                ("DELTA_RESUME_SLOTS", bad),
            ])
            .expect_err(bad);
            assert_eq!(errs.len(), 1, "{errs:#?}");
            assert!(errs[0].starts_with("DELTA_RESUME_SLOTS: "), "{errs:#?}");
        }
    }

    #[test]
    fn ack_wait_is_at_most_the_duplicate_window() {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path().display().to_string();
        let with = |v: &str| {
            let env: HashMap<String, String> =
                [("DELTA_AGENTS_DIR", d.as_str()), ("DELTA_ACK_WAIT_S", v)]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
            parse(&[], &env)
        };
        let c = with("120").expect("at the window");
        assert_eq!(c.queue.ack_wait, Duration::from_secs(120));
        for bad in ["120.5", "600"] {
            let errs = with(bad).expect_err(bad);
            assert_eq!(errs.len(), 1, "{errs:#?}");
            assert!(
                errs[0].starts_with(&format!(
                    "DELTA_ACK_WAIT_S: `{bad}` is more than 120 seconds"
                )),
                "{errs:#?}"
            );
        }
        let errs = with("0.5").expect_err("below the least");
        assert!(errs[0].starts_with("DELTA_ACK_WAIT_S: "), "{errs:#?}");
    }

    #[test]
    fn every_bad_value_is_reported_at_once() {
        let env: HashMap<String, String> = [
            ("DELTA_REDIS_URL", "localhost:6379"),
            ("DELTA_WORKER_CONCURRENCY", "0"),
            ("DELTA_SECRETS_KEY", "not-hex"),
            ("DELTA_RETENTION", "7 days"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let errs = parse(
            &args(&[
                "--nats-url",
                "http://x",
                "--agents-dir",
                "/no/such/dir",
                "--bogus",
                "1",
            ]),
            &env,
        )
        .expect_err("invalid");
        assert_eq!(errs.len(), 7, "{errs:#?}");
        for needle in [
            "--bogus",
            "DELTA_WORKER_CONCURRENCY",
            "--nats-url",
            "DELTA_REDIS_URL",
            "--agents-dir",
            "DELTA_SECRETS_KEY: DELTA_SECRETS_KEY must be one or more keys of 64 hex digits",
            "DELTA_RETENTION: `7 days` is not a period",
        ] {
            assert!(
                errs.iter().any(|e| e.contains(needle)),
                "{needle} in {errs:#?}"
            );
        }
    }
}
