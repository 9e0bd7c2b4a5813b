//! What the supervisor does to the job and hears from it, as the traits it is generic over:
//! where the job's signals go ([`Kill`]), its main process ([`Reap`]), what wakes the
//! supervisor ([`Events`]) and the watcher that outlives a SIGKILLed wrapper ([`Watching`]).
//! The real ones are thin adapters over `child`, `signals` and `watcher`, with the same system
//! calls in the same order; paused-time tests put a fake job in their place.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::process::ExitStatus;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::child::{Child, Target};
use crate::plumbing::signals::{Event, Signals};
use crate::watcher::Watcher;

/// Where the job's signals go, and what is left of it (the real one: [`Target`]).
pub trait Kill: Copy {
    /// `signal` to every process of the job.
    fn signal(&self, signal: Signal);
    /// A signal sent to `locked-run`, passed on to the job's process group.
    fn forward(&self, signal: Signal);
    /// The kill signal, then SIGCONT so that stopped members can act on it.
    fn terminate(&self, signal: Signal);
    /// Whether anything of the job is alive, given whether any child of ours is left (after
    /// [`Reap::reap`]).
    fn anything_left(&self, children_remain: bool) -> bool;
    /// The job's live processes, as "pid (program), ...".
    fn leftovers(&self) -> String;
    /// The job's own session (its main process's pid), unless it shares ours in a terminal.
    fn own_session(&self) -> Option<Pid>;
}

impl Kill for Target {
    fn signal(&self, signal: Signal) {
        Target::signal(self, signal);
    }

    fn forward(&self, signal: Signal) {
        Target::forward(self, signal);
    }

    fn terminate(&self, signal: Signal) {
        Target::terminate(self, signal);
    }

    fn anything_left(&self, children_remain: bool) -> bool {
        Target::anything_left(self, children_remain)
    }

    fn leftovers(&self) -> String {
        Target::leftovers(self)
    }

    fn own_session(&self) -> Option<Pid> {
        match self {
            Target::Session(session) => Some(*session),
            Target::Tree => None,
        }
    }
}

/// The job's main process, as its status changes (the real one: [`Child`]).
pub trait Reap {
    /// Reaps every child of ours that has ended, keeping the command's status; returns whether
    /// any child of ours is left.
    fn reap(&mut self) -> io::Result<bool>;
    /// The command's status, once it has been reaped.
    fn status(&self) -> Option<ExitStatus>;
}

impl Reap for Child {
    fn reap(&mut self) -> io::Result<bool> {
        Child::reap(self)
    }

    fn status(&self) -> Option<ExitStatus> {
        Child::status(self)
    }
}

/// What wakes the supervisor: a signal to pass on, or a child's change of state (the real
/// one: [`Signals`], as [`super::Interrupts`] is for the wait).
pub trait Events {
    fn next_event(&mut self) -> impl Future<Output = Event>;
}

impl Events for Signals {
    async fn next_event(&mut self) -> Event {
        Signals::next_event(self).await
    }
}

/// The watcher process kept for the job (the real one: [`Watcher`]).
pub trait Watching: Sized {
    /// What tells of the watcher's exit, taken once it runs (the real one's pidfd).
    type Exit;
    fn exit(&self) -> Self::Exit;
    /// Resolves once the watcher behind `exit` has exited; never, when that cannot be known.
    fn exited(exit: Self::Exit) -> impl Future<Output = ()>;
    fn pid(&self) -> libc::pid_t;
    /// Lets this watcher go, and starts another like it, told the job's `session` (0: none).
    fn replace(self, session: libc::pid_t) -> io::Result<Self>;
    /// Nothing of the job is left: should the wrapper die now, leave the session alone.
    fn disarm(&self);
    /// Lets the watcher go, and reaps it.
    fn dismiss(self);
}

impl Watching for Watcher {
    type Exit = Option<OwnedFd>;

    fn exit(&self) -> Option<OwnedFd> {
        self.exits()
    }

    async fn exited(exit: Option<OwnedFd>) {
        let registered = exit.map(|fd| {
            // SAFETY: the AsyncFd owns the descriptor, which stays open until it is dropped.
            unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            }
        });
        let readable = match registered {
            Some(Ok(fd)) => fd.readable().await.map(drop),
            _ => return std::future::pending().await,
        };
        if readable.is_err() {
            std::future::pending::<()>().await;
        }
    }

    fn pid(&self) -> libc::pid_t {
        Watcher::pid(self)
    }

    /// The one that died is reaped before another is started, which keeps its copies of the
    /// wrapper's descriptors as the first did (`file://`'s lock among them).
    fn replace(self, session: libc::pid_t) -> io::Result<Watcher> {
        let keep_descriptors = self.keeps_descriptors();
        Watcher::dismiss(self);
        Watcher::start(None, keep_descriptors, session)
    }

    fn disarm(&self) {
        Watcher::disarm(self);
    }

    fn dismiss(self) {
        Watcher::dismiss(self);
    }
}
