//! `--metrics-dir`: node_exporter's textfile after every run: a held run moves the `last_*`
//! gauges (its status, its fence, a success's time), a skip (75), an unreachable store (69)
//! and a `--max-run` (124) are counted by outcome, a skip and a 69 leave the gauges alone, and
//! only the file and its lock stay in the directory; a run a SIGTERM ends is counted, whether
//! it held the lock (ended by the signal) or waited for it (143).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use super::backends::Backend;
use crate::support::*;

/// The samples of NAME `job`'s file: `metric{labels}` to value.
pub fn samples(dir: &Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(dir.join("locked_run_job.prom")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').unwrap();
            (key.to_owned(), value.parse().unwrap())
        })
        .collect()
}

pub fn runs(samples: &BTreeMap<String, f64>, outcome: &str) -> f64 {
    samples
        .get(&format!(
            "locked_run_runs_total{{name=\"job\",outcome=\"{outcome}\"}}"
        ))
        .copied()
        .unwrap_or_else(|| panic!("no {outcome} count: {samples:?}"))
}

fn gauge(samples: &BTreeMap<String, f64>, metric: &str) -> Option<f64> {
    samples.get(&format!("{metric}{{name=\"job\"}}")).copied()
}

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let metrics = scratch();
    let dir = path_str(metrics.path());
    let out = store
        .lr()
        .args(["--metrics-dir", dir])
        .name("job")
        .sh("echo $LOCKED_RUN_FENCE; exit 3")
        .run()
        .expect(3);
    let fence: f64 = out.stdout.trim().parse().unwrap();
    let after_run = samples(metrics.path());
    assert_eq!(runs(&after_run, "ran"), 1.0);
    assert_eq!(gauge(&after_run, "locked_run_last_exit_status"), Some(3.0));
    assert_eq!(gauge(&after_run, "locked_run_last_fence"), Some(fence));
    assert_eq!(
        gauge(&after_run, "locked_run_last_success_timestamp_seconds"),
        None,
        "no success yet"
    );
    let ran_at = gauge(&after_run, "locked_run_last_run_timestamp_seconds").unwrap();

    let holder = store.holder(&[]);
    store
        .lr()
        .args(["--metrics-dir", dir, "-n"])
        .job(["true"])
        .run()
        .expect(75);
    let after_skip = samples(metrics.path());
    assert_eq!(runs(&after_skip, "skipped"), 1.0);
    assert_eq!(
        gauge(&after_skip, "locked_run_last_run_timestamp_seconds"),
        Some(ran_at),
        "a skip leaves the last held run's gauges as they were"
    );
    assert_eq!(gauge(&after_skip, "locked_run_last_exit_status"), Some(3.0));
    assert!(gauge(&after_skip, "locked_run_last_attempt_timestamp_seconds").unwrap() >= ran_at);
    holder.finish().expect(0);

    lr().args(backend.unreachable())
        .args(["--metrics-dir", dir])
        .job(["true"])
        .run()
        .expect(69);
    let after_failure = samples(metrics.path());
    assert_eq!(runs(&after_failure, "unreachable"), 1.0);
    assert_eq!(
        gauge(&after_failure, "locked_run_last_exit_status"),
        Some(3.0),
        "an unreachable store leaves the last held run's gauges as they were"
    );

    store
        .lr()
        .env("LOCKED_RUN_METRICS_DIR", dir)
        .args(["--max-run", "300ms", "-k", "300ms"])
        .job(["sleep", "5"])
        .run()
        .expect(124);
    assert_eq!(
        runs(&samples(metrics.path()), "max_run"),
        1.0,
        "the environment names it too"
    );
    store
        .lr()
        .args(["--metrics-dir", dir])
        .job(["true"])
        .run()
        .expect(0);
    let last = samples(metrics.path());
    assert_eq!(runs(&last, "ran"), 2.0, "{last:?}");
    assert_eq!(gauge(&last, "locked_run_last_exit_status"), Some(0.0));
    assert!(gauge(&last, "locked_run_last_success_timestamp_seconds").is_some());
    let mut names: Vec<String> = std::fs::read_dir(metrics.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".locked_run_job.lock", "locked_run_job.prom"]);

    // A SIGTERM ends a run that counts, however it comes: to a run that holds the lock it is
    // forwarded, and the run ends by it once its command has (counted as ran, its status the
    // signal's); to one that waits, it ends the wait with 143 (counted as failed). Only a
    // process that SIGTERM kills before it could handle any signal (as it starts) counts
    // nothing, and it never logged that it acquired the lock: the fault harness tells the two
    // apart so.
    let holder = Holder::with(store.lr().args(["--metrics-dir", dir]), "job");
    let waiter = store
        .lr()
        .args(["--metrics-dir", dir])
        .job(["true"])
        .spawn();
    store.wait_for_waiters(1);
    signal(waiter.pid(), libc::SIGTERM);
    waiter
        .wait_for(Duration::from_secs(10))
        .expect(128 + libc::SIGTERM);
    assert_eq!(runs(&samples(metrics.path()), "failed"), 1.0);
    signal(holder.pid(), libc::SIGTERM);
    let killed = holder.running.wait_for(Duration::from_secs(10));
    assert_eq!(killed.status.signal(), Some(libc::SIGTERM), "{killed:?}");
    let last = samples(metrics.path());
    assert_eq!(runs(&last, "ran"), 3.0, "{last:?}");
    assert_eq!(
        gauge(&last, "locked_run_last_exit_status"),
        Some(f64::from(128 + libc::SIGTERM))
    );
}
