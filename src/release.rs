//! `locked-run release NAME [--force]`: frees a stuck lock, saying whom it took it from. The
//! fence counter is never deleted, so fencing tokens keep growing. Without `--force` it only
//! shows the holder. Exit 0 when something was released, 1 when the lock was free.

use crate::backend::Holder;
use crate::exit::{Exit, Failure};
use crate::lock::Lock;
use crate::redlock::Redlock;

/// One server.
pub async fn release(lock: &Lock, force: bool) -> Result<Exit, Failure> {
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
    let holder = reachable
        .iter()
        .find_map(|(h, _)| h.clone().filter(Holder::is_known).or(h.clone()));
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
