//! `--shared` on Redis: shared runs hold together, never beside a run without it; waiters of
//! both modes are served in arrival order (a writer is not starved by readers arriving back
//! to back); the plain `SET NX` protocol is kept out by shared holders and keeps them out; a
//! shared holder's lost lease stops its command before the lease can end (76).

use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn shared_runs_hold_together_and_keep_exclusive_runs_and_the_plain_protocol_out() {
    let redis = Redis::start();
    let exclusive = Holder::start(&redis, "job", &[]);
    let first_fence = exclusive.fence();
    exclusive.finish().expect(0);
    // Both hold at once: each is started before either is told to end.
    let a = Holder::start(&redis, "job", &["--shared"]);
    let b = Holder::start(&redis, "job", &["--shared"]);
    assert!(first_fence < a.fence() && a.fence() < b.fence());
    let status = status_json(&redis.url(), "job");
    assert_eq!(status["mode"], "shared", "{status}");
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");
    let pids: Vec<i64> = status["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["pid"].as_i64().unwrap())
        .collect();
    assert!(pids.contains(&i64::from(a.pid())) && pids.contains(&i64::from(b.pid())));
    let text = lr()
        .args(["status", "-u", &redis.url(), "job"])
        .run()
        .expect(0);
    assert!(text.stdout.contains("held shared by 2"), "{}", text.stdout);

    // The plain protocol finds the lock taken; so does a run without --shared.
    let plain: Option<String> = redis.cmd(&["SET", "lock:{job}", "mine", "NX", "PX", "5000"]);
    assert_eq!(plain, None, "SET NX must fail while shared runs hold");
    lr().url(&redis.url())
        .args(["-n", "job", "true"])
        .run()
        .expect(75);
    lr().url(&redis.url())
        .args(["-n", "--holders", "2", "job", "true"])
        .run()
        .expect_one_line(2, "held by runs with --shared");

    // One goes: the other still holds, and still keeps exclusive runs out.
    a.finish().expect(0);
    assert_eq!(redis.cmd::<String>(&["GET", "lock:{job}"]), "shared");
    lr().url(&redis.url())
        .args(["-n", "job", "true"])
        .run()
        .expect(75);
    // The last one takes the marker with it.
    let b_fence = b.fence();
    b.finish().expect(0);
    assert!(
        !redis.exists("lock:{job}"),
        "the marker went with the last holder"
    );
    assert!(!redis.exists("holders:{job}"));
    let out = lr()
        .url(&redis.url())
        .args([
            "-n",
            "job",
            "sh",
            "-c",
            "echo $LOCKED_RUN_FENCE $LOCKED_RUN_SHARED",
        ])
        .run()
        .expect(0);
    let after: Vec<&str> = out.stdout.split_whitespace().collect();
    assert_eq!(
        after[1], "0",
        "an exclusive run's command sees LOCKED_RUN_SHARED=0"
    );
    assert!(after[0].parse::<u64>().unwrap() > b_fence);
}

#[test]
fn a_plain_protocol_holder_keeps_shared_runs_out() {
    let redis = Redis::start();
    let _: String = redis.cmd(&["SET", "lock:{job}", "theirs", "PX", "30000"]);
    lr().url(&redis.url())
        .args(["-n", "--shared", "job", "true"])
        .run()
        .expect(75);
    assert_eq!(redis.cmd::<String>(&["GET", "lock:{job}"]), "theirs");
}

#[test]
fn a_writer_waits_for_the_last_reader_and_readers_after_it_wait_for_the_writer() {
    let redis = Redis::start();
    let dir = scratch();
    let d = dir.path();
    let first = logged(&redis.url(), d, "r1", &["--shared"]);
    wait_until("r1 started", Duration::from_secs(10), || {
        log_of(d).contains("start r1 1")
    });
    let second = logged(&redis.url(), d, "r2", &["--shared"]);
    wait_until("r2 started beside r1", Duration::from_secs(10), || {
        log_of(d).contains("start r2 1")
    });
    let writer = logged(&redis.url(), d, "w", &[]);
    wait_until("the writer queued", Duration::from_secs(10), || {
        queued(&redis) == 1
    });
    // Readers arriving back to back after the writer queue behind it: none passes it,
    // though the lock is held in shared mode.
    let mut late = Vec::new();
    for (i, who) in ["r3", "r4", "r5"].into_iter().enumerate() {
        late.push(logged(&redis.url(), d, who, &["--shared"]));
        wait_until("the reader queued", Duration::from_secs(10), || {
            queued(&redis) == 2 + i as i64
        });
    }
    assert!(!log_of(d).contains("start r3"), "{}", log_of(d));
    go(d, "r1");
    first.wait().expect(0);
    assert!(
        !log_of(d).contains("start w"),
        "the writer waits for r2 too"
    );
    let ended = Instant::now();
    go(d, "r2");
    second.wait().expect(0);
    wait_until("the writer started", Duration::from_secs(10), || {
        log_of(d).contains("start w 0")
    });
    // Woken by the release, not by a poll: well within the keep-alive's 2 s.
    assert!(
        ended.elapsed() < Duration::from_secs(2),
        "{:?}",
        ended.elapsed()
    );
    assert!(
        !log_of(d).contains("start r3"),
        "no reader beside the writer"
    );
    go(d, "w");
    writer.wait().expect(0);
    // The readers queued behind the writer are admitted together.
    wait_until(
        "the late readers started together",
        Duration::from_secs(10),
        || {
            let l = log_of(d);
            l.contains("start r3") && l.contains("start r4") && l.contains("start r5")
        },
    );
    for who in ["r3", "r4", "r5"] {
        go(d, who);
    }
    for r in late {
        r.wait().expect(0);
    }
    let l = log_of(d);
    let at = |what: &str| l.find(what).unwrap_or_else(|| panic!("{what}: {l}"));
    assert!(
        at("end r2") < at("start w") && at("end w") < at("start r3"),
        "{l}"
    );
    assert!(!redis.exists("lock:{job}") && queued(&redis) == 0);
}

#[test]
fn a_shared_holders_lost_lease_stops_its_command_before_the_lease_ends() {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = start_job(
        &redis.url(),
        dir.path(),
        &["--ttl", "2s", "--shared"],
        "exec sleep 60",
    );
    // The end of the run's own lease, read just before the fault.
    let before = Instant::now();
    let time: Vec<String> = redis.cmd(&["TIME"]);
    let now_ms = time[0].parse::<u64>().unwrap() * 1000 + time[1].parse::<u64>().unwrap() / 1000;
    let members: Vec<String> = redis.cmd(&["ZRANGE", "holders:{job}", "0", "-1", "WITHSCORES"]);
    let ends: u64 = members[1].parse::<f64>().unwrap() as u64;
    let expiry = before + Duration::from_millis(ends.saturating_sub(now_ms));
    redis.pause();
    assert!(
        wait_pid_exit(child, Duration::from_secs(10)),
        "the child was stopped"
    );
    let death = Instant::now();
    assert!(
        death < expiry,
        "the child died {:?} after its lease ended",
        death - expiry
    );
    eprintln!(
        "kill margin [shared, blackhole]: {:?} before the lease's end",
        expiry - death
    );
    let out = running.wait().expect(76);
    assert!(out.stderr.contains("lost the lock job"), "{}", out.stderr);
    redis.resume();
}

#[test]
fn release_force_frees_one_shared_holder_by_token_or_all() {
    let redis = Redis::start();
    let a = Holder::start(&redis, "job", &["--shared", "--renew-every", "200ms"]);
    let b = Holder::start(&redis, "job", &["--shared"]);
    let status = status_json(&redis.url(), "job");
    let token_a = status["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["pid"].as_i64() == Some(i64::from(a.pid())))
        .unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    lr().args([
        "release",
        "--force",
        "--token",
        &token_a,
        "-u",
        &redis.url(),
        "job",
    ])
    .run()
    .expect(0);
    // Its next renewal finds its lease gone: its command is stopped (76); b holds on.
    assert_eq!(a.running.wait().code(), Some(76));
    assert_eq!(
        status_json(&redis.url(), "job")["holders"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(redis.cmd::<String>(&["GET", "lock:{job}"]), "shared");
    lr().args(["release", "--force", "-u", &redis.url(), "job"])
        .run()
        .expect(0);
    assert!(
        !redis.exists("lock:{job}"),
        "the marker goes with the last holder"
    );
    b.finish();
}

#[test]
fn shared_is_refused_with_several_holders_no_fair_and_redlock() {
    lr().args([
        "-u",
        "redis://127.0.0.1:1",
        "--shared",
        "--holders",
        "2",
        "job",
        "true",
    ])
    .run()
    .expect_one_line(2, "--shared and --holders 2 do not go together");
    lr().args([
        "-u",
        "redis://127.0.0.1:1",
        "--shared",
        "--no-fair",
        "job",
        "true",
    ])
    .run()
    .expect_one_line(2, "--shared and --no-fair do not go together");
    lr().args([
        "-u",
        "redis://127.0.0.1:1",
        "-u",
        "redis://127.0.0.1:2",
        "-u",
        "redis://127.0.0.1:3",
    ])
    .args(["--shared", "job", "true"])
    .run()
    .expect_one_line(2, "--shared is for one Redis server");
}

/// Two shared holders at once on `url`, a run without --shared kept out meanwhile, and the
/// marker gone with the last of them (`primary` is the server that holds the keys).
fn two_readers_then_a_writer(url: &str, primary: &Redis) {
    let a = Holder::start_on(url, "job", &["--shared"]);
    let b = Holder::start_on(url, "job", &["--shared"]);
    assert_eq!(primary.cmd::<String>(&["GET", "lock:{job}"]), "shared");
    lr().url(url).args(["-n", "job", "true"]).run().expect(75);
    a.finish().expect(0);
    b.finish().expect(0);
    assert!(!primary.exists("lock:{job}"));
    lr().url(url).args(["-n", "job", "true"]).run().expect(0);
}

#[test]
fn through_sentinels_shared_runs_hold_together_on_the_primary() {
    let watched = Watched::start();
    two_readers_then_a_writer(&watched.url(), &watched.primary);
}

#[test]
fn in_a_cluster_shared_runs_hold_together_in_the_locks_slot() {
    let cluster = Cluster::start();
    let owner = cluster.owner("lock:{job}");
    two_readers_then_a_writer(&cluster.url(), owner);
}

#[test]
fn a_shared_min_hold_keeps_exclusive_runs_out_no_longer_than_the_hold() {
    let redis = Redis::start();
    lr().url(&redis.url())
        .args(["--shared", "--min-hold", "2s", "job", "true"])
        .run()
        .expect(0);
    // The marker lasts to the end of the hold, not the 30 s lease.
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
    assert!(pttl > 0 && pttl <= 2000, "{pttl}");
    let asked = Instant::now();
    lr().url(&redis.url())
        .args(["-w", "20s", "job", "true"])
        .run()
        .expect(0);
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
}

#[test]
fn a_marker_deleted_by_hand_is_put_back_before_an_exclusive_run_can_take_the_lock() {
    let redis = Redis::start();
    let reader = Holder::start(&redis, "job", &["--shared"]);
    let _: i64 = redis.cmd(&["DEL", "lock:{job}"]);
    lr().url(&redis.url())
        .args(["-n", "job", "true"])
        .run()
        .expect(75);
    assert_eq!(redis.cmd::<String>(&["GET", "lock:{job}"]), "shared");
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
    assert!(pttl > 0, "with the shared lease's expiry: {pttl}");
    reader.finish().expect(0);
    assert!(!redis.exists("lock:{job}"));
}
