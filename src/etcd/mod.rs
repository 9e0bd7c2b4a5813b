//! The consensus backend, `etcd://host:port[,host:port...]`: the lock in an etcd v3 cluster,
//! where every write is committed through Raft, so the fence (a create revision) never
//! repeats, also across a failover of etcd's leader. Spoken in etcd's gRPC API (`grpc`,
//! `client`), one HTTP/2 connection a run.
//!
//! The lock is etcd's own recipe (`client/v3/concurrency/mutex.go`), so that `locked-run` and
//! `etcdctl lock NAME` exclude each other on the same NAME:
//!
//! - A run's key is `NAME/<lease id in hex>`, created only if absent, with its holder's
//!   metadata and mode as the value (JSON, for `status` and the other runs; etcdctl's value is
//!   empty: an exclusive run's).
//! - The key under `NAME/` with the lowest create revision holds the lock (with `--shared`
//!   and `--holders N`, the keys `line` says). Its create revision is the fence: etcd's
//!   cluster-wide revision, strictly increasing.
//! - A waiter keeps its key and watches the key just before its own (the highest create
//!   revision below its own) for a delete (`line` says what else, in the other modes):
//!   arrival order, one wake-up per handoff.
//!
//! Two leases a run, so that a waiter that is gone holds nobody up for long (DESIGN, "Fair
//! waiting"): the holding lease (TTL `--ttl` rounded up to whole seconds; etcd may raise it to
//! its minimum), on which the lease clock runs, and, for a run that waits, a queue lease of
//! [`KEEP_ALIVE`] (etcd's shortest lease, 2 s, unless the cluster's is longer), kept alive on
//! every heartbeat (`KEEP_ALIVE / 3`). A waiter's key lives on its queue lease: a waiter
//! SIGKILLed stops keeping it alive, and etcd deletes its key once it lapses, about 2 s later,
//! waking the one behind. The grant's mark is the move of the key to the holding lease: the
//! woken waiter rewrites its key (value and create revision kept, the holder's metadata
//! renewed) onto its holding lease in the same transaction that confirms it is first (etcd
//! compares a whole key range: every key under `NAME/` was created at its revision or later),
//! so no key is on a holding lease that did not hold, and a holder's key, once moved, is never
//! deleted before its lease, whatever its keep-alives do (the lease clock stops its command
//! before that). A run that finds NAME free creates its key on the holding lease in one
//! transaction whose comparison is that `NAME/` is empty. `how-it-works.md` gives the argument.
//!
//! A release deletes the key in one transaction with the run's history record, and leaves its
//! leases, which hold nothing then, to lapse; a release after a request of its run went
//! unanswered, a give-back and a `-n` run that found the lock held revoke their leases, which
//! deletes the key with them: an attempt still on its way then finds its lease gone and takes
//! nothing. Should etcd be unreachable at that moment, the key stays until its lease's TTL.
//!
//! Every request may be sent twice (on a connection found closed): a second grant leaves a
//! lease with no key, which lapses; a second create finds the key there and reads it back as
//! ours; a second mark finds the key on the holding lease already (its comparison fails, its
//! reads say so); keep-alive, revoke and reads change nothing twice.

mod client;
mod declare;
mod doctor;
mod grpc;
mod history;
mod inspect;
mod keepalive;
mod leases;
mod line;
mod members;
mod name;
mod open;
mod place;
mod proto;
mod round;
mod url;
mod watch;
mod wire;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

pub use client::Client;
pub use declare::BACKEND;
pub use name::check as check_name;
pub use open::client;

use crate::backend::{
    Attempt, Backend, BackendError, Busy, Check, Expiry, Freed, History, KEEP_ALIVE, Mode, Report,
    Run, Tenure, View, Wakeups, hostname, wall_clock_ms,
};
use crate::lease::Timings;
use crate::name::LockName;
use inspect::holder_of;
use line::Awaited;
use round::Round;
use watch::{EtcdWakeups, Predecessor, Watch};

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
    /// What the run has of the lock; never held across an await.
    state: Mutex<State>,
}

/// One of the run's leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Lease {
    id: i64,
    /// The TTL etcd granted it, in seconds.
    granted: u64,
    /// The send instant of the last grant or keep-alive that etcd answered with it alive.
    kept: Instant,
}

/// The run's key `NAME/<lease hex>`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Place {
    key: String,
    created: i64,
    /// On the holding lease: the grant's mark (a key made there, or moved there by the
    /// transaction that found it first).
    marked: bool,
}

#[derive(Default)]
struct State {
    /// The lease the lock is held on, once granted; `None` once revoked or lost.
    hold: Option<Lease>,
    /// The lease of a waiter's place in the line; `None` before it queued, once it lapsed,
    /// and after a give-back.
    queue: Option<Lease>,
    place: Option<Place>,
    /// The key before ours at the last attempt, for the waiter's watch.
    wait_on: Option<Predecessor>,
    /// The key held, for `LOCKED_RUN_KEY` (see [`Backend::key`]).
    held_key: Option<String>,
    /// What was said once with `-v` about a lease's length.
    said: bool,
    /// What the last attempt of a waiter answered, while its standing holds.
    last_busy: Option<Attempt>,
    /// The watch confirmed and not fired yet: its number, what it awaits, and the connection
    /// it is on.
    watching: Option<(u64, Awaited, u64)>,
    /// When the last attempt read where the waiter stands.
    settled: Option<Instant>,
    /// The key an exclusive waiter waits on was the first when it read the line: once that
    /// key goes, no key is before its own (keys before it only go, never come).
    behind_first: bool,
    /// The number of the last watch opened.
    watches: u64,
    /// The revision of the event that woke this waiter, until the next attempt reads the line.
    woken_at: i64,
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
            state: Mutex::new(State::default()),
        }
    }

    /// The same lock, held in `mode`.
    pub fn with_mode(mut self, mode: Mode) -> EtcdLock {
        self.mode = mode;
        self
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key_of(&self, lease: i64) -> String {
        format!("{}{lease:x}", self.prefix)
    }

    /// The key a waiter waits on, as the last attempt found it.
    fn waits_on(&self) -> Option<Predecessor> {
        self.st().wait_on.clone()
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

    fn acquired(&self, place: &Place) -> Attempt {
        let mut st = self.st();
        st.held_key = Some(place.key.clone());
        st.wait_on = None;
        st.last_busy = None;
        Attempt::Acquired {
            fence: place.created as u64,
        }
    }
}

/// Held by the key `holder`: its end is its holder's business (a release or a lapse, seen by
/// the watch), not a time to sleep until.
fn busy(holder: &wire::Kv) -> Attempt {
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

    /// While it has a place in the line, a waiter asks again every
    /// [`KEEP_ALIVE`]`/3`: its queue lease is kept alive then (see `round`).
    fn queues(&self) -> bool {
        self.st().place.as_ref().is_some_and(|p| !p.marked)
    }

    /// `NAME/<lease hex>` once held; `NAME/` before.
    fn key(&self) -> String {
        self.st()
            .held_key
            .clone()
            .unwrap_or_else(|| self.prefix.clone())
    }

    /// The key is the token: an operator frees a holder by it.
    fn token(&self) -> String {
        self.key()
    }

    async fn give_back(&self, timeout: Duration) -> Result<bool, BackendError> {
        self.leave(Instant::now() + timeout).await
    }

    async fn try_acquire(&self, timings: &Timings, listen: bool) -> Result<Attempt, BackendError> {
        let started = Instant::now();
        let deadline = started + self.client.connect_timeout().min(timings.ttl / 2);
        for _ in 0..3 {
            if let Round::Done(attempt) = self.round(timings, listen, started, deadline).await? {
                return Ok(attempt);
            }
        }
        Err(BackendError::Transient(format!(
            "this run's key for lock {} kept vanishing (someone deletes the keys under {})",
            self.name, self.prefix
        )))
    }

    /// Keeps the holding lease alive, and checks that our key is still there: a `release
    /// --force` or a hand delete leaves the lease. The session counts the lease from the
    /// instant this was sent, with `--ttl`, which is at most what etcd granted.
    async fn renew(&self, _timings: &Timings, timeout: Duration) -> Result<bool, BackendError> {
        let (Some(hold), Some(place)) = ({
            let st = self.st();
            (st.hold, st.place.clone())
        }) else {
            return Ok(false);
        };
        let deadline = Instant::now() + timeout;
        let read = wire::txn(Vec::new(), vec![wire::get(&place.key)], Vec::new());
        let (alive, reply) = tokio::join!(
            self.keep_alive_hold(hold, deadline),
            self.client
                .must::<_, proto::etcdserverpb::TxnResponse>(wire::TXN, &read, deadline)
        );
        if !alive? {
            return Ok(false);
        }
        let still = wire::kvs(wire::txn_range(&reply?, 0))
            .first()
            .is_some_and(|kv| kv.create_revision == place.created);
        if !still {
            tracing::info!("the key {} of lock {} was deleted", place.key, self.name);
        }
        Ok(still)
    }

    /// Deletes our key (if still ours) in one transaction with the run's history record, the
    /// way `etcdctl lock`'s release is one delete: the leases, holding nothing then, are left
    /// to lapse by themselves (a waiter's queue lease is, too), so a handoff costs etcd this
    /// transaction and the next holder's grant. They are revoked all the same (which deletes
    /// whatever is on them) when the transaction found the key no longer ours (a `release
    /// --force` may have left the lease), went unanswered (the key may still be there: the
    /// revoke gets a deadline of its own, half the release's, and the line says why the
    /// transaction failed), or when a request of this run went unanswered before: that one, a
    /// take landing late, would otherwise make a key on a lease nobody keeps nor revokes, and
    /// NAME stay held by a run that has ended until the lease lapsed. Without a record to
    /// send, as before: revoked.
    /// With `keep_for` (`--min-hold`), the key is first moved to a lease of its own that lasts
    /// that long (whole seconds, at least etcd's minimum): it keeps its create revision, so it
    /// holds the lock until that lease ends, and its waiters wake then; the record goes on its
    /// own. A history that cannot be written is a warning, never a failed release.
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
        let place = self.st().place.clone();
        let (released, remembered) = match (keep_for, run, place) {
            (None, Some(run), Some(place)) => {
                // The release's own time: after a lost lease the session gives it no longer
                // than the lease may live on.
                let sent = self.remember(run, Some((&place.key, place.created)), deadline);
                let remembered = sent.await;
                // Half the release's time again, at most: enough for a new connection to a
                // member that answers, and a dead one (whose lease lapses meanwhile anyway)
                // holds the run's end up that much longer, not twice.
                let again = || self.let_go(None, Instant::now() + timeout / 2);
                match remembered {
                    Ok(true) if !self.client.unanswered() => {
                        self.forget();
                        (Ok(true), Ok(true))
                    }
                    Ok(true) => {
                        let _ = again().await;
                        (Ok(true), Ok(true))
                    }
                    Ok(false) => (again().await, Ok(false)),
                    Err(e) => match again().await {
                        Ok(revoked) => (Ok(revoked), Err(e)),
                        Err(_) => (Err(e.clone()), Err(e)),
                    },
                }
            }
            _ => {
                let released = self.let_go(keep_for, deadline).await;
                let remembered = match run {
                    Some(run) => self.remember(run, None, by).await,
                    None => Ok(false),
                };
                (released, remembered)
            }
        };
        crate::backend::unrecorded(&self.name, &released, remembered);
        released
    }

    /// A watch on what the last attempt awaits, from the revision after the read that found
    /// it: it covers the time since that attempt.
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

/// How long a waiter's place lasts unless kept alive: the queue lease asks for this.
const QUEUE_TTL: Duration = KEEP_ALIVE;

/// The longest a waiter trusts its watch without reading where it stands: a safety net for a
/// watch that went silent where no request of the waiter's shows it (its connection given up
/// closes it, which breaks the watch at once). The read costs etcd the line's keys (sorted by
/// revision): rare enough that 300 waiters ask it 10 times a second.
const RESETTLE: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;

    /// The library's `Lock` moves into `tokio::spawn` on a multi-thread runtime: the lock
    /// must be shared by its tasks (`Sync`), and what its attempts await must be `Send`.
    #[test]
    fn the_lock_is_send_and_sync_and_so_are_its_attempts() {
        fn sync<T: Send + Sync>(_: &T) {}
        fn send<T: Send>(_: T) {}
        let url = url::parse("etcd://127.0.0.1:1").unwrap();
        let client = Client::new(url, None, Duration::from_secs(1));
        let lock = EtcdLock::on(client, LockName::new("job").unwrap(), "true");
        sync(&lock);
        let timings = Timings::new(Duration::from_secs(30), None, None).unwrap();
        let deadline = Instant::now();
        send(lock.round(&timings, true, deadline, deadline));
        send(lock.leave(deadline));
        send(lock.let_go(None, deadline));
        send(lock.report());
    }
}
