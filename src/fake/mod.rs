//! A fake backend, `fake:///PATH`, for the conformance suite alone (compiled only with the
//! `fake-backend` feature, never shipped): it goes through the registry as any backend does,
//! and shows that adding one is its folder, its registry line, its test fixture and its docs.
//!
//! It keeps a lease as a server does, without a server: the lock's key in one small state file
//! (see `store`) with an expiry on the wall clock, renewed on the lease clock, taken from its
//! holder by `release --force` (the holder's next renewal finds it gone: 76); a fence counter
//! raised by every grant; the history. Waiters race on each release (no queue: no order among
//! them): each polls the file, and keeps a place of its own on a short expiry by asking again,
//! as a queued waiter does, so that `status` counts the live ones (a SIGKILLed waiter's lapses
//! within [`KEEP_ALIVE`]) and one that gives up leaves at once. It holds one holder at a time:
//! `--holders` and `--shared` are refused when it is opened.

mod store;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::backend::{
    Attempt, Backend, BackendError, Busy, Can, Check, Declaration, Expiry, Freed, History, Holder,
    KEEP_ALIVE, KEPT, Level, Modes, Queue, Reader, Report, Run, Several, Slot, Tenure, View,
    Wakeup, Wakeups, any_name, hostname, new_token, says, wall_clock_ms,
};
use crate::endpoints::Scheme;
use crate::lease::Timings;
use crate::name::LockName;
use crate::plumbing::exit::Failure;
use store::{Key, State, Store};

/// How often a waiter looks at the store for a release.
const POLL: Duration = Duration::from_millis(10);

/// The fake backend, as the registry knows it.
pub const BACKEND: Declaration = Declaration {
    called: "fake://",
    schemes: &[Scheme::plain("fake", "fake:///PATH (the tests' own)")],
    help: "fake:///PATH for the tests' fake backend (a build with the fake-backend feature)",
    doctor: "the tests' fake store",
    modes: Modes {
        holders: Can::No("the fake backend holds one lock at a time"),
        shared: Can::No("the fake backend holds one lock at a time"),
        wait_replicas: Can::No("the fake backend has no replicas"),
        queue: Queue::Racing,
    },
    several: Several::Refused(says!(
        "a fake:// URL names one store: give one, and no other URL"
    )),
    no_tls: Some(says!(
        "--tls-ca-cert, --tls-cert and --tls-key are for servers that speak TLS, and fake:// \
         has no server"
    )),
    name_rule: any_name,
    open: |store, spec| {
        let url = store.url().url();
        let store_of = Store::of(url).map_err(Failure::usage)?;
        Ok(Box::new(FakeLock {
            store: store_of,
            name: spec.name.clone(),
            command: store.how.command.to_owned(),
            token: Mutex::new(new_token()),
            waits: AtomicBool::new(false),
        }))
    },
};

/// A lock on one NAME in one fake store.
pub struct FakeLock {
    store: Store,
    name: LockName,
    command: String,
    /// The owner's token; a fresh one after a give-back.
    token: Mutex<String>,
    /// The last attempt left a place of this run's among the waiters, to keep alive.
    waits: AtomicBool,
}

impl FakeLock {
    fn mine(&self) -> String {
        self.token.lock().expect("not poisoned").clone()
    }

    fn busy(key: &Key) -> Busy {
        Busy {
            holder: Holder {
                host: Some(key.host.clone()),
                pid: Some(key.pid),
                command: Some(key.command.clone()),
                since_ms: Some(key.since_ms),
                fence: Some(key.fence),
            },
            expiry: Expiry::In(Duration::from_millis(
                key.expires_ms.saturating_sub(wall_clock_ms()),
            )),
        }
    }

    /// One attempt, under the store's lock: the key is ours (an attempt whose answer was lost
    /// took it), someone else's, or free and now ours with a new fence.
    fn attempt(&self, state: &mut State, ttl: Duration, listen: bool) -> Attempt {
        let (name, token) = (self.name.as_str(), self.mine());
        match state.key(name) {
            Some(key) if key.token == token => Attempt::Acquired { fence: key.fence },
            Some(key) => {
                if listen {
                    state.wait(
                        name,
                        &token,
                        Some(wall_clock_ms() + KEEP_ALIVE.as_millis() as u64),
                    );
                }
                Attempt::Busy(FakeLock::busy(&key))
            }
            None => {
                let now = wall_clock_ms();
                let fence = state.next_fence(name);
                let key = Key {
                    token: token.clone(),
                    expires_ms: now + ttl.as_millis() as u64,
                    host: hostname(),
                    pid: std::process::id(),
                    command: self.command.clone(),
                    since_ms: now,
                    fence,
                };
                state.set_key(name, Some(&key));
                state.wait(name, &token, None);
                Attempt::Acquired { fence }
            }
        }
    }
}

#[async_trait::async_trait(?Send)]
impl Backend for FakeLock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    fn races(&self) -> bool {
        true
    }

    fn queues(&self) -> bool {
        self.waits.load(Ordering::Relaxed)
    }

    fn key(&self) -> String {
        format!("lock:{}", self.name)
    }

    fn token(&self) -> String {
        self.mine()
    }

    async fn give_back(&self, _timeout: Duration) -> Result<bool, BackendError> {
        let (name, token) = (self.name.as_str(), self.mine());
        let held = self.store.change(|state| {
            state.wait(name, &token, None);
            let held = state.key(name).is_some_and(|key| key.token == token);
            if held {
                state.set_key(name, None);
            }
            (held, true)
        })?;
        self.waits.store(false, Ordering::Relaxed);
        *self.token.lock().expect("not poisoned") = new_token();
        Ok(held)
    }

    async fn try_acquire(&self, timings: &Timings, listen: bool) -> Result<Attempt, BackendError> {
        let attempt = self
            .store
            .change(|state| (self.attempt(state, timings.ttl, listen), true))?;
        let waits = listen && matches!(attempt, Attempt::Busy(_));
        self.waits.store(waits, Ordering::Relaxed);
        Ok(attempt)
    }

    async fn renew(&self, timings: &Timings, _timeout: Duration) -> Result<bool, BackendError> {
        let (name, token) = (self.name.as_str(), self.mine());
        self.store.change(|state| match state.key(name) {
            Some(mut key) if key.token == token => {
                key.expires_ms = wall_clock_ms() + timings.ttl.as_millis() as u64;
                state.set_key(name, Some(&key));
                (true, true)
            }
            _ => (false, false),
        })
    }

    async fn release(
        &self,
        keep_for: Option<Duration>,
        _timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError> {
        let (name, token) = (self.name.as_str(), self.mine());
        self.store.change(|state| {
            state.wait(name, &token, None);
            // A lost run is remembered too; a history never makes a release fail.
            if let Some(run) = run {
                state.remember(name, run.to_line());
            }
            let released = match state.key(name) {
                Some(mut key) if key.token == token => {
                    match keep_for {
                        Some(hold) => {
                            key.expires_ms = wall_clock_ms() + hold.as_millis() as u64;
                            state.set_key(name, Some(&key));
                        }
                        None => state.set_key(name, None),
                    }
                    true
                }
                _ => false,
            };
            (released, true)
        })
    }

    async fn subscribe(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError> {
        // A waiter reads the store's state, not a message: no release can pass unseen.
        Ok((Box::new(Polling { lock: self }), true))
    }
}

/// A waiter's wake-ups: the store read every [`POLL`] until the key is gone (or lapsed).
struct Polling<'a> {
    lock: &'a FakeLock,
}

#[async_trait::async_trait(?Send)]
impl Wakeups for Polling<'_> {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        let name = self.lock.name.as_str();
        while self.lock.store.read_locked()?.key(name).is_some() {
            tokio::time::sleep(POLL).await;
        }
        Ok(Wakeup::Anyone)
    }
}

#[async_trait::async_trait(?Send)]
impl View for FakeLock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    async fn inspect(&self) -> Result<Report, BackendError> {
        let name = self.name.as_str();
        let state = self.store.read_locked()?;
        let waiters = Some(state.waiters(name).len() as u64);
        let fence = state.fence(name);
        let Some(key) = state.key(name) else {
            return Ok(Report {
                fence,
                waiters,
                ..Report::default()
            });
        };
        let busy = FakeLock::busy(&key);
        Ok(Report {
            fence,
            held: Some(busy.clone()),
            value: Some(key.token.clone()),
            waiters,
            holders: vec![Slot {
                token: Some(key.token),
                busy,
            }],
            limit: Some(1),
            ..Report::default()
        })
    }

    async fn force_release(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        let name = self.name.as_str();
        self.store.change(|state| {
            let taken = state
                .key(name)
                .filter(|key| token.is_none_or(|t| t == key.token));
            if taken.is_some() {
                state.set_key(name, None);
            }
            let holders = taken.iter().map(|k| FakeLock::busy(k).holder).collect();
            let fence = state.fence(name);
            (Freed::Released { holders, fence }, taken.is_some())
        })
    }

    async fn history(&self, limit: usize) -> Result<History, BackendError> {
        let state = self.store.read_locked()?;
        let mut reader = Reader::new();
        for record in state.history(self.name.as_str()).iter().rev() {
            reader.take(record.as_bytes());
        }
        Ok(reader.finish(limit.min(KEPT)))
    }

    async fn checks(&self) -> Vec<Check> {
        let server = self.store.path.display().to_string();
        match self.store.read_locked() {
            Ok(state) => vec![Check {
                server,
                check: "store",
                level: Level::Ok,
                detail: crate::backend::last_fence(state.fence(self.name.as_str())),
            }],
            Err(e) => vec![Check {
                server,
                check: "store",
                level: Level::Fail,
                detail: e.to_string(),
            }],
        }
    }
}
