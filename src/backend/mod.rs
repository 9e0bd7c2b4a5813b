//! The lock as the session sees it: one small interface that every backend implements (one
//! Redis server, Redlock over several, the host-local `file://`), and [`AnyBackend`], the one
//! type that holds whichever the URLs named.

use std::fmt;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::exit::Failure;
use crate::lease::Timings;

mod any;
mod spec;

pub use any::{AnyBackend, AnyWakeups};
pub use spec::{LockSpec, Mode};

/// Who holds a lock, as far as its metadata tells. Every field may be missing: another program
/// using the plain `SET lock:{NAME} token NX PX` protocol leaves none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub command: Option<String>,
    /// Wall-clock time of the acquisition, in milliseconds since the Unix epoch (for display).
    pub since_ms: Option<u64>,
    pub fence: Option<u64>,
}

impl Holder {
    pub fn is_known(&self) -> bool {
        self.host.is_some() || self.pid.is_some()
    }

    /// `since` as RFC 3339 UTC, for display and JSON.
    pub fn since(&self) -> Option<String> {
        let ms = self.since_ms?;
        let t = UNIX_EPOCH.checked_add(Duration::from_millis(ms))?;
        Some(humantime::format_rfc3339_seconds(t).to_string())
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.is_known() {
            return f.write_str("another program (no locked-run holder metadata)");
        }
        f.write_str(self.host.as_deref().unwrap_or("?"))?;
        if let Some(pid) = self.pid {
            write!(f, " pid {pid}")?;
        }
        if let Some(command) = &self.command {
            write!(f, " ({command})")?;
        }
        if let Some(since) = self.since() {
            write!(f, " since {since}")?;
        }
        if let Some(fence) = self.fence {
            write!(f, ", fence {fence}")?;
        }
        Ok(())
    }
}

/// When a held lock expires on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    In(Duration),
    /// The key has no expiry (set by another tool): it is only freed by a delete.
    Never,
    /// A host-local `flock`: it lasts exactly as long as its holder's process holds it.
    WithHolder,
    /// Not held, but `ahead` fair waiters come first; the first of them keeps its place alive
    /// for `retry_in` more (after which, should it be gone, the next may go).
    Queued {
        ahead: u32,
        retry_in: Duration,
    },
}

impl Expiry {
    /// How long until it ends by itself; `Duration::MAX` for never (for ordering).
    pub fn left(self) -> Duration {
        match self {
            Expiry::In(d) | Expiry::Queued { retry_in: d, .. } => d,
            Expiry::Never | Expiry::WithHolder => Duration::MAX,
        }
    }
}

/// A lock found held by someone else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Busy {
    pub holder: Holder,
    pub expiry: Expiry,
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Expiry::Queued { ahead, .. } = self.expiry {
            return write!(
                f,
                "free, but {ahead} waiter(s) came first and go before this run"
            );
        }
        write!(f, "held by {}", self.holder)?;
        match self.expiry {
            Expiry::In(d) => write!(f, ", lease ends in {}", crate::lease::show(d)),
            Expiry::Never => f.write_str(", with no expiry"),
            Expiry::WithHolder | Expiry::Queued { .. } => Ok(()),
        }
    }
}

/// What `status` shows of a lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The last fence token issued (the current holder's while held), if any.
    pub fence: Option<u64>,
    /// `None` when free.
    pub held: Option<Busy>,
    /// The lock's value (the owner's token) while held; compared across Redlock's servers.
    pub value: Option<String>,
    /// How many wait for it, when that can be told.
    pub waiters: Option<u64>,
    /// A backend over several servers (Redlock): what each says; `None` for one.
    pub servers: Option<Servers>,
    /// Every holder (one, or up to `limit` with `--holders`), the soonest to end first.
    pub holders: Vec<Slot>,
    /// The N of the current holders (`--holders N`; 1 for one holder), when held.
    pub limit: Option<u32>,
    /// Held in shared mode (`--shared`): `holders` lists every shared holder.
    pub shared: bool,
    /// A store that keeps no last fence once its holder is gone (etcd: a fence is a key's create
    /// revision, and the key goes with its holder): its revision now, below every next fence.
    pub revision: Option<u64>,
}

/// The backend's own part of a report over several servers (Redlock): the quorum, and each
/// server's report, or why it did not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Servers {
    pub quorum: usize,
    pub each: Vec<(String, Result<Report, BackendError>)>,
}

/// One holder of a lock, and its token (an operator frees one holder of several by it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub token: Option<String>,
    pub busy: Busy,
}

/// What `release --force` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Freed {
    /// Released: whom it was taken from (none: it was free), and the last fence issued.
    Released {
        holders: Vec<Holder>,
        fence: Option<u64>,
    },
    /// Not released, and why: a host-local lock cannot be taken from a live process.
    Kept(String),
}

/// How long a fair waiter's place in the queue lasts unless it asks again: a waiter that is
/// SIGKILLed delays those behind it by about this much, at most.
pub const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// The answer to one acquisition attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Attempt {
    Acquired {
        fence: u64,
    },
    Busy(Busy),
    /// Held by runs of another mode (another `--holders` N; a one-holder run, or a program
    /// using the plain protocol, is exclusive): every run of one NAME must use the same mode.
    Mismatch {
        theirs: Mode,
    },
}

/// A backend operation that did not get an answer it could use.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// No usable answer: refused, reset, timed out, or a server that is loading, busy or
    /// failing over. Worth retrying on a fresh connection.
    #[error("{0}")]
    Transient(String),
    /// An answer, but a refusal (READONLY replica, NOPERM, OOM, WRONGTYPE, ...): a setup problem
    /// that retrying will not fix.
    #[error("{0}")]
    Refused(String),
    /// Either of the above, for a request that never reached the lock: no connection could be
    /// made, the server refused the connection's set-up (TLS, the password, the database)
    /// before any command of the lock ran, or it turned out to be no server of the lock's kind
    /// at all. Nothing it asked for can have been taken, so nothing needs giving back, and a
    /// first contact that failed so says that nothing was taken.
    #[error("{0}")]
    Unsent(Box<BackendError>),
}

impl BackendError {
    pub fn is_transient(&self) -> bool {
        match self {
            BackendError::Transient(_) => true,
            BackendError::Refused(_) => false,
            BackendError::Unsent(error) => error.is_transient(),
        }
    }

    /// Whether the request never reached the lock (see [`BackendError::Unsent`]).
    pub fn is_unsent(&self) -> bool {
        matches!(self, BackendError::Unsent(_))
    }

    /// This error, for a request that never reached the lock.
    pub fn unsent(self) -> BackendError {
        match self {
            BackendError::Unsent(_) => self,
            error => BackendError::Unsent(Box::new(error)),
        }
    }

    /// [`BackendError::unsent`] when `unsent`, else this error as it is.
    pub fn unsent_if(self, unsent: bool) -> BackendError {
        match unsent {
            true => self.unsent(),
            false => self,
        }
    }
}

/// How a holder keeps a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tenure {
    /// A lease that expires unless renewed (Redis): renewed on the lease clock, and the
    /// command stopped before it can expire.
    Lease,
    /// A lock the kernel holds for the holder's open file (`flock`): nothing to renew, nothing
    /// to lose while the holder lives; it ends with the holder.
    Kernel,
}

/// What holds the lock: the session's only view of a backend.
pub trait Backend {
    /// The release notifications a waiter sleeps on.
    type Wakeups<'a>: Wakeups
    where
        Self: 'a;

    /// How a holder keeps the lock: what the run must do to keep it.
    fn tenure(&self) -> Tenure;

    /// Creates what a run needs and looking does not (`file://`: the directory and the lock
    /// file), once the command was found; `status` and `release` never call it.
    fn prepare(&self) -> Result<(), Failure> {
        Ok(())
    }

    /// Whether the last attempt holds a place in a queue (fair waiting, or a `--no-fair` waiter
    /// behind fair ones), which the waiter must keep alive by asking again at least every
    /// [`KEEP_ALIVE`]`/3`.
    fn queues(&self) -> bool {
        false
    }

    /// Whether this waiter races on each release (`--no-fair`), rather than wait for its turn.
    fn races(&self) -> bool {
        false
    }

    /// A waiter that ends without the lock, or with a grant it cannot use, gives back whatever
    /// its attempts may have taken (the lock, a slot, a place in the queue), also should an
    /// attempt still be on its way: one that lands later must not take the lock for a run that
    /// is gone or has gone on. Later attempts carry a fresh token. `Ok(true)` when something
    /// was held.
    fn give_back(&self, timeout: Duration) -> impl Future<Output = Result<bool, BackendError>>;

    /// Where the lock lives (`lock:{NAME}`), for the child's `LOCKED_RUN_KEY`.
    fn key(&self) -> &str;

    /// The owner's unique token, for the child's `LOCKED_RUN_TOKEN` (it changes only when a
    /// waiter gives back what it may hold).
    fn token(&self) -> String;

    /// One acquisition attempt. With `listen`, the backend may subscribe to release messages
    /// first, in the same round trip, so that a waiter is listening before it tries. An
    /// attempt whose reply was lost may have succeeded; the next attempt recognises the lock
    /// as ours.
    /// The lease asked for is `timings.ttl`: a backend keeps no lease length of its own, so
    /// the server's expiry and the lease clock's V always come from the same [`Timings`].
    fn try_acquire(
        &self,
        timings: &Timings,
        listen: bool,
    ) -> impl Future<Output = Result<Attempt, BackendError>>;

    /// Compare-and-extend to a full `timings.ttl`: `Ok(false)` when the lock is no longer ours.
    fn renew(
        &self,
        timings: &Timings,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, BackendError>>;

    /// Compare-and-release, waking waiters; with `keep_for`, leave the lock to expire after that
    /// long instead (`--min-hold`). `Ok(false)` when the lock was no longer ours.
    fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
    ) -> impl Future<Output = Result<bool, BackendError>>;

    /// The lock's state, for `status` (and `release`, which shows the holder it refuses to
    /// take the lock from without `--force`). Changes nothing.
    fn inspect(&self) -> impl Future<Output = Result<Report, BackendError>>;

    /// `release --force`: frees the lock whoever holds it (of several holders, the one whose
    /// token is `token`, or every one), never its fence counter, and wakes the waiters.
    fn force_release(
        &self,
        token: Option<&str>,
    ) -> impl Future<Output = Result<Freed, BackendError>>;

    /// Release notifications, confirmed by the server when this returns, and whether that
    /// subscription already preceded the last attempt (else the caller must try again before
    /// sleeping, or a release in between would go unseen).
    fn subscribe(&self) -> impl Future<Output = Result<(Self::Wakeups<'_>, bool), BackendError>>;
}

/// Release notifications.
pub trait Wakeups {
    /// Resolves on the next release message; `Err` when the subscription broke.
    fn next(&mut self) -> impl Future<Output = Result<Wakeup, BackendError>>;
}

/// What woke a waiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wakeup {
    /// A release, for anyone to try (a wait without a queue; `flock`'s own wake-up).
    Anyone,
    /// A release that hands the lock to the waiter at the head of the queue, by its token: the
    /// others need not ask (fair waiting).
    Turn(String),
    /// A release whose next turn is a `--no-fair` waiter's: the racers before the first fair
    /// waiter may ask.
    Race,
}

impl Wakeup {
    /// A release message: `released` for anyone, `race` for the racers, else the token whose
    /// turn it is.
    pub fn from_message(payload: &[u8]) -> Wakeup {
        match payload {
            b"" | b"released" => Wakeup::Anyone,
            b"race" => Wakeup::Race,
            token => Wakeup::Turn(String::from_utf8_lossy(token).into_owned()),
        }
    }

    /// Whether the waiter with `token` (a racer: `--no-fair`) should try again.
    pub fn for_me(&self, token: &str, racer: bool) -> bool {
        match self {
            Wakeup::Anyone => true,
            Wakeup::Race => racer,
            Wakeup::Turn(turn) => turn == token,
        }
    }
}

/// This host's name, as holders record it.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into())
}

/// The password `REDISCLI_AUTH` gives (as `redis-cli` takes it), for URLs that carry none.
pub fn env_password() -> Option<String> {
    std::env::var("REDISCLI_AUTH")
        .ok()
        .filter(|p| !p.is_empty())
}

/// Milliseconds since the Unix epoch, for holder metadata (display only, never for deadlines).
pub fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_reads_like_a_sentence() {
        let h = Holder {
            host: Some("web-3".into()),
            pid: Some(4242),
            command: Some("backup.sh".into()),
            since_ms: Some(1_764_673_200_000),
            fence: Some(17),
        };
        assert_eq!(
            h.to_string(),
            "web-3 pid 4242 (backup.sh) since 2025-12-02T11:00:00Z, fence 17"
        );
        assert_eq!(
            Holder::default().to_string(),
            "another program (no locked-run holder metadata)"
        );
    }
}
