//! One wake-up per handoff: a release is announced to the waiter whose turn it is alone, on a
//! channel only that waiter listens on, so the cost of a handoff (messages delivered,
//! processes woken) does not grow with the number of waiters. An observer subscribed to every
//! release channel of the NAME (`PSUBSCRIBE released:{job}*`) records what each release sends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

/// Every message published on a release channel of `job`, as (channel, payload), in order.
pub(crate) struct Observer {
    seen: Arc<Mutex<Vec<(String, String)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Observer {
    /// Returns once the server confirmed the pattern subscription.
    pub(crate) fn start(redis: &Redis) -> Observer {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut conn = redis.conn();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut pubsub = conn.as_pubsub();
                pubsub.psubscribe("released:{job}*").unwrap();
                pubsub
                    .set_read_timeout(Some(Duration::from_millis(100)))
                    .unwrap();
                ready_tx.send(()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(message) = pubsub.get_message() {
                        let payload = String::from_utf8_lossy(message.get_payload_bytes());
                        let entry = (message.get_channel_name().to_owned(), payload.into_owned());
                        seen.lock().unwrap().push(entry);
                    }
                }
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the observer subscribed");
        Observer {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn seen(&self) -> Vec<(String, String)> {
        self.seen.lock().unwrap().clone()
    }

    /// What was seen once `done` holds of it (within 10 s).
    pub(crate) fn until(
        &self,
        done: impl Fn(&[(String, String)]) -> bool,
    ) -> Vec<(String, String)> {
        wait_until("the release messages", Duration::from_secs(10), || {
            done(&self.seen())
        });
        self.seen()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A waiter whose command appends `who` to `log`.
fn waiter(redis: &Redis, log: &std::path::Path, who: &str, extra: &[&str]) -> Running {
    lr().url(&redis.url())
        .args(extra)
        .name("job")
        .sh(&format!("echo {who} >> {}", path_str(log)))
        .spawn()
}

/// The queue of `job`, head first.
fn queue(redis: &Redis) -> Vec<String> {
    redis.cmd(&["ZRANGE", "queue:{job}", "0", "-1"])
}

/// Both slots of `--holders 2` held, and three waiters (w1, w2, w3: [`waiter`]s logging to
/// `log`) queued behind them in that order; with the queue's tokens, head first.
fn two_slots_held_three_queued(
    redis: &Redis,
    log: &std::path::Path,
) -> ([Holder; 2], Vec<Running>, Vec<String>) {
    let first = Holder::start(redis, "job", &["--holders", "2"]);
    let second = Holder::start(redis, "job", &["--holders", "2"]);
    let mut waiters = Vec::new();
    for i in 1..=3 {
        waiters.push(waiter(redis, log, &format!("w{i}"), &["--holders", "2"]));
        wait_until("the waiter queued", Duration::from_secs(10), || {
            queue(redis).len() == i
        });
    }
    let tokens = queue(redis);
    ([first, second], waiters, tokens)
}

#[test]
fn a_release_wakes_the_head_waiter_alone_on_a_channel_of_its_own() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = Holder::start(&redis, "job", &[]);
    let mut waiters = Vec::new();
    for i in 1..=4 {
        waiters.push(waiter(&redis, &log, &format!("w{i}"), &[]));
        wait_until("the waiter queued", Duration::from_secs(10), || {
            queue(&redis).len() == i
        });
    }
    let tokens = queue(&redis);
    // Each waiter listens on its own channel, one subscriber each, and none on the NAME's.
    wait_until("every waiter listening", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 4
    });
    let mut channels = release_channels(&redis, "job");
    channels.sort();
    let mut expected: Vec<(String, i64)> = tokens
        .iter()
        .map(|t| (format!("released:{{job}}:{t}"), 1))
        .collect();
    expected.sort();
    assert_eq!(channels, expected);

    let observer = Observer::start(&redis);
    std::fs::write(holder.path("go"), "").unwrap();
    assert_eq!(holder.running.wait().code(), Some(0));
    for w in waiters {
        assert_eq!(w.wait().code(), Some(0));
    }
    let seen = observer.until(|seen| seen.len() >= 5);
    // One message a release: the holder's names w1, w1's names w2, ... and the last one,
    // with nobody queued, goes on the NAME's channel (for waiters that keep no place).
    let mut wanted: Vec<(String, String)> = tokens
        .iter()
        .map(|t| (format!("released:{{job}}:{t}"), t.clone()))
        .collect();
    wanted.push(("released:{job}".into(), "released".into()));
    assert_eq!(seen, wanted);
    let order = std::fs::read_to_string(&log).unwrap();
    assert_eq!(order, "w1\nw2\nw3\nw4\n");
}

#[test]
fn a_freed_slot_of_several_wakes_as_many_waiters_as_places_are_free() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let ([first, second], waiters, tokens) = two_slots_held_three_queued(&redis, &log);
    wait_until("every waiter listening", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 3
    });
    let observer = Observer::start(&redis);
    std::fs::write(first.path("go"), "").unwrap();
    assert_eq!(first.running.wait().code(), Some(0));
    // One place freed: the head alone is told, not the two behind it (w1 takes the place and
    // ends, which frees it again for w2, and so on).
    let seen = observer.until(|seen| !seen.is_empty());
    assert_eq!(
        seen[0],
        (format!("released:{{job}}:{}", tokens[0]), tokens[0].clone()),
        "{seen:?}"
    );
    for w in waiters {
        assert_eq!(w.wait().code(), Some(0));
    }
    // Every release while some waited named one waiter, in arrival order.
    let seen = observer.seen();
    let named: Vec<&str> = seen
        .iter()
        .filter(|(channel, _)| channel != "released:{job}")
        .map(|(_, payload)| payload.as_str())
        .collect();
    assert_eq!(named, tokens, "{seen:?}");
    std::fs::write(second.path("go"), "").unwrap();
    assert_eq!(second.running.wait().code(), Some(0));
}

/// A waiter that gave back a grant it could not use goes on with a fresh token: it must then
/// listen on the channel that token names (else its turn is announced where nobody hears it,
/// and it waits for its keep-alive to ask again).
#[test]
fn a_waiter_that_gave_back_listens_on_its_fresh_tokens_channel() {
    let redis = Redis::start();
    let first = Holder::start(&redis, "job", &[]);
    // 150 ms each way: every grant is known 300 ms after it was asked for, leaving less of the
    // 1 s lease than R + K = 300 + 650 ms, so it is given back (and the waiter, with a fresh
    // token, tries again): while this lasts, the waiter can take nothing it may use.
    let proxy = Proxy::start(redis.port);
    proxy.set(Mode::Latency(Duration::from_millis(150)));
    let dir = scratch();
    let marker = dir.path().join("ran");
    let log = dir.path().join("stderr");
    let waiter = lr_stderr_to(&log)
        .args([
            "-v",
            "-u",
            &proxy.url(),
            "--ttl",
            "1s",
            "--renew-every",
            "300ms",
        ])
        .args(["--kill-after", "650ms", "-w", "30s", "job", "--"])
        .args(["touch", path_str(&marker)])
        .spawn();
    wait_until("the waiter queued", Duration::from_secs(10), || {
        queue(&redis).len() == 1
    });
    let old = queue(&redis)[0].clone();
    first.finish().expect(0);
    wait_for_file(&log, Duration::from_secs(10), |t| {
        t.contains("to grant lock job")
    });
    // Another holder takes the lock: it queues before the give-back lands, or wins the lock at
    // one of the waiter's later give-backs.
    let second = Holder::start(&redis, "job", &[]);
    wait_until("the waiter queued again", Duration::from_secs(10), || {
        queue(&redis).len() == 1 && subscribers(&redis, "job") == 1
    });
    let fresh = queue(&redis)[0].clone();
    assert_ne!(fresh, old, "a token given back is never used again");
    assert_eq!(
        release_channels(&redis, "job"),
        [(format!("released:{{job}}:{fresh}"), 1)],
        "the waiter listens where its fresh token's turn is announced"
    );
    proxy.set(Mode::Pass);
    let observer = Observer::start(&redis);
    second.finish().expect(0);
    assert_eq!(waiter.wait().code(), Some(0));
    assert!(marker.exists());
    assert_eq!(
        observer.until(|seen| !seen.is_empty())[0],
        (format!("released:{{job}}:{fresh}"), fresh.clone())
    );
}

/// With `--holders N`, a woken waiter among the first N that leaves before taking its place
/// hands its turn on: the waiter behind is told at once (not left to its next keep-alive).
#[test]
fn a_woken_waiter_that_leaves_tells_the_next_one() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let ([first, second], waiters, tokens) = two_slots_held_three_queued(&redis, &log);
    // w1 and w2 cannot act on their wake-ups.
    for w in &waiters[..2] {
        signal(w.pid(), libc::SIGSTOP);
    }
    let observer = Observer::start(&redis);
    lr().args(["release", "--force", "-u", &redis.url(), "job"])
        .run()
        .expect(0);
    observer.until(|seen| seen.len() >= 2);
    // w2 gives up: its place among the first two passes to w3, which is told so.
    signal(waiters[1].pid(), libc::SIGTERM);
    signal(waiters[1].pid(), libc::SIGCONT);
    let own = (format!("released:{{job}}:{}", tokens[2]), tokens[2].clone());
    let seen = observer.until(|seen| seen.contains(&own));
    assert_eq!(
        &seen[..2],
        [
            (format!("released:{{job}}:{}", tokens[0]), tokens[0].clone()),
            (format!("released:{{job}}:{}", tokens[1]), tokens[1].clone()),
        ]
    );
    signal(waiters[0].pid(), libc::SIGCONT);
    let mut waiters = waiters.into_iter();
    let (w1, w2, w3) = (
        waiters.next().unwrap(),
        waiters.next().unwrap(),
        waiters.next().unwrap(),
    );
    assert_eq!(w1.wait().code(), Some(0));
    assert_eq!(w2.wait().code(), Some(143));
    assert_eq!(w3.wait().code(), Some(0));
    let _ = (first.finish(), second.finish());
}
