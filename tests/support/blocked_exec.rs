//! A program whose exec blocks, and a wrapper's command seen from `/proc`: for the tests of the
//! command's start (it must never start past the lease's kill-signal point, even with its
//! wrapper stopped).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::path_str;
use super::process::{signal, wait_until};

/// A copy of `touch` at `program`, under a write lease (`fcntl(F_SETLEASE)`) that a perl
/// process holds for `secs`: an exec of it blocks until then (as on a file system that stalls).
pub fn leased_program(program: &Path, secs: u32) -> Child {
    std::fs::copy("/usr/bin/touch", program).expect("a copy of touch");
    let mut holder = Command::new("perl")
        .args([
            "-e",
            r#"open(my $f, "<", $ARGV[0]) or die "open: $!"; $SIG{IO} = "IGNORE";
               fcntl($f, 1024, 1) or die "F_SETLEASE: $!"; $| = 1; print "held\n"; sleep $ARGV[1]"#,
            path_str(program),
            &secs.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("perl is installed (see .ci/run)");
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "held\n", "the lease on the program was not taken");
    holder
}

/// The fields of `/proc/PID/stat` after the command name, from the state (field 3) on.
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// The pid of `wrapper`'s command child, once it is cloned. The watcher, its other child, is
/// told apart by its exit signal (none: field 38), not its name, which it sets only once
/// running.
pub fn command_child(wrapper: i32) -> i32 {
    child_by_exit_signal(wrapper, "17", "the command's child is cloned")
}

/// The pid of `wrapper`'s watcher, once it is cloned: the child with no exit signal.
pub fn watcher_child(wrapper: i32) -> i32 {
    child_by_exit_signal(wrapper, "0", "the wrapper's watcher is cloned")
}

fn child_by_exit_signal(wrapper: i32, signal: &str, what: &str) -> i32 {
    let mut child = 0;
    wait_until(what, Duration::from_secs(10), || {
        child = children_by_exit_signal(wrapper, signal)
            .first()
            .copied()
            .unwrap_or(0);
        child != 0
    });
    child
}

/// `wrapper`'s children whose exit signal is `signal` ("0": its watchers, "17": its command),
/// as they are now.
pub fn children_by_exit_signal(wrapper: i32, signal: &str) -> Vec<i32> {
    let children = std::fs::read_to_string(format!("/proc/{wrapper}/task/{wrapper}/children"))
        .unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|pid| pid.parse::<i32>().ok())
        .filter(|&pid| {
            stat_fields(pid).is_some_and(|f| f.get(38 - 3).map(String::as_str) == Some(signal))
        })
        .collect()
}

/// Waits until `pid` is a zombie: dead, not reaped by its (stopped) parent.
pub fn wait_until_dead(pid: i32, what: &str) {
    wait_until(what, Duration::from_secs(10), || {
        stat_fields(pid).is_some_and(|f| f.first().map(String::as_str) == Some("Z"))
    });
}

/// Waits until `pid` is gone, or a zombie (dead; its parent may be the test's init, slow to
/// reap).
pub fn wait_until_gone(pid: i32, what: &str) {
    wait_until(what, Duration::from_secs(10), || {
        stat_fields(pid).is_none_or(|f| f.first().map(String::as_str) == Some("Z"))
    });
}

/// Stops `wrapper` (SIGSTOP, the wrapper alone) as soon as its command's child is cloned, its
/// exec blocked on the leased program; resumes it once that child is dead and the lease
/// (`lease`, the perl holding it) is gone, so the exec would have gone on by then.
pub fn stop_across_the_start(wrapper: i32, lease: &mut Child) {
    let child = command_child(wrapper);
    signal(wrapper, libc::SIGSTOP);
    // Killed while the wrapper is stopped: a zombie its stopped parent has not reaped.
    wait_until_dead(child, "the blocked child is killed");
    let _ = lease.wait();
    signal(wrapper, libc::SIGCONT);
}
