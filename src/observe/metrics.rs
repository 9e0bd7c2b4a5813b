//! `--metrics-dir DIR`: at the end of every run (skips and failures too), `DIR/locked_run_STEM.prom`
//! in the Prometheus text format, for node_exporter's textfile collector. Written atomically (a
//! temporary file whose name does not end in `.prom`, then a rename); the counters are this
//! host's, carried from one run's file to the next under a lock of their own (read, add,
//! write), so concurrent runs never lose a count. The `last_*` gauges describe this host's last
//! run that held the lock: a skip or an unreachable store changes only the counters and
//! `locked_run_last_attempt_timestamp_seconds`, so a host that skipped never looks failed.
//! A write that fails is one warning and changes no status.
//!
//! The directory may be shared with other users and programs (node_exporter's collector
//! directory), so nothing in it can hold a run up past its command's end: the previous file is
//! read only if it is a regular file (never through a link, never blocking on a FIFO, at most
//! [`MAX_FILE`] bytes), and the lock of the read-add-write is waited for at most [`LOCK_WAIT`]
//! (another user may hold it for ever: a flock needs only a descriptor open for reading), after
//! which the counters are written from what could be read, with one warning.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::backend::{Run, wall_clock_ms};
use crate::name::LockName;

/// How a run ended, as `locked_run_runs_total{outcome=...}` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// It took the lock and ran the command (whatever its status).
    Ran,
    /// 75: the lock was held, and the run did not wait (or its wait ran out).
    Skipped,
    /// 76: the lease was lost and the command stopped.
    Lost,
    /// 69: the store could not be reached or refused.
    Unreachable,
    /// 124: `--max-run` ran out.
    MaxRun,
    /// Anything else: a usage error, a command not found, a signal while waiting.
    Failed,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Ran => "ran",
            Outcome::Skipped => "skipped",
            Outcome::Lost => "lost",
            Outcome::Unreachable => "unreachable",
            Outcome::MaxRun => "max_run",
            Outcome::Failed => "failed",
        }
    }

    const ALL: [Outcome; 6] = [
        Outcome::Ran,
        Outcome::Skipped,
        Outcome::Lost,
        Outcome::Unreachable,
        Outcome::MaxRun,
        Outcome::Failed,
    ];
}

/// The gauges of the last run that held the lock.
const GAUGES: [(&str, &str); 6] = [
    (
        "locked_run_last_run_timestamp_seconds",
        "When this host's last run that held the lock let go of it (Unix time).",
    ),
    (
        "locked_run_last_success_timestamp_seconds",
        "When this host's last run that held the lock and whose command ended 0 let go (Unix time).",
    ),
    (
        "locked_run_last_duration_seconds",
        "How long this host's last run held the lock.",
    ),
    (
        "locked_run_last_wait_seconds",
        "How long this host's last run waited for the lock.",
    ),
    (
        "locked_run_last_exit_status",
        "The exit status of this host's last run that held the lock.",
    ),
    (
        "locked_run_last_fence",
        "The fence token of this host's last run that held the lock.",
    ),
];

/// How long a run waits for the lock of the read-add-write before it writes without it.
const LOCK_WAIT: Duration = Duration::from_secs(3);

/// The most of the previous file that is read: far more than the few dozen lines this module
/// writes.
const MAX_FILE: u64 = 1 << 20;

const ATTEMPT: &str = "locked_run_last_attempt_timestamp_seconds";
const RUNS: &str = "locked_run_runs_total";

/// Adds this run to NAME's file in `dir`: `outcome`, and `run` when it held the lock.
pub fn write(dir: &Path, name: &LockName, outcome: Outcome, run: Option<&Run>) {
    if let Err(e) = update(dir, name, outcome, run) {
        tracing::warn!(
            "cannot write the metrics of lock {name} in {} ({e}); the run's status stands",
            dir.display()
        );
    }
}

fn update(dir: &Path, name: &LockName, outcome: Outcome, run: Option<&Run>) -> io::Result<()> {
    let stem = crate::file::stem(name);
    let path = dir.join(format!("locked_run_{stem}.prom"));
    // The counters are read, added to and written under this lock: a run that wrote between
    // another's read and write would lose a count. One that cannot be had within LOCK_WAIT
    // (held by another user, or not a file of ours) costs that, not the run's end.
    let lock_path = dir.join(format!(".locked_run_{stem}.lock"));
    let guard = match lock(&lock_path) {
        Ok(guard) => Some(guard),
        Err(e) => {
            tracing::warn!(
                "cannot lock {} ({e}); the metrics of lock {name} are written without it (a run \
                 ending at the same moment may lose a count)",
                lock_path.display()
            );
            None
        }
    };
    let mut values = read(&path);
    let labels = format!("name=\"{}\"", escape(name.as_str()));
    let seconds = |ms: u64| ms as f64 / 1000.0;
    values.insert(format!("{ATTEMPT}{{{labels}}}"), seconds(wall_clock_ms()));
    let counter = format!("{RUNS}{{{labels},outcome=\"{}\"}}", outcome.label());
    *values.entry(counter).or_insert(0.0) += 1.0;
    if let Some(run) = run {
        let mut gauge = |metric: &str, value: f64| {
            values.insert(format!("{metric}{{{labels}}}"), value);
        };
        gauge(GAUGES[0].0, seconds(run.ended_ms));
        if run.status == 0 {
            gauge(GAUGES[1].0, seconds(run.ended_ms));
        }
        gauge(
            GAUGES[2].0,
            seconds(run.ended_ms.saturating_sub(run.started_ms)),
        );
        gauge(GAUGES[3].0, seconds(run.waited_ms));
        gauge(GAUGES[4].0, f64::from(run.status));
        gauge(GAUGES[5].0, run.fence as f64);
    }
    let text = render(&values, &labels);
    // A name nobody can guess and plant a file under beforehand.
    let tmp = dir.join(format!(
        ".locked_run_{stem}.prom.{}",
        crate::backend::new_token()
    ));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)?;
        file.write_all(text.as_bytes())?;
        fs::rename(&tmp, &path)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    drop(guard);
    written
}

/// An exclusive flock on `path` (created; a regular file, never through a link, opened
/// without blocking), held while the returned file lives; waited for at most [`LOCK_WAIT`].
fn lock(path: &Path) -> io::Result<File> {
    let open = |write: bool| {
        OpenOptions::new()
            .read(true)
            .write(write)
            .create(write)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
    };
    // Another user's lock file (0644) opens for reading only, which a flock needs.
    let file = match open(true) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => open(false)?,
        opened => opened?,
    };
    regular(&file)?;
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match crate::file::flock_file(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if started.elapsed() >= LOCK_WAIT {
                    return Err(io::Error::other(format!(
                        "another process has held it for {}",
                        crate::text::show(LOCK_WAIT)
                    )));
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            locked => return locked.map(|()| file),
        }
    }
}

/// An error unless `file` is a regular file.
fn regular(file: &File) -> io::Result<()> {
    match file.metadata()?.is_file() {
        true => Ok(()),
        false => Err(io::Error::other("not a regular file")),
    }
}

/// The samples of a file this module wrote: `metric{labels} value` lines. Anything else
/// (comments, a damaged line) is left out; a missing file is an empty one, and so is anything
/// but a regular file (a FIFO, a link to `/dev/zero`: another user's, in a shared directory),
/// of which no more than [`MAX_FILE`] bytes are read.
fn read(path: &Path) -> BTreeMap<String, f64> {
    let text = (|| {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)?;
        regular(&file)?;
        let mut bytes = Vec::new();
        file.take(MAX_FILE).read_to_end(&mut bytes)?;
        io::Result::Ok(String::from_utf8_lossy(&bytes).into_owned())
    })()
    .unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The file's text: each metric's HELP and TYPE, then its samples; every outcome's counter is
/// there (0 until it happens), so a rate over it never starts from nothing.
fn render(values: &BTreeMap<String, f64>, labels: &str) -> String {
    let mut values = values.clone();
    for outcome in Outcome::ALL {
        let key = format!("{RUNS}{{{labels},outcome=\"{}\"}}", outcome.label());
        values.entry(key).or_insert(0.0);
    }
    let mut out = String::new();
    let mut family = |metric: &str, kind: &str, help: &str| {
        let prefix = format!("{metric}{{");
        let samples: Vec<(&String, &f64)> = values
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .collect();
        if samples.is_empty() {
            return;
        }
        out.push_str(&format!("# HELP {metric} {help}\n# TYPE {metric} {kind}\n"));
        for (key, value) in samples {
            out.push_str(&format!("{key} {value}\n"));
        }
    };
    family(
        ATTEMPT,
        "gauge",
        "When this host last tried to run the job under the lock (Unix time).",
    );
    for (metric, help) in GAUGES {
        family(metric, "gauge", help);
    }
    family(RUNS, "counter", "Runs on this host, by how they ended.");
    out
}

/// A label value as the text format writes it: `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
