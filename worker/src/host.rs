//! What every binary's `main` does the same way: logging to stderr and the async runtime.

/// Logs to stderr, filtered by `DELTA_LOG` (tracing's env-filter syntax), else `default`.
pub fn init_logging(default: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DELTA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// The multi-threaded runtime; on failure, says so and exits 1.
pub fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    }
}
