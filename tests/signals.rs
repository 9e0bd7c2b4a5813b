//! Signals: forwarded to the child's whole group, the child's death by a signal passed on,
//! what the child leaves behind stopped before the release, PDEATHSIG, ignored signals kept.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::Duration;

use crate::support::*;

/// A perl child that forks a grandchild; both log every forwarded signal they get and exit on
/// TERM.
const LOGGER: &str = r#"
$| = 1;
my ($log, $ready, $own_group) = @ARGV;
my $who = fork() ? "parent" : "child";
setpgrp(0, 0) if $who eq "child" && $own_group;
for my $s (qw(TERM INT HUP QUIT USR1 USR2)) {
    $SIG{$s} = sub {
        open(my $f, ">>", $log) or die; print $f "$who $_[0]\n"; close $f;
        exit 0 if $_[0] eq "TERM";
    };
}
open(my $f, ">>", $ready) or die; print $f "$who\n"; close $f;
sleep 1 while 1;
"#;

#[test]
fn every_forwarded_signal_reaches_the_childs_whole_group() {
    let redis = Redis::start();
    let dir = scratch();
    let (log, ready) = (file(&dir, "log"), file(&dir, "ready"));
    let running = lr()
        .url(&redis.url())
        .job(["perl", "-e", LOGGER, path_str(&log), path_str(&ready)])
        .spawn();
    wait_for_file(&ready, Duration::from_secs(10), |t| t.lines().count() == 2);
    for (sig, name) in [
        (libc::SIGUSR1, "USR1"),
        (libc::SIGUSR2, "USR2"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGINT, "INT"),
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGTERM, "TERM"),
    ] {
        signal(running.pid(), sig);
        wait_for_file(&log, Duration::from_secs(10), |t| {
            t.contains(&format!("parent {name}\n")) && t.contains(&format!("child {name}\n"))
        });
    }
    running.wait().expect_with(0, "the child exited 0 on TERM");
    assert!(!redis.exists("lock:{job}"), "released");
}

#[test]
fn sigterm_to_locked_run_ends_the_child_and_locked_run_with_the_same_signal() {
    let redis = Redis::start();
    let dir = scratch();
    let pid_file = file(&dir, "pid");
    let running = lr()
        .url(&redis.url())
        .name("job")
        .sh(&format!(
            "echo $$ > {p}.tmp; mv {p}.tmp {p}; exec sleep 60",
            p = path_str(&pid_file)
        ))
        .spawn();
    wait_for_file(&pid_file, Duration::from_secs(10), |t| t.ends_with('\n'));
    signal(running.pid(), libc::SIGTERM);
    let out = running.wait();
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{out:?}");
    assert!(!redis.exists("lock:{job}"), "released before dying");
    assert_eq!(out.stderr, "");
}

#[test]
fn a_child_killed_by_a_signal_is_passed_on_without_a_core_dump() {
    let redis = Redis::start();
    for (sig, name) in [(libc::SIGUSR1, "USR1"), (libc::SIGQUIT, "QUIT")] {
        let out = lr()
            .url(&redis.url())
            .name("job")
            .sh(&format!("kill -{name} $$"))
            .run();
        assert_eq!(out.status.signal(), Some(sig), "{name}: {out:?}");
        assert!(!out.status.core_dumped(), "{name}: core dumps are off");
        assert!(!redis.exists("lock:{job}"));
    }
}

#[test]
fn processes_left_behind_are_stopped_before_the_release() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    // The child exits at once, leaving a grandchild that takes 300 ms to stop on SIGTERM.
    let script = format!(
        "(trap 'sleep 0.3; echo done > {d}/gc-done; exit 0' TERM; echo $$ > {d}/gc.tmp; mv {d}/gc.tmp {d}/gc; \
          while :; do sleep 0.05; done) & \
         while [ ! -e {d}/gc ]; do sleep 0.01; done; exit 3"
    );
    lr().url(&redis.url())
        .name("job")
        .sh(&script)
        .run()
        .expect_with(3, "the child's status");
    // locked-run released (and exited) only after the grandchild was gone.
    assert!(
        file(&dir, "gc-done").exists(),
        "the grandchild finished before locked-run did"
    );
    let gc: i32 = std::fs::read_to_string(file(&dir, "gc"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!alive(gc));
    assert!(!redis.exists("lock:{job}"));
}

#[test]
fn a_sigkilled_locked_run_takes_its_child_along_and_the_lock_expires() {
    let redis = Redis::start();
    let dir = scratch();
    let pid_file = file(&dir, "pid");
    let running = lr()
        .url(&redis.url())
        .args(["--ttl", "1s"])
        .name("job")
        .sh(&format!(
            "echo $$ > {p}.tmp; mv {p}.tmp {p}; exec sleep 60",
            p = path_str(&pid_file)
        ))
        .spawn();
    let child: i32 = wait_for_file(&pid_file, Duration::from_secs(10), |t| t.ends_with('\n'))
        .trim()
        .parse()
        .unwrap();
    signal(running.pid(), libc::SIGKILL);
    assert!(
        wait_pid_exit(child, Duration::from_secs(5)),
        "PDEATHSIG killed the child"
    );
    wait_until("the lease expired", Duration::from_secs(5), || {
        !redis.exists("lock:{job}")
    });
    let _ = running.wait();
}

#[test]
fn a_forwarded_signal_starts_no_timer_of_its_own() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    // The child ignores TERM and finishes when told; K is 100 ms.
    let script = format!(
        "trap '' TERM; echo up > {d}/up; while [ ! -e {d}/go ]; do sleep 0.01; done; exit 4"
    );
    let running = lr()
        .url(&redis.url())
        .args(["--ttl", "300ms"])
        .name("job")
        .sh(&script)
        .spawn();
    wait_for_file(&file(&dir, "up"), Duration::from_secs(10), |t| {
        !t.is_empty()
    });
    signal(running.pid(), libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500)); // five times K
    std::fs::write(file(&dir, "go"), "").unwrap();
    running
        .wait()
        .expect_with(4, "no SIGKILL followed the forwarded SIGTERM");
}

#[test]
fn signals_ignored_at_start_stay_ignored_for_the_child() {
    let redis = Redis::start();
    let dir = scratch();
    let status_of = |ignore_hup: bool| -> u64 {
        let out_file = file(&dir, "sigign");
        let _ = std::fs::remove_file(&out_file);
        let mut cmd = lr().url(&redis.url()).name("job").sh(&format!(
            "grep SigIgn /proc/$$/status > {}",
            path_str(&out_file)
        ));
        if ignore_hup {
            // SAFETY: signal(2) between fork and exec.
            cmd = cmd.with(|c| unsafe {
                c.pre_exec(|| {
                    libc::signal(libc::SIGHUP, libc::SIG_IGN);
                    Ok(())
                })
            });
        }
        cmd.run().expect(0);
        let text = std::fs::read_to_string(&out_file).unwrap();
        u64::from_str_radix(text.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    let hup = 1 << (libc::SIGHUP - 1);
    assert_eq!(status_of(true) & hup, hup, "nohup's SIGHUP stays ignored");
    assert_eq!(status_of(false) & hup, 0, "and is not ignored otherwise");
}

#[test]
fn processes_that_leave_the_group_but_not_the_session_are_stopped_too() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    // One grandchild changes process group (as `timeout` or `set -m` do); another calls
    // setsid (a daemon meant to outlive the job). The child then exits.
    let child = format!(
        r#"use POSIX;
           if (!fork) {{ POSIX::setpgid(0, 0); open(F, ">{d}/moved"); print F $$; close F; sleep 60; exit }}
           if (!fork) {{ POSIX::setsid(); open(STDOUT, ">/dev/null"); open(STDERR, ">/dev/null"); open(F, ">{d}/daemon"); print F $$; close F; sleep 60; exit }}
           sleep 0.01 until -s "{d}/moved" && -s "{d}/daemon";"#
    );
    lr().url(&redis.url())
        .job(["perl", "-e", &child])
        .run()
        .expect(0);
    let pid = |f: &str| -> i32 {
        std::fs::read_to_string(file(&dir, f))
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(
        !alive(pid("moved")),
        "the grandchild in another group was stopped before the release"
    );
    assert!(
        alive(pid("daemon")),
        "the one that called setsid was let go"
    );
    signal(pid("daemon"), libc::SIGKILL);
    assert!(!redis.exists("lock:{job}"));
}

#[test]
fn orphans_are_reaped_while_the_command_runs() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    // Twenty short-lived orphans (double fork): each is re-parented to locked-run and dies.
    let script = format!(
        "for i in $(seq 20); do (sleep 0.01 &); done; echo > {d}/forked; \
         while [ ! -e {d}/go ]; do sleep 0.01; done"
    );
    let running = lr().url(&redis.url()).name("job").sh(&script).spawn();
    wait_for_file(&file(&dir, "forked"), Duration::from_secs(10), |t| {
        !t.is_empty()
    });
    let wrapper = running.pid();
    wait_until("no zombie children left", Duration::from_secs(5), || {
        zombie_children(wrapper) == 0
    });
    std::fs::write(file(&dir, "go"), "").unwrap();
    running.wait().expect(0);
}

fn zombie_children(pid: i32) -> usize {
    let mut zombies = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in list.split_whitespace() {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            if stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            {
                zombies += 1;
            }
        }
    }
    zombies
}

/// A signal sent to `locked-run` goes to the command's process group, not to a descendant that
/// moved to a group of its own (a `set -m` job; here the command's child): USR1 would end such a
/// process, which was never meant to get it. (When the command exits, that process is still
/// stopped with the rest.)
#[test]
fn forwarded_signals_stay_in_the_commands_group() {
    let redis = Redis::start();
    let dir = scratch();
    let (log, ready) = (file(&dir, "log"), file(&dir, "ready"));
    let running = lr()
        .url(&redis.url())
        .job(["perl", "-e", LOGGER])
        .args([path_str(&log), path_str(&ready), "own-group"])
        .spawn();
    wait_for_file(&ready, Duration::from_secs(10), |t| t.lines().count() == 2);
    signal(running.pid(), libc::SIGUSR1);
    wait_for_file(&log, Duration::from_secs(10), |t| {
        t.contains("parent USR1\n")
    });
    signal(running.pid(), libc::SIGTERM);
    // The command exits on TERM; what it left behind gets the kill signal after it.
    let log = wait_for_file(&log, Duration::from_secs(10), |t| {
        t.contains("child TERM\n")
    });
    assert!(!log.contains("child USR1"), "{log}");
    running.wait().expect(0);
    assert!(!redis.exists("lock:{job}"), "released");
}
