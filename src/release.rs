//! `locked-run release NAME [--force]`: frees a stuck lock, saying whom it took it from. The
//! fence counter is never deleted, so fencing tokens keep growing. Without `--force` it only
//! shows the holder. Exit 0 when something was released, 1 when the lock was free.

use crate::backend::{BackendError, Expiry, Holder};
use crate::exit::{Exit, Failure};
use crate::file;
use crate::name::LockName;
use crate::redis::lock::ServerLock;
use crate::redis::redlock::Redlock;

/// One server.
pub async fn release(lock: &ServerLock, force: bool) -> Result<Exit, Failure> {
    let name = lock.name().as_str();
    if !force {
        let report = lock
            .inspect()
            .await
            .map_err(|e| Failure::unavailable(e.to_string()))?;
        return refuse(name, report.held.map(|b| b.holder), report.fence);
    }
    let (holder, fence) = lock
        .force_release()
        .await
        .map_err(|e| Failure::unavailable(e.to_string()))?;
    Ok(said(name, holder, fence))
}

/// A host-local lock: a live holder cannot be robbed of a flock (stop its process instead); a
/// lock kept only by a `--min-hold` deadline is freed with `--force`.
pub fn release_file(url: &str, name: &LockName, force: bool) -> Result<Exit, Failure> {
    let unavailable = |e: BackendError| Failure::unavailable(e.to_string());
    let report = file::inspect(url, name).map_err(unavailable)?;
    let Some(busy) = report.held else {
        return Ok(said(name.as_str(), None, report.fence));
    };
    if busy.expiry == Expiry::WithHolder {
        let stop = busy
            .holder
            .pid
            .map_or_else(String::new, |pid| format!(" (kill {pid})"));
        return Err(Failure::usage(format!(
            "lock {name} is held by {}; a host-local lock is freed only when its holder's process \
             ends: stop that process{stop} and the lock is free at once",
            busy.holder
        )));
    }
    if !force {
        return Err(Failure::usage(format!(
            "lock {name} is kept by --min-hold of its last holder, {}; nothing was released: add \
             --force to release it",
            busy.holder
        )));
    }
    let (holder, fence) = file::clear_min_hold(url, name).map_err(unavailable)?;
    Ok(said(name.as_str(), holder, fence))
}

/// Redlock: released on every server that answers; it was held if any server held it.
pub async fn release_redlock(redlock: &Redlock, force: bool) -> Result<Exit, Failure> {
    let name = redlock.name();
    let answers = redlock.force_release_everywhere(force).await;
    let reachable: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
    if reachable.is_empty() {
        let first = answers.into_iter().find_map(Result::err);
        return Err(Failure::unavailable(first.map_or_else(
            || "no Redis server answered".into(),
            |e| e.to_string(),
        )));
    }
    // The holder as the first server that knows it tells; else as any server tells.
    let holders: Vec<&Holder> = reachable.iter().filter_map(|(h, _)| h.as_ref()).collect();
    let holder = holders
        .iter()
        .find(|h| h.is_known())
        .or(holders.first())
        .map(|h| (*h).clone());
    let fence = reachable.iter().filter_map(|(_, f)| *f).max();
    if !force {
        return refuse(name, holder, fence);
    }
    Ok(said(name, holder, fence))
}

fn refuse(name: &str, holder: Option<Holder>, fence: Option<u64>) -> Result<Exit, Failure> {
    match holder {
        None => Ok(said(name, None, fence)),
        Some(holder) => Err(Failure::usage(format!(
            "lock {name} is held by {holder}; nothing was released: add --force to release it \
             (its command keeps running until its next renewal finds the lock gone)"
        ))),
    }
}

fn said(name: &str, holder: Option<Holder>, fence: Option<u64>) -> Exit {
    let fence = fence.map_or_else(|| "none issued yet".into(), |f| f.to_string());
    match holder {
        Some(holder) => {
            println!("released lock {name}, held by {holder}; last fence {fence}");
            Exit::Child(0)
        }
        None => {
            println!("lock {name} was free (last fence {fence}); nothing to release");
            Exit::Free
        }
    }
}
