//! `delta-worker`: the stateless fleet host of the engine. Configuration, logging, signals, run.

/// mimalloc: under load, glibc malloc took about a quarter of a worker's CPU (perf).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(delta_worker::cli_main(std::env::args().skip(1).collect()));
}
