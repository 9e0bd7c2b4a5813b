//! The holes a second hostile review found, one regression test each, with real processes: an
//! option read back from the command's environment, a give-back that lands late, an attempt
//! that lands after its waiter gave up, `--no-fair` among fair waiters, a semaphore's queue
//! that kept the dead, a place left behind by a waiter interrupted before any reply, and the
//! sweep that killed a daemon on its way out of the job's group.

use std::path::Path;
use std::time::Duration;

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

/// A child that appends `start FENCE NS PID`, holds the lock `$ARGV[1]` seconds, then appends
/// `end ...` (CLOCK_MONOTONIC; on SIGTERM it logs its end and exits), for `check_concurrency`.
const HOLD_FOR: &str = r#"
use Time::HiRes qw(clock_gettime CLOCK_MONOTONIC sleep);
my ($log, $secs) = @ARGV; my $f = $ENV{LOCKED_RUN_FENCE};
sub note { open(my $h, ">>", $log) or die; printf $h "%s %d %d %d\n", $_[0], $f, int(clock_gettime(CLOCK_MONOTONIC) * 1e9), $$; close $h; }
$SIG{TERM} = sub { note("end"); exit 143 };
note("start"); sleep($secs); note("end");
"#;

fn holding_for(log: &Path, secs: &str) -> Vec<String> {
    ["perl", "-e", HOLD_FOR, path_str(log), secs]
        .map(str::to_owned)
        .to_vec()
}

fn queued(redis: &Redis) -> i64 {
    redis.cmd(&["ZCARD", "queue:{job}"])
}

// See: issue 22, hole 1. `LOCKED_RUN_HOLDERS`, which a run puts in its command's environment,
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

// See: issue 22, hole 2. A grant that came too late was given back with a 1 s limit; when that
// timed out the run retried with the same token, the script said "already ours", the command
// started, and then the delayed compare-and-DEL deleted the lock, which another run took: two
// commands at once. Now a token whose give-back was not confirmed is never used again.
#[test]
fn a_late_give_back_cannot_delete_the_lock_the_same_run_took_again() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let log = dir.path().join("log");
    let timings = [
        "--ttl",
        "6s",
        "--renew-every",
        "1s",
        "--kill-after",
        "4500ms",
    ];
    let holder = Holder::start(&redis, "job", &timings);
    // A waits through the proxy; B, behind it, straight to the server.
    let a = lr()
        .url(&proxy.url())
        .args(timings)
        .job(holding_for(&log, "2.5"))
        .spawn();
    wait_until("A queued", Duration::from_secs(10), || queued(&redis) == 1);
    let b = lr()
        .url(&redis.url())
        .args(timings)
        .job(holding_for(&log, "0.2"))
        .spawn();
    wait_until("B queued", Duration::from_secs(10), || queued(&redis) == 2);
    // A's connection now takes 1.5 s to reach the server: its grant comes with 4.4 s of the
    // lease left, less than R + K, and is given back on the same slow connection.
    proxy.delay_requests_of_open_connections(Duration::from_millis(1500));
    holder.finish().expect(0);
    a.wait().expect(0);
    b.wait().expect(0);
    let (sections, most) = check_concurrency(&log, 1);
    assert_eq!(
        (sections, most),
        (2, 1),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
}

// See: issue 22, hole 3. A waiter SIGTERMed while its acquire was on its way gave back on a new
// connection; the old request landed afterwards and took the lock for a process that was gone.
#[test]
fn an_attempt_that_lands_after_its_waiter_ended_takes_nothing() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let holder = Holder::start(&redis, "job", &[]);
    let a = lr().url(&proxy.url()).job(["true"]).spawn();
    wait_until("A queued", Duration::from_secs(10), || queued(&redis) == 1);
    proxy.delay_requests_of_open_connections(Duration::from_millis(1500));
    // The release wakes A, whose attempt is held up on the way.
    holder.finish().expect(0);
    wait_until("A's attempt is on its way", Duration::from_secs(10), || {
        proxy.held() >= 1
    });
    signal(a.pid(), libc::SIGTERM);
    assert_eq!(a.wait().code(), Some(128 + libc::SIGTERM));
    wait_until(
        "the attempt reached the server",
        Duration::from_secs(10),
        || proxy.passed_late() >= 1,
    );
    assert!(
        !redis.exists("lock:{job}"),
        "the late attempt took the lock for a process that is gone"
    );
    assert_eq!(queued(&redis), 0, "nor a place in the queue");
    lr().url(&redis.url())
        .args(["-n", "job", "true"])
        .run()
        .expect(0);
}

// See: issue 22, hole 4. A `--no-fair` waiter ignored release messages that named the queue's
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

// See: issue 22, hole 5. With every slot of `--holders N` taken, lapsed places were never
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

// See: issue 22, hole 6. A waiter interrupted before the first reply came never left the queue
// ("joined" was recorded only from a reply): the next waiter started about 2 s late.
#[test]
fn a_waiter_interrupted_before_any_reply_leaves_the_queue() {
    let redis = Redis::start();
    // Loads the scripts, so that EVALSHA alone runs them behind the proxy.
    lr().url(&redis.url())
        .args(["other", "true"])
        .run()
        .expect(0);
    let holder = Holder::start(&redis, "job", &[]);
    let proxy = Proxy::start(redis.port);
    proxy.set(Mode::DropReplies);
    let a = lr().url(&proxy.url()).job(["true"]).spawn();
    wait_until("A queued, unanswered", Duration::from_secs(10), || {
        queued(&redis) == 1
    });
    signal(a.pid(), libc::SIGTERM);
    assert_eq!(a.wait().code(), Some(128 + libc::SIGTERM));
    assert_eq!(queued(&redis), 0, "A's place was left at once");
    holder.finish().expect(0);
}

// See: issue 22, hole 7. `setsid -f` returns before its child calls setsid(): when the job's
// main process exited first, the sweep stopped the daemon on its way out, silently. Now the
// sweep lets the group settle first, and says what it stops.
#[test]
fn the_sweep_lets_a_daemon_on_its_way_out_go_and_names_what_it_stops() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    // The daemon leaves the job's group 20 ms after the job's main process has exited.
    let out = lr()
        .url(&redis.url())
        .name("job")
        .sh(&format!(
            "sh -c 'sleep 0.02; exec setsid sleep 30 >/dev/null 2>&1 </dev/null' & echo $! > {d}/daemon; exit 0"
        ))
        .run()
        .expect(0);
    let daemon: i32 = std::fs::read_to_string(dir.path().join("daemon"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let survived = alive(daemon);
    signal(daemon, libc::SIGKILL);
    assert!(survived, "the daemon was stopped: {}", out.stderr);
    assert_eq!(out.stderr, "", "nothing was stopped, so nothing is said");

    // What stays in the group is stopped, and named at the default log level.
    let out = lr()
        .url(&redis.url())
        .name("job")
        .sh(&format!(
            "sleep 30 >/dev/null 2>&1 & echo $! > {d}/left; exit 0"
        ))
        .run()
        .expect(0);
    let left = std::fs::read_to_string(dir.path().join("left")).unwrap();
    assert!(!alive(left.trim().parse().unwrap()));
    assert!(
        out.stderr
            .contains(&format!("left processes behind: {} (sleep)", left.trim())),
        "{}",
        out.stderr
    );
}

// See: issue 22, review of the mends. A waiter whose heartbeat went unanswered retried with the
// same token (as it must: the lost attempt may have been granted), took the lock, ran and
// released; the lost attempt landed afterwards and took the lock again for a run that had
// ended. A run with an unanswered attempt now buries its token as it lets go.
#[test]
fn an_attempt_that_lands_after_its_run_released_takes_nothing() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let holder = Holder::start(&redis, "job", &["--ttl", "3s"]);
    // Attempts may take T/2 = 1.5 s; B's next heartbeat is held up 4 s on its way.
    let b = lr()
        .url(&proxy.url())
        .args(["--ttl", "3s"])
        .job(["true"])
        .spawn();
    wait_until("B queued", Duration::from_secs(10), || queued(&redis) == 1);
    proxy.delay_requests_of_open_connections(Duration::from_secs(4));
    wait_until(
        "B's heartbeat is on its way",
        Duration::from_secs(10),
        || proxy.held() >= 1,
    );
    holder.finish().expect(0);
    b.wait().expect(0);
    wait_until(
        "the heartbeat reached the server",
        Duration::from_secs(10),
        || proxy.passed_late() >= 1,
    );
    assert!(
        !redis.exists("lock:{job}"),
        "the late heartbeat took the lock again for a run that has ended"
    );
    lr().url(&redis.url())
        .args(["-n", "job", "true"])
        .run()
        .expect(0);
}

// See: issue 22, review of the mends. `status` counted the subscribers of the release channel
// as waiters, so a stopped (or vanished) waiter counted for as long as its connection lived.
#[test]
fn status_counts_live_places_not_subscribers() {
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &[]);
    let w = lr().url(&redis.url()).job(["true"]).spawn();
    wait_until("queued", Duration::from_secs(10), || queued(&redis) == 1);
    signal(w.pid(), libc::SIGSTOP);
    wait_until(
        "the stopped waiter's place lapsed",
        Duration::from_secs(8),
        || status_json(&redis.url(), "job")["waiters"] == 0,
    );
    signal(w.pid(), libc::SIGCONT);
    holder.finish().expect(0);
    w.wait().expect(0);
}
