//! `--holders N` on `file://`: N slot files, `STEM.lock.0` to `STEM.lock.{N-1}`, each locked
//! with `flock(2)` by one holder. A run takes whichever is free, and the slot's metadata
//! records N for the next run to compare with its own.
//!
//! Every run decides under a brief flock on DIR, one-holder runs (`STEM.lock`) too (they raise
//! their fence under it): it looks at the other runs' files and writes its own metadata before
//! letting DIR go, so a run of another N that decides after it sees it. Only files whose
//! metadata names a holder count: a waiter's thread locks a file for an instant (and writes
//! nothing), a holder empties its file before letting it go.

use std::fs::File;
use std::io;
use std::path::PathBuf;

use super::FileLock;
use super::files::{Paths, flock, open_existing, open_lock_file, refused};
use super::meta::{Meta, NotBefore};
use super::proc_locks::{holder_of, is_locked};
use crate::backend::{Attempt, BackendError, Busy, Expiry, Holder, Mode};

impl FileLock {
    /// One attempt at a slot of a semaphore.
    pub(super) async fn acquire_slot(&self) -> Result<Attempt, BackendError> {
        let dir = self.paths.lock_dir().await?;
        if let Some(theirs) = other_holders(&self.paths, self.mode()) {
            return Ok(Attempt::Mismatch { theirs });
        }
        let mut busy: Option<Busy> = None;
        for i in 0..self.holders {
            let path = self.paths.slot(i);
            let file = open_lock_file(&path).map_err(|e| refused(&path, "open", &e))?;
            match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    busy.get_or_insert(Busy {
                        holder: holder_of(&file, Meta::read(&file).holder),
                        expiry: Expiry::WithHolder,
                    });
                    continue;
                }
                Err(e) => return Err(refused(&path, "lock", &e)),
            }
            let last = Meta::read(&file);
            if let Some(left) = last.not_before.as_ref().and_then(NotBefore::left) {
                // Kept by --min-hold of its last holder: no process holds it.
                let _ = flock(&file, libc::LOCK_UN);
                let soonest = busy.as_ref().map_or(left, |b| b.expiry.left().min(left));
                busy = Some(Busy {
                    holder: busy.map_or(last.holder, |b| b.holder),
                    expiry: Expiry::In(soonest),
                });
                continue;
            }
            let fence = self
                .paths
                .raise_fence_locked(&dir)
                .inspect_err(|_| drop(flock(&file, libc::LOCK_UN)))?;
            let meta = self.granted(fence, Some(self.holders));
            if let Err(e) = meta.write(&file) {
                let _ = flock(&file, libc::LOCK_UN);
                return Err(refused(&path, "write", &e));
            }
            *self.file.borrow_mut() = Some(file);
            *self.held.borrow_mut() = Some(meta);
            return Ok(Attempt::Acquired { fence });
        }
        Ok(Attempt::Busy(busy.unwrap_or(Busy {
            holder: Holder::default(),
            expiry: Expiry::WithHolder,
        })))
    }
}

/// The slot files that exist, in order (slots are created from 0 up).
pub(super) fn existing_slots(paths: &Paths) -> impl Iterator<Item = PathBuf> + '_ {
    (0..)
        .map(|i| paths.slot(i))
        .take_while(|p| p.symlink_metadata().is_ok())
}

/// The mode of runs that hold NAME in another mode than `ours` (called under the flock on
/// DIR): semaphore slots whose metadata names another N, for any run; for a semaphore's run
/// also a one-holder run (exclusive) or shared holders. Exclusive and shared runs exclude each
/// other on the lock file itself: they find it busy, not of another mode.
pub(super) fn other_holders(paths: &Paths, ours: Mode) -> Option<Mode> {
    if let Mode::Holders(_) = ours {
        if held_with(&paths.lock, |meta| meta.token.is_some()).is_some() {
            return Some(Mode::Exclusive);
        }
        if super::shared::any_live(paths) {
            return Some(Mode::Shared);
        }
    }
    existing_slots(paths).find_map(|path| {
        let other = |limit: u32| Mode::of_holders(limit) != ours;
        let meta = held_with(&path, |meta| meta.limit.is_some_and(other))?;
        meta.limit.map(Mode::of_holders)
    })
}

/// What a file says when it says what `telling` looks for and a process holds it. The metadata
/// is read first: a holder empties its file before letting it go, so whether a process still
/// holds it (`/proc/locks`) is asked only of a file that names a holder of interest.
fn held_with(path: &std::path::Path, telling: impl Fn(&Meta) -> bool) -> Option<Meta> {
    let file = open_existing(path, false).ok()?;
    let meta = Meta::read(&file);
    (telling(&meta) && is_locked(&file).unwrap_or(false)).then_some(meta)
}

/// Whether `file` (a slot) is kept only by a `--min-hold` deadline, and for how long.
pub(super) fn min_hold_of(file: &File) -> Option<std::time::Duration> {
    Meta::read(file)
        .not_before
        .as_ref()
        .and_then(NotBefore::left)
}
