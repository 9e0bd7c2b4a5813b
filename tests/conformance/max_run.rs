//! `--max-run DUR`: the command is stopped once it has run DUR, the status is 124 with one
//! line, and the lock is free once the job is gone; a command that ends in time keeps its own
//! status.

use std::time::Duration;

use super::backends::Backend;
use super::store::one_line;
use crate::support::*;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let out = store
        .lr()
        .args(["--max-run", "1s"])
        .job(["sleep", "60"])
        .run()
        .expect(124);
    let line = one_line(&out.stderr);
    assert!(
        line.contains("ran longer than --max-run 1s") && line.contains("SIGTERM"),
        "{line}"
    );
    assert!(
        out.elapsed >= Duration::from_secs(1),
        "not before DUR: {:?}",
        out.elapsed
    );
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    store
        .op("status")
        .arg("job")
        .run()
        .expect_with(1, "free once the job is gone");
    store
        .lr()
        .args(["--max-run", "10s"])
        .job(sh("exit 3"))
        .run()
        .expect(3);
}
