//! What a run needs besides the backend: the lock's name, the command, the lease's timings, how
//! long to wait and how the run may end. The command line builds it; waiting and running read it.

use std::ffi::OsString;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::backend::{LockSpec, Mode};
use crate::lease::Timings;
use crate::name::LockName;
use crate::plumbing::exit::Codes;

/// Everything a run needs besides the backend.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub name: LockName,
    pub command: Vec<OsString>,
    pub timings: Timings,
    pub patience: Patience,
    pub kill_signal: Signal,
    pub min_hold: Option<Duration>,
    /// `--holders N`: up to N runs hold NAME at once.
    pub holders: u32,
    /// `--shared`: held in shared mode.
    pub shared: bool,
    /// `--max-run`: the command is stopped once it has run this long.
    pub max_run: Option<Duration>,
    /// Waiters are served in arrival order (not `--no-fair`), where the backend keeps a queue.
    pub fair: bool,
    /// `locked-run status ...` for this lock, as the user can paste it into a shell.
    pub status_command: String,
    /// How long the final release may take.
    pub release_timeout: Duration,
    /// The statuses a conflict and a lost lease end with (`-E`, `--lost-exit-code`).
    pub codes: Codes,
    /// `--metrics-dir`: where the run's Prometheus textfile goes.
    pub metrics_dir: Option<std::path::PathBuf>,
    /// `--ping`: the monitor's ping URL.
    pub ping: Option<String>,
}

/// What a wait for the lock reads: the lock, its timings, how long to wait and in which mode.
/// A run of the command line gives it ([`RunConfig::wait`]), and so does the library's guard,
/// which has no command.
#[derive(Clone, Copy, Debug)]
pub struct Wait<'a> {
    pub name: &'a LockName,
    pub timings: Timings,
    pub patience: Patience,
    pub mode: Mode,
    /// `locked-run status ...` for this lock, as the user can paste it into a shell.
    pub status_command: &'a str,
}

impl RunConfig {
    /// What the wait for this run's lock reads.
    pub fn wait(&self) -> Wait<'_> {
        Wait {
            name: &self.name,
            timings: self.timings,
            patience: self.patience,
            mode: self.spec().mode,
            status_command: &self.status_command,
        }
    }

    /// The lock this run asks a backend for.
    pub fn spec(&self) -> LockSpec {
        LockSpec {
            name: self.name.clone(),
            mode: match self.shared {
                true => Mode::Shared,
                false => Mode::of_holders(self.holders),
            },
            fair: self.fair,
        }
    }
}

/// How long to wait for a held lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Patience {
    /// `-n`, `-w 0s`: fail at once (75), silently unless `-v`.
    NoWait,
    /// `-w DUR`.
    For(Duration),
    /// The default.
    Forever,
}
