//! What the operators' commands read of a `file://` lock, without creating anything and
//! without touching the lock whenever `/proc/locks` can tell; `release --force` of a lock kept
//! only by `--min-hold`; and `doctor`'s check of a NAME's files.

use std::fs;
use std::io;
use std::path::Path;

use super::files::{Paths, flock, open_existing, open_lock_file, refused};
use super::meta::{Meta, NotBefore};
use super::proc_locks::{holder_of, is_locked, waiters};
use crate::backend::{BackendError, Busy, Expiry, Freed, Report};
use crate::name::LockName;

/// `status` of a NAME in a directory, without creating anything, and without touching the
/// lock whenever `/proc/locks` can tell.
pub fn report(paths: &Paths) -> Result<Report, BackendError> {
    let dir = &paths.dir;
    if !dir.is_dir() {
        return Err(BackendError::Refused(format!(
            "{} is not a directory (no lock was ever taken there, or the file:// URL is wrong)",
            dir.display()
        )));
    }
    let fence = paths.read_fence()?;
    let waiters = waiters(paths);
    let file = match open_existing(&paths.lock, false) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Report {
                fence,
                waiters,
                ..Report::default()
            });
        }
        Err(e) => return Err(refused(&paths.lock, "read", &e)),
    };
    let meta = Meta::read(&file);
    let held = is_locked(&file).map_err(|e| refused(&paths.lock, "check", &e))?;
    let (holder, expiry) = if held {
        (holder_of(&file, meta.holder), Some(Expiry::WithHolder))
    } else {
        let left = meta.not_before.as_ref().and_then(NotBefore::left);
        (meta.holder, left.map(Expiry::In))
    };
    Ok(Report {
        fence,
        held: expiry.map(|expiry| Busy { holder, expiry }),
        value: expiry.and(meta.token),
        waiters,
        ..Report::default()
    })
}

/// `release --force`: frees a lock that only a `--min-hold` deadline keeps; a lock that a live
/// process holds cannot be taken from it (a flock belongs to its holder until it exits).
pub fn force_release(paths: &Paths, name: &LockName) -> Result<Freed, BackendError> {
    let report = report(paths)?;
    if let Some(busy) = report.held.filter(|b| b.expiry == Expiry::WithHolder) {
        return Ok(Freed::Kept(only_its_process_frees(name, &busy)));
    }
    let fence = report.fence;
    let file = match open_existing(&paths.lock, true) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Freed::Released {
                holder: None,
                fence,
            });
        }
        Err(e) => return Err(refused(&paths.lock, "open", &e)),
    };
    flock(&file, libc::LOCK_EX | libc::LOCK_NB).map_err(|e| refused(&paths.lock, "lock", &e))?;
    let meta = Meta::read(&file);
    let holder = meta
        .not_before
        .as_ref()
        .and_then(NotBefore::left)
        .map(|_| meta.holder.clone());
    if holder.is_some() {
        file.set_len(0)
            .map_err(|e| refused(&paths.lock, "write", &e))?;
    }
    Ok(Freed::Released { holder, fence })
}

/// Why a lock that a live process holds cannot be released from here.
pub fn only_its_process_frees(name: &LockName, busy: &Busy) -> String {
    let stop = busy
        .holder
        .pid
        .map_or_else(String::new, |pid| format!(" (kill {pid})"));
    format!(
        "lock {name} is held by {}; a host-local lock is freed only when its holder's process \
         ends: stop that process{stop} and the lock is free at once",
        busy.holder
    )
}

/// `doctor`: NAME's files in DIR can be used by this user: the lock file opens for writing
/// (not a link), the fence counter reads as one.
pub fn check_files(dir: &Path, name: &LockName) -> Result<String, String> {
    let paths = Paths::new(dir, name);
    let lock = match fs::symlink_metadata(&paths.lock) {
        Err(_) => return Ok(format!("no files for lock {name} yet")),
        Ok(_) => {
            open_lock_file(&paths.lock).map_err(|e| refused(&paths.lock, "open", &e).to_string())?
        }
    };
    drop(lock);
    let fence = paths.read_fence().map_err(|e| e.to_string())?;
    Ok(format!(
        "{} opens for writing; last fence of lock {name}: {}",
        paths.lock.display(),
        fence.map_or_else(|| "none issued yet".into(), |f| f.to_string())
    ))
}
