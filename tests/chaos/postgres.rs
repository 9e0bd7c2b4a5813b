//! Chaos on `postgres://`, T = 2 s: the link blackholed past the kill point, and every process
//! of the server paused (SIGSTOP) during a hold. Either way the command must be dead before the
//! holder row's `expires_at`, read from the server's own clock just before the fault.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::postgres::Postgres;
use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use crate::*;

pub fn postgres_blackhole() -> Figure {
    let pg = Postgres::start();
    let proxy = Proxy::start(pg.port);
    let dir = scratch();
    let url = pg
        .url()
        .replace(&format!(":{}/", pg.port), &format!(":{}/", proxy.port));
    let (running, child) = job(&url, dir.path(), &[], "exec sleep 60");
    let expiry = row_expiry(&pg);
    proxy.set(Mode::Blackhole);
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    expect_lost(running);
    figure
}

pub fn postgres_paused() -> Figure {
    let pg = Postgres::start();
    let dir = scratch();
    let (running, child) = job(&pg.url(), dir.path(), &[], "exec sleep 60");
    let expiry = row_expiry(&pg);
    let stopped = server_processes(pg.pid());
    for &pid in &stopped {
        let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
    }
    let dead = wait_pid_exit(child, Duration::from_secs(10));
    let death = Instant::now();
    for &pid in &stopped {
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
    }
    assert!(dead, "the command outlived a paused server");
    let figure = margin(expiry, death);
    expect_lost(running);
    figure
}

/// A lower bound of when the holder row of `job` lapses: the server's own count of what is
/// left, added to an instant taken before it was asked.
fn row_expiry(pg: &Postgres) -> Instant {
    let before = Instant::now();
    let left: f64 = pg
        .psql(
            "SELECT extract(epoch FROM expires_at - clock_timestamp()) * 1000 \
             FROM locked_run.holder WHERE name = 'job'",
        )
        .parse()
        .expect("the holder row's time left");
    before + Duration::from_millis(left.max(0.0) as u64)
}

/// The postmaster and every process it forked (its backends and workers).
fn server_processes(postmaster: i32) -> Vec<i32> {
    let mut pids = vec![postmaster];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The parent pid is the second field after the parenthesised command name.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(postmaster) {
            pids.push(pid);
        }
    }
    pids
}
