//! The watcher: a tiny process that outlives a `locked-run` killed by SIGKILL (or a crash) just
//! long enough to SIGKILL every process of the job's session, and waits until none is left.
//!
//! PDEATHSIG reaches the direct child only: without the watcher, a `sh -c 'long-job & wait'`
//! would leave `long-job` running after its wrapper's death, beside the next holder's command
//! (at once with `file://`, whose flock dies with the wrapper; T later with Redis). The watcher
//! keeps a copy of every descriptor the wrapper had when it started, the `file://` lock among
//! them, so a host-local lock stays held until the old job is gone. A lease's watcher needs
//! none of them and closes them all but its pipe: a copy of a connection would keep the
//! server's client (and its subscription) alive after the wrapper let it go, and a copy of the
//! wrapper's stdout or stderr would hold a reader's pipe open.
//!
//! How it learns of the death: it blocks reading a pipe whose only write end the wrapper holds
//! (close-on-exec, so the command never has it); end of file means the wrapper is gone. When
//! the job ends normally the wrapper clears the session it named and closes the pipe, and the
//! watcher exits without touching anything. A run that has to wait for a lease starts its
//! watcher while it waits, so that the grant is not followed by a clone more before the
//! command's; the point the start may not pass is then named at the grant, with one byte on
//! the pipe (the only thing ever written to it). A watcher killed while the run waits is
//! replaced at the grant ([`Watcher::arm`]); one killed while the job runs, as soon as its
//! pidfd says so ([`Watcher::exits`]).
//!
//! It also guards the command's start: a command must not start past the lease's kill-signal
//! point, and the wrapper waits for its exec no longer than that point before it SIGKILLs it;
//! but an exec held up in the kernel (a lease on the program's file, a slow file system) while
//! the wrapper itself is stopped would otherwise complete whenever it unblocks. So the watcher,
//! which a SIGSTOP of the wrapper does not stop, wakes at that point too and SIGKILLs the
//! child should it still be between its clone and its exec (the kernel writes the child's pid
//! to the shared block at the clone and clears it when the exec commits or the child exits).
//!
//! It is started like the command (see `spawn`): `clone(CLONE_VM)` on a stack of its own, so
//! nothing is copied and no page is faulted twice. It shares the wrapper's memory, so until the
//! wrapper is gone it may only make plain system calls: no allocation, no locks, no logging.
//! Every signal is blocked in it (SIGKILL aside), it sits in a process group of its own so that
//! a kill aimed at the wrapper's group does not take it along, and it is not a child the wrapper
//! waits for (no exit signal), except when the wrapper reaps it after dismissing it.

use std::ffi::c_void;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};

use nix::unistd::Pid;

mod proc;
mod sys;

use proc::{close_all_but, kill_session};

/// What the wrapper and the watcher share: the job's session to kill (0: none), the command
/// between its clone and its exec and the point it may not exec past, and the pipe.
#[repr(C)]
struct Shared {
    /// The job's session id, which is also its first process group's (the command's pid).
    session: AtomicI32,
    /// The command's pid from its clone until its exec commits or it exits, else 0: written and
    /// cleared by the kernel (`CLONE_CHILD_SETTID`, `CLONE_CHILD_CLEARTID`).
    pre_exec: AtomicI32,
    /// `CLOCK_BOOTTIME` ns past which the command must not start (0: no such point, or not
    /// known yet: see [`Watcher::arm`]).
    start_by_ns: AtomicU64,
    /// Set before the watcher SIGKILLs a command still short of its exec at that point.
    killed_before_exec: AtomicBool,
    read_fd: libc::c_int,
    write_fd: libc::c_int,
    /// Keep the descriptors copied at the clone (`file://`: its lock among them).
    keep_descriptors: bool,
}

/// The running watcher, as the wrapper sees it.
pub struct Watcher {
    pid: libc::pid_t,
    shared: &'static Shared,
    write: Option<OwnedFd>,
}

/// The watcher's pid while one runs, so the job's process tree leaves it out.
static RUNNING: AtomicI32 = AtomicI32::new(0);

/// The size of the watcher's mapping: its stack, with the shared block at the bottom.
const MAPPING: usize = 32 * 1024;

impl Watcher {
    /// Starts the watcher. The job's session is named later ([`Watcher::session`]), by the
    /// child itself before it execs, so no instant exists where the wrapper could die with a
    /// job the watcher does not know. `start_by` is the point past which the command
    /// must not start (a `CLOCK_BOOTTIME` reading; none for a lock the kernel holds, or not
    /// known yet: see [`Watcher::arm`]). `keep_descriptors`: keep the copies of the wrapper's
    /// descriptors (a lock the kernel holds for an open file); else all but its pipe are
    /// closed. `session`: the job's session when it is already known (a watcher started to
    /// replace one that died), else 0.
    pub fn start(
        start_by: Option<std::time::Duration>,
        keep_descriptors: bool,
        session: libc::pid_t,
    ) -> io::Result<Watcher> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills two descriptors, owned below.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh descriptors from pipe2.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: an anonymous private mapping, never unmapped: the watcher may use it until
        // it exits, which can be after the wrapper's death.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                MAPPING,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let shared = base as *mut Shared;
        // SAFETY: the mapping is writable, aligned to a page and large enough.
        unsafe {
            shared.write(Shared {
                session: AtomicI32::new(session),
                pre_exec: AtomicI32::new(0),
                killed_before_exec: AtomicBool::new(false),
                start_by_ns: AtomicU64::new(crate::plumbing::clock::boot_ns_at(start_by)),
                read_fd: read.as_raw_fd(),
                write_fd: write.as_raw_fd(),
                keep_descriptors,
            });
        }
        let top = (base as usize + MAPPING) & !15;
        let pid = with_signals_blocked(|| {
            // SAFETY: the watcher runs `watcher_main` on its own stack in our memory; it only
            // makes async-signal-safe system calls (see there). No exit signal: it is no child
            // that `waitpid(-1)` reports.
            unsafe {
                libc::clone(
                    watcher_main,
                    top as *mut c_void,
                    libc::CLONE_VM,
                    shared as *mut c_void,
                )
            }
        });
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(read);
        RUNNING.store(pid, Ordering::SeqCst);
        Ok(Watcher {
            pid,
            // SAFETY: initialised above, and never unmapped.
            shared: unsafe { &*shared },
            write: Some(write),
        })
    }

    /// Names the point past which the command must not start, for a watcher started before it
    /// was known (while the run waited for the lock, off the path from the grant to the
    /// start): the point is stored, then one byte on the pipe wakes the watcher to read it.
    /// A watcher that is gone by then (killed while the run waited) is replaced by a fresh
    /// one, started with the point: the job is never started unwatched for want of it.
    pub fn arm(mut self, start_by: Option<std::time::Duration>) -> io::Result<Watcher> {
        let (keep_descriptors, self_pid) = (self.keeps_descriptors(), self.pid);
        let mut status = 0;
        // SAFETY: polls our own clone child (__WALL: it has no exit signal), never blocks.
        let reaped = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG | libc::__WALL) }
            == self.pid;
        if !reaped {
            let ns = crate::plumbing::clock::boot_ns_at(start_by);
            self.shared.start_by_ns.store(ns, Ordering::SeqCst);
            let write = self.write.as_ref().map_or(-1, AsRawFd::as_raw_fd);
            // SAFETY: one byte from the stack to our own pipe; a pipe with room never blocks.
            // EPIPE (SIGPIPE being ignored) says the watcher is gone.
            if ns == 0 || unsafe { libc::write(write, b"s".as_ptr().cast(), 1) } == 1 {
                return Ok(self);
            }
            self.dismiss();
        } else {
            RUNNING.store(0, Ordering::SeqCst);
            drop(self.write.take());
        }
        tracing::warn!(
            "the watcher started while waiting is gone (pid {}); starting another",
            self_pid
        );
        Watcher::start(start_by, keep_descriptors, 0)
    }

    /// A descriptor that turns readable when the watcher exits (a pidfd), for the wrapper to
    /// notice a watcher killed while the job runs; none where the kernel has no pidfds (before
    /// Linux 5.3).
    pub fn exits(&self) -> Option<OwnedFd> {
        // SAFETY: pidfd_open on our own clone child, not yet reaped; the new descriptor is
        // owned below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) };
        // SAFETY: a fresh descriptor from pidfd_open (close-on-exec by default).
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    }

    /// The watcher's pid.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Whether it keeps its copies of the wrapper's descriptors (see [`Watcher::start`]): a
    /// watcher started in its place must do the same.
    pub fn keeps_descriptors(&self) -> bool {
        self.shared.keep_descriptors
    }

    /// Where the child writes its session (its pid) between `setsid` and `exec`.
    pub fn session(&self) -> &AtomicI32 {
        &self.shared.session
    }

    /// Where the kernel keeps the command's pid between its clone and its exec (see
    /// [`crate::child::Watched`]).
    pub fn pre_exec(&self) -> &AtomicI32 {
        &self.shared.pre_exec
    }

    /// Whether the watcher SIGKILLed the command short of its exec (see
    /// [`crate::child::Watched`]).
    pub fn killed_before_exec(&self) -> &AtomicBool {
        &self.shared.killed_before_exec
    }

    /// The job is gone: from now on the watcher leaves its session alone, should the wrapper
    /// die. One store to shared memory, so it costs nothing before the release; the watcher
    /// itself is let go later ([`Watcher::dismiss`]), off the path to the next holder.
    pub fn disarm(&self) {
        self.shared.session.store(0, Ordering::SeqCst);
    }

    /// Lets the watcher go, after [`Watcher::disarm`] if it was not called, and reaps it: end
    /// of file on its pipe, and SIGKILL, since it has nothing left to do and a stopped watcher
    /// must not hold the wrapper in its reap.
    ///
    /// For `file://` the watcher's copy of the lock's descriptor does not keep the lock: the
    /// release unlocks it (`LOCK_UN`), which frees it for every descriptor sharing it.
    pub fn dismiss(mut self) {
        self.disarm();
        drop(self.write.take());
        let mut status = 0;
        // SAFETY: our own clone child, not yet reaped (so its pid is not another's); waits for
        // it (__WALL: it has no exit signal), which SIGKILL makes prompt.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, &mut status, libc::__WALL);
        }
        RUNNING.store(0, Ordering::SeqCst);
    }
}

/// The watcher's name (`ps -o comm`): 15 bytes, all the kernel keeps of a name. A kill of a
/// job's session passes over a process of this name that blocks every signal it can (a
/// nested `locked-run`'s watcher) and waits for it instead: see [`kill_session`].
pub const NAME: &std::ffi::CStr = c"locked-run-watc";

/// Whether a blocked-signal mask (`SigBlk` in `/proc/PID/status`) holds every signal but the
/// two no process can block (SIGKILL, SIGSTOP): a watcher's, from its first instruction.
pub fn blocks_every_signal(mask: u64) -> bool {
    let unblockable = (1 << (libc::SIGKILL - 1)) | (1 << (libc::SIGSTOP - 1));
    mask | unblockable == u64::MAX
}

/// The running watcher, if any: not part of the job.
pub fn running() -> Option<Pid> {
    Some(RUNNING.load(Ordering::SeqCst))
        .filter(|&pid| pid > 0)
        .map(Pid::from_raw)
}

/// Runs `f` with every signal blocked on this thread, restoring the mask after: a child created
/// meanwhile starts with everything blocked, and none of our handlers can run in it.
fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: sigset_t is plain data, filled by sigfillset and pthread_sigmask.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to local sigsets.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let result = f();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    result
}

/// The watcher itself: only async-signal-safe system calls, no allocation, no panics. Its
/// errno is the wrapper's main thread's (shared memory, shared thread pointer): no call here
/// fails while the wrapper lives, but for the `read` that ends on the wrapper's death (and
/// `close_range` on a kernel before 5.9, once, as the watcher starts).
extern "C" fn watcher_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` is the shared block, which is never unmapped.
    let shared = unsafe { &*(arg as *const Shared) };
    // SAFETY: plain system calls on this process.
    unsafe {
        libc::close(shared.write_fd);
        if !shared.keep_descriptors {
            close_all_but(shared.read_fd);
        }
        libc::setpgid(0, 0);
        // glibc's sigfillset leaves out the two signals it keeps for its threads (32 and 33),
        // whose default is to terminate: the kernel's own call blocks them too.
        let all: u64 = !0;
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &raw const all,
            std::ptr::null_mut::<u64>(),
            8,
        );
        libc::prctl(libc::PR_SET_NAME, NAME.as_ptr(), 0, 0, 0);
        watch(shared);
        let session = shared.session.load(Ordering::SeqCst);
        if session > 0 {
            kill_session(session);
        }
        libc::_exit(0)
    }
}

/// Waits for the wrapper's end (end of file on the pipe: it let the watcher go, or died), and
/// meanwhile guards the start: at the start-by point, a command still between its clone and
/// its exec is SIGKILLed, since its exec would start it past the point should it unblock
/// while the wrapper, which waits for it too, is stopped. A byte on the pipe says that the
/// point was named ([`Watcher::arm`]); nothing else is ever written. One wake-up per event.
///
/// The pid read cannot be another process's: the kernel clears it before the child can be
/// reaped. Should the child exec and exit between the read and the kill, the kill finds a
/// zombie (the wrapper's to reap) and does nothing; should its exec commit just then, the
/// command is killed at its start, as the lease clock's first kill signal is due at this very
/// point (no renewal runs while the wrapper waits for the exec).
unsafe fn watch(shared: &Shared) {
    let mut guarded = false;
    loop {
        let start_by = shared.start_by_ns.load(Ordering::SeqCst);
        let mut timeout = -1;
        if start_by > 0 && !guarded {
            let now = crate::plumbing::clock::boot_ns();
            if now >= start_by {
                let pid = shared.pre_exec.load(Ordering::SeqCst);
                if pid > 0 {
                    shared.killed_before_exec.store(true, Ordering::SeqCst);
                    // SAFETY: a plain system call on the wrapper's child, not yet reapable.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                guarded = true;
                continue;
            }
            timeout = (start_by - now).div_ceil(1_000_000).min(i32::MAX as u64) as i32;
        }
        // With every signal blocked, the wait only ends on the pipe or the timeout (should
        // it fail, the read below blocks rather than spin).
        if sys::wait_readable(shared.read_fd, timeout) == 0 {
            continue;
        }
        let mut byte = 0u8;
        // SAFETY: one byte into this frame.
        if unsafe { libc::read(shared.read_fd, (&raw mut byte).cast(), 1) } <= 0 {
            return;
        }
    }
}
