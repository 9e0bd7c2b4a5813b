//! The waiter as a pure state machine: it is told what each attempt, subscription and wake-up
//! brought, at which clock reading, and answers with the next step. It sends nothing and
//! sleeps on nothing itself ([`super::acquire`] does), so every decision of waiting is tested
//! under paused time with a fake backend.

use std::fmt::Write as _;
use std::time::Duration;

use crate::backend::{Attempt, BackendError, Busy, Expiry, KEEP_ALIVE};
use crate::plumbing::exit::{Exit, Failure};
use crate::session::config::{Patience, Wait};
use crate::text::show;

/// A lock just taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquired {
    pub fence: u64,
    /// Clock reading taken before the granting request was sent: the lease runs from here.
    pub sent: Duration,
    pub waited: Duration,
}

/// What the driver does next.
#[derive(Debug)]
pub enum Next {
    /// Ask the backend now.
    Try,
    /// Subscribe to release messages, then say how it went ([`Waiter::subscribed`]).
    Subscribe,
    /// Give back a grant that came too late, then say so ([`Waiter::gave_back`]).
    GiveBack,
    /// Sleep until this clock reading, a release message for us, or a signal.
    Sleep(Duration),
    /// The lock is ours: run the command.
    Hold(Acquired),
    /// Stop waiting: give back what may be held (see [`Waiter::must_give_back`]), and fail.
    Fail(Failure),
}

/// What the backend says of itself after an attempt, as far as waiting cares.
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts {
    /// The lock is a lease (a grant that leaves too little of it is given back).
    pub lease: bool,
    /// The last attempt holds a place in a queue, kept alive by asking every `KEEP_ALIVE / 3`.
    pub queued: bool,
}

/// What ended a sleep.
#[derive(Debug)]
pub enum Woke {
    /// The clock reading the sleep was until.
    Time,
    /// A release message for us.
    Message,
    /// The subscription broke.
    Broke(BackendError),
}

/// Back-off after a failed attempt while waiting, and for a holder's key without expiry.
const RETRY_FIRST: Duration = Duration::from_millis(50);
pub(super) const RETRY_CAP: Duration = Duration::from_secs(2);

/// How long to sleep on a lock with no expiry of its own when the backend wakes waiters
/// exactly (flock): only a safety net.
const SAFETY_NAP: Duration = Duration::from_secs(60);

/// An attempt still unanswered when `-w` runs out is news of a server that stopped answering
/// only once it has waited several times as long as the last answer took, and this more:
/// one sent a moment before the deadline is merely on its way.
const ON_ITS_WAY: Duration = Duration::from_millis(50);

/// The state of one wait for one lock.
pub struct Waiter<'a> {
    ask: Wait<'a>,
    start: Duration,
    deadline: Option<Duration>,
    /// The send instant of the attempt in flight (or the last one).
    sent: Duration,
    /// How long the last answered attempt took.
    round_trip: Duration,
    /// The server answered busy at least once: lost contact is retried from then on.
    answered: bool,
    listening: bool,
    subscribe_after: Duration,
    /// When the subscription last broke.
    last_broke: Option<Duration>,
    last_busy: Option<Busy>,
    last_error: Option<BackendError>,
    retries: u32,
    no_expiry_retries: u32,
    /// An attempt with the current token went unanswered: it may have taken the lock.
    maybe_held: bool,
    queued: bool,
    /// What the service manager's status line should say now, until the driver takes it.
    unit_status: Option<String>,
}

impl<'a> Waiter<'a> {
    pub fn new(ask: Wait<'a>, now: Duration) -> Waiter<'a> {
        Waiter {
            ask,
            start: now,
            deadline: match ask.patience {
                Patience::For(d) => Some(now + d),
                _ => None,
            },
            sent: now,
            round_trip: Duration::ZERO,
            answered: false,
            listening: false,
            subscribe_after: now,
            last_broke: None,
            last_busy: None,
            last_error: None,
            retries: 0,
            no_expiry_retries: 0,
            maybe_held: false,
            queued: false,
            unit_status: None,
        }
    }

    /// Whether an attempt asks to listen for release messages in the same round trip.
    pub fn listens(&self) -> bool {
        self.ask.patience != Patience::NoWait
    }

    /// Whether the driver's subscription is still wanted (dropped after lost contact).
    pub fn listening(&self) -> bool {
        self.listening
    }

    /// Whether, on the way out without the lock, something may need giving back: an attempt
    /// that went unanswered, or a place in the queue.
    pub fn must_give_back(&self) -> bool {
        self.maybe_held || self.queued
    }

    /// A new line for the service manager's status (`STATUS=`), once: set when the waiter
    /// settles down to wait on a busy lock, sent by the driver, so the waiter itself does no
    /// I/O.
    /// What the last busy answer said, for a watched wait's line.
    pub fn last_busy(&self) -> Option<&Busy> {
        self.last_busy.as_ref()
    }

    pub fn unit_status(&mut self) -> Option<String> {
        self.unit_status.take()
    }

    /// An attempt is sent now.
    pub fn sending(&mut self, now: Duration) {
        self.sent = now;
    }

    /// The `--wait` deadline, if any.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }

    /// The wait ran out at `now` while an attempt was unanswered: it ends now, not when the
    /// attempt times out; what the attempt may have taken is given back. A server that stopped
    /// answering (69) when the attempt has waited several times as long as the last answer
    /// took; else the lock was busy, as the last answer said (75): an attempt sent a moment
    /// before the deadline is no news of the server.
    pub fn ran_out_in_flight(&mut self, now: Duration) -> Failure {
        self.maybe_held = true;
        let waited = now.saturating_sub(self.sent);
        let on_its_way = waited <= self.round_trip * 4 + ON_ITS_WAY;
        if !(on_its_way && self.last_error.is_none() && self.last_busy.is_some()) {
            self.last_error = Some(BackendError::Transient(
                "the last attempt was not answered before the wait ran out".into(),
            ));
        }
        self.gave_up()
    }

    /// A signal ended the wait; `in_flight` when an attempt was unanswered.
    pub fn interrupted(&mut self, signal: nix::sys::signal::Signal, in_flight: bool) -> Failure {
        self.maybe_held |= in_flight;
        Failure::new(
            Exit::Interrupted(signal as i32),
            format!(
                "{signal} while waiting for lock {}: nothing was run and nothing is held",
                self.ask.name
            ),
        )
    }

    /// The attempt sent at [`Waiter::sending`] was answered at `now`.
    pub fn answered(
        &mut self,
        now: Duration,
        attempt: Result<Attempt, BackendError>,
        facts: Facts,
    ) -> Next {
        self.queued = facts.queued;
        self.round_trip = now.saturating_sub(self.sent);
        let (name, timings) = (&self.ask.name, self.ask.timings);
        match attempt {
            Ok(Attempt::Acquired { fence }) => {
                let left = timings.valid_until(self.sent).saturating_sub(now);
                // R beyond the point where the command may no longer start (V - D - K):
                // time to start it, and to renew once, even when R < D.
                let needed = timings.renew_every + timings.kill_after + timings.drift;
                if !facts.lease || left >= needed {
                    return Next::Hold(Acquired {
                        fence,
                        sent: self.sent,
                        waited: self.sent.saturating_sub(self.start),
                    });
                }
                // Too little of the lease is left to run anything: give it back now rather
                // than hold it while running nothing, then try again, with a fresh token (the
                // give-back may land late: it must not delete what the next attempt takes).
                self.last_error = Some(BackendError::Transient(format!(
                    "the server took {} to grant lock {name}, leaving {} of the lease, less \
                     than --renew-every + --kill-after + the drift allowance",
                    show(now.saturating_sub(self.sent)),
                    show(left)
                )));
                Next::GiveBack
            }
            Ok(Attempt::Busy(busy)) => self.busy(now, busy),
            Ok(Attempt::Mismatch { theirs }) => Next::Fail(Failure::usage(format!(
                "lock {name} is held by runs with {}, and this run asks for {}: every run of one \
                 NAME must use the same --holders (a run without it, or a program using the \
                 plain SET NX protocol, counts as 1), and --shared only goes with --holders 1; \
                 nothing was run",
                theirs.options(),
                self.ask.mode.options(),
            ))),
            Err(error) => self.failed(now, error),
        }
    }

    /// A late grant was given back (or the give-back failed: the next attempt carries a fresh
    /// token all the same): it counts as a failed attempt.
    pub fn gave_back(&mut self, now: Duration) -> Next {
        self.maybe_held = false;
        let error = self
            .last_error
            .take()
            .unwrap_or_else(|| BackendError::Transient("a grant came too late".into()));
        self.failed(now, error)
    }

    /// The subscription the driver was asked for is confirmed (`Ok(covered)`: it preceded
    /// the last attempt), or failed.
    pub fn subscribed(&mut self, now: Duration, result: Result<bool, BackendError>) -> Next {
        match result {
            Ok(covered) => {
                self.listening = true;
                if !covered {
                    // Listening only now: ask again, so a release between the answer and the
                    // subscription is not missed.
                    return Next::Try;
                }
            }
            Err(e) => {
                // The server did answer: at the deadline this is still a conflict.
                tracing::info!("cannot subscribe to release messages: {e}");
                self.subscribe_after = now + RETRY_CAP;
            }
        }
        let busy = self
            .last_busy
            .clone()
            .expect("a subscription follows a busy answer");
        self.nap(now, &busy)
    }

    /// The wait ran out while a subscription was being made (a server that never confirms
    /// one must not stretch `--wait`): still a conflict, as the last answer said busy.
    pub fn ran_out_subscribing(&mut self) -> Next {
        Next::Fail(self.gave_up())
    }

    /// A sleep ended.
    pub fn woke(&mut self, now: Duration, why: Woke) -> Next {
        if let Woke::Broke(e) = &why {
            tracing::info!("{e}; resubscribing");
            self.listening = false;
            // At once (the retry's own request subscribes again in its write, and a release
            // for us must not wait for the keep-alive), unless it broke before within
            // RETRY_CAP: a subscription that breaks as soon as it is made must not turn into
            // a busy loop.
            let again = self.last_broke.is_some_and(|t| now < t + RETRY_CAP);
            self.subscribe_after = if again { now + RETRY_CAP } else { now };
            self.last_broke = Some(now);
        }
        match why {
            Woke::Time => match self.deadline {
                Some(deadline) if now >= deadline => Next::Fail(self.gave_up()),
                _ => Next::Try,
            },
            Woke::Message | Woke::Broke(_) => Next::Try,
        }
    }

    fn busy(&mut self, now: Duration, busy: Busy) -> Next {
        self.answered = true;
        self.retries = 0;
        self.last_error = None;
        if self.ask.patience == Patience::NoWait {
            let message =
                crate::text::message!("lock {} is {busy}; not waiting (--no-wait)", self.ask.name);
            return Next::Fail(Failure::new(Exit::Conflict, message).quiet());
        }
        self.last_busy = Some(busy.clone());
        if !self.listening && now >= self.subscribe_after {
            return Next::Subscribe;
        }
        self.nap(now, &busy)
    }

    /// Sleeps on a busy answer: until the holder's expiry (plus jitter), a place's keep-alive,
    /// or the deadline.
    fn nap(&mut self, now: Duration, busy: &Busy) -> Next {
        let nap = match busy.expiry {
            // Not listening (the subscription broke, or was refused): no release message can
            // cut the nap short, so it is a poll, every 2 s at most.
            Expiry::In(d) if !self.listening => (d + jitter(d)).min(RETRY_CAP),
            Expiry::In(d) => d + jitter(d),
            // Free, but the first waiter in the queue goes first: it is woken by name; should
            // it be gone, its place lapses after `retry_in`.
            Expiry::Queued { retry_in, .. } => retry_in + jitter(retry_in),
            // The wake-up comes when the holder lets go; the nap is a safety net (and, without
            // wake-ups, a slow poll).
            Expiry::WithHolder if self.listening => SAFETY_NAP,
            Expiry::WithHolder => RETRY_CAP,
            Expiry::Never => {
                if self.no_expiry_retries == 0 {
                    tracing::info!(
                        "lock {} is held with no expiry (set by another tool?); checking again \
                         with back-off",
                        self.ask.name
                    );
                }
                self.no_expiry_retries += 1;
                backoff(self.no_expiry_retries)
            }
        };
        // A place in the queue lapses unless asked for again: a heartbeat, not a poll (release
        // messages still wake the waiter whose turn it is).
        let nap = match self.queued {
            true => nap.min(KEEP_ALIVE / 3),
            false => nap,
        };
        tracing::debug!(
            event = "waiting",
            holder_fence = busy.holder.fence,
            "lock {} is {busy}; sleeping up to {}",
            self.ask.name,
            show(nap)
        );
        self.unit_status = Some(format!(
            "waiting for lock {} ({})",
            self.ask.name,
            holder_words(busy)
        ));
        self.sleep(now, nap)
    }

    /// An attempt that got no usable answer.
    fn failed(&mut self, now: Duration, error: BackendError) -> Next {
        if error.is_transient() && !error.is_unsent() {
            // Sent but unanswered: the server may have granted it all the same.
            self.maybe_held = true;
        }
        if !self.answered || !error.is_transient() || self.ask.patience == Patience::NoWait {
            // With nothing to give back, the line says so, and the give-back is skipped: it
            // would only fail again, for the same reason, and talk of what was never held.
            let taken = match self.must_give_back() {
                true => "",
                false => " and nothing was taken",
            };
            return Next::Fail(Failure::unavailable(format!(
                "{error}; nothing was run{taken}"
            )));
        }
        tracing::info!(
            "lost contact while waiting for lock {}: {error}; retrying",
            self.ask.name
        );
        self.listening = false;
        self.last_error = Some(error);
        self.retries += 1;
        self.sleep(now, backoff(self.retries))
    }

    fn sleep(&mut self, now: Duration, nap: Duration) -> Next {
        match self.deadline {
            Some(deadline) if now >= deadline => Next::Fail(self.gave_up()),
            Some(deadline) => Next::Sleep(now + nap.min(deadline - now)),
            None => Next::Sleep(now + nap),
        }
    }

    fn gave_up(&mut self) -> Failure {
        let name = &self.ask.name;
        let waited = match self.ask.patience {
            Patience::For(d) => show(d),
            _ => "the wait".into(),
        };
        match (self.last_error.take(), self.last_busy.take()) {
            (Some(error), _) => Failure::unavailable(format!(
                "gave up waiting for lock {name} after {waited}: {error}; nothing was run"
            )),
            (None, Some(busy)) => Failure::new(
                Exit::Conflict,
                format!(
                    "gave up waiting for lock {name} after {waited}: it is {busy}; raise --wait, \
                     or see `{}`",
                    self.ask.status_command
                ),
            ),
            (None, None) => Failure::new(
                Exit::Conflict,
                format!("gave up waiting for lock {name} after {waited}"),
            ),
        }
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

/// A little randomness so waiters that slept on the same expiry do not all ask at once.
fn jitter(pttl: Duration) -> Duration {
    let cap = (pttl.as_millis() as u64 / 50).clamp(2, 50);
    Duration::from_millis(fastrand::u64(1..=cap))
}

fn backoff(retries: u32) -> Duration {
    let exp = retries.saturating_sub(1).min(10);
    (RETRY_FIRST * (1u32 << exp)).min(RETRY_CAP)
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

    /// The status line is the driver's to send: the waiter only names it, once.
    #[test]
    fn settling_down_to_wait_names_the_holder_for_the_unit_status_once() {
        let cfg = crate::session::fake::config(Patience::Forever);
        let mut waiter = Waiter::new(cfg.wait(), Duration::ZERO);
        waiter.sending(Duration::ZERO);
        let holder = crate::backend::Holder {
            host: Some("web-3".into()),
            pid: Some(4242),
            fence: Some(17),
            ..Default::default()
        };
        let busy = Busy {
            holder,
            expiry: Expiry::In(Duration::from_secs(20)),
        };
        let facts = super::Facts::default();
        let next = waiter.answered(Duration::from_millis(1), Ok(Attempt::Busy(busy)), facts);
        assert!(matches!(next, Next::Subscribe), "{next:?}");
        assert_eq!(waiter.unit_status(), None, "not waiting yet");
        let next = waiter.subscribed(Duration::from_millis(2), Ok(true));
        assert!(matches!(next, Next::Sleep(_)), "{next:?}");
        assert_eq!(
            waiter.unit_status().as_deref(),
            Some("waiting for lock job (held by web-3 pid 4242, fence 17)")
        );
        assert_eq!(waiter.unit_status(), None, "said once");
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
