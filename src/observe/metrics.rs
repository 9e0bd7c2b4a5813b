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
//! [`MAX_FILE`] bytes: a larger one is no file of ours, and the counters start again), and of
//! it only this NAME's samples of this module's metrics; the lock of the read-add-write is
//! waited for at most [`LOCK_WAIT`] (another user may hold it for ever: a flock needs only a
//! descriptor open for reading), or until a SIGTERM or SIGINT, after which the counters are
//! written from what could be read, with one warning. A lock file swapped for another while a
//! run took it (renamed over, removed) is taken again, within the same wait; in a sticky
//! directory that other users can write, one that belongs to another user (who could swap it
//! at will) is not used at all, as `file://` treats such a file, with the same warning.
//! Temporary files that a killed run left behind are removed by a later run.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
    let guard = match lock_or_signal(&lock_path) {
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
    let labels = format!("name=\"{}\"", escape(name.as_str()));
    let mut values = match read(&path) {
        Ok(values) => values,
        Err(Foreign) => {
            tracing::warn!(
                "{} is larger than 1 MiB, as no file of locked-run's is (another program's?): \
                 the metrics of lock {name} start again from this run",
                path.display()
            );
            BTreeMap::new()
        }
    };
    values.retain(|key, _| ours(key, &labels));
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
    // What a run killed while it wrote (SIGKILL) left a minute or more ago.
    crate::file::remove_stale(dir, &format!(".locked_run_{stem}.prom."), "");
    written
}

/// Whether `key` is one of this module's samples for this NAME (`labels`): whatever else a
/// file of that name holds is not carried to the next.
fn ours(key: &str, labels: &str) -> bool {
    let single = |metric: &str| key == format!("{metric}{{{labels}}}");
    let counter = Outcome::ALL
        .iter()
        .any(|o| key == format!("{RUNS}{{{labels},outcome=\"{}\"}}", o.label()));
    counter || single(ATTEMPT) || GAUGES.iter().any(|(metric, _)| single(metric))
}

/// [`lock`], ended early by a SIGTERM or SIGINT (the run's status stands, and its counters are
/// written without the lock): listened for only while it waits.
fn lock_or_signal(path: &Path) -> io::Result<File> {
    let stop = Arc::new(AtomicBool::new(false));
    let ids: Vec<_> = [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT]
        .into_iter()
        .filter_map(|sig| signal_hook::flag::register(sig, stop.clone()).ok())
        .collect();
    let locked = lock(path, &stop);
    for id in ids {
        signal_hook::low_level::unregister(id);
    }
    locked
}

/// An exclusive flock on `path` (created; a regular file, never through a link, opened
/// without blocking, and not another user's in a sticky directory), held while the returned
/// file lives and still the file at `path` once taken; waited for at most [`LOCK_WAIT`], and
/// no longer once `stop` is set.
fn lock(path: &Path, stop: &AtomicBool) -> io::Result<File> {
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
    let started = Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        // Another user's lock file (0644) opens for reading only, which a flock needs.
        let file = match open(true) {
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => open(false)?,
            opened => opened?,
        };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        crate::file::check_owner(path, &meta)?;
        match crate::file::flock_file(&file, libc::LOCK_EX | libc::LOCK_NB) {
            // Still the file at the path: no run that opens it now can take another.
            Ok(()) if still_at(path, &meta) => return Ok(file),
            // Renamed over or removed between the open and the flock: taken again.
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
        drop(file);
        if stop.load(Ordering::Relaxed) {
            return Err(io::Error::other("a signal ended the wait for it"));
        }
        if started.elapsed() >= LOCK_WAIT {
            return Err(io::Error::other(format!(
                "another process has held it, or swapped it, for {}",
                crate::text::show(LOCK_WAIT)
            )));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Whether the file at `path` (not followed) is the one `meta` describes.
fn still_at(path: &Path, meta: &fs::Metadata) -> bool {
    fs::symlink_metadata(path).is_ok_and(|now| now.dev() == meta.dev() && now.ino() == meta.ino())
}

/// A previous file larger than [`MAX_FILE`]: no file this module wrote.
struct Foreign;

/// The samples of a file this module wrote: `metric{labels} value` lines. Anything else
/// (comments, a damaged line) is left out; a missing file is an empty one, and so is anything
/// but a regular file (a FIFO, a link to `/dev/zero`: another user's, in a shared directory);
/// a file larger than [`MAX_FILE`] is [`Foreign`].
fn read(path: &Path) -> Result<BTreeMap<String, f64>, Foreign> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let Ok(file) = file else {
        return Ok(BTreeMap::new());
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() && meta.len() > MAX_FILE => return Err(Foreign),
        Ok(meta) if meta.is_file() => {}
        _ => return Ok(BTreeMap::new()),
    }
    let mut bytes = Vec::new();
    if file.take(MAX_FILE).read_to_end(&mut bytes).is_err() {
        return Ok(BTreeMap::new());
    }
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect())
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
