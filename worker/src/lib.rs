//! Delta Fleet's agent engine and its fleet host.
//!
//! - [`agent`]: loading and checking an agent directory (`config.yaml`, `script.yaml`).
//! - [`tools`]: Delta Engine's tool forms, run as child processes with timeouts.
//! - [`brain`]: the scripted and the OpenAI-compatible brains.
//! - [`engine`]: the Thought-Action-Observation loop, resumable from its journal.
//!
//! The engine writes only through the `RunStore` port and never waits for a person: the hosts
//! (`delta run`, the fleet worker) decide what a pause means.

pub mod config;
pub mod fleet;
