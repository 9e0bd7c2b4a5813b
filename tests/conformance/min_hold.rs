//! `--min-hold`: a lock kept by its last holder's `--min-hold` after its command ended, with no
//! command running, reads the same everywhere: `status` says it is kept by `--min-hold` (not
//! held by a run whose command is going on), `release` says so and that `--force` frees it, a
//! `-n` run is 75 meanwhile, and `release --force` frees it for the next run.

use super::backends::Backend;
use super::store::{hostname, one_line};
use crate::support::*;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let run = store
        .lr()
        .args(["--min-hold", "1h"])
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .spawn();
    let pid = run.pid();
    let out = run.wait().expect(0);
    let fence: u64 = out.stdout.trim().parse().unwrap();
    let holder = format!("{} pid {pid} (sh) since ", hostname());

    let status = store
        .op("status")
        .arg("job")
        .run()
        .expect_with(0, "kept: held");
    let first = status.stdout.lines().next().unwrap();
    let opening = format!("job: kept by --min-hold of its last holder, {holder}");
    assert!(first.starts_with(&opening), "{opening:?}: {first}");
    assert!(first.contains(&format!("; fence {fence}; ")), "{first}");
    assert!(first.contains("s left"), "{first}");
    let json = store.status();
    assert_eq!(json["held"], true, "{json}");
    let ttl_ms = json["ttl_ms"].as_i64().unwrap();
    assert!(
        ttl_ms > 3_000_000 && ttl_ms <= 3_600_000,
        "the hour's rest: {json}"
    );

    let out = store.op("release").arg("job").run().expect(2);
    let line = one_line(&out.stderr);
    let opening =
        format!("locked-run: lock job is kept by --min-hold of its last holder, {holder}");
    assert!(line.starts_with(&opening), "{opening:?}: {line}");
    assert!(
        line.ends_with("; nothing was released: add --force to release it"),
        "{line}"
    );

    store.lr().args(["-n"]).job(["true"]).run().expect(75);
    let out = store.op("release").args(["--force", "job"]).run().expect(0);
    let opening = format!("released lock job, held by {holder}");
    assert!(
        out.stdout.starts_with(&opening),
        "{opening:?}: {}",
        out.stdout
    );
    let out = store
        .lr()
        .args(["-n"])
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    let next: u64 = out.stdout.trim().parse().unwrap();
    assert!(next > fence, "fences grow: {fence} then {next}");
}
