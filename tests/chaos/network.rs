//! Chaos: the network misbehaves, through the fault proxy (blackholes, latency, resets).

#![allow(unused_imports)]

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use crate::*;

pub fn blackhole_long() -> Figure {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(&proxy.url(), dir.path(), &[], "exec sleep 60");
    let expiry = expiry_lower_bound(&redis);
    proxy.set(Mode::Blackhole);
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    expect_lost(running);
    figure
}

/// A child that runs until told to stop, then exits 5.
pub fn until_go(dir: &Path) -> String {
    format!(
        "while [ ! -e {d}/go ]; do sleep 0.01; done; exit 5",
        d = path_str(dir)
    )
}

pub fn finish_untouched(running: Running, dir: &Path) -> Figure {
    std::fs::write(dir.join("go"), "").unwrap();
    let out = running.wait();
    assert_eq!(out.code(), Some(5), "the child ran to its end: {out:?}");
    Figure::Untouched
}

pub fn blackhole_short() -> Figure {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(&proxy.url(), dir.path(), &[], &until_go(dir.path()));
    proxy.set(Mode::Blackhole);
    thread::sleep(Duration::from_millis(600)); // the outage: under T/3 = 666 ms
    proxy.set(Mode::Pass);
    // Long enough for a renewal to succeed again before the child is asked to finish.
    thread::sleep(Duration::from_millis(700));
    assert!(alive(child));
    finish_untouched(running, dir.path())
}

pub fn latency_under() -> Figure {
    // Attempts may take R/2 = 166 ms; 70 ms each way is a 140 ms round trip.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, _) = job(&proxy.url(), dir.path(), &[], &until_go(dir.path()));
    proxy.set(Mode::Latency(Duration::from_millis(70)));
    thread::sleep(Duration::from_secs(3)); // 1.5 T of slow renewals
    proxy.set(Mode::Pass);
    finish_untouched(running, dir.path())
}

pub fn latency_over() -> Figure {
    // 90 ms each way: every attempt times out at 166 ms, so the lease must be given up in time.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(&proxy.url(), dir.path(), &[], "exec sleep 60");
    let expiry = expiry_lower_bound(&redis);
    proxy.set(Mode::Latency(Duration::from_millis(90)));
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    // The cause named is the last failed attempt's: a timeout, or "no longer ours" when a
    // delayed renewal reached the server after the key had expired.
    expect_lost(running);
    figure
}

pub fn resets() -> Figure {
    // Every connection is reset shortly after it is made; renewals retry on fresh ones.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(&proxy.url(), dir.path(), &[], &until_go(dir.path()));
    for _ in 0..20 {
        thread::sleep(Duration::from_millis(150));
        proxy.set(Mode::Reset);
        proxy.set(Mode::Pass);
    }
    assert!(alive(child));
    finish_untouched(running, dir.path())
}
