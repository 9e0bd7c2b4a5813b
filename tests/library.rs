//! The library API: two locks taking turns as their leases run out, with growing fences and a
//! release that says whether it still owned the lease; and interoperation with any program that
//! uses the plain SET NX PX / INCR protocol.

use std::time::Duration;

use locked_run::Lock;

use crate::support::*;

#[tokio::test(flavor = "current_thread")]
async fn two_locks_take_turns_as_leases_run_out_with_growing_fences() {
    let redis = Redis::start();
    let ttl = Duration::from_millis(200);
    let a = Lock::new(&redis.url(), "seat-42", ttl).unwrap();
    let b = Lock::new(&redis.url(), "seat-42", ttl).unwrap();

    assert_eq!(
        a.acquire().await.unwrap(),
        Some(1),
        "A acquires with fence 1"
    );
    assert_eq!(
        b.acquire().await.unwrap(),
        None,
        "B cannot while A holds it"
    );

    tokio::time::sleep(Duration::from_millis(300)).await; // A's lease runs out
    assert_eq!(
        b.acquire().await.unwrap(),
        Some(2),
        "B acquires with fence 2"
    );
    assert!(
        !a.extend().await.unwrap(),
        "A's extend says it is no longer the owner"
    );
    assert!(
        !a.release().await.unwrap(),
        "A's release says it was not the owner"
    );
    assert_eq!(
        redis.get("lock:{seat-42}").as_deref(),
        Some(b.token().as_str()),
        "B's lock is untouched"
    );

    assert!(b.extend().await.unwrap());
    assert!(b.release().await.unwrap());
    assert!(!redis.exists("lock:{seat-42}"));
}

#[test]
fn another_program_using_the_plain_protocol_interoperates() {
    let redis = Redis::start();
    // What a program in another language does: SET NX PX and INCR.
    let _: String = redis.cmd(&["SET", "lock:{job}", "python-worker-7", "NX", "PX", "60000"]);
    let _: i64 = redis.cmd(&["INCR", "fence:{job}"]);
    lr().url(&redis.url())
        .arg("-n")
        .job(["true"])
        .run()
        .expect_with(75, "its lock is respected");

    let _: i64 = redis.cmd(&["DEL", "lock:{job}"]);
    let out = lr()
        .url(&redis.url())
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run();
    assert_eq!(
        out.stdout.trim(),
        "2",
        "its fence counter is shared: {out:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_retry_recognises_its_own_grant() {
    // As when the reply to the first acquire was lost: the same token asks again.
    let redis = Redis::start();
    let lock = Lock::new(&redis.url(), "job", Duration::from_secs(10)).unwrap();
    assert_eq!(lock.acquire().await.unwrap(), Some(1));
    assert_eq!(
        lock.acquire().await.unwrap(),
        Some(1),
        "ours, with our fence, not busy"
    );
    assert_eq!(
        redis.get("fence:{job}").as_deref(),
        Some("1"),
        "no second fence used"
    );
}

/// One owner of the lease length: the lock's own timings, checked as `--ttl` is. A lease
/// shorter than the lease clock can keep (here 50 ms; at least 100 ms) is refused rather than
/// used. (A regression test: the library once let its TTL and the run's timings disagree.)
#[test]
fn a_lease_too_short_to_keep_is_refused() {
    let err = Lock::new("redis://127.0.0.1:1", "job", Duration::from_millis(50))
        .err()
        .expect("refused");
    assert!(matches!(err, locked_run::Error::Usage(_)), "{err}");
    assert!(err.to_string().contains("too short"), "{err}");
}

#[tokio::test(flavor = "current_thread")]
async fn the_server_is_given_the_locks_own_lease() {
    let redis = Redis::start();
    let lock = Lock::new(&redis.url(), "job", Duration::from_secs(3)).unwrap();
    assert_eq!(lock.ttl(), Duration::from_secs(3));
    assert_eq!(lock.acquire().await.unwrap(), Some(1));
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
    assert!((2_000..=3_000).contains(&pttl), "{pttl}");
    let _: i64 = redis.cmd(&["PEXPIRE", "lock:{job}", "500"]);
    assert!(lock.extend().await.unwrap());
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
    assert!(
        (2_000..=3_000).contains(&pttl),
        "extended to T again: {pttl}"
    );
    assert!(lock.release().await.unwrap());
}

/// The library on etcd: fences are the keys' create revisions, a second lock finds the first
/// holding, and a release lets the next one in with a larger fence.
#[tokio::test(flavor = "current_thread")]
async fn the_library_takes_an_etcd_url() {
    let etcd = crate::support::etcd::Etcd::start();
    let ttl = Duration::from_secs(5);
    let a = Lock::new(&etcd.url(), "seat-42", ttl).unwrap();
    let b = Lock::new(&etcd.url(), "seat-42", ttl).unwrap();
    let first = a.acquire().await.unwrap().expect("A acquires");
    assert_eq!(
        b.acquire().await.unwrap(),
        None,
        "B cannot while A holds it"
    );
    assert!(a.extend().await.unwrap(), "still A's");
    assert!(a.release().await.unwrap(), "A's to release");
    let second = b
        .acquire()
        .await
        .unwrap()
        .expect("B acquires once A let go");
    assert!(second > first, "{second} > {first}");
    assert!(b.release().await.unwrap());
    assert!(etcd.keys("seat-42/").is_empty(), "nothing left");
    assert!(
        Lock::new(&etcd.url(), "seat/42", ttl).is_err(),
        "no '/' in a NAME on etcd"
    );
}

/// A guard waits as the command line does, keeps its lease in the background while the task
/// does not touch it (T = 1 s, held 2.5 s), and gives the lock back when dropped.
#[tokio::test(flavor = "current_thread")]
async fn a_guard_keeps_its_lease_in_the_background_and_releases_when_dropped() {
    let redis = Redis::start();
    let endpoints = locked_run::Endpoints::new([redis.url()]);
    let mut options = locked_run::Options::new(Duration::from_secs(1));
    let lock = Lock::open(&endpoints, "report", &options).unwrap();
    let guard = lock.hold().await.unwrap();
    assert_eq!(guard.fence(), 1);
    options.wait = Some(Duration::ZERO);
    let other = Lock::open(&endpoints, "report", &options).unwrap();
    assert!(
        matches!(other.hold().await, Err(locked_run::Error::Busy(_))),
        "not waiting: busy"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        redis.get("lock:{report}").as_deref(),
        Some(guard.token()),
        "renewed past two leases' length"
    );
    assert_eq!(guard.stopping(), None);
    drop(guard);
    wait_until("the dropped guard released", Duration::from_secs(5), || {
        !redis.exists("lock:{report}")
    });
    let next = other.hold().await.unwrap();
    assert_eq!(next.fence(), 2, "the next holder's fence is larger");
    assert!(next.release().await.unwrap(), "it was still ours");
}

/// Taken away by an operator, the lock is found gone at the next renewal (R = T/6) and the task
/// is told to stop at once.
#[tokio::test(flavor = "current_thread")]
async fn a_guard_tells_its_task_to_stop_when_the_lock_is_taken_away() {
    let redis = Redis::start();
    let lock = Lock::new(&redis.url(), "report", Duration::from_secs(3)).unwrap();
    let mut guard = lock.hold().await.unwrap();
    let _: i64 = redis.cmd(&["DEL", "lock:{report}"]);
    let stop = tokio::time::timeout(Duration::from_secs(3), guard.stop_now())
        .await
        .expect("told within a renew interval");
    assert_eq!(stop, locked_run::Stop::Lost);
    assert!(!guard.release().await.unwrap(), "no longer ours");
}

/// The library opens every backend the command line does, with its refusals: `--holders` on
/// Redlock is refused before anything is connected.
#[test]
fn the_library_refuses_what_the_command_line_refuses() {
    let five = Five::start();
    let urls: Vec<String> = five.servers.iter().map(|r| r.url()).collect();
    let mut options = locked_run::Options::new(Duration::from_secs(5));
    options.holders = 3;
    let refused = Lock::open(&locked_run::Endpoints::new(urls), "job", &options)
        .err()
        .expect("refused");
    assert!(
        matches!(&refused, locked_run::Error::Usage(why) if why.contains("--holders")),
        "{refused}"
    );
}
