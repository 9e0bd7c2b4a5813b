//! `-w DUR` that runs out: 75, not before DUR, with one line that says who holds the lock; the
//! waiter's place in the queue is gone at once.

use std::time::Duration;

use super::backends::Backend;
use super::store::{hostname, one_line};

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let holder = store.holder(&[]);
    let out = store
        .lr()
        .args(["-w", "700ms"])
        .job(["true"])
        .run()
        .expect(75);
    assert!(
        out.elapsed >= Duration::from_millis(700),
        "{:?}",
        out.elapsed
    );
    assert!(out.elapsed < Duration::from_secs(5), "{:?}", out.elapsed);
    let line = one_line(&out.stderr);
    let opening = format!(
        "locked-run: gave up waiting for lock job after 700ms: it is held by {} pid {} (sh) since ",
        hostname(),
        holder.pid()
    );
    assert!(line.starts_with(&opening), "{opening:?}: {line}");
    assert!(
        line.contains(&format!(", fence {}", holder.fence())),
        "{line}"
    );
    assert!(line.contains("raise --wait"), "says what to do: {line}");
    assert_eq!(store.waiters(), 0, "it left the queue at once");
    holder.finish().expect(0);
}
