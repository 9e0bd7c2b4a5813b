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
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
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
    /// Sends `signal`; processes already gone are not an error.
    pub fn signal(&self, signal: Signal) {
        match self {
            Target::Group(pgid) => {
                if let Err(e) = killpg(*pgid, signal) {
                    if e != Errno::ESRCH {
                        tracing::warn!("cannot send {signal} to process group {pgid}: {e}");
                    }
                }
            }
            Target::Tree => {
                for (pid, _) in descendants() {
                    let _ = kill(pid, signal);
                }
            }
        }
    }

    /// A terminating signal, then SIGCONT so stopped members can act on it (coreutils timeout).
    pub fn terminate(&self, signal: Signal) {
        self.signal(signal);
        if signal != Signal::SIGKILL && signal != Signal::SIGCONT {
            self.signal(Signal::SIGCONT);
        }
    }

    /// Reaps what we inherited (we are a subreaper) and says whether anything is left.
    pub fn reap_and_check_empty(&self) -> bool {
        match self {
            Target::Group(pgid) => {
                let any_in_group = Pid::from_raw(-pgid.as_raw());
                while let Ok(status) = waitpid(any_in_group, Some(WaitPidFlag::WNOHANG)) {
                    if status == WaitStatus::StillAlive {
                        break;
                    }
                }
                // Signal 0 probes for members; ESRCH means none is left.
                killpg(*pgid, None) == Err(Errno::ESRCH)
            }
            Target::Tree => {
                let me = nix::unistd::getpid();
                let mut left = 0;
                for (pid, (parent, zombie)) in descendants() {
                    if zombie && parent == me {
                        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
                    } else {
                        left += 1;
                    }
                }
                left == 0
            }
        }
    }
}

/// (pid, (parent, is_zombie)) for every descendant of this process, from /proc.
fn descendants() -> Vec<(Pid, (Pid, bool))> {
    let mut all = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return all;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The command name may hold spaces and parentheses: parse after the last ')'.
        let Some(close) = stat.iter().rposition(|&b| b == b')') else {
            continue;
        };
        let rest = String::from_utf8_lossy(&stat[close + 1..]);
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let Some(ppid) = fields.next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        all.push((Pid::from_raw(pid), (Pid::from_raw(ppid), state == "Z")));
    }
    let me = nix::unistd::getpid();
    let mut tree = Vec::new();
    let mut frontier = vec![me];
    while let Some(parent) = frontier.pop() {
        for &(pid, (ppid, zombie)) in &all {
            if ppid == parent && pid != me {
                tree.push((pid, (ppid, zombie)));
                frontier.push(pid);
            }
        }
    }
    tree
}
