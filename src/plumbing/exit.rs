//! Exit statuses: every way `locked-run` can end, mapped to a number in one place.
//!
//! The table is part of the contract (the README's "Exit status"): scripts branch on these
//! numbers, so a number never changes meaning.

use std::fmt;

/// How a run (or a subcommand) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The child ran to its end while the lease was held: its own exit code.
    Child(u8),
    /// The child was ended by this signal while the lease was held. `locked-run` releases, then
    /// ends itself with the same signal; a shell reports 128 + N.
    ChildSignal(i32),
    /// A signal ended the wait for the lock: nothing ran, nothing is held. Status 128 + N.
    Interrupted(i32),
    /// Not acquired: busy with `--no-wait`, or `--wait` ran out (75, `-E`).
    Conflict,
    /// The lease was lost while the child ran and `locked-run` stopped the child (76).
    Lost,
    /// `--max-run` ran out and `locked-run` stopped the child (124, as `timeout(1)`).
    TimedOut,
    /// The backend could not be reached, or answered wrongly, before the child started (69).
    Unavailable,
    /// Usage or configuration error (2).
    Usage,
    /// The command was found but is not executable (126).
    NotExecutable,
    /// The command was not found (127).
    NotFound,
    /// `status`: the lock is held (0).
    Held,
    /// `status`: the lock is free (1).
    Free,
    /// `doctor`: 1 when a check failed, else 0.
    Checked { failed: bool },
}

/// The two statuses a user may renumber (`-E/--conflict-exit-code`, `--lost-exit-code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codes {
    pub conflict: u8,
    pub lost: u8,
}

impl Default for Codes {
    fn default() -> Self {
        Codes {
            conflict: CONFLICT,
            lost: LOST,
        }
    }
}

pub const CONFLICT: u8 = 75;
pub const LOST: u8 = 76;
pub const UNAVAILABLE: u8 = 69;
pub const USAGE: u8 = 2;
pub const NOT_EXECUTABLE: u8 = 126;
pub const NOT_FOUND: u8 = 127;
pub const TIMED_OUT: u8 = 124;

impl Exit {
    /// The process exit status for this outcome.
    pub fn code(self, codes: Codes) -> u8 {
        match self {
            Exit::Child(code) => code,
            Exit::ChildSignal(sig) | Exit::Interrupted(sig) => signal_status(sig),
            Exit::Conflict => codes.conflict,
            Exit::Lost => codes.lost,
            Exit::Unavailable => UNAVAILABLE,
            Exit::Usage => USAGE,
            Exit::NotExecutable => NOT_EXECUTABLE,
            Exit::NotFound => NOT_FOUND,
            Exit::TimedOut => TIMED_OUT,
            Exit::Held => 0,
            Exit::Free => 1,
            Exit::Checked { failed } => u8::from(failed),
        }
    }
}

/// 128 + N, the shell's convention for "ended by signal N".
fn signal_status(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(255)
}

/// A run that did not end with the child's own status: the status and the one line that says
/// what happened and what to do. `quiet` lines are only printed with `-v` (a conflict the user
/// asked not to wait for must not mail cron every minute).
#[derive(Debug, PartialEq, Eq)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
    pub quiet: bool,
}

impl Failure {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Failure {
            exit,
            message: message.into(),
            quiet: false,
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Failure::new(Exit::Usage, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Failure::new(Exit::Unavailable, message)
    }

    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_design() {
        let d = Codes::default();
        assert_eq!(Exit::Child(0).code(d), 0);
        assert_eq!(Exit::Child(3).code(d), 3);
        assert_eq!(Exit::ChildSignal(15).code(d), 143);
        assert_eq!(Exit::ChildSignal(2).code(d), 130);
        assert_eq!(Exit::Interrupted(1).code(d), 129);
        assert_eq!(Exit::Conflict.code(d), 75);
        assert_eq!(Exit::Lost.code(d), 76);
        assert_eq!(Exit::Unavailable.code(d), 69);
        assert_eq!(Exit::Usage.code(d), 2);
        assert_eq!(Exit::NotExecutable.code(d), 126);
        assert_eq!(Exit::NotFound.code(d), 127);
        assert_eq!(Exit::TimedOut.code(d), 124);
        assert_eq!(Exit::Held.code(d), 0);
        assert_eq!(Exit::Free.code(d), 1);
    }

    #[test]
    fn conflict_and_lost_are_renumbered() {
        let codes = Codes {
            conflict: 1,
            lost: 99,
        };
        assert_eq!(Exit::Conflict.code(codes), 1);
        assert_eq!(Exit::Lost.code(codes), 99);
        assert_eq!(Exit::Unavailable.code(codes), 69);
    }

    #[test]
    fn huge_signal_numbers_saturate() {
        assert_eq!(Exit::ChildSignal(200).code(Codes::default()), 255);
    }
}
