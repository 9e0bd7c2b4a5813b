//! Running the binary under test: [`lr`] builds a `locked-run` command line (on top of
//! [`locked_run`], which leaves out inherited LOCKED_RUN_* settings) and runs or spawns it under
//! the hard timeout; [`Output`]'s checks print everything the process left when they fail.
//!
//! ```ignore
//! lr().url(&redis.url()).args(["--ttl", "2s"]).job(["true"]).run().expect(0);
//! let holder = lr().url(&url).name("job").sh("exec sleep 60").spawn();
//! lr().args(["-u", "redis://", "job", "true"]).run().expect_one_line(2, "no host");
//! let status = status_json(&url, "job");
//! ```

use std::ffi::OsStr;
use std::fmt::Display;
use std::path::Path;
use std::process::Command;

use super::process::{Output, Running, locked_run, run, spawn, without_our_settings};
use super::redlock::Five;
use super::{BIN, path_str, sh};

/// `locked-run` with no arguments yet.
pub fn lr() -> LockedRun {
    LockedRun { cmd: locked_run() }
}

/// Another build of `locked-run` (the path of its binary: an older release, for the upgrade
/// tests), with no arguments yet.
pub fn lr_of(bin: &str) -> LockedRun {
    LockedRun {
        cmd: without_our_settings(bin),
    }
}

/// `locked-run` whose stderr goes to `path` as it is written (a file the test reads while the
/// run goes on, or a FIFO), not collected at its end: `sh -c 'exec "$0" "$@" 2> PATH'` runs
/// the binary, with no arguments yet.
pub fn lr_stderr_to(path: &Path) -> LockedRun {
    let mut cmd = without_our_settings("sh");
    cmd.arg("-c")
        .arg(format!("exec \"$0\" \"$@\" 2> {}", path_str(path)))
        .arg(BIN);
    LockedRun { cmd }
}

/// `locked-run` run with its descriptors 0, 1 and 2 closed (as a daemon's child or a careless
/// cron may start it): `sh -c 'exec "$0" "$@" 0<&- 1>&- 2>&-'` runs the binary, with no
/// arguments yet.
pub fn lr_closed_stdio() -> LockedRun {
    let mut cmd = without_our_settings("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" \"$@\" 0<&- 1>&- 2>&-")
        .arg(BIN);
    LockedRun { cmd }
}

/// A `locked-run` command line being built. Each method appends to it, in order, exactly what
/// it says: `.name("job").sh(S)` is `job sh -c S`, `.job(ARGV)` is `job -- ARGV`.
pub struct LockedRun {
    cmd: Command,
}

impl LockedRun {
    /// `-u URL`.
    pub fn url(mut self, url: &str) -> Self {
        self.cmd.args(["-u", url]);
        self
    }

    /// The five servers of a Redlock test, `-u` each, and `--node-timeout 500ms` (see
    /// [`locked_run_on`] for why).
    pub fn on(mut self, five: &Five) -> Self {
        self.cmd
            .args(five.url_args())
            .args(["--node-timeout", "500ms"]);
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.cmd.arg(arg);
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.cmd.args(args);
        self
    }

    /// The lock's NAME.
    pub fn name(self, name: &str) -> Self {
        self.arg(name)
    }

    /// `-- COMMAND ARGS...`.
    pub fn command<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(self, argv: I) -> Self {
        self.arg("--").args(argv)
    }

    /// The lock `job` and its command: `job -- COMMAND ARGS...`.
    pub fn job<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(self, argv: I) -> Self {
        self.name("job").command(argv)
    }

    /// `sh -c SCRIPT` (after the NAME, without `--`).
    pub fn sh(self, script: &str) -> Self {
        self.args(sh(script))
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    /// Anything else a test needs of the [`Command`]: its stdin, a uid, a `pre_exec`.
    pub fn with(mut self, change: impl FnOnce(&mut Command) -> &mut Command) -> Self {
        change(&mut self.cmd);
        self
    }

    /// Runs it to completion, under the hard timeout.
    pub fn run(self) -> Output {
        run(self.cmd)
    }

    /// Starts it; its output is collected in the background.
    pub fn spawn(self) -> Running {
        spawn(self.cmd)
    }

    pub fn into_command(self) -> Command {
        self.cmd
    }
}

impl Output {
    /// Asserts the exit status, showing the whole output if it is another; returns the output
    /// for more checks.
    #[track_caller]
    pub fn expect(self, code: i32) -> Output {
        assert_eq!(self.code(), Some(code), "{self:?}");
        self
    }

    /// [`Output::expect`], saying what the status means or which case this is.
    #[track_caller]
    pub fn expect_with(self, code: i32, context: impl Display) -> Output {
        assert_eq!(self.code(), Some(code), "{context}: {self:?}");
        self
    }

    /// Exit `code`, and one line on stderr: `locked-run: ...` containing `needle`.
    #[track_caller]
    pub fn expect_one_line(self, code: i32, needle: &str) -> Output {
        let out = self.expect(code);
        assert!(out.stderr.starts_with("locked-run: "), "{}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1, "one line: {}", out.stderr);
        assert!(
            out.stderr.contains(needle),
            "{needle:?} not in {}",
            out.stderr
        );
        out
    }

    /// Exit `code`, and one line on stderr that opens with exactly `locked-run: {opening}`:
    /// the words an operator searches the FAQ (docs/faq.md) for.
    #[track_caller]
    pub fn expect_opening(self, code: i32, opening: &str) -> Output {
        let out = self.expect(code);
        assert_eq!(out.stderr.lines().count(), 1, "one line: {}", out.stderr);
        assert!(
            out.stderr.starts_with(&format!("locked-run: {opening}")),
            "not opening with {opening:?}: {}",
            out.stderr
        );
        out
    }

    /// Stdout as JSON (`status --json`, `doctor --json`).
    #[track_caller]
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// The fences of NAME's runs at `url`, newest first, as `history --json` lists them.
#[track_caller]
pub fn history_fences(url: &str, name: &str) -> Vec<u64> {
    let out = lr()
        .args(["history", "--json", "--limit", "100", "-u", url, name])
        .run();
    fences_in(&out.json())
}

/// The fences of the runs `history --json` printed, in its order.
#[track_caller]
pub fn fences_in(history: &serde_json::Value) -> Vec<u64> {
    history
        .as_array()
        .unwrap_or_else(|| panic!("history --json gave no array: {history}"))
        .iter()
        .map(|run| run["fence"].as_u64().unwrap())
        .collect()
}

/// `locked-run status --json -u URL NAME`, parsed.
#[track_caller]
pub fn status_json(url: &str, name: &str) -> serde_json::Value {
    lr().args(["status", "--json", "-u", url, name])
        .run()
        .json()
}
