//! `delta-gateway`: configuration, logging, signals, run (see `delta_host::program_main`).

/// mimalloc: under load, glibc malloc took about a quarter of a worker's CPU (perf).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use delta_gateway::config;

fn main() {
    let args = std::env::args().skip(1).collect();
    std::process::exit(delta_host::program_main(
        "delta-gateway",
        config::SETTINGS,
        args,
        config::parse,
        |config, shutdown| {
            let scheme = if config.tls.is_some() {
                "https"
            } else {
                "http"
            };
            let ready = move |addr| eprintln!("delta-gateway listening on {scheme}://{addr}");
            delta_gateway::run(config, shutdown, ready)
        },
    ));
}
