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
use tokio::sync::{mpsc, oneshot};

pub use guard::{Guard, Stop};

/// What went wrong: its kind, in the terms of the command line's exit statuses, and its cause
/// ([`std::error::Error::source`]: the line the command line would print, in the store's or
/// the option's words). More kinds may come: match with a `_` arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The name, a URL, an option, or a combination of them was refused (the command line's
    /// status 2).
    #[error("refused: a name, URL or option this lock cannot be opened or held with")]
    Usage(#[source] Cause),
    /// The store could not be reached, or gave no usable answer (69). Worth retrying.
    #[error("the lock's store could not be reached, or gave no usable answer")]
    Unavailable(#[source] Cause),
    /// The store answered with a refusal that retrying will not fix (a read-only replica, a
    /// missing permission; 69 too).
    #[error("the lock's store refused")]
    Refused(#[source] Cause),
    /// [`Lock::hold`] found the lock held and was not to wait, or its wait ran out (75).
    #[error("the lock is held by another, and the wait for it is over")]
    Busy(#[source] Cause),
}

/// The cause of an [`Error`]: the store's own error, or the line that says what was refused.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A cause that is a line and nothing more.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Said(String);

impl Error {
    fn usage(line: impl Into<String>) -> Error {
        Error::Usage(Box::new(Said(line.into())))
    }

    fn unavailable(line: impl Into<String>) -> Error {
        Error::Unavailable(Box::new(Said(line.into())))
    }
}

impl From<BackendError> for Error {
    fn from(error: BackendError) -> Error {
        match error {
            BackendError::Transient(_) => Error::Unavailable(Box::new(error)),
            BackendError::Refused(_) => Error::Refused(Box::new(error)),
            BackendError::Unsent(inner) => Error::from(*inner),
        }
    }
}

impl From<Failure> for Error {
    fn from(failure: Failure) -> Error {
        let cause = Box::new(Said(failure.message));
        match failure.exit {
            Exit::Usage => Error::Usage(cause),
            Exit::Conflict => Error::Busy(cause),
            _ => Error::Unavailable(cause),
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
        Timings::new(self.ttl, self.renew_every, self.kill_after).map_err(Error::usage)
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

/// A lease on one NAME, in whatever the endpoints name. `Send` and `Sync`: it can be moved into
/// `tokio::spawn` on any runtime, and shared. Its store is spoken to from a thread of its own
/// (one per `Lock`, with the command line's one-threaded runtime), so the caller's runtime,
/// whichever it is, carries nothing but the answers.
pub struct Lock {
    name: LockName,
    endpoints: Endpoints,
    options: Options,
    timings: Timings,
    token: String,
    /// To the lock's thread; dropped with the `Lock`, the thread ends (nothing is released: a
    /// lease taken by [`Lock::acquire`] lapses unless [`Lock::release`] gave it back).
    calls: mpsc::UnboundedSender<Call>,
}

/// What the lock's thread is asked to do, and where to answer.
enum Call {
    Acquire(oneshot::Sender<Result<Option<u64>, Error>>),
    Extend(oneshot::Sender<Result<bool, Error>>),
    Release(oneshot::Sender<Result<bool, Error>>),
}

/// A lock opened through the door, on the thread that speaks to its store.
pub(super) struct Opened {
    backend: Box<dyn Backend>,
    name: LockName,
    timings: Timings,
}

impl Opened {
    /// Opens the lock `name` as `options` say, refused as the command line refuses the same.
    fn new(endpoints: &Endpoints, name: &str, options: &Options) -> Result<Opened, Error> {
        let name = LockName::new(name).map_err(Error::usage)?;
        let timings = options.timings()?;
        let mut endpoints = endpoints.clone();
        endpoints.connect_timeout = options.timeout;
        let backend = open(&endpoints, &options.spec(name.clone()), &opening(options))?;
        backend.prepare()?;
        Ok(Opened {
            backend,
            name,
            timings,
        })
    }

    async fn acquire(&self, options: &Options) -> Result<Option<u64>, Error> {
        Ok(
            match self.backend.try_acquire(&self.timings, false).await? {
                Attempt::Acquired { fence } => Some(fence),
                Attempt::Busy(_) => None,
                Attempt::Mismatch { theirs } => {
                    return Err(Error::usage(format!(
                        "lock {} is held by runs with {}, and this one asks for {}",
                        self.name,
                        theirs.options(),
                        options.spec(self.name.clone()).mode.options()
                    )));
                }
            },
        )
    }

    /// Answers `calls` until the `Lock` is dropped.
    async fn serve(self, options: Options, mut calls: mpsc::UnboundedReceiver<Call>) {
        let timeout = options.timeout;
        while let Some(call) = calls.recv().await {
            match call {
                Call::Acquire(reply) => {
                    let _ = reply.send(self.acquire(&options).await);
                }
                Call::Extend(reply) => {
                    let extended = self.backend.renew(&self.timings, timeout).await;
                    let _ = reply.send(extended.map_err(Error::from));
                }
                Call::Release(reply) => {
                    let released = self.backend.release(None, timeout, None).await;
                    let _ = reply.send(released.map_err(Error::from));
                }
            }
        }
    }
}

/// Runs `work` on a thread of its own, on the command line's one-threaded runtime (the lease
/// clock on `CLOCK_BOOTTIME`), whatever runtime the caller has, if any.
pub(super) fn on_a_thread<F>(
    name: &str,
    work: impl FnOnce() -> F + Send + 'static,
) -> Result<(), Error>
where
    F: std::future::Future<Output = ()>,
{
    let runtime = crate::open::runtime()?;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || runtime.block_on(work()))
        .map(drop)
        .map_err(|e| Error::unavailable(format!("cannot start the lock's thread: {e}")))
}

impl Lock {
    /// The lock `name` in what `url` names (a Redis server or Redlock's, an etcd cluster, a
    /// PostgreSQL database, a `file://` directory), with lease length `ttl` and every other
    /// option at its default.
    pub fn new(url: &str, name: &str, ttl: Duration) -> Result<Lock, Error> {
        Lock::open(&Endpoints::new([url]), name, &Options::new(ttl))
    }

    /// The lock `name` in what `endpoints` name, held as `options` say; refused as the command
    /// line refuses the same (a mode the store cannot hold, timings that leave no time to
    /// retry, a bad NAME). Nothing is connected yet.
    pub fn open(endpoints: &Endpoints, name: &str, options: &Options) -> Result<Lock, Error> {
        let (opened, opened_rx) = std::sync::mpsc::sync_channel(1);
        let (calls, calls_rx) = mpsc::unbounded_channel();
        let asked = (endpoints.clone(), name.to_owned(), options.clone());
        on_a_thread("locked-run-lock", move || async move {
            let (endpoints, name, options) = asked;
            let lock = match Opened::new(&endpoints, &name, &options) {
                Ok(lock) => lock,
                Err(error) => {
                    let _ = opened.send(Err(error));
                    return;
                }
            };
            let said = (lock.name.clone(), lock.timings, lock.backend.token());
            if opened.send(Ok(said)).is_ok() {
                lock.serve(options, calls_rx).await;
            }
        })?;
        let (name, timings, token) = opened_rx.recv().map_err(|_| {
            Error::unavailable("the lock's thread ended before it opened the lock")
        })??;
        Ok(Lock {
            name,
            endpoints: endpoints.clone(),
            options: options.clone(),
            timings,
            token,
            calls,
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
        self.token.clone()
    }

    /// Takes the lock if it is free: `Some(fence)`, strictly larger than any fence issued
    /// before on this NAME; `None` when someone else holds it.
    pub async fn acquire(&self) -> Result<Option<u64>, Error> {
        self.call(Call::Acquire).await
    }

    /// Extends the lease to a full TTL from now, if it is still ours.
    pub async fn extend(&self) -> Result<bool, Error> {
        self.call(Call::Extend).await
    }

    /// Releases the lock if it is still ours, waking waiters.
    pub async fn release(&self) -> Result<bool, Error> {
        self.call(Call::Release).await
    }

    /// Asks the lock's thread, and waits for its answer.
    async fn call<T>(
        &self,
        call: impl FnOnce(oneshot::Sender<Result<T, Error>>) -> Call,
    ) -> Result<T, Error> {
        let gone = || Error::unavailable("the lock's thread is gone");
        let (reply, answer) = oneshot::channel();
        self.calls.send(call(reply)).map_err(|_| gone())?;
        answer.await.unwrap_or_else(|_| Err(gone()))
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

    /// [`Lock::hold`], for code without a runtime: blocks the calling thread until the lock is
    /// held or the wait ends. Not from within an async task (it would block the runtime's
    /// thread).
    pub fn hold_blocking(&self) -> Result<Guard, Error> {
        guard::hold_blocking(
            self.endpoints.clone(),
            self.name.clone(),
            self.options.clone(),
        )
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
