//! `--holders N` beyond what the conformance suite's `holders` asks of every backend: the third
//! run starts within moments of a release and the slot it did not take is free for a fourth, on
//! one Redis server (no key left behind) and on `file://`; a run nested in a holder's command
//! takes its own N, not the outer run's; `release --force` frees one holder by its token, or
//! all.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;

/// A holder of `job` with `--holders N` that writes its fence to `dir/NAME` and runs until
/// `dir/NAME.go` exists.
fn holder(url: &str, n: &str, dir: &Path, name: &str, extra: &[&str]) -> Running {
    let d = path_str(dir);
    lr().url(url)
        .args(["--holders", n])
        .args(extra)
        .name("job")
        .sh(&format!(
            "echo $LOCKED_RUN_FENCE $LOCKED_RUN_HOLDERS > {d}/{name}.tmp; mv {d}/{name}.tmp {d}/{name}; \
             while [ ! -e {d}/{name}.go ]; do sleep 0.01; done"
        ))
        .spawn()
}

fn started(dir: &Path, name: &str) -> String {
    wait_for_file(&dir.join(name), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    })
}

/// Three runs with `--holders 2`: two run, the third is 75 with `-n` and otherwise waits, and
/// starts as soon as one of the two ends.
fn two_of_three(url: &str) {
    let dir = scratch();
    let d = dir.path();
    let a = holder(url, "2", d, "a", &[]);
    let b = holder(url, "2", d, "b", &[]);
    let (fa, fb) = (started(d, "a"), started(d, "b"));
    assert!(
        fa.ends_with(" 2\n") && fb.ends_with(" 2\n"),
        "LOCKED_RUN_HOLDERS: {fa} {fb}"
    );
    assert_ne!(fa, fb, "every holder has a fence of its own");

    let busy = lr()
        .url(url)
        .args(["--holders", "2", "-n", "job", "true"])
        .run()
        .expect(75);
    assert!(busy.stderr.is_empty(), "-n is silent: {}", busy.stderr);

    let status = status_json(url, "job");
    assert_eq!(status["limit"], 2, "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");

    let c = holder(url, "2", d, "c", &[]);
    wait_until("the third waits", Duration::from_secs(10), || {
        status_json(url, "job")["waiters"] == 1
    });
    assert!(!d.join("c").exists(), "no third holder while two hold");
    std::fs::write(d.join("a.go"), "").unwrap();
    a.wait().expect(0);
    let freed = Instant::now();
    let fc = started(d, "c");
    let after = freed.elapsed();
    assert!(
        after < Duration::from_millis(500),
        "the third started {after:?} after a release"
    );
    let fences: Vec<u64> = [&fa, &fb, &fc]
        .iter()
        .map(|f| f.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert!(
        fences[2] > fences[0].max(fences[1]),
        "fences grow: {fences:?}"
    );
    // The third waited on both slots; the slot it did not take is not kept by that wait once
    // its holder lets go: a fourth run takes it while the third still runs.
    std::fs::write(d.join("b.go"), "").unwrap();
    b.wait().expect(0);
    lr().url(url)
        .args(["--holders", "2", "-w", "5s", "job", "true"])
        .run()
        .expect(0);
    std::fs::write(d.join("c.go"), "").unwrap();
    c.wait().expect(0);
    assert_eq!(status_json(url, "job")["held"], false);
}

#[test]
fn two_of_three_run_on_redis_and_the_third_starts_at_a_release() {
    let redis = Redis::start();
    two_of_three(&redis.url());
    assert!(!redis.exists("holders:{job}"), "nothing left behind");
    assert!(!redis.exists("holders-meta:{job}"));
}

#[test]
fn two_of_three_run_on_file_and_the_third_starts_at_a_release() {
    let locks = scratch();
    two_of_three(&file_url(locks.path()));
}

// See: commit bce488f. `LOCKED_RUN_HOLDERS`, which a run puts in its command's environment,
// was read back as `--holders` by a `locked-run` that the command started: a plain nested run
// became a 3-holder lock.
#[test]
fn a_nested_run_takes_its_own_lock_not_the_outer_runs_holders() {
    let redis = Redis::start();
    let dirs = scratch();
    let locks = dirs.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    for url in [redis.url(), file_url(&locks)] {
        let dir = scratch();
        let d = path_str(dir.path());
        // The outer job (--holders 3) runs an inner plain run that holds `inner` until told.
        let inner = format!(
            "{BIN} -u {url} inner sh -c 'echo $LOCKED_RUN_HOLDERS > {d}/seen.tmp; mv {d}/seen.tmp {d}/seen; \
             while [ ! -e {d}/go ]; do sleep 0.01; done'"
        );
        let outer = lr()
            .url(&url)
            .args(["--holders", "3"])
            .name("outer")
            .sh(&inner)
            .spawn();
        let seen = wait_for_file(&dir.path().join("seen"), Duration::from_secs(10), |t| {
            t.ends_with('\n')
        });
        assert_eq!(
            seen.trim(),
            "1",
            "{url}: the inner run is a one-holder lock"
        );
        // A second nested run, as the outer job's sibling would start it: its environment
        // says 3, and it must not be let in beside the first.
        lr().url(&url)
            .env("LOCKED_RUN_HOLDERS", "3")
            .args(["-n", "inner", "true"])
            .run()
            .expect(75);
        std::fs::write(dir.path().join("go"), "").unwrap();
        outer.wait().expect(0);
    }
}

#[test]
fn a_program_using_the_plain_protocol_counts_as_one_holder() {
    let redis = Redis::start();
    let _: String = redis.cmd(&["SET", "lock:{job}", "python-worker-7", "NX", "PX", "60000"]);
    let out = lr()
        .url(&redis.url())
        .args(["--holders", "3", "-n", "job", "true"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("--holders 1"), "{}", out.stderr);
}

#[test]
fn release_force_frees_one_holder_by_token_or_all() {
    let redis = Redis::start();
    let url = redis.url();
    let dir = scratch();
    let d = dir.path();
    let a = holder(&url, "3", d, "a", &["--ttl", "2s"]);
    let b = holder(&url, "3", d, "b", &["--ttl", "2s"]);
    let c = holder(&url, "3", d, "c", &["--ttl", "2s"]);
    for name in ["a", "b", "c"] {
        started(d, name);
    }
    let status = status_json(&url, "job");
    let holders = status["holders"].as_array().unwrap().clone();
    assert_eq!(holders.len(), 3, "{status}");
    let token = holders[0]["token"].as_str().unwrap().to_owned();
    let pid = holders[0]["pid"].as_i64().unwrap() as i32;

    lr().args(["release", "-u", &url, "job"])
        .run()
        .expect_with(2, "without --force");
    lr().args(["release", "--force", "--token", &token, "-u", &url, "job"])
        .run()
        .expect(0);
    // The holder it was taken from finds its slot gone at its next renewal: stopped, 76.
    assert!(
        wait_pid_exit(pid, Duration::from_secs(5)),
        "the robbed holder stopped"
    );
    assert_eq!(
        status_json(&url, "job")["holders"]
            .as_array()
            .unwrap()
            .len(),
        2
    );

    let out = lr()
        .args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(0);
    assert!(out.stdout.contains("held by 2 holders"), "{}", out.stdout);
    let statuses: Vec<Option<i32>> = [a, b, c].into_iter().map(|r| r.wait().code()).collect();
    assert_eq!(statuses, [Some(76); 3], "each one robbed was stopped");
    assert_eq!(status_json(&url, "job")["held"], false);
    assert!(!redis.exists("holders:{job}"));
}

#[test]
fn redlock_with_holders_is_a_usage_error() {
    let five = Five::start();
    let out = lr()
        .on(&five)
        .args(["--holders", "2", "job", "true"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("Redlock"), "{}", out.stderr);
    for bad in ["0", "1001", "x"] {
        lr().args(["--holders", bad, "job", "true"])
            .run()
            .expect_with(2, format!("--holders {bad}"));
    }
}

#[test]
fn a_cluster_keeps_a_semaphores_keys_in_the_names_slot() {
    let cluster = Cluster::start();
    let dir = scratch();
    let d = dir.path();
    let a = holder(&cluster.url(), "2", d, "a", &[]);
    let b = holder(&cluster.url(), "2", d, "b", &[]);
    started(d, "a");
    started(d, "b");
    let owner = cluster.owner("lock:{job}");
    let members: i64 = owner.cmd(&["ZCARD", "holders:{job}"]);
    assert_eq!(
        members, 2,
        "both holders on the node that owns {{job}}'s slot"
    );
    lr().url(&cluster.url())
        .args(["--holders", "2", "-n", "job", "true"])
        .run()
        .expect(75);
    for name in ["a", "b"] {
        std::fs::write(d.join(format!("{name}.go")), "").unwrap();
    }
    a.wait().expect(0);
    b.wait().expect(0);
}

#[test]
fn through_sentinels_holders_run_on_the_primary() {
    let watched = Watched::start();
    let dir = scratch();
    let d = dir.path();
    let a = holder(&watched.url(), "2", d, "a", &[]);
    started(d, "a");
    assert!(watched.primary.exists("holders:{job}"));
    std::fs::write(d.join("a.go"), "").unwrap();
    a.wait().expect(0);
    assert!(!watched.primary.exists("holders:{job}"));
}

/// On `file://`, `release --force` of slots of which one is a live holder's frees nothing and
/// says so: a slot kept only by a `--min-hold` beside it is not emptied first.
#[test]
fn release_force_on_file_frees_nothing_while_a_slot_has_a_live_holder() {
    let locks = scratch();
    let url = file_url(locks.path());
    let dir = scratch();
    let d = dir.path();
    // Slot 0: kept by --min-hold after its run ended; slot 1: a live holder.
    lr().url(&url)
        .args(["--holders", "2", "--min-hold", "60s", "job", "true"])
        .run()
        .expect(0);
    let live = holder(&url, "2", d, "live", &[]);
    started(d, "live");
    lr().args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect_with(2, "only its process");
    // Still kept: a third run finds no free slot.
    lr().url(&url)
        .args(["--holders", "2", "-n", "job", "true"])
        .run()
        .expect(75);
    std::fs::write(d.join("live.go"), "").unwrap();
    live.wait().expect(0);
}

/// `release --force` on Redis does not report a holder whose lease already ended (its wrapper
/// SIGKILLed, its slot not yet dropped by anyone; the key lives on with another holder's
/// renewals): it drops it, and reports only the holder it took the lock from.
#[test]
fn release_force_does_not_report_a_holder_whose_lease_ended() {
    let redis = Redis::start();
    let url = redis.url();
    let dir = scratch();
    let live = holder(&url, "2", dir.path(), "live", &["--ttl", "1s"]);
    let gone = holder(&url, "2", dir.path(), "gone", &["--ttl", "1s"]);
    started(dir.path(), "live");
    started(dir.path(), "gone");
    signal(gone.pid(), libc::SIGKILL);
    let _ = gone.wait();
    wait_until("its lease ended", Duration::from_secs(5), || {
        status_json(&url, "job")["holders"]
            .as_array()
            .is_some_and(|h| h.len() == 1)
    });
    let listed: i64 = redis.cmd(&["ZCARD", "holders:{job}"]);
    assert_eq!(listed, 2, "still listed, past its lease");
    let out = lr()
        .args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(0);
    assert!(
        out.stdout.contains("held by") && !out.stdout.contains("2 holders"),
        "{}",
        out.stdout
    );
    assert_eq!(live.wait().code(), Some(76), "the live one was robbed");
    assert!(!redis.exists("holders:{job}"), "nothing left");
}
