//! `locked-run release NAME [--force]`: frees a stuck lock, saying whom it took it from. The
//! fence counter is never deleted, so fencing tokens keep growing. Without `--force` it only
//! shows the holder. Exit 0 when something was released, 1 when the lock was free.

use crate::backend::{Freed, Holder, Tenure, View};
use crate::file;
use crate::name::LockName;
use crate::plumbing::exit::{Exit, Failure};
use crate::text::say;

/// Shows the holder and refuses (2) without `force`; with it, frees the lock. `token`: of
/// several holders (`--holders`), free only the one whose `LOCKED_RUN_TOKEN` it is.
pub async fn release(
    backend: &dyn View,
    name: &LockName,
    force: bool,
    token: Option<&str>,
) -> Result<Exit, Failure> {
    let unavailable = |e: crate::backend::BackendError| Failure::unavailable(e.to_string());
    if !force {
        let report = backend.inspect().await.map_err(unavailable)?;
        let Some(busy) = report.held.clone() else {
            return Ok(said(name, &[], report.fence));
        };
        // The first holder whose run goes on; none: only --min-hold keeps the lock.
        let tenure = backend.tenure();
        let runs = crate::subcommands::status::history_for(backend, &report)
            .await
            .map(|history| history.runs)
            .unwrap_or_default();
        let live = match report
            .holders
            .iter()
            .find(|slot| !crate::subcommands::status::kept(tenure, slot, &runs))
        {
            Some(slot) => Some(slot.busy.clone()),
            None if report.holders.is_empty() => Some(busy.clone()),
            None => None,
        };
        let why = match (tenure, live) {
            (_, None) => crate::text::message!(
                "lock {name} is kept by --min-hold of its last holder, {}; nothing was released: \
                 add --force to release it",
                busy.holder
            ),
            // A flock belongs to its holder until it exits: --force cannot help.
            (Tenure::Kernel, Some(live)) => file::only_its_process_frees(name, &live),
            (Tenure::Lease, Some(live)) => crate::text::message!(
                "lock {name} is held by {}; nothing was released: add --force to release it \
                 (its command keeps running until its next renewal finds the lock gone)",
                live.holder
            ),
        };
        return Err(Failure::usage(why));
    }
    match backend.force_release(token).await.map_err(unavailable)? {
        Freed::Released { holders, fence } => Ok(said(name, &holders, fence)),
        Freed::Kept(why) => Err(Failure::usage(why)),
    }
}

fn said(name: &LockName, holders: &[Holder], fence: Option<u64>) -> Exit {
    let fence = crate::backend::last_fence(fence);
    match holders {
        [holder] => {
            say(format_args!(
                "released lock {name}, held by {holder}; {fence}"
            ));
            Exit::Child(0)
        }
        [_, ..] => {
            let by: Vec<String> = holders.iter().map(Holder::to_string).collect();
            say(format_args!(
                "released lock {name}, held by {} holders: {}; {fence}",
                holders.len(),
                by.join("; ")
            ));
            Exit::Child(0)
        }
        [] => {
            say(format_args!(
                "lock {name} was free ({fence}); nothing to release"
            ));
            Exit::Free
        }
    }
}
