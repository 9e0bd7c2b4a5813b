//! The lease clock: when to renew, when to stop the child, and the loop that keeps the lease.
//!
//! This is the safety core (docs/how-it-works.md, "The lease clock"). With T the TTL, R the renew interval,
//! K the kill grace and D = T/100 + 2 ms the drift allowance:
//!
//! - a grant or renewal whose request was *sent* at s proves the lease valid until V = s + T - D
//!   (the server's TTL started no earlier than the send);
//! - the next renewal is due at s + R; a failed attempt is retried with a short back-off, and
//!   each attempt may take at most min(R/2, V - now);
//! - at V - D - K with no success since, the child gets the kill signal; at V - D, SIGKILL. The
//!   child is thus signalled before the server can hand the lock to anyone else, with D to spare
//!   for late timers;
//! - a reply saying "not the owner" means the lease is gone now: kill signal at once, SIGKILL K
//!   later (never after V - D);
//! - every wake-up reads the clock first, so a wrapper that slept through V - D (timer late,
//!   SIGSTOP, suspend) SIGKILLs at once;
//! - once stopping has begun it is final, and its SIGKILL deadline is never moved.
//!
//! [`LeaseClock`] is the pure state machine; [`keep`] drives it with a [`Clock`], a [`Renew`]er
//! and a [`Stopper`], so unit tests pin every transition under `tokio::time::pause()`.

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::plumbing::clock::Clock;
use crate::text::show;

/// The shortest TTL accepted.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// The shortest renew interval accepted.
pub const MIN_RENEW: Duration = Duration::from_millis(10);

/// T, R, K and D, validated together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    pub ttl: Duration,
    pub renew_every: Duration,
    pub kill_after: Duration,
    pub drift: Duration,
}

impl Timings {
    /// T with the defaults R = T/6 and K = T/3 where not given; refuses timings that leave no
    /// time to retry a failed renewal.
    pub fn new(
        ttl: Duration,
        renew_every: Option<Duration>,
        kill_after: Option<Duration>,
    ) -> Result<Self, String> {
        if ttl < MIN_TTL {
            // Zero as it is written (`--ttl 0s`), not as `show` has it (0ms).
            let given = match ttl.is_zero() {
                true => "0s".to_owned(),
                false => show(ttl),
            };
            return Err(format!(
                "--ttl {given} is too short: the lease must be at least {} so renewals can keep \
                 up (the default is 30s)",
                show(MIN_TTL)
            ));
        }
        let renew_every = renew_every.unwrap_or(ttl / 6);
        let kill_after = kill_after.unwrap_or(ttl / 3);
        let drift = Self::drift_for(ttl);
        if renew_every < MIN_RENEW {
            return Err(format!(
                "--renew-every {} is too short: at least {} (renewing faster only loads the server)",
                show(renew_every),
                show(MIN_RENEW)
            ));
        }
        let budget = ttl.saturating_sub(2 * drift);
        if renew_every + kill_after >= budget {
            return Err(format!(
                "--renew-every {} + --kill-after {} must be shorter than the TTL less twice the \
                 drift allowance ({} - 2 x {} = {}), or no time is left to retry a failed renewal; \
                 shorten them or raise --ttl",
                show(renew_every),
                show(kill_after),
                show(ttl),
                show(drift),
                show(budget)
            ));
        }
        Ok(Timings {
            ttl,
            renew_every,
            kill_after,
            drift,
        })
    }

    /// D = T/100 + 2 ms, the Redlock drift allowance.
    pub fn drift_for(ttl: Duration) -> Duration {
        ttl / 100 + Duration::from_millis(2)
    }

    /// T - 2D - K - R: how long failed renewals may be retried after the first one was due,
    /// before the kill signal. `-v` says so when this is shorter than R.
    pub fn retry_window(&self) -> Duration {
        self.ttl
            .saturating_sub(2 * self.drift + self.kill_after + self.renew_every)
    }

    /// How long a grant sent at `sent` is valid: V = s + T - D. The only place V is computed.
    pub fn valid_until(&self, sent: Duration) -> Duration {
        sent + self.ttl - self.drift
    }

    /// T in milliseconds, as the scripts take it (`PX`).
    pub fn ttl_ms(&self) -> String {
        self.ttl.as_millis().max(1).to_string()
    }
}

/// Why the child is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// No renewal succeeded in time (server down, slow or unreachable).
    Expiring,
    /// The server said the lock is no longer ours (expired, deleted or taken over).
    NotOwner,
    /// `locked-run` woke up past V - D (paused, suspended, or starved of CPU).
    Late,
}

/// Where the stop of the child stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Running,
    Terminating { kill_at: Duration },
    Killed,
}

/// What the keeper must do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Terminate(Why),
    Kill(Why),
    Renew {
        timeout: Duration,
    },
    /// Nothing to do until this reading (or ever, with `None`).
    Sleep(Option<Duration>),
}

/// The pure lease state machine: feed it clock readings and renewal results, ask it what to do.
#[derive(Clone, Debug)]
pub struct LeaseClock {
    timings: Timings,
    valid_until: Duration,
    next_renewal: Duration,
    failures: u32,
    lost: bool,
    stop: Stop,
    stop_reason: Option<Why>,
    last_error: Option<String>,
}

impl LeaseClock {
    /// A lease granted by a request sent at `sent`.
    pub fn new(timings: Timings, sent: Duration) -> Self {
        LeaseClock {
            timings,
            valid_until: timings.valid_until(sent),
            next_renewal: sent + timings.renew_every,
            failures: 0,
            lost: false,
            stop: Stop::Running,
            stop_reason: None,
            last_error: None,
        }
    }

    /// V: the lease is proven valid until this reading.
    #[cfg(test)]
    pub fn valid_until(&self) -> Duration {
        self.valid_until
    }

    #[cfg(test)]
    pub fn stop(&self) -> Stop {
        self.stop
    }

    /// No later than this reading has the lease lapsed on the server as well (V + 2D: the
    /// server counts from the last renewal's arrival, which its answer bounds): a release
    /// after it, of a lease lost, can only find the key gone.
    pub fn lapsed_by(&self) -> Duration {
        self.valid_until + 2 * self.timings.drift
    }

    /// The last renewal error, for the message that explains a stop.
    pub fn last_error(&self) -> Option<&str> {
        self.last_error.as_deref()
    }

    /// A renewal sent at `sent` succeeded.
    pub fn renewed(&mut self, sent: Duration) {
        self.valid_until = self.valid_until.max(self.timings.valid_until(sent));
        self.next_renewal = sent + self.timings.renew_every;
        self.failures = 0;
    }

    /// A renewal attempt failed at `now` (timeout, connection or server error): retry soon.
    pub fn renew_failed(&mut self, now: Duration, error: String) {
        self.failures += 1;
        self.next_renewal = now + self.backoff();
        self.last_error = Some(error);
    }

    /// The server said the key is no longer ours.
    pub fn lost(&mut self) {
        self.lost = true;
    }

    /// Whether the lease can no longer be counted on at `now`: lost, or past V - D.
    pub fn expired(&self, now: Duration) -> bool {
        self.lost || now >= self.kill_point()
    }

    /// 20 ms doubling per failure, capped at R/4: quick to recover after a blip, and a server
    /// that refuses at once is asked at most four times per renew interval.
    fn backoff(&self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(16);
        let base = Duration::from_millis(20) * (1u32 << exp);
        base.min(self.timings.renew_every / 4)
            .max(Duration::from_millis(1))
    }

    fn kill_point(&self) -> Duration {
        self.valid_until.saturating_sub(self.timings.drift)
    }

    /// V - D - K: where the kill signal goes, with no renewal since. A command must not start
    /// past it.
    pub fn term_point(&self) -> Duration {
        self.kill_point().saturating_sub(self.timings.kill_after)
    }

    /// What to do at `now`. `renewing` says whether a renewal is already in flight. Call again
    /// after acting on anything but `Sleep`.
    pub fn step(&mut self, now: Duration, renewing: bool) -> Step {
        match self.stop {
            Stop::Running => {
                if now >= self.kill_point() {
                    // Past V - D with no kill signal sent: no grace is left. With K > 0 the term
                    // point passed unseen, so this wake-up is late (pause, suspend, starved CPU).
                    let why = if self.lost {
                        Why::NotOwner
                    } else if self.timings.kill_after.is_zero() {
                        Why::Expiring
                    } else {
                        Why::Late
                    };
                    self.stop = Stop::Killed;
                    self.stop_reason = Some(why);
                    return Step::Kill(why);
                }
                if self.lost {
                    // Gone now: the kill signal at once, SIGKILL K later, and never after V - D
                    // (a loss seen late, past the term point, keeps the V - D deadline).
                    self.stop = Stop::Terminating {
                        kill_at: (now + self.timings.kill_after).min(self.kill_point()),
                    };
                    self.stop_reason = Some(Why::NotOwner);
                    return Step::Terminate(Why::NotOwner);
                }
                if now >= self.term_point() {
                    self.stop = Stop::Terminating {
                        kill_at: self.kill_point(),
                    };
                    self.stop_reason = Some(Why::Expiring);
                    return Step::Terminate(Why::Expiring);
                }
            }
            Stop::Terminating { kill_at } => {
                if now >= kill_at {
                    self.stop = Stop::Killed;
                    return Step::Kill(self.stop_reason.unwrap_or(Why::Expiring));
                }
            }
            Stop::Killed => {}
        }
        let renewal_due = !renewing && !self.lost;
        if renewal_due && now >= self.next_renewal {
            let half = self.timings.renew_every / 2;
            let left = self.valid_until.saturating_sub(now);
            let timeout = if left.is_zero() { half } else { half.min(left) };
            return Step::Renew { timeout };
        }
        let mut wake: Option<Duration> = None;
        let mut at = |t: Duration| wake = Some(wake.map_or(t, |w| w.min(t)));
        if renewal_due {
            at(self.next_renewal);
        }
        match self.stop {
            Stop::Running => {
                at(self.term_point());
                at(self.kill_point());
            }
            Stop::Terminating { kill_at } => at(kill_at),
            Stop::Killed => {}
        }
        Step::Sleep(wake)
    }
}

/// One compare-and-extend of the lease.
pub trait Renew {
    /// `Ok(true)` while the lease is still ours, `Ok(false)` when the server says it is not,
    /// `Err` when the attempt failed (the next one should use a fresh connection). The attempt
    /// must give up after `timeout`.
    fn renew(&self, timeout: Duration) -> impl Future<Output = Result<bool, String>>;
}

/// What stops the child.
pub trait Stopper {
    /// Send the kill signal (SIGTERM unless `--kill-signal`).
    fn terminate(&self, why: Why);
    /// SIGKILL.
    fn kill(&self, why: Why);
}

type Renewal<'a> = Pin<Box<dyn Future<Output = Result<bool, String>> + 'a>>;

/// Keeps the lease: renews on time, and stops the child through `stopper` when it cannot.
///
/// Never returns; the run loop polls it beside the child and drops it when the child's group is
/// gone. Between polls its state lives in `lease`, which the run loop may read.
pub async fn keep<C: Clock, R: Renew, S: Stopper>(
    lease: &RefCell<LeaseClock>,
    clock: &C,
    renewer: &R,
    stopper: &S,
) -> Infallible {
    let mut renewal: Option<(Duration, Renewal<'_>)> = None;
    loop {
        let now = clock.now();
        let step = lease.borrow_mut().step(now, renewal.is_some());
        match step {
            Step::Terminate(why) => stopper.terminate(why),
            Step::Kill(why) => stopper.kill(why),
            Step::Renew { timeout } => {
                let attempt = renewer.renew(timeout);
                let bounded = async move {
                    match tokio::time::timeout(timeout, attempt).await {
                        Ok(result) => result,
                        Err(_) => Err(format!("no answer within {}", show(timeout))),
                    }
                };
                renewal = Some((now, Box::pin(bounded)));
            }
            Step::Sleep(until) => {
                let result = match renewal.as_mut() {
                    Some((_, attempt)) => tokio::select! {
                        result = attempt => Some(result),
                        () = sleep_until(clock, until) => None,
                    },
                    None => {
                        sleep_until(clock, until).await;
                        None
                    }
                };
                if let Some(result) = result {
                    let (sent, _) = renewal.take().expect("a result comes from a renewal");
                    let now = clock.now();
                    let mut lease = lease.borrow_mut();
                    match result {
                        Ok(true) => {
                            if lease.failures > 0 {
                                tracing::info!(
                                    event = "renewed",
                                    after_failures = lease.failures,
                                    "renewed the lease after {} failed attempt(s)",
                                    lease.failures
                                );
                            } else {
                                tracing::debug!(event = "renewed", "renewed the lease");
                            }
                            lease.renewed(sent);
                        }
                        Ok(false) => {
                            tracing::debug!(
                                event = "not_owner",
                                "renewal: the lock is no longer ours"
                            );
                            lease.lost();
                        }
                        Err(error) => {
                            tracing::info!(
                                event = "renewal_failed",
                                error = %error,
                                "renewal failed: {error}; retrying"
                            );
                            lease.renew_failed(now, error);
                        }
                    }
                }
            }
        }
    }
}

async fn sleep_until<C: Clock>(clock: &C, until: Option<Duration>) {
    match until {
        Some(deadline) => clock.sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
