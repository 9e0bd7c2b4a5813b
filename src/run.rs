//! The run loop: take the lock, run the child under the lease, reap what it leaves, release,
//! and say how it ended. It does not care which backend holds the lock.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::pin::{Pin, pin};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::backend::Backend;
use crate::child::{self, Child, Target};
use crate::config::RunConfig;
use crate::exit::{Exit, Failure};
use crate::lease::{self, BootClock, Clock, LeaseClock, Renew, Stopper, Timings, Why, show};
use crate::notify;
use crate::session;
use crate::signals::{Event, Incoming, Signals};
use crate::watcher::Watcher;

/// Runs `cfg.command`, found at `program` ([`child::resolve`]), under the lock held by
/// `backend`.
pub async fn run<B: Backend>(
    backend: &B,
    cfg: &RunConfig,
    program: &Path,
) -> Result<Exit, Failure> {
    let mut signals = Signals::install()
        .map_err(|e| Failure::unavailable(format!("cannot install signal handlers: {e}")))?;
    let clock = BootClock;
    let acquired = session::acquire(backend, &clock, cfg, &mut signals).await?;
    tracing::info!(
        event = "acquired",
        fence = acquired.fence,
        waited_ms = acquired.waited.as_millis() as u64,
        "acquired lock {} with fence {} after waiting {}",
        cfg.name,
        acquired.fence,
        show(acquired.waited)
    );

    let interactive = child::interactive();
    child::become_subreaper();
    let env = [
        ("LOCKED_RUN_FENCE", acquired.fence.to_string()),
        ("LOCKED_RUN_NAME", cfg.name.to_string()),
        ("LOCKED_RUN_KEY", backend.key().to_owned()),
        ("LOCKED_RUN_TOKEN", backend.token().to_owned()),
        ("LOCKED_RUN_TTL_MS", cfg.timings.ttl.as_millis().to_string()),
        ("LOCKED_RUN_HOLDERS", cfg.holders.to_string()),
    ];
    // In a terminal the job shares our group, which is the terminal's to handle.
    let watcher = match interactive {
        true => None,
        false => Watcher::start()
            .inspect_err(|e| {
                tracing::warn!(
                    "cannot start the watcher ({e}): should locked-run be SIGKILLed, processes its \
                     command started may outlive it"
                )
            })
            .ok(),
    };
    let spawned = child::spawn(
        program,
        &cfg.command,
        &env,
        interactive,
        watcher.as_ref().map(Watcher::group),
    );
    let (mut child, target) = match spawned {
        Ok(spawned) => spawned,
        Err(failure) => {
            if let Some(watcher) = &watcher {
                watcher.disarm();
            }
            release(backend, cfg, None, false).await;
            if let Some(watcher) = watcher {
                watcher.dismiss();
            }
            return Err(failure);
        }
    };

    let stopper = ChildStopper {
        target,
        signal: cfg.kill_signal,
        reason: Cell::new(None),
        first_signal: Cell::new(None),
        ran_out: Cell::new(false),
    };
    let started = clock.now();
    let lease = RefCell::new(LeaseClock::new(cfg.timings, acquired.sent));
    let renewer = Renewer(backend, cfg.timings);
    notify::send(&format!(
        "READY=1\nSTATUS=holding lock {} (fence {})",
        cfg.name, acquired.fence
    ));
    let status = {
        let mut keeper = pin!(async {
            if backend.has_lease() {
                match lease::keep(&lease, &clock, &renewer, &stopper).await {}
            } else {
                std::future::pending::<()>().await
            }
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
        if backend.has_lease()
            && stopper.reason.get().is_none()
            && lease.borrow().expired(clock.now())
        {
            stopper.kill(Why::Late);
        }
        drain(
            &mut child,
            target,
            cfg,
            &mut signals,
            keeper.as_mut(),
            interactive,
        )
        .await;
        // Nothing of the job is left for the watcher to kill.
        if let Some(watcher) = &watcher {
            watcher.disarm();
        }
        status
    };

    if let Ok(status) = &status {
        tracing::info!(
            event = "child_exited",
            status = status.code(),
            signal = status.signal(),
            "the command {}",
            ended(status)
        );
    }
    let keep_for = cfg
        .min_hold
        .and_then(|hold| hold.checked_sub(clock.now().saturating_sub(acquired.sent)))
        .filter(|rest| !rest.is_zero());
    let still_ours = release(backend, cfg, keep_for, stopper.reason.get().is_some()).await;
    // Let go once the lock is free: the next holder need not wait for this process to exit.
    if let Some(watcher) = watcher {
        watcher.dismiss();
    }

    let status =
        status.map_err(|e| Failure::unavailable(format!("lost track of the child: {e}")))?;
    let ended = ended(&status);
    // Whichever stop began first says how the run ended.
    if stopper.ran_out.get() {
        let max_run = cfg.max_run.map(show).unwrap_or_default();
        return Err(Failure::new(
            Exit::TimedOut,
            format!(
                "the command ran longer than --max-run {max_run}; stopped it with {} (it {ended}); \
                 lock {} is released",
                cfg.kill_signal, cfg.name
            ),
        ));
    }
    if let Some(why) = stopper.reason.get() {
        let lease = lease.borrow();
        let cause = match why {
            Why::Expiring => format!(
                "the lease could not be renewed ({})",
                lease.last_error().unwrap_or("no answer")
            ),
            Why::NotOwner => {
                "Redis says it is no longer ours (expired, deleted or taken over)".into()
            }
            Why::Late => "locked-run was paused or suspended past the end of its lease".into(),
        };
        let first = stopper.first_signal.get().unwrap_or(Signal::SIGKILL);
        return Err(Failure::new(
            Exit::Lost,
            format!(
                "lost the lock {} while the command ran: {cause}; stopped it with {first} (it {ended}); \
                 its work may be incomplete",
                cfg.name
            ),
        ));
    }
    if still_ours == Some(false) {
        tracing::warn!(
            "lock {} was no longer ours when the command ended (deleted or taken over by another program?)",
            cfg.name
        );
    }
    Ok(match status.signal() {
        Some(sig) => Exit::ChildSignal(sig),
        None => Exit::Child(status.code().unwrap_or(1) as u8),
    })
}

/// Releases (or, with `keep_for`, leaves to expire later); a failure is only a warning, since
/// the lease expires by itself, and not even that after a loss, which has its own line.
/// Returns whether the lock was still ours, when known.
async fn release<B: Backend>(
    backend: &B,
    cfg: &RunConfig,
    keep_for: Option<Duration>,
    lost: bool,
) -> Option<bool> {
    match backend.release(keep_for, cfg.release_timeout).await {
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

fn forward(target: Target, incoming: Incoming, interactive: bool) {
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

/// After the child's exit, and a short settle: whatever is left of the job gets the kill signal, SIGKILL K later
/// (again at every wake-up, for anything forked meanwhile), while the lease is still kept;
/// returns only once nothing is left, so the lock is never released under a live process.
async fn drain<F: Future<Output = ()>>(
    child: &mut Child,
    target: Target,
    cfg: &RunConfig,
    signals: &mut Signals,
    mut keeper: Pin<&mut F>,
    interactive: bool,
) {
    let left = |child: &mut Child| {
        let children_remain = child.reap().unwrap_or(true);
        target.anything_left(children_remain)
    };
    if !left(child) {
        return;
    }
    // A process on its way out of the group (`setsid -f`, `cmd &` then `setsid`) may not have
    // left it yet when the main process exits: give it a moment, and let go of what left.
    let settled = Instant::now() + SETTLE;
    loop {
        tokio::select! {
            () = keeper.as_mut() => {}
            event = signals.next_event() => {
                if let Event::Signal(incoming) = event {
                    forward(target, incoming, interactive);
                }
            }
            () = tokio::time::sleep_until(settled) => break,
        }
    }
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
    let kill_at = Instant::now() + cfg.timings.kill_after;
    let mut killed = false;
    let mut next_warning = kill_at + Duration::from_secs(30);
    loop {
        // SIGCHLD says when an inherited process dies; the tick covers members whose parent
        // is another member, which reaps them without telling us.
        let tick = Instant::now() + Duration::from_millis(250);
        let wake = if killed { tick } else { tick.min(kill_at) };
        tokio::select! {
            () = keeper.as_mut() => {}
            event = signals.next_event() => {
                if let Event::Signal(incoming) = event {
                    forward(target, incoming, interactive);
                }
            }
            () = tokio::time::sleep_until(wake) => {}
        }
        if !left(child) {
            return;
        }
        let now = Instant::now();
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

struct ChildStopper {
    target: Target,
    signal: Signal,
    reason: Cell<Option<Why>>,
    /// The signal that began the stop, for the message that explains it.
    first_signal: Cell<Option<Signal>>,
    /// `--max-run` ran out before any lease loss began a stop.
    ran_out: Cell<bool>,
}

impl ChildStopper {
    fn begin(&self, why: Why, signal: Signal) {
        if self.reason.get().is_none() {
            self.reason.set(Some(why));
            self.first_signal.set(Some(signal));
            notify::send(&format!(
                "STATUS=lost the lock; stopping the command ({why:?})"
            ));
        }
        tracing::info!(
            event = "lost",
            why = ?why,
            signal = %signal,
            "stopping the command ({why:?}): sending {signal}"
        );
    }
}

impl ChildStopper {
    /// `--max-run` ran out: the kill signal, unless a stop for a lost lease is under way
    /// (its own deadlines stand, and it says how the run ended).
    fn time_limit(&self) {
        if self.reason.get().is_some() {
            return;
        }
        self.ran_out.set(true);
        tracing::info!(
            event = "max_run",
            signal = %self.signal,
            "the command has run for --max-run: sending {}",
            self.signal
        );
        notify::send("STATUS=--max-run ran out; stopping the command");
        self.target.terminate(self.signal);
    }

    /// `--kill-after` past `--max-run`: SIGKILL.
    fn time_limit_kill(&self) {
        if self.ran_out.get() {
            tracing::info!("the command outlived --max-run by --kill-after: sending SIGKILL");
            self.target.signal(Signal::SIGKILL);
        }
    }
}

impl Stopper for ChildStopper {
    fn terminate(&self, why: Why) {
        self.begin(why, self.signal);
        self.target.terminate(self.signal);
    }

    fn kill(&self, why: Why) {
        self.begin(why, Signal::SIGKILL);
        self.target.signal(Signal::SIGKILL);
    }
}

/// Renews through the backend with the run's timings, the ones the lease clock counts with.
struct Renewer<'a, B>(&'a B, Timings);

impl<B: Backend> Renew for Renewer<'_, B> {
    async fn renew(&self, timeout: Duration) -> Result<bool, String> {
        self.0
            .renew(&self.1, timeout)
            .await
            .map_err(|e| e.to_string())
    }
}

/// "exited with status 3", "was ended by SIGTERM".
fn ended(status: &std::process::ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was ended by {}", signal_name(sig)),
        _ => "ended".into(),
    }
}

fn signal_name(sig: i32) -> String {
    Signal::try_from(sig).map_or_else(|_| format!("signal {sig}"), |s| s.to_string())
}
