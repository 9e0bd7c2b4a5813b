//! Chaos on `etcd://`: the link to etcd blackholed past the kill point (the command dead before
//! its lease could end, T = 6 s; exclusive and shared), and etcd's leader SIGKILLed during a hold (the hold goes on,
//! T = 10 s).

use std::time::{Duration, Instant};

use crate::support::etcd::Etcd;
use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use crate::*;

pub fn etcd_blackhole() -> Figure {
    blackhole(&[])
}

/// The same for a shared holder, whose lease is its own.
pub fn etcd_shared_blackhole() -> Figure {
    blackhole(&["--shared"])
}

fn blackhole(mode: &[&str]) -> Figure {
    let etcd = Etcd::start();
    let proxy = Proxy::start(etcd.members[0].client_port);
    let dir = scratch();
    let url = format!("etcd://127.0.0.1:{}", proxy.port);
    // T = 6 s: etcd reports what is left of a lease in whole seconds (truncated), so the
    // bound below is up to a second early; with T = 2 s that second is half the lease.
    let mut args = vec!["--ttl", "6s", "--connect-timeout", "1s"];
    args.extend(mode);
    let (running, child) = start_job(&url, dir.path(), &args, "exec sleep 60");
    let (key, _, _) = etcd.keys("job/").into_iter().next().expect("the run's key");
    let lease = key.trim_start_matches("job/").to_owned();
    // A lower bound of the lease's end: etcd truncates what is left to whole seconds.
    let before = Instant::now();
    let left = etcd.time_to_live(&lease);
    let expiry = before + Duration::from_secs(left.max(0) as u64);
    proxy.set(Mode::Blackhole);
    assert!(wait_pid_exit(child, Duration::from_secs(20)));
    let figure = margin(expiry, Instant::now());
    expect_lost(running);
    figure
}

pub fn etcd_leader_killed() -> Figure {
    let mut etcd = Etcd::start_cluster();
    let dir = scratch();
    let d = path_str(dir.path());
    // T = 10 s: an election (etcd's default election timeout is 1 s, and on a loaded machine
    // a member may wait out several) must fit in the lease's renewal window, T - R - K = 5 s.
    let mut cmd = locked_run();
    cmd.args(["-u", &etcd.url(), "--ttl", "10s", "--connect-timeout", "1s"])
        .arg("job")
        .args(sh(&format!(
            "echo up > {d}/up; while [ ! -e {d}/go ]; do sleep 0.01; done"
        )));
    let running = spawn(cmd);
    wait_for_file(&dir.path().join("up"), Duration::from_secs(20), |t| {
        !t.is_empty()
    });
    let leader = etcd.leader();
    etcd.members[leader].kill();
    // Past the lease the kill found: renewed on the members left, through the election.
    std::thread::sleep(Duration::from_secs(12));
    std::fs::write(dir.path().join("go"), "").unwrap();
    let out = running.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    Figure::Note("the hold went on past its lease (T = 10 s) through the leader's SIGKILL".into())
}
