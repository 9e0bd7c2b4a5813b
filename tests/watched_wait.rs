//! A wait someone watches says so: in CI (the `CI` variable) a run still waiting after about
//! 2 s prints who holds the lock; on a terminal the line is updated in place and ended once the
//! wait is over; under cron (no terminal, no `CI`) and with `-q` a wait stays silent.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

/// A waiter on `job` held by `holder`, its `-w` running out after 3 s, in `env`.
fn waiter(redis: &Redis, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut run = lr().url(&redis.url()).args(["-w", "3s"]).args(extra);
    for (key, value) in env {
        run = run.env(key, value);
    }
    run.job(["true"]).run().expect(75)
}

#[test]
fn in_ci_a_wait_says_who_holds_the_lock_and_under_cron_it_stays_silent() {
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &[]);
    let ci = waiter(&redis, &[], &[("CI", "true")]);
    let lines: Vec<&str> = ci
        .stderr
        .lines()
        .filter(|l| l.starts_with("locked-run: waiting for lock job"))
        .collect();
    assert_eq!(lines.len(), 1, "one line after 2 s: {}", ci.stderr);
    assert!(
        lines[0].contains("held by ") && lines[0].contains(&format!("pid {}", holder.pid())),
        "{}",
        ci.stderr
    );
    let cron = waiter(&redis, &[], &[]);
    assert!(
        !cron.stderr.contains("locked-run: waiting"),
        "{}",
        cron.stderr
    );
    let quiet = waiter(&redis, &["-q"], &[("CI", "true")]);
    assert!(
        !quiet.stderr.contains("locked-run: waiting"),
        "{}",
        quiet.stderr
    );
    holder.finish();
}

/// On a terminal the line is written in place (a carriage return before it, the rest of the
/// terminal's line erased) and ended with a newline once the lock is taken.
#[test]
fn on_a_terminal_the_line_is_updated_in_place_and_ended() {
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &[]);
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let slave: OwnedFd = pty.slave;
    let mut command = lr().url(&redis.url()).job(["true"]).into_command();
    command
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave.try_clone().unwrap()));
    let mut run = command.spawn().unwrap();
    drop(slave);
    let mut master = std::fs::File::from(pty.master);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            seen.extend_from_slice(&buf[..n]);
            let _ = tx.send(String::from_utf8_lossy(&seen).into_owned());
        }
    });
    let mut seen = String::new();
    while !seen.contains("waiting for lock job") {
        seen = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the line, within 10 s");
    }
    holder.finish();
    let status = wait_timeout(&mut run, Duration::from_secs(20)).expect("ends once it holds");
    assert_eq!(status.code(), Some(0));
    while let Ok(more) = rx.recv_timeout(Duration::from_secs(2)) {
        seen = more;
    }
    assert!(
        seen.contains("\rlocked-run: waiting for lock job, held by "),
        "{seen:?}"
    );
    assert!(seen.contains("\x1b[K"), "{seen:?}");
    assert!(
        seen.ends_with('\n'),
        "ended once the wait is over: {seen:?}"
    );
}
