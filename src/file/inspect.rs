//! What the operators' commands read of a `file://` lock (its one lock file and its shared
//! holders' files, or a semaphore's slot files), without creating anything and without
//! touching the lock whenever `/proc/locks` can tell; `release --force` of what only
//! `--min-hold` keeps; and `doctor`'s check of a NAME's files.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::fence::Reading;
use super::files::{Paths, flock, open_existing, open_lock_file, refused};
use super::meta::{Meta, NotBefore};
use super::proc_locks::{holder_of, is_locked, process, readers, waiters};
use super::shared::{Member, members};
use super::slots::existing_slots;
use crate::backend::{BackendError, Busy, Expiry, Freed, Holder, Report, Slot};
use crate::name::LockName;

/// One file of a lock as it stands: what it says, and who keeps it (a process, or only a
/// `--min-hold` deadline), if anyone.
struct Kept {
    path: PathBuf,
    file: File,
    meta: Meta,
    expiry: Option<Expiry>,
    /// A shared holder's own file, not a lock file.
    member: bool,
}

/// Every file of a lock as it stands: the lock file and the slot files there are, then the
/// shared holders' files.
fn files(paths: &Paths) -> Result<Vec<Kept>, BackendError> {
    let mut kept = lock_files(paths)?;
    let shared = members(paths).map_err(|e| refused(&paths.dir, "read", &e))?;
    kept.extend(shared.into_iter().map(|m: Member| Kept {
        path: m.path,
        file: m.file,
        meta: m.meta,
        expiry: m.expiry,
        member: true,
    }));
    Ok(kept)
}

/// The lock file and the slot files there are, each as it stands.
fn lock_files(paths: &Paths) -> Result<Vec<Kept>, BackendError> {
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
            member: false,
        });
    }
    Ok(kept)
}

/// The processes that hold the lock file shared with no file of their own (`flock -s`): not
/// `locked-run --shared` holders, whose files name them.
fn others_sharing(paths: &Paths, files: &[Kept]) -> Vec<Holder> {
    let Some(lock) = files.iter().find(|k| k.path == paths.lock) else {
        return Vec::new();
    };
    let named: Vec<u32> = files
        .iter()
        .filter(|k| k.member && k.expiry == Some(Expiry::WithHolder))
        .filter_map(|k| k.meta.holder.pid)
        .collect();
    readers(&lock.file)
        .into_iter()
        .filter(|pid| !named.contains(pid))
        .map(process)
        .collect()
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
    let counter = paths.read_counter()?;
    let files = files(paths)?;
    let watched: Vec<&Path> = files
        .iter()
        .filter(|k| !k.member)
        .map(|k| k.path.as_path())
        .collect();
    let waiters = waiters(&watched, &paths.queued_pids());
    let others = others_sharing(paths, &files);
    let one = files
        .first()
        .is_some_and(|k| k.path == paths.lock && k.expiry.is_some());
    let exclusive = files.iter().any(|k| !k.member && k.expiry.is_some());
    let mut holders: Vec<Slot> = Vec::new();
    let mut limit = None;
    for kept in files {
        let Some(expiry) = kept.expiry else { continue };
        let holder = match expiry {
            Expiry::WithHolder if !kept.member => holder_of(&kept.file, kept.meta.holder),
            _ => kept.meta.holder,
        };
        limit = limit.or(kept.meta.limit);
        holders.push(Slot {
            token: kept.meta.token,
            busy: Busy { holder, expiry },
        });
    }
    holders.extend(others.into_iter().map(|holder| Slot {
        token: None,
        busy: Busy {
            holder,
            expiry: Expiry::WithHolder,
        },
    }));
    let shared = !exclusive && !holders.is_empty();
    let fence = match counter {
        None => None,
        Some(Reading::Last(fence)) => Some(fence),
        Some(Reading::AtMost(top)) => Some(last_known(paths, &holders).unwrap_or(top)),
    };
    holders.sort_by_key(|s| s.busy.expiry.left());
    let held = holders.first().map(|s| s.busy.clone());
    Ok(Report {
        fence,
        value: holders.first().and_then(|s| s.token.clone()),
        limit: held
            .is_some()
            .then(|| if one || shared { 1 } else { limit.unwrap_or(0) }),
        held,
        holders,
        waiters,
        shared,
        ..Report::default()
    })
}

/// The last token issued as far as the holders and the history show it, when the counter
/// can tell only its block's top: the largest a holder was given or a run recorded.
fn last_known(paths: &Paths, holders: &[Slot]) -> Option<u64> {
    let held = holders.iter().filter_map(|s| s.busy.holder.fence);
    let ran = super::history::largest_fence(paths).ok().flatten();
    held.chain(ran).max()
}

/// `release --force`: frees what only a `--min-hold` deadline keeps (the holder whose token is
/// `token`, or every one, exclusive or shared); a lock that a live process holds cannot be
/// taken from it (a flock belongs to its holder until it exits), nor from a shared holder.
pub fn force_release(
    paths: &Paths,
    name: &LockName,
    token: Option<&str>,
) -> Result<Freed, BackendError> {
    let fence = paths.read_fence()?;
    let files = files(paths)?;
    // `flock -s` holders have no token: only "all" names them.
    let others = match token {
        None => others_sharing(paths, &files),
        Some(_) => Vec::new(),
    };
    let chosen: Vec<_> = files
        .into_iter()
        .filter(|kept| token.is_none_or(|t| kept.meta.token.as_deref() == Some(t)))
        .collect();
    // All or nothing: a live holder among them is reported before anything is freed.
    let live = chosen
        .iter()
        .find(|kept| kept.expiry == Some(Expiry::WithHolder))
        .map(|live| match live.member {
            true => live.meta.holder.clone(),
            false => holder_of(&live.file, live.meta.holder.clone()),
        })
        .or(others.into_iter().next());
    if let Some(holder) = live {
        let busy = Busy {
            holder,
            expiry: Expiry::WithHolder,
        };
        return Ok(Freed::Kept(only_its_process_frees(name, &busy)));
    }
    let mut released = Vec::new();
    for kept in chosen {
        if kept.expiry.is_none() {
            continue;
        }
        if kept.member {
            // Its holder is gone: only the deadline is left, in a file nobody holds.
            match fs::remove_file(&kept.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(refused(&kept.path, "remove", &e));
                }
                _ => {}
            }
            released.push(kept.meta.holder);
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
    crate::text::message!(
        "lock {name} is held by {}; a host-local lock is freed only when its holder's process \
         ends: stop that process{stop} and the lock is free at once",
        busy.holder
    )
}

/// `doctor`: NAME's files in DIR that every user may write (a lock, fence, queue or history
/// file made with umask 0, or by another program).
pub fn writable_by_all(dir: &Path, name: &LockName) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let paths = Paths::new(dir, name);
    [
        paths.lock.clone(),
        paths.fence.clone(),
        paths.queue(),
        paths.history(),
    ]
    .into_iter()
    .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o002 != 0))
    .map(|p| p.display().to_string())
    .collect()
}

/// `doctor`: NAME's files in DIR can be used by this user: the lock file opens for writing, the
/// fence counter reads as one, and the queue's counter opens; none is a link, nor another
/// user's where that user could swap it (see `trust`).
pub fn check_files(dir: &Path, name: &LockName) -> Result<String, String> {
    let paths = Paths::new(dir, name);
    let lock = match fs::symlink_metadata(&paths.lock) {
        Err(_) => return Ok(format!("no files for lock {name} yet")),
        Ok(_) => {
            open_lock_file(&paths.lock).map_err(|e| refused(&paths.lock, "open", &e).to_string())?
        }
    };
    drop(lock);
    let queue = paths.queue();
    if fs::symlink_metadata(&queue).is_ok() {
        open_existing(&queue, false).map_err(|e| refused(&queue, "open", &e).to_string())?;
    }
    let fence = paths.read_fence().map_err(|e| e.to_string())?;
    Ok(format!(
        "{} opens for writing; lock {name}: {}",
        paths.lock.display(),
        crate::backend::last_fence(fence)
    ))
}
