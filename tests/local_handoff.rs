//! `file://`: the handoff to the next waiter, and what it must not do on the way, nor while it
//! holds the flock on DIR that a grant needs: read `/proc/locks`, whose every reading waits for
//! the kernel. Real processes on a real directory, one waiter traced by strace.

use std::time::Duration;

use crate::support::*;

/// A lone waiter is handed the lock without a reading of `/proc/locks` on the way: each
/// reading waits for an RCU grace period (the kernel takes its list of locks for writing),
/// 10-20 ms on a quiet machine, which made file:// hand a lone waiter the lock some 12 ms after
/// flock would have. See issue 47.
#[test]
fn a_lone_waiter_is_handed_the_lock_without_reading_proc_locks() {
    handed_over_without_reading_proc_locks(0);
}

/// Nor does the waiter behind another, which finds the lock taken by the one before it on its
/// way (and asks who holds it).
#[test]
fn a_waiter_behind_another_is_handed_the_lock_without_reading_proc_locks() {
    handed_over_without_reading_proc_locks(1);
}

/// `ahead` waiters queue behind a holder, then one more under strace; from the instant the
/// holder is told to end, the traced waiter opens `/proc/locks` no more.
fn handed_over_without_reading_proc_locks(ahead: usize) {
    let locks = scratch();
    let url = file_url(locks.path());
    let holder = Holder::start_on(&url, "job", &[]);
    // Queued, and blocked in flock (the head on the lock file, each other one on the place of
    // the one before it): a waiter that had yet to start its thread would start it after the
    // instant this test takes for the release.
    let queued = |n: usize| {
        wait_until("the waiters block", Duration::from_secs(10), || {
            status_json(&url, "job")["waiters"] == n && blocked_in(locks.path()) == n
        })
    };
    let before: Vec<Running> = (0..ahead)
        .map(|i| {
            let waiter = lr().url(&url).job(["true"]).spawn();
            queued(i + 1);
            waiter
        })
        .collect();
    let trace = scratch();
    let trace = trace.path().join("waiter.trace");
    let mut cmd = without_our_settings("strace");
    cmd.args(["-f", "-qq", "-y", "-ttt", "-o", path_str(&trace)])
        .args([
            "-e",
            "trace=openat,flock,close,clone3",
            BIN,
            "-u",
            &url,
            "job",
            "--",
            "true",
        ]);
    let waiter = spawn(cmd);
    queued(ahead + 1);
    let told = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    holder.finish().expect(0);
    for earlier in before {
        earlier.wait().expect(0);
    }
    waiter.wait().expect(0);
    let text = std::fs::read_to_string(&trace).expect("strace is installed (see .ci/setup)");
    let late: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("\"/proc/locks\""))
        .filter(|l| {
            let at = l
                .split_whitespace()
                .nth(1)
                .and_then(|t| t.parse::<f64>().ok());
            at.is_some_and(|at| at >= told)
        })
        .collect();
    assert!(
        late.is_empty(),
        "the waiter read /proc/locks on its way to the lock:\n{}",
        late.join("\n")
    );
    // Nor starts a thread on the way: the one that waited on the place of the waiter before it
    // goes on to wait on the lock file (a thread started once the lock is busy may first run
    // after the release it was started to see, on a busy machine).
    let threads: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("clone3("))
        .filter(|l| {
            let at = l
                .split_whitespace()
                .nth(1)
                .and_then(|t| t.parse::<f64>().ok());
            at.is_some_and(|at| at >= told)
        })
        .collect();
    assert!(
        threads.is_empty(),
        "the waiter started a thread on its way to the lock:\n{}",
        threads.join("\n")
    );
    // Nor while it held the flock on DIR (taking its place in the queue), which a grant
    // needs too: a handoff meanwhile would wait as long.
    let dir = format!("<{}>", path_str(locks.path()));
    let mut held = false;
    for line in text.lines() {
        if line.contains("flock(") && line.contains(&dir) && line.contains("LOCK_EX") {
            held = line.ends_with("= 0");
        } else if line.contains("close(") && line.contains(&dir) {
            held = false;
        }
        assert!(
            !(held && line.contains("\"/proc/locks\"")),
            "the waiter read /proc/locks under the flock on {dir}:\n{text}"
        );
    }
}

/// How many flock requests are blocked on the files of `dir`, as `/proc/locks` lists them (the
/// `->` lines), matched by inode.
fn blocked_in(dir: &std::path::Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let inodes: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.ino())
        .collect();
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .filter(|l| l.contains("->") && l.contains("FLOCK"))
        .filter_map(|l| {
            l.split_whitespace()
                .nth(6)?
                .rsplit(':')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .filter(|inode| inodes.contains(inode))
        .count()
}
