//! `--metrics-dir` in a directory shared with others: nothing in it can hold a run up past its
//! command's end or change its status. A FIFO where the previous file was is not read (it
//! would block), the lock that serialises the counters' update is waited for a few seconds
//! at most, and a previous file of 2 MiB is not read whole; each run ends at once with its
//! command's status, and leaves a file of its own.

use std::time::Duration;

use super::backends::Backend;
use super::metrics::{runs, samples};
use crate::support::*;

/// Far more than a few seconds, far less than the hard timeout.
const PROMPTLY: Duration = Duration::from_secs(15);

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let metrics = scratch();
    let dir = path_str(metrics.path());
    let prom = metrics.path().join("locked_run_job.prom");
    let run = || {
        store
            .lr()
            .args(["--metrics-dir", dir])
            .job(["true"])
            .spawn()
            .wait_for(PROMPTLY)
            .expect(0)
    };

    let made = std::process::Command::new("mkfifo")
        .arg(&prom)
        .status()
        .unwrap();
    assert!(made.success());
    run();
    assert!(prom.is_file(), "a regular file in the FIFO's place");
    assert_eq!(runs(&samples(metrics.path()), "ran"), 1.0);

    std::fs::write(&prom, "#".repeat(2 << 20)).unwrap();
    run();
    assert_eq!(
        runs(&samples(metrics.path()), "ran"),
        1.0,
        "counted from nothing"
    );

    let held = holding_flock(&metrics.path().join(".locked_run_job.lock"));
    let out = run();
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    signal(held.pid(), libc::SIGKILL);
}
