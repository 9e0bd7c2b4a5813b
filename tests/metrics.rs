//! `--metrics-dir`: node_exporter's textfile, written at the end of every run: the last held
//! run's gauges, a skip and an unreachable store counted without touching them, counters that
//! concurrent runs never lose, no temporary file left, and a file `promtool` accepts; in a
//! directory shared with other users, nothing planted there (a held lock, a FIFO, a link to
//! `/dev/zero`) holds a run up past its command's end.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::support::hostile::run_measured;
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

/// Only the file itself (and its lock) stay in the directory.
fn only_the_file(dir: &Path) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [".locked_run_job.lock", "locked_run_job.prom"]);
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

/// A process of another user's (nobody's, as root; else this user's), started in a process
/// group of its own and killed with it when dropped.
struct Other(std::process::Child);

impl Other {
    /// Runs `script` with `sh` as that user; it says it is up by writing `up` into `ready`.
    fn start(script: &str, ready: &Path) -> Other {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", script]).process_group(0);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            cmd.uid(65534).gid(65534);
        }
        let other = Other(cmd.spawn().unwrap());
        wait_for_file(ready, Duration::from_secs(10), |t| t.contains("up"));
        other
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        signal(-(self.0.id() as i32), libc::SIGKILL);
        let _ = self.0.wait();
    }
}

/// A directory every user may write (as a shared collector directory is).
fn shared_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// Issue 43: any user who can read the metrics lock file can hold it (`flock FILE sleep`); a
/// run waited for it for as long, after its release, deaf to SIGTERM. Now it waits a few
/// seconds at most, says so once, and writes the counters all the same.
#[test]
fn a_metrics_lock_held_by_another_user_delays_the_end_by_seconds_at_most() {
    let locks = scratch();
    let metrics = shared_dir();
    let dir = path_str(metrics.path());
    let url = file_url(locks.path());
    lr().url(&url)
        .args(["--metrics-dir", dir])
        .job(["true"])
        .run()
        .expect(0);
    let ready = metrics.path().join("ready");
    let lock = metrics.path().join(".locked_run_job.lock");
    let _holder = Other::start(
        &format!(
            "exec flock -o {} sh -c 'echo up > {}; exec sleep 50'",
            path_str(&lock),
            path_str(&ready)
        ),
        &ready,
    );
    let out = lr()
        .url(&url)
        .args(["--metrics-dir", dir])
        .job(["true"])
        .run()
        .expect(0);
    assert!(
        out.elapsed < Duration::from_secs(15),
        "the run ended {:?} after its start",
        out.elapsed
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("cannot lock") && out.stderr.contains("written without it"),
        "{}",
        out.stderr
    );
    assert_eq!(
        runs(&samples(metrics.path()), "ran"),
        2.0,
        "counted all the same"
    );
}

/// Issue 43: a FIFO planted where the previous file (or the lock file) goes blocked the run's
/// read for ever, past SIGTERM. Neither is read now; the file is written afresh.
#[test]
fn a_fifo_in_place_of_the_metrics_file_or_its_lock_is_not_waited_on() {
    let locks = scratch();
    let metrics = shared_dir();
    for fifo in ["locked_run_job.prom", ".locked_run_job.lock"] {
        let made = std::process::Command::new("mkfifo")
            .arg(metrics.path().join(fifo))
            .status()
            .unwrap();
        assert!(made.success());
    }
    let out = lr()
        .url(&file_url(locks.path()))
        .args(["--metrics-dir", path_str(metrics.path())])
        .job(["true"])
        .spawn()
        .wait_for(Duration::from_secs(30))
        .expect(0);
    assert!(out.stderr.contains("not a regular file"), "{}", out.stderr);
    assert_eq!(runs(&samples(metrics.path()), "ran"), 1.0);
}

/// Issue 43: a link to `/dev/zero` where the previous file goes was read until memory ran out
/// (16 GB). Links are never followed there now; the run stays small.
#[test]
fn a_link_to_dev_zero_in_place_of_the_metrics_file_is_not_followed() {
    let locks = scratch();
    let metrics = shared_dir();
    std::os::unix::fs::symlink("/dev/zero", metrics.path().join("locked_run_job.prom")).unwrap();
    let url = file_url(locks.path());
    let (out, peak) = run_measured(&[
        "-u",
        &url,
        "--metrics-dir",
        path_str(metrics.path()),
        "job",
        "true",
    ]);
    let out = out.expect(0);
    if let Some(kb) = peak {
        assert!(kb < 128 * 1024, "peak {kb} KiB");
    }
    assert!(out.stderr.is_empty(), "{}", out.stderr);
    assert_eq!(runs(&samples(metrics.path()), "ran"), 1.0);
    assert!(
        std::fs::symlink_metadata(metrics.path().join("locked_run_job.prom"))
            .unwrap()
            .is_file(),
        "the link was replaced by the file"
    );
}

/// Issue 43's review: in a sticky directory, another user owned the metrics lock file and
/// renamed fresh ones over it in a loop; concurrent runs locked different files and lost
/// counts without a word. Another user's lock file there is not used (its owner could swap it
/// at will, as `file://` says of such a file): one warning, the counters written without it.
#[test]
fn another_users_metrics_lock_file_in_a_sticky_directory_is_not_used() {
    // SAFETY: geteuid has no preconditions.
    if skip_unless(unsafe { libc::geteuid() } == 0, "another user needs root") {
        return;
    }
    let locks = scratch();
    let metrics = shared_dir();
    let ready = metrics.path().join("ready");
    drop(Other::start(
        &format!(
            "touch {}/.locked_run_job.lock; echo up > {}",
            path_str(metrics.path()),
            path_str(&ready)
        ),
        &ready,
    ));
    let out = lr()
        .url(&file_url(locks.path()))
        .args(["--metrics-dir", path_str(metrics.path())])
        .job(["true"])
        .run()
        .expect(0);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("belongs to user nobody (uid 65534)")
            && out.stderr.contains("are written without it"),
        "{}",
        out.stderr
    );
    assert_eq!(runs(&samples(metrics.path()), "ran"), 1.0);
}

/// A run of `job` whose metrics go to `dir`, whose metrics lock another process holds: once its
/// command has ended (it now waits for that lock). The holder, the run, and its lock directory.
fn ended_with_the_metrics_lock_held(dir: &Path) -> (Running, Running, tempfile::TempDir) {
    let locks = scratch();
    let held = holding_flock(&dir.join(".locked_run_job.lock"));
    let ended = dir.join("ended");
    let run = lr()
        .url(&file_url(locks.path()))
        .args(["--metrics-dir", path_str(dir)])
        .job(["touch", path_str(&ended)])
        .spawn();
    wait_for_file(&ended, Duration::from_secs(10), |_| true);
    (held, run, locks)
}

/// Issue 43's review: a lock file swapped for another while a run waited for it (renamed
/// over, or removed) was never looked at again: the run kept trying the old one. It is taken
/// again where it now is, within the same wait, without a word.
#[test]
fn a_metrics_lock_file_renamed_over_while_a_run_waits_is_taken_again() {
    let metrics = scratch();
    let dir = metrics.path();
    let (held, run, _locks) = ended_with_the_metrics_lock_held(dir);
    // Once it tried the held file (or a moment went by: this build opens it only for each
    // try), a fresh one takes its place.
    let tried = std::time::Instant::now();
    while !has_open(run.pid(), ".locked_run_job.lock") && tried.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(dir.join("fresh"), "").unwrap();
    std::fs::rename(dir.join("fresh"), dir.join(".locked_run_job.lock")).unwrap();
    let out = run.wait_for(Duration::from_secs(15)).expect(0);
    assert_eq!(out.stderr, "", "taken again, not waited out");
    assert_eq!(runs(&samples(dir), "ran"), 1.0);
    signal(held.pid(), libc::SIGKILL);
}

/// Issue 43's review: a SIGTERM (or SIGINT) while a run waited for the metrics lock did
/// nothing; the run ended 3 s later. It ends the wait: the status stands, and the counters are
/// written without the lock, said in one line.
#[test]
fn a_sigterm_ends_the_wait_for_the_metrics_lock() {
    let metrics = scratch();
    let dir = metrics.path();
    let (held, run, _locks) = ended_with_the_metrics_lock_held(dir);
    wait_until("the run waits for the lock", Duration::from_secs(3), || {
        asleep(run.pid())
    });
    signal(run.pid(), libc::SIGTERM);
    let out = run.wait_for(Duration::from_secs(15)).expect(0);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("(a signal ended the wait for it)")
            && out.stderr.contains("are written without it"),
        "{}",
        out.stderr
    );
    assert_eq!(runs(&samples(dir), "ran"), 1.0);
    signal(held.pid(), libc::SIGKILL);
}

/// Issue 43's review: a previous file of 1 MiB of another program's samples, planted once,
/// was read to its first MiB (all junk), carried on, and this NAME's own counters, written
/// after it, were never read again: `ran` stayed 1. A file that large is no file of ours (the
/// counters start again, said once); of a smaller one only this NAME's samples are carried.
#[test]
fn only_this_names_own_samples_are_carried_from_one_run_to_the_next() {
    let locks = scratch();
    let metrics = scratch();
    let dir = metrics.path();
    let prom = dir.join("locked_run_job.prom");
    let junk: String = (0..40_000)
        .map(|i| format!("locked_run_runs_total{{a=\"{i}\"}} 1\n"))
        .collect();
    assert!(junk.len() > 1 << 20);
    std::fs::write(&prom, &junk).unwrap();
    let run = || {
        lr().url(&file_url(locks.path()))
            .args(["--metrics-dir", path_str(dir)])
            .job(["true"])
            .run()
            .expect(0)
    };
    let first = run();
    assert!(
        first.stderr.contains("is larger than 1 MiB") && first.stderr.lines().count() == 1,
        "{}",
        first.stderr
    );
    assert_eq!(run().stderr, "");
    // Another program's samples, and another NAME's, in this NAME's file: not carried.
    let mut text = std::fs::read_to_string(&prom).unwrap();
    text.push_str("locked_run_runs_total{name=\"other\",outcome=\"ran\"} 5\nother_metric 3\n");
    std::fs::write(&prom, text).unwrap();
    run();
    let after = samples(dir);
    assert_eq!(runs(&after, "ran"), 3.0);
    assert!(
        after.keys().all(|k| k.contains("name=\"job\"")),
        "{after:?}"
    );
    only_the_file(dir);
}

/// Issue 43's review: a run SIGKILLed while it wrote the file left its temporary file behind
/// for ever. A later run removes such files of this user's once they are a minute old, and
/// nothing else.
#[test]
fn temporary_files_a_killed_run_left_are_removed_once_old() {
    let locks = scratch();
    let metrics = scratch();
    let dir = metrics.path();
    let name = |n: u32| format!(".locked_run_job.prom.{n:08}-0000-4000-8000-000000000000");
    let old = dir.join(name(1));
    let young = dir.join(name(2));
    let not_a_file = dir.join(name(3));
    let not_ours = dir.join(".locked_run_job.prom.unique");
    for file in [&old, &young, &not_ours] {
        std::fs::write(file, "").unwrap();
    }
    std::fs::create_dir(&not_a_file).unwrap();
    for path in [&old, &not_a_file, &not_ours] {
        two_minutes_old(path);
    }
    lr().url(&file_url(locks.path()))
        .args(["--metrics-dir", path_str(dir)])
        .job(["true"])
        .run()
        .expect(0);
    assert!(!old.exists(), "a minute old: removed");
    assert!(young.exists() && not_a_file.exists() && not_ours.exists());
}
