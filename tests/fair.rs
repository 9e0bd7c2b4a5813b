//! Fair waiting on Redis, beyond what the conformance suite's `fair` and `dead_waiter` ask of
//! every backend: a drained queue leaves no key behind, a SIGKILLed waiter's place lapses even
//! while every slot of `--holders N` is taken, a waiter that gives up leaves at once,
//! `--no-fair` waiters race among themselves but never past a fair waiter that came first,
//! and Redlock keeps no queue.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;

/// A waiter named `who` whose command logs `start WHO NS` and `end WHO NS` (CLOCK_REALTIME).
fn waiter(url: &str, log: &Path, who: &str, extra: &[&str]) -> Running {
    let mut cmd = locked_run();
    cmd.args(["-u", url])
        .args(extra)
        .arg("job")
        .args(sh(&format!(
            "echo start {who} $(date +%s%N) >> {l}; sleep 0.05; echo end {who} $(date +%s%N) >> {l}",
            l = path_str(log)
        )));
    spawn(cmd)
}

/// Once the queue drains, nothing of it is left on the server: neither the queue nor its
/// keep-alive scores (the order itself is the conformance suite's `fair`).
#[test]
fn a_drained_queue_leaves_no_key_behind() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = Holder::start(&redis, "job", &[]);
    let mut waiters = Vec::new();
    for i in 1..=2 {
        waiters.push(waiter(&redis.url(), &log, &format!("w{i}"), &[]));
        wait_until("the waiter queued", Duration::from_secs(10), || {
            queued(&redis) == i
        });
    }
    assert!(redis.exists("queue-alive:{job}"), "kept while they wait");
    assert_eq!(holder.finish().code(), Some(0));
    for w in waiters {
        assert_eq!(w.wait().code(), Some(0));
    }
    assert!(!redis.exists("queue:{job}"), "the queue is gone");
    assert!(
        !redis.exists("queue-alive:{job}"),
        "and its keep-alive scores"
    );
}

// See: commit bce488f. With every slot of `--holders N` taken, lapsed places were never
// dropped: SIGKILLed waiters stayed in the queue (and in `status`) as long as the slots did.
#[test]
fn the_places_of_killed_waiters_lapse_while_every_slot_is_taken() {
    let redis = Redis::start();
    let holders = ["--holders", "2"];
    let held = [
        Holder::start(&redis, "job", &holders),
        Holder::start(&redis, "job", &holders),
    ];
    let doomed: Vec<Running> = (0..5)
        .map(|_| lr().url(&redis.url()).args(holders).job(["true"]).spawn())
        .collect();
    wait_until("five waiters queued", Duration::from_secs(10), || {
        queued(&redis) == 5
    });
    for running in &doomed {
        signal(running.pid(), libc::SIGKILL);
    }
    for running in doomed {
        assert_eq!(running.wait().code(), None);
    }
    // A live waiter's keep-alive drops the dead places once theirs ended (2 s).
    let live = lr().url(&redis.url()).args(holders).job(["true"]).spawn();
    wait_until(
        "only the live waiter is queued",
        Duration::from_secs(8),
        || queued(&redis) == 1,
    );
    let status = status_json(&redis.url(), "job");
    assert_eq!(status["waiters"], 1, "status counts the live: {status}");
    for holder in held {
        holder.finish().expect(0);
    }
    live.wait().expect(0);
}

#[test]
fn a_waiter_that_gives_up_leaves_the_queue_at_once() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = Holder::start(&redis, "job", &[]);
    let impatient = waiter(&redis.url(), &log, "impatient", &["-w", "500ms"]);
    wait_until("impatient queued", Duration::from_secs(10), || {
        queued(&redis) == 1
    });
    let patient = waiter(&redis.url(), &log, "patient", &[]);
    wait_until("patient queued", Duration::from_secs(10), || {
        queued(&redis) == 2
    });
    let out = impatient.wait();
    assert_eq!(out.code(), Some(75), "{out:?}");
    assert_eq!(queued(&redis), 1, "it left the queue when it gave up");
    assert_eq!(holder.finish().code(), Some(0));
    let released = Instant::now();
    wait_for_file(&log, Duration::from_secs(10), |t| {
        t.contains("start patient")
    });
    let after = released.elapsed();
    assert!(
        after < Duration::from_millis(1_000),
        "the one behind waited {after:?}: the place of the one that left did not lapse first"
    );
    assert_eq!(patient.wait().code(), Some(0));
}

#[test]
fn a_holder_using_the_plain_protocol_is_waited_for() {
    let redis = Redis::start();
    let _: String = redis.cmd(&["SET", "lock:{job}", "python-worker-7", "NX", "PX", "60000"]);
    let dir = scratch();
    let log = dir.path().join("log");
    let w = waiter(&redis.url(), &log, "w", &[]);
    wait_until("queued", Duration::from_secs(10), || queued(&redis) == 1);
    assert!(!log.exists(), "it waits for the other program's lock");
    let _: i64 = redis.cmd(&["DEL", "lock:{job}"]);
    assert_eq!(w.wait().code(), Some(0));
    assert!(std::fs::read_to_string(&log).unwrap().contains("start w"));
}

#[test]
fn no_fair_waiters_queue_as_racers_and_redlock_keeps_no_queue() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = Holder::start(&redis, "job", &[]);
    let w = waiter(&redis.url(), &log, "w", &["--no-fair"]);
    wait_until("the waiter queued", Duration::from_secs(10), || {
        queued(&redis) == 1
    });
    let members: Vec<String> = redis.cmd(&["ZRANGE", "queue:{job}", "0", "-1"]);
    assert!(
        members[0].starts_with('~'),
        "a --no-fair waiter's place is a racer's: {members:?}"
    );
    assert_eq!(holder.finish().code(), Some(0));
    assert_eq!(w.wait().code(), Some(0));

    // Redlock: independent servers would order their queues differently; it races.
    let five = Five::start();
    let holder = Holder::with(lr().on(&five), "job");
    let mut cmd = locked_run_on(&five);
    cmd.args(["job", "true"]);
    let waiter = spawn(cmd);
    wait_until(
        "the Redlock waiter listens",
        Duration::from_secs(10),
        || five.servers.iter().all(|r| subscribers(r, "job") == 1),
    );
    for server in &five.servers {
        assert!(
            !server.exists("queue:{job}"),
            "no queue on a Redlock server"
        );
    }
    assert_eq!(holder.finish().code(), Some(0));
    assert_eq!(waiter.wait().code(), Some(0));
}

// See: commit bce488f. A `--no-fair` waiter ignored release messages that named the queue's
// head and slept for the holder's whole lease, while fair waiters that came after it went.
#[test]
fn a_no_fair_waiter_is_not_passed_by_fair_waiters_that_came_after_it() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = Holder::start(&redis, "job", &[]);
    let waiter = |who: &str, extra: &[&str]| {
        lr().url(&redis.url())
            .args(extra)
            .name("job")
            .sh(&format!(
                "echo {who} >> {l}; sleep 0.05",
                l = path_str(&log)
            ))
            .spawn()
    };
    // Each has asked once, and listens, before the next one comes.
    let server = &redis;
    let listening = |n: i64| move || subscribers(server, "job") == n;
    let first = waiter("fair-1", &[]);
    wait_until("fair-1 waits", Duration::from_secs(10), listening(1));
    let racer = waiter("racer", &["--no-fair"]);
    wait_until("the racer waits", Duration::from_secs(10), listening(2));
    let second = waiter("fair-2", &[]);
    wait_until("fair-2 waits", Duration::from_secs(10), listening(3));
    holder.finish().expect(0);
    for running in [first, racer, second] {
        running.wait().expect(0);
    }
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "fair-1\nracer\nfair-2\n",
        "served in arrival order"
    );
}

/// Racers go in any order among themselves, but a fair waiter that came first goes before
/// all of them, and one that came after them waits for them all: a release wakes only racers
/// that may take the lock, and a racer that is woken never takes it past a fair waiter.
#[test]
fn racers_between_fair_waiters_go_in_any_order_but_never_past_one() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = Holder::start(&redis, "job", &[]);
    let arrivals = [
        ("fair-1", &[][..]),
        ("racer-1", &["--no-fair"][..]),
        ("racer-2", &["--no-fair"]),
        ("racer-3", &["--no-fair"]),
        ("racer-4", &["--no-fair"]),
        ("fair-2", &[]),
        ("racer-5", &["--no-fair"]),
        ("racer-6", &["--no-fair"]),
    ];
    let mut waiting = Vec::new();
    for (i, (who, extra)) in arrivals.iter().enumerate() {
        waiting.push(
            lr().url(&redis.url())
                .args(*extra)
                .name("job")
                .sh(&format!("echo {who} >> {}", path_str(&log)))
                .spawn(),
        );
        wait_until("the waiter queued", Duration::from_secs(10), || {
            queued(&redis) == i as i64 + 1
        });
    }
    holder.finish().expect(0);
    for running in waiting {
        running.wait().expect(0);
    }
    let order = std::fs::read_to_string(&log).unwrap();
    let order: Vec<&str> = order.lines().collect();
    let mut between = order[1..5].to_vec();
    between.sort();
    let mut last = order[6..].to_vec();
    last.sort();
    assert_eq!(
        (order[0], between, order[5], last),
        (
            "fair-1",
            vec!["racer-1", "racer-2", "racer-3", "racer-4"],
            "fair-2",
            vec!["racer-5", "racer-6"]
        ),
        "{order:?}"
    );
}
