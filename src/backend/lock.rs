//! The run's lock: the one interface a session holds a lock through, whichever backend keeps
//! it, and the release notifications a waiter sleeps on.

use std::time::Duration;

use super::{BackendError, Busy, Mode, Run};
use crate::lease::Timings;
use crate::plumbing::exit::Failure;

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

/// What holds the lock: the session's only view of a backend. Object-safe (each future boxed,
/// as object_store's one trait serves S3, GCS and local files alike), so that a session holds
/// `&dyn Backend` and never asks which backend it has.
#[async_trait::async_trait(?Send)]
pub trait Backend {
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

    /// Where the lock lives (`lock:{NAME}`, a file, a key of etcd's), for the child's
    /// `LOCKED_RUN_KEY`.
    fn key(&self) -> String;

    /// The owner's unique token, for the child's `LOCKED_RUN_TOKEN` (it changes only when a
    /// waiter gives back what it may hold).
    fn token(&self) -> String;

    /// A waiter that ends without the lock, or with a grant it cannot use, gives back whatever
    /// its attempts may have taken (the lock, a slot, a place in the queue), also should an
    /// attempt still be on its way: one that lands later must not take the lock for a run that
    /// is gone or has gone on. Later attempts carry a fresh token. `Ok(true)` when something
    /// was held.
    async fn give_back(&self, timeout: Duration) -> Result<bool, BackendError>;

    /// One acquisition attempt. With `listen`, the backend may subscribe to release messages
    /// first, in the same round trip, so that a waiter is listening before it tries. An
    /// attempt whose reply was lost may have succeeded; the next attempt recognises the lock
    /// as ours.
    /// The lease asked for is `timings.ttl`: a backend keeps no lease length of its own, so
    /// the server's expiry and the lease clock's V always come from the same [`Timings`].
    async fn try_acquire(&self, timings: &Timings, listen: bool) -> Result<Attempt, BackendError>;

    /// Compare-and-extend to a full `timings.ttl`: `Ok(false)` when the lock is no longer ours.
    async fn renew(&self, timings: &Timings, timeout: Duration) -> Result<bool, BackendError>;

    /// Compare-and-release, waking waiters; with `keep_for`, leave the lock to expire after that
    /// long instead (`--min-hold`). `Ok(false)` when the lock was no longer ours. With `run`,
    /// the run is added to the NAME's history, in the same round trip or right after, never
    /// before the release is confirmed, and never a reason for the release to fail.
    async fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError>;

    /// Release notifications, confirmed by the server when this returns, and whether that
    /// subscription already preceded the last attempt (else the caller must try again before
    /// sleeping, or a release in between would go unseen).
    async fn subscribe(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError>;
}

/// Release notifications.
#[async_trait::async_trait(?Send)]
pub trait Wakeups {
    /// Resolves on the next release message; `Err` when the subscription broke.
    async fn next(&mut self) -> Result<Wakeup, BackendError>;
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
