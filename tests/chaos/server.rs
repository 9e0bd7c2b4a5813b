//! Chaos: the server goes away (killed, restarted empty, flushed, its key overwritten).

#![allow(unused_imports)]

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use crate::*;

pub fn redis_killed() -> Figure {
    let mut redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let expiry = expiry_lower_bound(&redis);
    redis.kill();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    expect_lost(running);
    figure
}

pub fn redis_restarted_empty() -> Figure {
    let mut redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    redis.restart_empty();
    let lost = Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let after = lost.elapsed();
    let out = expect_lost(running);
    assert!(out.stderr.contains("no longer ours"), "{}", out.stderr);
    // Found at the next renewal: within R (333 ms) plus an attempt's retries.
    assert!(after < Duration::from_millis(1_000), "{after:?}");
    Figure::StoppedAfter(after, "the restart")
}

pub fn key_flushed() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let _: String = redis.cmd(&["FLUSHALL"]);
    let lost = Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let after = lost.elapsed();
    expect_lost(running);
    assert!(after < Duration::from_millis(600), "{after:?}");
    Figure::StoppedAfter(after, "the flush")
}

pub fn key_overwritten() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let _: String = redis.cmd(&["SET", "lock:{job}", "another-owner", "PX", "60000"]);
    let lost = Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let after = lost.elapsed();
    expect_lost(running);
    assert_eq!(
        redis.get("lock:{job}").as_deref(),
        Some("another-owner"),
        "the new owner's lock is untouched"
    );
    assert!(after < Duration::from_millis(600), "{after:?}");
    Figure::StoppedAfter(after, "the overwrite")
}
