//! The local run store: Delta Engine v1.2's `.delta/` layout (docs/protocol.md §7).
//!
//! ```text
//! .delta/runs/<RUN_ID>/execution/metadata.json   run record, replaced by write-temp-then-rename
//! .delta/runs/<RUN_ID>/execution/journal.jsonl   one event per line, appended and fsynced
//! .delta/runs/LATEST                              the latest run id (a LATEST symlink is read too)
//! ```
//!
//! Crash safety: the journal is written first and is the truth. A crash mid-append leaves at most
//! a torn last line, which was never acknowledged and is cut off on load; a crash between the
//! journal and the metadata leaves a record that disagrees with the journal, and `load` mends the
//! record from the journal. The store does plain blocking file I/O: it serves one run of one
//! local process, where each write is a few hundred bytes.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::fcntl::{Flock, FlockArg};

use super::{Error, RunRecord, RunStore, StatusChange, StoredRun, numbered};
use delta_protocol::journal::{self, Replay};
use delta_protocol::{Event, JournalEvent, RunId, RunStatus, Timestamp};

/// Runs under one `.delta/` directory.
pub struct FileRunStore {
    /// The `.delta` directory itself.
    root: PathBuf,
    /// The last seq and record of every run this process loaded or created, so that an append
    /// neither re-reads the journal nor writes a record older than the one on disk.
    cache: Mutex<HashMap<RunId, (RunRecord, u64)>>,
}

/// An exclusive hold on one run: while it lives no other `delta run` can work on the run.
#[derive(Debug)]
pub struct RunLock {
    _flock: Flock<File>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.display().to_string(),
        source,
    }
}

impl FileRunStore {
    /// A store rooted at `delta_dir` (usually `<work dir>/.delta`); nothing is created yet.
    pub fn new(delta_dir: impl Into<PathBuf>) -> Self {
        Self {
            root: delta_dir.into(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `.delta/runs/<RUN_ID>/execution`
    pub fn execution_dir(&self, run_id: RunId) -> PathBuf {
        self.root
            .join("runs")
            .join(run_id.to_string())
            .join("execution")
    }

    fn journal_path(&self, run_id: RunId) -> PathBuf {
        self.execution_dir(run_id).join("journal.jsonl")
    }

    fn metadata_path(&self, run_id: RunId) -> PathBuf {
        self.execution_dir(run_id).join("metadata.json")
    }

    /// The run named by `.delta/runs/LATEST` (a file holding the id, or a symlink to the run's
    /// directory), if there is one.
    pub fn latest(&self) -> Result<Option<RunId>, Error> {
        let path = self.root.join("runs").join("LATEST");
        let text = match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(&path)(e)),
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&path).map_err(io(&path))?;
                target
                    .components()
                    .filter_map(|c| c.as_os_str().to_str())
                    .find(|c| c.parse::<RunId>().is_ok())
                    .unwrap_or_default()
                    .to_owned()
            }
            Ok(_) => fs::read_to_string(&path).map_err(io(&path))?,
        };
        let id = text.trim();
        id.parse().map(Some).map_err(|_| Error::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("`{id}` is not a run id; delete the file to start afresh"),
            ),
        })
    }

    /// Points `.delta/runs/LATEST` at `run_id` (atomically).
    pub fn set_latest(&self, run_id: RunId) -> Result<(), Error> {
        let runs = self.root.join("runs");
        let path = runs.join("LATEST");
        if fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            fs::remove_file(&path).map_err(io(&path))?;
        }
        write_atomically(&path, format!("{run_id}\n").as_bytes())
    }

    /// Takes the run's lock, or says that another process holds it.
    pub fn lock(&self, run_id: RunId) -> Result<RunLock, Error> {
        let dir = self.execution_dir(run_id);
        fs::create_dir_all(&dir).map_err(io(&dir))?;
        let path = dir.join(".lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        let flock = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
            Error::Locked {
                run_id,
                detail: format!("another `delta run` holds {} ({errno})", path.display()),
            }
        })?;
        Ok(RunLock { _flock: flock })
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, (RunRecord, u64)>> {
        // A panic while holding this lock leaves plain data behind: keep using it.
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn load_sync(&self, run_id: RunId) -> Result<StoredRun, Error> {
        let meta_path = self.metadata_path(run_id);
        let meta = match fs::read(&meta_path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(run_id));
            }
            other => other.map_err(io(&meta_path))?,
        };
        let mut record: RunRecord =
            serde_json::from_slice(&meta).map_err(|source| Error::Record {
                path: meta_path.display().to_string(),
                source,
            })?;
        let jpath = self.journal_path(run_id);
        let text = match fs::read_to_string(&jpath) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            other => other.map_err(io(&jpath))?,
        };
        let parsed = journal::parse_jsonl(&text)?;
        if let Some(cut) = parsed.torn_tail_at {
            tracing::warn!(path = %jpath.display(), bytes = text.len() - cut,
                "cutting off a torn last journal line left by a crash");
            let f = OpenOptions::new()
                .write(true)
                .open(&jpath)
                .map_err(io(&jpath))?;
            f.set_len(cut as u64).map_err(io(&jpath))?;
            f.sync_all().map_err(io(&jpath))?;
        } else if !text.is_empty() && !text.ends_with('\n') {
            let mut f = OpenOptions::new()
                .append(true)
                .open(&jpath)
                .map_err(io(&jpath))?;
            f.write_all(b"\n")
                .and_then(|_| f.sync_all())
                .map_err(io(&jpath))?;
        }
        // The journal is the truth: mend a record that a crash left behind it.
        let replay = Replay::new(&parsed.events);
        if let Some(status) = replay.implied_status() {
            let pending = (status == RunStatus::WaitingForInput)
                .then(|| replay.pending().map(|r| r.request_id))
                .flatten();
            if record.status != status || record.pending_request_id != pending {
                record.status = status;
                record.pending_request_id = pending;
                if let Some(end) = replay.terminal() {
                    record.result.clone_from(&end.result);
                    record.error.clone_from(&end.error);
                }
                write_atomically(&meta_path, &record_bytes(&record))?;
            }
        }
        let last = parsed.events.last().map_or(0, |e| e.seq);
        self.cached().insert(run_id, (record.clone(), last));
        Ok(StoredRun::whole(record, parsed.events))
    }

    fn append_sync(
        &self,
        run_id: RunId,
        events: Vec<Event>,
        change: Option<StatusChange>,
    ) -> Result<Vec<JournalEvent>, Error> {
        let cached = self.cached().get(&run_id).cloned();
        let (mut record, last) = match cached {
            Some(c) => c,
            None => {
                let run = self.load_sync(run_id)?;
                let last = run.journal.last().map_or(0, |e| e.seq);
                (run.record, last)
            }
        };
        if record.status.is_terminal() {
            return Err(Error::Terminal {
                run_id,
                status: record.status,
            });
        }
        let now = Timestamp::now();
        let stored = numbered(events, last + 1, now);
        if !stored.is_empty() {
            let text: String = stored.iter().map(journal::to_line).collect();
            let jpath = self.journal_path(run_id);
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&jpath)
                .map_err(io(&jpath))?;
            f.write_all(text.as_bytes())
                .and_then(|_| f.sync_data())
                .map_err(io(&jpath))?;
        }
        record.updated_at = now;
        if let Some(change) = &change {
            change.apply_to(&mut record, now);
        }
        write_atomically(&self.metadata_path(run_id), &record_bytes(&record))?;
        let new_last = stored.last().map_or(last, |e| e.seq);
        self.cached().insert(run_id, (record, new_last));
        Ok(stored)
    }
}

fn record_bytes(record: &RunRecord) -> Vec<u8> {
    let mut v = serde_json::to_vec_pretty(record).unwrap_or_default();
    v.push(b'\n');
    v
}

/// Writes `path` so that a crash leaves either the old or the new content: temp file, fsync,
/// rename, fsync of the directory.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io(dir))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(io(&tmp))?;
    fs::rename(&tmp, path).map_err(io(path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    Ok(())
}

impl RunStore for FileRunStore {
    async fn create(&self, record: RunRecord) -> Result<(), Error> {
        let path = self.metadata_path(record.run_id);
        if path.exists() {
            return Err(Error::AlreadyExists(record.run_id));
        }
        write_atomically(&path, &record_bytes(&record))?;
        self.cached().insert(record.run_id, (record, 0));
        Ok(())
    }

    async fn load(&self, run_id: RunId) -> Result<StoredRun, Error> {
        self.load_sync(run_id)
    }

    async fn append(
        &self,
        run_id: RunId,
        events: Vec<Event>,
        change: Option<StatusChange>,
    ) -> Result<Vec<JournalEvent>, Error> {
        self.append_sync(run_id, events, change)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use delta_protocol::{MessageLevel, SystemMessage};

    fn msg() -> Event {
        Event::SystemMessage(SystemMessage {
            level: MessageLevel::Info,
            content: "x".into(),
        })
    }

    #[tokio::test]
    async fn file_store_passes_the_contract() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileRunStore::new(dir.path().join(".delta"));
        super::super::contract::run_all(&store).await;
    }

    #[tokio::test]
    async fn a_torn_last_line_is_cut_off_and_a_stale_record_mended() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileRunStore::new(dir.path().join(".delta"));
        let run = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
        let id = run.run_id;
        store.create(run).await.expect("create");
        store
            .append(id, vec![msg(), msg()], None)
            .await
            .expect("append");
        let jpath = store.journal_path(id);
        let mut f = OpenOptions::new().append(true).open(&jpath).expect("open");
        f.write_all(b"{\"seq\":3,\"timesta").expect("write");
        drop(f);

        let fresh = FileRunStore::new(dir.path().join(".delta"));
        let loaded = fresh.load(id).await.expect("torn tail is repaired");
        assert_eq!(loaded.journal.len(), 2);
        let appended = fresh
            .append(id, vec![msg()], None)
            .await
            .expect("append after repair");
        assert_eq!(appended[0].seq, 3);
        let again = FileRunStore::new(dir.path().join(".delta"))
            .load(id)
            .await
            .expect("clean");
        assert_eq!(again.journal.len(), 3);
    }

    /// A crash between the journal and the metadata: the journal ends paused (or finished) and
    /// `metadata.json` still says running. `load` mends the record from the journal, on disk too.
    #[tokio::test]
    async fn a_record_left_behind_its_journal_by_a_crash_is_mended() {
        use delta_protocol::{EngineEnd, EngineStart, InteractionRequest, InteractionType};
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join(".delta");
        let store = FileRunStore::new(root.clone());
        let stale = |id: RunId| {
            let record: RunRecord =
                serde_json::from_slice(&fs::read(store.metadata_path(id)).expect("metadata.json"))
                    .expect("a record");
            record
        };
        let start = |id: RunId| {
            Event::EngineStart(EngineStart {
                run_id: id,
                agent: "a".into(),
                task: "t".into(),
                worker: "w".into(),
                attempt: 1,
            })
        };
        let end = |status, result: Option<&str>| {
            Event::EngineEnd(EngineEnd {
                status,
                result: result.map(str::to_owned),
                error: None,
            })
        };

        // Paused: the question asked and the pause journaled, the record not written.
        let run = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
        let paused = run.run_id;
        store.create(run).await.expect("create");
        let q = InteractionRequest::new(paused, "a", InteractionType::UserInput, "Go?");
        let events = vec![
            start(paused),
            Event::HumanInputRequest(Box::new(q.clone())),
            end(RunStatus::WaitingForInput, None),
        ];
        store.append(paused, events, None).await.expect("append");
        assert_eq!(stale(paused).status, RunStatus::Running, "left behind");

        // Finished: the end journaled with its result, the record not written.
        let run = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
        let done = run.run_id;
        store.create(run).await.expect("create");
        let events = vec![start(done), end(RunStatus::Completed, Some("42"))];
        store.append(done, events, None).await.expect("append");
        assert_eq!(stale(done).status, RunStatus::Running, "left behind");

        let fresh = FileRunStore::new(root.clone());
        let loaded = fresh.load(paused).await.expect("load").record;
        assert_eq!(loaded.status, RunStatus::WaitingForInput);
        assert_eq!(loaded.pending_request_id, Some(q.request_id));
        let loaded = fresh.load(done).await.expect("load").record;
        assert_eq!(
            (loaded.status, loaded.result.as_deref()),
            (RunStatus::Completed, Some("42"))
        );
        // Mended on disk, not only in what `load` returned.
        assert_eq!(stale(paused).status, RunStatus::WaitingForInput);
        assert_eq!(stale(paused).pending_request_id, Some(q.request_id));
        assert_eq!(stale(done).status, RunStatus::Completed);
        assert_eq!(stale(done).result.as_deref(), Some("42"));
    }

    #[tokio::test]
    async fn a_corrupt_middle_line_is_an_error_with_its_number() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileRunStore::new(dir.path().join(".delta"));
        let run = RunRecord::new(RunId::new(), "a", "t", RunStatus::Running);
        let id = run.run_id;
        store.create(run).await.expect("create");
        store.append(id, vec![msg()], None).await.expect("append");
        let jpath = store.journal_path(id);
        let text = fs::read_to_string(&jpath).expect("read");
        fs::write(&jpath, format!("{text}garbage\n{text}")).expect("write");
        let err = FileRunStore::new(dir.path().join(".delta"))
            .load(id)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Journal(journal::Error::Corrupt { line: 2, .. })),
            "{err}"
        );
    }

    #[test]
    fn latest_reads_files_and_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileRunStore::new(dir.path().join(".delta"));
        assert_eq!(store.latest().expect("none"), None);
        let id = RunId::new();
        store.set_latest(id).expect("set");
        assert_eq!(store.latest().expect("file"), Some(id));
        let link = dir.path().join(".delta/runs/LATEST");
        fs::remove_file(&link).expect("rm");
        std::os::unix::fs::symlink(format!("{id}"), &link).expect("symlink");
        assert_eq!(store.latest().expect("symlink"), Some(id));
        store.set_latest(id).expect("replaces the symlink");
        assert!(
            !fs::symlink_metadata(&link)
                .expect("meta")
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn a_second_lock_on_a_run_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = FileRunStore::new(dir.path().join(".delta"));
        let id = RunId::new();
        let held = store.lock(id).expect("first lock");
        assert!(matches!(store.lock(id), Err(Error::Locked { .. })));
        drop(held);
        store.lock(id).expect("free again");
    }
}
