//! `delta-worker`: the stateless fleet host of the engine. Configuration, logging, signals, run
//! (see `delta_host::program_main`).

/// mimalloc: under load, glibc malloc took about a quarter of a worker's CPU (perf).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use delta_worker::{config, fleet};

fn main() {
    let args = std::env::args().skip(1).collect();
    std::process::exit(delta_host::program_main(
        "delta-worker",
        config::SETTINGS,
        args,
        config::parse,
        fleet::run,
    ));
}
