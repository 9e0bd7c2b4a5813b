//! The consensus backend, `etcd://host:port[,host:port...]`: the lock in an etcd v3 cluster,
//! where every write is committed through Raft, so the fence (a create revision) never
//! repeats, also across a failover of etcd's leader.
//!
//! The lock is etcd's own recipe (`client/v3/concurrency/mutex.go`), so that `locked-run` and
//! `etcdctl lock NAME` exclude each other on the same NAME:
//!
//! - Each run grants itself a lease (TTL: `--ttl` rounded up to whole seconds; etcd may raise
//!   it to its minimum) and creates the key `NAME/<lease id in hex>` on it, only if absent,
//!   with its holder's metadata and mode as the value (JSON, for `status` and the other runs;
//!   etcdctl's value is empty: an exclusive run's).
//! - The key under `NAME/` with the lowest create revision holds the lock (with `--shared`
//!   and `--holders N`, the keys `line` says). Its create revision is the fence: etcd's
//!   cluster-wide revision, strictly increasing.
//! - A waiter keeps its key and watches the key just before its own (the highest create
//!   revision below its own) for a delete (`line` says what else, in the other modes):
//!   arrival order, one wake-up per handoff. Woken, it keeps its lease alive and reads the
//!   first key in the same instant, on two connections: the lease clock counts from that
//!   keep-alive, and the fence (its key's create revision) is known already, so the command
//!   starts one round trip after the wake-up. Between wake-ups the session asks again while
//!   the waiter holds a place ([`Backend::queues`]); with its watch standing, that costs
//!   etcd nothing but a keep-alive and a read every [`FRESH`] (less with a lease shorter than
//!   three times that). A waiter whose lease lapsed
//!   anyway queues again, at the end.
//! - Release, give-back and a `-n` run that found the lock held all revoke the lease, which
//!   deletes the key with it: an attempt still on its way then finds its lease gone and takes
//!   nothing. Should etcd be unreachable at that moment, the key stays until its lease's TTL.
//!
//! Every request may be sent twice (on a kept-alive connection found closed): a second grant
//! leaves a lease with no key, which lapses; a second create finds the key there and reads it
//! back as ours; keep-alive, revoke and reads change nothing twice.

mod client;
mod declare;
mod doctor;
mod history;
mod inspect;
mod lease;
mod line;
mod name;
mod open;
mod reply;
mod url;
mod view;
mod watch;
mod wire;

use std::cell::{Cell, RefCell};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

pub use client::Client;
pub use declare::BACKEND;
pub use name::check as check_name;
pub use open::client;

pub use wire::prefix_end;

use crate::backend::{
    Attempt, Backend, BackendError, Busy, Check, Expiry, Freed, History, Mode, Report, Run, Tenure,
    View, Wakeups, hostname, wall_clock_ms,
};
use crate::lease::Timings;
use crate::name::LockName;
use client::NOT_FOUND;
use inspect::holder_of;
use line::{Awaited, Standing, standing};
use watch::{EtcdWakeups, Predecessor, Watch};
use wire::{Kv, kvs, txn_range};

/// A lock on one NAME in one etcd cluster.
pub struct EtcdLock {
    client: Client,
    name: LockName,
    /// Exclusive, `--shared` or `--holders N`: said in our key's value (see `line`).
    mode: Mode,
    /// `NAME/`: every contender's key starts with it.
    prefix: String,
    /// The holder's metadata stored in the key (JSON), less the time.
    host: String,
    command: String,
    /// This run's lease and key, once granted; `None` once revoked or lost.
    place: Cell<Option<Place>>,
    /// The key before ours at the last attempt, for the waiter's watch.
    wait_on: RefCell<Option<Predecessor>>,
    /// The key held, for `LOCKED_RUN_KEY` (see [`Backend::key`]).
    held_key: RefCell<Option<String>>,
    /// What was said once with `-v` about the lease's length.
    said: Cell<bool>,
    /// The send instant of the last grant or keep-alive that etcd answered with a live lease.
    kept_alive: Cell<Option<Instant>>,
    /// The TTL etcd granted this run's lease, in seconds.
    granted: Cell<u64>,
    /// What the last attempt of a waiter answered, while its standing holds (see `unchanged`).
    last_busy: RefCell<Option<Attempt>>,
    /// The watch confirmed and not fired yet, by its number, and what it awaits.
    watching: RefCell<Option<(u64, Awaited)>>,
    /// The number of the last watch opened.
    watches: Cell<u64>,
    /// The revision of the event that woke this waiter, until the next attempt reads the line.
    woken_at: Cell<i64>,
}

/// The longest a waiter's heartbeat between wake-ups may go without asking etcd (see
/// `unchanged`): as long as a place lasts on Redis, so that a member that stopped answering
/// (its watch silent, its connection open) is found out as soon there. A shorter lease is
/// kept alive every third of it, as etcd's own sessions do (see `EtcdLock::fresh`).
const FRESH: Duration = crate::backend::KEEP_ALIVE;

/// A lease of this run and its key `NAME/<lease hex>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    lease: i64,
    /// The key's create revision, once it exists.
    created: Option<i64>,
}

/// What one round of an attempt found.
enum Round {
    Done(Attempt),
    /// Our key vanished between two reads (a `release --force`, a lapsed lease): once more.
    Again,
}

impl EtcdLock {
    /// The lock `name` in the cluster `client` talks to; `command` is shown to `status`.
    pub fn on(client: Client, name: LockName, command: &str) -> EtcdLock {
        EtcdLock {
            client,
            mode: Mode::Exclusive,
            prefix: format!("{name}/"),
            name,
            host: hostname(),
            command: command.to_owned(),
            place: Cell::new(None),
            wait_on: RefCell::new(None),
            held_key: RefCell::new(None),
            said: Cell::new(false),
            kept_alive: Cell::new(None),
            granted: Cell::new(0),
            last_busy: RefCell::new(None),
            watching: RefCell::new(None),
            watches: Cell::new(0),
            woken_at: Cell::new(0),
        }
    }

    /// The same lock, held in `mode`.
    pub fn with_mode(mut self, mode: Mode) -> EtcdLock {
        self.mode = mode;
        self
    }

    fn key_of(&self, lease: i64) -> String {
        format!("{}{lease:x}", self.prefix)
    }

    /// The key a waiter waits on, as the last attempt found it.
    fn waits_on(&self) -> Option<Predecessor> {
        self.wait_on.borrow().clone()
    }

    /// The value of our key: who holds (or waits), for `status` and the waiters' messages.
    fn value(&self) -> Vec<u8> {
        let (mode, limit) = line::mode_fields(self.mode);
        json!({
            "mode": mode,
            "limit": limit,
            "host": self.host,
            "pid": std::process::id(),
            "command": self.command,
            "since": wall_clock_ms(),
        })
        .to_string()
        .into_bytes()
    }

    /// The key that holds the lock now, if any.
    async fn holder_key(&self, deadline: Instant) -> Result<Option<wire::Kv>, BackendError> {
        let reply = self
            .client
            .must("/v3/kv/range", &wire::range_first(&self.prefix), deadline)
            .await?;
        Ok(kvs(&reply).into_iter().next())
    }

    fn acquired(&self, key: String, created: i64) -> Attempt {
        *self.held_key.borrow_mut() = Some(key);
        Attempt::Acquired {
            fence: created as u64,
        }
    }

    async fn round(
        &self,
        timings: &Timings,
        listen: bool,
        deadline: Instant,
    ) -> Result<Round, BackendError> {
        if let Some(attempt) = self.unchanged() {
            return Ok(Round::Done(attempt));
        }
        self.wait_on.replace(None);
        self.last_busy.replace(None);
        // 1. A live lease: ours kept alive, or a new one. A waiter whose key exists reads the
        // line in the same instant (its key, on this lease, needs no write: nothing to fsync
        // on the way to a handoff), each request on a connection of its own.
        let (lease, known) = match self.place.get() {
            Some(Place {
                lease,
                created: Some(created),
            }) => {
                let key = self.key_of(lease);
                // Woken by the key before ours going, an exclusive waiter is most likely the
                // first now: the first key alone says so (one range, etcdctl's read).
                let woken = self.woken_at.get();
                if woken > 0 && self.mode == Mode::Exclusive {
                    let (alive, first) = tokio::join!(
                        self.keep_alive(lease, deadline),
                        self.first_is(&key, created, woken, deadline)
                    );
                    if !alive? {
                        self.woken_at.set(0);
                        (self.lapsed(timings, deadline).await?, None)
                    } else if first? {
                        self.woken_at.set(0);
                        return Ok(Round::Done(self.acquired(key, created)));
                    } else {
                        let view = self.view(&key, created, true, deadline).await?;
                        (lease, Some((created, view)))
                    }
                } else {
                    let (alive, view) = tokio::join!(
                        self.keep_alive(lease, deadline),
                        self.view(&key, created, true, deadline)
                    );
                    match alive? {
                        true => (lease, Some((created, view?))),
                        false => (self.lapsed(timings, deadline).await?, None),
                    }
                }
            }
            Some(place) if self.keep_alive(place.lease, deadline).await? => (place.lease, None),
            Some(_) => (self.lapsed(timings, deadline).await?, None),
            None => {
                // -n: a run that will not wait does not queue, even for an instant.
                if !listen {
                    if let Some(attempt) = self.refused_at_once(deadline).await? {
                        return Ok(Round::Done(attempt));
                    }
                }
                (self.grant(timings, deadline).await?, None)
            }
        };
        let key = self.key_of(lease);
        let line = match known {
            Some((created, view)) => self.standing_in(&key, created, view, deadline).await?,
            None => {
                // 2. Our key, created if absent, in one transaction with what decides our
                // standing: the first key, and the keys before ours (an exclusive run: the
                // key just before ours, the one it would watch, as the second of the last
                // two; a line has ours last, as it was just made).
                let before = match self.mode {
                    Mode::Exclusive => wire::last_created(&self.prefix, 2),
                    _ => json!({ "request_range": wire::range_line(&self.prefix) }),
                };
                let first = wire::first_created(&self.prefix);
                let create = wire::txn(
                    &[wire::absent(&key)],
                    &[wire::put(&key, &self.value(), lease), first.clone(), before],
                    &[wire::get(&key), first],
                );
                let reply = match self.client.call("/v3/kv/txn", &create, deadline).await? {
                    Ok(reply) => reply,
                    // The lease lapsed between the keep-alive and the put.
                    Err(status) if status.code == NOT_FOUND => {
                        self.place.set(None);
                        return Ok(Round::Again);
                    }
                    Err(status) => return Err(self.client.refused(&status)),
                };
                let made = reply["succeeded"] == true;
                let created = match made {
                    true => wire::revision(&reply),
                    false => match kvs(txn_range(&reply, 0)).first() {
                        Some(kv) => kv.create_revision,
                        None => return Ok(Round::Again),
                    },
                };
                self.place.set(Some(Place {
                    lease,
                    created: Some(created),
                }));
                let Some(first) = kvs(txn_range(&reply, 1)).into_iter().next() else {
                    return Ok(Round::Again);
                };
                // An exclusive run knows from the first key alone whether it holds.
                if self.mode == Mode::Exclusive && first.create_revision == created {
                    return Ok(Round::Done(self.acquired(key, created)));
                }
                match made {
                    true => {
                        let before = kvs(txn_range(&reply, 2))
                            .into_iter()
                            .filter(|kv| kv.create_revision < created);
                        let before: Vec<Kv> = match self.mode {
                            Mode::Exclusive => {
                                std::iter::once(first).chain(before.take(1)).collect()
                            }
                            _ => before.collect(),
                        };
                        Some((created, before, created))
                    }
                    // Our key was there already (a create whose reply was lost): read.
                    false => {
                        let view = self.view(&key, created, true, deadline).await?;
                        self.standing_in(&key, created, view, deadline).await?
                    }
                }
            }
        };
        let Some((created, before, revision)) = line else {
            return Ok(Round::Again);
        };
        match standing(self.mode, &before) {
            Standing::Holds => {
                if matches!(self.mode, Mode::Holders(_)) && revision > created {
                    self.tell_the_next(&key, lease, created, deadline).await;
                }
                Ok(Round::Done(self.acquired(key, created)))
            }
            Standing::Mismatch(theirs) => {
                self.step_aside(lease, created, deadline).await;
                Ok(Round::Done(Attempt::Mismatch { theirs }))
            }
            Standing::Waits(awaited) => {
                let busy = busy(&before[0]);
                if !listen {
                    self.step_aside(lease, created, deadline).await;
                } else {
                    self.wait_on.replace(Some(Predecessor {
                        awaited,
                        from: revision + 1,
                    }));
                    self.last_busy.replace(Some(busy.clone()));
                }
                Ok(Round::Done(busy))
            }
        }
    }
}

/// Held by the key `holder`: its end is its holder's business (a release or a lapse, seen by
/// the watch), not a time to sleep until.
pub(super) fn busy(holder: &wire::Kv) -> Attempt {
    Attempt::Busy(Busy {
        holder: holder_of(holder),
        expiry: Expiry::WithHolder,
    })
}

#[async_trait::async_trait(?Send)]
impl Backend for EtcdLock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    /// While it has a key, a waiter asks again every [`crate::backend::KEEP_ALIVE`]`/3`; an
    /// attempt keeps its lease alive and reads the line unless its watch stands and it did
    /// both within [`FRESH`] or a third of its lease (see `view`).
    fn queues(&self) -> bool {
        self.place.get().is_some()
    }

    /// `NAME/<lease hex>` once held; `NAME/` before.
    fn key(&self) -> String {
        self.held_key
            .borrow()
            .clone()
            .unwrap_or_else(|| self.prefix.clone())
    }

    /// The key is the token: an operator frees a holder by it.
    fn token(&self) -> String {
        self.key().to_owned()
    }

    async fn give_back(&self, timeout: Duration) -> Result<bool, BackendError> {
        self.leave(Instant::now() + timeout).await
    }

    async fn try_acquire(&self, timings: &Timings, listen: bool) -> Result<Attempt, BackendError> {
        let deadline = Instant::now() + self.client.connect_timeout().min(timings.ttl / 2);
        for _ in 0..3 {
            if let Round::Done(attempt) = self.round(timings, listen, deadline).await? {
                return Ok(attempt);
            }
        }
        Err(BackendError::Transient(format!(
            "this run's key for lock {} kept vanishing (someone deletes the keys under {})",
            self.name, self.prefix
        )))
    }

    /// Keeps the lease alive, and checks that our key is still there: a `release --force` or
    /// a hand delete leaves the lease. The session counts the lease from the instant this was
    /// sent, with `--ttl`, which is at most what etcd granted.
    async fn renew(&self, _timings: &Timings, timeout: Duration) -> Result<bool, BackendError> {
        let Some(Place {
            lease,
            created: Some(created),
        }) = self.place.get()
        else {
            return Ok(false);
        };
        let deadline = Instant::now() + timeout;
        if !self.keep_alive(lease, deadline).await? {
            return Ok(false);
        }
        let key = self.key_of(lease);
        let reply = self
            .client
            .must(
                "/v3/kv/txn",
                &wire::txn(&[], &[wire::get(&key)], &[]),
                deadline,
            )
            .await?;
        let still = kvs(txn_range(&reply, 0))
            .first()
            .is_some_and(|kv| kv.create_revision == created);
        if !still {
            tracing::info!("the key {key} of lock {} was deleted", self.name);
        }
        Ok(still)
    }

    /// Revokes the lease, which deletes the key in the same step. `Ok(false)` when the lease
    /// was gone already. With `keep_for` (`--min-hold`), the key is first moved to a lease of
    /// its own that lasts that long (whole seconds, at least etcd's minimum): it keeps its
    /// create revision, so it holds the lock until that lease ends, and its waiters wake then.
    /// `run` goes in the history: a history that cannot be written is a warning, never a
    /// failed release. Without `keep_for`, its record is sent with the revoke, on a connection
    /// of its own, in a transaction that also deletes our key (if still ours): etcd commits
    /// the two together as a rule (one fsync), and neither waits for the other, so the
    /// history adds no round trip to the release nor to the run's end. The revoke alone says
    /// whether the release went through.
    async fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError> {
        let deadline = Instant::now() + timeout;
        // The history gets a deadline of its own: a release that used up its time still
        // leaves its run in it.
        let by = Instant::now() + self.client.connect_timeout();
        let (released, remembered) = match (keep_for, run, self.place.get()) {
            (
                None,
                Some(run),
                Some(Place {
                    lease,
                    created: Some(created),
                }),
            ) => {
                let key = self.key_of(lease);
                tokio::join!(
                    self.let_go(None, deadline),
                    self.remember(run, Some((&key, created)), by)
                )
            }
            _ => {
                let released = self.let_go(keep_for, deadline).await;
                let remembered = match run {
                    Some(run) => self.remember(run, None, by).await,
                    None => Ok(()),
                };
                (released, remembered)
            }
        };
        crate::backend::unrecorded(&self.name, &released, remembered);
        released
    }

    /// A watch on the key before ours, from the revision after the read that found it: it
    /// covers the time since that attempt.
    async fn subscribe(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError> {
        let Some(on) = self.waits_on() else {
            let none = EtcdWakeups {
                lock: self,
                watch: None,
            };
            return Ok((Box::new(none), false));
        };
        let watch = Watch::open(self, &on).await?;
        let wakeups = EtcdWakeups {
            lock: self,
            watch: Some(watch),
        };
        // The connections the wake-up's requests go on, opened now, while nothing waits on
        // them.
        self.client
            .warm(Instant::now() + self.client.connect_timeout())
            .await;
        Ok((Box::new(wakeups), true))
    }
}

#[async_trait::async_trait(?Send)]
impl View for EtcdLock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    async fn inspect(&self) -> Result<Report, BackendError> {
        self.report().await
    }

    async fn force_release(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        self.force(token).await
    }

    async fn history(&self, limit: usize) -> Result<History, BackendError> {
        self.history_here(limit).await
    }

    async fn checks(&self) -> Vec<Check> {
        doctor::check_etcd(&self.client, &self.name).await
    }
}
