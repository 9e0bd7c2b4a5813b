//! `--shared` on `file://`: `flock(LOCK_SH)` on DIR/NAME.lock. Shared runs hold together, never
//! beside an exclusive one, each with a fence of its own; `flock -s` and `flock` share and
//! exclude on the same file; `status` lists every shared holder; a shared `--min-hold` keeps
//! exclusive runs out; a SIGKILLed shared holder leaves nothing that counts. Real processes;
//! order is read from the children's log.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::*;

/// What a holder's command does, whichever program holds the lock for it: logs `start NAME
/// FENCE SHARED`, says it is up (`NAME.up`, its fence and LOCKED_RUN_SHARED), runs until
/// `NAME.go` exists (a minute at most), and logs `end NAME`.
fn script(dir: &Path, name: &str) -> String {
    format!(
        "echo start {name} $LOCKED_RUN_FENCE $LOCKED_RUN_SHARED >> {d}/log; \
         echo $LOCKED_RUN_FENCE $LOCKED_RUN_SHARED > {d}/{name}.tmp; mv {d}/{name}.tmp {d}/{name}.up; \
         n=0; until [ -e {d}/{name}.go ] || [ $n -ge 6000 ]; do sleep 0.01; n=$((n+1)); done; \
         echo end {name} >> {d}/log",
        d = path_str(dir)
    )
}

/// `locked-run -u URL EXTRA job sh -c SCRIPT`, started.
fn hold(url: &str, dir: &Path, name: &str, extra: &[&str]) -> Running {
    lr().url(url)
        .args(extra)
        .name("job")
        .sh(&script(dir, name))
        .spawn()
}

/// `flock EXTRA LOCK_FILE sh -c SCRIPT`, started.
fn flock_hold(lock_file: &Path, dir: &Path, name: &str, extra: &[&str]) -> Running {
    let mut flock = Command::new("flock");
    flock
        .args(extra)
        .arg(lock_file)
        .args(sh(&script(dir, name)));
    spawn(flock)
}

/// Waits until `name` says it is up; returns its fence and LOCKED_RUN_SHARED.
fn up(dir: &Path, name: &str) -> (u64, String) {
    let text = wait_for_file(
        &dir.join(format!("{name}.up")),
        Duration::from_secs(10),
        |t| t.ends_with('\n'),
    );
    let mut words = text.split_whitespace();
    let fence = words.next().map_or(0, |f| f.parse().unwrap());
    (fence, words.next().unwrap_or("").to_owned())
}

fn go(dir: &Path, name: &str) {
    std::fs::write(dir.join(format!("{name}.go")), "").unwrap();
}

/// The log's events, `start NAME` or `end NAME`, in the order they happened.
fn events(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("log"))
        .unwrap()
        .lines()
        .map(|line| {
            line.split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn at(events: &[String], event: &str) -> usize {
    events
        .iter()
        .position(|e| e == event)
        .unwrap_or_else(|| panic!("{event:?} not in {events:?}"))
}

fn pids(status: &serde_json::Value) -> Vec<i64> {
    let mut pids: Vec<i64> = status["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("no holders: {status}"))
        .iter()
        .map(|h| h["pid"].as_i64().unwrap())
        .collect();
    pids.sort();
    pids
}

fn sorted(mut pids: Vec<i64>) -> Vec<i64> {
    pids.sort();
    pids
}

#[test]
fn shared_runs_hold_together_each_with_a_fence_of_its_own() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let a = hold(&url, d, "a", &["--shared"]);
    let (fa, shared) = up(d, "a");
    assert_eq!(shared, "1", "the command sees LOCKED_RUN_SHARED=1");
    let b = hold(&url, d, "b", &["--shared"]);
    let (fb, _) = up(d, "b");
    // Both are up, and neither was told to go.
    assert!(fb > fa, "fences grow across shared holders: {fa} then {fb}");
    assert_eq!(status_json(&url, "job")["fence"], fb);

    let status = status_json(&url, "job");
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(status["mode"], "shared", "{status}");
    assert_eq!(
        pids(&status),
        sorted(vec![a.pid().into(), b.pid().into()]),
        "{status}"
    );
    let fences: Vec<u64> = status["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["fence"].as_u64().unwrap())
        .collect();
    assert_eq!(fences, [fa, fb], "{status}");
    // A third shared run, `-n`, gets in beside them.
    lr().url(&url)
        .args(["-n", "--shared"])
        .job(["true"])
        .run()
        .expect(0);

    go(d, "a");
    go(d, "b");
    a.wait().expect(0);
    b.wait().expect(0);
    let events = events(d);
    assert!(
        at(&events, "start b") < at(&events, "end a"),
        "both held at once: {events:?}"
    );
    let status = status_json(&url, "job");
    assert_eq!(status["held"], false, "{status}");
    assert_eq!(status["mode"], serde_json::Value::Null, "{status}");
    // Nothing of theirs is left in DIR but the lock file, the fence counter and the history.
    let mut left: Vec<String> = std::fs::read_dir(locks.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["job.fence", "job.history", "job.lock"]);
}

#[test]
fn an_exclusive_run_waits_until_the_last_shared_holder_has_ended() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let a = hold(&url, d, "a", &["--shared"]);
    let (fa, _) = up(d, "a");
    let b = hold(&url, d, "b", &["--shared"]);
    let (fb, _) = up(d, "b");

    let busy = lr().url(&url).args(["-n"]).job(["true"]).run().expect(75);
    assert!(busy.stderr.is_empty(), "-n is silent: {}", busy.stderr);
    let w = hold(&url, d, "w", &[]);
    wait_until("the exclusive run waits", Duration::from_secs(10), || {
        status_json(&url, "job")["waiters"] == 1
    });
    go(d, "a");
    a.wait().expect(0);
    assert!(!d.join("w.up").exists(), "one shared holder is still there");
    go(d, "b");
    b.wait().expect(0);
    let (fw, shared) = up(d, "w");
    assert_eq!(shared, "0", "LOCKED_RUN_SHARED of an exclusive run");
    let status = status_json(&url, "job");
    assert_eq!(status["mode"], "exclusive", "{status}");
    assert_eq!(pids(&status), [i64::from(w.pid())], "{status}");
    assert!(fw > fa.max(fb), "fences grow across modes: {fa} {fb} {fw}");
    go(d, "w");
    w.wait().expect(0);
    let events = events(d);
    assert!(
        at(&events, "end a") < at(&events, "start w")
            && at(&events, "end b") < at(&events, "start w"),
        "{events:?}"
    );
}

#[test]
fn a_shared_run_waits_while_an_exclusive_run_holds() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let x = hold(&url, d, "x", &[]);
    let (fx, _) = up(d, "x");

    let out = lr()
        .url(&url)
        .args(["-n", "-v", "--shared"])
        .job(["true"])
        .run()
        .expect(75);
    assert!(
        out.stderr.contains(&format!("pid {}", x.pid())),
        "the exclusive holder is named: {}",
        out.stderr
    );
    let s = hold(&url, d, "s", &["--shared"]);
    wait_until("the shared run waits", Duration::from_secs(10), || {
        status_json(&url, "job")["waiters"] == 1
    });
    go(d, "x");
    x.wait().expect(0);
    let (fs, _) = up(d, "s");
    assert!(fs > fx);
    go(d, "s");
    s.wait().expect(0);
    let events = events(d);
    assert!(at(&events, "end x") < at(&events, "start s"), "{events:?}");
}

#[test]
fn flock_s_and_locked_run_shared_share_the_lock_and_exclude_exclusive_runs() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let lock_file = locks.path().join("job.lock");

    // flock -s holds: a shared run gets in, an exclusive one does not.
    let reader = flock_hold(&lock_file, d, "flock-s", &["-s"]);
    up(d, "flock-s");
    lr().url(&url)
        .args(["-n", "--shared"])
        .job(["true"])
        .run()
        .expect_with(0, "beside flock -s");
    lr().url(&url)
        .args(["-n"])
        .job(["true"])
        .run()
        .expect_with(75, "an exclusive run beside flock -s");
    let status = status_json(&url, "job");
    assert_eq!(status["mode"], "shared", "{status}");
    assert_eq!(pids(&status), [i64::from(reader.pid())], "{status}");
    assert_eq!(status["holders"][0]["command"], "flock", "{status}");
    go(d, "flock-s");
    reader.wait().expect(0);

    // flock (exclusive) holds: a shared run stays out.
    let writer = flock_hold(&lock_file, d, "flock", &[]);
    up(d, "flock");
    let out = lr()
        .url(&url)
        .args(["-n", "-v", "--shared"])
        .job(["true"])
        .run()
        .expect_with(75, "a shared run beside flock");
    assert!(
        out.stderr
            .contains(&format!("pid {} (flock)", writer.pid())),
        "{}",
        out.stderr
    );
    go(d, "flock");
    writer.wait().expect(0);

    // locked-run --shared holds: flock -s gets in, flock does not.
    let shared = hold(&url, d, "lr", &["--shared"]);
    up(d, "lr");
    let flock = |extra: &[&str]| {
        let mut flock = Command::new("flock");
        flock.args(extra).arg(&lock_file).arg("true");
        run(flock)
    };
    flock(&["-n"]).expect_with(1, "flock -n beside locked-run --shared");
    flock(&["-s", "-n"]).expect_with(0, "flock -s -n beside locked-run --shared");
    go(d, "lr");
    shared.wait().expect(0);
}

#[test]
fn a_shared_min_hold_keeps_exclusive_runs_out_until_released_by_force() {
    let locks = scratch();
    let url = file_url(locks.path());
    lr().url(&url)
        .args(["--shared", "--min-hold", "60s"])
        .job(["true"])
        .run()
        .expect(0);
    // Shared runs would have run beside it: they still may. Exclusive runs may not.
    lr().url(&url)
        .args(["-n", "--shared"])
        .job(["true"])
        .run()
        .expect(0);
    lr().url(&url).args(["-n"]).job(["true"]).run().expect(75);
    let status = status_json(&url, "job");
    assert_eq!(
        status["mode"], "shared",
        "kept by a shared holder: {status}"
    );
    let holders = status["holders"].as_array().unwrap();
    assert_eq!(holders.len(), 1, "{status}");
    assert!(holders[0]["ttl_ms"].as_i64().unwrap() > 50_000, "{status}");

    lr().args(["release", "-u", &url, "job"])
        .run()
        .expect_with(2, "without --force");
    lr().args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(0);
    lr().url(&url).args(["-n"]).job(["true"]).run().expect(0);
    let fences = history_fences(&url, "job");
    assert_eq!(fences.len(), 3, "{fences:?}");
    assert_eq!(
        status_json(&url, "job")["fence"],
        fences[2] + 2,
        "{fences:?}"
    );
}

#[test]
fn a_killed_shared_holder_is_not_listed_and_cannot_be_released_while_others_hold() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let jobs = scratch();
    let (killed, child) = start_job(&url, jobs.path(), &["--shared"], "exec sleep 60");
    let live = hold(&url, d, "live", &["--shared"]);
    up(d, "live");
    assert_eq!(
        pids(&status_json(&url, "job")),
        sorted(vec![killed.pid().into(), live.pid().into()])
    );

    signal(killed.pid(), libc::SIGKILL);
    assert!(
        wait_pid_exit(child, Duration::from_secs(5)),
        "the dead holder's command ended"
    );
    let _ = killed.wait();
    // Its watcher, which keeps its descriptors until its job is gone, ends an instant later.
    wait_until(
        "the dead holder is not listed",
        Duration::from_secs(5),
        || pids(&status_json(&url, "job")) == [i64::from(live.pid())],
    );
    let out = lr()
        .args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(2);
    assert!(
        out.stderr.contains(&format!("kill {}", live.pid())),
        "a live shared holder is named, not taken from: {}",
        out.stderr
    );
    go(d, "live");
    live.wait().expect(0);
    lr().url(&url).args(["-n"]).job(["true"]).run().expect(0);
    let left = std::fs::read_dir(locks.path())
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().starts_with("job.shared.")
        })
        .count();
    assert_eq!(left, 0, "the dead holder's file was removed");
}
