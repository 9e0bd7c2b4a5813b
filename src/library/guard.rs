//! A held lock that keeps itself: [`Guard`]. The lock is waited for, renewed and released on a
//! thread of its own, with a runtime of its own (the command line's: one thread, the lease
//! clock on `CLOCK_BOOTTIME`), so the lease is kept whatever the task does meanwhile and
//! whichever runtime, if any, the caller uses. The task hears of the lease's end through
//! [`Guard::stop_now`], at the lease clock's kill point (V − D − K) or at once when the store
//! says the lock is gone: before anyone else can hold it, as long as the task stops within K.

use std::cell::RefCell;
use std::time::Duration;

use tokio::sync::oneshot::error::RecvError;
use tokio::sync::{oneshot, watch};

use super::{Error, Opened, Options, on_a_thread};
use crate::backend::{Backend, Tenure};
use crate::endpoints::Endpoints;
use crate::lease::{self, LeaseClock, Stopper, Timings, Why};
use crate::name::LockName;
use crate::plumbing::clock::{BootClock, Clock};
use crate::session::config::Wait;
use crate::session::{Interrupts, Renewer, acquire};

/// Why the task must stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// No renewal succeeded for so long that the lease reaches its kill point: it may end
    /// within K.
    Expiring,
    /// The store said the lock is no longer ours: someone else may hold it now.
    Lost,
}

/// A lock held by this process until released or dropped, renewed in the background.
pub struct Guard {
    fence: u64,
    token: String,
    stop: watch::Receiver<Option<Stop>>,
    /// Asks the guard's thread to release and say whether the lock was still ours; dropped
    /// (with the guard), it releases all the same.
    release: oneshot::Sender<oneshot::Sender<Result<bool, Error>>>,
}

impl Guard {
    /// The fence token of this holding: strictly larger than any issued before on this NAME.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// The owner's unique token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Why the task must stop, once it must.
    pub fn stopping(&self) -> Option<Stop> {
        *self.stop.borrow()
    }

    /// Resolves once the task must stop (at once if it already must): the lease reached its
    /// kill point with no renewal, or the store said it is gone.
    pub async fn stop_now(&mut self) -> Stop {
        match self.stop.wait_for(Option::is_some).await {
            Ok(stop) => stop.expect("waited for"),
            // The guard's thread is gone: nothing keeps the lease.
            Err(_) => Stop::Lost,
        }
    }

    /// Gives the lock back (compare-and-release, waking waiters); `Ok(false)` when it was no
    /// longer ours.
    pub async fn release(self) -> Result<bool, Error> {
        let (reply, answer) = oneshot::channel();
        if self.release.send(reply).is_err() {
            return Err(Error::unavailable("the guard's thread is gone"));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Error::unavailable("the guard's thread is gone")))
    }
}

/// What the guard's thread says once it holds the lock.
struct Held {
    fence: u64,
    token: String,
}

/// What the guard's thread will say once it holds the lock, or could not.
type Said = oneshot::Receiver<Result<Held, Error>>;

/// The guard's thread, started: the guard's ends of its channels.
struct Started {
    stop: watch::Receiver<Option<Stop>>,
    release: oneshot::Sender<oneshot::Sender<Result<bool, Error>>>,
}

impl Started {
    /// Starts the guard's thread, which opens a holder of its own and waits for the lock.
    fn new(
        endpoints: Endpoints,
        name: LockName,
        options: Options,
    ) -> Result<(Said, Started), Error> {
        let (held, held_rx) = oneshot::channel::<Result<Held, Error>>();
        let (stop, stop_rx) = watch::channel(None);
        let (release, release_rx) = oneshot::channel();
        on_a_thread("locked-run-guard", move || {
            on_its_thread(endpoints, name, options, held, stop, release_rx)
        })?;
        let started = Started {
            stop: stop_rx,
            release,
        };
        Ok((held_rx, started))
    }

    /// The guard, once the thread said it holds the lock (`said`); why not, else.
    fn guard(self, said: Result<Result<Held, Error>, RecvError>) -> Result<Guard, Error> {
        match said {
            Ok(Ok(Held { fence, token })) => Ok(Guard {
                fence,
                token,
                stop: self.stop,
                release: self.release,
            }),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(Error::unavailable(
                "the guard's thread ended before it held the lock",
            )),
        }
    }
}

/// Starts the guard's thread and waits until it holds the lock, or could not.
pub(super) async fn hold(
    endpoints: Endpoints,
    name: LockName,
    options: Options,
) -> Result<Guard, Error> {
    let (said, started) = Started::new(endpoints, name, options)?;
    started.guard(said.await)
}

/// [`hold`], blocking the calling thread while it waits.
pub(super) fn hold_blocking(
    endpoints: Endpoints,
    name: LockName,
    options: Options,
) -> Result<Guard, Error> {
    let (said, started) = Started::new(endpoints, name, options)?;
    started.guard(said.blocking_recv())
}

/// The guard's thread: opens a holder of its own, waits for the lock, keeps it until released.
async fn on_its_thread(
    endpoints: Endpoints,
    name: LockName,
    options: Options,
    mut held: oneshot::Sender<Result<Held, Error>>,
    stop: watch::Sender<Option<Stop>>,
    release: oneshot::Receiver<oneshot::Sender<Result<bool, Error>>>,
) {
    let lock = match Opened::new(&endpoints, name.as_str(), &options) {
        Ok(lock) => lock,
        Err(error) => {
            let _ = held.send(Err(error));
            return;
        }
    };
    let status_command = endpoints.pasteable("status", name.as_str());
    let ask = Wait {
        name: &name,
        timings: lock.timings,
        patience: options.patience(),
        mode: options.spec(name.clone()).mode,
        status_command: &status_command,
    };
    let backend = lock.backend.as_ref();
    let acquired = acquire(backend, &BootClock, ask, &mut Abandoned(&mut held)).await;
    let acquired = match acquired {
        Ok(acquired) => acquired,
        Err(failure) => {
            let _ = held.send(Err(failure.into()));
            return;
        }
    };
    let token = backend.token();
    let fence = acquired.fence;
    let timeout = options.timeout.min(options.ttl);
    if held.send(Ok(Held { fence, token })).is_err() {
        // Whoever asked is gone.
        let _ = backend.release(None, timeout, None).await;
        return;
    }
    keep(
        backend,
        &BootClock,
        lock.timings,
        acquired.sent,
        &stop,
        release,
        timeout,
    )
    .await;
}

/// A wait that ends once whoever asked for the lock stopped waiting for it (the future of
/// [`Lock::hold`] dropped): nothing is then held, nothing left queued.
///
/// [`Lock::hold`]: super::Lock::hold
struct Abandoned<'a>(&'a mut oneshot::Sender<Result<Held, Error>>);

impl Interrupts for Abandoned<'_> {
    async fn next_ending_wait(&mut self) -> nix::sys::signal::Signal {
        self.0.closed().await;
        nix::sys::signal::Signal::SIGTERM
    }
}

/// Tells the task through `stop`; the lease clock's SIGKILL point says it once more, should the
/// kill point have passed unseen.
struct Tell<'a>(&'a watch::Sender<Option<Stop>>);

impl Stopper for Tell<'_> {
    fn terminate(&self, why: Why) {
        let stop = match why {
            Why::NotOwner => Stop::Lost,
            Why::Expiring | Why::Late => Stop::Expiring,
        };
        self.0.send_if_modified(|now| {
            let first = now.is_none();
            now.get_or_insert(stop);
            first
        });
    }

    fn kill(&self, why: Why) {
        self.terminate(why);
    }
}

/// Keeps the lease granted by a request sent at `sent` (the lease clock's readings), telling
/// `stop` when the task must stop, until `release` asks for the lock back or is dropped; then
/// releases, and answers whether the lock was still ours.
pub(super) async fn keep<C: Clock>(
    backend: &dyn Backend,
    clock: &C,
    timings: Timings,
    sent: Duration,
    stop: &watch::Sender<Option<Stop>>,
    release: oneshot::Receiver<oneshot::Sender<Result<bool, Error>>>,
    release_timeout: Duration,
) {
    let lease = RefCell::new(LeaseClock::new(timings, sent));
    let renewer = Renewer(backend, timings);
    let keeping = async {
        match backend.tenure() {
            Tenure::Lease => match lease::keep(&lease, clock, &renewer, &Tell(stop)).await {},
            Tenure::Kernel => std::future::pending::<()>().await,
        }
    };
    let reply = tokio::select! {
        () = keeping => None,
        reply = release => reply.ok(),
    };
    let released = backend
        .release(None, release_timeout, None)
        .await
        .map_err(Error::from);
    if let Some(reply) = reply {
        let _ = reply.send(released);
    }
}
