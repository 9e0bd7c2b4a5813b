//! A SIGKILLed holder is followed after its lease: the waiter starts no sooner than the lease
//! `status` read just before the kill could end, and soon after it (where the kernel holds the
//! lock, `file://`, at once).

use std::time::Duration;

use super::backends::{Backend, Tenure};
use super::store::{at, events, now_ns, timed};
use crate::support::*;

/// How late after the lease's end (the kill, for `file://`) the waiter may start.
const SOON: Duration = Duration::from_secs(2);

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = store.holder(&["--ttl", "2s"]);
    let next = timed(&store, &log, "next", &[]);
    store.wait_for_waiters(1);
    let read = now_ns();
    let ttl_ms = store.status()["ttl_ms"].as_i64().expect("held");
    let killed = now_ns();
    signal(holder.pid(), libc::SIGKILL);
    next.wait().expect(0);
    let started = at(&events(&log), "start", "next");
    let after = Duration::from_nanos(started.saturating_sub(killed));
    println!("the next holder started {after:?} after the kill (ttl_ms {ttl_ms} just before)");
    match backend.supports().tenure {
        Tenure::Kernel => {
            assert_eq!(ttl_ms, -1, "held as long as its holder lives");
            assert!(after < SOON, "the kernel frees the lock at once: {after:?}");
        }
        Tenure::Lease => {
            assert!(ttl_ms > 0, "a lease: {ttl_ms}");
            let lease_end = read + ttl_ms as u64 * 1_000_000;
            assert!(
                started >= lease_end,
                "started {:?} before the lease could end",
                Duration::from_nanos(lease_end - started)
            );
            // The lease was renewed at most a renewal before the kill: it ends at most T
            // (raised to what the store granted, which status read) after.
            let lease = Duration::from_millis(ttl_ms.max(2_000) as u64);
            assert!(
                after <= lease + SOON,
                "followed {after:?} after the kill, the lease being {lease:?}"
            );
        }
    }
}
