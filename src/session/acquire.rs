//! Taking the lock: the driver of the pure [`Waiter`]. It sends what the waiter asks for
//! (attempts, a subscription, a give-back), sleeps on the [`Clock`] until the waiter's next
//! reading, a release message for this run or a signal, and reports back. No polling: a waiter
//! asks the server again only when something may have changed.

use std::future::Future;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::backend::{Backend, Tenure, Wakeups};
use crate::observe::notify;
use crate::plumbing::clock::Clock;
use crate::plumbing::exit::Failure;
use crate::plumbing::signals::Signals;
use crate::session::config::Wait;
use crate::text::show;

use super::progress::{Progress, Watched};
use super::waiter::{Acquired, Facts, Next, Waiter, Woke};

/// How long a give-back may take when leaving without the lock.
pub const GIVE_BACK_TIMEOUT: Duration = Duration::from_secs(1);

/// The signals that end a wait (TERM, INT, HUP, QUIT).
pub trait Interrupts {
    fn next_ending_wait(&mut self) -> impl Future<Output = Signal>;
}

impl Interrupts for Signals {
    async fn next_ending_wait(&mut self) -> Signal {
        Signals::next_ending_wait(self).await
    }
}

/// Takes the lock, waiting as `ask.patience` allows. A grant that leaves less of the lease than
/// R + K + D (a server that took that long to answer) is given back and counts as a failure.
pub async fn acquire<C: Clock, I: Interrupts>(
    backend: &dyn Backend,
    clock: &C,
    ask: Wait<'_>,
    interrupts: &mut I,
) -> Result<Acquired, Failure> {
    acquire_with(backend, clock, ask, interrupts, || {}).await
}

/// [`acquire`], calling `while_waiting` once, as the run first sleeps on a busy lock: what the
/// start of the command needs and the grant does not can be readied then, off the path from a
/// release to the next command's start.
pub async fn acquire_with<C: Clock, I: Interrupts>(
    backend: &dyn Backend,
    clock: &C,
    ask: Wait<'_>,
    interrupts: &mut I,
    while_waiting: impl FnOnce(),
) -> Result<Acquired, Failure> {
    let mut while_waiting = Some(while_waiting);
    let mut waiter = Waiter::new(ask, clock.now());
    let mut progress = Watched::now().map(|w| Progress::new(clock.now(), w));
    let acquired = wait(
        backend,
        clock,
        &ask,
        interrupts,
        &mut waiter,
        &mut while_waiting,
        &mut progress,
    )
    .await;
    if progress.is_some_and(|p| p.said && p.watched == Watched::Terminal) {
        crate::plumbing::log::progress_done();
    }
    acquired
}

/// The driver's loop, until the lock is held or the wait ends.
async fn wait<C: Clock, I: Interrupts>(
    backend: &dyn Backend,
    clock: &C,
    ask: &Wait<'_>,
    interrupts: &mut I,
    waiter: &mut Waiter<'_>,
    while_waiting: &mut Option<impl FnOnce()>,
    progress: &mut Option<Progress>,
) -> Result<Acquired, Failure> {
    let mut wakeups: Option<Box<dyn Wakeups + '_>> = None;
    let mut next = Next::Try;
    loop {
        next = match next {
            Next::Try => attempt(backend, clock, ask, interrupts, waiter).await,
            Next::Subscribe => tokio::select! {
                biased;
                signal = interrupts.next_ending_wait() => Next::Fail(waiter.interrupted(signal, false)),
                subscribed = backend.subscribe() => {
                    let covered = subscribed.map(|(w, covered)| {
                        wakeups = Some(w);
                        covered
                    });
                    waiter.subscribed(clock.now(), covered)
                }
                () = until(clock, waiter.deadline()) => waiter.ran_out_subscribing(),
            },
            Next::GiveBack => {
                if let Err(e) = backend.give_back(GIVE_BACK_TIMEOUT).await {
                    tracing::info!(
                        "could not give back lock {} granted too late: {e}",
                        ask.name
                    );
                }
                waiter.gave_back(clock.now())
            }
            Next::Sleep(until) => {
                if let Some(ready) = while_waiting.take() {
                    ready();
                }
                let said_at = progress.as_ref().map(Progress::due);
                let why = tokio::select! {
                    biased;
                    signal = interrupts.next_ending_wait() => {
                        next = Next::Fail(waiter.interrupted(signal, false));
                        continue;
                    }
                    woke = next_for_me(backend, &mut wakeups) => woke,
                    () = clock.sleep_until(until) => Woke::Time,
                    () = until_some(clock, said_at) => {
                        if let Some(p) = progress.as_mut() {
                            let line = p.line(clock.now(), ask.name, waiter.last_busy());
                            crate::plumbing::log::progress(&line, p.watched == Watched::Terminal);
                        }
                        next = Next::Sleep(until);
                        continue;
                    }
                };
                waiter.woke(clock.now(), why)
            }
            Next::Hold(acquired) => return Ok(acquired),
            Next::Fail(failure) => return Err(give_back(backend, ask, waiter, failure).await),
        };
        // Said as soon as the waiter decides it, before its next step is carried out.
        if let Some(status) = waiter.unit_status() {
            notify::send(&format!("STATUS={status}"));
        }
        if !waiter.listening() {
            wakeups = None;
        }
    }
}

/// One attempt, and what the waiter makes of its answer; unless a signal, or the `--wait`
/// deadline, ends the wait while it is in flight.
async fn attempt<C: Clock, I: Interrupts>(
    backend: &dyn Backend,
    clock: &C,
    ask: &Wait<'_>,
    interrupts: &mut I,
    waiter: &mut Waiter<'_>,
) -> Next {
    waiter.sending(clock.now());
    tokio::select! {
        biased;
        // The attempt in flight may have been granted.
        signal = interrupts.next_ending_wait() => Next::Fail(waiter.interrupted(signal, true)),
        attempt = backend.try_acquire(&ask.timings, waiter.listens()) => {
            let facts = Facts { lease: backend.tenure() == Tenure::Lease, queued: backend.queues() };
            waiter.answered(clock.now(), attempt, facts)
        }
        // A server that stopped answering must not stretch `--wait`.
        () = until(clock, waiter.deadline()) => Next::Fail(waiter.ran_out_in_flight(clock.now())),
    }
}

/// Sleeps until `at`; never, without it.
async fn until_some<C: Clock>(clock: &C, at: Option<Duration>) {
    match at {
        Some(at) => clock.sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`; never, without one.
async fn until<C: Clock>(clock: &C, deadline: Option<Duration>) {
    match deadline {
        Some(deadline) => clock.sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// The next release message meant for this run (another waiter's turn is slept through); never,
/// when not listening.
async fn next_for_me(backend: &dyn Backend, wakeups: &mut Option<Box<dyn Wakeups + '_>>) -> Woke {
    let Some(w) = wakeups else {
        return std::future::pending().await;
    };
    loop {
        match w.next().await {
            Ok(wakeup) if wakeup.for_me(&backend.token(), backend.races()) => return Woke::Message,
            Ok(_) => continue,
            Err(e) => return Woke::Broke(e),
        }
    }
}

/// On every way out without the lock: what an unanswered attempt may have taken, and the
/// place in the queue, are given back (harmless when nothing was taken), and the token is
/// buried, so an attempt still on its way takes nothing.
async fn give_back(
    backend: &dyn Backend,
    ask: &Wait<'_>,
    waiter: &Waiter<'_>,
    mut failure: Failure,
) -> Failure {
    if waiter.must_give_back() {
        match backend.give_back(GIVE_BACK_TIMEOUT).await {
            Ok(true) => {
                tracing::info!("released lock {} taken by an unanswered attempt", ask.name);
                // Given back: whatever the attempt took, nothing is held now (an etcd lease
                // granted, then a take that went unanswered, revoked).
                if failure.message.ends_with("; nothing was run") {
                    failure.message.push_str(" and nothing is held");
                }
            }
            // Nothing was held, and the token is buried: nothing can be taken any more. A
            // first contact that failed says so, as one with nothing to give back does.
            Ok(false) if failure.message.ends_with("; nothing was run") => {
                failure.message.push_str(" and nothing was taken");
            }
            Ok(false) => {}
            // The line that ends the run must not say "nothing is held" then: a place kept
            // (on etcd, a key that heads the queue once those before it go) or a lock taken
            // by an unanswered attempt stays until it lapses.
            Err(e) => {
                let said = failure.message.trim_end_matches(" and nothing is held");
                // The same refusal (a password, a wrong port) said once, not twice in a line.
                let why = e.to_string();
                let why = match said.contains(&why) {
                    true => "for the same reason".to_owned(),
                    false => format!("({why})"),
                };
                // In words true of every backend: a place in Redis's queue lapses after
                // KEEP_ALIVE, one in etcd's line with its lease, a lock with its lease.
                failure.message = format!(
                    "{said}; what this run may hold of it could not be given back {why}: it \
                     lapses by itself, within the lease or {}, whichever is longer",
                    show(crate::backend::KEEP_ALIVE)
                );
            }
        }
    }
    failure
}
