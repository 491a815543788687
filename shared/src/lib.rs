//! Delta Fleet's shared contract: the protocol types (PROTOCOL.md), the journal, and the run-store
//! port with its adapters.
//!
//! `protocol` and `journal` are pure data (no async, no I/O) so that every host (the local CLI,
//! the fleet worker, the gateway) and every fuzzer agree on one definition. `store` holds the one
//! port the engine writes through, and its adapters.

pub mod journal;
pub mod protocol;
pub mod secret;
pub mod store;
