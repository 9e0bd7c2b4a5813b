//! A holder whose `since` no date can show (past year 9999, as any user of the store may write
//! it) reads as unknown: `since ?` in text, null in JSON; `status`, `-n`, a waiter and
//! `release` answer as they would of any holder, never a crash (they panicked: status 101, and
//! a waiter left its queue place to lapse).

use super::backends::Backend;
use super::store::one_line;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let holder = store.holder(&[]);
    store.servers.plant_far_since();

    let status = store.op("status").arg("job").run().expect(0);
    assert!(
        status
            .stdout
            .contains(&format!("pid {} (sh) since ?", holder.pid())),
        "{status:?}"
    );
    let json = store.status();
    assert_eq!(json["held"], true, "{json}");
    assert_eq!(json["holder"]["since"], serde_json::Value::Null, "{json}");
    assert_eq!(json["holder"]["pid"], holder.pid(), "{json}");

    let busy = store.lr().args(["-n", "-v"]).job(["true"]).run().expect(75);
    let line = one_line(&busy.stderr);
    assert!(line.contains(" (sh) since ?, fence "), "{line}");
    let waited = store
        .lr()
        .args(["-w", "300ms"])
        .job(["true"])
        .run()
        .expect(75);
    assert!(one_line(&waited.stderr).contains(" since ?"), "{waited:?}");
    let refused = store.op("release").arg("job").run();
    assert_ne!(refused.code(), Some(101), "{refused:?}");
    assert!(refused.stderr.starts_with("locked-run: "), "{refused:?}");
    assert!(!refused.stderr.contains("panicked"), "{refused:?}");

    holder.finish().expect(0);
    store.lr().args(["-n"]).job(["true"]).run().expect(0);
}
