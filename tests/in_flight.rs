//! Requests still in flight when a run moves on: an attempt, a heartbeat or a give-back held
//! up on its way to the server (a fault proxy delays it), or one whose reply never comes. What
//! lands after its waiter ended, or after its run released, takes nothing; a give-back that
//! lands late cannot delete the lock the same run took since; a waiter interrupted before any
//! reply leaves no place in the queue.

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

// See: commit bce488f. A grant that came too late was given back with a 1 s limit; when that
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

// See: commit bce488f. A waiter SIGTERMed while its acquire was on its way gave back on a new
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

// See: commit bce488f. A waiter interrupted before the first reply came never left the queue
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

// See: commit bd8102f. A waiter whose heartbeat went unanswered retried with the
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
