//! What happened, in the lock's own store, beyond what the conformance suite's `history`
//! asks of every backend (the fields, newest first, how each run ended): Redlock keeps it on
//! every server and merges it; a lost run is in it; at most 100 are kept on each backend; a
//! foreign holder leaves none; concurrent holders' runs are all kept; and the release's round
//! trips are those it had without history.

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use serde_json::Value;

use crate::support::postgres::Postgres;
use crate::support::*;

/// `locked-run history --json` of NAME `job`, as an array.
fn history(url: &[String], limit: u16) -> Vec<Value> {
    let out = lr()
        .args(url)
        .args(["history", "--json", "--limit", &limit.to_string(), "job"])
        .run();
    assert!(matches!(out.code(), Some(0 | 1)), "{out:?}");
    out.json().as_array().unwrap().clone()
}

fn field(runs: &[Value], key: &str) -> Vec<Value> {
    runs.iter().map(|r| r[key].clone()).collect()
}

/// Runs that end 0, 3, by a signal and by `--max-run`, then the history says them newest
/// first, each with how it ended and the status locked-run returned, fences in order.
fn runs_are_kept_newest_first_with_how_each_ended(url: &[String], run_args: &[String]) {
    assert!(history(url, 20).is_empty(), "never taken: no history");
    lr().args(url).args(run_args).job(["true"]).run().expect(0);
    lr().args(url)
        .args(run_args)
        .name("job")
        .sh("exit 3")
        .run()
        .expect(3);
    let killed = lr()
        .args(url)
        .args(run_args)
        .name("job")
        .sh("kill -TERM $$")
        .run();
    assert_eq!(killed.status.signal(), Some(15), "{killed:?}");
    lr().args(url)
        .args(run_args)
        .args(["--max-run", "300ms", "-k", "300ms"])
        .job(["sleep", "5"])
        .run()
        .expect(124);
    let runs = history(url, 20);
    assert_eq!(
        field(&runs, "status"),
        [124, 143, 3, 0].map(Value::from),
        "{runs:?}"
    );
    assert_eq!(
        field(&runs, "ended"),
        ["max-run", "signal", "exit", "exit"].map(Value::from)
    );
    assert_eq!(runs[1]["signal"], 15);
    let fences: Vec<u64> = runs.iter().map(|r| r["fence"].as_u64().unwrap()).collect();
    assert!(fences.windows(2).all(|w| w[0] > w[1]), "{fences:?}");
    let first = &runs[3];
    assert!(first["pid"].as_u64().is_some());
    assert_eq!(first["mode"], "exclusive");
    assert_eq!(first["user"], "root");
    assert!(first["started_at"].as_str().unwrap().ends_with('Z'));
    assert!(first["ended_at"].as_str().unwrap() >= first["started_at"].as_str().unwrap());
    assert_eq!(history(url, 2).len(), 2, "--limit");
    let text = lr().args(url).args(["history", "job"]).run().expect(0);
    assert_eq!(text.stdout.lines().count(), 4, "{}", text.stdout);
    assert!(
        text.stdout
            .lines()
            .next()
            .unwrap()
            .contains("--max-run ran out (124)")
    );
    let status = lr().args(url).args(["status", "job"]).run().expect(1);
    assert!(
        status.stdout.contains("  last run: ") && status.stdout.contains("(124)"),
        "{}",
        status.stdout
    );
}

#[test]
fn redlock_keeps_the_runs_history_on_every_server_and_merges_it() {
    let five = Five::start();
    // Redlock's per-server timeout at its default (T/100) is missed on two loaded cores.
    let run_args = ["--node-timeout".to_owned(), "300ms".to_owned()];
    runs_are_kept_newest_first_with_how_each_ended(&five.url_args(), &run_args);
    let each: Vec<i64> = five
        .servers
        .iter()
        .map(|r| r.cmd(&["LLEN", "history:{job}"]))
        .collect();
    assert_eq!(each, [4, 4, 4, 4, 4], "on every server the release reached");
}

/// A run whose lock was taken away is in the history as lost, 76.
#[test]
fn a_lost_run_is_in_the_history() {
    let redis = Redis::start();
    let url = ["-u".to_owned(), redis.url()];
    let dir = scratch();
    let up = file(&dir, "up");
    let run = lr()
        .args(&url)
        .args(["--ttl", "2s"])
        .name("job")
        .sh(&format!("echo up > {}; sleep 30", path_str(&up)))
        .spawn();
    wait_for_file(&up, Duration::from_secs(10), |t| !t.is_empty());
    let _: () = redis.cmd(&["DEL", "lock:{job}"]);
    run.wait().expect(76);
    let runs = history(&url, 5);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(
        (runs[0]["ended"].as_str(), runs[0]["status"].as_i64()),
        (Some("lost"), Some(76))
    );
}

/// At most 100 runs are kept: the oldest go.
fn the_newest_hundred_are_kept(url: &[String]) {
    let fences = |runs: &[Value]| -> Vec<u64> {
        runs.iter().map(|r| r["fence"].as_u64().unwrap()).collect()
    };
    for _ in 0..3 {
        lr().args(url).job(["true"]).run().expect(0);
    }
    let oldest = fences(&history(url, 3));
    for _ in 0..100 {
        lr().args(url).job(["true"]).run().expect(0);
    }
    let kept = fences(&history(url, 100));
    assert_eq!(kept.len(), 100);
    assert!(
        kept.windows(2).all(|w| w[0] > w[1]),
        "newest first: {kept:?}"
    );
    assert!(
        oldest.iter().all(|f| !kept.contains(f)),
        "the three oldest gone: {oldest:?}"
    );
}

#[test]
fn redis_keeps_the_newest_hundred() {
    let redis = Redis::start();
    let url = ["-u".into(), redis.url()];
    the_newest_hundred_are_kept(&url);
    // Cut once twice as long: a release in between costs one LPUSH, not a read of the hundred.
    let len: i64 = redis.cmd(&["LLEN", "history:{job}"]);
    assert_eq!(len, 103);
    let record: String = redis.cmd(&["LINDEX", "history:{job}", "0"]);
    for _ in 0..98 {
        let _: i64 = redis.cmd(&["LPUSH", "history:{job}", &record]);
    }
    lr().args(&url).job(["true"]).run().expect(0);
    let len: i64 = redis.cmd(&["LLEN", "history:{job}"]);
    assert_eq!(len, 100, "past two hundred: the newest hundred");
    let newest = history(&url, 1);
    assert_ne!(newest[0].to_string(), record, "the run's own first");
}

#[test]
fn file_keeps_the_newest_hundred() {
    let locks = scratch();
    the_newest_hundred_are_kept(&["-u".into(), file_url(locks.path())]);
    let lines = std::fs::read_to_string(locks.path().join("job.history")).unwrap();
    assert!(lines.lines().count() <= 200, "cut once twice as long");
}

#[test]
fn etcd_keeps_the_newest_hundred() {
    let etcd = Etcd::start();
    the_newest_hundred_are_kept(&["-u".into(), etcd.url()]);
}

#[test]
fn postgres_keeps_the_newest_hundred() {
    let pg = Postgres::start();
    the_newest_hundred_are_kept(&["-u".into(), pg.url()]);
    let rows = pg.psql("SELECT count(*) FROM locked_run.history WHERE name = 'job'");
    assert_eq!(rows, "100");
}

/// Holders that let go together each leave their run in the history: shared holders on Redis
/// and file://, whose releases (and appends) may meet.
fn concurrent_holders_are_all_kept(url: &[String]) {
    let dir = scratch();
    let d = path_str(dir.path());
    let runs: Vec<Running> = (0..4)
        .map(|i| {
            lr().args(url)
                .args(["--shared"])
                .name("job")
                .sh(&format!(
                    "touch {d}/up.{i}; while [ ! -e {d}/go ]; do sleep 0.01; done"
                ))
                .spawn()
        })
        .collect();
    for i in 0..4 {
        wait_for_file(
            &dir.path().join(format!("up.{i}")),
            Duration::from_secs(10),
            |_| true,
        );
    }
    std::fs::write(dir.path().join("go"), "").unwrap();
    for run in runs {
        run.wait().expect(0);
    }
    let runs = history(url, 10);
    assert_eq!(runs.len(), 4, "{runs:?}");
    assert!(runs.iter().all(|r| r["mode"] == "shared"));
}

#[test]
fn redis_keeps_the_runs_of_holders_that_let_go_together() {
    let redis = Redis::start();
    concurrent_holders_are_all_kept(&["-u".into(), redis.url()]);
}

#[test]
fn file_keeps_the_runs_of_holders_that_let_go_together() {
    let locks = scratch();
    concurrent_holders_are_all_kept(&["-u".into(), file_url(locks.path())]);
}

#[test]
fn postgres_keeps_the_runs_of_holders_that_let_go_together() {
    let pg = Postgres::start();
    concurrent_holders_are_all_kept(&["-u".into(), pg.url()]);
}

/// A lock held only by another program using the plain protocol has a fence but no history.
#[test]
fn a_foreign_holder_leaves_no_history() {
    let redis = Redis::start();
    let _: String = redis.cmd(&["SET", "lock:{job}", "python-worker", "NX", "PX", "60000"]);
    let _: i64 = redis.cmd(&["INCR", "fence:{job}"]);
    let url = ["-u".to_owned(), redis.url()];
    assert!(history(&url, 10).is_empty());
    lr().args(&url).args(["history", "job"]).run().expect(1);
}

/// The release is one call with the history as without it: the run's record goes in the
/// release script's own call.
#[test]
fn the_history_costs_the_release_no_round_trip() {
    let redis = Redis::start();
    let url = ["-u".to_owned(), redis.url()];
    lr().args(&url).job(["true"]).run().expect(0);
    let _: () = redis.cmd(&["CONFIG", "RESETSTAT"]);
    lr().args(&url).job(["true"]).run().expect(0);
    // The acquire and the release: one script call each (EVALSHA; EVAL once after a flush).
    let calls = command_stats(&redis, &["evalsha", "eval"], "calls");
    assert_eq!(calls, 2, "the acquire's and the release's");
    assert_eq!(history(&url, 5).len(), 2);
}

/// A history that cannot be written costs the run nothing: it runs, its lock is let go, and
/// one warning says the run is missing from the history, once the release went through.
#[test]
fn an_unwritable_history_is_one_warning_after_the_release() {
    let dir = scratch();
    let url = format!("file://{}", dir.path().display());
    // A directory where the history file goes: it cannot be opened for appending.
    std::fs::create_dir(dir.path().join("job.history")).unwrap();
    let out = lr().url(&url).job(["true"]).run().expect(0);
    let warned: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("could not add this run to lock job's history"))
        .collect();
    assert_eq!(warned.len(), 1, "{}", out.stderr);
    assert!(
        warned[0].ends_with("the lock is released"),
        "{}",
        out.stderr
    );
    // Released: the next run takes it at once.
    lr().url(&url).args(["-n"]).job(["true"]).run().expect(0);
}
