//! `locked-run release NAME`: without `--force` it only shows the holder; `--force` frees a
//! stuck lock, wakes its waiters and stops the old holder at its next renewal.

use std::time::{Duration, Instant};

use crate::support::*;

fn hostname() -> String {
    nix::unistd::gethostname().unwrap().into_string().unwrap()
}

#[test]
fn release_without_force_only_shows_the_holder() {
    let redis = Redis::start();
    let out = lr()
        .args(["release", "-u", &redis.url(), "job"])
        .run()
        .expect_with(1, "free");
    assert_eq!(
        out.stdout,
        "lock job was free (no fence issued yet); nothing to release\n"
    );

    let dir = scratch();
    let (running, _) = start_job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let out = lr()
        .args(["release", "-u", &redis.url(), "job"])
        .run()
        .expect(2);
    assert!(
        out.stderr
            .contains(&format!("is held by {} pid {}", hostname(), running.pid())),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("add --force"), "{}", out.stderr);
    assert!(redis.exists("lock:{job}"), "still held");
    signal(running.pid(), libc::SIGTERM);
    let _ = running.wait();
}

#[test]
fn a_forced_release_wakes_the_waiter_and_stops_the_old_holder() {
    let redis = Redis::start();
    let dir = scratch();
    // T = 2 s: the holder renews every 333 ms and learns of the release at its next renewal.
    let (holder, holder_child) =
        start_job(&redis.url(), dir.path(), &["--ttl", "2s"], "exec sleep 60");
    let started = file(&dir, "waiter-started");
    let waiter = lr()
        .url(&redis.url())
        .name("job")
        .sh(&format!(
            "echo $LOCKED_RUN_FENCE > {}; sleep 1",
            path_str(&started)
        ))
        .spawn();
    wait_until("the waiter subscribed", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 1
    });

    let out = lr()
        .args(["release", "--force", "-u", &redis.url(), "job"])
        .run();
    let released = Instant::now();
    let out = out.expect(0);
    assert!(
        out.stdout.starts_with(&format!(
            "released lock job, held by {} pid {} (sh) since ",
            hostname(),
            holder.pid()
        )),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.ends_with("fence 1; last fence 1\n"),
        "{}",
        out.stdout
    );

    wait_for_file(&started, Duration::from_secs(5), |t| t.ends_with('\n'));
    let woke = released.elapsed();
    assert!(
        woke < Duration::from_millis(500),
        "the waiter started {woke:?} after the release"
    );
    assert_eq!(
        std::fs::read_to_string(&started).unwrap(),
        "2\n",
        "the fence counter was kept"
    );

    assert!(
        wait_pid_exit(holder_child, Duration::from_secs(5)),
        "the old holder stopped its command"
    );
    let out = holder.wait().expect(76);
    assert!(out.stderr.contains("no longer ours"), "{}", out.stderr);
    waiter.wait().expect(0);
}
