//! The seed's fencing scenario end to end: a holder paused past its lease, a second holder with
//! a larger fence writes, the first resumes and its fenced write changes nothing.

use std::process::Command;
use std::time::Duration;

use crate::support::*;

fn sqlite(db: &str, sql: &str) -> String {
    let out = Command::new("sqlite3")
        .arg(db)
        .arg(sql)
        .output()
        .expect("sqlite3 is installed (see .ci/run)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The write every holder makes: it only lands if its fence is newer than the row's.
const FENCED_WRITE: &str = "UPDATE seat SET owner = '$WHO', fence = $LOCKED_RUN_FENCE \
     WHERE id = 1 AND fence < $LOCKED_RUN_FENCE; SELECT changes();";

#[test]
fn a_paused_holders_stale_write_is_refused_by_the_fence() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let db = format!("{d}/seats.db");
    sqlite(
        &db,
        "CREATE TABLE seat (id INTEGER PRIMARY KEY, owner TEXT, fence INTEGER NOT NULL); INSERT INTO seat VALUES (1, NULL, 0);",
    );

    // A: takes the lock, then is paused (with its whole job) past its lease.
    let a_script = format!(
        "echo $$ > {d}/a-pid.tmp; mv {d}/a-pid.tmp {d}/a-pid; while [ ! -e {d}/go ]; do sleep 0.01; done; \
         sqlite3 {db} \"{w}\" > {d}/a-changes.tmp; mv {d}/a-changes.tmp {d}/a-changes; exec sleep 60",
        w = FENCED_WRITE.replace("$WHO", "A")
    );
    let a = lr()
        .url(&redis.url())
        .args(["--ttl", "2s"])
        .name("seats")
        .sh(&a_script)
        .spawn();
    let a_child: i32 = wait_for_file(&file(&dir, "a-pid"), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    })
    .trim()
    .parse()
    .unwrap();
    signal(-a_child, libc::SIGSTOP); // the job (its own process group)
    signal(a.pid(), libc::SIGSTOP); // and locked-run: a VM pause, a long GC
    wait_until("A's lease expired", Duration::from_secs(10), || {
        !redis.exists("lock:{seats}")
    });

    // B: takes the lock with a larger fence and writes.
    let b = lr()
        .url(&redis.url())
        .name("seats")
        .command(sh(&format!(
            "sqlite3 {db} \"{}\"; echo fence=$LOCKED_RUN_FENCE",
            FENCED_WRITE.replace("$WHO", "B")
        )))
        .run()
        .expect(0);
    assert_eq!(b.stdout, "1\nfence=2\n", "B's write landed with fence 2");

    // A's job resumes first and makes its (stale) write: the fence refuses it.
    std::fs::write(file(&dir, "go"), "").unwrap();
    signal(-a_child, libc::SIGCONT);
    let changes = wait_for_file(&file(&dir, "a-changes"), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    });
    assert_eq!(changes, "0\n", "A's write with fence 1 changed no row");
    assert_eq!(
        sqlite(&db, "SELECT owner, fence FROM seat WHERE id = 1;"),
        "B|2\n"
    );

    // A's wrapper resumes, finds its lease long gone and kills the job: 76.
    signal(a.pid(), libc::SIGCONT);
    let out = a.wait().expect(76);
    assert!(
        out.stderr
            .contains("paused or suspended past the end of its lease"),
        "{}",
        out.stderr
    );
    assert!(!alive(a_child));
}
