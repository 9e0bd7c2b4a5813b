//! The chaos suite: `locked-run` under the faults production brings (a server killed, restarted
//! empty, frozen or slow behind a fault proxy, keys flushed or taken over, a child that ignores
//! SIGTERM, a wrapper SIGKILLed or paused, signal storms, wall-clock jumps) and under contention,
//! with real processes. Each scenario asserts its outcome and records a figure; the table of
//! worst figures is printed at the end (`cargo test --test chaos`).
//!
//! T = 2 s wherever a kill margin is measured (R = 333 ms, K = 666 ms, D = 22 ms), so D is not
//! lost in scheduler noise. A kill margin is how long before the earliest possible server-side
//! expiry of the key the child was dead; it must be positive.

// The integration suite's fixtures: the chaos suite uses most of them, not all.
#[allow(dead_code, unused_imports)]
#[path = "../support/mod.rs"]
mod support;

mod contention;
mod etcd;
mod holders;
mod local;
mod network;
mod postgres;
mod process;
mod safety;
mod server;
mod shared;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::*;

use contention::*;
use etcd::*;
use holders::*;
use local::*;
use network::*;
use postgres::*;
use process::*;
use safety::*;
use server::*;
use shared::*;

pub const TTL: &str = "2s";

/// One scenario's figure.
#[derive(Clone, Debug)]
pub enum Figure {
    /// Child dead this long before the key's earliest expiry (bigger is better).
    Margin(Duration),
    /// Child stopped this long after the event named (smaller is better).
    StoppedAfter(Duration, &'static str),
    /// The child was (rightly) left alone.
    Untouched,
    Note(String),
}

type Scenario = fn() -> Figure;

/// Each run's figure, or why it failed.
type Runs = Vec<Result<Figure, String>>;

fn main() {
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let scenarios: Vec<(&str, usize, Scenario)> = vec![
        ("redis killed mid-run", 3, redis_killed),
        ("redis restarted empty", 1, redis_restarted_empty),
        ("key flushed (FLUSHALL)", 1, key_flushed),
        ("key overwritten by another owner", 1, key_overwritten),
        ("blackhole past the kill point", 3, blackhole_long),
        ("blackhole shorter than T/3", 2, blackhole_short),
        ("latency just under the attempt timeout", 1, latency_under),
        ("latency just over the attempt timeout", 2, latency_over),
        ("connections reset every 150 ms", 1, resets),
        ("child ignores SIGTERM", 3, ignores_sigterm),
        ("SIGTERM storm during a lease-loss stop", 2, sigterm_storm),
        ("child forks grandchildren and exits", 1, grandchildren),
        ("locked-run SIGKILLed", 2, wrapper_sigkilled),
        ("locked-run SIGSTOPped past T, resumed", 2, wrapper_paused),
        ("wall clock jumps +1h then -1h", 1, wall_clock_jumps),
        ("contention 6 x 15, no faults", 1, contention_clean),
        ("contention with a fault each round", 1, contention_faults),
        (
            "file://: holder SIGKILLed, a waiter takes over",
            3,
            file_holder_killed,
        ),
        ("file://: contention 6 x 15", 1, file_contention),
        (
            "failover after a renewal the replica missed (--wait-replicas)",
            1,
            failover_after_an_unacknowledged_renewal,
        ),
        (
            "locked-run SIGKILLed, its job's grandchild running",
            1,
            wrapper_sigkilled_grandchild_redis,
        ),
        (
            "file://: locked-run SIGKILLed, its job's grandchild running",
            1,
            wrapper_sigkilled_grandchild_file,
        ),
        (
            "Redlock: 2 of 5 restart empty, then a 3rd freezes",
            1,
            redlock_renewal_retakes_restarted_servers,
        ),
        (
            "--holders 3: 6 x 20 runs on one NAME",
            1,
            holders_contention,
        ),
        (
            "file://: --holders 3: 6 x 20 runs on one NAME",
            1,
            holders_contention_file,
        ),
        (
            "--holders 2: redis killed mid-run",
            2,
            holders_server_killed,
        ),
        (
            "--holders 2: a holder's slot taken away",
            1,
            holders_slot_stolen,
        ),
        (
            "--holders 2: a holder SIGKILLed, a waiter takes its slot",
            1,
            holders_wrapper_sigkilled,
        ),
        (
            "--shared: redis killed while two hold",
            2,
            shared_server_killed,
        ),
        (
            "--shared: a holder's lease taken away",
            1,
            shared_lease_stolen,
        ),
        (
            "--shared: a holder SIGKILLed, a waiting writer goes",
            1,
            shared_holder_sigkilled,
        ),
        ("etcd://: blackhole past the kill point", 2, etcd_blackhole),
        (
            "etcd://: blackhole past the kill point, --shared",
            2,
            etcd_shared_blackhole,
        ),
        (
            "etcd://: the leader SIGKILLed during a hold",
            1,
            etcd_leader_killed,
        ),
        (
            "postgres://: blackhole past the kill point",
            2,
            postgres_blackhole,
        ),
        (
            "postgres://: the server's processes paused",
            2,
            postgres_paused,
        ),
    ];
    let scenarios: Vec<_> = scenarios
        .into_iter()
        .filter(|(name, _, _)| only.as_deref().is_none_or(|o| name.contains(o)))
        .collect();
    let started = Instant::now();
    let results: Mutex<BTreeMap<usize, (String, Runs)>> = Mutex::new(BTreeMap::new());
    // Scenarios mostly wait; four at a time keeps 2 cores far from saturated.
    let queue: Mutex<Vec<(usize, &str, usize, Scenario)>> = Mutex::new(
        scenarios
            .iter()
            .enumerate()
            .map(|(i, &(name, runs, f))| (i, name, runs, f))
            .rev()
            .collect(),
    );
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let Some((i, name, runs, f)) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let mut figures = Vec::new();
                    for _ in 0..runs {
                        let outcome = std::panic::catch_unwind(f).map_err(|e| {
                            e.downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "panicked".into())
                        });
                        let failed = outcome.is_err();
                        figures.push(outcome);
                        if failed {
                            break;
                        }
                    }
                    eprintln!("chaos: {name}: done");
                    results
                        .lock()
                        .unwrap()
                        .insert(i, (name.to_owned(), figures));
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    println!();
    println!("| scenario | runs | result | worst figure |");
    println!("|---|---|---|---|");
    let mut failures = 0;
    for (name, figures) in results.values() {
        let failed: Vec<&String> = figures.iter().filter_map(|f| f.as_ref().err()).collect();
        let ok: Vec<&Figure> = figures.iter().filter_map(|f| f.as_ref().ok()).collect();
        let result = if failed.is_empty() { "ok" } else { "FAILED" };
        failures += failed.len();
        println!("| {name} | {} | {result} | {} |", figures.len(), worst(&ok));
        for f in failed {
            eprintln!("chaos: {name}: {f}");
        }
    }
    println!(
        "\nchaos suite: {} scenarios in {:.0?}",
        results.len(),
        started.elapsed()
    );
    // The closing line test-result readers count, as for the other suites: scenarios.
    let failed = results
        .values()
        .filter(|(_, figures)| figures.iter().any(Result::is_err))
        .count();
    println!("{} passed, {failed} failed", results.len() - failed);
    if failures > 0 {
        eprintln!("chaos suite: {failures} failure(s)");
        std::process::exit(1);
    }
}

fn worst(figures: &[&Figure]) -> String {
    let margins: Vec<Duration> = figures
        .iter()
        .filter_map(|f| {
            if let Figure::Margin(m) = f {
                Some(*m)
            } else {
                None
            }
        })
        .collect();
    if let Some(m) = margins.iter().min() {
        return format!("child dead {} before the key's earliest expiry", ms(*m));
    }
    let late: Vec<(Duration, &str)> = figures
        .iter()
        .filter_map(|f| {
            if let Figure::StoppedAfter(d, what) = f {
                Some((*d, *what))
            } else {
                None
            }
        })
        .collect();
    if let Some((d, what)) = late.iter().max_by_key(|(d, _)| *d) {
        return format!("child stopped {} after {what}", ms(*d));
    }
    if let Some(Figure::Note(n)) = figures.iter().rev().find(|f| matches!(f, Figure::Note(_))) {
        return n.clone();
    }
    if figures.iter().any(|f| matches!(f, Figure::Untouched)) {
        return "child left alone, as it should be".into();
    }
    "-".into()
}

pub fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

pub fn margin(expiry: Instant, death: Instant) -> Figure {
    assert!(
        death < expiry,
        "the child died {:?} AFTER the key's expiry",
        death - expiry
    );
    Figure::Margin(expiry - death)
}

pub fn lease_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["--ttl", TTL, "--connect-timeout", "1s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

pub fn job(url: &str, dir: &Path, extra: &[&str], child: &str) -> (Running, i32) {
    let args = lease_args(extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_job(url, dir, &args, child)
}

pub fn expect_lost(running: Running) -> Output {
    let out = running.wait();
    assert_eq!(out.code(), Some(76), "{out:?}");
    // The child's own stderr comes first (a shell says "Terminated" of its killed sleep).
    assert!(
        out.stderr
            .lines()
            .any(|l| l.starts_with("locked-run: lost the lock job")),
        "{}",
        out.stderr
    );
    out
}
