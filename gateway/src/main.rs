//! `delta-gateway`: configuration, logging, signals, run.

fn main() {
    std::process::exit(delta_gateway::cli_main(std::env::args().skip(1).collect()));
}
