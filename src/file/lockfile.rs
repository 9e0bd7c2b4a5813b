//! The lock file itself, `STEM.lock`: opened once and kept (the flock belongs to that open
//! file), locked without blocking, checked against the file at its path (one deleted and
//! created again is another lock), and who keeps it from this run.

use std::cell::Ref;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;

use super::files::{flock, open_lock_file, refused};
use super::meta::Meta;
use super::proc_locks::holder_of;
use super::{FileLock, shared};
use crate::backend::{BackendError, Busy, Expiry, Holder};

impl FileLock {
    /// The lock file, opened (created) if it is not yet.
    pub(super) fn file(&self) -> Result<Ref<'_, File>, BackendError> {
        if self.file.borrow().is_none() {
            let file = open_lock_file(&self.paths.lock)
                .map_err(|e| refused(&self.paths.lock, "open", &e))?;
            *self.file.borrow_mut() = Some(file);
        }
        Ref::filter_map(self.file.borrow(), Option::as_ref).map_err(|_| {
            BackendError::Refused(format!("{} is not open", self.paths.lock.display()))
        })
    }

    pub(super) fn unlock(&self) {
        // Closing the descriptor at exit would unlock too; an error here changes nothing.
        if let Some(file) = &*self.file.borrow() {
            let _ = flock(file, libc::LOCK_UN);
        }
    }

    /// Locks the lock file without blocking, shared or exclusive as this run holds it; when
    /// it is busy, who keeps it. A file deleted and created again under the same name is
    /// another lock: the one at the path is locked instead (a few times at most, against
    /// someone who keeps replacing it).
    pub(super) fn lock_at_path(&self) -> Result<Option<Busy>, BackendError> {
        let operation = self.operation();
        let mut replaced = 0;
        loop {
            let file = self.file()?;
            let locked = match flock(&file, operation | libc::LOCK_NB) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                Err(e) => return Err(refused(&self.paths.lock, "lock", &e)),
            };
            let here = self
                .still_at_path(&file)
                .map_err(|e| self.refused(refused(&self.paths.lock, "check", &e)))?;
            if !locked && here {
                return Ok(Some(Busy {
                    holder: self.keeping(&file),
                    expiry: Expiry::WithHolder,
                }));
            }
            drop(file);
            if here {
                return Ok(None);
            }
            // Replaced: busy or not, the file we have is no longer the lock.
            if locked {
                self.unlock();
            }
            replaced += 1;
            if replaced > 3 {
                return Err(BackendError::Transient(format!(
                    "{} keeps being replaced (deleted and created again) by someone else",
                    self.paths.lock.display()
                )));
            }
            let file = open_lock_file(&self.paths.lock)
                .map_err(|e| refused(&self.paths.lock, "open", &e))?;
            *self.file.borrow_mut() = Some(file);
        }
    }

    /// Who keeps the lock file from this run: its exclusive holder (the one the file names,
    /// unless `/proc/locks` says another process holds it); for an exclusive run, the first
    /// shared holder when shared ones hold it (the file then names a past exclusive holder).
    pub(super) fn keeping(&self, file: &File) -> Holder {
        let named = || holder_of(file, Meta::read(file).holder);
        match self.shared {
            true => named(),
            false => shared::first_live(&self.paths).unwrap_or_else(named),
        }
    }

    /// Whether `file` is still the file at the lock's path (not deleted, not replaced).
    pub(super) fn still_at_path(&self, file: &File) -> io::Result<bool> {
        let open = file.metadata()?;
        match fs::symlink_metadata(&self.paths.lock) {
            Ok(now) => Ok(now.dev() == open.dev() && now.ino() == open.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes the lock file's content durable, and its directory entry (this run may have
    /// created it): a `--min-hold` deadline must survive a crash, as the fence counter does.
    pub(super) fn sync(&self, file: &File) -> io::Result<()> {
        file.sync_data()?;
        File::open(&self.paths.dir)?.sync_all()
    }

    pub(super) fn refused(&self, e: BackendError) -> BackendError {
        self.unlock();
        e
    }

    /// Who keeps a run waiting that runs before it in the queue keep from the lock: the lock's
    /// holders, as far as `/proc/locks` tells (the first shared one when shared ones hold it).
    pub(super) fn in_line(&self) -> Result<Busy, BackendError> {
        let file = self.file()?;
        let named = || holder_of(&file, Meta::read(&file).holder);
        Ok(Busy {
            holder: shared::first_live(&self.paths).unwrap_or_else(named),
            expiry: Expiry::WithHolder,
        })
    }
}
