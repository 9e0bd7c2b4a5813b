//! A signal that comes while a run waits ends the wait at once: status 128 + N with one line,
//! nothing run, its place in the queue gone at once (not when it would lapse), and the
//! holder's lock untouched.

use std::time::Duration;

use super::backends::Backend;
use super::store::one_line;
use crate::support::*;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let holder = store.holder(&[]);
    let dir = scratch();
    let ran = dir.path().join("ran");
    let waiter = store.lr().job(["touch", path_str(&ran)]).spawn();
    store.wait_for_waiters(1);
    signal(waiter.pid(), libc::SIGTERM);
    let out = waiter
        .wait_for(Duration::from_secs(10))
        .expect(128 + libc::SIGTERM);
    let line = one_line(&out.stderr);
    assert!(
        line.contains("while waiting for lock job: nothing was run"),
        "{line}"
    );
    assert!(!ran.exists(), "the command did not run");
    let status = store.status();
    assert_eq!(status["waiters"], 0, "it left the queue at once: {status}");
    assert_eq!(status["holder"]["pid"], holder.pid(), "{status}");
    let fence = holder.fence();
    holder.finish().expect(0);
    let next = store
        .lr()
        .args(["-n"])
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    let next: u64 = next.stdout.trim().parse().unwrap();
    assert!(next > fence, "{fence} then {next}");
}
