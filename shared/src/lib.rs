//! Delta Fleet's shared contract: the protocol types (PROTOCOL.md), the journal, the run-store
//! port with its adapters, and the fleet's NATS queue.
//!
//! `protocol` and `journal` are pure data (no async, no I/O) so that every host (the local CLI,
//! the fleet worker, the gateway) and every fuzzer agree on one definition. `store` holds the one
//! port the engine writes through, and its adapters (Redis code lives there only). `queue` is
//! the only module that speaks NATS; workers and gateways both use it. `host` and `settings` are
//! what every binary's `main` does the same way.

pub mod host;
pub mod journal;
pub mod protocol;
pub mod queue;
pub mod secret;
pub mod settings;
pub mod store;
