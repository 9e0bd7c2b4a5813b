//! What the job leaves behind when its main process exits: a short settle for processes on
//! their way out of the group, then the kill signal, SIGKILL K later, to whatever is left, while
//! the lease is still kept; and the signals `locked-run` passes on to the job meanwhile.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::plumbing::clock::Clock;
use crate::plumbing::signals::{Event, Incoming};
use crate::session::config::RunConfig;

use super::supervised::{Events, Kill, Reap};

/// Passes a signal sent to `locked-run` on to the job, unless the terminal already delivered it
/// to the whole foreground group (the job included).
pub fn forward<K: Kill>(target: K, incoming: Incoming, interactive: bool) {
    if interactive && incoming.from_kernel {
        // Ctrl-C and friends reached the whole foreground group, the child included.
        tracing::debug!(
            "{} came from the terminal; not forwarding it again",
            incoming.signal
        );
        return;
    }
    tracing::debug!("forwarding {} to the command", incoming.signal);
    target.forward(incoming.signal);
}

/// How long the sweep waits for processes on their way out of the job's group.
const SETTLE: Duration = Duration::from_millis(100);

/// After the child's exit, and a short settle: whatever is left of the job gets the kill
/// signal, SIGKILL K later (again at every wake-up, for anything forked meanwhile), while the
/// lease is still kept; returns only once nothing is left, so the lock is never released under
/// a live process.
pub async fn drain<F: Future<Output = ()>, C: Clock, P: Reap, K: Kill, E: Events>(
    clock: &C,
    child: &mut P,
    target: K,
    cfg: &RunConfig,
    signals: &mut E,
    mut keeper: Pin<&mut F>,
    interactive: bool,
) {
    let left = |child: &mut P| {
        let children_remain = child.reap().unwrap_or(true);
        target.anything_left(children_remain)
    };
    if !left(child) {
        return;
    }
    settle(clock, target, signals, keeper.as_mut(), interactive).await;
    if !left(child) {
        return;
    }
    tracing::warn!(
        "the command exited and left processes behind: {}; sending them {} (a process meant to \
         outlive the job must call setsid)",
        target.leftovers(),
        cfg.kill_signal
    );
    target.terminate(cfg.kill_signal);
    let kill_at = clock.now() + cfg.timings.kill_after;
    let mut killed = false;
    let mut next_warning = kill_at + Duration::from_secs(30);
    loop {
        // SIGCHLD says when an inherited process dies; the tick covers members whose parent
        // is another member, which reaps them without telling us.
        let tick = clock.now() + Duration::from_millis(250);
        let wake = if killed { tick } else { tick.min(kill_at) };
        tokio::select! {
            () = keeper.as_mut() => {}
            event = signals.next_event() => {
                if let Event::Signal(incoming) = event {
                    forward(target, incoming, interactive);
                }
            }
            () = clock.sleep_until(wake) => {}
        }
        if !left(child) {
            return;
        }
        let now = clock.now();
        if now >= kill_at {
            if !killed {
                tracing::info!(
                    "processes left by the command survived {}; sending SIGKILL",
                    cfg.kill_signal
                );
                killed = true;
            }
            target.signal(Signal::SIGKILL);
        }
        if now >= next_warning {
            tracing::warn!(
                "processes left by the command survive SIGKILL (another user's, or stuck in the kernel); \
                 keeping lock {} until they are gone",
                cfg.name
            );
            next_warning = now + Duration::from_secs(60);
        }
    }
}

/// A process on its way out of the group (`setsid -f`, `cmd &` then `setsid`) may not have left
/// it yet when the main process exits: it is given [`SETTLE`], while the lease is kept and
/// signals are passed on, and what left meanwhile is let go.
async fn settle<F: Future<Output = ()>, C: Clock, K: Kill, E: Events>(
    clock: &C,
    target: K,
    signals: &mut E,
    mut keeper: Pin<&mut F>,
    interactive: bool,
) {
    let settled = clock.now() + SETTLE;
    loop {
        tokio::select! {
            () = keeper.as_mut() => {}
            event = signals.next_event() => {
                if let Event::Signal(incoming) = event {
                    forward(target, incoming, interactive);
                }
            }
            () = clock.sleep_until(settled) => return,
        }
    }
}
