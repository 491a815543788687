//! `delta migrate-redis`: moves a fleet's Redis keys from the layout of before the buckets to
//! the bucketed one (docs/operations.md#redis-buckets). Stop the fleet first; running it again
//! finishes a migration cut short and otherwise moves nothing.
//!
//! With `--journal-entries` it only lets the fleet write its journals in the newest format (each
//! write's events packed in one entry), once every gateway and worker runs a build that reads it
//! (docs/operations.md#upgrading-with-no-run-lost).

use delta_store::redis::{DEFAULT_BUCKETS, MAX_BUCKETS, RedisRunStore};

#[derive(Debug, Clone, clap::Args)]
pub struct MigrateArgs {
    /// The Redis to migrate (prefer the environment: `ps` shows flags, and the URL may hold a
    /// password).
    #[arg(
        long,
        env = "DELTA_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub redis_url: String,
    /// A CA certificate (PEM) to trust for a rediss:// URL.
    #[arg(long, env = "DELTA_REDIS_CA_FILE", value_name = "FILE")]
    pub redis_ca_file: Option<std::path::PathBuf>,
    /// The fleet's key prefix.
    #[arg(long, env = "DELTA_KEY_PREFIX", default_value = "delta")]
    pub key_prefix: String,
    /// How many buckets to spread the runs over: the fleet's DELTA_REDIS_BUCKETS, fixed from now on.
    #[arg(long, env = "DELTA_REDIS_BUCKETS", default_value_t = DEFAULT_BUCKETS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BUCKETS)))]
    pub redis_buckets: u32,
    /// Only let the fleet write its journals in the newest format, each write's events packed in
    /// one entry (smaller, fewer commands): run it once every gateway and worker runs a build of
    /// 2026-11-25 or later, then restart them. Moves no keys.
    #[arg(long)]
    pub journal_entries: bool,
    /// The URL is a seed node of a Redis Cluster (for `--journal-entries`).
    #[arg(long, env = "DELTA_REDIS_CLUSTER")]
    pub redis_cluster: bool,
}

/// Migrates, prints what moved as one JSON line; exit 0, or 1 with the reason on stderr.
pub async fn run(args: MigrateArgs, cancel: tokio_util::sync::CancellationToken) -> i32 {
    if args.journal_entries {
        return journal_entries(&args).await;
    }
    // A bar on stderr for people (SCAN, then a round trip per 500 keys: minutes on a big
    // Redis); Ctrl+C stops between batches, and running it again finishes it.
    let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let progress = |what: &str, done: usize, of: usize| {
        if let Some(bar) = &bar {
            bar.set_length(of as u64);
            bar.set_position(done as u64);
            bar.set_message(what.to_owned());
        }
        !cancel.is_cancelled()
    };
    let moved = RedisRunStore::migrate_layout_with(
        &args.redis_url,
        &args.key_prefix,
        args.redis_ca_file.as_deref(),
        args.redis_buckets,
        &progress,
    )
    .await;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    match moved {
        Ok(m) => {
            crate::ops::out(&format!(
                "{}\n",
                serde_json::json!({
                    "prefix": args.key_prefix,
                    "buckets": args.redis_buckets,
                    "run_keys": m.run_keys,
                    "index_entries": m.index_entries,
                    "idempotency_keys": m.idempotency_keys,
                    "skipped": m.skipped,
                    "interrupted": m.interrupted,
                })
            ));
            if m.interrupted {
                eprintln!(
                    "interrupted: what moved stays moved; run the same command again to finish (each step is safe to repeat)"
                );
                return 130;
            }
            0
        }
        Err(e) => {
            eprintln!("error: {}", delta_host::Chain(&e));
            1
        }
    }
}

/// `--journal-entries`: sets `<p>:journal-format`, prints one JSON line.
async fn journal_entries(args: &MigrateArgs) -> i32 {
    let options = delta_store::redis::Options {
        cluster: args.redis_cluster,
        ca_file: args.redis_ca_file.clone(),
        buckets: None,
    };
    let set =
        match RedisRunStore::connect_options(&args.redis_url, &args.key_prefix, &options).await {
            Ok(store) => store.allow_entry_per_write().await,
            Err(e) => Err(e),
        };
    match set {
        Ok(already) => {
            crate::ops::out(&format!(
                "{}\n",
                serde_json::json!({
                    "prefix": args.key_prefix,
                    "journal_format": delta_store::redis::JOURNAL_FORMAT_PACKED,
                    "already": already,
                })
            ));
            eprintln!(
                "restart the gateways and workers: each writes packed journal entries once it starts again"
            );
            0
        }
        Err(e) => {
            eprintln!("error: {}", delta_host::Chain(&e));
            1
        }
    }
}
