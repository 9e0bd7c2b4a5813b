//! What the watcher reads and does in `/proc` without allocating (it shares the wrapper's
//! memory, so it may only make plain system calls): the descriptors it closes, and the job's
//! session it SIGKILLs, process by process, until none is left.

use super::NAME;

/// Closes every descriptor of the watcher's own table but `keep`: `close_range`, or, before
/// Linux 5.9, each one `/proc/self/fd` lists.
pub(super) unsafe fn close_all_but(keep: libc::c_int) {
    let keep = keep as libc::c_uint;
    // SAFETY: plain system calls on the watcher's own descriptor table.
    unsafe {
        let below = keep == 0 || libc::syscall(libc::SYS_close_range, 0, keep - 1, 0) == 0;
        let above = libc::syscall(libc::SYS_close_range, keep + 1, libc::c_uint::MAX, 0) == 0;
        if below && above {
            return;
        }
        each_number_in(c"/proc/self/fd", |fd, dir| {
            if fd != keep && fd != dir as libc::c_uint {
                libc::close(fd as libc::c_int);
            }
            true
        });
    }
}

/// Calls `f` with each decimal entry of directory `path` (a pid in `/proc`, a descriptor in
/// `/proc/self/fd`) and the directory's own descriptor, read into a buffer on the stack,
/// until `f` says false. Nothing happens if `path` cannot be opened.
unsafe fn each_number_in(path: &std::ffi::CStr, mut f: impl FnMut(u32, libc::c_int) -> bool) {
    // SAFETY: plain system calls on buffers of this frame.
    unsafe {
        let dir = libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        );
        if dir < 0 {
            return;
        }
        let mut entries = [0u8; 4096];
        'scan: loop {
            let n = libc::syscall(
                libc::SYS_getdents64,
                dir,
                entries.as_mut_ptr(),
                entries.len(),
            );
            if n <= 0 {
                break;
            }
            let mut at = 0usize;
            while at + 19 < n as usize {
                // struct linux_dirent64: d_ino u64, d_off i64, d_reclen u16, d_type u8, d_name.
                let reclen = u16::from_ne_bytes([entries[at + 16], entries[at + 17]]) as usize;
                if reclen == 0 {
                    break 'scan;
                }
                let name = &entries[at + 19..(at + reclen).min(n as usize)];
                if let Some(number) = decimal(name) {
                    if !f(number, dir) {
                        break 'scan;
                    }
                }
                at += reclen;
            }
        }
        libc::close(dir);
    }
}

/// SIGKILLs every process of session `sid` until no live one is left (zombies are dead: their
/// new parent reaps them, or not, as it likes). The job's first group goes atomically with one
/// `kill`; what moved to another group of the session (`timeout`, `set -m`) is found in `/proc`
/// and killed one by one, and a process it forked meanwhile is in the next pass, which comes
/// 1 ms later, then less and less often, at least every 100 ms, for as long as something lives.
/// A session's id is not reused while any process is in it, so nothing else is killed.
///
/// One process of the session is waited for, never killed: the watcher of a `locked-run` that
/// the job runs itself. That run's own job is in a session of its own, which a kill of ours
/// does not reach; once its wrapper dies with ours, its watcher is what kills that job, and it
/// ends when that is done. It is known by its name and by blocking every signal it can, as a
/// watcher does from its first instruction: a program that only bears the name
/// (`locked-run-watchdog`, cut to 15 bytes by the kernel) is killed like the rest, and a
/// watcher of another build (a package upgraded during a long job) is still spared.
pub(super) unsafe fn kill_session(sid: libc::pid_t) {
    let mut pause_ms = 1;
    loop {
        // SAFETY: plain system calls.
        unsafe { libc::kill(-sid, libc::SIGKILL) };
        if !unsafe { kill_members(sid) } {
            return;
        }
        super::sys::nap_ms(pause_ms);
        pause_ms = (pause_ms * 2).min(100);
    }
}

/// SIGKILLs each live process of session `sid` that `/proc` lists (a nested run's watcher
/// aside), read into buffers on the stack; says whether it found any alive. If `/proc` cannot
/// be read, the session counts as gone.
unsafe fn kill_members(sid: libc::pid_t) -> bool {
    let mut found = false;
    // SAFETY: reads /proc into buffers on the stack; kill is a plain system call.
    unsafe {
        each_number_in(c"/proc", |pid, _| {
            if let Some(member) = member(pid, sid) {
                if !member.watcher {
                    libc::kill(pid as libc::pid_t, libc::SIGKILL);
                }
                found = true;
            }
            true
        });
    }
    found
}

/// A NUL-terminated decimal name (a `/proc` entry that is a process).
fn decimal(name: &[u8]) -> Option<u32> {
    let mut value: u32 = 0;
    let mut digits = 0;
    for &b in name {
        match b {
            0 => break,
            b'0'..=b'9' => {
                value = value.checked_mul(10)?.checked_add(u32::from(b - b'0'))?;
                digits += 1;
            }
            _ => return None,
        }
    }
    (digits > 0).then_some(value)
}

/// A live process of a session, as its `/proc/PID/stat` line tells.
#[derive(Debug, PartialEq, Eq)]
struct Member {
    /// Named as a watcher is ([`NAME`]).
    watcher: bool,
}

/// PID as a member of session `sid`, if `/proc/PID/stat` says it is one and it is alive: not
/// a zombie, or a zombie first thread whose process has a thread that still runs (its main
/// thread called `pthread_exit`). It counts as a nested run's watcher if it is named as one
/// and blocks every signal it can (a name alone proves nothing: `locked-run-watchdog` is cut
/// to it by the kernel).
unsafe fn member(pid: u32, sid: libc::pid_t) -> Option<Member> {
    let mut path = [0u8; 64];
    // SAFETY: a NUL-terminated path in this frame.
    let stat = unsafe { read_stat(proc_path(&mut path, pid, None, b"/stat"))? };
    if stat.session != sid {
        return None;
    }
    // SAFETY: plain reads of /proc.
    if matches!(stat.state, b'Z' | b'X') && !unsafe { live_thread(pid) } {
        return None;
    }
    // SAFETY: a NUL-terminated path in this frame.
    let watcher = stat.watcher
        && unsafe { blocked_signals(proc_path(&mut path, pid, None, b"/status")) }
            .is_some_and(super::blocks_every_signal);
    Some(Member { watcher })
}

/// The `SigBlk` mask of the `/proc/PID/status` file at `path`, read into a buffer on the stack.
unsafe fn blocked_signals(path: *const libc::c_char) -> Option<u64> {
    let mut status = [0u8; 4096];
    // SAFETY: a NUL-terminated path and a buffer of this frame.
    let n = unsafe {
        let fd = libc::open(path, libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, status.as_mut_ptr().cast(), status.len());
        libc::close(fd);
        n
    };
    if n <= 0 {
        return None;
    }
    sig_blk(&status[..n as usize])
}

/// The hexadecimal mask on a status text's `SigBlk:` line.
fn sig_blk(status: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\nSigBlk:";
    let at = status.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let mut mask: u64 = 0;
    let mut digits = 0;
    for &b in &status[at..] {
        let digit = match b {
            b'\t' | b' ' if digits == 0 => continue,
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => break,
        };
        mask = mask.checked_mul(16)? | u64::from(digit);
        digits += 1;
    }
    (digits > 0).then_some(mask)
}

/// Whether any thread of process `pid` is alive (not a zombie), by its `/proc/PID/task` entries.
unsafe fn live_thread(pid: u32) -> bool {
    let mut dir = [0u8; 64];
    let mut alive = false;
    // SAFETY: NUL-terminated paths in this frame; plain reads of /proc.
    unsafe {
        let tasks = proc_path(&mut dir, pid, None, b"/task");
        each_number_in(std::ffi::CStr::from_ptr(tasks), |tid, _| {
            let mut path = [0u8; 64];
            let stat = read_stat(proc_path(&mut path, pid, Some(tid), b"/stat"));
            alive = stat.is_some_and(|s| !matches!(s.state, b'Z' | b'X'));
            !alive
        });
    }
    alive
}

/// Writes "/proc/PID[/task/TID]TAIL\0" into `out` (64 bytes hold the longest) and returns it.
fn proc_path(out: &mut [u8; 64], pid: u32, tid: Option<u32>, tail: &[u8]) -> *const libc::c_char {
    out[..6].copy_from_slice(b"/proc/");
    let mut len = 6;
    len += write_decimal(&mut out[len..], pid);
    if let Some(tid) = tid {
        out[len..len + 6].copy_from_slice(b"/task/");
        len += 6;
        len += write_decimal(&mut out[len..], tid);
    }
    out[len..len + tail.len()].copy_from_slice(tail);
    len += tail.len();
    out[len] = 0;
    out.as_ptr().cast()
}

/// The `/proc/.../stat` file at `path`, parsed, read into a buffer on the stack.
unsafe fn read_stat(path: *const libc::c_char) -> Option<Stat> {
    let mut stat = [0u8; 512];
    // SAFETY: a NUL-terminated path and a buffer of this frame.
    let n = unsafe {
        let fd = libc::open(path, libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, stat.as_mut_ptr().cast(), stat.len());
        libc::close(fd);
        n
    };
    if n <= 0 {
        return None;
    }
    parse_stat(&stat[..n as usize])
}

/// What the watcher reads of a `/proc/PID/stat` line.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    state: u8,
    session: libc::pid_t,
    watcher: bool,
}

/// The state, session and whether COMM is a watcher's from a `/proc/PID/stat` line: "PID (COMM)
/// STATE PPID PGRP SESSION ..."; COMM may hold spaces and parentheses, so fields are counted from
/// the last ')'.
fn parse_stat(stat: &[u8]) -> Option<Stat> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let open = stat.iter().position(|&b| b == b'(')?;
    let watcher = stat.get(open + 1..close) == Some(NAME.to_bytes());
    let rest = stat.get(close + 2..)?;
    let state = *rest.first()?;
    let mut fields = rest.split(|&b| b == b' ');
    fields.next()?; // state
    fields.next()?; // ppid
    fields.next()?; // pgrp
    let session = fields.next()?;
    let mut value: libc::pid_t = 0;
    for &b in session {
        if !b.is_ascii_digit() {
            return None;
        }
        value = value
            .checked_mul(10)?
            .checked_add(libc::pid_t::from(b - b'0'))?;
    }
    Some(Stat {
        state,
        session: value,
        watcher,
    })
}

/// Writes `value` in decimal at the start of `out`; returns how many bytes.
fn write_decimal(out: &mut [u8], mut value: u32) -> usize {
    let mut digits = [0u8; 10];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (value % 10) as u8;
        n += 1;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    for i in 0..n {
        out[i] = digits[n - 1 - i];
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_entries_and_stat_lines_are_read_without_allocating() {
        assert_eq!(decimal(b"4242\0junk"), Some(4242));
        assert_eq!(decimal(b"self\0"), None);
        assert_eq!(decimal(b"\0"), None);
        let stat = |state, session, watcher| {
            Some(Stat {
                state,
                session,
                watcher,
            })
        };
        assert_eq!(
            parse_stat(b"77 (sh -c (x)) S 1 4243 4242 0 -1"),
            stat(b'S', 4242, false)
        );
        assert_eq!(
            parse_stat(b"78 (sleep) Z 1 4243 4242"),
            stat(b'Z', 4242, false)
        );
        assert_eq!(
            parse_stat(b"79 (locked-run-watc) S 1 79 4242"),
            stat(b'S', 4242, true)
        );
        assert_eq!(parse_stat(b"garbage"), None);
        let mut out = [0u8; 10];
        let n = write_decimal(&mut out, 1_234_567);
        assert_eq!(&out[..n], b"1234567");
        let n = write_decimal(&mut out, 0);
        assert_eq!(&out[..n], b"0");
    }

    #[test]
    fn this_process_is_alive_in_its_session_and_a_made_up_session_is_not() {
        let me = std::process::id();
        let session = nix::unistd::getsid(None).unwrap().as_raw();
        // SAFETY: reads /proc only.
        unsafe {
            assert_eq!(member(me, session), Some(Member { watcher: false }));
            assert_eq!(member(me, session + 1), None);
            assert!(live_thread(me));
        }
        assert_eq!(
            sig_blk(
                b"Name:\tx\nSigPnd:\t0000000000000001\nSigBlk:\tfffffffffffbfeff\nSigIgn:\t0\n"
            ),
            Some(0xffff_ffff_fffb_feff)
        );
        assert_eq!(sig_blk(b"Name:\tx\n"), None);
        assert!(super::super::blocks_every_signal(0xffff_ffff_fffb_feff));
        assert!(!super::super::blocks_every_signal(0));
        let mut path = [0u8; 64];
        let at = proc_path(&mut path, 4_294_967_295, Some(4_294_967_295), b"/stat");
        // SAFETY: proc_path NUL-terminates what it writes.
        let written = unsafe { std::ffi::CStr::from_ptr(at) };
        assert_eq!(written.to_bytes(), b"/proc/4294967295/task/4294967295/stat");
    }
}
