//! `delta-worker`: the fleet host of the engine (NATS JetStream + Redis).
//!
//! The fleet consumer is not built yet (issue "The fleet worker"); until then this binary says so
//! plainly instead of pretending to work.

fn main() {
    eprintln!(
        "delta-worker {}: the fleet worker (NATS JetStream + Redis) is not available yet.\n\
         Run agents locally with `delta run --agent <dir> --task \"...\"`.",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(64);
}
