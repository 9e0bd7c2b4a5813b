//! The run's record for the NAME's history, made as the command has ended and before the lock
//! is let go, so that the release carries it: who ran, with which fence and mode, when it took
//! and let go of the lock, how long it waited, and how it ended (the status `locked-run` returns,
//! as `--lost-exit-code` and the rest make it).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::backend::{Backend, Ended, Mode, Run, hostname, wall_clock_ms};
use crate::session::config::RunConfig;

use super::ending::{Context, ending};
use super::stop::{Cause, Stopping};
use super::waiter::Acquired;

/// The lock as it was taken: the grant, when it came (wall clock), and who took it, for the
/// history.
pub struct Held<'a> {
    pub acquired: &'a Acquired,
    pub started_ms: u64,
    pub user: String,
}

/// The record of a run that took the lock as `held` says and whose command ended with
/// `status`, its stop (if any) explained by `stopping`.
pub fn record(
    backend: &dyn Backend,
    cfg: &RunConfig,
    held: &Held<'_>,
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
        user: held.user.clone(),
        fence: held.acquired.fence,
        mode: match cfg.spec().mode {
            Mode::Exclusive => "exclusive".into(),
            Mode::Shared => "shared".into(),
            Mode::Holders(n) => format!("holders {n}"),
        },
        started_ms: held.started_ms,
        ended_ms: wall_clock_ms(),
        waited_ms: held.acquired.waited.as_millis() as u64,
        status: i32::from(exit),
        ended,
    }
}
