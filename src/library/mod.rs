//! The lock as a Rust type, for programs that want the protocol without the wrapper: every
//! backend and option the command line has, opened through the same door from the same
//! [`Endpoints`], with the same lease clock. Two ways to use it:
//!
//! - [`Lock`], step by step: [`Lock::acquire`] returns the fence token, [`Lock::extend`] and
//!   [`Lock::release`] say whether the lease was still ours. The caller keeps time itself.
//! - [`Lock::hold`], a [`Guard`]: waits for the lock as the command line does, then renews it in
//!   the background on the lease clock and tells the task to stop ([`Guard::stop_now`]) at the
//!   lease clock's kill point, before anyone else can hold the lock; [`Guard::release`], or
//!   dropping the guard, gives it back. What the command line does for a child, done for a task.
//!
//! ```no_run
//! # async fn demo() -> Result<(), locked_run::Error> {
//! use std::time::Duration;
//! use locked_run::{Endpoints, Lock, Options};
//!
//! let endpoints = Endpoints::new(["redis://127.0.0.1:6379"]);
//! let lock = Lock::open(&endpoints, "nightly-report", &Options::new(Duration::from_secs(30)))?;
//! let mut guard = lock.hold().await?;
//! let fence = guard.fence(); // pass it to the storage you write to, so it can refuse a stale holder
//! tokio::select! {
//!     _ = guard.stop_now() => { /* the lease may be lost soon: stop writing now */ }
//!     _ = async { /* the work, writing with `fence` */ } => {}
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod guard;
#[cfg(test)]
mod tests;

use std::time::Duration;

use crate::backend::Opening;
use crate::backend::{Attempt, Backend, BackendError, LockSpec, Mode};
use crate::endpoints::Endpoints;
use crate::lease::Timings;
use crate::name::LockName;
use crate::open::open;
use crate::plumbing::exit::{Exit, Failure};
use crate::session::config::Patience;

pub use guard::{Guard, Stop};

/// What went wrong, in the terms of the command line's exit statuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The name, a URL, an option, or a combination of them was refused (the command line's
    /// status 2).
    #[error("{0}")]
    Usage(String),
    /// The store could not be reached, or gave no usable answer (69). Worth retrying.
    #[error("{0}")]
    Unavailable(String),
    /// The store answered with a refusal that retrying will not fix (a read-only replica, a
    /// missing permission; 69 too).
    #[error("{0}")]
    Refused(String),
    /// [`Lock::hold`] found the lock held and was not to wait, or its wait ran out (75).
    #[error("{0}")]
    Busy(String),
}

impl From<BackendError> for Error {
    fn from(error: BackendError) -> Error {
        match error {
            BackendError::Transient(text) => Error::Unavailable(text),
            BackendError::Refused(text) => Error::Refused(text),
            BackendError::Unsent(inner) => Error::from(*inner),
        }
    }
}

impl From<Failure> for Error {
    fn from(failure: Failure) -> Error {
        match failure.exit {
            Exit::Usage => Error::Usage(failure.message),
            Exit::Conflict => Error::Busy(failure.message),
            _ => Error::Unavailable(failure.message),
        }
    }
}

/// How a lock is held and waited for: the command line's options, with its defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The lease length T (`--ttl`).
    pub ttl: Duration,
    /// R (`--renew-every`); `None`: T/6.
    pub renew_every: Option<Duration>,
    /// K (`--kill-after`): how long before the lease's last safe instant [`Guard::stop_now`]
    /// resolves; `None`: T/3.
    pub kill_after: Option<Duration>,
    /// Up to N holders at once (`--holders N`).
    pub holders: u32,
    /// Held in shared mode (`--shared`).
    pub shared: bool,
    /// Waiters served in arrival order (not `--no-fair`).
    pub fair: bool,
    /// How long [`Lock::hold`] waits for a held lock (`-w`); `None`: for as long as it takes;
    /// zero: not at all (`-n`).
    pub wait: Option<Duration>,
    /// How long one call may take, and one connection attempt (`--connect-timeout`).
    pub timeout: Duration,
}

impl Options {
    /// Lease length `ttl`, everything else as the command line's defaults.
    pub fn new(ttl: Duration) -> Options {
        Options {
            ttl,
            renew_every: None,
            kill_after: None,
            holders: 1,
            shared: false,
            fair: true,
            wait: None,
            timeout: Duration::from_secs(5),
        }
    }

    fn timings(&self) -> Result<Timings, Error> {
        Timings::new(self.ttl, self.renew_every, self.kill_after).map_err(Error::Usage)
    }

    fn spec(&self, name: LockName) -> LockSpec {
        LockSpec {
            name,
            mode: match self.shared {
                true => Mode::Shared,
                false => Mode::of_holders(self.holders),
            },
            fair: self.fair,
        }
    }

    fn patience(&self) -> Patience {
        match self.wait {
            None => Patience::Forever,
            Some(d) if d.is_zero() => Patience::NoWait,
            Some(d) => Patience::For(d),
        }
    }
}

/// A lease on one NAME, in whatever the endpoints name.
pub struct Lock {
    backend: Box<dyn Backend>,
    endpoints: Endpoints,
    name: LockName,
    options: Options,
    timings: Timings,
}

impl Lock {
    /// The lock `name` in what `url` names (a Redis server or Redlock's, an etcd cluster, a
    /// `file://` directory), with lease length `ttl` and every other option at its default.
    pub fn new(url: &str, name: &str, ttl: Duration) -> Result<Lock, Error> {
        Lock::open(&Endpoints::new([url]), name, &Options::new(ttl))
    }

    /// The lock `name` in what `endpoints` name, held as `options` say; refused as the command
    /// line refuses the same (a mode the store cannot hold, timings that leave no time to
    /// retry, a bad NAME).
    pub fn open(endpoints: &Endpoints, name: &str, options: &Options) -> Result<Lock, Error> {
        let name = LockName::new(name).map_err(Error::Usage)?;
        let timings = options.timings()?;
        let mut endpoints = endpoints.clone();
        endpoints.connect_timeout = options.timeout;
        let backend = open(&endpoints, &options.spec(name.clone()), &opening(options))?;
        backend.prepare()?;
        Ok(Lock {
            backend,
            endpoints,
            name,
            options: options.clone(),
            timings,
        })
    }

    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The lease length: what every grant and renewal asks the store for.
    pub fn ttl(&self) -> Duration {
        self.timings.ttl
    }

    /// The owner's unique token: what the store holds for us while we hold the lock.
    pub fn token(&self) -> String {
        self.backend.token()
    }

    /// Takes the lock if it is free: `Some(fence)`, strictly larger than any fence issued
    /// before on this NAME; `None` when someone else holds it.
    pub async fn acquire(&self) -> Result<Option<u64>, Error> {
        Ok(
            match self.backend.try_acquire(&self.timings, false).await? {
                Attempt::Acquired { fence } => Some(fence),
                Attempt::Busy(_) => None,
                Attempt::Mismatch { theirs } => {
                    return Err(Error::Usage(format!(
                        "lock {} is held by runs with {}, and this one asks for {}",
                        self.name,
                        theirs.options(),
                        self.options.spec(self.name.clone()).mode.options()
                    )));
                }
            },
        )
    }

    /// Extends the lease to a full TTL from now, if it is still ours.
    pub async fn extend(&self) -> Result<bool, Error> {
        Ok(self
            .backend
            .renew(&self.timings, self.options.timeout)
            .await?)
    }

    /// Releases the lock if it is still ours, waking waiters.
    pub async fn release(&self) -> Result<bool, Error> {
        Ok(self
            .backend
            .release(None, self.options.timeout, None)
            .await?)
    }

    /// Waits for the lock as the command line does (`Options::wait`, arrival order), then keeps
    /// it on the lease clock in the background until the [`Guard`] is released or dropped. The
    /// guard is a holder of its own, with a token of its own, beside this `Lock`.
    pub async fn hold(&self) -> Result<Guard, Error> {
        guard::hold(
            self.endpoints.clone(),
            self.name.clone(),
            self.options.clone(),
        )
        .await
    }
}

/// What the door needs besides the endpoints: the library's name for `status` to show, and
/// Redlock's per-server timeout (the command line's default, T/100 and at least 5 ms).
fn opening(options: &Options) -> Opening<'static> {
    Opening {
        command: "library",
        node_timeout: (options.ttl / 100).max(Duration::from_millis(5)),
        wait_replicas: None,
        lenient: false,
    }
}
