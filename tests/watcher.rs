//! The watcher of a run that has to wait: started while the run waits (off the path from the
//! release to the start), told the start's kill point at the grant, replaced if it was killed
//! meanwhile or while the command runs, never a reason for the run to hang, and holding none
//! of the wrapper's descriptors (a lease's watcher needs none). Real Redis, real processes and signals; the lock
//! is held first by another program (a key with no expiry), so the run waits until the test
//! deletes it.

use std::path::Path;
use std::time::Duration;

use crate::support::*;

const TTL: &str = "2s";

fn held_by_another_program() -> Redis {
    let redis = Redis::start();
    let _: () = redis.cmd(&["SET", "lock:{job}", "another-program"]);
    redis
}

/// A command that starts `sleep 300` in the background, writes its pid to `file` and waits.
fn background_sleep(file: &Path) -> String {
    format!(
        "sleep 300 & echo $! > {0}.tmp; mv {0}.tmp {0}; wait",
        path_str(file)
    )
}

/// The pid a command wrote to `file`, once it is there.
fn pid_in(file: &Path) -> i32 {
    wait_for_file(file, Duration::from_secs(10), |t| t.ends_with('\n'))
        .trim()
        .parse()
        .unwrap()
}

/// The descriptors open in process `pid`.
fn descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The watcher, started while the run waits, is named the kill point only at the grant: the
/// guard of the start holds all the same. Once the run takes the lock, its program's exec
/// blocks past the kill point with the wrapper stopped: killed short of its exec, 76.
#[test]
fn a_watcher_started_while_waiting_still_guards_the_start() {
    let redis = held_by_another_program();
    let dir = scratch();
    let program = file(&dir, "program");
    let marker = file(&dir, "ran");
    let mut holder = leased_program(&program, 6);
    let run = lr()
        .args(["-u", &redis.url(), "--ttl", TTL, "job", "--"])
        .args([path_str(&program), path_str(&marker)])
        .spawn();
    let watcher = watcher_child(run.pid());
    assert_eq!(
        redis.get("lock:{job}").as_deref(),
        Some("another-program"),
        "the watcher came only with the grant"
    );
    let _: () = redis.cmd(&["DEL", "lock:{job}"]);
    stop_across_the_start(run.pid(), &mut holder);
    run.wait()
        .expect_opening(76, "lost the lock job before the command could start");
    assert!(!marker.exists(), "the command started past the kill point");
    wait_until_gone(watcher, "the watcher ends with its run");
}

/// Whether process `pid` blocks signal `sig` (`SigBlk` of `/proc/PID/status`).
fn blocks(pid: i32, sig: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

/// A waiting run SIGKILLed leaves no watcher behind: the watcher sees its pipe end and exits.
/// Meanwhile it held its pipe and nothing else of the wrapper's (no copy of the connection),
/// and blocked every signal, glibc's own two (32 and 33) too.
#[test]
fn a_watcher_started_while_waiting_ends_with_a_killed_wrapper_and_holds_nothing() {
    let redis = held_by_another_program();
    let run = lr().args(["-u", &redis.url(), "job", "--", "true"]).spawn();
    let watcher = watcher_child(run.pid());
    wait_until(
        "the watcher keeps its pipe alone",
        Duration::from_secs(10),
        || descriptors(watcher) == 1,
    );
    wait_until(
        "the watcher blocks every signal",
        Duration::from_secs(10),
        || [1, 15, 32, 33, 64].iter().all(|&sig| blocks(watcher, sig)),
    );
    signal(run.pid(), libc::SIGKILL);
    let _ = run.wait();
    wait_until_gone(watcher, "the watcher of a killed waiter exits");
}

/// A watcher killed while its run waits is replaced at the grant: the job is never started
/// unwatched. The run is then SIGKILLed while its command's background child runs: the new
/// watcher kills it.
#[test]
fn a_watcher_killed_while_the_run_waits_is_replaced_at_the_grant() {
    let redis = held_by_another_program();
    let dir = scratch();
    let grandchild = file(&dir, "grandchild");
    let run = lr()
        .args(["-u", &redis.url(), "job", "--", "sh", "-c"])
        .arg(background_sleep(&grandchild))
        .spawn();
    let first = watcher_child(run.pid());
    signal(first, libc::SIGKILL);
    wait_until_gone(first, "the first watcher is dead");
    let _: () = redis.cmd(&["DEL", "lock:{job}"]);
    let pid = pid_in(&grandchild);
    let second = watcher_child(run.pid());
    assert_ne!(second, first, "no new watcher");
    signal(run.pid(), libc::SIGKILL);
    let _ = run.wait();
    wait_until_gone(
        pid,
        "the job's background child is killed by the new watcher",
    );
}

/// A stopped watcher does not hold its run: a run that gives up waiting reaps it at once, 75.
#[test]
fn a_stopped_watcher_does_not_hold_a_run_that_gives_up() {
    let redis = held_by_another_program();
    let run = lr()
        .args(["-u", &redis.url(), "-w", "1s", "job", "--", "true"])
        .spawn();
    let watcher = watcher_child(run.pid());
    signal(watcher, libc::SIGSTOP);
    run.wait_for(Duration::from_secs(10))
        .expect_opening(75, "gave up waiting for lock job after 1s");
    wait_until_gone(watcher, "the stopped watcher is reaped");
}

/// A watcher killed while the command runs is replaced at once: the wrapper SIGKILLed after
/// that still leaves nothing of its job running (the command's background child is killed by
/// the new watcher).
#[test]
fn a_watcher_killed_while_the_command_runs_is_replaced() {
    let redis = Redis::start();
    let dir = scratch();
    let grandchild = file(&dir, "grandchild");
    let run = lr()
        .args(["-u", &redis.url(), "job", "--", "sh", "-c"])
        .arg(background_sleep(&grandchild))
        .spawn();
    let pid = pid_in(&grandchild);
    let first = watcher_child(run.pid());
    signal(first, libc::SIGKILL);
    let mut second = 0;
    wait_until("another watcher", Duration::from_secs(10), || {
        second = children_by_exit_signal(run.pid(), "0")
            .into_iter()
            .find(|&pid| pid != first)
            .unwrap_or(0);
        second != 0
    });
    wait_until("the new watcher is set up", Duration::from_secs(10), || {
        descriptors(second) == 1
    });
    signal(run.pid(), libc::SIGKILL);
    let _ = run.wait();
    wait_until_gone(
        pid,
        "the job's background child is killed by the new watcher",
    );
}

/// The same once the command has exited and what it left behind is being swept: a process
/// that ignores SIGTERM keeps the sweep waiting (K = 20 s) when the watcher is SIGKILLed; another
/// is started, and kills the leftover when the wrapper is SIGKILLed in turn.
#[test]
fn a_watcher_killed_while_the_sweep_waits_is_replaced() {
    let redis = Redis::start();
    let dir = scratch();
    let left = file(&dir, "left");
    // Single quotes: `$$` is the leftover's own pid, not its parent's.
    let inner = format!(
        "trap \"\" TERM; echo $$ > {0}.tmp; mv {0}.tmp {0}; exec sleep 300",
        path_str(&left)
    );
    let run = lr()
        .args(["-u", &redis.url(), "-k", "20s", "job", "--", "sh", "-c"])
        .arg(format!(
            "sh -c '{inner}' & while [ ! -e {} ]; do sleep 0.01; done",
            path_str(&left)
        ))
        .spawn();
    let leftover = pid_in(&left);
    // The command gone, its leftover is the wrapper's child (it is their subreaper).
    wait_until("the command exits", Duration::from_secs(10), || {
        children_by_exit_signal(run.pid(), "17") == [leftover]
    });
    let first = watcher_child(run.pid());
    signal(first, libc::SIGKILL);
    wait_until("another watcher", Duration::from_secs(10), || {
        children_by_exit_signal(run.pid(), "0")
            .iter()
            .any(|&pid| pid != first)
    });
    signal(run.pid(), libc::SIGKILL);
    let _ = run.wait();
    wait_until_gone(leftover, "the leftover is killed by the new watcher");
}
