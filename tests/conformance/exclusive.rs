//! Exclusivity under contention: runs started at once never overlap, and their fences grow
//! strictly in the order their commands started (each command logs its start and end with its
//! fence; the log is the evidence).

use super::backends::Backend;
use crate::support::*;

/// How many runs contend.
const RUNS: usize = 8;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let dir = scratch();
    let log = dir.path().join("log");
    let runs: Vec<Running> = (0..RUNS)
        .map(|_| {
            store
                .lr()
                .job(["perl", "-e", CRITICAL_SECTION, path_str(&log)])
                .spawn()
        })
        .collect();
    for run in runs {
        run.wait().expect(0);
    }
    assert_eq!(check_log(&log), RUNS, "every run ran once");
}
