//! Child supervision: finding the command, spawning it so it cannot outlive us unnoticed,
//! signalling it (its process group, or its process tree in a terminal), and reaping what it
//! leaves behind.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::exit::{Exit, Failure};

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
    /// The child's own process group (non-interactive): grandchildren of a `sh -c` too.
    Group(Pid),
    /// Every descendant of `locked-run` (interactive: the child shares our group).
    Tree,
}

/// Spawns the command. Must run on the runtime's main thread: PDEATHSIG fires when the
/// *thread* that forked exits.
pub fn spawn(
    program: &Path,
    argv: &[OsString],
    env: &[(&str, String)],
    interactive: bool,
) -> Result<(tokio::process::Child, Target), Failure> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg0(&argv[0]).args(&argv[1..]);
    for (key, value) in env {
        cmd.env(key, value);
    }
    if !interactive {
        cmd.process_group(0);
    }
    let parent = nix::unistd::getpid().as_raw();
    // SAFETY: between fork and exec only async-signal-safe calls: prctl, getppid, _exit.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // We may have died between fork and prctl; then nobody would kill this child.
            if libc::getppid() != parent {
                libc::_exit(128 + libc::SIGKILL);
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| {
        let shown = argv[0].to_string_lossy();
        match e.kind() {
            io::ErrorKind::NotFound => Failure::new(
                Exit::NotFound,
                format!("{shown}: {e}; the lock was released"),
            ),
            _ => Failure::new(
                Exit::NotExecutable,
                format!("{shown}: cannot run it: {e}; the lock was released"),
            ),
        }
    })?;
    let pid = Pid::from_raw(child.id().expect("a just-spawned child has a pid") as i32);
    let target = if interactive {
        Target::Tree
    } else {
        Target::Group(pid)
    };
    Ok((child, target))
}

impl Target {
    /// Sends `signal` to the job: the child's process group (atomically, so a process forked
    /// meanwhile is not missed), plus every other descendant still in our session. The second
    /// part catches what changed group without leaving the session (`timeout`, `set -m`);
    /// only a process that called `setsid` is let go. Processes already gone are no error.
    pub fn signal(&self, signal: Signal) {
        if let Target::Group(pgid) = self {
            if let Err(e) = killpg(*pgid, signal) {
                if e != Errno::ESRCH {
                    tracing::warn!("cannot send {signal} to process group {pgid}: {e}");
                }
            }
        }
        for process in job_processes() {
            if !process.zombie && Some(process.pgid) != self.pgid() {
                let _ = kill(process.pid, signal);
            }
        }
    }

    fn pgid(&self) -> Option<Pid> {
        match self {
            Target::Group(pgid) => Some(*pgid),
            Target::Tree => None,
        }
    }

    /// A terminating signal, then SIGCONT so stopped members can act on it (coreutils timeout).
    pub fn terminate(&self, signal: Signal) {
        self.signal(signal);
        if signal != Signal::SIGKILL && signal != Signal::SIGCONT {
            self.signal(Signal::SIGCONT);
        }
    }

    /// Reaps the zombies we inherited as subreaper, except `running` (the direct child, which
    /// tokio reaps: waiting for it here would steal its status), and says whether anything of
    /// the job is left.
    pub fn reap_and_check_empty(&self, running: Option<Pid>) -> bool {
        let me = nix::unistd::getpid();
        let mut left = false;
        for process in job_processes() {
            if process.zombie && process.parent == me && Some(process.pid) != running {
                let _ = waitpid(process.pid, Some(WaitPidFlag::WNOHANG));
            } else {
                left = true;
            }
        }
        if let Target::Group(pgid) = self {
            // Members whose parent is outside our tree (none, normally): signal 0 probes for
            // any member; ESRCH means none is left.
            left = left || killpg(*pgid, None) != Err(Errno::ESRCH);
        }
        !left
    }
}

/// A process of the job, from /proc.
#[derive(Clone, Copy, Debug)]
struct Process {
    pid: Pid,
    parent: Pid,
    pgid: Pid,
    zombie: bool,
}

/// Our descendants in our own session: the job, and what it left behind. A process that
/// called `setsid` (a daemon meant to outlive the job) is not followed, nor are its children.
fn job_processes() -> Vec<Process> {
    let me = nix::unistd::getpid();
    let session = nix::unistd::getsid(None).ok();
    let mut job = Vec::new();
    let mut frontier = children(me);
    while let Some(pid) = frontier.pop() {
        let Some(process) = stat(pid) else { continue };
        if process.1 != session {
            continue;
        }
        job.push(process.0);
        if !process.0.zombie {
            frontier.extend(children(pid));
        }
    }
    job
}

/// The children of `pid`, from `/proc/PID/task/*/children` (one file per thread: orphans are
/// re-parented to whichever of our threads).
fn children(pid: Pid) -> Vec<Pid> {
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => found.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .map(Pid::from_raw),
            ),
            // A kernel without CONFIG_PROC_CHILDREN: find them by their parent instead.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return children_by_scan(pid),
            Err(_) => {}
        }
    }
    found
}

fn children_by_scan(parent: Pid) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .map(Pid::from_raw)
        .filter(|&pid| stat(pid).is_some_and(|(p, _)| p.parent == parent))
        .collect()
}

/// A process's parent, group, session and zombie state.
fn stat(pid: Pid) -> Option<(Process, Option<Pid>)> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: parse after the last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = String::from_utf8_lossy(&stat[close + 1..]);
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let mut number = || fields.next()?.parse::<i32>().ok().map(Pid::from_raw);
    let (parent, pgid, session) = (number()?, number()?, number()?);
    Some((
        Process {
            pid,
            parent,
            pgid,
            zombie: state == "Z",
        },
        Some(session),
    ))
}
