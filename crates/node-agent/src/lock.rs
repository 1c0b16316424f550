//! One agent per plugin directory.
//!
//! Two agents on one directory (a DaemonSet rollout with surge, a stuck old
//! pod) would take the plugin socket from each other forever: each serves
//! again when the socket's inode changes, and every re-registration drops
//! the kubelet's stream. So the agent holds an advisory lock (`flock`) on
//! `<plugin dir>/gpusched-agent.lock` for as long as it runs, and a second
//! agent refuses to start, naming the holder.
//!
//! The lock is released by the kernel when the holder exits, however it
//! exits, so a crashed agent never blocks its successor. The file itself is
//! left in place (removing it would let a third agent lock a fresh file
//! while the second still holds the old one). The kubelet removes only
//! sockets from the plugin directory, so the file survives kubelet restarts.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// File name of the lock inside the plugin directory.
pub const LOCK_FILE: &str = "gpusched-agent.lock";

/// The lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be opened or created.
    #[error("cannot open lock file {path}: {source}")]
    Open {
        /// The lock file.
        path: PathBuf,
        /// Why opening failed.
        source: std::io::Error,
    },
    #[error(
        "another gpusched agent is serving plugin dir {dir} ({holder}; lock file {path}); \
         refusing to start, as two agents would take the plugin socket from each other. \
         Stop the other agent first (DaemonSet: rollingUpdate.maxSurge 0)"
    )]
    /// Another process holds the lock.
    Held {
        /// The plugin directory.
        dir: PathBuf,
        /// The lock file.
        path: PathBuf,
        /// What the holder wrote into the file (`pid N, pod/host …`), or `holder unknown`.
        holder: String,
    },
    /// Locking failed for a reason other than another holder.
    #[error("cannot lock {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// Why locking failed.
        source: std::io::Error,
    },
}

/// A held lock; dropping it releases the lock.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Who holds the lock, from what the holder wrote into the file.
fn describe_holder(file: &mut File) -> String {
    let mut text = String::new();
    // A holder that has not written yet, or unreadable text, is "unknown".
    let _ = Read::by_ref(file).take(256).read_to_string(&mut text);
    let text = text.trim();
    if text.is_empty() {
        "holder unknown".into()
    } else {
        text.lines().collect::<Vec<_>>().join(", ")
    }
}

/// Takes the lock of `dir` (which must exist) without waiting.
pub fn acquire(dir: &Path) -> Result<DirLock, LockError> {
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|source| LockError::Open {
            path: path.clone(),
            source,
        })?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            return Err(LockError::Held {
                dir: dir.to_path_buf(),
                holder: describe_holder(&mut file),
                path,
            });
        }
        Err(TryLockError::Error(source)) => return Err(LockError::Lock { path, source }),
    }
    // Ours now: say who we are, for the next one that tries.
    let mut me = format!("pid {}", std::process::id());
    if let Ok(h) = std::env::var("HOSTNAME")
        && !h.is_empty()
    {
        me.push_str(&format!(
            "\npod/host {}",
            h.chars().take(253).collect::<String>()
        ));
    }
    me.push('\n');
    let written = file
        .set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.write_all(me.as_bytes()));
    if let Err(e) = written {
        // The lock is what matters; the note only helps the message.
        tracing::warn!(file = %path.display(), "cannot write lock holder: {e}");
    }
    Ok(DirLock { _file: file, path })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_one_dir_is_refused_naming_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let held = acquire(d.path()).unwrap();
        assert_eq!(held.path(), d.path().join(LOCK_FILE));
        let e = acquire(d.path()).unwrap_err().to_string();
        assert!(e.contains("another gpusched agent"), "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        assert!(e.contains(&d.path().display().to_string()), "{e}");
        drop(held);
        // Released with its holder: the next agent starts.
        let again = acquire(d.path()).unwrap();
        drop(again);
    }
}
