//! The one record of why and how the command is being stopped: `--max-run` ran out, or the
//! lease was lost (and why), with the signal that began it. The first stop to begin explains the
//! ending; a later one only escalates (a lease loss during a `--max-run` stop keeps its own
//! deadlines, and the first cause still says how the run ended).

use std::cell::Cell;

use nix::sys::signal::Signal;

use crate::child::Target;
use crate::lease::{Stopper, Why};
use crate::observe::notify;

use super::supervised::Kill;

/// Why the command is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// `--max-run` ran out.
    MaxRun,
    /// The lease was lost, or could not be vouched for.
    Lost(Why),
}

/// The stop under way: its cause, and the signal that began it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopping {
    pub cause: Cause,
    pub first_signal: Signal,
}

/// Sends the command its signals and remembers the first stop.
pub struct ChildStopper<K = Target> {
    target: K,
    signal: Signal,
    stopping: Cell<Option<Stopping>>,
    lost: Cell<bool>,
}

impl<K: Kill> ChildStopper<K> {
    pub fn new(target: K, signal: Signal) -> ChildStopper<K> {
        ChildStopper {
            target,
            signal,
            stopping: Cell::new(None),
            lost: Cell::new(false),
        }
    }

    /// The stop under way, if any.
    pub fn stopping(&self) -> Option<Stopping> {
        self.stopping.get()
    }

    /// Whether a stop for a lost lease began (first, or after a `--max-run` stop).
    pub fn lost(&self) -> bool {
        self.lost.get()
    }

    /// Records the stop, unless one began before: the first one explains the ending.
    fn begin(&self, cause: Cause, signal: Signal) {
        if self.stopping.get().is_none() {
            self.stopping.set(Some(Stopping {
                cause,
                first_signal: signal,
            }));
            notify::send(&match cause {
                Cause::MaxRun => "STATUS=--max-run ran out; stopping the command".to_owned(),
                Cause::Lost(why) => format!("STATUS=lost the lock; stopping the command ({why:?})"),
            });
        }
    }

    /// `--max-run` ran out: the kill signal, unless a stop for a lost lease is under way (its
    /// own deadlines stand, and it says how the run ended).
    pub fn time_limit(&self) {
        if self.stopping.get().is_some() {
            return;
        }
        self.begin(Cause::MaxRun, self.signal);
        tracing::info!(
            event = "max_run",
            signal = %self.signal,
            "the command has run for --max-run: sending {}",
            self.signal
        );
        self.target.terminate(self.signal);
    }

    /// `--kill-after` past `--max-run`: SIGKILL, if that stop is the one under way.
    pub fn time_limit_kill(&self) {
        if self
            .stopping
            .get()
            .is_some_and(|s| s.cause == Cause::MaxRun)
        {
            tracing::info!("the command outlived --max-run by --kill-after: sending SIGKILL");
            self.target.signal(Signal::SIGKILL);
        }
    }

    fn losing(&self, why: Why, signal: Signal) {
        self.lost.set(true);
        self.begin(Cause::Lost(why), signal);
        tracing::info!(
            event = "lost",
            why = ?why,
            signal = %signal,
            "stopping the command ({why:?}): sending {signal}"
        );
    }
}

/// The signal goes first, and only then is the stop recorded and said: a write to a stderr
/// file on a stalled disk, or to the service manager's socket, must not hold up the signal
/// that keeps the command within its lease.
impl<K: Kill> Stopper for ChildStopper<K> {
    fn terminate(&self, why: Why) {
        self.target.terminate(self.signal);
        self.losing(why, self.signal);
    }

    fn kill(&self, why: Why) {
        self.target.signal(Signal::SIGKILL);
        self.losing(why, Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use nix::unistd::Pid;

    use super::*;

    /// A `--max-run` stop is not a lease loss (its failed release is a warning, not an info
    /// line), and stays what explains the ending when a loss follows it.
    #[test]
    fn a_max_run_stop_is_no_loss_and_stays_first() {
        let mut sleeper = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .expect("sleep runs");
        let group = Pid::from_raw(sleeper.id() as i32);
        let stopper = ChildStopper::new(Target::Session(group), Signal::SIGTERM);
        stopper.time_limit();
        assert!(!stopper.lost());
        assert_eq!(stopper.stopping().map(|s| s.cause), Some(Cause::MaxRun));
        stopper.terminate(Why::Expiring);
        assert!(stopper.lost());
        assert_eq!(stopper.stopping().map(|s| s.cause), Some(Cause::MaxRun));
        let _ = sleeper.kill();
        let _ = sleeper.wait();
    }
}
