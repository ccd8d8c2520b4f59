//! The durable epoch: the only state a node keeps across restarts.
//!
//! Epochs are ballots (docs/protocol.md §2, see `cluster::ballot`), so two nodes never
//! share one. A node that starts serving moves to a round above every epoch it
//! has persisted or seen, and writes the new epoch to `<data-dir>/epoch` with
//! fsync (file, then directory) before it issues the first token of it. That
//! is why tokens keep increasing across restarts, kill -9 included.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use ringlock_shards::token::EPOCH_MAX;

use crate::cluster::next_epoch;

/// The epoch file of one data directory, locked against a second server.
#[derive(Debug)]
pub struct EpochStore {
    dir: PathBuf,
    highest: u64,
    /// Held open for its `flock`, released when the process ends.
    _lock: File,
}

impl EpochStore {
    /// Opens (creating if needed) the data directory and reads its epoch.
    /// Errors say what the operator should do.
    pub fn open(dir: &Path) -> Result<EpochStore, String> {
        fs::create_dir_all(dir).map_err(|error| {
            format!("cannot create the data directory {}: {error}; pick another --data-dir", dir.display())
        })?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(&lock_path).map_err(|error| {
            format!("the data directory {} is not writable: {error}; pick another --data-dir", dir.display())
        })?;
        // SAFETY: flock on a file descriptor we own.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(format!(
                "the data directory {} is in use by another ringlock server; give each server its own --data-dir",
                dir.display()
            ));
        }
        // The lock file names the process that holds it, for `ringlock-cli
        // reload --data-dir`.
        let mut lock = lock;
        let _ = lock.set_len(0).and_then(|()| {
            use std::io::Write;
            writeln!(lock, "{}", std::process::id())
        });
        let path = dir.join("epoch");
        let highest = match fs::read_to_string(&path) {
            Ok(text) => match text.trim().parse::<u64>() {
                Ok(epoch) if epoch <= EPOCH_MAX => epoch,
                _ => {
                    return Err(format!(
                        "{} does not hold an epoch number from 0 to {EPOCH_MAX} ({:?}); restore it, or see \
                         \"When the epoch space runs out\" in the README",
                        path.display(),
                        text.trim()
                    ));
                }
            },
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                // A new epoch file starts the node's tokens from scratch: if
                // this node ran before from another directory (the default
                // --data-dir is relative to the working directory), its new
                // tokens may be below those it issued there.
                let absolute = fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
                tracing::warn!(
                    path = %absolute.join("epoch").display(),
                    "no epoch file in the data directory: starting a new one; if this node ran before with \
                     another --data-dir, point --data-dir at that one instead, or its tokens go below earlier ones"
                );
                0
            }
            Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
        };
        let mut store = EpochStore { dir: dir.to_path_buf(), highest, _lock: lock };
        // Prove now that the epoch can be written, rather than at the first grant.
        store
            .persist(highest)
            .map_err(|error| format!("cannot write {}: {error}; pick another --data-dir", path.display()))?;
        Ok(store)
    }

    /// The highest epoch persisted.
    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// Persists `epoch` (if above the highest so far) with fsync of the file
    /// and of the directory, so the rename itself survives a crash.
    pub fn persist(&mut self, epoch: u64) -> io::Result<()> {
        if epoch > EPOCH_MAX {
            // No token can carry it, and a file holding it could not be opened again.
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("epoch {epoch} is above {EPOCH_MAX}")));
        }
        let epoch = epoch.max(self.highest);
        let temporary = self.dir.join("epoch.tmp");
        let mut file = File::create(&temporary)?;
        writeln!(file, "{epoch}")?;
        file.sync_all()?;
        fs::rename(&temporary, self.dir.join("epoch"))?;
        File::open(&self.dir)?.sync_all()?;
        self.highest = epoch;
        Ok(())
    }

    /// Moves to the first epoch of `node` above every epoch persisted or
    /// `seen`, persists it, and returns it.
    pub fn advance(&mut self, node: u64, seen: u64) -> Result<u64, String> {
        let epoch = next_epoch(self.highest.max(seen), node)?;
        self.persist(epoch)
            .map_err(|error| format!("cannot persist epoch {epoch} in {}: {error}", self.dir.display()))?;
        Ok(epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ringlock-epoch-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_epoch_survives_reopening_and_only_grows() {
        let dir = temp_dir("reopen");
        let mut store = EpochStore::open(&dir).unwrap();
        assert_eq!(store.highest(), 0);
        assert_eq!(store.advance(0, 0), Ok(16));
        assert_eq!(store.advance(0, 100), Ok(112));
        drop(store);
        let mut store = EpochStore::open(&dir).unwrap();
        assert_eq!(store.highest(), 112);
        store.persist(5).unwrap();
        assert_eq!(store.highest(), 112, "persisting a lower epoch keeps the higher one");
        drop(store);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_second_server_cannot_share_the_directory() {
        let dir = temp_dir("locked");
        let _first = EpochStore::open(&dir).unwrap();
        let second = EpochStore::open(&dir).unwrap_err();
        assert!(second.contains("in use"), "{second}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_epoch_file_is_refused() {
        let dir = temp_dir("corrupt");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("epoch"), "not a number").unwrap();
        let error = EpochStore::open(&dir).unwrap_err();
        assert!(error.contains("does not hold an epoch"), "{error}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_epoch_file_above_the_epoch_space_is_refused_and_none_is_written() {
        let dir = temp_dir("range");
        fs::create_dir_all(&dir).unwrap();
        for text in [u64::MAX.to_string(), (EPOCH_MAX + 1).to_string(), "-1".to_string()] {
            fs::write(dir.join("epoch"), &text).unwrap();
            let error = EpochStore::open(&dir).unwrap_err();
            assert!(error.contains(&format!("from 0 to {EPOCH_MAX}")), "{text}: {error}");
            assert!(error.contains("epoch space runs out"), "the error names the recovery: {error}");
        }
        fs::write(dir.join("epoch"), EPOCH_MAX.to_string()).unwrap();
        let mut store = EpochStore::open(&dir).unwrap();
        assert_eq!(store.highest(), EPOCH_MAX);
        assert!(store.advance(0, 0).unwrap_err().contains("exhausted"));
        assert!(store.persist(EPOCH_MAX + 1).is_err());
        assert!(store.persist(u64::MAX).is_err());
        drop(store);
        assert_eq!(fs::read_to_string(dir.join("epoch")).unwrap().trim(), EPOCH_MAX.to_string());
        fs::remove_dir_all(&dir).unwrap();
    }
}
