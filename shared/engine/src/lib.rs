//! Delta Fleet's agent engine: everything that decides what a run does next, and nothing about
//! where it runs.
//!
//! - [`agent`]: loading and checking an agent directory (`agent.yaml`/`config.yaml`, imports,
//!   `script.yaml`, `hooks.yaml`, `context.yaml`).
//! - [`hooks`]: Delta Engine's lifecycle hooks, run as processes with its file protocol.
//! - [`context`]: Delta Engine's `context.yaml` composition, for the openai brain.
//! - [`files`]: bounded reads of files a tool or hook may have written (no FIFOs, devices,
//!   symlinks).
//! - [`tools`]: Delta Engine's tool forms, run as child processes with timeouts.
//! - [`brain`]: the scripted and the OpenAI-compatible brains.
//! - [`policy`], [`grants`]: `policy.yaml` rules and scoped grants, consulted before each tool
//!   call that may need approval.
//! - [`engine`]: the Thought-Action-Observation loop, resumable from its journal, and
//!   [`engine::check_answer`], the one check of an answer that the gateway and the engine share.
//!
//! The engine writes only through the `RunStore` port (`delta-store`) and never waits for a
//! person: the hosts (`delta run`, the fleet worker) decide what a pause means. It is a library of
//! its own so that every host, the gateway and the fuzzers use one definition.

pub mod agent;
pub mod brain;
pub mod context;
pub mod engine;
pub mod files;
pub mod grants;
pub mod hooks;
pub mod policy;
pub mod resume;
pub mod script;
pub mod tools;
