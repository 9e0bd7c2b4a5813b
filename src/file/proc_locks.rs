//! What `/proc/locks` tells of a `file://` lock without touching it: whether a process holds
//! it, which one, and how many wait.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::files::flock;
use crate::backend::{Holder, hostname};

/// How many processes wait for the lock: those with a place in the queue (`queued`, their
/// pids) and those blocked on any of `files` (its lock file, or a semaphore's slots: `flock(1)`
/// waits there too), from `/proc/locks` (waiters in this PID namespace only); the queued alone
/// when that cannot be read. A process counts once, and not at all while it holds one of them
/// (a semaphore's waiter waits on every slot, and its threads stay blocked once it holds one).
pub fn waiters(files: &[&Path], queued: &[u32]) -> Option<u64> {
    let Some(locks) = ProcLocks::read() else {
        return Some(queued.len() as u64);
    };
    let mut blocked: HashSet<i64> = queued.iter().map(|&pid| i64::from(pid)).collect();
    let mut holding = HashSet::new();
    for path in files {
        let Ok(meta) = fs::symlink_metadata(path) else {
            continue;
        };
        let (on_file, _) = locks.on(&meta);
        for line in on_file {
            if line.blocked {
                blocked.insert(line.pid);
            } else {
                holding.insert(line.pid);
            }
        }
    }
    Some(blocked.difference(&holding).count() as u64)
}

/// Whether some process holds the lock on `file` exclusively (a lock file's exclusive holder,
/// a semaphore's slot, a shared holder's own file); shared holders of a lock file are not
/// counted ([`readers`] names them). `/proc/locks` answers without touching the lock, when it
/// can: an exclusive flock listed on the file's device and inode is a holder, a shared one
/// listed there rules one out (the two never coexist), and no flock listed at all is a free
/// lock, as long as this process sees every process's locks (the initial PID namespace) and
/// the reading was of one instant (it fit in one read). Otherwise (a container, a filesystem
/// whose device numbers differ from the ones `/proc/locks` prints, a host with pages of
/// locks) a shared lock is tried for an instant: a `-n` run at that very instant would find
/// the lock busy.
pub fn is_locked(file: &File) -> io::Result<bool> {
    locked_in(ProcLocks::read().as_ref(), file)
}

/// [`is_locked`], on one reading of `/proc/locks` (`None`: it could not be read).
pub fn locked_in(locks: Option<&ProcLocks>, file: &File) -> io::Result<bool> {
    let meta = file.metadata()?;
    if let Some(locks) = locks {
        let (on_file, exact) = locks.on(&meta);
        let mut granted = on_file.iter().filter(|l| !l.blocked).peekable();
        if exact && granted.clone().any(|l| l.write) {
            return Ok(true);
        }
        // What is not listed rules a holder out only in a reading taken at one instant.
        if locks.snapshot && exact && granted.peek().is_some() {
            return Ok(false);
        }
        if locks.snapshot && on_file.is_empty() && sees_every_process() {
            return Ok(false);
        }
    }
    match flock(file, libc::LOCK_SH | libc::LOCK_NB) {
        Ok(()) => {
            let _ = flock(file, libc::LOCK_UN);
            Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
        Err(e) => Err(e),
    }
}

/// The processes that hold a shared flock on `file` (`flock -s`, `locked-run --shared`), as
/// `/proc/locks` lists them (in this PID namespace only), each once.
pub fn readers(file: &File) -> Vec<u32> {
    let (Ok(meta), Some(locks)) = (file.metadata(), ProcLocks::read()) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = Vec::new();
    for line in locks.on(&meta).0 {
        if !line.blocked && !line.write && line.pid > 0 && !pids.contains(&(line.pid as u32)) {
            pids.push(line.pid as u32);
        }
    }
    pids
}

/// The holder the lock file names, checked against the process `/proc/locks` says holds the
/// lock: a `locked-run` that was SIGKILLed leaves its metadata behind, and the lock may now be
/// held by another program (`flock(1)`, exclusive or shared); then that process is named, not
/// the dead one.
///
/// A live `locked-run` of this host that the file names is taken at its word, and
/// `/proc/locks` is not read: every reading of it waits for an RCU grace period (the kernel
/// takes its list of locks for writing, 10-20 ms on a quiet machine), and a waiter asks who
/// holds the lock each time it finds it busy, on the way to its next wake-up. A holder
/// SIGKILLed leaves no such process, so its stale metadata is still checked (a pid reused by
/// another `locked-run` since is the one case told wrong).
pub fn holder_of(file: &File, named: Holder) -> Holder {
    if names_a_live_run(&named) {
        return named;
    }
    let Ok(meta) = file.metadata() else {
        return named;
    };
    let Some(locks) = ProcLocks::read() else {
        return named;
    };
    let (on_file, _) = locks.on(&meta);
    let granted = || on_file.iter().filter(|l| !l.blocked && l.pid > 0);
    let Some(pid) = granted()
        .find(|l| l.write)
        .or_else(|| granted().next())
        .map(|l| l.pid as u32)
    else {
        return named;
    };
    if named.pid == Some(pid) {
        return named;
    }
    process(pid)
}

/// Whether `named` is a `locked-run` process of this host, alive now (`/proc/PID/comm`).
fn names_a_live_run(named: &Holder) -> bool {
    let (Some(host), Some(pid)) = (named.host.as_deref(), named.pid) else {
        return false;
    };
    host == hostname()
        && fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "locked-run")
}

/// Whether the exclusive flock on `file` is held by a stopped process (SIGSTOP, Ctrl-Z: state
/// `T` in `/proc/PID/stat`), as far as `locks` tells: matched on device and inode, the holder's
/// pid is of this PID namespace. `false` when that cannot be told.
pub fn held_by_stopped(locks: &ProcLocks, file: &File) -> bool {
    let Ok(meta) = file.metadata() else {
        return false;
    };
    let (on_file, exact) = locks.on(&meta);
    let holder = on_file.iter().find(|l| !l.blocked && l.write && l.pid > 0);
    exact
        && holder.is_some_and(|l| {
            fs::read_to_string(format!("/proc/{}/stat", l.pid)).is_ok_and(|stat| {
                let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
                state.is_some_and(|rest| rest.starts_with('T'))
            })
        })
}

/// What this host tells of process `pid`: its name, from `/proc`.
pub fn process(pid: u32) -> Holder {
    Holder {
        host: Some(hostname()),
        pid: Some(pid),
        command: fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|c| c.trim().to_owned()),
        since_ms: None,
        fence: None,
    }
}

/// Whether this process is in the initial PID namespace, where `/proc/locks` lists the locks
/// of every process (elsewhere only those of the processes this namespace sees).
fn sees_every_process() -> bool {
    // PROC_PID_INIT_INO: the initial PID namespace's inode number, fixed by the kernel.
    fs::read_link("/proc/self/ns/pid").is_ok_and(|l| l.as_os_str() == "pid:[4026531836]")
}

/// One line of `/proc/locks` about a flock: "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF",
/// a blocked waiter "1: -> FLOCK  ADVISORY  WRITE 4243 08:01:1234 0 EOF" (the device numbers
/// in hex, the inode in decimal).
#[derive(Clone, Debug, PartialEq, Eq)]
struct LockLine {
    blocked: bool,
    write: bool,
    pid: i64,
    dev: (u64, u64),
    inode: u64,
}

/// One reading of `/proc/locks`.
pub struct ProcLocks {
    lines: Vec<LockLine>,
    /// Whether the reading is of one instant. The kernel lists the locks a page at a time, one
    /// `read(2)` each, letting go of the list between them: lines of a longer reading may be
    /// missed (a lock taken or freed between two reads shifts the rest), so what such a
    /// reading leaves out proves nothing.
    snapshot: bool,
}

impl ProcLocks {
    pub fn read() -> Option<ProcLocks> {
        let mut file = File::open("/proc/locks").ok()?;
        let mut bytes = vec![0; 64 * 1024];
        let first = file.read(&mut bytes).ok()?;
        bytes.truncate(first);
        let mut rest = Vec::new();
        file.read_to_end(&mut rest).ok()?;
        let snapshot = rest.is_empty();
        bytes.extend_from_slice(&rest);
        let mut locks = ProcLocks::parse(&String::from_utf8_lossy(&bytes));
        locks.snapshot = snapshot;
        Some(locks)
    }

    fn parse(text: &str) -> ProcLocks {
        let lines = text
            .lines()
            .filter_map(|line| {
                let mut fields: Vec<&str> = line.split_whitespace().collect();
                let blocked = fields.get(1) == Some(&"->");
                if blocked {
                    fields.remove(1);
                }
                if fields.get(1) != Some(&"FLOCK") {
                    return None;
                }
                let mut id = fields.get(5)?.split(':');
                Some(LockLine {
                    blocked,
                    write: fields.get(3) == Some(&"WRITE"),
                    pid: fields.get(4)?.parse().ok()?,
                    dev: (
                        u64::from_str_radix(id.next()?, 16).ok()?,
                        u64::from_str_radix(id.next()?, 16).ok()?,
                    ),
                    inode: id.next()?.parse().ok()?,
                })
            })
            .collect();
        ProcLocks {
            lines,
            snapshot: true,
        }
    }

    /// The flocks on the file `meta` describes, and whether they were matched on its device
    /// as well as its inode. Some filesystems (btrfs, overlayfs) report a device number in
    /// `stat` other than the one `/proc/locks` prints: then the inode alone is matched, which
    /// another filesystem's file may share, so the match is not exact.
    fn on(&self, meta: &fs::Metadata) -> (Vec<LockLine>, bool) {
        let dev = (
            libc::major(meta.dev()) as u64,
            libc::minor(meta.dev()) as u64,
        );
        let same_inode = self.lines.iter().filter(|l| l.inode == meta.ino());
        let exact: Vec<LockLine> = same_inode
            .clone()
            .filter(|l| l.dev == dev)
            .cloned()
            .collect();
        if !exact.is_empty() {
            return (exact, true);
        }
        (same_inode.cloned().collect(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_locks_lines_are_read_and_matched_on_device_and_inode() {
        let locks = ProcLocks::parse(
            "1: POSIX  ADVISORY  WRITE 77 08:01:99 0 EOF\n\
             2: FLOCK  ADVISORY  WRITE 4242 fd:0a:1234 0 EOF\n\
             2: -> FLOCK  ADVISORY  WRITE 4243 fd:0a:1234 0 EOF\n\
             3: FLOCK  ADVISORY  READ 11 fd:0b:1234 0 EOF\n",
        );
        assert_eq!(locks.lines.len(), 3, "POSIX locks are not ours");
        assert_eq!(
            locks.lines[1],
            LockLine {
                blocked: true,
                write: true,
                pid: 4243,
                dev: (0xfd, 0x0a),
                inode: 1234
            }
        );
        assert!(!locks.lines[2].write);
    }
}
