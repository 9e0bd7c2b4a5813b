//! `--shared`: shared runs hold together, an exclusive run waits for the last of them, and a
//! shared run that comes after a waiting writer waits behind it (`-n` too is 75 then): a
//! stream of readers never starves a writer. Fences grow across both modes. A backend that
//! cannot keep it refuses the option.

use super::backends::Backend;
use super::store::{gated, go, logged, position, refused, started};
use crate::support::*;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    if !backend.supports().shared {
        return refused(&store, &["--shared"], "--shared");
    }
    let dir = scratch();
    let d = dir.path();
    let r1 = gated(&store, d, "r1", &["--shared"]);
    let r2 = gated(&store, d, "r2", &["--shared"]);
    let (f1, f2) = (started(d, "r1"), started(d, "r2"));
    let status = store.status();
    assert_eq!(status["mode"], "shared", "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");

    let w = gated(&store, d, "w", &[]);
    store.wait_for_waiters(1);
    store
        .lr()
        .args(["--shared", "-n"])
        .job(["true"])
        .run()
        .expect_with(
            75,
            "-n takes shared mode only when no writer holds or waits",
        );
    let r3 = gated(&store, d, "r3", &["--shared"]);
    store.wait_for_waiters(2);
    assert!(!logged(d, "start", "w"), "the writer waits for the readers");
    assert!(
        !logged(d, "start", "r3"),
        "a reader never passes a waiting writer"
    );

    go(d, "r1");
    go(d, "r2");
    let fw = started(d, "w");
    assert!(
        !logged(d, "start", "r3"),
        "the later reader waits for the writer"
    );
    go(d, "w");
    let f3 = started(d, "r3");
    go(d, "r3");
    for run in [r1, r2, w, r3] {
        run.wait().expect(0);
    }
    assert!(position(d, "start", "w") > position(d, "end", "r1"));
    assert!(position(d, "start", "w") > position(d, "end", "r2"));
    assert!(position(d, "start", "r3") > position(d, "end", "w"));
    assert!(
        f1 != f2 && fw > f1.max(f2) && f3 > fw,
        "{f1} {f2} {fw} {f3}"
    );
    assert_eq!(store.status()["held"], false);
}
