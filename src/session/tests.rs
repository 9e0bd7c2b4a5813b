//! Waiting under paused time against a backend with scripted answers: each test pins one
//! decision of the waiter (what it sends, when, with which token, and how it ends), and fails
//! when that behaviour is broken. T = 30 s, R = 5 s, K = 10 s, D = 302 ms.

use std::time::Duration;

use crate::backend::{Attempt, BackendError, Busy, Expiry, Holder, KEEP_ALIVE, Mode, Wakeup};
use crate::plumbing::exit::Exit;
use crate::session::config::Patience;

use super::acquire::acquire;
use super::fake::{Answer, Fake, Seen, SignalAt, TestClock, after, config};

fn busy(expiry_ms: u64) -> Result<Attempt, BackendError> {
    Ok(Attempt::Busy(Busy {
        holder: Holder::default(),
        expiry: Expiry::In(Duration::from_millis(expiry_ms)),
    }))
}

fn granted(fence: u64) -> Result<Attempt, BackendError> {
    Ok(Attempt::Acquired { fence })
}

fn lost() -> Result<Attempt, BackendError> {
    Err(BackendError::Transient("no answer within 5s".into()))
}

#[tokio::test(start_paused = true)]
async fn a_release_message_wakes_the_waiter_long_before_the_holders_expiry() {
    let fake = Fake::new(vec![after(1, busy(20_000)), after(1, granted(7))]);
    let cfg = config(Patience::Forever);
    let clock = TestClock::new();
    let mut signals = SignalAt::never();
    let waiting = acquire(&fake, &clock, cfg.wait(), &mut signals);
    let publish = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        fake.publish(Wakeup::Anyone);
    };
    let (acquired, ()) = tokio::join!(waiting, publish);
    let acquired = acquired.expect("acquired");
    assert_eq!(acquired.fence, 7);
    let attempts = fake.attempts();
    assert_eq!(attempts.len(), 2);
    assert_eq!(
        attempts[1].0, 500,
        "asked again at the release, not at the expiry"
    );
    assert_eq!(acquired.waited, Duration::from_millis(500));
}

#[tokio::test(start_paused = true)]
async fn another_waiters_turn_does_not_wake_this_one() {
    let fake = Fake::new(vec![after(1, busy(3_000)), after(1, granted(2))]);
    let cfg = config(Patience::Forever);
    let clock = TestClock::new();
    let mut signals = SignalAt::never();
    let waiting = acquire(&fake, &clock, cfg.wait(), &mut signals);
    let publish = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        fake.publish(Wakeup::Turn("someone-else".into()));
        fake.publish(Wakeup::Race);
    };
    let (acquired, ()) = tokio::join!(waiting, publish);
    acquired.expect("acquired");
    let second = fake.attempts()[1].0;
    assert!(
        (3_001..=3_100).contains(&second),
        "slept to the holder's expiry plus jitter: {second} ms"
    );
}

#[tokio::test(start_paused = true)]
async fn a_subscription_that_did_not_cover_the_last_attempt_forces_a_retry() {
    let fake = Fake::new(vec![after(1, busy(20_000)), after(1, granted(3))]).covering(&[false]);
    let cfg = config(Patience::Forever);
    let clock = TestClock::new();
    let acquired = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never()).await;
    acquired.expect("acquired");
    let seen = fake.seen.borrow().clone();
    assert!(
        matches!(
            &seen[..],
            [
                Seen::Attempt { at: 0, .. },
                Seen::Subscribed { at: 1 },
                Seen::Attempt { at: 1, .. }
            ]
        ),
        "asked again at once, not after a nap: {seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_queued_waiter_keeps_its_place_alive_with_heartbeats() {
    let mut answers = vec![after(1, busy(30_000))];
    answers.extend((0..10).map(|_| after(1, busy(30_000))));
    let fake = Fake::new(answers);
    fake.queued.set(true);
    let cfg = config(Patience::For(Duration::from_secs(3)));
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("gave up");
    assert_eq!(failure.exit, Exit::Conflict);
    let attempts = fake.attempts();
    assert!(attempts.len() >= 4, "{attempts:?}");
    for pair in attempts.windows(2) {
        let gap = pair[1].0 - pair[0].0;
        assert!(
            // The nap, plus the 1 ms each scripted answer takes.
            gap <= (KEEP_ALIVE / 3).as_millis() as u64 + 2,
            "a heartbeat every keep-alive/3 at most: {attempts:?}"
        );
    }
    assert_eq!(
        fake.gave_back().len(),
        1,
        "the place is left on the way out"
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_grant_is_given_back_and_the_next_attempt_carries_a_fresh_token() {
    // The grant takes 16 s to come: 13.7 s of the lease are left, less than R + K = 15 s.
    let fake = Fake::new(vec![
        after(1, busy(1_000)),
        after(16_000, granted(4)),
        after(1, granted(5)),
    ]);
    let cfg = config(Patience::Forever);
    let clock = TestClock::new();
    let acquired = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect("acquired");
    assert_eq!(acquired.fence, 5);
    let attempts = fake.attempts();
    let gave_back = fake.gave_back();
    assert_eq!(gave_back.len(), 1, "{:?}", fake.seen.borrow());
    assert_eq!(gave_back[0].1, attempts[1].1, "the late grant's token");
    assert_ne!(attempts[2].1, attempts[1].1, "never used again");
    assert!(gave_back[0].0 < attempts[2].0);
}

#[tokio::test(start_paused = true)]
async fn a_grant_is_taken_only_with_time_to_start_the_command_even_when_r_is_below_d() {
    // T = 2 s, R = 10 ms below D = 22 ms, K = 1945 ms. A grant 5 ms after its send leaves
    // 1973 ms of the lease: more than R + K, yet past the point where the command may still
    // start (V - D - K, 11 ms after the send) less R. Given back; the next, 1 ms, is taken.
    let fake = Fake::new(vec![
        after(1, busy(1_000)),
        after(5, granted(4)),
        after(1, granted(5)),
    ]);
    let mut cfg = config(Patience::Forever);
    cfg.timings = crate::lease::Timings::new(
        Duration::from_secs(2),
        Some(Duration::from_millis(10)),
        Some(Duration::from_millis(1945)),
    )
    .expect("valid timings");
    let clock = TestClock::new();
    let acquired = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect("acquired");
    assert_eq!(acquired.fence, 5);
    assert_eq!(fake.gave_back().len(), 1, "{:?}", fake.seen.borrow());
}

#[tokio::test(start_paused = true)]
async fn a_late_grant_at_the_first_contact_is_unavailable() {
    let fake = Fake::new(vec![after(16_000, granted(1))]);
    let cfg = config(Patience::Forever);
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("69");
    assert_eq!(failure.exit, Exit::Unavailable);
    assert!(
        failure.message.contains("took 16s to grant"),
        "{}",
        failure.message
    );
    // Given back once for the grant, and once more on the way out (the fresh token's
    // unanswered attempts: none, but the grant's error counts as one).
    assert!(!fake.gave_back().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_lost_reply_is_given_back_on_the_way_out() {
    // Busy; then a reply lost (the server may have granted it); busy again; -w runs out.
    let fake = Fake::new(vec![
        after(1, busy(200)),
        after(1, lost()),
        after(1, busy(60_000)),
        after(1, busy(60_000)),
    ]);
    let cfg = config(Patience::For(Duration::from_secs(1)));
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("gave up");
    assert_eq!(failure.exit, Exit::Conflict, "{}", failure.message);
    let gave_back = fake.gave_back();
    assert_eq!(gave_back.len(), 1);
    assert_eq!(gave_back[0].0, 1_000, "at the deadline");
    assert_eq!(
        gave_back[0].1,
        fake.attempts()[1].1,
        "the token of the lost reply"
    );
}

// See: issue 35, item 5. A first contact that never reached the server (refused, a password
// refused) gave back, failed again, and its line talked of giving back what was never held.
#[tokio::test(start_paused = true)]
async fn a_first_contact_that_reached_nothing_gives_nothing_back_and_says_nothing_was_taken() {
    let unreached = BackendError::Transient("cannot reach Redis at redis://h".into()).unsent();
    for answer in [
        unreached,
        BackendError::Refused("WRONGPASS".into()).unsent(),
    ] {
        let fake = Fake::new(vec![after(1, Err(answer))]);
        let cfg = config(Patience::Forever);
        let failure = acquire(&fake, &TestClock::new(), cfg.wait(), &mut SignalAt::never())
            .await
            .expect_err("unreachable");
        assert_eq!(failure.exit, Exit::Unavailable, "{}", failure.message);
        assert!(fake.gave_back().is_empty(), "nothing to give back");
        assert!(
            failure
                .message
                .ends_with("; nothing was run and nothing was taken"),
            "{}",
            failure.message
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_reply_lost_is_given_back_and_then_nothing_was_taken() {
    let fake = Fake::new(vec![after(1, lost())]);
    let cfg = config(Patience::Forever);
    let failure = acquire(&fake, &TestClock::new(), cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("unreachable");
    assert_eq!(
        fake.gave_back().len(),
        1,
        "the lost reply may have taken it"
    );
    assert_eq!(
        failure.message,
        "no answer within 5s; nothing was run and nothing was taken"
    );
}

/// Issue 45's review: an etcd whose HTTP/2 send window is 0 granted the first request (sent
/// before its settings came) and none after; the take went unanswered, the give-back revoked
/// the lease, and the line ended "nothing was run", short of what it says when nothing was
/// taken: that nothing is held.
#[tokio::test(start_paused = true)]
async fn a_first_reply_lost_then_given_back_says_nothing_is_held() {
    let fake = Fake::new(vec![after(1, lost())]);
    fake.gives_back.set(true);
    let cfg = config(Patience::Forever);
    let failure = acquire(&fake, &TestClock::new(), cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("unreachable");
    assert_eq!(fake.gave_back().len(), 1);
    assert_eq!(
        failure.message,
        "no answer within 5s; nothing was run and nothing is held"
    );
}

#[tokio::test(start_paused = true)]
async fn a_signal_during_an_unanswered_attempt_gives_it_back() {
    let fake = Fake::new(vec![after(1, busy(200)), Answer(granted(9), None)]);
    let cfg = config(Patience::Forever);
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::after(1_000))
        .await
        .expect_err("interrupted");
    assert_eq!(failure.exit, Exit::Interrupted(libc::SIGTERM));
    assert_eq!(
        fake.gave_back(),
        vec![(1_000, fake.attempts()[1].1.clone())]
    );
}

#[tokio::test(start_paused = true)]
async fn a_no_wait_run_that_finds_the_lock_busy_is_a_quiet_conflict_and_gives_nothing_back() {
    let fake = Fake::new(vec![after(1, busy(5_000))]);
    let cfg = config(Patience::NoWait);
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("75");
    assert_eq!(failure.exit, Exit::Conflict);
    assert!(failure.quiet);
    assert!(
        fake.gave_back().is_empty(),
        "nothing to give back: one round trip"
    );
    assert!(
        !fake
            .seen
            .borrow()
            .iter()
            .any(|s| matches!(s, Seen::Subscribed { .. }))
    );
}

#[tokio::test(start_paused = true)]
async fn lost_contact_is_retried_with_back_off_until_the_deadline() {
    let mut answers = vec![after(1, busy(100))];
    answers.extend((0..20).map(|_| after(1, lost())));
    let fake = Fake::new(answers);
    let cfg = config(Patience::For(Duration::from_secs(2)));
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("69");
    assert_eq!(failure.exit, Exit::Unavailable);
    assert!(
        failure
            .message
            .starts_with("gave up waiting for lock job after 2s")
    );
    let at: Vec<u64> = fake.attempts().iter().map(|a| a.0).collect();
    // 100 ms (+ jitter) to the expiry, then 50, 100, 200, 400, 800 ms of back-off.
    assert!(at.len() >= 5 && at.len() <= 8, "{at:?}");
    for pair in at[1..].windows(2) {
        assert!(pair[1] - pair[0] >= 50, "no busy loop: {at:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_with_other_holders_is_a_usage_error() {
    let fake = Fake::new(vec![after(
        1,
        Ok(Attempt::Mismatch {
            theirs: Mode::Holders(3),
        }),
    )]);
    let cfg = config(Patience::Forever);
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("2");
    assert_eq!(failure.exit, Exit::Usage);
    assert!(failure.message.contains("--holders 3"));
}

/// `Job::start` of `program` with `start_by`, on a lock just granted; what it failed with,
/// and everything the backend was asked.
async fn start_failing(
    program: &str,
    start_by: Option<Duration>,
) -> (crate::plumbing::exit::Failure, Vec<Seen>) {
    let fake = Fake::new(vec![]);
    let cfg = config(Patience::Forever);
    let acquired = super::waiter::Acquired {
        fence: 1,
        sent: Duration::ZERO,
        waited: Duration::ZERO,
    };
    let program = std::path::Path::new(program);
    let failure = super::job::Job::start(&fake, &cfg, program, &acquired, start_by, None)
        .await
        .err()
        .expect("nothing starts");
    let seen = fake.seen.borrow().clone();
    (failure, seen)
}

#[tokio::test(start_paused = true)]
async fn a_spawn_that_fails_releases_the_lock_before_its_failure() {
    let (failure, seen) = start_failing("/nonexistent/locked-run-test-program", None).await;
    assert_eq!(failure.exit, Exit::NotFound);
    assert!(
        matches!(&seen[..], [Seen::Released { .. }]),
        "released, and nothing else: {seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_start_past_the_kill_point_runs_nothing_and_releases_the_lock() {
    // A real program: only the start-by point stops it.
    let (failure, seen) = start_failing("/bin/true", Some(Duration::ZERO)).await;
    assert_eq!(failure.exit, Exit::Lost);
    assert!(
        failure
            .message
            .starts_with("lost the lock job before the command could start"),
        "{}",
        failure.message
    );
    assert!(
        matches!(&seen[..], [Seen::Released { .. }]),
        "released, and nothing else: {seen:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_broken_subscription_is_made_again_at_once_the_first_time() {
    let fake = Fake::new(vec![
        after(1, busy(20_000)),
        after(1, busy(20_000)),
        after(1, granted(3)),
    ]);
    let cfg = config(Patience::Forever);
    let clock = TestClock::new();
    let mut signals = SignalAt::never();
    let waiting = acquire(&fake, &clock, cfg.wait(), &mut signals);
    let faults = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        fake.break_subscription();
        tokio::time::sleep(Duration::from_millis(200)).await;
        fake.publish(Wakeup::Anyone);
    };
    let (acquired, ()) = tokio::join!(waiting, faults);
    assert_eq!(acquired.expect("acquired").fence, 3);
    let at: Vec<u64> = fake.attempts().iter().map(|a| a.0).collect();
    // Asked again at the break, listening again at once: the release at 500 ms wakes it
    // (not its next poll, 2 s later).
    assert_eq!(at, [0, 300, 500], "{:?}", fake.seen.borrow());
    let subscribed = fake
        .seen
        .borrow()
        .iter()
        .filter(|s| matches!(s, Seen::Subscribed { .. }))
        .count();
    assert_eq!(subscribed, 2);
}

#[tokio::test(start_paused = true)]
async fn a_wait_ends_at_its_deadline_though_an_attempt_is_unanswered() {
    let fake = Fake::new(vec![after(0, busy(100)), Answer(lost(), None)]);
    let cfg = config(Patience::For(Duration::from_secs(2)));
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("69");
    assert_eq!(failure.exit, Exit::Unavailable);
    assert!(
        failure
            .message
            .contains("after 2s: the last attempt was not answered before the wait ran out"),
        "{}",
        failure.message
    );
    // At the deadline, not at the attempt's own timeout; what it may have taken is given back.
    assert_eq!(
        crate::plumbing::clock::Clock::now(&clock),
        Duration::from_secs(2)
    );
    assert_eq!(fake.gave_back().len(), 1);
}

/// An attempt sent a moment before the deadline, unanswered when it comes, is no news of the
/// server: the lock was busy, as the answer before said (75), and what the attempt may have
/// taken is given back all the same.
#[tokio::test(start_paused = true)]
async fn an_attempt_sent_just_before_the_deadline_leaves_the_wait_busy() {
    // Answered in 20 ms; the next attempt goes 1900 ms and a jitter of at most 38 ms after
    // it, 42-79 ms before the deadline: within 4 x 20 + 50 ms.
    let fake = Fake::new(vec![after(20, busy(1_900)), Answer(lost(), None)]);
    let cfg = config(Patience::For(Duration::from_secs(2)));
    let clock = TestClock::new();
    let failure = acquire(&fake, &clock, cfg.wait(), &mut SignalAt::never())
        .await
        .expect_err("75");
    assert_eq!(failure.exit, Exit::Conflict, "{}", failure.message);
    assert!(
        failure.message.contains("after 2s: it is"),
        "{}",
        failure.message
    );
    assert_eq!(
        crate::plumbing::clock::Clock::now(&clock),
        Duration::from_secs(2)
    );
    assert_eq!(fake.gave_back().len(), 1);
}
