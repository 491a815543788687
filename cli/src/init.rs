//! `delta init <name> [-t template]`: a new agent directory from one of this project's example
//! agents (`examples/agents/*`, built into the binary), as Delta Engine's `delta init` does with
//! its templates. The config is written as `agent.yaml` (Delta Engine v1.9+'s name) with `name:`
//! set to the directory's name.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// One file of a template: its name, its text, and whether it is a program.
type File = (&'static str, &'static str, bool);

macro_rules! file {
    ($agent:literal, $name:literal, $exec:literal) => {
        (
            $name,
            include_str!(concat!("../../examples/agents/", $agent, "/", $name)),
            $exec,
        )
    };
}

/// The templates, by name, with what each shows.
const TEMPLATES: &[(&str, &str, &[File])] = &[
    (
        "hello",
        "scripted: a tool call, a free-text question, finish (no LLM needed)",
        &[
            file!("hello", "config.yaml", false),
            file!("hello", "script.yaml", false),
        ],
    ),
    (
        "chooser",
        "scripted: a question with options and a branch on the answer",
        &[
            file!("chooser", "config.yaml", false),
            file!("chooser", "script.yaml", false),
        ],
    ),
    (
        "intake",
        "scripted: a typed answer (a form) used by the next tool",
        &[
            file!("intake", "config.yaml", false),
            file!("intake", "script.yaml", false),
        ],
    ),
    (
        "deployer",
        "scripted: a plan to confirm, a secret, a choice and an approval",
        &[
            file!("deployer", "config.yaml", false),
            file!("deployer", "script.yaml", false),
            file!("deployer", "check_key.sh", true),
            file!("deployer", "deploy.sh", true),
        ],
    ),
    (
        "openai-tools",
        "an LLM agent (OpenAI-compatible endpoint) with two tools and ask_human",
        &[
            file!("openai-tools", "config.yaml", false),
            file!("openai-tools", "system_prompt.md", false),
        ],
    ),
];

pub const DEFAULT_TEMPLATE: &str = "hello";

/// The options of `delta init`.
#[derive(Debug, Clone, clap::Args)]
pub struct InitArgs {
    /// The agent directory to create (its last part becomes the agent's `name`).
    pub name: PathBuf,
    /// The template: hello (default), chooser, intake, deployer, openai-tools.
    #[arg(short, long, default_value = DEFAULT_TEMPLATE)]
    pub template: String,
    /// Ask nothing (accepted for Delta Engine's `delta init -y`; this command never asks).
    #[arg(short = 'y', long = "yes")]
    pub yes: bool,
}

/// Runs `delta init`; returns the exit code (0 created, 2 refused).
pub fn run(args: InitArgs) -> i32 {
    match create(&args.name, &args.template) {
        Ok(files) => {
            eprintln!(
                "created agent `{}` from template `{}` in {}:",
                agent_name(&args.name).unwrap_or_default(),
                args.template,
                args.name.display()
            );
            for f in files {
                eprintln!("  {f}");
            }
            eprintln!(
                "try it: delta run --agent {} -m \"<what to do>\"",
                args.name.display()
            );
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
    }
}

fn agent_name(dir: &Path) -> Option<String> {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| {
            !n.is_empty()
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
}

/// Writes the template's files into `dir`; returns their names.
pub fn create(dir: &Path, template: &str) -> Result<Vec<String>, String> {
    let Some((_, _, files)) = TEMPLATES.iter().find(|(n, _, _)| *n == template) else {
        let known: Vec<String> = TEMPLATES
            .iter()
            .map(|(n, what, _)| format!("  {n}: {what}"))
            .collect();
        return Err(format!(
            "no template `{template}`; the templates:\n{}",
            known.join("\n")
        ));
    };
    let name = agent_name(dir).ok_or_else(|| {
        format!(
            "`{}`: an agent's directory name is its name: use letters, digits, `-` and `_`",
            dir.display()
        )
    })?;
    if dir.exists() {
        let empty = std::fs::read_dir(dir)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if !empty {
            return Err(format!(
                "{} already exists and is not empty: choose another name",
                dir.display()
            ));
        }
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("{}: cannot create it ({e})", dir.display()))?;
    let mut written = vec![];
    for (file, text, exec) in files.iter() {
        let (target, text) = if *file == "config.yaml" {
            ("agent.yaml", rename(text, &name))
        } else {
            (*file, (*text).to_owned())
        };
        let path = dir.join(target);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        if *exec {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        written.push(target.to_owned());
    }
    Ok(written)
}

/// The config with its top-level `name:` set to `name`.
fn rename(config: &str, name: &str) -> String {
    let mut done = false;
    config
        .lines()
        .map(|l| {
            if !done && l.starts_with("name:") {
                done = true;
                format!("name: {name}")
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_makes_an_agent_that_loads() {
        let root = tempfile::tempdir().expect("tempdir");
        for (template, _, _) in TEMPLATES {
            let dir = root.path().join(format!("my-{template}"));
            create(&dir, template).expect("created");
            let agent = delta_engine::agent::Agent::load(&dir)
                .unwrap_or_else(|e| panic!("{template}: {e}"));
            assert_eq!(agent.name(), format!("my-{template}"));
            assert!(agent.config_path.ends_with("agent.yaml"));
        }
        let err = create(&root.path().join("my-hello"), "hello").unwrap_err();
        assert!(err.contains("not empty"), "{err}");
        let err = create(&root.path().join("x"), "nope").unwrap_err();
        assert!(
            err.contains("no template `nope`") && err.contains("openai-tools"),
            "{err}"
        );
    }
}
