//! Bounded reads of files that a tool, a hook or a generator may have written (or replaced).
//!
//! A size check before reading bounds nothing: a FIFO blocks the reader forever, `/dev/zero` and
//! `/proc` files report a size of 0 and never end, and a symlink reads whatever it points at. So
//! a file is opened with `O_NOFOLLOW | O_NONBLOCK` (a symlink as the last component fails, a FIFO
//! opens without waiting for a writer), must be a regular file by `fstat` of the open handle, and
//! is read through `take(max + 1)`: one byte over the limit refuses it.
//!
//! Paths that a tool can write (the work directory) are canonicalized first and must stay inside
//! the work directory ([`inside`]), which takes care of symlinks in the middle of the path.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: not found")]
    Missing(PathBuf),
    #[error("{0}: is a symbolic link (not followed)")]
    Symlink(PathBuf),
    #[error("{0}: not a regular file (a FIFO, device or directory is never read)")]
    NotRegular(PathBuf),
    #[error("{path}: more than the {max} bytes read")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("{path}: resolves to {real}, outside {within}")]
    Outside {
        path: PathBuf,
        real: PathBuf,
        within: PathBuf,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Reads at most `max` bytes of the regular file `path` (never through a symlink as its last
/// component, never a FIFO or device). Blocking: call it off the async runtime.
pub fn read_limited(path: &Path, max: u64) -> Result<Vec<u8>, Error> {
    let io = |source: std::io::Error| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC).bits())
        .open(path);
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::Missing(path.to_path_buf()));
        }
        // ELOOP: the last component is a symlink.
        Err(e) if e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) => {
            return Err(Error::Symlink(path.to_path_buf()));
        }
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(Error::NotRegular(path.to_path_buf()));
    }
    let mut bytes = vec![];
    file.take(max + 1).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(Error::TooLarge {
            path: path.to_path_buf(),
            max,
        });
    }
    Ok(bytes)
}

/// [`read_limited`] as text (invalid UTF-8 replaced).
pub fn read_text(path: &Path, max: u64) -> Result<String, Error> {
    read_limited(path, max).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// [`read_text`] on a blocking thread, so that a slow file system cannot wedge the runtime.
pub async fn read_text_async(path: PathBuf, max: u64) -> Result<String, Error> {
    let shown = path.clone();
    tokio::task::spawn_blocking(move || read_text(&path, max))
        .await
        .unwrap_or_else(|e| {
            Err(Error::Io {
                path: shown,
                source: std::io::Error::other(e.to_string()),
            })
        })
}

/// `path` canonicalized, when it lies inside `dir` (itself canonicalized).
pub fn inside(path: &Path, dir: &Path) -> Result<PathBuf, Error> {
    let real = path.canonicalize().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::Missing(path.to_path_buf())
        } else {
            Error::Io {
                path: path.to_path_buf(),
                source: e,
            }
        }
    })?;
    let within = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    if real.starts_with(&within) {
        Ok(real)
    } else {
        Err(Error::Outside {
            path: path.to_path_buf(),
            real,
            within,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifos_devices_symlinks_and_large_files_are_refused() {
        let d = tempfile::tempdir().expect("tempdir");
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        assert!(matches!(read_limited(&fifo, 10), Err(Error::NotRegular(_))));
        let zero = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
        assert!(matches!(read_limited(&zero, 10), Err(Error::Symlink(_))));
        assert!(matches!(
            read_limited(Path::new("/dev/zero"), 10),
            Err(Error::NotRegular(_))
        ));
        let big = d.path().join("big");
        std::fs::write(&big, "12345678901").expect("write");
        assert!(matches!(
            read_limited(&big, 10),
            Err(Error::TooLarge { .. })
        ));
        assert_eq!(read_limited(&big, 11).expect("fits").len(), 11);
        assert!(matches!(
            read_limited(&d.path().join("none"), 10),
            Err(Error::Missing(_))
        ));
        let out = tempfile::tempdir().expect("tempdir");
        std::fs::write(out.path().join("secret"), "s").expect("write");
        let link = d.path().join("link");
        std::os::unix::fs::symlink(out.path().join("secret"), &link).expect("symlink");
        assert!(matches!(
            inside(&link, d.path()),
            Err(Error::Outside { .. })
        ));
        assert!(inside(&big, d.path()).is_ok());
    }
}
