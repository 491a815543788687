//! An agent's `config.yaml`, parsed and checked as `Agent::load` does; for an accepted config,
//! every tool builds an invocation from arguments of its parameters' types.
#![no_main]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use delta_fuzz::assert_clear;
use delta_engine::agent::CheckedConfig;
use delta_engine::tools::{ParamType, ToolEnv};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fuzz_target!(|data: &[u8]| {
    // The product reads the file as UTF-8 and refuses anything else before parsing.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let checked = match CheckedConfig::parse(Path::new("config.yaml"), text, Path::new(".")) {
        Ok(c) => c,
        Err(e) => {
            assert_clear(&e);
            assert!(e.to_string().starts_with("config.yaml"), "{e}");
            return;
        }
    };
    let env = ToolEnv {
        work_dir: PathBuf::from("/work"),
        agent_home: PathBuf::from("/agent"),
        vars: vec![],
    };
    for tool in checked.tools.values() {
        let args: serde_json::Map<String, Value> = tool
            .params
            .iter()
            .map(|p| {
                let v = match p.kind {
                    ParamType::String => json!("it's a \"value\" $x"),
                    ParamType::Number => json!(1.5),
                    ParamType::Integer => json!(-2),
                    ParamType::Boolean => json!(true),
                };
                (p.name.clone(), v)
            })
            .collect();
        let args = Value::Object(args);
        let values: BTreeMap<String, String> = tool
            .check_args(&args)
            .expect("arguments of the declared types are accepted");
        let _ = tool.danger(&args);
        let _ = tool.needs_approval(&args);
        // A value that starts with `-` where the program would read it as an option is refused.
        match tool.invocation(&values, &env) {
            Ok(invocation) => {
                let _ = invocation.display();
            }
            Err(e) => assert_clear(&e),
        }
        if let Err(e) = tool.check_args(&json!([1])) {
            assert_clear(&e);
        }
    }
});
