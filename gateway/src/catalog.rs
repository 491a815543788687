//! The agents a fleet runs, as the agent protocols show them: MCP's tools and A2A's skills
//! (docs/protocols.md). Read from the gateway's `DELTA_AGENTS_DIR`, the directory submissions
//! are checked against, so a protocol lists exactly the agents a submission may name.
//!
//! The directory is read at most every [`FRESH_FOR`] (the agent card and the tool list are open
//! to many callers: no caller makes the gateway parse every agent on each request), so an agent
//! added or changed on disk shows within that. An agent that does not load is left out of the
//! listing and named in a warning, once per error (`delta run` or the worker says why in full).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use crate::Gateway;
use crate::ops::valid_agent_name;

/// One agent of the catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentInfo {
    /// The agent's directory name: what a submission names (`agent`).
    pub name: String,
    /// Its `description`, or a sentence made from its name.
    pub description: String,
    /// Its `version`, when it says one.
    pub version: Option<String>,
}

/// Agents in a catalog at most: a directory with more lists the first ones by name.
pub const MAX_AGENTS: usize = 1000;

/// How long a reading of the agents directory is used before it is read again.
pub const FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(2);

type Readings = HashMap<PathBuf, (Instant, Arc<Vec<AgentInfo>>)>;

/// The last reading of each agents directory (one per gateway in practice).
static READINGS: LazyLock<Mutex<Readings>> = LazyLock::new(Mutex::default);

impl Gateway {
    /// The agents of this fleet, sorted by name.
    pub fn agents(&self) -> Vec<AgentInfo> {
        cached(&self.config.agents_dir).as_ref().clone()
    }

    /// One agent of the catalog, by the name a submission would use.
    pub fn agent(&self, name: &str) -> Option<AgentInfo> {
        if !valid_agent_name(name) {
            return None;
        }
        // One added since the last reading is loaded at once (one agent, on a miss only).
        cached(&self.config.agents_dir)
            .iter()
            .find(|a| a.name == name)
            .cloned()
            .or_else(|| load(&self.config.agents_dir, name))
    }
}

fn cached(dir: &Path) -> Arc<Vec<AgentInfo>> {
    let mut readings = READINGS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, agents)) = readings.get(dir)
        && at.elapsed() < FRESH_FOR
    {
        return agents.clone();
    }
    let agents = Arc::new(list(dir));
    readings.insert(dir.to_path_buf(), (Instant::now(), agents.clone()));
    agents
}

/// The agents in `dir`, sorted by name: each subdirectory with a valid agent name that loads.
pub fn list(dir: &Path) -> Vec<AgentInfo> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read the agents directory (DELTA_AGENTS_DIR)");
            return Vec::new();
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| valid_agent_name(n))
        .collect();
    names.sort();
    names.truncate(MAX_AGENTS);
    names.iter().filter_map(|n| load(dir, n)).collect()
}

fn load(dir: &Path, name: &str) -> Option<AgentInfo> {
    let path = dir.join(name);
    if !path.is_dir() {
        return None;
    }
    match delta_engine::agent::Agent::load(&path) {
        Ok(agent) => Some(AgentInfo {
            name: name.to_owned(),
            description: agent
                .config
                .description
                .filter(|d| !d.trim().is_empty())
                .unwrap_or_else(|| format!("Runs the agent `{name}` on a task.")),
            version: agent.config.version,
        }),
        Err(e) => {
            static WARNED: LazyLock<Mutex<HashSet<(String, String)>>> =
                LazyLock::new(Mutex::default);
            let why = delta_host::Chain(&e).to_string();
            let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
            if warned.len() < 10_000 && warned.insert((name.to_owned(), why.clone())) {
                tracing::warn!(agent = name, error = %why, "agent left out of the catalog: it does not load");
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_the_agents_that_load_sorted_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let agent = |name: &str, config: &str| {
            let d = dir.path().join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("config.yaml"), config).unwrap();
            std::fs::write(d.join("script.yaml"), "steps:\n  - finish: done\n").unwrap();
        };
        agent(
            "zeta",
            "name: zeta\nbrain: scripted\ndescription: Last one.\nversion: 2.0.0\n",
        );
        agent("alpha", "name: alpha\nbrain: scripted\n");
        agent("broken", "name: [\n");
        agent("not a name", "name: x\nbrain: scripted\n");
        std::fs::write(dir.path().join("file.yaml"), "name: file\n").unwrap();
        let listed = list(dir.path());
        assert_eq!(
            listed,
            vec![
                AgentInfo {
                    name: "alpha".into(),
                    description: "Runs the agent `alpha` on a task.".into(),
                    version: None,
                },
                AgentInfo {
                    name: "zeta".into(),
                    description: "Last one.".into(),
                    version: Some("2.0.0".into()),
                },
            ]
        );
        assert!(list(&dir.path().join("missing")).is_empty());
    }
}
