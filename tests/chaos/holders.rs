//! Chaos: `--holders N`, a semaphore whose every slot is a lease of its own: contention that
//! must never exceed N, a slot's lease stolen or its server killed (the holder stopped before
//! that slot's lease can expire), and a holder SIGKILLed with its wrapper (its slot freed
//! within T).

use std::time::{Duration, Instant};

use crate::contention::workers;
use crate::support::*;
use crate::*;

fn contended(url: &str) -> Figure {
    let dir = scratch();
    let log = dir.path().join("log");
    let started = Instant::now();
    let codes = workers(url, &log, 20, &["--holders", "3"]);
    assert!(codes.iter().all(|&c| c == 0), "{codes:?}");
    let (sections, most) = check_concurrency(&log, 3);
    assert_eq!(sections, 120);
    // A semaphore that admitted one at a time would pass the limit; it must admit several.
    assert!(
        most >= 2,
        "never more than one at once: --holders 3 not honoured"
    );
    Figure::Note(format!(
        "120 runs, at most {most} at once, fences unique, {}",
        ms(started.elapsed())
    ))
}

pub fn holders_contention() -> Figure {
    let redis = Redis::start();
    contended(&redis.url())
}

pub fn holders_contention_file() -> Figure {
    let locks = scratch();
    contended(&format!("file://{}", locks.path().display()))
}

/// The lease of the slot (or share, `--shared`) held by `token`, as the server counts it: its
/// score less TIME.
pub fn slot_expiry(redis: &Redis, token: &str) -> Instant {
    let before = Instant::now();
    let score: String = redis.cmd(&["ZSCORE", "holders:{job}", token]);
    let time: Vec<String> = redis.cmd(&["TIME"]);
    let now_ms = time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
    let left = score.parse::<f64>().unwrap() as u64 - now_ms;
    before + Duration::from_millis(left)
}

/// A holder of one of two slots, with the token it holds.
fn slot_holder(url: &str, dir: &std::path::Path) -> (Running, i32, String) {
    let (running, child) = job(
        url,
        dir,
        &["--holders", "2"],
        &format!(
            "echo $LOCKED_RUN_TOKEN > {d}/token.tmp; mv {d}/token.tmp {d}/token; exec sleep 60",
            d = path_str(dir)
        ),
    );
    let token = wait_for_file(&dir.join("token"), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    });
    (running, child, token.trim().to_owned())
}

pub fn holders_server_killed() -> Figure {
    let mut redis = Redis::start();
    let dir = scratch();
    let (running, child, token) = slot_holder(&redis.url(), dir.path());
    let expiry = slot_expiry(&redis, &token);
    redis.kill();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    expect_lost(running);
    figure
}

pub fn holders_slot_stolen() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child, token) = slot_holder(&redis.url(), dir.path());
    let _: i64 = redis.cmd(&["ZREM", "holders:{job}", &token]);
    let lost = Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let after = lost.elapsed();
    let out = expect_lost(running);
    assert!(out.stderr.contains("no longer ours"), "{}", out.stderr);
    assert!(after < Duration::from_millis(1_000), "{after:?}");
    Figure::StoppedAfter(after, "its slot was taken away")
}

pub fn holders_wrapper_sigkilled() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (one, _, _) = slot_holder(&redis.url(), dir.path());
    let other = scratch();
    let (two, _, _) = slot_holder(&redis.url(), other.path());
    let started = other.path().join("third");
    let mut third = locked_run();
    third
        .args(lease_args(&[
            "-u",
            &redis.url(),
            "--holders",
            "2",
            "-w",
            "10s",
        ]))
        .arg("job")
        .args(sh(&format!("echo up > {}", path_str(&started))));
    let third = spawn(third);
    wait_until("the third waits", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 1
    });
    let killed = Instant::now();
    signal(one.pid(), libc::SIGKILL);
    wait_for_file(&started, Duration::from_secs(10), |t| !t.is_empty());
    let freed = killed.elapsed();
    assert!(
        freed <= Duration::from_millis(2_300),
        "slot freed after {freed:?}, T is 2 s"
    );
    assert_eq!(third.wait().code(), Some(0));
    signal(two.pid(), libc::SIGTERM);
    let _ = (one.wait(), two.wait());
    Figure::Note(format!(
        "the slot was taken by the waiter {} after the SIGKILL (T = 2 s)",
        ms(freed)
    ))
}
