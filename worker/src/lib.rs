//! Delta Fleet's worker: the fleet host of the engine (`delta-engine`), and nothing else.
//!
//! - [`fleet`]: pull jobs from NATS, load each run, resume it through the engine (which reads
//!   its answers through the store's `AnswerStore` port), publish the questions it asks, ack;
//!   heartbeats, fencing, dead letters, exhausted jobs and an ordered shutdown.
//! - [`config`]: the `delta-worker` settings (flags and `DELTA_*` variables).
//! - [`workdir`]: each run's own work directory under `DELTA_WORK_DIR`, and their removal.
//!
//! The agent loop itself (agents, tools, brains, replay, answer checks) is `delta-engine`'s; the
//! worker only decides what a pause, a refusal or a fenced write means for the job it holds.

pub mod config;
pub mod fleet;
pub mod workdir;
