//! The job: the command started under the lock (its environment, the watcher that outlives a
//! SIGKILLed wrapper, the spawn), and its one finish, which owns the order of the last steps:
//! the watcher disarmed once nothing of the job is left, the lock released (or left to expire
//! at the end of `--min-hold`), the watcher dismissed once the lock is free.

use std::path::Path;
use std::time::Duration;

use crate::backend::{Backend, Run, Tenure};
use crate::child::{self, Child, SpawnError, Target};
use crate::plumbing::clock::{BootClock, Clock};
use crate::plumbing::exit::{Exit, Failure};
use crate::session::config::RunConfig;
use crate::text::show;
use crate::watcher::Watcher;

use super::supervised::{Kill, Watching};
use super::waiter::Acquired;

/// A command running under the lock: its main process, where its signals go, and its
/// watcher. The parts are the real ones but in paused-time tests (see [`super::supervised`]).
pub struct Job<P = Child, K = Target, W = Watcher> {
    pub child: P,
    pub target: K,
    pub interactive: bool,
    watcher: Option<W>,
}

impl Job {
    /// Starts `cfg.command` (found at `program`) with the lock's environment, unless the
    /// lease clock's kill-signal point `start_by` (a lease's; none for a lock the kernel
    /// holds) has passed by the instant it would exec (see [`child::spawn`]). `early`: a
    /// watcher started while the run waited, told `start_by` now. A spawn that starts nothing
    /// releases the lock before its failure is returned.
    pub async fn start(
        backend: &dyn Backend,
        cfg: &RunConfig,
        program: &Path,
        acquired: &Acquired,
        start_by: Option<Duration>,
        early: Option<Watcher>,
    ) -> Result<Job, Failure> {
        let interactive = child::interactive();
        child::become_subreaper();
        // Read by the command, never read back by a locked-run it starts (no option of ours
        // has an environment variable of these names).
        let env = [
            ("LOCKED_RUN_FENCE", acquired.fence.to_string()),
            ("LOCKED_RUN_NAME", cfg.name.to_string()),
            ("LOCKED_RUN_KEY", backend.key().to_owned()),
            ("LOCKED_RUN_TOKEN", backend.token()),
            ("LOCKED_RUN_TTL_MS", cfg.timings.ttl.as_millis().to_string()),
            ("LOCKED_RUN_HOLDERS", cfg.holders.to_string()),
            ("LOCKED_RUN_SHARED", u8::from(cfg.shared).to_string()),
        ];
        // In a terminal the job shares our group, which is the terminal's to handle: the
        // child names no session to the watcher then, which only guards the start.
        // A lock the kernel holds for an open file is kept by the watcher's copy of it too.
        let keep_descriptors = backend.tenure() == Tenure::Kernel;
        let watcher = match early {
            Some(watcher) => watcher.arm(start_by),
            None => Watcher::start(start_by, keep_descriptors, 0),
        };
        let watcher = watcher
            .inspect_err(|e| {
                tracing::warn!(
                    "cannot start the watcher ({e}): should locked-run be SIGKILLed, \
                     processes its command started may outlive it"
                )
            })
            .ok();
        let watched = watcher.as_ref().map(|w| child::Watched {
            session: w.session(),
            pre_exec: w.pre_exec(),
            killed_before_exec: w.killed_before_exec(),
        });
        match child::spawn(program, &cfg.command, &env, interactive, watched, start_by) {
            Ok((child, target)) => Ok(Job::new(child, target, interactive, watcher)),
            Err(e) => {
                // Late, the lease may be gone: a release that finds it so is no news.
                let (failure, late) = match e {
                    SpawnError::Failed(failure) => (failure, false),
                    SpawnError::Late => (late_start(cfg, acquired), true),
                };
                let lost = late.then_some(cfg.release_timeout);
                finish(backend, cfg, watcher, None, lost, None).await;
                Err(failure)
            }
        }
    }
}

impl<P, K: Kill, W: Watching> Job<P, K, W> {
    /// A job of these parts; `watcher`, if one could be started.
    pub fn new(child: P, target: K, interactive: bool, watcher: Option<W>) -> Job<P, K, W> {
        Job {
            child,
            target,
            interactive,
            watcher,
        }
    }

    /// The child, and what keeps the job watched ([`Rewatch`]), borrowed apart so that both
    /// can be used at once.
    pub fn split(&mut self) -> (&mut P, Rewatch<'_, W>) {
        let session = match (self.target.own_session(), self.interactive) {
            (Some(session), false) => session.as_raw(),
            _ => 0,
        };
        let rewatch = Rewatch {
            watcher: &mut self.watcher,
            session,
        };
        (&mut self.child, rewatch)
    }

    /// Nothing of the job is left for the watcher to kill: from now on it leaves the session
    /// alone, should the wrapper die before the release.
    pub fn disarm(&self) {
        if let Some(watcher) = &self.watcher {
            watcher.disarm();
        }
    }

    /// Releases (or leaves to expire after `keep_for`) and lets the watcher go; returns
    /// whether the lock was still ours, when known. `lost`: the lease was lost, and lapses on
    /// the server within this much.
    pub async fn finish(
        self,
        backend: &dyn Backend,
        cfg: &RunConfig,
        keep_for: Option<Duration>,
        lost: Option<Duration>,
        run: Option<&Run>,
    ) -> Option<bool> {
        finish(backend, cfg, self.watcher, keep_for, lost, run).await
    }
}

/// The job's watcher, for as long as something of the job may be left (the command, then what
/// it left behind, until the sweep is done).
pub struct Rewatch<'a, W = Watcher> {
    watcher: &'a mut Option<W>,
    /// The job's session (0: in a terminal, the job has none of its own).
    session: libc::pid_t,
}

impl<W: Watching> Rewatch<'_, W> {
    /// Never returns: should the watcher die (killed by hand, say), it is reaped and another
    /// is started, told the job's session, so that a wrapper SIGKILLed later still leaves
    /// nothing of the job running. The watcher's exit is read from a pidfd; without pidfds
    /// (before Linux 5.3) this only waits.
    pub async fn keep_watching(mut self) {
        let mut exits = self.watcher.as_ref().map(W::exit);
        loop {
            match exits {
                Some(exit) => W::exited(exit).await,
                None => std::future::pending().await,
            }
            exits = self.replace();
        }
    }

    fn replace(&mut self) -> Option<W::Exit> {
        let old = self.watcher.take()?;
        let pid = old.pid();
        let new = match W::replace(old, self.session) {
            Ok(new) => new,
            Err(e) => {
                tracing::warn!(
                    "the watcher died while the command ran (pid {pid}), and another cannot be \
                     started ({e}): should locked-run be SIGKILLed, processes its command \
                     started may outlive it"
                );
                return None;
            }
        };
        tracing::warn!(
            "the watcher died while the command ran (pid {pid}); started another (pid {})",
            new.pid()
        );
        let exits = new.exit();
        *self.watcher = Some(new);
        Some(exits)
    }
}

/// The run's end when the lease reached its kill-signal point before the command could start.
fn late_start(cfg: &RunConfig, acquired: &Acquired) -> Failure {
    Failure::new(
        Exit::Lost,
        format!(
            "lost the lock {} before the command could start: {} passed between asking for it \
             and the start, past the point where the command would be stopped (a slow server or \
             network, a program slow to load, an overloaded machine, or locked-run paused); \
             nothing was run",
            cfg.name,
            show(BootClock.now().saturating_sub(acquired.sent))
        ),
    )
}

/// Disarm, release, dismiss, in that order: the watcher must not kill a session that is gone
/// (its pids may be reused), and the next holder need not wait for this process to exit.
async fn finish<W: Watching>(
    backend: &dyn Backend,
    cfg: &RunConfig,
    watcher: Option<W>,
    keep_for: Option<Duration>,
    lost: Option<Duration>,
    run: Option<&Run>,
) -> Option<bool> {
    if let Some(watcher) = &watcher {
        watcher.disarm();
    }
    let still_ours = release(backend, cfg, keep_for, lost, run).await;
    if let Some(watcher) = watcher {
        watcher.dismiss();
    }
    still_ours
}

/// Releases (or, with `keep_for`, leaves to expire later); a failure is only a warning, since
/// the lease expires by itself, and not even that after a loss, which has its own line. After
/// a loss the release is tried no longer than the lease may live on (at least 100 ms): past
/// that it could only find the key gone, and a server gone silent held the run's end (and its
/// status, 76) up for the whole release timeout.
async fn release(
    backend: &dyn Backend,
    cfg: &RunConfig,
    keep_for: Option<Duration>,
    lost: Option<Duration>,
    run: Option<&Run>,
) -> Option<bool> {
    let timeout = match lost {
        Some(lapses_in) => cfg
            .release_timeout
            .min(lapses_in.max(Duration::from_millis(100))),
        None => cfg.release_timeout,
    };
    let lost = lost.is_some();
    match backend.release(keep_for, timeout, run).await {
        Ok(ours) => {
            tracing::debug!(
                event = "released",
                still_ours = ours,
                kept_ms = keep_for.map(|d| d.as_millis() as u64),
                "released lock {} (ours: {ours})",
                cfg.name
            );
            Some(ours)
        }
        Err(e) if lost => {
            tracing::info!("could not release lock {}: {e}", cfg.name);
            None
        }
        Err(e) => {
            tracing::warn!(
                "could not release lock {}: {e}; it expires by itself within {}",
                cfg.name,
                show(cfg.timings.ttl.max(keep_for.unwrap_or_default()))
            );
            None
        }
    }
}
