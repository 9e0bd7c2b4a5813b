//! Chaos: the host-local backend (file://).

#![allow(unused_imports)]

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use crate::*;

pub fn file_holder_killed() -> Figure {
    let locks = scratch();
    let dir = scratch();
    let url = format!("file://{}", locks.path().display());
    let (holder, child) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let first = status_json(&url, "job")["fence"].as_u64().unwrap();
    let started = dir.path().join("waiter");
    let mut waiter = locked_run();
    waiter.args(["-u", &url, "job"]).args(sh(&format!(
        "echo $LOCKED_RUN_FENCE > {}",
        path_str(&started)
    )));
    let waiter = spawn(waiter);
    // Blocked in flock: `status` counts it (from /proc/locks).
    wait_until("the waiter is blocked", Duration::from_secs(10), || {
        let mut status = locked_run();
        status.args(["status", "--json", "-u", &url, "job"]);
        run(status).stdout.contains("\"waiters\":1")
    });
    let killed = Instant::now();
    signal(holder.pid(), libc::SIGKILL);
    wait_for_file(&started, Duration::from_secs(5), |t| t.ends_with('\n'));
    let took_over = killed.elapsed();
    assert!(wait_pid_exit(child, Duration::from_secs(5)), "PDEATHSIG");
    let stopped = killed.elapsed();
    assert_eq!(
        std::fs::read_to_string(&started).unwrap(),
        format!("{}\n", first + 1)
    );
    assert_eq!(waiter.wait().code(), Some(0));
    let _ = holder.wait();
    Figure::Note(format!(
        "waiter ran {} after the holder's SIGKILL (its command gone after {}), with the next fence",
        ms(took_over),
        ms(stopped)
    ))
}

pub fn file_contention() -> Figure {
    let locks = scratch();
    let dir = scratch();
    let log = dir.path().join("log");
    let url = format!("file://{}", locks.path().display());
    let started = Instant::now();
    let codes = workers(&url, &log, 15, &[]);
    assert!(codes.iter().all(|&c| c == 0), "{codes:?}");
    assert_eq!(check_log(&log), 90);
    // The fence file holds the top of the block the fences came from (a crash must never hand
    // one out twice), not the last one issued: the fences the runs were given are in the log.
    let text = std::fs::read_to_string(&log).unwrap();
    let mut fences: Vec<u64> = text
        .lines()
        .filter(|l| l.starts_with("start "))
        .map(|l| l.split(' ').nth(1).unwrap().parse().unwrap())
        .collect();
    fences.sort_unstable();
    // A new directory's first fence is the clock in microseconds; then one a run.
    assert_eq!(fences, (fences[0]..fences[0] + 90).collect::<Vec<u64>>());
    Figure::Note(format!(
        "90 runs, no overlap, 90 fences in a row, {}",
        ms(started.elapsed())
    ))
}
