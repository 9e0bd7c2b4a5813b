//! Chaos: contention on one NAME, with and without faults.

#![allow(unused_imports)]

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use crate::*;

/// Six workers, each running `runs` locked jobs in a row on one NAME; returns their statuses.
pub fn workers(url: &str, log: &Path, runs: usize, extra: &[&str]) -> Vec<i32> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    (0..runs)
                        .map(|_| {
                            let mut cmd = locked_run();
                            cmd.args(["-u", url, "--ttl", "1s", "--connect-timeout", "1s"])
                                .args(extra)
                                .args([
                                    "shared",
                                    "--",
                                    "perl",
                                    "-e",
                                    CRITICAL_SECTION,
                                    path_str(log),
                                ]);
                            run(cmd).code().unwrap_or(-1)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

pub fn contention_clean() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let started = Instant::now();
    let codes = workers(&redis.url(), &log, 15, &[]);
    assert!(codes.iter().all(|&c| c == 0), "{codes:?}");
    let sections = check_log(&log);
    assert_eq!(sections, 90);
    Figure::Note(format!(
        "90 runs, no overlap, fences strictly increasing, {}",
        ms(started.elapsed())
    ))
}

pub fn contention_faults() -> Figure {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let log = dir.path().join("log");
    let started = Instant::now();
    let mut statuses: BTreeMap<i32, usize> = BTreeMap::new();
    let mut faults = Vec::new();
    for round in 0..5 {
        let fault = match fastrand::u8(0..4) {
            0 => Mode::Blackhole,
            1 => Mode::Latency(Duration::from_millis(40)),
            2 => Mode::Reset,
            _ => Mode::Latency(Duration::from_millis(120)),
        };
        faults.push(format!("{fault:?}"));
        let codes = thread::scope(|s| {
            let work = s.spawn(|| workers(&proxy.url(), &log, 3, &["-w", "20s"]));
            // The fault lands in the middle of the round and lasts 400 ms.
            thread::sleep(Duration::from_millis(150 + 50 * round));
            proxy.set(fault);
            thread::sleep(Duration::from_millis(400));
            proxy.set(Mode::Pass);
            work.join().unwrap()
        });
        for c in codes {
            // 0: ran; 76: stopped on a lost lease; 69/75: could not take it during the fault.
            assert!([0, 69, 75, 76, 143].contains(&c), "unexpected status {c}");
            *statuses.entry(c).or_default() += 1;
        }
    }
    let sections = check_log(&log);
    Figure::Note(format!(
        "{sections} sections, no overlap, fences increasing; faults {}; statuses {statuses:?}; {}",
        faults.join(", "),
        ms(started.elapsed())
    ))
}
