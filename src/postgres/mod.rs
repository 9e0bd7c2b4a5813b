//! The database backend, `postgres://` (also `postgresql://`): the lock in tables of a
//! PostgreSQL database, for teams whose shared store is the database they already run.
//!
//! Tenure is a lease row, never a session advisory lock (a server may notice a client gone long
//! before or after the client does, and a transaction-pooling PgBouncer breaks such locks):
//! `locked_run.holder` holds one row per holder, live while `expires_at > clock_timestamp()`,
//! the expiry always written as `clock_timestamp() + T` and judged by the database's clock,
//! while the run keeps the lease clock on its own monotonic clock from each send instant,
//! exactly as for Redis. `locked_run.fence` keeps a counter per NAME, raised by every grant:
//! `LOCKED_RUN_FENCE`. The SQL, and why no interleaving admits two holders, is in `sql.rs`;
//! the tables in `schema.rs`.
//!
//! Waiters queue in arrival order (`locked_run.queue`), each place kept alive on the server's
//! clock by the waiter asking again at least every keep-alive/3; a release notifies (`NOTIFY`)
//! the waiter whose turn it is on a channel of its own, which only shortens its wait: behind a
//! transaction-pooling pooler, where notifications may not arrive, waiting stays correct and
//! fair, only slower.

mod client;
mod conn;
mod doctor;
mod frames;
mod grant;
mod history;
mod inspect;
mod listen;
mod open;
mod pgpass;
mod replication;
mod schema;
mod sql;
mod tls;
mod url;

use std::cell::{Cell, RefCell};
use std::time::Duration;

use tokio::time::Instant;

pub use open::client;

use crate::backend::{
    Attempt, Backend, BackendError, Check, Freed, History, Mode, Report, Run, Tenure, View,
    Wakeups, hostname, new_token,
};
use crate::backend::{Can, Declaration, Modes, Queue, Several, any_name, says};
use crate::endpoints::Scheme;
use crate::lease::Timings;
use crate::name::LockName;
use crate::plumbing::exit::Failure;
use client::Client;
use sql::{Commit, Tx};

/// How long a token given back stays buried: an attempt of it that reaches the server later
/// than this (held up in a proxy, a stalled network) could still take the lock.
pub const BURY_FOR: Duration = Duration::from_secs(600);

/// A PostgreSQL database (`postgres://`, `postgresql://`), as the registry knows it.
pub const BACKEND: Declaration = Declaration {
    called: "postgres://",
    schemes: &[
        Scheme::plain("postgres", "postgres://[user@]host[:port][,...]/DB"),
        Scheme::plain("postgresql", ""),
    ],
    help: "postgres://[user@]host[:port][,host[:port]...]/DB[?sslmode=verify-full] (also \
           postgresql://) for a PostgreSQL database (the primary found among several hosts)",
    doctor: "a PostgreSQL database (connection, TLS, primary, tables, privileges, \
             synchronous_commit)",
    modes: Modes {
        holders: Can::Yes,
        shared: Can::Yes,
        wait_replicas: Can::No(
            "on PostgreSQL a grant commits with synchronous_commit = on, and so waits for the \
             synchronous standbys that synchronous_standby_names lists",
        ),
        queue: Queue::Fair,
    },
    several: Several::Refused(says!(
        "a postgres:// URL names one database: give one (several hosts go in it: \
         postgres://HOST:PORT,HOST:PORT/DB), and no other URL"
    )),
    // The --tls-* files apply (sslmode says whether TLS is used).
    no_tls: None,
    name_rule: any_name,
    open: |store, spec| {
        let client = client(store.endpoints, store.url().url()).map_err(Failure::usage)?;
        Ok(Box::new(
            PgLock::on(client, spec.name.clone(), store.how.command).with(spec.mode, spec.fair),
        ))
    },
};

/// A lock on one NAME in one database.
pub struct PgLock {
    client: Client,
    name: LockName,
    /// The NAME as an SQL literal.
    n: String,
    mode: Mode,
    fair: bool,
    /// The owner's unique token; a token given back is buried and replaced.
    token: RefCell<String>,
    /// A request with the current token that could take the lock went unanswered: the
    /// release buries the token (one landing later must not take the lock again).
    stray: Cell<bool>,
    /// The last attempt may hold a place in the queue.
    queued: Cell<bool>,
    /// The LISTEN on this token's channel was committed with (or before) the last attempt.
    covered: Cell<bool>,
    host: String,
    command: String,
}

impl PgLock {
    /// The lock `name` in the database `client` talks to; `command` is shown to `status`.
    pub fn on(client: Client, name: LockName, command: &str) -> PgLock {
        PgLock {
            client,
            n: sql::text(name.as_str()),
            name,
            mode: Mode::Exclusive,
            fair: true,
            token: RefCell::new(new_token()),
            stray: Cell::new(false),
            queued: Cell::new(false),
            covered: Cell::new(false),
            host: hostname(),
            command: command.to_owned(),
        }
    }

    /// The same lock, held in `mode`, its waiters `fair` or racing (`--no-fair`).
    pub fn with(mut self, mode: Mode, fair: bool) -> PgLock {
        self.mode = mode;
        self.fair = fair;
        self
    }

    fn token_now(&self) -> String {
        self.token.borrow().clone()
    }

    /// `exclusive`, `shared` or `holders`, as the rows say it.
    fn mode_word(&self) -> &'static str {
        match self.mode {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Holders(_) => "holders",
        }
    }

    /// Notes a request with the current token that went unanswered.
    fn astray<T>(&self, result: Result<T, BackendError>) -> Result<T, BackendError> {
        if matches!(&result, Err(e) if e.is_transient() && !e.is_unsent()) {
            self.stray.set(true);
        }
        result
    }

    async fn renew_within(&self, ttl: Duration, timeout: Duration) -> Result<bool, BackendError> {
        let mut tx = Tx::default();
        sql::prologue(&mut tx, timeout, Commit::Standby);
        let at = sql::renew(&mut tx, &self.n, &self.token_now(), ttl);
        let sets = self
            .client
            .exec(&tx, Instant::now() + timeout, false)
            .await?;
        Ok(sets.get(at).is_some_and(|rows| rows.len() == 1))
    }

    /// Releases (or keeps until `keep_for` ends), and in the same round trip adds `run` to
    /// the history: its failure is a warning, never a failed release.
    async fn release_within(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError> {
        let token = self.token_now();
        let mut tx = Tx::default();
        sql::prologue(&mut tx, timeout, Commit::Standby);
        sql::lock(&mut tx, &self.n);
        if self.stray.get() {
            sql::bury(&mut tx, &self.n, &token, BURY_FOR);
        }
        sql::let_go(&mut tx, &self.n, &token, keep_for);
        sql::expire(&mut tx, &self.n);
        sql::wake(&mut tx, &self.n, self.mode.holders());
        let at = sql::ours(&mut tx);
        let record = run.map(|run| history::record(&self.n, run, timeout));
        let deadline = Instant::now() + timeout;
        // The history's answer comes right after the release's; it gets a little time of its
        // own should the release have used up its deadline.
        let then_by = deadline.max(Instant::now() + Duration::from_secs(1));
        let (released, remembered) = self
            .client
            .exec_then(&tx, record.as_ref(), deadline, then_by)
            .await;
        let released = released.map(|sets| client::first(&sets[at..]) == Some("true"));
        if let Some(remembered) = remembered {
            crate::backend::unrecorded(&self.name, &released, remembered);
        }
        released
    }

    async fn give_back_within(&self, timeout: Duration) -> Result<bool, BackendError> {
        let token = self.token_now();
        let mut tx = Tx::default();
        sql::prologue(&mut tx, timeout, Commit::Standby);
        sql::lock(&mut tx, &self.n);
        sql::bury(&mut tx, &self.n, &token, BURY_FOR);
        sql::leave_queue(&mut tx, &self.n, &token);
        sql::let_go(&mut tx, &self.n, &token, None);
        sql::expire(&mut tx, &self.n);
        sql::wake(&mut tx, &self.n, self.mode.holders());
        let at = sql::ours(&mut tx);
        let sets = self
            .client
            .exec(&tx, Instant::now() + timeout, true)
            .await?;
        Ok(client::first(&sets[at..]) == Some("true"))
    }
}

#[async_trait::async_trait(?Send)]
impl Backend for PgLock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    fn queues(&self) -> bool {
        self.queued.get()
    }

    fn races(&self) -> bool {
        !self.fair
    }

    /// `locked_run.holder/NAME`.
    fn key(&self) -> String {
        format!("locked_run.holder/{}", self.name)
    }

    fn token(&self) -> String {
        self.token_now()
    }

    async fn give_back(&self, timeout: Duration) -> Result<bool, BackendError> {
        self.queued.set(false);
        let given = self.give_back_within(timeout).await;
        self.token.replace(new_token());
        self.stray.set(false);
        self.covered.set(false);
        if let Some(conn) = self.client.current() {
            conn.forget_notifications();
        }
        given
    }

    async fn try_acquire(&self, timings: &Timings, listen: bool) -> Result<Attempt, BackendError> {
        let attempt = self.attempt(timings, listen).await;
        self.astray(attempt)
    }

    async fn renew(&self, timings: &Timings, timeout: Duration) -> Result<bool, BackendError> {
        self.renew_within(timings.ttl, timeout).await
    }

    async fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError> {
        self.release_within(keep_for, timeout, run).await
    }

    async fn subscribe(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError> {
        self.listen().await
    }
}

#[async_trait::async_trait(?Send)]
impl View for PgLock {
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
        doctor::checks(&self.client, &self.name).await
    }
}
