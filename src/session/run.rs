//! The run: take the lock, run the job under the lease, sweep what it leaves, finish, and say
//! how it ended. It does not care which backend holds the lock.

use std::cell::RefCell;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::pin::pin;
use std::process::ExitStatus;

use crate::backend::{Backend, Run, Tenure, user_name, wall_clock_ms};
use crate::lease::{self, LeaseClock, Stopper, Why};
use crate::observe::notify;
use crate::plumbing::clock::{BootClock, Clock};
use crate::plumbing::exit::{Exit, Failure};
use crate::plumbing::signals::{Event, Signals};
use crate::session::config::RunConfig;
use crate::text::show;
use crate::watcher::Watcher;

use super::acquire::acquire_with;
use super::ending::{Context, ended, ending};
use super::job::Job;
use super::record::{Held, record};
use super::stop::ChildStopper;
use super::supervised::{Events, Kill, Reap, Watching};
use super::sweep::{drain, forward};
use super::waiter::Acquired;

/// Runs `cfg.command`, found at `program` ([`crate::child::resolve`]), under the lock held by
/// `backend`; `started` is told the run's token once the command has started. With how the run
/// ended, its record when it took the lock (what its release added to the history).
pub async fn run(
    backend: &dyn Backend,
    cfg: &RunConfig,
    program: &Path,
    started: &dyn Fn(&str),
) -> (Result<Exit, Failure>, Option<Run>) {
    let mut run = None;
    let result = run_recording(backend, cfg, program, started, &mut run).await;
    (result, run)
}

async fn run_recording(
    backend: &dyn Backend,
    cfg: &RunConfig,
    program: &Path,
    started: &dyn Fn(&str),
    recorded: &mut Option<Run>,
) -> Result<Exit, Failure> {
    let mut signals = Signals::install()
        .map_err(|e| Failure::unavailable(format!("cannot install signal handlers: {e}")))?;
    backend.prepare()?;
    let clock = BootClock;
    // A run that has to wait starts its watcher meanwhile (a lease's watcher: `file://`'s
    // must copy the lock's descriptor, which exists once the lock is taken).
    let mut early = None;
    let lease_backed = backend.tenure() == Tenure::Lease;
    let acquired = acquire_with(backend, &clock, cfg.wait(), &mut signals, || {
        if lease_backed {
            early = Watcher::start(None, false, 0).ok();
        }
    })
    .await;
    let acquired = match acquired {
        Ok(acquired) => acquired,
        Err(failure) => {
            if let Some(watcher) = early {
                watcher.dismiss();
            }
            return Err(failure);
        }
    };
    tracing::info!(
        event = "acquired",
        fence = acquired.fence,
        waited_ms = acquired.waited.as_millis() as u64,
        "acquired lock {} with fence {} after waiting {}",
        cfg.name,
        acquired.fence,
        show(acquired.waited)
    );
    let started_ms = wall_clock_ms();
    let lease = RefCell::new(LeaseClock::new(cfg.timings, acquired.sent));
    let start_by = (backend.tenure() == Tenure::Lease).then(|| lease.borrow().term_point());
    let job = Job::start(backend, cfg, program, &acquired, start_by, early).await?;
    started(&backend.token());
    notify::send(&format!(
        "READY=1\nSTATUS=holding lock {} (fence {})",
        cfg.name, acquired.fence
    ));
    // Read while the command runs, not on the way from its end to the release.
    let held = Held {
        acquired: &acquired,
        started_ms,
        user: user_name(),
    };
    hold(
        &clock,
        backend,
        cfg,
        &held,
        &lease,
        job,
        &mut signals,
        recorded,
    )
    .await
}

/// The job under the lock, from its start to the run's end: supervised (the lease, `--max-run`,
/// the signals, the sweep), finished (disarm, release, dismiss), and its ending said. Generic
/// over the clock and the job's parts, so that paused-time tests drive it with a fake job.
#[allow(clippy::too_many_arguments)]
pub(super) async fn hold<C: Clock, P: Reap, K: Kill, W: Watching, E: Events>(
    clock: &C,
    backend: &dyn Backend,
    cfg: &RunConfig,
    held: &Held<'_>,
    lease: &RefCell<LeaseClock>,
    mut job: Job<P, K, W>,
    events: &mut E,
    recorded: &mut Option<Run>,
) -> Result<Exit, Failure> {
    let acquired = held.acquired;
    let stopper = ChildStopper::new(job.target, cfg.kill_signal);
    let status = supervise(clock, backend, cfg, lease, &stopper, &mut job, events).await;
    if let Ok(status) = &status {
        tracing::info!(
            event = "child_exited",
            status = status.code(),
            signal = status.signal(),
            "the command {}",
            ended(status)
        );
    }
    let stopping = stopper.stopping();
    let last_error = lease.borrow().last_error().map(str::to_owned);
    let cx = Context {
        name: &cfg.name,
        kill_signal: cfg.kill_signal,
        max_run: cfg.max_run,
        last_error: last_error.as_deref(),
    };
    let run = status
        .as_ref()
        .ok()
        .map(|&status| record(backend, cfg, held, stopping, status, &cx));
    // After a lost lease a failed release is expected (the loss has its own line), and is
    // tried no longer than the lease may still live on the server; after a --max-run stop it
    // is neither.
    let lapses_in = lease.borrow().lapsed_by().saturating_sub(clock.now());
    let still_ours = job
        .finish(
            backend,
            cfg,
            keep_for(cfg, clock, acquired),
            stopper.lost().then_some(lapses_in),
            run.as_ref(),
        )
        .await;
    *recorded = run;
    let status =
        status.map_err(|e| Failure::unavailable(format!("lost track of the child: {e}")))?;
    ending(stopping, status, still_ours, &cx)
}

/// The rest of `--min-hold` past now, if any: the lock is then left to expire, not deleted.
fn keep_for<C: Clock>(
    cfg: &RunConfig,
    clock: &C,
    acquired: &Acquired,
) -> Option<std::time::Duration> {
    cfg.min_hold
        .and_then(|hold| hold.checked_sub(clock.now().saturating_sub(acquired.sent)))
        .filter(|rest| !rest.is_zero())
}

/// Keeps the lease and the `--max-run` limit while the command runs, passes signals on, and
/// once the command has exited sweeps what it left; returns the command's status once nothing
/// of the job is left (the watcher disarmed).
async fn supervise<C: Clock, P: Reap, K: Kill, W: Watching, E: Events>(
    clock: &C,
    backend: &dyn Backend,
    cfg: &RunConfig,
    lease: &RefCell<LeaseClock>,
    stopper: &ChildStopper<K>,
    job: &mut Job<P, K, W>,
    signals: &mut E,
) -> std::io::Result<ExitStatus> {
    let started = clock.now();
    let renewer = super::Renewer(backend, cfg.timings);
    let (target, interactive) = (job.target, job.interactive);
    let (child, rewatch) = job.split();
    let status = {
        // The lease, and a watcher that dies replaced, until nothing of the job is left.
        let mut keeper = pin!(async {
            let lease = async {
                if backend.tenure() == Tenure::Lease {
                    match lease::keep(lease, clock, &renewer, stopper).await {}
                } else {
                    std::future::pending::<()>().await
                }
            };
            tokio::join!(lease, rewatch.keep_watching());
        });
        // --max-run: the kill signal once the command has run that long, SIGKILL K later.
        let mut limit = pin!(async {
            let Some(max_run) = cfg.max_run else {
                return std::future::pending().await;
            };
            clock.sleep_until(started + max_run).await;
            stopper.time_limit();
            clock
                .sleep_until(started + max_run + cfg.timings.kill_after)
                .await;
            stopper.time_limit_kill();
            std::future::pending::<()>().await
        });
        let status = loop {
            tokio::select! {
                biased;
                // Before the signals: a storm of them must not delay a lease deadline.
                () = &mut keeper => {}
                () = &mut limit => {}
                event = signals.next_event() => match event {
                    Event::Signal(incoming) => forward(target, incoming, interactive),
                    Event::ChildChanged => match child.reap() {
                        Ok(_) => {
                            if let Some(status) = child.status() {
                                break Ok(status);
                            }
                        }
                        Err(e) => break Err(e),
                    },
                },
            }
        };
        // A wrapper paused past V - D cannot vouch that the child ran under the lease.
        if backend.tenure() == Tenure::Lease
            && !stopper.lost()
            && lease.borrow().expired(clock.now())
        {
            stopper.kill(Why::Late);
        }
        drain(
            clock,
            child,
            target,
            cfg,
            signals,
            keeper.as_mut(),
            interactive,
        )
        .await;
        status
    };
    job.disarm();
    status
}
