//! Chaos: the child and the wrapper misbehave (signals, SIGKILL, SIGSTOP, clock jumps).

#![allow(unused_imports)]

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;
use crate::*;

pub fn ignores_sigterm() -> Figure {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let terms = dir.path().join("terms");
    let child = format!(
        "trap 'date +%s%N >> {t}' TERM; while :; do sleep 0.05; done",
        t = path_str(&terms)
    );
    // T = 10 s: the child dies only at the SIGKILL, V - D, so the margin is D itself: 22 ms at
    // T = 2 s, which a wrapper's timer held up 100 ms on a busy machine lost once in CI (the
    // etcd clusters of the scenarios beside it); 102 ms at T = 10 s.
    let args = ["--ttl", "10s", "--connect-timeout", "1s"];
    let (running, child) = start_job(&proxy.url(), dir.path(), &args, &child);
    let expiry = expiry_lower_bound(&redis);
    proxy.set(Mode::Blackhole);
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let death = Instant::now();
    let death_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let figure = margin(expiry, death);
    let term: u128 = std::fs::read_to_string(&terms)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let grace = Duration::from_nanos((death_ns - term) as u64);
    assert!(
        grace >= Duration::from_millis(600),
        "SIGKILL {grace:?} after SIGTERM; --kill-after is 666 ms"
    );
    expect_lost(running);
    figure
}

pub fn sigterm_storm() -> Figure {
    // The child ignores SIGTERM; the lease is lost; meanwhile SIGTERMs rain on locked-run.
    // They are forwarded, but must not reset the escalation: SIGKILL still comes by V - D.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let trapped = dir.path().join("trapped");
    let (running, child) = job(
        &proxy.url(),
        dir.path(),
        &[],
        &format!(
            "trap '' TERM; touch {}; while :; do sleep 0.05; done",
            path_str(&trapped)
        ),
    );
    // The storm starts once SIGTERM is ignored: one that came before would end the shell.
    wait_for_file(&trapped, Duration::from_secs(10), |_| true);
    let expiry = expiry_lower_bound(&redis);
    proxy.set(Mode::Blackhole);
    let wrapper = running.pid();
    let storm = thread::spawn(move || {
        let mut sent = 0;
        while alive(child) && sent < 500 {
            signal(wrapper, libc::SIGTERM);
            sent += 1;
            thread::sleep(Duration::from_millis(10));
        }
        sent
    });
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    let sent = storm.join().unwrap();
    assert!(sent > 50, "{sent} SIGTERMs");
    expect_lost(running);
    figure
}

pub fn grandchildren() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let script = format!(
        "for i in 1 2 3; do (trap 'sleep 0.2; echo $i >> {d}/gone; exit 0' TERM; while :; do sleep 0.05; done) & done; \
         sleep 0.1; exit 0"
    );
    let started = Instant::now();
    let mut cmd = locked_run();
    cmd.args(["-u", &redis.url(), "--ttl", TTL, "job"])
        .args(sh(&script));
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let gone = std::fs::read_to_string(dir.path().join("gone")).unwrap_or_default();
    assert_eq!(
        gone.lines().count(),
        3,
        "all three grandchildren were stopped before locked-run exited"
    );
    assert!(!redis.exists("lock:{job}"), "and only then released");
    Figure::Note(format!(
        "3 grandchildren stopped, then released; run took {}",
        ms(started.elapsed())
    ))
}

pub fn wrapper_sigkilled() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let killed = Instant::now();
    signal(running.pid(), libc::SIGKILL);
    assert!(
        wait_pid_exit(child, Duration::from_secs(5)),
        "PDEATHSIG killed the child"
    );
    let after = killed.elapsed();
    wait_until("the lock expired", Duration::from_secs(5), || {
        !redis.exists("lock:{job}")
    });
    let freed = killed.elapsed();
    assert!(
        freed <= Duration::from_millis(2_200),
        "freed after {freed:?}, T is 2 s"
    );
    let _ = running.wait();
    Figure::StoppedAfter(after, "locked-run's death (PDEATHSIG)")
}

pub fn wrapper_paused() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    signal(running.pid(), libc::SIGSTOP);
    wait_until("the lease expired", Duration::from_secs(5), || {
        !redis.exists("lock:{job}")
    });
    let resumed = Instant::now();
    signal(running.pid(), libc::SIGCONT);
    assert!(wait_pid_exit(child, Duration::from_secs(5)));
    let after = resumed.elapsed();
    let out = expect_lost(running);
    assert!(out.stderr.contains("paused or suspended"), "{}", out.stderr);
    assert!(
        after < Duration::from_millis(500),
        "killed {after:?} after resuming, not at once"
    );
    Figure::StoppedAfter(after, "locked-run resumed")
}

/// libfaketime, when installed: it shifts the wall clock of one process.
pub fn libfaketime() -> Option<&'static str> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
}

pub fn wall_clock_jumps() -> Figure {
    let Some(lib) = libfaketime() else {
        panic!("libfaketime is not installed (apt-get install faketime); .ci/run installs it");
    };
    let redis = Redis::start();
    let dir = scratch();
    let rc = dir.path().join("faketime.rc");
    // Returns how the run ended when the wall clock jumps, with the monotonic clocks either left
    // alone (as in life) or faked along (to show the test would see a clock-dependent deadline).
    let run_with = |fake_monotonic: bool| -> Output {
        std::fs::write(&rc, "+0\n").unwrap();
        let mut cmd = locked_run();
        cmd.env("LD_PRELOAD", lib)
            .env("FAKETIME_TIMESTAMP_FILE", &rc)
            .env("FAKETIME_NO_CACHE", "1")
            .args(["-u", &redis.url(), "--ttl", TTL, "job", "--", "sleep", "3"]);
        if !fake_monotonic {
            cmd.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let running = spawn(cmd);
        wait_until("the lock is taken", Duration::from_secs(5), || {
            redis.exists("lock:{job}")
        });
        thread::sleep(Duration::from_millis(500));
        std::fs::write(&rc, "+1h\n").unwrap();
        if !fake_monotonic {
            // Back past where it started: a wall-clock timer would now wait an hour.
            thread::sleep(Duration::from_millis(1_000));
            std::fs::write(&rc, "-1h\n").unwrap();
        }
        // Renewals must go on through both jumps: the lease never runs out on the server
        // while the command (sleep 3) runs; the check stops short of its end and the release.
        let until = running.started + Duration::from_millis(2_700);
        while !fake_monotonic && Instant::now() < until {
            let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
            assert!(pttl > 0, "the lease lapsed on the server ({pttl})");
            thread::sleep(Duration::from_millis(50));
        }
        running.wait()
    };
    let out = run_with(false);
    assert_eq!(
        out.code(),
        Some(0),
        "wall-clock jumps moved no deadline: {out:?}"
    );
    let contrast = run_with(true);
    assert_eq!(
        contrast.code(),
        Some(76),
        "with the boot clock faked too, the jump is seen: {contrast:?}"
    );
    Figure::Note("no deadline moved (a faked boot clock would have killed: 76)".into())
}
