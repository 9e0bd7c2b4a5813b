//! Waiting for the lock: one attempt, then (unless `--no-wait`) a confirmed subscription to the
//! release channel and a sleep until a release message, the holder's expiry plus a little
//! jitter, the `--wait` deadline or a signal, whichever comes first. No polling: a waiter asks
//! the server again only when something may have changed.

use std::fmt::Write as _;
use std::time::Duration;

use crate::backend::{Attempt, Backend, BackendError, Busy, Expiry, KEEP_ALIVE, Wakeup, Wakeups};
use crate::config::Patience;
use crate::config::RunConfig;
use crate::exit::{Exit, Failure};
use crate::lease::{Clock, show};
use crate::name::LockName;
use crate::notify;
use crate::signals::Signals;

/// A lock just taken.
#[derive(Clone, Copy, Debug)]
pub struct Acquired {
    pub fence: u64,
    /// Clock reading taken before the granting request was sent: the lease runs from here.
    pub sent: Duration,
    pub waited: Duration,
}

/// Back-off after a failed attempt while waiting, and for a holder's key without expiry.
const RETRY_FIRST: Duration = Duration::from_millis(50);
const RETRY_CAP: Duration = Duration::from_secs(2);

/// How long to sleep on a lock with no expiry of its own when the backend wakes waiters
/// exactly (flock): only a safety net.
const SAFETY_NAP: Duration = Duration::from_secs(60);

/// Takes the lock, waiting as `patience` allows. A grant that leaves less of the lease than
/// R + K (a server that took that long to answer) is given back and counts as a failure.
pub async fn acquire<B: Backend, C: Clock>(
    backend: &B,
    clock: &C,
    cfg: &RunConfig,
    signals: &mut Signals,
) -> Result<Acquired, Failure> {
    let (name, patience, timings, holders) = (&cfg.name, cfg.patience, cfg.timings, cfg.holders);
    let start = clock.now();
    let deadline = match patience {
        Patience::For(d) => Some(start + d),
        _ => None,
    };
    let mut waiter = Waiter {
        backend,
        name,
        maybe_held: false,
    };
    let mut wakeups: Option<B::Wakeups<'_>> = None;
    let mut subscribe_after = start;
    let mut answered = false;
    let mut last_busy: Option<Busy> = None;
    let mut last_error: Option<BackendError>;
    let mut retries = 0u32;
    let mut no_expiry_retries = 0u32;
    loop {
        let sent = clock.now();
        let attempt = tokio::select! {
            biased;
            signal = signals.next_ending_wait() => {
                // The attempt in flight may have been granted.
                waiter.maybe_held = true;
                return Err(waiter.give_back(interrupted(signal, name)).await);
            }
            attempt = backend.try_acquire(&timings, patience != Patience::NoWait) => attempt,
        };
        let answer: Result<Busy, BackendError> = match attempt {
            Ok(Attempt::Acquired { fence }) => {
                let now = clock.now();
                let left = timings.valid_until(sent).saturating_sub(now);
                if !backend.has_lease() || left >= timings.renew_every + timings.kill_after {
                    return Ok(Acquired {
                        fence,
                        sent,
                        waited: sent.saturating_sub(start),
                    });
                }
                // Too little of the lease is left to run anything: give it back now rather
                // than hold it while running nothing, then try again, with a fresh token (the
                // give-back may land late: it must not delete what the next attempt takes).
                if let Err(e) = backend.give_back(GIVE_BACK_TIMEOUT).await {
                    tracing::info!("could not give back lock {name} granted too late: {e}");
                }
                waiter.maybe_held = false;
                Err(BackendError::Transient(format!(
                    "Redis took {} to grant lock {name}, leaving {} of the lease, less than \
                     --renew-every + --kill-after",
                    show(now.saturating_sub(sent)),
                    show(left)
                )))
            }
            Ok(Attempt::Busy(busy)) => Ok(busy),
            Ok(Attempt::Mismatch { holders: theirs }) => {
                let message = format!(
                    "lock {name} is held by runs with --holders {theirs}, and this run asks for \
                     --holders {holders}: every run of one NAME must use the same --holders (a \
                     run without it, or a program using the plain SET NX protocol, counts as 1); \
                     nothing was run"
                );
                return Err(waiter.give_back(Failure::usage(message)).await);
            }
            Err(error) => Err(error),
        };
        let nap = match answer {
            Ok(busy) => {
                answered = true;
                retries = 0;
                last_error = None;
                if patience == Patience::NoWait {
                    let message = format!("lock {name} is {busy}; not waiting (--no-wait)");
                    return Err(waiter
                        .give_back(Failure::new(Exit::Conflict, message).quiet())
                        .await);
                }
                if wakeups.is_none() && clock.now() >= subscribe_after {
                    let subscribed = tokio::select! {
                        biased;
                        signal = signals.next_ending_wait() => {
                            return Err(waiter.give_back(interrupted(signal, name)).await);
                        }
                        subscribed = backend.subscribe() => subscribed,
                    };
                    match subscribed {
                        Ok((w, covered)) => {
                            wakeups = Some(w);
                            if !covered {
                                // Listening only now: ask again, so a release between the
                                // answer and the subscription is not missed.
                                last_busy = Some(busy);
                                continue;
                            }
                        }
                        Err(e) => {
                            // The server did answer: at the deadline this is still a conflict.
                            tracing::info!("cannot subscribe to release messages: {e}");
                            subscribe_after = clock.now() + RETRY_CAP;
                        }
                    }
                }
                let nap = match busy.expiry {
                    // Not listening (the subscription broke, or was refused): no release
                    // message can cut the nap short, so it is a poll, every 2 s at most.
                    Expiry::In(d) if wakeups.is_none() => (d + jitter(d)).min(RETRY_CAP),
                    Expiry::In(d) => d + jitter(d),
                    // Free, but the first waiter in the queue goes first: it is woken by name;
                    // should it be gone, its place lapses after `retry_in`.
                    Expiry::Queued { retry_in, .. } => retry_in + jitter(retry_in),
                    // The wake-up comes when the holder lets go; the nap is a safety net
                    // (and, without wake-ups, a slow poll).
                    Expiry::WithHolder if wakeups.is_some() => SAFETY_NAP,
                    Expiry::WithHolder => RETRY_CAP,
                    Expiry::Never => {
                        if no_expiry_retries == 0 {
                            tracing::info!(
                                "lock {name} is held with no expiry (set by another tool?); \
                                 checking again with back-off"
                            );
                        }
                        no_expiry_retries += 1;
                        backoff(no_expiry_retries)
                    }
                };
                // A place in the queue lapses unless asked for again: a heartbeat, not a poll
                // (release messages still wake the waiter whose turn it is).
                let nap = match backend.queues() {
                    true => nap.min(KEEP_ALIVE / 3),
                    false => nap,
                };
                tracing::debug!(
                    event = "waiting",
                    holder_fence = busy.holder.fence,
                    "lock {name} is {busy}; sleeping up to {}",
                    show(nap)
                );
                notify::send(&format!(
                    "STATUS=waiting for lock {name} ({})",
                    holder_words(&busy)
                ));
                last_busy = Some(busy);
                nap
            }
            Err(error) => {
                if error.is_transient() {
                    // Sent but unanswered: the server may have granted it all the same.
                    waiter.maybe_held = true;
                }
                if !answered || !error.is_transient() || patience == Patience::NoWait {
                    let message = format!("{error}; nothing was run");
                    return Err(waiter.give_back(Failure::unavailable(message)).await);
                }
                tracing::info!("lost contact while waiting for lock {name}: {error}; retrying");
                wakeups = None;
                last_error = Some(error);
                retries += 1;
                backoff(retries)
            }
        };
        let now = clock.now();
        let nap = match deadline {
            Some(deadline) if now >= deadline => {
                return Err(waiter.give_back(gave_up(cfg, last_busy, last_error)).await);
            }
            Some(deadline) => nap.min(deadline - now),
            None => nap,
        };
        let wake_at = tokio::time::Instant::now() + nap;
        loop {
            tokio::select! {
                biased;
                signal = signals.next_ending_wait() => {
                    return Err(waiter.give_back(interrupted(signal, name)).await);
                }
                woke = next_wakeup(&mut wakeups) => match woke {
                    // Another waiter's turn: only it need ask; this one sleeps on.
                    Ok(wakeup) if !wakeup.for_me(&backend.token(), backend.races()) => continue,
                    Ok(_) => break,
                    Err(e) => {
                        // Resubscribe after a pause, not at once: a subscription that breaks
                        // as soon as it is made must not turn into a busy loop.
                        tracing::info!("{e}; resubscribing");
                        wakeups = None;
                        subscribe_after = clock.now() + RETRY_CAP;
                        break;
                    }
                },
                () = tokio::time::sleep_until(wake_at) => {
                    if deadline.is_some_and(|d| clock.now() >= d) {
                        return Err(waiter.give_back(gave_up(cfg, last_busy, last_error)).await);
                    }
                    break;
                }
            }
        }
    }
}

/// Gives back, on every way out without the lock, what an unanswered attempt may have taken
/// and the place in the queue it may hold: the give-back compares our token, so it is harmless
/// when nothing was taken, and buries the token, so an attempt still on its way takes nothing.
struct Waiter<'a, B> {
    backend: &'a B,
    name: &'a LockName,
    maybe_held: bool,
}

impl<B: Backend> Waiter<'_, B> {
    async fn give_back(&self, failure: Failure) -> Failure {
        // A place in the queue is left at once: the next waiter need not wait for it to lapse.
        if self.maybe_held || self.backend.queues() {
            match self.backend.give_back(GIVE_BACK_TIMEOUT).await {
                Ok(true) => {
                    tracing::info!("released lock {} taken by an unanswered attempt", self.name)
                }
                Ok(false) => {}
                Err(e) => tracing::info!(
                    "could not give back what this run may hold of lock {} ({e}); a place in \
                     the queue lapses within {}, a lock taken within the lease",
                    self.name,
                    show(KEEP_ALIVE)
                ),
            }
        }
        failure
    }
}

/// How long the give-back may take when leaving without the lock.
const GIVE_BACK_TIMEOUT: Duration = Duration::from_secs(1);

async fn next_wakeup<W: Wakeups>(wakeups: &mut Option<W>) -> Result<Wakeup, BackendError> {
    match wakeups {
        Some(w) => w.next().await,
        None => std::future::pending().await,
    }
}

/// A little randomness so waiters that slept on the same expiry do not all ask at once.
fn jitter(pttl: Duration) -> Duration {
    let cap = (pttl.as_millis() as u64 / 50).clamp(2, 50);
    Duration::from_millis(fastrand::u64(1..=cap))
}

fn backoff(retries: u32) -> Duration {
    let exp = retries.saturating_sub(1).min(10);
    (RETRY_FIRST * (1u32 << exp)).min(RETRY_CAP)
}

fn interrupted(signal: nix::sys::signal::Signal, name: &LockName) -> Failure {
    Failure::new(
        Exit::Interrupted(signal as i32),
        format!("{signal} while waiting for lock {name}: nothing was run and nothing is held"),
    )
}

fn gave_up(cfg: &RunConfig, busy: Option<Busy>, error: Option<BackendError>) -> Failure {
    let name = &cfg.name;
    let waited = match cfg.patience {
        Patience::For(d) => show(d),
        _ => "the wait".into(),
    };
    match (error, busy) {
        (Some(error), _) => Failure::unavailable(format!(
            "gave up waiting for lock {name} after {waited}: {error}; nothing was run"
        )),
        (None, Some(busy)) => Failure::new(
            Exit::Conflict,
            format!(
                "gave up waiting for lock {name} after {waited}: it is {busy}; raise --wait, \
                 or see `{}`",
                cfg.status_command
            ),
        ),
        (None, None) => Failure::new(
            Exit::Conflict,
            format!("gave up waiting for lock {name} after {waited}"),
        ),
    }
}

/// "held by web-3 pid 4242, fence 17", for the unit's status line.
fn holder_words(busy: &Busy) -> String {
    let h = &busy.holder;
    let mut words = format!("held by {}", h.host.as_deref().unwrap_or("another program"));
    if let Some(pid) = h.pid {
        let _ = write!(words, " pid {pid}");
    }
    if let Some(fence) = h.fence {
        let _ = write!(words, ", fence {fence}");
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(50));
        assert_eq!(backoff(2), Duration::from_millis(100));
        assert_eq!(backoff(6), Duration::from_millis(1600));
        assert_eq!(backoff(7), RETRY_CAP);
        assert_eq!(backoff(1000), RETRY_CAP);
    }

    #[test]
    fn jitter_is_small() {
        for _ in 0..100 {
            let j = jitter(Duration::from_secs(30));
            assert!(j >= Duration::from_millis(1) && j <= Duration::from_millis(50));
            let j = jitter(Duration::from_millis(10));
            assert!(j >= Duration::from_millis(1) && j <= Duration::from_millis(2));
        }
    }
}
