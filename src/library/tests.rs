//! The guard's lease keeping against a backend with scripted renewals, under paused time: it
//! renews every R, tells the task to stop at V − D − K when renewals fail and at once when the
//! lock is gone, and releases when asked or dropped.

use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::Error;
use super::guard::{Stop, keep};
use crate::backend::{Attempt, BackendError, Busy, Expiry, Holder};
use crate::lease::Timings;
use crate::session::fake::{Answer, Fake, TestClock};

const T: Duration = Duration::from_secs(30);

fn timings() -> Timings {
    Timings::new(T, None, None).unwrap()
}

fn failing(delay_ms: u64) -> Answer {
    Answer(
        Err(BackendError::Transient("connection refused".into())),
        Some(Duration::from_millis(delay_ms)),
    )
}

fn gone() -> Answer {
    let busy = Busy {
        holder: Holder::default(),
        expiry: Expiry::In(T),
    };
    Answer(Ok(Attempt::Busy(busy)), Some(Duration::ZERO))
}

type Release = oneshot::Sender<oneshot::Sender<Result<bool, Error>>>;

/// Keeps the fake's lease (granted at 0) on a task of this runtime; returns how to stop it.
fn keeping(
    fake: &'static Fake,
    clock: &'static TestClock,
) -> (watch::Receiver<Option<Stop>>, Release) {
    let (stop, stop_rx) = watch::channel(None);
    let (release, release_rx) = oneshot::channel();
    tokio::task::spawn_local(async move {
        let timeout = Duration::from_secs(5);
        keep(
            fake,
            clock,
            timings(),
            Duration::ZERO,
            &stop,
            release_rx,
            timeout,
        )
        .await;
    });
    (stop_rx, release)
}

fn leak<T>(value: T) -> &'static T {
    Box::leak(Box::new(value))
}

async fn in_local<F: std::future::Future<Output = ()>>(f: F) {
    tokio::task::LocalSet::new().run_until(f).await;
}

#[tokio::test(start_paused = true)]
async fn a_kept_lease_is_renewed_every_r_and_the_task_is_never_told_to_stop() {
    in_local(async {
        let (fake, clock) = (leak(Fake::new(vec![])), leak(TestClock::new()));
        let (stop, release) = keeping(fake, clock);
        tokio::time::sleep(T * 3).await;
        assert_eq!(*stop.borrow(), None);
        let renewals = fake.renewals();
        assert_eq!(renewals[..3], [5_000, 10_000, 15_000], "every R = T/6");
        assert!(renewals.len() >= 17, "{renewals:?}");
        let (reply, answer) = oneshot::channel();
        release.send(reply).unwrap();
        assert!(
            matches!(answer.await.unwrap(), Ok(true)),
            "released, and it was ours"
        );
        assert_eq!(fake.released().len(), 1);
    })
    .await;
}

/// With T = 30 s, D = 302 ms and K = 10 s, V = 29.698 s: the task is told at V − D − K =
/// 19.396 s, not a millisecond before, and only once.
#[tokio::test(start_paused = true)]
async fn failing_renewals_tell_the_task_to_stop_at_the_kill_point() {
    in_local(async {
        let fake = leak(Fake::new(vec![]).renewing((0..200).map(|_| failing(0)).collect()));
        let clock = leak(TestClock::new());
        let (mut stop, _release) = keeping(fake, clock);
        tokio::time::sleep(Duration::from_millis(19_395)).await;
        assert_eq!(*stop.borrow(), None, "not before V - D - K");
        stop.changed().await.unwrap();
        assert_eq!(clock.now_ms(), 19_396);
        assert_eq!(*stop.borrow(), Some(Stop::Expiring));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_lock_found_gone_tells_the_task_at_once() {
    in_local(async {
        let fake = leak(Fake::new(vec![]).renewing(vec![gone()]));
        let clock = leak(TestClock::new());
        let (mut stop, _release) = keeping(fake, clock);
        stop.changed().await.unwrap();
        assert_eq!(clock.now_ms(), 5_000, "at the first renewal, R = 5 s");
        assert_eq!(*stop.borrow(), Some(Stop::Lost));
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_releases_all_the_same() {
    in_local(async {
        let (fake, clock) = (leak(Fake::new(vec![])), leak(TestClock::new()));
        let (_stop, release) = keeping(fake, clock);
        tokio::time::sleep(Duration::from_secs(7)).await;
        drop(release);
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(fake.released(), [7_000]);
        tokio::time::sleep(T).await;
        assert_eq!(fake.renewals(), [5_000], "no renewal after the release");
    })
    .await;
}
