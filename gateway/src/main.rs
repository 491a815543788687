//! `delta-gateway`: HTTP API, SSE, web inbox and bot bridge of the fleet.
//!
//! Not built yet (issue "The gateway"); until then this binary says so plainly.

fn main() {
    eprintln!(
        "delta-gateway {}: the gateway is not available yet.\n\
         Run agents locally with `delta run --agent <dir> --task \"...\"`.",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(64);
}
