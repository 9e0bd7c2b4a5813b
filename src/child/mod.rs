//! Child supervision: finding the command, spawning it so it cannot outlive us unnoticed,
//! signalling it (every process of its session, or its process tree in a terminal), and reaping
//! what it leaves behind.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::plumbing::exit::{Exit, Failure};

mod spawn;
mod tree;

pub use spawn::{SpawnError, Watched, spawn};
use tree::{describe, job_processes};

/// Finds `program` as the shell would (on PATH unless it has a slash), before any lock is
/// taken: not found is 127, found but not executable 126.
pub fn resolve(program: &OsStr) -> Result<PathBuf, Failure> {
    let shown = program.to_string_lossy();
    if program.is_empty() {
        return Err(Failure::new(
            Exit::NotFound,
            "the command is empty; nothing was locked",
        ));
    }
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match executable(&path) {
            Found::Yes => Ok(path),
            Found::NotExecutable(why) => Err(not_executable(&shown, why)),
            Found::No => Err(Failure::new(
                Exit::NotFound,
                format!("{shown}: no such file; nothing was locked"),
            )),
        };
    }
    let path_var =
        std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut unusable = None;
    for dir in std::env::split_paths(&path_var) {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        match executable(&candidate) {
            Found::Yes => return Ok(candidate),
            Found::NotExecutable(why) => {
                unusable.get_or_insert((candidate, why));
            }
            Found::No => {}
        }
    }
    match unusable {
        Some((path, why)) => Err(not_executable(&path.to_string_lossy(), why)),
        None => Err(Failure::new(
            Exit::NotFound,
            format!("{shown}: command not found on PATH; nothing was locked"),
        )),
    }
}

enum Found {
    Yes,
    No,
    NotExecutable(&'static str),
}

fn executable(path: &Path) -> Found {
    match path.metadata() {
        Err(_) => Found::No,
        Ok(meta) if meta.is_dir() => Found::NotExecutable("is a directory"),
        // access(2) rather than the mode bits: it knows about root, ACLs and noexec mounts.
        Ok(_) if nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok() => Found::Yes,
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => {
            Found::NotExecutable("permission denied (not executable)")
        }
        Ok(_) => Found::NotExecutable("permission denied"),
    }
}

fn not_executable(shown: &str, why: &str) -> Failure {
    Failure::new(
        Exit::NotExecutable,
        format!("{shown}: {why}; nothing was locked"),
    )
}

/// Whether `locked-run` owns the terminal's foreground (`tcgetpgrp(0) == getpgrp()`): then the
/// child stays in our group, as with `timeout --foreground`, so Ctrl-C, Ctrl-Z and tty reads
/// behave as without the wrapper.
pub fn interactive() -> bool {
    nix::unistd::tcgetpgrp(io::stdin()).is_ok_and(|fg| fg == nix::unistd::getpgrp())
}

/// Makes orphaned descendants our children, so we can reap them and know when the job's
/// processes are all gone before releasing.
pub fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!("cannot become a child subreaper: {e}");
    }
}

/// Who a signal for "the child" goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The job's own session (non-interactive), whose id is the child's pid, as is its first
    /// process group's: grandchildren of a `sh -c` too, and those that moved to another group
    /// of the session (`timeout`, `set -m`, a job-control shell).
    Session(Pid),
    /// Every descendant of `locked-run` (interactive: the child shares our group).
    Tree,
}

/// The running command: its pid, and its status once reaped.
#[derive(Debug)]
pub struct Child {
    pid: Pid,
    status: Option<ExitStatus>,
}

impl Child {
    /// The command's status, once it has been reaped.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }

    /// Reaps every child of ours that has ended: the command (keeping its status) and the
    /// orphans re-parented to us as subreaper, which would otherwise pile up as zombies while
    /// a long job runs. Called on every SIGCHLD. Returns whether any child of ours is left.
    ///
    /// `waitpid(-1)` is safe here because nothing else waits for children in this process:
    /// the command is spawned by [`spawn`], not by `tokio::process`.
    pub fn reap(&mut self) -> io::Result<bool> {
        loop {
            let mut raw = 0;
            // SAFETY: waitpid with a valid status pointer.
            match unsafe { libc::waitpid(-1, &mut raw, libc::WNOHANG) } {
                0 => return Ok(true),
                -1 => {
                    let e = io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::ECHILD) => return Ok(false),
                        Some(libc::EINTR) => continue,
                        _ => return Err(e),
                    }
                }
                pid if pid == self.pid.as_raw() => self.status = Some(ExitStatus::from_raw(raw)),
                _ => {}
            }
        }
    }
}

impl Target {
    /// Sends `signal` to the job: the child's process group (atomically, so a process forked
    /// meanwhile is not missed), plus every other descendant of ours still in the job's
    /// session. The second part catches what changed group without leaving the session
    /// (`timeout`, `set -m`); only a process that called `setsid` is let go, and a nested run's
    /// watcher is waited for instead (see [`tree::Process::killable`]). Processes already gone
    /// are no error.
    pub fn signal(&self, signal: Signal) {
        self.signal_group(signal);
        for process in job_processes(self.session()) {
            if process.killable() && Some(process.pgid) != self.pgid() {
                let _ = kill(process.pid, signal);
            }
        }
    }

    /// Passes on a signal sent to `locked-run`: to the child's process group (where the job is),
    /// and not to descendants that put themselves in other groups (a `set -m` job would die
    /// of a USR1 meant for the child). With no group of its own (interactive), the child's
    /// tree, as for a kill.
    pub fn forward(&self, signal: Signal) {
        match self {
            Target::Session(_) => self.signal_group(signal),
            Target::Tree => self.signal(signal),
        }
    }

    fn signal_group(&self, signal: Signal) {
        if let Target::Session(pgid) = self {
            if let Err(e) = killpg(*pgid, signal) {
                if e != Errno::ESRCH {
                    tracing::warn!("cannot send {signal} to process group {pgid}: {e}");
                }
            }
        }
    }

    /// The job's first process group (the child's, which leads it), if it has one of its own.
    fn pgid(&self) -> Option<Pid> {
        match self {
            Target::Session(sid) => Some(*sid),
            Target::Tree => None,
        }
    }

    /// The session the job's processes are in: its own, or ours in a terminal.
    fn session(&self) -> Option<Pid> {
        match self {
            Target::Session(sid) => Some(*sid),
            Target::Tree => nix::unistd::getsid(None).ok(),
        }
    }

    /// A terminating signal, then SIGCONT so stopped members can act on it (coreutils timeout).
    pub fn terminate(&self, signal: Signal) {
        self.signal(signal);
        if signal != Signal::SIGKILL && signal != Signal::SIGCONT {
            self.signal(Signal::SIGCONT);
        }
    }

    /// The job's live processes, as "pid (program), ...", for the line that says what the
    /// sweep stops.
    pub fn leftovers(&self) -> String {
        let mut processes = job_processes(self.session());
        if let Target::Session(pgid) = self {
            // Members first: they are what the group kill reaches.
            processes.sort_by_key(|p| p.pgid != *pgid);
        }
        describe(&processes)
    }

    /// Whether anything of the job is still alive, given whether we still have children at
    /// all (after [`Child::reap`]). No children means no descendants: the common case needs
    /// no look at /proc.
    pub fn anything_left(&self, children_remain: bool) -> bool {
        let group_left = match self {
            // Signal 0 probes for members; ESRCH means none is left.
            Target::Session(pgid) => killpg(*pgid, None) != Err(Errno::ESRCH),
            Target::Tree => false,
        };
        group_left || (children_remain && job_processes(self.session()).iter().any(|p| !p.zombie))
    }
}
