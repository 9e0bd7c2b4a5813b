//! The lease clock pinned to the millisecond under `tokio::time::pause()`, with a scripted
//! renewer and a recorder in place of the child. T = 30 s, so R = 5 s, K = 10 s, D = 302 ms and
//! a grant sent at 0 is valid until V = 29 698 ms.

use super::*;
use std::cell::{Cell, RefCell};
use tokio::time::Instant;

const T: Duration = Duration::from_secs(30);

struct TestClock {
    start: Instant,
    /// Time that passed without the monotonic clock seeing it (a suspend).
    jump: Cell<Duration>,
    /// Wakes sleepers when the jump happens, as a CLOCK_BOOTTIME timer fires on resume.
    resumed: tokio::sync::Notify,
}

impl TestClock {
    fn suspend_for(&self, d: Duration) {
        self.jump.set(self.jump.get() + d);
        self.resumed.notify_waiters();
    }
}

impl Clock for TestClock {
    fn now(&self) -> Duration {
        self.start.elapsed() + self.jump.get()
    }

    async fn sleep_until(&self, deadline: Duration) {
        loop {
            let now = self.now();
            if now >= deadline {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(deadline - now) => {}
                () = self.resumed.notified() => {}
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Answer {
    Owner,
    NotOwner,
    Fail,
    Hang,
    SlowOwner(Duration),
}

struct Renewer<F: Fn(u64) -> Answer> {
    start: Instant,
    answer: F,
    /// (sent at ms, timeout ms)
    attempts: RefCell<Vec<(u64, u64)>>,
}

impl<F: Fn(u64) -> Answer> Renew for Renewer<F> {
    async fn renew(&self, timeout: Duration) -> Result<bool, String> {
        let at = ms(self.start.elapsed());
        self.attempts.borrow_mut().push((at, ms(timeout)));
        match (self.answer)(at) {
            Answer::Owner => Ok(true),
            Answer::NotOwner => Ok(false),
            Answer::Fail => Err("connection refused".into()),
            Answer::Hang => std::future::pending().await,
            Answer::SlowOwner(d) => {
                tokio::time::sleep(d).await;
                Ok(true)
            }
        }
    }
}

#[derive(Default)]
struct Recorder {
    start: Cell<Option<Instant>>,
    events: RefCell<Vec<(&'static str, u64, Why)>>,
}

impl Recorder {
    fn at(&self) -> u64 {
        ms(self.start.get().unwrap().elapsed())
    }
}

impl Stopper for Recorder {
    fn terminate(&self, why: Why) {
        self.events.borrow_mut().push(("term", self.at(), why));
    }
    fn kill(&self, why: Why) {
        self.events.borrow_mut().push(("kill", self.at(), why));
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

struct Run<F: Fn(u64) -> Answer> {
    clock: TestClock,
    renewer: Renewer<F>,
    stopper: Recorder,
    lease: RefCell<LeaseClock>,
}

fn setup<F: Fn(u64) -> Answer>(timings: Timings, answer: F) -> Run<F> {
    let start = Instant::now();
    let stopper = Recorder::default();
    stopper.start.set(Some(start));
    Run {
        clock: TestClock {
            start,
            jump: Cell::new(Duration::ZERO),
            resumed: tokio::sync::Notify::new(),
        },
        renewer: Renewer {
            start,
            answer,
            attempts: RefCell::new(Vec::new()),
        },
        stopper,
        lease: RefCell::new(LeaseClock::new(timings, Duration::ZERO)),
    }
}

impl<F: Fn(u64) -> Answer> Run<F> {
    /// Runs the keeper for `total` of virtual time; at `suspend.0` the boot clock jumps by
    /// `suspend.1` while the monotonic clock does not move (a suspended machine).
    async fn for_ms(&self, total: u64, suspend: Option<(u64, Duration)>) {
        let jump = async {
            if let Some((at, by)) = suspend {
                tokio::time::sleep(Duration::from_millis(at)).await;
                self.clock.suspend_for(by);
            }
            std::future::pending::<()>().await
        };
        tokio::select! {
            never = keep(&self.lease, &self.clock, &self.renewer, &self.stopper) => match never {},
            () = jump => {}
            () = tokio::time::sleep(Duration::from_millis(total)) => {}
        }
    }

    fn events(&self) -> Vec<(&'static str, u64, Why)> {
        self.stopper.events.borrow().clone()
    }

    fn attempts(&self) -> Vec<(u64, u64)> {
        self.renewer.attempts.borrow().clone()
    }
}

fn defaults() -> Timings {
    Timings::new(T, None, None).unwrap()
}

#[test]
fn defaults_follow_the_design() {
    let t = defaults();
    assert_eq!(t.renew_every, Duration::from_secs(5));
    assert_eq!(t.kill_after, Duration::from_secs(10));
    assert_eq!(t.drift, Duration::from_millis(302));
    // T - 2D - K - R = 30000 - 604 - 10000 - 5000
    assert_eq!(t.retry_window(), Duration::from_millis(14_396));
}

#[test]
fn timings_that_leave_no_retry_window_are_refused() {
    assert!(Timings::new(Duration::from_millis(99), None, None).is_err());
    assert!(Timings::new(Duration::from_millis(100), None, None).is_ok());
    assert!(Timings::new(T, Some(Duration::from_millis(9)), None).is_err());
    // R + K = T - 2D exactly is refused, a millisecond less is accepted.
    let t = Duration::from_secs(10);
    let d = Timings::drift_for(t); // 102 ms
    let budget = t - 2 * d;
    assert!(
        Timings::new(
            t,
            Some(Duration::from_secs(1)),
            Some(budget - Duration::from_secs(1))
        )
        .is_err()
    );
    assert!(
        Timings::new(
            t,
            Some(Duration::from_secs(1)),
            Some(budget - Duration::from_secs(1) - Duration::from_millis(1))
        )
        .is_ok()
    );
}

#[tokio::test(start_paused = true)]
async fn healthy_lease_renews_every_r_and_never_stops_the_child() {
    let run = setup(defaults(), |_| Answer::Owner);
    run.for_ms(60_001, None).await;
    assert!(run.events().is_empty());
    let sent: Vec<u64> = run.attempts().iter().map(|a| a.0).collect();
    assert_eq!(sent, (1..=12).map(|i| i * 5_000).collect::<Vec<_>>());
    assert!(run.attempts().iter().all(|&(_, timeout)| timeout == 2_500));
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_send_the_kill_signal_at_v_minus_d_minus_k_and_sigkill_at_v_minus_d() {
    let run = setup(defaults(), |_| Answer::Fail);
    run.for_ms(40_000, None).await;
    // V = 29698; V - D = 29396; V - D - K = 19396.
    assert_eq!(
        run.events(),
        [
            ("term", 19_396, Why::Expiring),
            ("kill", 29_396, Why::Expiring)
        ]
    );
    let attempts = run.attempts();
    assert_eq!(attempts[0].0, 5_000, "first renewal at R");
    assert_eq!(attempts[1].0, 5_020, "retried after a short back-off");
    // Back-off capped at R/4: retried, but never a spin.
    assert!(
        attempts.len() > 20 && attempts.len() < 40,
        "{} attempts",
        attempts.len()
    );
    assert!(attempts.windows(2).all(|w| w[1].0 - w[0].0 <= 1_250));
    assert_eq!(run.lease.borrow().last_error(), Some("connection refused"));
}

#[tokio::test(start_paused = true)]
async fn validity_counts_from_the_send_instant_not_the_reply() {
    // The renewal sent at 5000 is answered a second later; then the server is gone.
    let run = setup(defaults(), |at| {
        if at == 5_000 {
            Answer::SlowOwner(Duration::from_secs(1))
        } else {
            Answer::Fail
        }
    });
    run.for_ms(40_000, None).await;
    // V = 5000 + 29698 = 34698, so term at 24396 (25396 if counted from the reply).
    assert_eq!(
        run.events(),
        [
            ("term", 24_396, Why::Expiring),
            ("kill", 34_396, Why::Expiring)
        ]
    );
    assert_eq!(
        run.attempts()[1].0,
        10_000,
        "next renewal due at s + R, s the send instant"
    );
}

#[tokio::test(start_paused = true)]
async fn hung_attempts_time_out_within_the_validity_left() {
    let run = setup(defaults(), |_| Answer::Hang);
    run.for_ms(40_000, None).await;
    assert_eq!(
        run.events(),
        [
            ("term", 19_396, Why::Expiring),
            ("kill", 29_396, Why::Expiring)
        ]
    );
    let attempts = run.attempts();
    assert_eq!(attempts[0], (5_000, 2_500));
    assert_eq!(
        attempts[1],
        (7_520, 2_500),
        "timed out at 7500, retried 20 ms later"
    );
    for &(at, timeout) in &attempts {
        let left = 29_698u64.saturating_sub(at);
        let expected = if left == 0 { 2_500 } else { left.min(2_500) };
        assert_eq!(timeout, expected, "attempt at {at}: {attempts:?}");
    }
    assert!(
        attempts.iter().any(|&(_, timeout)| timeout < 2_500),
        "the last attempts are cut to V: {attempts:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn not_owner_stops_at_once_and_kills_k_later() {
    let run = setup(defaults(), |_| Answer::NotOwner);
    run.for_ms(40_000, None).await;
    assert_eq!(
        run.events(),
        [
            ("term", 5_000, Why::NotOwner),
            ("kill", 15_000, Why::NotOwner)
        ]
    );
    assert_eq!(run.attempts().len(), 1, "a lost lease is not renewed");
}

#[tokio::test(start_paused = true)]
async fn waking_past_v_minus_d_kills_at_once() {
    // Renewed at 5000 (V = 34698); at 6000 (monotonic) the machine resumes from a 40 s suspend.
    // The boot-clock timer fires on resume and finds V - D long past: SIGKILL at once, without
    // waiting for the next monotonic wake-up (the renewal due at 10000).
    let run = setup(defaults(), |_| Answer::Owner);
    run.for_ms(20_000, Some((6_000, Duration::from_secs(40))))
        .await;
    assert_eq!(run.events(), [("kill", 6_000, Why::Late)]);
    assert_eq!(run.attempts()[0].0, 5_000);
}

#[tokio::test(start_paused = true)]
async fn the_stop_is_final_and_its_sigkill_deadline_does_not_move() {
    // The server comes back at 20000, after the kill signal went out at 19396.
    let run = setup(defaults(), |at| {
        if at < 20_000 {
            Answer::Fail
        } else {
            Answer::Owner
        }
    });
    run.for_ms(40_000, None).await;
    assert_eq!(
        run.events(),
        [
            ("term", 19_396, Why::Expiring),
            ("kill", 29_396, Why::Expiring)
        ]
    );
    assert!(
        run.lease.borrow().valid_until() > Duration::from_millis(40_000),
        "renewal went on"
    );
}

#[tokio::test(start_paused = true)]
async fn an_outage_shorter_than_about_half_t_never_touches_the_child() {
    // Down from just before the renewal at 5000 for T/2 - 2D - one back-off step.
    let down = 4_999..(4_999 + 15_000 - 604 - 1_250);
    let run = setup(defaults(), move |at| {
        if down.contains(&at) {
            Answer::Fail
        } else {
            Answer::Owner
        }
    });
    run.for_ms(60_000, None).await;
    assert!(run.events().is_empty(), "{:?}", run.events());
}

#[tokio::test(start_paused = true)]
async fn without_grace_sigkill_comes_at_v_minus_d() {
    let timings = Timings::new(T, None, Some(Duration::ZERO)).unwrap();
    let run = setup(timings, |_| Answer::Fail);
    run.for_ms(40_000, None).await;
    assert_eq!(run.events(), [("kill", 29_396, Why::Expiring)]);
}

#[tokio::test(start_paused = true)]
async fn a_loss_found_after_the_kill_signal_keeps_the_sigkill_deadline() {
    // Renewals fail until 25000, then the server answers "not ours": SIGTERM went out at 19396,
    // the SIGKILL stays at V - D = 29396 rather than 25000 + K.
    let run = setup(defaults(), |at| {
        if at < 25_000 {
            Answer::Fail
        } else {
            Answer::NotOwner
        }
    });
    run.for_ms(40_000, None).await;
    assert_eq!(
        run.events(),
        [
            ("term", 19_396, Why::Expiring),
            ("kill", 29_396, Why::Expiring)
        ]
    );
}

#[test]
fn a_loss_seen_past_the_term_point_keeps_the_v_minus_d_deadline() {
    // The wrapper was starved across V - D - K; the "not ours" reply and the term point are
    // handled in the same step. SIGKILL must still come at V - D, not K after the reply.
    let mut lease = LeaseClock::new(defaults(), Duration::ZERO);
    lease.lost();
    let late = Duration::from_millis(25_000); // term point 19396, kill point 29396
    assert_eq!(lease.step(late, false), Step::Terminate(Why::NotOwner));
    assert_eq!(
        lease.stop(),
        Stop::Terminating {
            kill_at: Duration::from_millis(29_396)
        }
    );
    assert_eq!(
        lease.step(Duration::from_millis(29_396), false),
        Step::Kill(Why::NotOwner)
    );
}
