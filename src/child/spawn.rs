//! Spawning the command nearly the way `posix_spawn` does: `clone(CLONE_VM)`, then, in
//! the child, only async-signal-safe calls until `exec`. All the `unsafe` of starting a
//! process is here.

use std::ffi::{CString, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::Duration;

use nix::unistd::Pid;

use super::{Child, Target};
use crate::plumbing::clock::{boot_ns, boot_ns_at};
use crate::plumbing::exit::{Exit, Failure};

/// Spawns the command, in a session of its own unless `interactive`, with PDEATHSIG set.
///
/// A session rather than only a process group: a job's processes may move to other groups
/// (coreutils `timeout`, `set -m`, a job-control shell), but only `setsid` takes one out of the
/// session, so "every process of the job's session" is what a kill must reach, also the
/// watcher's once we are gone and the job's processes are no longer our descendants.
///
/// Spawned nearly the way `posix_spawn` does it: `clone(CLONE_VM)`, so the parent's
/// page tables are not copied (about half a millisecond saved on every run; std falls back to
/// `fork` as soon as a `pre_exec` hook is needed, and PDEATHSIG needs one). Must run on the
/// runtime's main thread: PDEATHSIG fires when the *thread* that created the child exits.
///
/// With `watch` (the watcher's cells), the child writes its session there before it execs, so
/// the watcher can kill the whole job should `locked-run` die, and the kernel keeps
/// the child's pid there from the clone until its exec commits, so the watcher can kill a
/// child still short of its exec at the start-by point, should we be stopped meanwhile.
///
/// With `start_by` (a `CLOCK_BOOTTIME` reading: the lease clock's point of sending the kill
/// signal), the command never starts on a lease that may already be another run's: the child
/// reads the clock as the last thing before it execs and execs nothing once that point has
/// passed, and we wait for its exec no longer than that point (an exec can block on the
/// program's file: a lease on it, a slow file system) before we SIGKILL it
/// ([`SpawnError::Late`] either way), however long `locked-run` was held up between the grant
/// and the start (an overloaded machine, a stalled write, a pause).
pub fn spawn(
    program: &Path,
    argv: &[OsString],
    env: &[(&str, String)],
    interactive: bool,
    watch: Option<Watched>,
    start_by: Option<Duration>,
) -> Result<(Child, Target), SpawnError> {
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

    let start_by_ns = boot_ns_at(start_by);
    let spawned = clone_exec(
        &path,
        &argv_ptrs,
        &envp_ptrs,
        !interactive,
        watch,
        start_by_ns,
    );
    let pid = spawned.map_err(|e| {
        // Found on PATH a moment ago: gone now is 127; anything else (a script whose
        // interpreter is missing, a bad format) is found but not executable, 126.
        if e.raw_os_error() == Some(LATE) {
            SpawnError::Late
        } else if e.raw_os_error() == Some(libc::ENOENT) && !program.exists() {
            SpawnError::Failed(Failure::new(
                Exit::NotFound,
                format!("{shown}: {e}; the lock was released"),
            ))
        } else {
            SpawnError::Failed(Failure::new(
                Exit::NotExecutable,
                format!("{shown}: cannot run it: {e}; the lock was released"),
            ))
        }
    })?;
    let target = if interactive {
        Target::Tree
    } else {
        Target::Session(pid)
    };
    Ok((Child { pid, status: None }, target))
}

/// What the watcher is told of the command: its session, written by the child before it
/// execs, and its pid between its clone and its exec (written and cleared by the kernel).
#[derive(Clone, Copy)]
pub struct Watched<'a> {
    pub session: &'a AtomicI32,
    pub pre_exec: &'a AtomicI32,
    /// Set by the watcher when it SIGKILLed the child short of its exec: nothing was started.
    pub killed_before_exec: &'a AtomicBool,
}

/// Why a spawn started nothing.
#[derive(Debug)]
pub enum SpawnError {
    /// The command could not be started (its failure says why, and what was released).
    Failed(Failure),
    /// `start_by` had passed when the child was about to exec: nothing was started.
    Late,
}

impl From<Failure> for SpawnError {
    fn from(failure: Failure) -> Self {
        SpawnError::Failed(failure)
    }
}

/// The errno the child reports when `start_by` had passed (no exec sets it).
const LATE: i32 = libc::ETIME;

/// What the child needs between clone and exec, prepared by the parent: the child may not
/// allocate, and shares the parent's memory until it execs.
struct Exec<'a> {
    path: &'a CString,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    parent: libc::pid_t,
    new_session: bool,
    /// The watcher's cell for the job's session, if a watcher runs.
    watch: Option<&'a AtomicI32>,
    /// The parent's signal mask before it blocked everything for the clone.
    mask: libc::sigset_t,
    /// `CLOCK_BOOTTIME` in ns past which the child must not exec (0: no limit).
    start_by_ns: u64,
    /// Set by the child when it fails before exec (0: it exec'd).
    errno: AtomicI32,
}

fn clone_exec(
    path: &CString,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    new_session: bool,
    watch: Option<Watched>,
    start_by_ns: u64,
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
        new_session,
        watch: watch.map(|w| w.session),
        mask,
        start_by_ns,
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
    // The child's exec (or its exit) closes the write end of this close-on-exec pipe: end of
    // file on the read end says it no longer uses our memory. Made before the clone, so the
    // child's copy of our descriptors has it.
    let mut done = [0i32; 2];
    // SAFETY: pipe2 fills two descriptors, closed below.
    if unsafe { libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: undoes the mapping and the mask above.
        unsafe {
            libc::munmap(stack, STACK);
            libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        }
        return Err(e);
    }
    // The stack grows down: pass its 16-byte aligned top.
    let top = (stack as usize + STACK) & !15;
    // With a watcher, the kernel writes the child's pid to the watcher's cell as the child
    // starts and clears it when the exec commits (or the child exits).
    let (tid_flags, child_tid) = match watch {
        Some(w) => (
            libc::CLONE_CHILD_SETTID | libc::CLONE_CHILD_CLEARTID,
            w.pre_exec.as_ptr(),
        ),
        None => (0, std::ptr::null_mut()),
    };
    // SAFETY: `exec` and `stack` stay alive and untouched by us until the child has exec'd or
    // is gone (the wait below); the child only makes async-signal-safe calls (see child_main);
    // the watcher's cell lives as long as the watcher's mapping, which is never unmapped.
    // No CLONE_VFORK: we wait for the exec ourselves, and no longer than `start_by`, since an
    // exec can block (a file lease or a slow file system under the program).
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::SIGCHLD | tid_flags,
            &exec as *const Exec as *mut libc::c_void,
            std::ptr::null_mut::<libc::pid_t>(),
            std::ptr::null_mut::<libc::c_void>(),
            child_tid,
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: our copy of the write end; the child has its own.
    unsafe { libc::close(done[1]) };
    // A child that never exec'd has started nothing: the watcher is told to leave its session
    // alone before it is reaped (its pid may be reused once reaped).
    let reap_unstarted = |pid: libc::pid_t| {
        if let Some(w) = watch {
            w.session.store(0, Ordering::SeqCst);
        }
        let mut raw = 0;
        // SAFETY: reaps our own child, which has exited or been SIGKILLed.
        unsafe { libc::waitpid(pid, &mut raw, 0) };
    };
    let outcome = if pid < 0 {
        Err(clone_error)
    } else if exec_or_exit(done[0], start_by_ns) {
        let killed_late = watch.is_some_and(|w| w.killed_before_exec.load(Ordering::SeqCst));
        match exec.errno.load(Ordering::SeqCst) {
            // The watcher stopped it short of its exec (we were stopped past the start-by
            // point): nothing was started.
            0 if killed_late => {
                reap_unstarted(pid);
                Err(io::Error::from_raw_os_error(LATE))
            }
            0 => Ok(Pid::from_raw(pid)),
            errno => {
                reap_unstarted(pid);
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    } else {
        // Past the start-by point and not yet exec'd: killed, and reaped before its stack and
        // `exec` go away.
        // SAFETY: our own child, not yet reaped, so the pid is still its.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        reap_unstarted(pid);
        Err(io::Error::from_raw_os_error(LATE))
    };
    // SAFETY: the child no longer uses its stack or our memory; restores the mask saved above.
    unsafe {
        libc::close(done[0]);
        libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        libc::munmap(stack, STACK);
    }
    outcome
}

/// Waits for end of file on `fd` (the child exec'd or exited), until `CLOCK_BOOTTIME` reads
/// `start_by_ns` (0: for ever). False when that came first.
fn exec_or_exit(fd: i32, start_by_ns: u64) -> bool {
    loop {
        let timeout_ms = match start_by_ns {
            0 => -1,
            at => {
                let now = boot_ns();
                if now >= at {
                    0
                } else {
                    // Rounded up: never a wake-up before the point.
                    ((at - now).div_ceil(1_000_000)).min(i32::MAX as u64) as i32
                }
            }
        };
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of ours.
        let ready = unsafe { libc::poll(&mut poll, 1, timeout_ms) };
        if ready > 0 {
            let mut byte = 0u8;
            // SAFETY: reads into a byte of ours; nobody writes to the pipe, so this is the end
            // of file (or an error, which says the same: the write end is gone).
            let n = unsafe { libc::read(fd, (&mut byte as *mut u8).cast(), 1) };
            if n <= 0 {
                return true;
            }
        } else if ready == 0 && timeout_ms == 0 {
            return false;
        }
        // Interrupted, or woken before the point: look again.
    }
}

/// The child between clone and exec: only async-signal-safe calls, no allocation, no panics.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `Exec`, alive until the parent has seen this child exec or
    // exit (or has killed and reaped it).
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
        if exec.new_session {
            // Leader of a new session and of its first group, both named by our pid.
            if libc::setsid() < 0 {
                return fail(exec);
            }
            if let Some(session) = exec.watch {
                session.store(libc::getpid(), Ordering::SeqCst);
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
        if exec.start_by_ns != 0 && boot_ns() >= exec.start_by_ns {
            *libc::__errno_location() = LATE;
            return fail(exec);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::clock::{BootClock, Clock};

    fn touch(marker: &Path, start_by: Duration) -> Result<(Child, Target), SpawnError> {
        let argv = [
            OsString::from("sh"),
            OsString::from("-c"),
            OsString::from(format!("touch '{}'", marker.display())),
        ];
        spawn(Path::new("/bin/sh"), &argv, &[], true, None, Some(start_by))
    }

    #[test]
    fn a_child_past_its_start_by_execs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let late = BootClock.now().saturating_sub(Duration::from_millis(1));
        assert!(matches!(touch(&marker, late), Err(SpawnError::Late)));
        assert!(!marker.exists(), "the command ran after its start-by point");

        let (child, _) = touch(&marker, BootClock.now() + Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e:?}"));
        let status = nix::sys::wait::waitpid(child.pid, None).unwrap();
        assert!(
            matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)),
            "{status:?}"
        );
        assert!(marker.exists(), "a child within its start-by point runs");
    }
}
