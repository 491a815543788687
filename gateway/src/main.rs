//! `delta-gateway`: configuration, logging, signals, run.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        eprint!(
            "{}",
            delta_shared::settings::usage("delta-gateway", delta_gateway::config::SETTINGS)
        );
        return;
    }
    let env = std::env::vars().collect();
    let config = match delta_gateway::config::parse(&args, &env) {
        Ok(c) => c,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            std::process::exit(64);
        }
    };
    let rt = delta_shared::host::runtime();
    let telemetry = delta_shared::host::init_logging("info", "delta-gateway", &rt);
    let code = rt.block_on(async {
        let shutdown = delta_shared::host::shutdown_on_signals();
        let ready = |addr| eprintln!("delta-gateway listening on http://{addr}");
        match delta_gateway::run(config, shutdown, ready).await {
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
