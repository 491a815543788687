//! `delta-worker`: the stateless fleet host of the engine. Configuration, logging, signals, run.

fn main() {
    std::process::exit(delta_worker::cli_main(std::env::args().skip(1).collect()));
}
