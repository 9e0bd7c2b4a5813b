//! What the operators' commands read of a `file://` lock (its one lock file, or a semaphore's
//! slot files), without creating anything and without touching the lock whenever
//! `/proc/locks` can tell; `release --force` of what only `--min-hold` keeps; and `doctor`'s
//! check of a NAME's files.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::files::{Paths, flock, open_existing, open_lock_file, refused};
use super::meta::{Meta, NotBefore};
use super::proc_locks::{holder_of, is_locked, waiters};
use super::slots::existing_slots;
use crate::backend::{BackendError, Busy, Expiry, Freed, Report, Slot};
use crate::name::LockName;

/// One file of a lock as it stands: what it says, and who keeps it (a process, or only a
/// `--min-hold` deadline), if anyone.
struct Kept {
    path: PathBuf,
    file: File,
    meta: Meta,
    expiry: Option<Expiry>,
}

/// The lock file and the slot files there are, each as it stands.
fn files(paths: &Paths) -> Result<Vec<Kept>, BackendError> {
    let mut kept = Vec::new();
    for path in std::iter::once(paths.lock.clone()).chain(existing_slots(paths)) {
        let file = match open_existing(&path, false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(refused(&path, "read", &e)),
        };
        let meta = Meta::read(&file);
        let expiry = if is_locked(&file).map_err(|e| refused(&path, "check", &e))? {
            Some(Expiry::WithHolder)
        } else {
            meta.not_before
                .as_ref()
                .and_then(NotBefore::left)
                .map(Expiry::In)
        };
        kept.push(Kept {
            path,
            file,
            meta,
            expiry,
        });
    }
    Ok(kept)
}

/// `status`: every holder of the lock, the soonest to end first.
pub fn report(paths: &Paths) -> Result<Report, BackendError> {
    let dir = &paths.dir;
    if !dir.is_dir() {
        return Err(BackendError::Refused(format!(
            "{} is not a directory (no lock was ever taken there, or the file:// URL is wrong)",
            dir.display()
        )));
    }
    let fence = paths.read_fence()?;
    let files = files(paths)?;
    let watched: Vec<&Path> = files.iter().map(|k| k.path.as_path()).collect();
    let waiters = waiters(&watched);
    let one = files
        .first()
        .is_some_and(|k| k.path == paths.lock && k.expiry.is_some());
    let mut holders: Vec<Slot> = Vec::new();
    let mut limit = None;
    for kept in files {
        let Some(expiry) = kept.expiry else { continue };
        let holder = match expiry {
            Expiry::WithHolder => holder_of(&kept.file, kept.meta.holder),
            _ => kept.meta.holder,
        };
        limit = limit.or(kept.meta.limit);
        holders.push(Slot {
            token: kept.meta.token,
            busy: Busy { holder, expiry },
        });
    }
    holders.sort_by_key(|s| s.busy.expiry.left());
    let held = holders.first().map(|s| s.busy.clone());
    Ok(Report {
        fence,
        value: holders.first().and_then(|s| s.token.clone()),
        limit: held
            .is_some()
            .then(|| if one { 1 } else { limit.unwrap_or(0) }),
        held,
        holders,
        waiters,
        ..Report::default()
    })
}

/// `release --force`: frees what only a `--min-hold` deadline keeps (the holder whose token is
/// `token`, or every one); a lock that a live process holds cannot be taken from it (a flock
/// belongs to its holder until it exits).
pub fn force_release(
    paths: &Paths,
    name: &LockName,
    token: Option<&str>,
) -> Result<Freed, BackendError> {
    let fence = paths.read_fence()?;
    let chosen: Vec<_> = files(paths)?
        .into_iter()
        .filter(|kept| token.is_none_or(|t| kept.meta.token.as_deref() == Some(t)))
        .collect();
    // All or nothing: a live holder among them is reported before anything is freed.
    if let Some(live) = chosen
        .iter()
        .find(|kept| kept.expiry == Some(Expiry::WithHolder))
    {
        let busy = Busy {
            holder: holder_of(&live.file, live.meta.holder.clone()),
            expiry: Expiry::WithHolder,
        };
        return Ok(Freed::Kept(only_its_process_frees(name, &busy)));
    }
    let mut released = Vec::new();
    for kept in chosen {
        if kept.expiry.is_none() {
            continue;
        }
        let file = open_existing(&kept.path, true).map_err(|e| refused(&kept.path, "open", &e))?;
        flock(&file, libc::LOCK_EX | libc::LOCK_NB).map_err(|e| refused(&kept.path, "lock", &e))?;
        file.set_len(0)
            .map_err(|e| refused(&kept.path, "write", &e))?;
        released.push(kept.meta.holder);
    }
    Ok(Freed::Released {
        holders: released,
        fence,
    })
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
