//! Delta Fleet's agent engine and its fleet host.
//!
//! - [`agent`]: loading and checking an agent directory (`config.yaml`, `script.yaml`).
//! - [`tools`]: Delta Engine's tool forms, run as child processes with timeouts.
//! - [`brain`]: the scripted and the OpenAI-compatible brains.
//! - [`engine`]: the Thought-Action-Observation loop, resumable from its journal.
//!
//! The engine writes only through the `RunStore` port and never waits for a person: the hosts
//! (`delta run`, the fleet worker) decide what a pause means.

pub mod config;
pub mod fleet;

/// The `delta-worker` program (also `delta worker`): configuration from `args` and the environment,
/// logging, signals, run. Returns the exit code: 0, 1 on a failure, 64 on bad configuration.
pub fn cli_main(args: Vec<String>) -> i32 {
    if args.iter().any(|a| a == "--help" || a == "-h") {
        eprint!(
            "{}",
            delta_host::settings::usage("delta-worker", crate::config::SETTINGS)
        );
        return 0;
    }
    let env = std::env::vars().collect();
    let config = match crate::config::parse(&args, &env) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            return 64;
        }
    };
    let rt = delta_host::runtime();
    let telemetry = delta_host::init_logging("info", "delta-worker", &rt);
    let code = rt.block_on(async {
        let shutdown = delta_host::shutdown_on_signals();
        match crate::fleet::run(config, shutdown).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        }
    });
    drop(telemetry);
    code
}
