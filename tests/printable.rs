//! What another host wrote reaches no terminal raw: a holder whose host name (set in a UTS
//! namespace, as a container's owner may) is made of terminal escape sequences, a bell, a
//! carriage return, a C1 control and a forged history row, on every backend. `status` (its
//! "held by" and "last run" lines, and `--json`), `history` (text and `--json`) and `release`
//! show it escaped, on stdout and stderr alike.

use std::process::Command;
use std::time::Duration;

use crate::support::postgres::Postgres;
use crate::support::*;

/// The host name (52 bytes: a host name holds 64): sets the window title, erases the
/// line and writes a forged history row over it; CSI as the one-character C1 control U+009B,
/// which JSON encoders leave raw.
const HOST: &str = "w\u{1b}]0;PWNED\u{7}\u{1b}[2K\r2026-01-01  exit 0  fence 999\u{9b}31m x";

/// Runs the command in a UTS namespace of its own whose host name is [`HOST`] (as root).
fn hostile_host(cmd: &mut Command) -> &mut Command {
    crate::support::hostile::on_host_named(cmd, HOST)
}

/// The characters of `text` a terminal would act on: every control character but the newline
/// that ends a line.
fn raw(text: &str) -> Vec<char> {
    text.chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect()
}

/// Both outputs of `out` are free of raw control characters, and stdout shows the host.
fn printable_and_shown(what: &str, out: &Output) {
    assert!(
        raw(&out.stdout).is_empty() && raw(&out.stderr).is_empty(),
        "{what} printed {:?} raw: {out:?}",
        [raw(&out.stdout), raw(&out.stderr)].concat()
    );
    assert!(out.stdout.contains("PWNED"), "{what}: {out:?}");
}

/// `url`: the `-u` arguments; `run_args`: what the holder's run takes besides.
fn hostile_names_are_printed_escaped(url: &[String], run_args: &[&str]) {
    // SAFETY: geteuid has no preconditions.
    if skip_unless(
        unsafe { libc::geteuid() } == 0,
        "a UTS namespace needs root",
    ) {
        return;
    }
    let dir = scratch();
    let (up, go) = (file(&dir, "up"), file(&dir, "go"));
    let holder = lr()
        .args(url)
        .args(run_args)
        .name("job")
        .sh(&format!(
            "echo up > {}; while [ ! -e {} ]; do sleep 0.05; done",
            path_str(&up),
            path_str(&go)
        ))
        .with(hostile_host)
        .spawn();
    wait_for_file(&up, Duration::from_secs(20), |t| t.contains("up"));
    let status = lr().args(url).args(["status", "job"]).run().expect(0);
    printable_and_shown("status's held by line", &status);
    assert!(status.stdout.contains("\\u{1b}]0;PWNED"), "{status:?}");
    let json = lr()
        .args(url)
        .args(["status", "--json", "job"])
        .run()
        .expect(0);
    printable_and_shown("status --json", &json);
    assert_eq!(json.json()["held"], true);
    // Refused without --force: the line on stderr names the holder.
    let refused = lr().args(url).args(["release", "job"]).run().expect(2);
    assert!(raw(&refused.stderr).is_empty(), "{refused:?}");
    assert!(refused.stderr.contains("PWNED"), "{refused:?}");
    std::fs::write(&go, "").unwrap();
    holder.wait().expect(0);
    let status = lr().args(url).args(["status", "job"]).run().expect(1);
    printable_and_shown("status's last run line", &status);
    assert!(status.stdout.contains("  last run: "), "{status:?}");
    let history = lr().args(url).args(["history", "job"]).run().expect(0);
    printable_and_shown("history", &history);
    assert_eq!(history.stdout.lines().count(), 1, "{history:?}");
    let json = lr()
        .args(url)
        .args(["history", "--json", "job"])
        .run()
        .expect(0);
    printable_and_shown("history --json", &json);
    assert_eq!(
        json.json()[0]["host"],
        HOST,
        "JSON escapes it, and keeps it"
    );
}

#[test]
fn redis_prints_hostile_host_names_escaped() {
    let redis = Redis::start();
    hostile_names_are_printed_escaped(&["-u".into(), redis.url()], &[]);
}

#[test]
fn file_prints_hostile_host_names_escaped() {
    let locks = scratch();
    hostile_names_are_printed_escaped(&["-u".into(), file_url(locks.path())], &[]);
}

#[test]
fn etcd_prints_hostile_host_names_escaped() {
    let etcd = Etcd::start();
    hostile_names_are_printed_escaped(&["-u".into(), etcd.url()], &[]);
}

#[test]
fn postgres_prints_hostile_host_names_escaped() {
    let pg = Postgres::start();
    hostile_names_are_printed_escaped(&["-u".into(), pg.url()], &[]);
}

#[test]
fn redlock_prints_hostile_host_names_escaped() {
    let five = Five::start();
    // Redlock's per-server timeout at its default (T/100) is missed on two loaded cores.
    hostile_names_are_printed_escaped(&five.url_args(), &["--node-timeout", "300ms"]);
}
