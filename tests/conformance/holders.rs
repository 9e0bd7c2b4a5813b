//! `--holders N`: two of three runs hold at once, each with a fence of its own and
//! `LOCKED_RUN_HOLDERS`; the third is 75 with `-n` and otherwise waits, and starts when one of
//! the two ends, with a larger fence; a run with another N is refused (2, one line naming
//! both), a run without `--holders` (N = 1) too, even one that would wait, and a lone
//! holder's lock refuses runs with `--holders 2`. A backend that cannot keep it refuses the
//! option.

use super::backends::Backend;
use super::store::{gated, go, logged, one_line, refused, started};
use crate::support::*;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    if !backend.supports().holders {
        return refused(&store, &["--holders", "2"], "--holders");
    }
    let dir = scratch();
    let d = dir.path();
    let two = ["--holders", "2"];
    let a = gated(&store, d, "a", &two);
    let b = gated(&store, d, "b", &two);
    let (fa, fb) = (started(d, "a"), started(d, "b"));
    assert_ne!(fa, fb, "every holder has a fence of its own");
    let status = store.status();
    assert_eq!(status["limit"], 2, "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");

    let busy = store
        .lr()
        .args(two)
        .args(["-n"])
        .job(["true"])
        .run()
        .expect(75);
    assert_eq!(busy.stderr, "", "-n is silent");
    let env = store
        .lr()
        .args(["--holders", "3"])
        .args(["-n"])
        .job(sh("echo $LOCKED_RUN_HOLDERS"))
        .run();
    assert_eq!(env.code(), Some(2), "another N is refused: {env:?}");
    let line = env.stderr.trim();
    assert!(
        line.contains("held by runs with --holders 2")
            && line.contains("this run asks for --holders 3"),
        "names both: {line}"
    );
    assert_eq!(env.stderr.lines().count(), 1, "{}", env.stderr);
    // A run without --holders is N = 1: refused too, at once, though it would wait.
    let plain = store.lr().args(["-w", "5s"]).job(["true"]).run();
    assert_eq!(plain.code(), Some(2), "N = 1 is refused: {plain:?}");
    let line = one_line(&plain.stderr);
    assert!(
        line.contains("held by runs with --holders 2")
            && line.contains("this run asks for --holders 1"),
        "names both: {line}"
    );

    let c = gated(&store, d, "c", &two);
    store.wait_for_waiters(1);
    assert!(!logged(d, "start", "c"), "no third holder while two hold");
    go(d, "a");
    a.wait().expect(0);
    let fc = started(d, "c");
    assert!(fc > fa.max(fb), "fences grow: {fa} {fb} {fc}");
    go(d, "b");
    b.wait().expect(0);
    let out = store
        .lr()
        .args(two)
        .args(["-n"])
        .job(sh("echo $LOCKED_RUN_HOLDERS"))
        .run()
        .expect(0);
    assert_eq!(out.stdout.trim(), "2", "LOCKED_RUN_HOLDERS");
    go(d, "c");
    c.wait().expect(0);
    assert_eq!(store.status()["held"], false);

    // And the other way round: a lone holder (N = 1) refuses runs with --holders 2.
    let one = store.holder(&[]);
    let out = store
        .lr()
        .args(two)
        .args(["-n"])
        .job(["true"])
        .run()
        .expect(2);
    assert!(
        one_line(&out.stderr).contains("held by runs with --holders 1"),
        "{}",
        out.stderr
    );
    one.finish().expect(0);
}
