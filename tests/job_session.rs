//! A job is a session of its own: every kill (the watcher's after a SIGKILLed wrapper, a lost
//! lease, `--max-run`, the sweep) reaches the processes that moved to another process group of
//! it (coreutils `timeout`, a `set -m` shell, a process that calls `setpgid` itself), and only
//! a process that left it with `setsid` is let go (also one still on its way out when the
//! job's main process ends: the sweep lets the group settle, and names what it stops). On
//! every backend.
//!
//! See: issue 35, break 1 (the watcher killed the job's first process group only, so a
//! SIGKILLed wrapper's `timeout 60 sleep 61` ran on beside the next holder's command), and the
//! review of its mend: a process whose main thread had ended looked dead in `/proc` to every
//! kill, and any program named like a nested run's watcher (`locked-run-watchdog`) was spared.

use std::path::Path;
use std::time::Duration;

use crate::support::*;

/// The job's shapes, each pid written to a file of `dir` as it starts: `timeout` (which puts
/// itself in a new group) and its `sleep`; a `set -m` shell's `sleep`, in a group of its own;
/// a perl that calls `setpgid` itself; a python in a group of its own whose main thread has
/// ended (`pthread_exit`) while another runs on, so `/proc` shows it a zombie; a program that
/// only bears a nested watcher's name (`locked-run-watchdog`, which the kernel cuts to
/// `locked-run-watc`) in a `set -m` group; and a `setsid` daemon, which is meant to live (its
/// output goes elsewhere, so that it holds no pipe of the test's open). `ready` is written once
/// all are there; then the script waits for them.
fn job_script(dir: &Path) -> String {
    let d = path_str(dir);
    format!(
        "timeout 60 sh -c 'echo $$ > {d}/timeout.tmp; mv {d}/timeout.tmp {d}/timeout; exec sleep 61' &
         bash -c 'set -m; sleep 72 & echo $! > {d}/setm.tmp; mv {d}/setm.tmp {d}/setm; wait' &
         perl -e 'setpgrp(0, 0); open my $f, \">\", \"{d}/setpgid.tmp\"; print $f \"$$\\n\"; close $f; \
                  rename \"{d}/setpgid.tmp\", \"{d}/setpgid\"; sleep 80' &
         python3 -c '{ZOMBIE_LEADER}' {d} &
         cp \"$(command -v sleep)\" {d}/locked-run-watchdog
         bash -c 'set -m; {d}/locked-run-watchdog 85 & echo $! > {d}/named.tmp; mv {d}/named.tmp {d}/named; wait' &
         setsid sh -c 'echo $$ > {d}/daemon.tmp; mv {d}/daemon.tmp {d}/daemon; exec sleep 90' > /dev/null 2>&1 &
         for f in timeout setm setpgid leaderless named daemon; do while [ ! -e {d}/$f ]; do sleep 0.01; done; done
         echo ready > {d}/ready
         wait"
    )
}

/// A process in a group of its own whose main thread ends while a second thread runs on.
const ZOMBIE_LEADER: &str = "import ctypes, os, sys, threading, time
os.setpgid(0, 0)
threading.Thread(target=time.sleep, args=(70,)).start()
d = sys.argv[1]
open(d + \"/leaderless.tmp\", \"w\").write(\"%d\\n\" % os.getpid())
os.rename(d + \"/leaderless.tmp\", d + \"/leaderless\")
ctypes.CDLL(None).pthread_exit(None)";

/// The pids the job wrote: the five that stayed in its session, then the daemon.
fn job_pids(dir: &Path) -> ([i32; 5], i32) {
    wait_for_file(&dir.join("ready"), Duration::from_secs(20), |t| {
        t.ends_with('\n')
    });
    let pid = |name: &str| -> i32 {
        std::fs::read_to_string(dir.join(name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    (
        [
            pid("timeout"),
            pid("setm"),
            pid("setpgid"),
            pid("leaderless"),
            pid("named"),
        ],
        pid("daemon"),
    )
}

/// Ends the daemon the test let live.
struct Daemon(i32);

impl Drop for Daemon {
    fn drop(&mut self) {
        signal(self.0, libc::SIGKILL);
    }
}

fn assert_gone(pids: &[i32], what: &str) {
    for &pid in pids {
        assert!(
            wait_pid_exit(pid, Duration::from_secs(10)),
            "{what}: process {pid} of the job's session outlived it"
        );
    }
}

/// A command that writes to `out` which of `pids` are alive (a thread of theirs that is not a
/// zombie) as it starts.
fn check_alive(pids: &[i32], out: &Path) -> String {
    let list: Vec<String> = pids.iter().map(i32::to_string).collect();
    format!(
        "for p in {}; do for t in /proc/$p/task/*; do s=$(cut -d' ' -f3 $t/stat 2>/dev/null); \
         case \"$s\" in ''|Z|X) ;; *) echo \"alive $p\"; break;; esac; done; done > {o}.tmp; mv {o}.tmp {o}",
        list.join(" "),
        o = path_str(out)
    )
}

/// SIGKILLs the wrapper of a job with every shape: the watcher kills the whole session but the
/// daemon, and the next holder's command (which waits for the lock) finds none of it alive.
fn a_sigkilled_wrappers_whole_session_dies_before_the_next_holder(url: &[String], ttl: &str) {
    let dir = scratch();
    let first = lr()
        .args(url)
        .args(["--ttl", ttl, "job"])
        .sh(&job_script(dir.path()))
        .spawn();
    let (pids, daemon) = job_pids(dir.path());
    let _daemon = Daemon(daemon);
    signal(first.pid(), libc::SIGKILL);
    let out = dir.path().join("seen-by-the-next-holder");
    lr().args(url)
        .args(["--ttl", ttl, "-w", "30s", "job"])
        .sh(&check_alive(&pids, &out))
        .run()
        .expect_with(0, "the next holder runs once the lock is free");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "",
        "the next holder's command started beside the SIGKILLed wrapper's job"
    );
    assert_gone(&pids, "after the wrapper was SIGKILLed");
    assert!(alive(daemon), "the setsid daemon was let go");
    let _ = first.wait();
}

#[test]
fn a_sigkilled_wrapper_leaves_nothing_of_its_job_on_redis() {
    let redis = Redis::start();
    a_sigkilled_wrappers_whole_session_dies_before_the_next_holder(
        &["-u".into(), redis.url()],
        "2s",
    );
}

#[test]
fn a_sigkilled_wrapper_leaves_nothing_of_its_job_on_file() {
    let locks = scratch();
    let url = file_url(locks.path());
    a_sigkilled_wrappers_whole_session_dies_before_the_next_holder(&["-u".into(), url], "2s");
}

#[test]
fn a_sigkilled_wrapper_leaves_nothing_of_its_job_on_redlock() {
    let five = Five::start();
    // Redlock's per-server timeout at its default (T/100 = 20 ms) is missed on two loaded
    // cores; this test is not about it.
    let args = [
        five.url_args(),
        vec!["--node-timeout".into(), "300ms".into()],
    ]
    .concat();
    a_sigkilled_wrappers_whole_session_dies_before_the_next_holder(&args, "2s");
}

#[test]
fn a_sigkilled_wrapper_leaves_nothing_of_its_job_on_etcd() {
    let etcd = Etcd::start();
    a_sigkilled_wrappers_whole_session_dies_before_the_next_holder(
        &["-u".into(), etcd.url()],
        "2s",
    );
}

/// A lost lease stops every process of the job's session, not only its first group.
#[test]
fn a_lost_lease_stops_the_whole_session() {
    let redis = Redis::start();
    let dir = scratch();
    let run = lr()
        .url(&redis.url())
        .args(["--ttl", "2s", "job"])
        .sh(&job_script(dir.path()))
        .spawn();
    let (pids, daemon) = job_pids(dir.path());
    let _daemon = Daemon(daemon);
    let _: () = redis.cmd(&["DEL", "lock:{job}"]);
    // (What the kill signal has not ended yet when the main process exits may be named in a
    // warning before the line that says the lock was lost.)
    let out = run.wait().expect(76);
    assert!(
        out.stderr.contains("locked-run: lost the lock job"),
        "{}",
        out.stderr
    );
    assert_gone(&pids, "after the lease was lost");
    assert!(alive(daemon), "the setsid daemon was let go");
}

/// `--max-run` stops every process of the job's session.
#[test]
fn max_run_stops_the_whole_session() {
    let locks = scratch();
    let dir = scratch();
    let run = lr()
        .url(&file_url(locks.path()))
        .args(["--max-run", "3s", "-k", "1s", "job"])
        .sh(&job_script(dir.path()))
        .spawn();
    let (pids, daemon) = job_pids(dir.path());
    let _daemon = Daemon(daemon);
    run.wait().expect_with(124, "--max-run ran out");
    assert_gone(&pids, "after --max-run");
    assert!(alive(daemon), "the setsid daemon was let go");
}

/// What the command leaves behind in other groups of its session is swept before the release;
/// the daemon is let go.
#[test]
fn the_sweep_reaches_what_moved_to_another_group() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    // The main process exits at once, leaving the shapes behind.
    let script = format!(
        "({}) > /dev/null 2>&1 & while [ ! -e {d}/ready ]; do sleep 0.01; done; exit 0",
        job_script(dir.path())
    );
    let out = lr()
        .url(&redis.url())
        .args(["--ttl", "2s", "-k", "1s", "job"])
        .sh(&script)
        .run()
        .expect_with(0, "the command's own status");
    let (pids, daemon) = job_pids(dir.path());
    let _daemon = Daemon(daemon);
    for pid in pids {
        assert!(
            !alive(pid),
            "process {pid} outlived the sweep: {}",
            out.stderr
        );
    }
    assert!(alive(daemon), "the setsid daemon was let go");
    assert!(
        !redis.exists("lock:{job}"),
        "released once the session was empty"
    );
}

// See: commit bce488f. `setsid -f` returns before its child calls setsid(): when the job's
// main process exited first, the sweep stopped the daemon on its way out, silently. Now the
// sweep lets the group settle first, and says what it stops.
#[test]
fn the_sweep_lets_a_daemon_on_its_way_out_go_and_names_what_it_stops() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    // The daemon leaves the job's group 20 ms after the job's main process has exited.
    let out = lr()
        .url(&redis.url())
        .name("job")
        .sh(&format!(
            "sh -c 'sleep 0.02; exec setsid sleep 30 >/dev/null 2>&1 </dev/null' & echo $! > {d}/daemon; exit 0"
        ))
        .run()
        .expect(0);
    let daemon: i32 = std::fs::read_to_string(dir.path().join("daemon"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let survived = alive(daemon);
    signal(daemon, libc::SIGKILL);
    assert!(survived, "the daemon was stopped: {}", out.stderr);
    assert_eq!(out.stderr, "", "nothing was stopped, so nothing is said");

    // What stays in the group is stopped, and named at the default log level.
    let out = lr()
        .url(&redis.url())
        .name("job")
        .sh(&format!(
            "sleep 30 >/dev/null 2>&1 & echo $! > {d}/left; exit 0"
        ))
        .run()
        .expect(0);
    let left = std::fs::read_to_string(dir.path().join("left")).unwrap();
    assert!(!alive(left.trim().parse().unwrap()));
    assert!(
        out.stderr
            .contains(&format!("left processes behind: {} (sleep)", left.trim())),
        "{}",
        out.stderr
    );
}

/// A `locked-run` the job runs itself puts its own job in a session of its own, which the outer
/// kills do not reach: when the outer wrapper is SIGKILLed, its watcher SIGKILLs the inner
/// wrapper but spares the inner watcher, which then kills the inner job; the next outer holder
/// finds none of it alive.
#[test]
fn a_nested_runs_job_dies_with_a_sigkilled_outer_wrapper() {
    nested_job_dies_with_a_sigkilled_outer_wrapper(BIN);
}

// See: the review of this round's mends. A nested run's watcher was spared only if it ran our
// very program file: a nested run of another build (a copy; a package upgraded during a long
// job) had its watcher killed with it, and its job escaped in 5 of 20 tries. A watcher is now
// known by blocking every signal it can. The escape is a race, so the test tries three times.
#[test]
fn a_nested_run_of_another_build_has_its_job_killed_too() {
    let copies = scratch();
    let copy = copies.path().join("locked-run-copy");
    std::fs::copy(BIN, &copy).unwrap();
    for _ in 0..3 {
        nested_job_dies_with_a_sigkilled_outer_wrapper(path_str(&copy));
    }
}

fn nested_job_dies_with_a_sigkilled_outer_wrapper(inner_bin: &str) {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let inner = format!(
        "{inner_bin} -u {url} --ttl 2s inner -- sh -c 'trap \"\" TERM; sleep 300 & echo $! > {d}/pid.tmp; mv {d}/pid.tmp {d}/pid; wait'",
        url = redis.url()
    );
    let outer = lr()
        .url(&redis.url())
        .args(["--ttl", "2s", "outer"])
        .sh(&inner)
        .spawn();
    let sleeper = pid_in(&dir.path().join("pid"));
    signal(outer.pid(), libc::SIGKILL);
    let out = dir.path().join("seen");
    lr().url(&redis.url())
        .args(["--ttl", "2s", "-w", "20s", "outer"])
        .sh(&check_alive(&[sleeper], &out))
        .run()
        .expect(0);
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "",
        "the inner job outlived both wrappers"
    );
    let _ = outer.wait();
}

/// The outer lease lost while the inner job ignores SIGTERM: the outer SIGKILL reaches the
/// inner wrapper, whose watcher kills the inner job, and the outer run ends only after that.
#[test]
fn a_nested_runs_job_is_gone_before_the_outer_run_ends_on_a_lost_lease() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let inner = format!(
        "trap '' TERM; {BIN} -u {url} --ttl 2s inner -- sh -c 'sleep 300 & echo $! > {d}/pid.tmp; mv {d}/pid.tmp {d}/pid; wait'",
        url = redis.url()
    );
    let outer = lr()
        .url(&redis.url())
        .args(["--ttl", "2s", "outer"])
        .sh(&inner)
        .spawn();
    let sleeper = pid_in(&dir.path().join("pid"));
    let _: () = redis.cmd(&["DEL", "lock:{outer}"]);
    outer.wait().expect(76);
    assert!(!alive(sleeper), "the inner job outlived the outer run");
}

/// The pid a command wrote to `file`, once it is there.
fn pid_in(file: &Path) -> i32 {
    wait_for_file(file, Duration::from_secs(10), |t| t.ends_with('\n'))
        .trim()
        .parse()
        .unwrap()
}
