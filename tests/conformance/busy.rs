//! A busy lock: `-n` and `-w 0s` end 75 without a word (cron must not mail a skipped run), with
//! `-v` in the holder's one line (host, pid, program, fence), and `-E` renumbers the status.

use super::backends::Backend;
use super::store::{hostname, one_line};

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let holder = store.holder(&[]);
    for flags in [&["-n"][..], &["-w", "0s"]] {
        let out = store
            .lr()
            .args(flags)
            .job(["touch", "/nonexistent-dir/never"])
            .run()
            .expect_with(75, format!("{flags:?}"));
        assert_eq!(
            out.stderr, "",
            "{flags:?}: cron must not mail a skipped run"
        );
    }
    let out = store.lr().args(["-n", "-v"]).job(["true"]).run().expect(75);
    let line = one_line(&out.stderr);
    let opening = format!(
        "locked-run: lock job is held by {} pid {} (sh) since ",
        hostname(),
        holder.pid()
    );
    assert!(line.starts_with(&opening), "{opening:?}: {line}");
    assert!(
        line.contains(&format!(", fence {},", holder.fence()))
            || line.contains(&format!(", fence {};", holder.fence())),
        "names the holder's fence: {line}"
    );
    assert!(line.ends_with("; not waiting (--no-wait)"), "{line}");

    store
        .lr()
        .args(["-n", "-E", "1"])
        .job(["true"])
        .run()
        .expect_with(1, "-E renumbers the conflict status");
    holder.finish().expect(0);
    store.lr().args(["-n"]).job(["true"]).run().expect(0);
}
