//! The chaos suite: `locked-run` under the faults production brings (a server killed, restarted
//! empty, frozen or slow behind a fault proxy, keys flushed or taken over, a child that ignores
//! SIGTERM, a wrapper SIGKILLed or paused, signal storms, wall-clock jumps) and under contention,
//! with real processes. Each scenario asserts its outcome and records a figure; the table of
//! worst figures is printed at the end (`cargo test --test chaos`).
//!
//! T = 2 s wherever a kill margin is measured (R = 333 ms, K = 666 ms, D = 22 ms), so D is not
//! lost in scheduler noise. A kill margin is how long before the earliest possible server-side
//! expiry of the key the child was dead; it must be positive.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::proxy::{Mode, Proxy};
use support::*;

const TTL: &str = "2s";

/// One scenario's figure.
#[derive(Clone, Debug)]
enum Figure {
    /// Child dead this long before the key's earliest expiry (bigger is better).
    Margin(Duration),
    /// Child stopped this long after the event named (smaller is better).
    StoppedAfter(Duration, &'static str),
    /// The child was (rightly) left alone.
    Untouched,
    Note(String),
}

type Scenario = fn() -> Figure;

/// Each run's figure, or why it failed.
type Runs = Vec<Result<Figure, String>>;

fn main() {
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let scenarios: Vec<(&str, usize, Scenario)> = vec![
        ("redis killed mid-run", 3, redis_killed),
        ("redis restarted empty", 1, redis_restarted_empty),
        ("key flushed (FLUSHALL)", 1, key_flushed),
        ("key overwritten by another owner", 1, key_overwritten),
        ("blackhole past the kill point", 3, blackhole_long),
        ("blackhole shorter than T/3", 2, blackhole_short),
        ("latency just under the attempt timeout", 1, latency_under),
        ("latency just over the attempt timeout", 2, latency_over),
        ("connections reset every 150 ms", 1, resets),
        ("child ignores SIGTERM", 3, ignores_sigterm),
        ("SIGTERM storm during a lease-loss stop", 2, sigterm_storm),
        ("child forks grandchildren and exits", 1, grandchildren),
        ("locked-run SIGKILLed", 2, wrapper_sigkilled),
        ("locked-run SIGSTOPped past T, resumed", 2, wrapper_paused),
        ("wall clock jumps +1h then -1h", 1, wall_clock_jumps),
        ("contention 6 x 15, no faults", 1, contention_clean),
        ("contention with a fault each round", 1, contention_faults),
        (
            "file://: holder SIGKILLed, a waiter takes over",
            3,
            file_holder_killed,
        ),
        ("file://: contention 6 x 15", 1, file_contention),
    ];
    let scenarios: Vec<_> = scenarios
        .into_iter()
        .filter(|(name, _, _)| only.as_deref().is_none_or(|o| name.contains(o)))
        .collect();
    let started = Instant::now();
    let results: Mutex<BTreeMap<usize, (String, Runs)>> = Mutex::new(BTreeMap::new());
    // Scenarios mostly wait; four at a time keeps 2 cores far from saturated.
    let queue: Mutex<Vec<(usize, &str, usize, Scenario)>> = Mutex::new(
        scenarios
            .iter()
            .enumerate()
            .map(|(i, &(name, runs, f))| (i, name, runs, f))
            .rev()
            .collect(),
    );
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let Some((i, name, runs, f)) = queue.lock().unwrap().pop() else {
                        return;
                    };
                    let mut figures = Vec::new();
                    for _ in 0..runs {
                        let outcome = std::panic::catch_unwind(f).map_err(|e| {
                            e.downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_else(|| "panicked".into())
                        });
                        let failed = outcome.is_err();
                        figures.push(outcome);
                        if failed {
                            break;
                        }
                    }
                    eprintln!("chaos: {name}: done");
                    results
                        .lock()
                        .unwrap()
                        .insert(i, (name.to_owned(), figures));
                }
            });
        }
    });
    let results = results.into_inner().unwrap();
    println!();
    println!("| scenario | runs | result | worst figure |");
    println!("|---|---|---|---|");
    let mut failures = 0;
    for (name, figures) in results.values() {
        let failed: Vec<&String> = figures.iter().filter_map(|f| f.as_ref().err()).collect();
        let ok: Vec<&Figure> = figures.iter().filter_map(|f| f.as_ref().ok()).collect();
        let result = if failed.is_empty() { "ok" } else { "FAILED" };
        failures += failed.len();
        println!("| {name} | {} | {result} | {} |", figures.len(), worst(&ok));
        for f in failed {
            eprintln!("chaos: {name}: {f}");
        }
    }
    println!(
        "\nchaos suite: {} scenarios in {:.0?}",
        results.len(),
        started.elapsed()
    );
    if failures > 0 {
        eprintln!("chaos suite: {failures} failure(s)");
        std::process::exit(1);
    }
}

fn worst(figures: &[&Figure]) -> String {
    let margins: Vec<Duration> = figures
        .iter()
        .filter_map(|f| {
            if let Figure::Margin(m) = f {
                Some(*m)
            } else {
                None
            }
        })
        .collect();
    if let Some(m) = margins.iter().min() {
        return format!("child dead {} before the key's earliest expiry", ms(*m));
    }
    let late: Vec<(Duration, &str)> = figures
        .iter()
        .filter_map(|f| {
            if let Figure::StoppedAfter(d, what) = f {
                Some((*d, *what))
            } else {
                None
            }
        })
        .collect();
    if let Some((d, what)) = late.iter().max_by_key(|(d, _)| *d) {
        return format!("child stopped {} after {what}", ms(*d));
    }
    if let Some(Figure::Note(n)) = figures.iter().rev().find(|f| matches!(f, Figure::Note(_))) {
        return n.clone();
    }
    if figures.iter().any(|f| matches!(f, Figure::Untouched)) {
        return "child left alone, as it should be".into();
    }
    "-".into()
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn margin(expiry: Instant, death: Instant) -> Figure {
    assert!(
        death < expiry,
        "the child died {:?} AFTER the key's expiry",
        death - expiry
    );
    Figure::Margin(expiry - death)
}

fn lease_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["--ttl", TTL, "--connect-timeout", "1s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn job(url: &str, dir: &Path, extra: &[&str], child: &str) -> (Running, i32) {
    let args = lease_args(extra);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_job(url, dir, &args, child)
}

fn expect_lost(running: Running) -> Output {
    let out = running.wait();
    assert_eq!(out.code(), Some(76), "{out:?}");
    // The child's own stderr comes first (a shell says "Terminated" of its killed sleep).
    assert!(
        out.stderr
            .lines()
            .any(|l| l.starts_with("locked-run: lost the lock job")),
        "{}",
        out.stderr
    );
    out
}

// ---- the server goes away ----------------------------------------------------------------

fn redis_killed() -> Figure {
    let mut redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let expiry = expiry_lower_bound(&redis);
    redis.kill();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    expect_lost(running);
    figure
}

fn redis_restarted_empty() -> Figure {
    let mut redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    redis.restart_empty();
    let lost = Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let after = lost.elapsed();
    let out = expect_lost(running);
    assert!(out.stderr.contains("no longer ours"), "{}", out.stderr);
    // Found at the next renewal: within R (333 ms) plus an attempt's retries.
    assert!(after < Duration::from_millis(1_000), "{after:?}");
    Figure::StoppedAfter(after, "the restart")
}

fn key_flushed() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let _: String = redis.cmd(&["FLUSHALL"]);
    let lost = Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let after = lost.elapsed();
    expect_lost(running);
    assert!(after < Duration::from_millis(600), "{after:?}");
    Figure::StoppedAfter(after, "the flush")
}

fn key_overwritten() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let _: String = redis.cmd(&["SET", "lock:{job}", "another-owner", "PX", "60000"]);
    let lost = Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let after = lost.elapsed();
    expect_lost(running);
    assert_eq!(
        redis.get("lock:{job}").as_deref(),
        Some("another-owner"),
        "the new owner's lock is untouched"
    );
    assert!(after < Duration::from_millis(600), "{after:?}");
    Figure::StoppedAfter(after, "the overwrite")
}

// ---- the network misbehaves (fault proxy) ---------------------------------------------------

fn blackhole_long() -> Figure {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(&proxy.url(), dir.path(), &[], "exec sleep 60");
    let expiry = expiry_lower_bound(&redis);
    proxy.set(Mode::Blackhole);
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    expect_lost(running);
    figure
}

/// A child that runs until told to stop, then exits 5.
fn until_go(dir: &Path) -> String {
    format!(
        "while [ ! -e {d}/go ]; do sleep 0.01; done; exit 5",
        d = path_str(dir)
    )
}

fn finish_untouched(running: Running, dir: &Path) -> Figure {
    std::fs::write(dir.join("go"), "").unwrap();
    let out = running.wait();
    assert_eq!(out.code(), Some(5), "the child ran to its end: {out:?}");
    Figure::Untouched
}

fn blackhole_short() -> Figure {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(&proxy.url(), dir.path(), &[], &until_go(dir.path()));
    proxy.set(Mode::Blackhole);
    thread::sleep(Duration::from_millis(600)); // the outage: under T/3 = 666 ms
    proxy.set(Mode::Pass);
    // Long enough for a renewal to succeed again before the child is asked to finish.
    thread::sleep(Duration::from_millis(700));
    assert!(alive(child));
    finish_untouched(running, dir.path())
}

fn latency_under() -> Figure {
    // Attempts may take R/2 = 166 ms; 70 ms each way is a 140 ms round trip.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, _) = job(&proxy.url(), dir.path(), &[], &until_go(dir.path()));
    proxy.set(Mode::Latency(Duration::from_millis(70)));
    thread::sleep(Duration::from_secs(3)); // 1.5 T of slow renewals
    proxy.set(Mode::Pass);
    finish_untouched(running, dir.path())
}

fn latency_over() -> Figure {
    // 90 ms each way: every attempt times out at 166 ms, so the lease must be given up in time.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(&proxy.url(), dir.path(), &[], "exec sleep 60");
    let expiry = expiry_lower_bound(&redis);
    proxy.set(Mode::Latency(Duration::from_millis(90)));
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let figure = margin(expiry, Instant::now());
    // The cause named is the last failed attempt's: a timeout, or "no longer ours" when a
    // delayed renewal reached the server after the key had expired.
    expect_lost(running);
    figure
}

fn resets() -> Figure {
    // Every connection is reset shortly after it is made; renewals retry on fresh ones.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(&proxy.url(), dir.path(), &[], &until_go(dir.path()));
    for _ in 0..20 {
        thread::sleep(Duration::from_millis(150));
        proxy.set(Mode::Reset);
        proxy.set(Mode::Pass);
    }
    assert!(alive(child));
    finish_untouched(running, dir.path())
}

// ---- the child and the wrapper misbehave ------------------------------------------------

fn ignores_sigterm() -> Figure {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let terms = dir.path().join("terms");
    let child = format!(
        "trap 'date +%s%N >> {t}' TERM; while :; do sleep 0.05; done",
        t = path_str(&terms)
    );
    let (running, child) = job(&proxy.url(), dir.path(), &[], &child);
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

fn sigterm_storm() -> Figure {
    // The child ignores SIGTERM; the lease is lost; meanwhile SIGTERMs rain on locked-run.
    // They are forwarded, but must not reset the escalation: SIGKILL still comes by V - D.
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let (running, child) = job(
        &proxy.url(),
        dir.path(),
        &[],
        "trap '' TERM; while :; do sleep 0.05; done",
    );
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

fn grandchildren() -> Figure {
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

fn wrapper_sigkilled() -> Figure {
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

fn wrapper_paused() -> Figure {
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
fn libfaketime() -> Option<&'static str> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
}

fn wall_clock_jumps() -> Figure {
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

// ---- contention -----------------------------------------------------------------------------

/// Six workers, each running `runs` locked jobs in a row on one NAME; returns their statuses.
fn workers(url: &str, log: &Path, runs: usize, extra: &[&str]) -> Vec<i32> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    (0..runs)
                        .map(|_| {
                            let mut cmd = locked_run();
                            cmd.args(["-u", url, "--ttl", "1s", "--connect-timeout", "1s"])
                                .args(extra)
                                .args([
                                    "shared",
                                    "--",
                                    "perl",
                                    "-e",
                                    CRITICAL_SECTION,
                                    path_str(log),
                                ]);
                            run(cmd).code().unwrap_or(-1)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

fn contention_clean() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let started = Instant::now();
    let codes = workers(&redis.url(), &log, 15, &[]);
    assert!(codes.iter().all(|&c| c == 0), "{codes:?}");
    let sections = check_log(&log);
    assert_eq!(sections, 90);
    Figure::Note(format!(
        "90 runs, no overlap, fences strictly increasing, {}",
        ms(started.elapsed())
    ))
}

fn contention_faults() -> Figure {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port);
    let dir = scratch();
    let log = dir.path().join("log");
    let started = Instant::now();
    let mut statuses: BTreeMap<i32, usize> = BTreeMap::new();
    let mut faults = Vec::new();
    for round in 0..5 {
        let fault = match fastrand::u8(0..4) {
            0 => Mode::Blackhole,
            1 => Mode::Latency(Duration::from_millis(40)),
            2 => Mode::Reset,
            _ => Mode::Latency(Duration::from_millis(120)),
        };
        faults.push(format!("{fault:?}"));
        let codes = thread::scope(|s| {
            let work = s.spawn(|| workers(&proxy.url(), &log, 3, &["-w", "20s"]));
            // The fault lands in the middle of the round and lasts 400 ms.
            thread::sleep(Duration::from_millis(150 + 50 * round));
            proxy.set(fault);
            thread::sleep(Duration::from_millis(400));
            proxy.set(Mode::Pass);
            work.join().unwrap()
        });
        for c in codes {
            // 0: ran; 76: stopped on a lost lease; 69/75: could not take it during the fault.
            assert!([0, 69, 75, 76, 143].contains(&c), "unexpected status {c}");
            *statuses.entry(c).or_default() += 1;
        }
    }
    let sections = check_log(&log);
    Figure::Note(format!(
        "{sections} sections, no overlap, fences increasing; faults {}; statuses {statuses:?}; {}",
        faults.join(", "),
        ms(started.elapsed())
    ))
}

// ---- the host-local backend -----------------------------------------------------------------

fn file_holder_killed() -> Figure {
    let locks = scratch();
    let dir = scratch();
    let url = format!("file://{}", locks.path().display());
    let (holder, child) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let started = dir.path().join("waiter");
    let mut waiter = locked_run();
    waiter.args(["-u", &url, "job"]).args(sh(&format!(
        "echo $LOCKED_RUN_FENCE > {}",
        path_str(&started)
    )));
    let waiter = spawn(waiter);
    // Blocked in flock: `status` counts it (from /proc/locks).
    wait_until("the waiter is blocked", Duration::from_secs(10), || {
        let mut status = locked_run();
        status.args(["status", "--json", "-u", &url, "job"]);
        run(status).stdout.contains("\"waiters\":1")
    });
    let killed = Instant::now();
    signal(holder.pid(), libc::SIGKILL);
    wait_for_file(&started, Duration::from_secs(5), |t| t.ends_with('\n'));
    let took_over = killed.elapsed();
    assert!(wait_pid_exit(child, Duration::from_secs(5)), "PDEATHSIG");
    let stopped = killed.elapsed();
    assert_eq!(std::fs::read_to_string(&started).unwrap(), "2\n");
    assert_eq!(waiter.wait().code(), Some(0));
    let _ = holder.wait();
    Figure::Note(format!(
        "waiter ran {} after the holder's SIGKILL (its command gone after {}), with fence 2",
        ms(took_over),
        ms(stopped)
    ))
}

fn file_contention() -> Figure {
    let locks = scratch();
    let dir = scratch();
    let log = dir.path().join("log");
    let url = format!("file://{}", locks.path().display());
    let started = Instant::now();
    let codes = workers(&url, &log, 15, &[]);
    assert!(codes.iter().all(|&c| c == 0), "{codes:?}");
    assert_eq!(check_log(&log), 90);
    let fence = std::fs::read_to_string(locks.path().join("shared.fence")).unwrap();
    assert_eq!(fence, "90\n");
    Figure::Note(format!(
        "90 runs, no overlap, fences 1..90, {}",
        ms(started.elapsed())
    ))
}
