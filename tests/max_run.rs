//! `--max-run DUR`: the command is stopped once it has run DUR (the kill signal, SIGKILL
//! `--kill-after` later), the lock is released once the job is gone, and the status is 124,
//! with one line; on Redis and on `file://`.

use std::time::Duration;

use crate::support::*;

fn stops_the_command(url: &str, held: impl Fn() -> bool) {
    let dir = scratch();
    // Obeys SIGTERM.
    let (running, child) = start_job(url, dir.path(), &["--max-run", "1s"], "exec sleep 60");
    assert!(held(), "held while it runs");
    assert!(wait_pid_exit(child, Duration::from_secs(5)), "stopped");
    let out = running.wait().expect(124);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("ran longer than --max-run 1s") && out.stderr.contains("SIGTERM"),
        "{}",
        out.stderr
    );
    assert!(
        out.elapsed >= Duration::from_secs(1),
        "not before DUR: {:?}",
        out.elapsed
    );
    assert!(!held(), "released");

    // Ignores SIGTERM: SIGKILL --kill-after later (escalation), and the lock is free after.
    let dir = scratch();
    let (running, child) = start_job(
        url,
        dir.path(),
        &["--max-run", "500ms", "--kill-after", "700ms"],
        "trap '' TERM; while :; do sleep 0.05; done",
    );
    // Counted from when the job was seen running, a little after --max-run's clock started:
    // 100 ms of the 1.2 s are left for that, and SIGKILL without the --kill-after wait would
    // come at about 0.5 s.
    let started = std::time::Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(5)), "killed");
    let killed = started.elapsed();
    assert!(
        killed >= Duration::from_millis(1_100),
        "SIGKILL came {killed:?} after the start: not before --max-run + --kill-after"
    );
    let out = running.wait().expect(124);
    assert!(out.stderr.contains("ended by SIGKILL"), "{}", out.stderr);
    assert!(!held(), "released after the kill");

    // A command that ends in time keeps its own status.
    lr().url(url)
        .args(["--max-run", "10s"])
        .job(sh("exit 3"))
        .run()
        .expect(3);
}

#[test]
fn max_run_stops_a_command_on_redis() {
    let redis = Redis::start();
    stops_the_command(&redis.url(), || redis.exists("lock:{job}"));
}

#[test]
fn max_run_stops_a_command_on_file() {
    let locks = scratch();
    let url = file_url(locks.path());
    let held = || lr().args(["status", "-u", &url, "job"]).run().code() == Some(0);
    stops_the_command(&url, held);
}

#[test]
fn a_lease_lost_first_is_still_76() {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = start_job(
        &redis.url(),
        dir.path(),
        &["--ttl", "2s", "--max-run", "30s"],
        "exec sleep 60",
    );
    let _: i64 = redis.cmd(&["DEL", "lock:{job}"]);
    assert!(wait_pid_exit(child, Duration::from_secs(5)));
    running.wait().expect(76);
    lr().args(["--max-run", "0s", "job", "true"])
        .run()
        .expect(2);
}
