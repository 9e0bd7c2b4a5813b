//! Chaos: the holes a hostile review found, each played out with real processes: a failover
//! that promotes a replica which missed a renewal, a SIGKILLed wrapper whose job forked, and
//! Redlock renewals that must not erode to an exact quorum.

use std::time::{Duration, Instant};

use crate::support::proxy::Mode;
use crate::support::*;
use crate::*;

/// `--wait-replicas 1` through Sentinel, T = 4 s (R = 667 ms, K = 1.33 s, D = 42 ms). The
/// replica's link is blackholed: renewals still reach the primary, but the replica keeps the
/// expiry of the last renewal it received, and a failover promotes it. The command must be
/// dead before that copy of the lease runs out, since from then on the promoted replica hands
/// the lock to the next holder.
pub fn failover_after_an_unacknowledged_renewal() -> Figure {
    let watched = Watched::start_through_proxy();
    let dir = scratch();
    let (running, child) = start_job(
        &watched.url(),
        dir.path(),
        &[
            "--ttl",
            "4s",
            "--wait-replicas",
            "1",
            "--connect-timeout",
            "1s",
        ],
        "exec sleep 60",
    );
    wait_until(
        "the grant reached the replica",
        Duration::from_secs(10),
        || watched.replica.exists("lock:{job}"),
    );
    watched
        .link
        .as_ref()
        .expect("a proxied link")
        .set(Mode::Blackhole);
    wait_until(
        "a renewal that reached the primary and not the replica",
        Duration::from_secs(5),
        || {
            let primary: i64 = watched.primary.cmd(&["PTTL", "lock:{job}"]);
            let replica: i64 = watched.replica.cmd(&["PTTL", "lock:{job}"]);
            primary > replica + 300
        },
    );
    let before = Instant::now();
    let pttl: i64 = watched.replica.cmd(&["PTTL", "lock:{job}"]);
    assert!(pttl > 0, "the replica still holds the lease: {pttl}");
    let replica_expiry = before + Duration::from_millis(pttl as u64);
    let died = wait_pid_exit(
        child,
        replica_expiry.saturating_duration_since(Instant::now()) + Duration::from_secs(2),
    );
    assert!(
        died,
        "the command still ran 2 s after the replica's copy of the lease ran out"
    );
    let figure = margin(replica_expiry, Instant::now());
    let out = expect_lost(running);
    assert!(out.stderr.contains("replicas"), "{}", out.stderr);

    // The promoted replica lets the next holder in, with the next fence: the grant's fence
    // reached the replica because the grant, too, waited for it.
    wait_until(
        "the replica's copy of the lease ran out",
        Duration::from_secs(5),
        || !watched.replica.exists("lock:{job}"),
    );
    watched.fail_over();
    let mut next = locked_run();
    next.args(["-u", &watched.url(), "-w", "10s", "--connect-timeout", "1s"])
        .args(["job", "--", "sh", "-c", "echo $LOCKED_RUN_FENCE"]);
    let next = run(next);
    assert_eq!(next.code(), Some(0), "{next:?}");
    assert_eq!(next.stdout.trim(), "2", "{next:?}");
    figure
}

/// A job that forks a long-running grandchild and waits for it; its wrapper is SIGKILLed
/// while the next holder waits. PDEATHSIG reaches the shell only: the grandchild must be
/// stopped all the same, before the next holder's command starts (which checks).
fn sigkilled_wrapper(url: &str) -> (Duration, String) {
    let dir = scratch();
    let d = path_str(dir.path());
    let (holder, _shell) = job(
        url,
        dir.path(),
        &[],
        &format!("sleep 300 & echo $! > {d}/gc.tmp; mv {d}/gc.tmp {d}/gc; wait"),
    );
    let grandchild: i32 = wait_for_file(&dir.path().join("gc"), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    })
    .trim()
    .parse()
    .unwrap();
    let verdict = dir.path().join("verdict");
    let mut next = locked_run();
    next.args(lease_args(&["-u", url, "-w", "20s"]))
        .arg("job")
        .args(sh(&format!(
            "state=$(cut -d' ' -f3 /proc/{grandchild}/stat 2>/dev/null); \
             if [ -n \"$state\" ] && [ \"$state\" != Z ]; then echo overlap; else echo alone; fi > {v}",
            v = path_str(&verdict)
        )));
    let next = spawn(next);
    wait_until_waiting(url);
    let killed = Instant::now();
    signal(holder.pid(), libc::SIGKILL);
    assert!(
        wait_pid_exit(grandchild, Duration::from_secs(10)),
        "the grandchild outlived its SIGKILLed wrapper"
    );
    let gone = killed.elapsed();
    let said = wait_for_file(&verdict, Duration::from_secs(20), |t| t.ends_with('\n'));
    assert_eq!(
        said.trim(),
        "alone",
        "the next holder's command started beside the grandchild"
    );
    let next = next.wait();
    assert_eq!(next.code(), Some(0), "{next:?}");
    let _ = holder.wait();
    (gone, said)
}

/// Until a second `locked-run` on `url` waits for `job`: subscribed to its release channel
/// (Redis), or blocked on its lock file (`/proc/locks`, which `status` reads).
fn wait_until_waiting(url: &str) {
    wait_until("the next holder waits", Duration::from_secs(10), || {
        let mut status = locked_run();
        status.args(["status", "--json", "-u", url, "job"]);
        run(status).stdout.contains("\"waiters\":1")
    });
}

pub fn wrapper_sigkilled_grandchild_redis() -> Figure {
    let redis = Redis::start();
    let (gone, _) = sigkilled_wrapper(&redis.url());
    Figure::StoppedAfter(gone, "the wrapper's SIGKILL (grandchild)")
}

pub fn wrapper_sigkilled_grandchild_file() -> Figure {
    let locks = scratch();
    let url = format!("file://{}", locks.path().display());
    let (gone, _) = sigkilled_wrapper(&url);
    Figure::StoppedAfter(
        gone,
        "the wrapper's SIGKILL (grandchild; lock kept until then)",
    )
}

/// Redlock on five servers, T = 2 s: two restart empty during a long hold, then a third stops
/// answering. Renewals re-take the two empty servers, so four still hold the lock and the run
/// goes on; without that, the lease is down to an exact quorum and the third server loses it.
pub fn redlock_renewal_retakes_restarted_servers() -> Figure {
    let mut five = Five::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let mut cmd = locked_run_on(&five);
    cmd.args(lease_args(&[])).arg("job").args(sh(&format!(
        "echo $$ $LOCKED_RUN_TOKEN $LOCKED_RUN_FENCE > {d}/token.tmp; mv {d}/token.tmp {d}/token; \
         while [ ! -e {d}/go ]; do sleep 0.01; done"
    )));
    let running = spawn(cmd);
    let said = wait_for_file(&dir.path().join("token"), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    });
    let fields: Vec<&str> = said.split_whitespace().collect();
    let (shell, token, fence): (i32, &str, &str) =
        (fields[0].parse().unwrap(), fields[1], fields[2]);
    wait_until("all five hold it", Duration::from_secs(5), || {
        five.holding(token) == 5
    });
    five.servers[0].restart_empty();
    five.servers[1].restart_empty();
    // A renewal round finds the restarted servers' connections broken; a round after it
    // reaches them, empty, and takes them again (about 1 s). Then the third server freezes.
    wait_until(
        "the renewals take the two restarted servers again",
        Duration::from_secs(5),
        || five.holding(token) == 5,
    );
    five.servers[2].pause();
    let paused = Instant::now();
    while paused.elapsed() < Duration::from_millis(2_500) {
        assert!(
            alive(shell),
            "the lease was lost while four of five servers could hold it"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for server in [0, 1, 3, 4].map(|i| &five.servers[i]) {
        assert_eq!(server.get("lock:{job}").as_deref(), Some(token));
    }
    for server in &five.servers[..2] {
        assert_eq!(
            server.get("fence:{job}").as_deref(),
            Some(fence),
            "a re-taken server's fence counter is raised to the holder's fence"
        );
    }
    five.servers[2].resume();
    std::fs::write(dir.path().join("go"), "").unwrap();
    let out = running.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    Figure::Note(
        "2 of 5 restarted empty and were re-taken; a 3rd frozen 2.5 s: the run went on".into(),
    )
}
