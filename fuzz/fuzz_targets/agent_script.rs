//! A scripted agent's `script.yaml`, parsed and checked against the deployer example's tools as
//! `Agent::load` does.
#![no_main]

use std::path::Path;

use delta_fuzz::{assert_clear, deployer_tools};
use delta_engine::script::Script;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Script::parse(Path::new("script.yaml"), text, deployer_tools()) {
        Ok(script) => {
            // What the product accepted is the same script when parsed again.
            let again = Script::parse(Path::new("script.yaml"), text, deployer_tools())
                .expect("parses twice");
            assert_eq!(again, script);
        }
        Err(e) => {
            assert_clear(&e);
            assert!(e.to_string().starts_with("script.yaml"), "{e}");
        }
    }
});
