//! A SIGKILLed waiter's place lapses within about 2 s: the waiter behind it starts at most
//! that long after the one before it ended (a bound, measured from the commands' own logs),
//! whatever the lease (the default, 30 s). Where waiters race (no queue), the two live ones go
//! in either order, and neither waits for the dead one.

use std::time::Duration;

use super::backends::{Backend, Queue};
use super::store::{at, events, timed};
use crate::support::*;

/// About 2 s, with room for a loaded machine's wake-ups.
const BOUND: Duration = Duration::from_millis(2_500);

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let dir = scratch();
    let log = dir.path().join("log");
    let holder = store.holder(&[]);
    let first = timed(&store, &log, "first", &[]);
    store.wait_for_waiters(1);
    let doomed = timed(&store, &log, "doomed", &[]);
    store.wait_for_waiters(2);
    let last = timed(&store, &log, "last", &[]);
    store.wait_for_waiters(3);
    signal(doomed.pid(), libc::SIGKILL);
    assert_eq!(doomed.wait().code(), None, "SIGKILLed");
    holder.finish().expect(0);
    first.wait().expect(0);
    last.wait().expect(0);
    let events = events(&log);
    let (mut before, mut after) = ("first", "last");
    if backend.supports().queue == Queue::Racing
        && at(&events, "start", "last") < at(&events, "start", "first")
    {
        (before, after) = (after, before);
    }
    let delay = at(&events, "start", after)
        .checked_sub(at(&events, "end", before))
        .map(Duration::from_nanos)
        .unwrap_or_else(|| panic!("{after} started before {before} ended: {events:?}"));
    println!("the dead waiter held up the one behind it for {delay:?}");
    assert!(
        delay <= BOUND,
        "the dead waiter held up the one behind it for {delay:?}"
    );
    assert!(!events.iter().any(|(_, w, _)| w == "doomed"));
    assert_eq!(store.waiters(), 0, "no place is left");
}
