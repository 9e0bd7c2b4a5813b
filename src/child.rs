//! Child supervision: finding the command, spawning it so it cannot outlive us unnoticed,
//! signalling it (its process group, or its process tree in a terminal), and reaping what it
//! leaves behind.

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
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

/// The running command: its pid, and its status once reaped.
#[derive(Debug)]
pub struct Child {
    pid: Pid,
    status: Option<ExitStatus>,
}

impl Child {
    pub fn pid(&self) -> Pid {
        self.pid
    }

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

/// Spawns the command, in its own process group unless `interactive`, with PDEATHSIG set.
///
/// Spawned the way `posix_spawn` does it: `clone(CLONE_VM | CLONE_VFORK)`, so the parent's
/// page tables are not copied (about half a millisecond saved on every run; std falls back to
/// `fork` as soon as a `pre_exec` hook is needed, and PDEATHSIG needs one). Must run on the
/// runtime's main thread: PDEATHSIG fires when the *thread* that created the child exits.
///
/// With `watch` (the watcher's cell), the child writes its process group there before it
/// execs, so the watcher can kill the whole job should `locked-run` die.
pub fn spawn(
    program: &Path,
    argv: &[OsString],
    env: &[(&str, String)],
    interactive: bool,
    watch: Option<&AtomicI32>,
) -> Result<(Child, Target), Failure> {
    let shown = argv[0].to_string_lossy().into_owned();
    let cstring = |bytes: &[u8]| {
        CString::new(bytes)
            .map_err(|_| Failure::usage(format!("{shown}: an argument holds a NUL byte")))
    };
    let path = cstring(program.as_os_str().as_bytes())?;
    let args: Vec<CString> = argv
        .iter()
        .map(|a| cstring(a.as_bytes()))
        .collect::<Result<_, _>>()?;
    let mut vars: Vec<CString> = Vec::new();
    for (key, value) in std::env::vars_os() {
        if !env
            .iter()
            .any(|(ours, _)| key.as_bytes() == ours.as_bytes())
        {
            let mut entry = key.into_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            vars.extend(CString::new(entry).ok());
        }
    }
    for (key, value) in env {
        vars.push(cstring(format!("{key}={value}").as_bytes())?);
    }
    let argv_ptrs: Vec<*const libc::c_char> = args
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_ptrs: Vec<*const libc::c_char> = vars
        .iter()
        .map(|v| v.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();

    let pid = vfork_exec(&path, &argv_ptrs, &envp_ptrs, !interactive, watch).map_err(|e| {
        // Found on PATH a moment ago: gone now is 127; anything else (a script whose
        // interpreter is missing, a bad format) is found but not executable, 126.
        if e.raw_os_error() == Some(libc::ENOENT) && !program.exists() {
            Failure::new(
                Exit::NotFound,
                format!("{shown}: {e}; the lock was released"),
            )
        } else {
            Failure::new(
                Exit::NotExecutable,
                format!("{shown}: cannot run it: {e}; the lock was released"),
            )
        }
    })?;
    let target = if interactive {
        Target::Tree
    } else {
        Target::Group(pid)
    };
    Ok((Child { pid, status: None }, target))
}

/// What the child needs between clone and exec, prepared by the parent: the child may not
/// allocate, and shares the parent's memory until it execs.
struct Exec<'a> {
    path: &'a CString,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    parent: libc::pid_t,
    new_group: bool,
    /// The watcher's cell for the job's process group, if a watcher runs.
    watch: Option<&'a AtomicI32>,
    /// The parent's signal mask before it blocked everything for the clone.
    mask: libc::sigset_t,
    /// Set by the child when it fails before exec (0: it exec'd).
    errno: AtomicI32,
}

fn vfork_exec(
    path: &CString,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    new_group: bool,
    watch: Option<&AtomicI32>,
) -> io::Result<Pid> {
    // SAFETY: sigset_t is plain data, filled by sigfillset/pthread_sigmask.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut mask: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to local sigsets.
    unsafe {
        libc::sigfillset(&mut all);
        // No handler of ours may run in the child, which shares our memory: block everything
        // until the child has reset the handlers; signals meanwhile stay pending for us.
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut mask);
    }
    let exec = Exec {
        path,
        argv,
        envp,
        parent: nix::unistd::getpid().as_raw(),
        new_group,
        watch,
        mask,
        errno: AtomicI32::new(0),
    };
    // A fresh mapping rather than a zeroed Vec: only the pages the child touches are faulted
    // in (a zeroed buffer cost every run sixteen page faults).
    const STACK: usize = 64 * 1024;
    // SAFETY: an anonymous private mapping, unmapped below once the child has exec'd or exited.
    let stack = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if stack == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut()) };
        return Err(e);
    }
    // The stack grows down: pass its 16-byte aligned top.
    let top = (stack as usize + STACK) & !15;
    // SAFETY: CLONE_VFORK suspends us until the child has exec'd or exited, so `exec` and
    // `stack` outlive every use the child makes of them; the child only makes
    // async-signal-safe calls (see child_main).
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &exec as *const Exec as *mut libc::c_void,
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: restores the mask saved above; the child no longer uses its stack.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        libc::munmap(stack, STACK);
    }
    if pid < 0 {
        return Err(clone_error);
    }
    let errno = exec.errno.load(Ordering::SeqCst);
    if errno != 0 {
        let mut raw = 0;
        // SAFETY: reaps the child that failed to exec (it has exited: CLONE_VFORK).
        unsafe { libc::waitpid(pid, &mut raw, 0) };
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok(Pid::from_raw(pid))
}

/// The child between clone and exec: only async-signal-safe calls, no allocation, no panics.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Exec`, alive while the parent is suspended (CLONE_VFORK).
    let exec = unsafe { &*(arg as *const Exec) };
    // SAFETY: plain syscalls on this process.
    unsafe {
        // Handlers are the parent's code and data: back to the default before anything can
        // be delivered. Ignored signals stay ignored (nohup), but for SIGPIPE, which Rust's
        // runtime ignores on its own behalf (std's Command resets it the same way).
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for sig in 1..libc::SIGRTMAX() {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && (old.sa_sigaction != libc::SIG_IGN || sig == libc::SIGPIPE)
                && old.sa_sigaction != libc::SIG_DFL
            {
                libc::sigaction(sig, &default, std::ptr::null_mut());
            }
        }
        if exec.new_group {
            if libc::setpgid(0, 0) != 0 {
                return fail(exec);
            }
            if let Some(group) = exec.watch {
                group.store(libc::getpid(), Ordering::SeqCst);
            }
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return fail(exec);
        }
        // We may have died between clone and prctl; then nobody would kill this child.
        if libc::getppid() != exec.parent {
            libc::_exit(128 + libc::SIGKILL);
        }
        libc::sigprocmask(libc::SIG_SETMASK, &exec.mask, std::ptr::null_mut());
        libc::execve(exec.path.as_ptr(), exec.argv.as_ptr(), exec.envp.as_ptr());
        fail(exec)
    }
}

/// Reports errno to the parent and exits the child.
unsafe fn fail(exec: &Exec) -> libc::c_int {
    // SAFETY: reading this thread's errno and exiting without running any Rust code.
    unsafe {
        exec.errno
            .store((*libc::__errno_location()).max(1), Ordering::SeqCst);
        libc::_exit(127)
    }
}

impl Target {
    /// Sends `signal` to the job: the child's process group (atomically, so a process forked
    /// meanwhile is not missed), plus every other descendant still in our session. The second
    /// part catches what changed group without leaving the session (`timeout`, `set -m`);
    /// only a process that called `setsid` is let go. Processes already gone are no error.
    pub fn signal(&self, signal: Signal) {
        self.signal_group(signal);
        for process in job_processes() {
            if !process.zombie && Some(process.pgid) != self.pgid() {
                let _ = kill(process.pid, signal);
            }
        }
    }

    /// Passes on a signal sent to `locked-run`: to the child's process group, as DESIGN.md says,
    /// and not to descendants that put themselves in other groups (a `set -m` job would die
    /// of a USR1 meant for the child). With no group of its own (interactive), the child's
    /// tree, as for a kill.
    pub fn forward(&self, signal: Signal) {
        match self {
            Target::Group(_) => self.signal_group(signal),
            Target::Tree => self.signal(signal),
        }
    }

    fn signal_group(&self, signal: Signal) {
        if let Target::Group(pgid) = self {
            if let Err(e) = killpg(*pgid, signal) {
                if e != Errno::ESRCH {
                    tracing::warn!("cannot send {signal} to process group {pgid}: {e}");
                }
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

    /// Whether anything of the job is still alive, given whether we still have children at
    /// all (after [`Child::reap`]). No children means no descendants: the common case needs
    /// no look at /proc.
    pub fn anything_left(&self, children_remain: bool) -> bool {
        let group_left = match self {
            // Signal 0 probes for members; ESRCH means none is left.
            Target::Group(pgid) => killpg(*pgid, None) != Err(Errno::ESRCH),
            Target::Tree => false,
        };
        group_left || (children_remain && job_processes().iter().any(|p| !p.zombie))
    }
}

/// A process of the job, from /proc.
#[derive(Clone, Copy, Debug)]
struct Process {
    pid: Pid,
    pgid: Pid,
    zombie: bool,
}

/// Our descendants in our own session: the job, and what it left behind. A process that
/// called `setsid` (a daemon meant to outlive the job) is not followed, nor are its children.
fn job_processes() -> Vec<Process> {
    let me = nix::unistd::getpid();
    let session = nix::unistd::getsid(None).ok();
    let mut job = Vec::new();
    let watcher = crate::watcher::running();
    let mut frontier: Vec<Pid> = children(me)
        .into_iter()
        .filter(|&pid| Some(pid) != watcher)
        .collect();
    while let Some(pid) = frontier.pop() {
        let Some((process, _, sid)) = stat(pid) else {
            continue;
        };
        if sid != session {
            continue;
        }
        job.push(process);
        if !process.zombie {
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
        .filter(|&pid| stat(pid).is_some_and(|(_, p, _)| p == parent))
        .collect()
}

/// A process's parent, group, session and zombie state.
fn stat(pid: Pid) -> Option<(Process, Pid, Option<Pid>)> {
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
            pgid,
            zombie: state == "Z",
        },
        parent,
        Some(session),
    ))
}
