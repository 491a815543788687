//! Per-run work directories (issue 14, finding 11).
//!
//! `DELTA_WORK_DIR` is a root: a run's tools run in `<root>/<run_id>`, created `0700` by the
//! worker before it advances the run (unless its agent never uses one: `Agent::needs_work_dir`),
//! so that two runs (on one worker or on several sharing a
//! root) do not see each other's files by relative path, and `${CWD}` / `CWD` name the run's own
//! directory. A run may move between workers, so each worker that advanced it holds a copy of
//! its directory under its own root (or shares one, when workers share a root).
//!
//! The name is the run id in its canonical form (`RunId`'s `Display`: hex digits and dashes), so
//! it cannot name anything outside the root; entries of the root that are not such a name are
//! never touched. [`sweep`] removes the directories of runs that no longer exist in the store (a
//! retention deleted them) or finished longer than the retention period ago, never one of a run
//! in progress, and without following symbolic links out of the root.
//!
//! This separates runs that behave; it is no sandbox: a tool runs as the worker's user and can
//! still open `../<other run>` or any absolute path that user can (docs/security.md).

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use delta_protocol::RunId;

/// The root of the run directories of this worker.
#[derive(Clone, Debug)]
pub struct WorkDirs {
    /// Absolute (canonical) path, so that `${CWD}` is absolute too.
    root: PathBuf,
}

impl WorkDirs {
    /// Opens `root`, creating it if missing; its path made absolute.
    pub fn open(root: &Path) -> io::Result<Self> {
        fs::create_dir_all(root)?;
        Ok(Self {
            root: fs::canonicalize(root)?,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<run_id>` (not created).
    pub fn path(&self, run_id: RunId) -> PathBuf {
        self.root.join(run_id.to_string())
    }

    /// Creates the run's directory (`0700`) if it is not there, and returns it. Something else in
    /// its place (a file, a symbolic link planted by a tool) is removed first, so the run never
    /// works in a place outside the root.
    pub fn create(&self, run_id: RunId) -> io::Result<PathBuf> {
        let dir = self.path(run_id);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {
                if m.permissions().mode() & 0o777 != 0o700 {
                    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700))?;
                }
                return Ok(dir);
            }
            Ok(_) => fs::remove_file(&dir)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => Ok(dir),
            // Another job of the same run (or a worker sharing the root) made it meanwhile.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(dir),
            Err(e) => Err(e),
        }
    }

    /// The runs that have an entry under the root (entries not named as a run id are left out).
    pub fn list(&self) -> io::Result<Vec<RunId>> {
        let mut runs = vec![];
        for entry in fs::read_dir(&self.root)? {
            let entry = entry?;
            if let Some(run_id) = entry.file_name().to_str().and_then(run_dir_name) {
                runs.push(run_id);
            }
        }
        Ok(runs)
    }

    /// Removes the run's directory and everything in it; symbolic links are removed, never
    /// followed (`remove_dir_all` does not follow them, and a link in the directory's own place is
    /// unlinked). Already gone is fine.
    pub fn remove(&self, run_id: RunId) -> io::Result<()> {
        let dir = self.path(run_id);
        let result = match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => fs::remove_dir_all(&dir),
            Ok(_) => fs::remove_file(&dir),
            Err(e) => Err(e),
        };
        match result {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// The run an entry of the root belongs to: its name must be a run id exactly as the worker
/// writes it (so `../x`, `x/..`, other spellings of a UUID and anything else are not ours).
pub fn run_dir_name(name: &str) -> Option<RunId> {
    let run_id: RunId = name.parse().ok()?;
    (run_id.to_string() == name).then_some(run_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_directory_is_made_private_and_only_canonical_names_are_runs() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dirs = WorkDirs::open(&tmp.path().join("root")).expect("open");
        let id = RunId::new();
        let dir = dirs.create(id).expect("create");
        assert_eq!(dir.parent(), Some(dirs.root()));
        assert!(dir.is_absolute());
        let mode = fs::metadata(&dir).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Idempotent.
        assert_eq!(dirs.create(id).expect("again"), dir);

        for bad in [
            "../x",
            "..",
            ".",
            "",
            "/etc",
            &format!("{id}/.."),
            &format!("../{id}"),
            &id.to_string().to_uppercase(),
            &id.as_uuid().simple().to_string(),
        ] {
            assert_eq!(run_dir_name(bad), None, "{bad}");
        }
        assert_eq!(run_dir_name(&id.to_string()), Some(id));
        fs::write(dirs.root().join("notes.txt"), "x").expect("write");
        assert_eq!(dirs.list().expect("list"), vec![id]);
    }

    #[test]
    fn removal_does_not_follow_symbolic_links_out_of_the_root() {
        let tmp = tempfile::tempdir().expect("tmp");
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        fs::write(outside.join("keep"), "x").expect("write");
        let dirs = WorkDirs::open(&tmp.path().join("root")).expect("open");

        let a = RunId::new();
        let dir = dirs.create(a).expect("create");
        std::os::unix::fs::symlink(&outside, dir.join("link")).expect("symlink");
        dirs.remove(a).expect("remove");
        assert!(!dir.exists());
        assert!(outside.join("keep").exists());

        // A link in a run directory's own place is unlinked, not followed, both ways.
        let b = RunId::new();
        std::os::unix::fs::symlink(&outside, dirs.path(b)).expect("symlink");
        dirs.remove(b).expect("remove");
        assert!(outside.join("keep").exists());
        std::os::unix::fs::symlink(&outside, dirs.path(b)).expect("symlink");
        let made = dirs.create(b).expect("create");
        assert!(fs::symlink_metadata(&made).expect("meta").is_dir());
        assert!(outside.join("keep").exists());
        dirs.remove(a).expect("already gone is fine");
    }
}
