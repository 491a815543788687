//! The parts of the `delta` command that other crates exercise: the file mailbox's parsing
//! (`response.txt` / `response.json`), so that the fuzzers and property tests run the code
//! `delta run` runs. Everything else of the command lives in the binary (`main.rs`).

pub mod mailbox;
