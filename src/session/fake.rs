//! A backend with scripted answers, a clock and signals for paused-time tests of the session:
//! every attempt, give-back and release is recorded with its clock reading and token, and
//! release messages are published by the test.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

use crate::backend::{Attempt, Backend, BackendError, Tenure, Wakeup, Wakeups};
use crate::lease::Timings;
use crate::name::LockName;
use crate::plumbing::clock::Clock;
use crate::session::config::{Patience, RunConfig};

use super::acquire::Interrupts;

/// The clock of a paused-time test: readings since its creation.
pub struct TestClock(Instant);

impl TestClock {
    pub fn new() -> TestClock {
        TestClock(Instant::now())
    }
}

impl TestClock {
    /// The reading, in whole ms.
    pub fn now_ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64
    }
}

impl Clock for TestClock {
    fn now(&self) -> Duration {
        self.0.elapsed()
    }

    async fn sleep_until(&self, deadline: Duration) {
        tokio::time::sleep_until(self.0 + deadline).await;
    }
}

/// One scripted answer to an attempt: what, and how long it takes to come (`None`: never).
pub struct Answer(pub Result<Attempt, BackendError>, pub Option<Duration>);

pub fn after(delay_ms: u64, answer: Result<Attempt, BackendError>) -> Answer {
    Answer(answer, Some(Duration::from_millis(delay_ms)))
}

/// What the fake saw, with the clock reading (ms since the test's start) and the token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Attempt {
        at: u64,
        token: String,
    },
    Subscribed {
        at: u64,
    },
    GaveBack {
        at: u64,
        token: String,
    },
    Released {
        at: u64,
        token: String,
        timeout: Duration,
    },
    Renewed {
        at: u64,
    },
}

pub struct Fake {
    start: Instant,
    answers: RefCell<VecDeque<Answer>>,
    /// Scripted answers to renewals (an `Acquired` answer: still ours; `Busy`: not ours); once
    /// they run out, every renewal succeeds at once.
    renewals: RefCell<VecDeque<Answer>>,
    /// Whether a subscription covers the attempt before it (one answer per subscription;
    /// true once they run out).
    covers: RefCell<VecDeque<bool>>,
    messages: RefCell<VecDeque<Result<Wakeup, BackendError>>>,
    arrived: tokio::sync::Notify,
    pub seen: RefCell<Vec<Seen>>,
    token: RefCell<String>,
    tokens: Cell<u32>,
    pub lease: bool,
    pub queued: Cell<bool>,
    /// What a give-back answers: whether it found something to give back.
    pub gives_back: Cell<bool>,
}

impl Fake {
    pub fn new(answers: Vec<Answer>) -> Fake {
        Fake {
            start: Instant::now(),
            answers: RefCell::new(answers.into()),
            renewals: RefCell::new(VecDeque::new()),
            covers: RefCell::new(VecDeque::new()),
            messages: RefCell::new(VecDeque::new()),
            arrived: tokio::sync::Notify::new(),
            seen: RefCell::new(Vec::new()),
            token: RefCell::new("t0".into()),
            tokens: Cell::new(0),
            lease: true,
            queued: Cell::new(false),
            gives_back: Cell::new(false),
        }
    }

    /// Renewals answered as `renewals` script them (see [`Fake::renewals`]).
    pub fn renewing(self, renewals: Vec<Answer>) -> Fake {
        *self.renewals.borrow_mut() = renewals.into();
        self
    }

    /// The time each release was given.
    pub fn release_timeouts(&self) -> Vec<Duration> {
        self.seen
            .borrow()
            .iter()
            .filter_map(|s| match s {
                Seen::Released { timeout, .. } => Some(*timeout),
                _ => None,
            })
            .collect()
    }

    /// When each release was asked for, ms since the start.
    pub fn released(&self) -> Vec<u64> {
        self.seen
            .borrow()
            .iter()
            .filter_map(|s| match s {
                Seen::Released { at, .. } => Some(*at),
                _ => None,
            })
            .collect()
    }

    /// When each renewal was sent, ms since the start.
    pub fn renewals(&self) -> Vec<u64> {
        self.seen
            .borrow()
            .iter()
            .filter_map(|s| match s {
                Seen::Renewed { at } => Some(*at),
                _ => None,
            })
            .collect()
    }

    pub fn covering(self, covers: &[bool]) -> Fake {
        self.covers.replace(covers.iter().copied().collect());
        self
    }

    /// A release message for the waiters (delivered once a subscription exists).
    pub fn publish(&self, wakeup: Wakeup) {
        self.messages.borrow_mut().push_back(Ok(wakeup));
        self.arrived.notify_waiters();
    }

    /// The subscription breaks (delivered to the one that exists).
    pub fn break_subscription(&self) {
        let broken = BackendError::Transient("lost the subscription".into());
        self.messages.borrow_mut().push_back(Err(broken));
        self.arrived.notify_waiters();
    }

    fn ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn see(&self, seen: Seen) {
        self.seen.borrow_mut().push(seen);
    }

    pub fn attempts(&self) -> Vec<(u64, String)> {
        self.seen
            .borrow()
            .iter()
            .filter_map(|s| match s {
                Seen::Attempt { at, token } => Some((*at, token.clone())),
                _ => None,
            })
            .collect()
    }

    pub fn gave_back(&self) -> Vec<(u64, String)> {
        self.seen
            .borrow()
            .iter()
            .filter_map(|s| match s {
                Seen::GaveBack { at, token } => Some((*at, token.clone())),
                _ => None,
            })
            .collect()
    }
}

pub struct FakeWakeups<'a>(&'a Fake);

#[async_trait::async_trait(?Send)]
impl Wakeups for FakeWakeups<'_> {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        loop {
            let arrived = self.0.arrived.notified();
            if let Some(message) = self.0.messages.borrow_mut().pop_front() {
                return message;
            }
            arrived.await;
        }
    }
}

#[async_trait::async_trait(?Send)]
impl Backend for Fake {
    fn tenure(&self) -> Tenure {
        match self.lease {
            true => Tenure::Lease,
            false => Tenure::Kernel,
        }
    }

    fn queues(&self) -> bool {
        self.queued.get()
    }

    async fn give_back(&self, _timeout: Duration) -> Result<bool, BackendError> {
        self.see(Seen::GaveBack {
            at: self.ms(),
            token: self.token(),
        });
        self.tokens.set(self.tokens.get() + 1);
        self.token.replace(format!("t{}", self.tokens.get()));
        Ok(self.gives_back.get())
    }

    fn key(&self) -> String {
        "lock:{job}".into()
    }

    fn token(&self) -> String {
        self.token.borrow().clone()
    }

    async fn try_acquire(
        &self,
        _timings: &Timings,
        _listen: bool,
    ) -> Result<Attempt, BackendError> {
        self.see(Seen::Attempt {
            at: self.ms(),
            token: self.token(),
        });
        let Some(Answer(answer, delay)) = self.answers.borrow_mut().pop_front() else {
            panic!("no answer scripted for attempt {}", self.attempts().len());
        };
        match delay {
            Some(delay) => tokio::time::sleep(delay).await,
            None => std::future::pending().await,
        }
        answer
    }

    async fn renew(&self, _timings: &Timings, _timeout: Duration) -> Result<bool, BackendError> {
        self.see(Seen::Renewed { at: self.ms() });
        let scripted = self.renewals.borrow_mut().pop_front();
        match scripted {
            Some(Answer(answer, delay)) => {
                match delay {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => std::future::pending().await,
                }
                answer.map(|a| matches!(a, Attempt::Acquired { .. }))
            }
            None => Ok(true),
        }
    }

    async fn release(
        &self,
        _keep_for: Option<Duration>,
        timeout: Duration,
        _run: Option<&crate::backend::Run>,
    ) -> Result<bool, BackendError> {
        self.see(Seen::Released {
            at: self.ms(),
            token: self.token(),
            timeout,
        });
        Ok(true)
    }

    async fn subscribe(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError> {
        self.see(Seen::Subscribed { at: self.ms() });
        let covered = self.covers.borrow_mut().pop_front().unwrap_or(true);
        Ok((Box::new(FakeWakeups(self)), covered))
    }
}

/// Signals that end a wait: none, or SIGTERM once at an instant.
pub struct SignalAt(Option<Instant>);

impl SignalAt {
    pub fn never() -> SignalAt {
        SignalAt(None)
    }

    pub fn after(ms: u64) -> SignalAt {
        SignalAt(Some(Instant::now() + Duration::from_millis(ms)))
    }
}

impl Interrupts for SignalAt {
    async fn next_ending_wait(&mut self) -> Signal {
        match self.0 {
            Some(at) => {
                tokio::time::sleep_until(at).await;
                self.0 = None;
                Signal::SIGTERM
            }
            None => std::future::pending().await,
        }
    }
}

/// A run's configuration for `job` with T = 30 s (R = 5 s, K = 10 s, D = 302 ms).
pub fn config(patience: Patience) -> RunConfig {
    RunConfig {
        name: LockName::new("job").expect("a valid name"),
        command: vec!["true".into()],
        timings: Timings::new(Duration::from_secs(30), None, None).expect("valid timings"),
        patience,
        kill_signal: Signal::SIGTERM,
        min_hold: None,
        holders: 1,
        shared: false,
        max_run: None,
        fair: true,
        status_command: "locked-run status job".into(),
        release_timeout: Duration::from_secs(5),
        codes: crate::plumbing::exit::Codes::default(),
        metrics_dir: None,
        ping: None,
    }
}
