//! Waiting for the lock: one attempt, then (unless `--no-wait`) a confirmed subscription to the
//! release channel and a sleep until a release message, the holder's expiry plus a little
//! jitter, the `--wait` deadline or a signal, whichever comes first. No polling: a waiter asks
//! the server again only when something may have changed.

use std::time::Duration;

use crate::backend::{Attempt, Backend, BackendError, Busy, Expiry, Wakeups};
use crate::exit::{Exit, Failure};
use crate::lease::{Clock, show};
use crate::name::LockName;
use crate::signals::Signals;

/// How long to wait for a held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patience {
    /// `-n`, `-w 0s`: fail at once (75), silently unless `-v`.
    NoWait,
    /// `-w DUR`.
    For(Duration),
    /// The default.
    Forever,
}

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

/// Takes the lock, waiting as `patience` allows.
pub async fn acquire<B: Backend, C: Clock>(
    backend: &B,
    clock: &C,
    name: &LockName,
    patience: Patience,
    signals: &mut Signals,
) -> Result<Acquired, Failure> {
    let start = clock.now();
    let deadline = match patience {
        Patience::For(d) => Some(start + d),
        _ => None,
    };
    let mut wakeups: Option<B::Wakeups> = None;
    let mut answered = false;
    let mut last_busy: Option<Busy> = None;
    let mut last_error: Option<BackendError>;
    let mut retries = 0u32;
    let mut told_no_expiry = false;
    loop {
        let sent = clock.now();
        let attempt = tokio::select! {
            biased;
            signal = signals.next_ending_wait() => {
                // The attempt in flight may have been granted: hand back whatever is ours.
                let _ = backend.release(None, Duration::from_secs(1)).await;
                return Err(interrupted(signal, name));
            }
            attempt = backend.try_acquire() => attempt,
        };
        let nap = match attempt {
            Ok(Attempt::Acquired { fence }) => {
                return Ok(Acquired {
                    fence,
                    sent,
                    waited: sent.saturating_sub(start),
                });
            }
            Ok(Attempt::Busy(busy)) => {
                answered = true;
                retries = 0;
                last_error = None;
                if patience == Patience::NoWait {
                    return Err(Failure::new(
                        Exit::Conflict,
                        format!("lock {name} is {busy}; not waiting (--no-wait)"),
                    )
                    .quiet());
                }
                if wakeups.is_none() {
                    match backend.subscribe().await {
                        Ok(w) => {
                            // Listening now: ask again, so a release between the first
                            // answer and the subscription is not missed.
                            wakeups = Some(w);
                            last_busy = Some(busy);
                            continue;
                        }
                        Err(e) => {
                            // The server did answer: at the deadline this is still a conflict.
                            tracing::info!("cannot subscribe to release messages: {e}");
                        }
                    }
                }
                let nap = match busy.expiry {
                    Expiry::In(d) => d + jitter(d),
                    Expiry::Never => {
                        if !told_no_expiry {
                            tracing::info!(
                                "lock {name} is held with no expiry (set by another tool?); \
                                 checking again with back-off"
                            );
                            told_no_expiry = true;
                        }
                        retries += 1;
                        backoff(retries)
                    }
                };
                tracing::debug!("lock {name} is {busy}; sleeping up to {}", show(nap));
                last_busy = Some(busy);
                nap
            }
            Err(error) => {
                if !answered || !error.is_transient() {
                    return Err(Failure::unavailable(format!("{error}; nothing was run")));
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
                return Err(gave_up(name, patience, last_busy, last_error));
            }
            Some(deadline) => nap.min(deadline - now),
            None => nap,
        };
        tokio::select! {
            biased;
            signal = signals.next_ending_wait() => return Err(interrupted(signal, name)),
            woke = next_wakeup(&mut wakeups) => {
                if let Err(e) = woke {
                    tracing::info!("{e}; resubscribing");
                    wakeups = None;
                }
            }
            () = tokio::time::sleep(nap) => {
                if deadline.is_some_and(|d| clock.now() >= d) {
                    return Err(gave_up(name, patience, last_busy, last_error));
                }
            }
        }
    }
}

async fn next_wakeup<W: Wakeups>(wakeups: &mut Option<W>) -> Result<(), BackendError> {
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

fn gave_up(
    name: &LockName,
    patience: Patience,
    busy: Option<Busy>,
    error: Option<BackendError>,
) -> Failure {
    let waited = match patience {
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
                 or see `locked-run status {name}`"
            ),
        ),
        (None, None) => Failure::new(
            Exit::Conflict,
            format!("gave up waiting for lock {name} after {waited}"),
        ),
    }
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
