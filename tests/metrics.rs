//! `--metrics-dir`: node_exporter's textfile, written at the end of every run: the last held
//! run's gauges, a skip and an unreachable store counted without touching them, counters that
//! concurrent runs never lose, no temporary file left, and a file `promtool` accepts.

use std::collections::BTreeMap;
use std::path::Path;

use crate::support::*;

/// The samples of NAME `job`'s file: `metric{labels}` to value.
fn samples(dir: &Path) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(dir.join("locked_run_job.prom")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').unwrap();
            (key.to_owned(), value.parse().unwrap())
        })
        .collect()
}

fn runs(samples: &BTreeMap<String, f64>, outcome: &str) -> f64 {
    samples[&format!("locked_run_runs_total{{name=\"job\",outcome=\"{outcome}\"}}")]
}

fn gauge(samples: &BTreeMap<String, f64>, metric: &str) -> Option<f64> {
    samples.get(&format!("{metric}{{name=\"job\"}}")).copied()
}

/// Only the file itself (and its lock) stay in the directory.
fn only_the_file(dir: &Path) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".locked_run_job.lock", "locked_run_job.prom"]);
}

#[test]
fn a_run_a_skip_and_a_failure_each_count_and_only_a_held_run_moves_the_gauges() {
    let redis = Redis::start();
    let metrics = scratch();
    let dir = path_str(metrics.path());
    lr().url(&redis.url())
        .args(["--metrics-dir", dir])
        .name("job")
        .sh("exit 3")
        .run()
        .expect(3);
    let after_run = samples(metrics.path());
    assert_eq!(runs(&after_run, "ran"), 1.0);
    assert_eq!(gauge(&after_run, "locked_run_last_exit_status"), Some(3.0));
    assert_eq!(gauge(&after_run, "locked_run_last_fence"), Some(1.0));
    assert_eq!(
        gauge(&after_run, "locked_run_last_success_timestamp_seconds"),
        None,
        "no success yet"
    );
    let ran_at = gauge(&after_run, "locked_run_last_run_timestamp_seconds").unwrap();

    let holder = Holder::start(&redis, "job", &[]);
    lr().url(&redis.url())
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
    assert!(
        gauge(&after_skip, "locked_run_last_attempt_timestamp_seconds").unwrap() >= ran_at,
        "but it was an attempt"
    );
    holder.finish();

    lr().args(["-u", "redis://127.0.0.1:1", "--metrics-dir", dir])
        .job(["true"])
        .run()
        .expect(69);
    let after_failure = samples(metrics.path());
    assert_eq!(runs(&after_failure, "unreachable"), 1.0);
    assert_eq!(
        gauge(&after_failure, "locked_run_last_exit_status"),
        Some(3.0)
    );

    lr().url(&redis.url())
        .env("LOCKED_RUN_METRICS_DIR", dir)
        .job(["true"])
        .run()
        .expect(0);
    let after_success = samples(metrics.path());
    assert_eq!(
        runs(&after_success, "ran"),
        2.0,
        "the environment names it too"
    );
    assert_eq!(
        gauge(&after_success, "locked_run_last_exit_status"),
        Some(0.0)
    );
    assert!(gauge(&after_success, "locked_run_last_success_timestamp_seconds").is_some());
    only_the_file(metrics.path());
}

/// Twenty runs that end at once, each adding one to the counters: none is lost.
#[test]
fn concurrent_runs_never_lose_a_count() {
    let locks = scratch();
    let metrics = scratch();
    let url = file_url(locks.path());
    let runs_: Vec<Running> = (0..20)
        .map(|_| {
            lr().url(&url)
                .args(["--metrics-dir", path_str(metrics.path()), "--holders", "20"])
                .job(["true"])
                .spawn()
        })
        .collect();
    for run in runs_ {
        run.wait().expect(0);
    }
    assert_eq!(runs(&samples(metrics.path()), "ran"), 20.0);
    only_the_file(metrics.path());
}

/// The file is what Prometheus's own checker accepts (when `promtool` is installed: Debian's
/// `prometheus` package), with a NAME whose quote and backslash need escaping.
#[test]
fn promtool_accepts_the_file() {
    let promtool = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if skip_unless(promtool, "promtool is not installed") {
        return;
    }
    let locks = scratch();
    let metrics = scratch();
    lr().url(&file_url(locks.path()))
        .args(["--metrics-dir", path_str(metrics.path())])
        .args(["say\"hi\\there", "--", "true"])
        .run()
        .expect(0);
    let file = std::fs::read_dir(metrics.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "prom"))
        .unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("name=\"say\\\"hi\\\\there\""), "{text}");
    let mut check = std::process::Command::new("promtool");
    check
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap());
    let out = check.output().unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
