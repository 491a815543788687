//! `delta-worker`: the stateless fleet host of the engine. Configuration, logging, signals, run.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        eprint!(
            "{}",
            delta_shared::settings::usage("delta-worker", delta_worker::config::SETTINGS)
        );
        return;
    }
    let env = std::env::vars().collect();
    let config = match delta_worker::config::parse(&args, &env) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            std::process::exit(64);
        }
    };
    let rt = delta_worker::host::runtime();
    let telemetry = delta_worker::host::init_logging("info", "delta-worker", &rt);
    let code = rt.block_on(async {
        let shutdown = delta_worker::host::shutdown_on_signals();
        match delta_worker::fleet::run(config, shutdown).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        }
    });
    drop(telemetry);
    std::process::exit(code);
}
