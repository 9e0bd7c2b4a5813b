//! Fair order: waiters are served in the order they arrived, one at a time, and a `-n` run
//! that comes while they wait never barges past them. What a backend declares less of, the
//! suite checks less of: `file://` lets a newcomer take a lock it finds free between a release
//! and the next waiter's wake-up (the waiters keep their order), and Redlock keeps no queue
//! (its waiters race, and are all served, one at a time).

use std::time::{Duration, Instant};

use super::backends::{Backend, Queue};
use super::store::{at, events, timed};
use crate::support::*;

/// How many wait.
const WAITERS: u64 = 4;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = store.holder(&[]);
    let mut waiters = Vec::new();
    for i in 1..=WAITERS {
        waiters.push(timed(&store, &log, &format!("w{i}"), &[]));
        // Each has its place before the next one comes.
        store.wait_for_waiters(i);
    }
    std::fs::write(holder.path("go"), "").unwrap();
    // Meanwhile `-n` runs keep coming: none may take the lock while anyone waits.
    let mut no_waits = 0;
    let drained_by = Instant::now() + Duration::from_secs(60);
    while waiters
        .iter_mut()
        .any(|w| w.child.try_wait().unwrap().is_none())
    {
        assert!(
            Instant::now() < drained_by,
            "the waiters were not served in 60 s"
        );
        let out = store
            .lr()
            .args(["-n"])
            .name("job")
            .sh(&format!(
                "echo start n $(date +%s%N) >> {l}; echo end n $(date +%s%N) >> {l}",
                l = path_str(&log)
            ))
            .run();
        assert!(matches!(out.code(), Some(0 | 75)), "{out:?}");
        no_waits += 1;
    }
    holder.finish().expect(0);
    for w in waiters {
        w.wait().expect(0);
    }
    assert!(no_waits > 0);
    let events = events(&log);
    one_at_a_time(&events);
    let order: Vec<&str> = events
        .iter()
        .filter(|(k, w, _)| k == "start" && w != "n")
        .map(|(_, w, _)| w.as_str())
        .collect();
    let queue = backend.supports().queue;
    if queue == Queue::Racing {
        assert_eq!(
            order.len(),
            WAITERS as usize,
            "every waiter ran: {events:?}"
        );
        return;
    }
    assert_eq!(order, ["w1", "w2", "w3", "w4"], "{events:?}");
    assert_eq!(store.waiters(), 0, "the queue is gone");
    if queue == Queue::Waiters {
        return;
    }
    let last_end = at(&events, "end", "w4");
    for (kind, who, t) in &events {
        if who == "n" && kind == "start" {
            assert!(*t > last_end, "a -n run went before a waiter: {events:?}");
        }
    }
}

/// The logged commands never overlap: each start follows the previous end.
#[track_caller]
fn one_at_a_time(events: &[(String, String, u64)]) {
    let mut sorted = events.to_vec();
    sorted.sort_by_key(|e| e.2);
    for pair in sorted.chunks(2) {
        let [(start, a, _), (end, b, _)] = pair else {
            panic!("a start without an end: {sorted:?}")
        };
        assert!(
            start == "start" && end == "end" && a == b,
            "overlap: {sorted:?}"
        );
    }
}
