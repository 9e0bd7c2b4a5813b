//! What a backend is asked to hold, told when it is opened: the lock's name, its mode (one
//! holder, up to N, or shared), and whether waiters are served in arrival order.

use crate::name::LockName;

/// How many may hold the lock at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One holder (the default).
    Exclusive,
    /// Up to N holders at once (`--holders N`, N > 1): a counting semaphore.
    Holders(u32),
    /// Any number of shared holders (`--shared`), never beside an exclusive one: `flock -s`.
    Shared,
}

impl Mode {
    /// `--holders N`: 1 is exclusive.
    pub fn of_holders(holders: u32) -> Mode {
        match holders {
            0 | 1 => Mode::Exclusive,
            n => Mode::Holders(n),
        }
    }

    /// The N of `--holders N` (1 for exclusive and shared runs, which take no N).
    pub fn holders(self) -> u32 {
        match self {
            Mode::Exclusive | Mode::Shared => 1,
            Mode::Holders(n) => n,
        }
    }

    /// The options a run in this mode is given, for messages: `--holders 3`, `--shared`.
    pub fn options(self) -> String {
        match self {
            Mode::Exclusive => "--holders 1".into(),
            Mode::Holders(n) => format!("--holders {n}"),
            Mode::Shared => "--shared".into(),
        }
    }
}

/// The lock a backend is opened for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockSpec {
    pub name: LockName,
    pub mode: Mode,
    /// Waiters are served in arrival order (not `--no-fair`), where the backend keeps a queue.
    pub fair: bool,
}

impl LockSpec {
    /// An exclusive, fair lock: what `status` and `release` open (they read every mode).
    pub fn exclusive(name: LockName) -> LockSpec {
        LockSpec {
            name,
            mode: Mode::Exclusive,
            fair: true,
        }
    }
}
