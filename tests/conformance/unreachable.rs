//! A store that cannot be reached: 69 at once, with one line, and nothing run.

use std::time::Duration;

use super::backends::Backend;
use super::store::one_line;
use crate::support::*;

pub fn check(backend: &dyn Backend) {
    let dir = scratch();
    let ran = dir.path().join("ran");
    let out = lr()
        .args(backend.unreachable())
        .job(["touch", path_str(&ran)])
        .run()
        .expect(69);
    let line = one_line(&out.stderr);
    assert!(line.contains("nothing was run"), "{line}");
    assert!(!ran.exists(), "nothing run");
    assert!(
        out.elapsed < Duration::from_secs(5),
        "at once: {:?}",
        out.elapsed
    );
    lr().arg("status")
        .args(backend.unreachable())
        .arg("job")
        .run()
        .expect(69);
}
