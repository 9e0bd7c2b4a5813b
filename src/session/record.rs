//! The run's record for the NAME's history, made as the command has ended and before the lock
//! is let go, so that the release carries it: who ran, with which fence and mode, when it took
//! and let go of the lock, how long it waited, and how it ended (the status `locked-run` returns,
//! as `--lost-exit-code` and the rest make it).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::backend::{Backend, Ended, Mode, Run, hostname, user_name, wall_clock_ms};
use crate::config::RunConfig;

use super::ending::{Context, ending};
use super::stop::{Cause, Stopping};
use super::waiter::Acquired;

/// The record of a run that took the lock at `started_ms` (wall clock) and whose command ended
/// with `status`, its stop (if any) explained by `stopping`.
pub fn record(
    backend: &dyn Backend,
    cfg: &RunConfig,
    acquired: &Acquired,
    started_ms: u64,
    stopping: Option<Stopping>,
    status: ExitStatus,
    cx: &Context<'_>,
) -> Run {
    // Whether the lock was still ours changes only the words of the ending, not its status.
    let exit = match ending(stopping, status, Some(true), cx) {
        Ok(exit) => exit.code(cfg.codes),
        Err(failure) => failure.exit.code(cfg.codes),
    };
    let ended = match stopping.map(|s| s.cause) {
        Some(Cause::MaxRun) => Ended::MaxRun,
        Some(Cause::Lost(_)) => Ended::Lost,
        None => match status.signal() {
            Some(n) => Ended::Signal(n),
            None => Ended::Exit,
        },
    };
    Run {
        token: backend.token(),
        host: hostname(),
        pid: std::process::id(),
        user: user_name(),
        fence: acquired.fence,
        mode: match cfg.spec().mode {
            Mode::Exclusive => "exclusive".into(),
            Mode::Shared => "shared".into(),
            Mode::Holders(n) => format!("holders {n}"),
        },
        started_ms,
        ended_ms: wall_clock_ms(),
        waited_ms: acquired.waited.as_millis() as u64,
        status: i32::from(exit),
        ended,
    }
}
