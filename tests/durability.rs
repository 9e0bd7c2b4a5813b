//! What must reach the disk before `locked-run` lets go of a host-local lock: the `--min-hold`
//! deadline, like the fence counter, is written durably (the file, then its directory), or a
//! crash right after the release would forget it and a late host would run the job again.
//! Checked on the system calls of a real run, traced with strace.

use crate::support::*;

/// The system calls of one `locked-run ARGS...`, one line each, file descriptors with paths.
fn traced(args: &[&str]) -> (Output, Vec<String>) {
    let dir = scratch();
    let trace = file(&dir, "trace");
    let mut cmd = without_our_settings("strace");
    cmd.args(["-f", "-y", "-qq", "-s", "256", "-o", path_str(&trace)])
        .args(["-e", "trace=pwrite64,ftruncate,fsync,fdatasync,flock"])
        .arg(BIN)
        .args(args);
    let out = run(cmd);
    let lines = std::fs::read_to_string(&trace)
        .expect("strace is installed (see .ci/run)")
        .lines()
        .map(str::to_owned)
        .collect();
    (out, lines)
}

#[test]
fn a_min_hold_deadline_is_on_disk_before_the_lock_is_let_go() {
    let locks = scratch();
    let url = file_url(locks.path());
    let (out, calls) = traced(&["-u", &url, "--min-hold", "10s", "job", "true"]);
    out.expect(0);
    let lock_file = format!("{}/job.lock>", locks.path().display());
    let dir = format!("<{}>", locks.path().display());
    let written = calls
        .iter()
        .position(|c| {
            c.contains("pwrite64(") && c.contains(&lock_file) && c.contains("not_before=")
        })
        .unwrap_or_else(|| panic!("the deadline was never written: {calls:#?}"));
    let unlocked = calls[written..]
        .iter()
        .position(|c| c.contains("flock(") && c.contains(&lock_file) && c.contains("LOCK_UN"))
        .map(|i| written + i)
        .unwrap_or_else(|| panic!("the lock was never let go: {calls:#?}"));
    let between = &calls[written..unlocked];
    assert!(
        between
            .iter()
            .any(|c| (c.contains("fdatasync(") || c.contains("fsync(")) && c.contains(&lock_file)),
        "the lock file was not synced before the unlock: {between:#?}"
    );
    assert!(
        between
            .iter()
            .any(|c| c.contains("fsync(") && c.contains(&dir)),
        "the directory was not synced before the unlock: {between:#?}"
    );
}
