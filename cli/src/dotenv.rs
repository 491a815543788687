//! Delta Engine's `.env` files, for `delta run`: the work directory's, the agent directory's and
//! the project's (the nearest directory above the current one holding `.git`), in that order.
//! The process's environment wins over them all, and an earlier file over a later one.
//!
//! Only the LLM's variables are taken from them (`DELTA_API_KEY`, `DELTA_BASE_URL`,
//! `OPENAI_API_KEY`, the agent's `llm.api_key_env`), and only for the brain: tools and hooks run
//! with a cleared environment either way. Any other variable in a file is named in a warning
//! (names only: a value is never printed).

use std::path::{Path, PathBuf};

/// What the `.env` files hold for the brain.
#[derive(Debug, Default)]
pub struct DotEnv {
    /// The variables taken, the first file's value of each.
    values: Vec<(String, String)>,
    /// What was found but not used, one line each.
    pub warnings: Vec<String>,
}

impl DotEnv {
    /// Reads the files for an agent whose LLM reads the variables `wanted`.
    pub fn load(work_dir: &Path, agent_dir: &Path, wanted: &[&str]) -> DotEnv {
        let mut files = vec![work_dir.join(".env"), agent_dir.join(".env")];
        if let Some(root) = std::env::current_dir().ok().and_then(|d| project_root(&d)) {
            files.push(root.join(".env"));
        }
        let mut seen: Vec<PathBuf> = vec![];
        let mut env = DotEnv::default();
        for file in files {
            let real = file.canonicalize().unwrap_or(file.clone());
            if seen.contains(&real) {
                continue;
            }
            seen.push(real);
            let Ok(text) = std::fs::read_to_string(&file) else {
                continue;
            };
            env.read(&file, &text, wanted);
        }
        env
    }

    fn read(&mut self, file: &Path, text: &str, wanted: &[&str]) {
        let mut ignored = vec![];
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let Some((key, value)) = line.split_once('=') else {
                self.warnings.push(format!(
                    "{} line {}: not KEY=VALUE: ignored",
                    file.display(),
                    n + 1
                ));
                continue;
            };
            let key = key.trim();
            if !wanted.contains(&key) {
                ignored.push(key.to_owned());
                continue;
            }
            if !self.values.iter().any(|(k, _)| k == key) {
                self.values.push((key.to_owned(), unquote(value.trim())));
            }
        }
        if !ignored.is_empty() {
            self.warnings.push(format!(
                "{}: only the LLM's variables are read from a .env file ({}); ignored: {}",
                file.display(),
                wanted.join(", "),
                ignored.join(", ")
            ));
        }
    }

    /// `name` from the environment, else from the files.
    pub fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().or_else(|| {
            self.values
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        })
    }
}

fn unquote(v: &str) -> String {
    for q in ['"', '\''] {
        if v.len() >= 2 && v.starts_with(q) && v.ends_with(q) {
            return v[1..v.len() - 1].to_owned();
        }
    }
    // An unquoted value ends at a comment.
    v.split(" #").next().unwrap_or(v).trim_end().to_owned()
}

fn project_root(start: &Path) -> Option<PathBuf> {
    start
        .ancestors()
        .find(|d| d.join(".git").exists())
        .map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_llms_variables_are_taken_and_the_others_named() {
        let mut env = DotEnv::default();
        env.read(
            Path::new("w/.env"),
            "# keys\nexport DELTA_API_KEY=\"sk-1\"\nDELTA_BASE_URL=http://x/v1 # local\nAWS_SECRET=s3cr3t\nbroken\n",
            &["DELTA_API_KEY", "DELTA_BASE_URL"],
        );
        env.read(
            Path::new("a/.env"),
            "DELTA_API_KEY=sk-2\n",
            &["DELTA_API_KEY", "DELTA_BASE_URL"],
        );
        let file = |n: &str| {
            env.values
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(file("DELTA_API_KEY").as_deref(), Some("sk-1"));
        assert_eq!(file("DELTA_BASE_URL").as_deref(), Some("http://x/v1"));
        assert_eq!(file("AWS_SECRET"), None);
        let w = env.warnings.join("\n");
        assert!(w.contains("w/.env line 5: not KEY=VALUE"), "{w}");
        assert!(w.contains("ignored: AWS_SECRET"), "{w}");
        assert!(!w.contains("s3cr3t") && !w.contains("sk-1"), "{w}");
    }
}
