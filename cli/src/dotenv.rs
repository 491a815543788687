//! Delta Engine's `.env` files, for `delta run`: the work directory's, the agent directory's and
//! the project's (the nearest directory above the current one holding `.git`), in that order.
//! The process's environment wins over them all, and an earlier file over a later one.
//!
//! Only the LLM's variables are taken from them (`DELTA_API_KEY`, `DELTA_BASE_URL`,
//! `OPENAI_API_KEY`, the agent's `llm.api_key_env`), and only for the brain: tools and hooks run
//! with a cleared environment either way. Any other variable in a file is named in a warning
//! (names only: a value is never printed).
//!
//! The endpoint is where the key goes, so it is guarded:
//! - `DELTA_BASE_URL` is never taken from the work directory's `.env`: tools write that
//!   directory, and one could point the LLM (and the key) elsewhere. Only the agent directory's
//!   and the project's files, which the user writes, may name it.
//! - An endpoint from a file goes only with a key from the same file, never with a key from the
//!   environment or another file ([`DotEnv::get`]).
//!
//! Files are read bounded, as regular files only (no FIFO, device or symlink).

use std::path::{Path, PathBuf};

/// What the `.env` files hold for the brain.
#[derive(Debug, Default)]
pub struct DotEnv {
    /// The variables taken, the first file's value of each, with that file.
    values: Vec<(String, String, PathBuf)>,
    /// Whether the agent names its own `llm.base_url` (then `DELTA_BASE_URL` is not its
    /// endpoint, and does not tie the keys to its file).
    own_endpoint: bool,
    /// What was found but not used, one line each.
    pub warnings: Vec<String>,
}

impl DotEnv {
    /// Reads the files for an agent whose LLM reads the variables `wanted`; `own_endpoint`: the
    /// agent's `llm.base_url` is set.
    pub fn load(work_dir: &Path, agent_dir: &Path, wanted: &[&str], own_endpoint: bool) -> DotEnv {
        let mut files = vec![work_dir.join(".env"), agent_dir.join(".env")];
        if let Some(root) = std::env::current_dir().ok().and_then(|d| project_root(&d)) {
            files.push(root.join(".env"));
        }
        let mut seen: Vec<PathBuf> = vec![];
        let mut env = DotEnv {
            own_endpoint,
            ..DotEnv::default()
        };
        for (i, file) in files.iter().enumerate() {
            let real = file.canonicalize().unwrap_or(file.clone());
            if seen.contains(&real) {
                continue;
            }
            seen.push(real);
            let text = match delta_engine::files::read_text(file, MAX_DOTENV_BYTES) {
                Ok(text) => text,
                Err(delta_engine::files::Error::Missing(_)) => continue,
                Err(e) => {
                    env.warnings.push(format!("{e}: not read"));
                    continue;
                }
            };
            // Also when it is the project's too (`delta run` in the project root): tools write it.
            let tool_writable = i == 0;
            let wanted: Vec<&str> = wanted
                .iter()
                .copied()
                .filter(|w| !(tool_writable && *w == DELTA_BASE_URL))
                .collect();
            if tool_writable && mentions(&text, DELTA_BASE_URL) {
                env.warnings.push(format!(
                    "{}: DELTA_BASE_URL is not read from the work directory's .env (tools write \
                     that directory); set it in the agent directory's .env or the environment",
                    file.display()
                ));
            }
            env.read(file, &text, &wanted);
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
            if !self.values.iter().any(|(k, _, _)| k == key) {
                self.values
                    .push((key.to_owned(), unquote(value.trim()), file.to_path_buf()));
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

    /// `name` from the environment, else from the files — except that when the endpoint
    /// (`DELTA_BASE_URL`) comes from a file, a key comes only from that same file.
    pub fn get(&self, name: &str) -> Option<String> {
        self.lookup(name).map(|(v, _)| v)
    }

    /// [`DotEnv::get`], and where the value came from (`None`: the environment).
    pub fn lookup(&self, name: &str) -> Option<(String, Option<PathBuf>)> {
        let from_file = |n: &str| {
            self.values
                .iter()
                .find(|(k, _, _)| k == n)
                .map(|(_, v, f)| (v.clone(), Some(f.clone())))
        };
        if name != DELTA_BASE_URL
            && !self.own_endpoint
            && let Some((_, Some(endpoint_file))) = self.lookup(DELTA_BASE_URL)
        {
            // Never an endpoint from a file with a key from elsewhere.
            return self
                .values
                .iter()
                .find(|(k, _, f)| k == name && *f == endpoint_file)
                .map(|(_, v, f)| (v.clone(), Some(f.clone())));
        }
        std::env::var(name)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| (v, None))
            .or_else(|| from_file(name))
    }
}

const DELTA_BASE_URL: &str = "DELTA_BASE_URL";
/// The largest `.env` read.
const MAX_DOTENV_BYTES: u64 = 256 * 1024;

/// Whether `text` sets `name` (to say so in a warning).
fn mentions(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim();
        let l = l.strip_prefix("export ").unwrap_or(l);
        l.split_once('=').is_some_and(|(k, _)| k.trim() == name)
    })
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
                .find(|(k, _, _)| k == n)
                .map(|(_, v, _)| v.clone())
        };
        assert_eq!(file("DELTA_API_KEY").as_deref(), Some("sk-1"));
        assert_eq!(file("DELTA_BASE_URL").as_deref(), Some("http://x/v1"));
        assert_eq!(file("AWS_SECRET"), None);
        let w = env.warnings.join("\n");
        assert!(w.contains("w/.env line 5: not KEY=VALUE"), "{w}");
        assert!(w.contains("ignored: AWS_SECRET"), "{w}");
        assert!(!w.contains("s3cr3t") && !w.contains("sk-1"), "{w}");
    }

    #[test]
    fn the_work_directorys_env_never_names_the_endpoint() {
        let work = tempfile::tempdir().expect("tempdir");
        let agent = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            work.path().join(".env"),
            "DELTA_BASE_URL=https://evil.example/v1\n",
        )
        .expect("write");
        let wanted = ["DELTA_API_KEY", "DELTA_BASE_URL", "OPENAI_API_KEY"];
        let env = DotEnv::load(work.path(), agent.path(), &wanted, false);
        assert!(
            env.values.iter().all(|(k, _, _)| k != "DELTA_BASE_URL"),
            "{:?}",
            env.values
        );
        let w = env.warnings.join("\n");
        assert!(
            w.contains("DELTA_BASE_URL is not read from the work directory"),
            "{w}"
        );
    }

    #[test]
    fn an_endpoint_from_a_file_goes_only_with_that_files_key() {
        let mut env = DotEnv::default();
        env.read(
            Path::new("a/.env"),
            "DELTA_BASE_URL=https://x.example/v1\n",
            &["DELTA_API_KEY", "DELTA_BASE_URL", "DEFIX_UNSET_KEY"],
        );
        env.read(
            Path::new("p/.env"),
            "DEFIX_UNSET_KEY=sk-project\n",
            &["DELTA_API_KEY", "DELTA_BASE_URL", "DEFIX_UNSET_KEY"],
        );
        // PATH is surely in the environment: as a "key" it must not be taken from there.
        assert_eq!(env.get("PATH"), None);
        assert_eq!(env.get("DEFIX_UNSET_KEY"), None);
        env.read(
            Path::new("a/.env"),
            "DEFIX_UNSET_KEY=sk-agent\n",
            &["DEFIX_UNSET_KEY"],
        );
        assert_eq!(env.get("DEFIX_UNSET_KEY"), None, "a later file's key");
        let mut env = DotEnv::default();
        env.read(
            Path::new("a/.env"),
            "DELTA_BASE_URL=https://x.example/v1\nDEFIX_UNSET_KEY=sk-agent\n",
            &["DELTA_BASE_URL", "DEFIX_UNSET_KEY"],
        );
        assert_eq!(env.get("DEFIX_UNSET_KEY").as_deref(), Some("sk-agent"));
        // The agent's own endpoint: DELTA_BASE_URL's file ties nothing.
        env.own_endpoint = true;
        assert!(env.get("PATH").is_some());
    }
}
