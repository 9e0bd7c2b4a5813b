//! A lock taken from its holder: where holders keep a lease, `release --force` frees it, says
//! from whom, and the holder's command is stopped at its next renewal (76, one line; the
//! history says `lost`); where the kernel holds the lock (`file://`), nobody can take it from a
//! live holder, and `release --force` says so (2) and leaves it held.

use super::backends::{Backend, Tenure};
use super::store::{hostname, one_line};

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    // T = 2 s: the holder renews every 333 ms, and learns of the release at its next renewal.
    let holder = store.holder(&["--ttl", "2s"]);
    let pid = holder.pid();
    let out = store.op("release").args(["--force", "job"]).run();
    match backend.supports().tenure {
        Tenure::Lease => {
            let out = out.expect(0);
            let opening = format!("released lock job, held by {} pid {pid} (sh)", hostname());
            assert!(
                out.stdout.starts_with(&opening),
                "{opening:?}: {}",
                out.stdout
            );
            let lost = holder.running.wait().expect(76);
            let line = one_line(&lost.stderr);
            assert!(
                line.starts_with("locked-run: lost the lock job while the command ran"),
                "{line}"
            );
            let runs = store.history();
            assert_eq!(
                (&runs[0]["ended"], &runs[0]["status"]),
                (&"lost".into(), &76.into())
            );
        }
        Tenure::Kernel => {
            let line = one_line(&out.expect(2).stderr).to_owned();
            assert!(
                line.contains("is freed only when its holder's process ends"),
                "{line}"
            );
            assert_eq!(store.status()["held"], true, "still held");
            holder.finish().expect(0);
        }
    }
}
