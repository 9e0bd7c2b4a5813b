//! Redlock over five real redis-server processes: quorum, failures, loss mid-run, fences that
//! stay monotonic when a minority of servers restart empty, contention, a slow server, status.

use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

/// A holder of `job` on the five servers: its command prints its fence, writes its token to
/// `dir/token` (returned), and runs until `dir/go` exists.
fn hold(five: &Five, extra: &[&str], dir: &std::path::Path) -> (Running, String) {
    let d = path_str(dir);
    let running = lr()
        .on(five)
        .args(extra)
        .name("job")
        .sh(&format!(
            "echo $LOCKED_RUN_TOKEN > {d}/token.tmp; mv {d}/token.tmp {d}/token; echo $LOCKED_RUN_FENCE; \
             while [ ! -e {d}/go ]; do sleep 0.01; done"
        ))
        .spawn();
    let token = wait_for_file(&dir.join("token"), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    });
    (running, token.trim().to_owned())
}

#[test]
fn a_quorum_holds_the_lock_with_one_token_and_fence() {
    let five = Five::start();
    let dir = scratch();
    let (running, token) = hold(&five, &[], dir.path());
    assert_eq!(five.holding(&token), 5, "every server holds our token");
    let counters: Vec<Option<String>> = five.servers.iter().map(|r| r.get("fence:{job}")).collect();
    std::fs::write(file(&dir, "go"), "").unwrap();
    let out = running.wait().expect(0);
    // 1, unless a first attempt under load missed the quorum (its grants given back, their
    // counters raised): then the next one's. Every server's counter was raised to it.
    let fence = out.stdout.trim().to_owned();
    assert!(fence.parse::<u64>().is_ok_and(|f| f >= 1), "{fence}");
    assert_eq!(counters, vec![Some(fence); 5], "one fence on every server");
    assert_eq!(five.holding(&token), 0, "released everywhere");
}

#[test]
fn two_servers_down_still_works_three_down_is_69() {
    let mut five = Five::start();
    five.servers[0].kill();
    five.servers[3].kill();
    let out = lr()
        .on(&five)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert_eq!(out.stdout.trim(), "1");

    five.servers[4].kill();
    let dir = scratch();
    let marker = file(&dir, "ran");
    let out = lr()
        .on(&five)
        .job(["touch", path_str(&marker)])
        .run()
        .expect(69);
    assert!(
        out.stderr
            .contains("only 2 of 5 Redis servers answered, a quorum is 3"),
        "{}",
        out.stderr
    );
    assert!(!marker.exists(), "nothing was run");
    assert!(
        !five.servers[1].exists("lock:{job}") && !five.servers[2].exists("lock:{job}"),
        "nothing held"
    );
}

#[test]
fn a_majority_lost_mid_run_stops_the_child_before_those_keys_expire() {
    let five = Five::start();
    let dir = scratch();
    let (running, child) = start_job_args(
        &five,
        dir.path(),
        &["--ttl", "2s", "--node-timeout", "500ms"],
        "exec sleep 60",
    );
    // The earliest server-side expiry among the three servers about to freeze.
    let expiry = five.servers[..3]
        .iter()
        .map(expiry_lower_bound)
        .min()
        .unwrap();
    for r in &five.servers[..3] {
        r.pause();
    }
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let death = Instant::now();
    assert!(death < expiry, "dead {:?} after the expiry", death - expiry);
    eprintln!("kill margin [Redlock, 3 of 5 frozen]: {:?}", expiry - death);
    let out = running.wait().expect(76);
    assert!(out.stderr.contains("not a quorum of 3"), "{}", out.stderr);
    for r in &five.servers[..3] {
        r.resume();
    }
}

fn start_job_args(
    five: &Five,
    dir: &std::path::Path,
    extra: &[&str],
    child: &str,
) -> (Running, i32) {
    let urls = five.url_args();
    let mut args: Vec<&str> = urls.iter().map(String::as_str).collect();
    args.extend_from_slice(extra);
    // start_job passes the first URL itself; the other four follow in `args`.
    start_job(&five.servers[0].url(), dir, &args[2..], child)
}

#[test]
fn fences_keep_growing_while_minorities_restart_empty() {
    let mut five = Five::start();
    let mut last = 0u64;
    for round in 0..20 {
        let out = lr()
            .on(&five)
            .job(sh("echo $LOCKED_RUN_FENCE"))
            .run()
            .expect_with(0, format!("round {round}"));
        let fence: u64 = out.stdout.trim().parse().unwrap();
        assert!(fence > last, "round {round}: fence {fence} after {last}");
        last = fence;
        // Two servers (a minority) lose everything, counters included.
        let a = fastrand::usize(0..5);
        let b = (a + 1 + fastrand::usize(0..4)) % 5;
        five.servers[a].restart_empty();
        five.servers[b].restart_empty();
    }
}

/// A holder whose keys lapsed on a minority of the servers (a missed renewal, a restart) still
/// holds a quorum. A waiter is granted that minority, which is no use to it: it gives it back
/// without waking anyone (itself included) and waits for the holder, instead of trying again
/// as fast as the round trips go.
#[test]
fn a_waiter_does_not_spin_on_the_servers_the_holder_no_longer_holds() {
    let five = Five::start();
    let dir = scratch();
    let (holder, token) = hold(&five, &[], dir.path());
    for lapsed in &five.servers[3..] {
        let _: i64 = lapsed.cmd(&["DEL", "lock:{job}", "holder:{job}"]);
    }
    assert_eq!(five.holding(&token), 3, "the holder keeps its quorum");
    for server in &five.servers {
        let _: String = server.cmd(&["CONFIG", "RESETSTAT"]);
    }
    let waiter = lr().on(&five).job(["true"]).spawn();
    wait_until(
        "the waiter listens on every server",
        Duration::from_secs(10),
        || five.servers.iter().all(|s| subscribers(s, "job") == 1),
    );
    // A measurement window, not a synchronisation: a spinning waiter sends hundreds of
    // attempts in it; a waiting one, its first (and the holder at most one renewal).
    std::thread::sleep(Duration::from_secs(2));
    let attempts: u64 = five.servers[3..]
        .iter()
        .map(|s| command_stats(s, &["evalsha", "eval"], "calls"))
        .sum();
    assert!(
        attempts <= 8,
        "{attempts} scripts on the two lapsed servers in 2 s"
    );
    assert_eq!(five.holding(&token), 3);
    std::fs::write(file(&dir, "go"), "").unwrap();
    holder.wait().expect(0);
    waiter
        .wait()
        .expect_with(0, "the waiter ran once the holder released");
}

/// Renewal rounds end soon after a quorum answered, but not before the other servers had their
/// chance: every server keeps the lease on the connection it has, rather than the slowest of
/// each round having its request dropped, and its connection with it.
#[test]
fn every_server_is_renewed_on_its_own_connection() {
    let five = Five::start();
    let dir = scratch();
    let (holder, token) = hold(&five, &["--ttl", "2s"], dir.path());
    let connections = |r: &Redis| -> u64 {
        let info: String = r.cmd(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_connections_received")
    };
    let before: Vec<u64> = five.servers.iter().map(connections).collect();
    // A measurement window of about 7 renewal rounds (R = 333 ms), longer than T.
    std::thread::sleep(Duration::from_millis(2500));
    let after: Vec<u64> = five.servers.iter().map(connections).collect();
    let holding = five.holding(&token);
    std::fs::write(file(&dir, "go"), "").unwrap();
    holder.wait().expect(0);
    // Each INFO came on a connection of its own: one more than before, on every server.
    let reconnected: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b - 1).collect();
    assert_eq!(
        reconnected, [0; 5],
        "connections locked-run opened again while renewing"
    );
    assert_eq!(
        holding, 5,
        "servers still holding the lease after 2.5 s of renewals"
    );
}

#[test]
fn four_processes_contending_never_overlap() {
    let five = Five::start();
    let dir = scratch();
    let log = file(&dir, "log");
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..8 {
                    lr().on(&five)
                        .args(["--ttl", "2s"])
                        .name("shared")
                        .command(["perl", "-e", CRITICAL_SECTION, path_str(&log)])
                        .run()
                        .expect(0);
                }
            });
        }
    });
    assert_eq!(check_log(&log), 32);
}

#[test]
fn a_slow_server_does_not_stall_the_acquisition() {
    let five = Five::start();
    let proxy = Proxy::start(five.servers[4].port);
    proxy.set(Mode::Latency(Duration::from_secs(2)));
    let mut cmd = lr();
    for r in &five.servers[..4] {
        cmd = cmd.url(&r.url());
    }
    // T = 10 s: each server may take T/100 = 100 ms to answer.
    let cmd = cmd
        .url(&proxy.url())
        .args(["--ttl", "10s", "-v"])
        .job(["true"]);
    let started = Instant::now();
    let out = cmd.run().expect(0);
    let acquired = out.stderr.lines().next().unwrap_or("");
    assert!(acquired.contains("acquired lock job"), "{}", out.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "did not wait for the slow server: {:?}",
        started.elapsed()
    );
}

#[test]
fn a_waiter_wakes_on_the_release() {
    let five = Five::start();
    let holder = Holder::with(lr().on(&five), "job");
    let waiter = lr().on(&five).job(sh("echo $LOCKED_RUN_FENCE")).spawn();
    wait_until(
        "the waiter listens on every server",
        Duration::from_secs(10),
        || five.servers.iter().all(|r| subscribers(r, "job") == 1),
    );
    holder.finish().expect(0);
    let released = Instant::now();
    let out = waiter.wait().expect(0);
    // Larger than the holder's; not necessarily 2: an attempt that met the release half-way
    // took counters on some servers before giving its votes back.
    assert!(
        out.stdout.trim().parse::<u64>().unwrap() > 1,
        "{}",
        out.stdout
    );
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by the release: {:?}",
        released.elapsed()
    );
}

#[test]
fn status_shows_each_server_and_the_quorum() {
    let mut five = Five::start();
    let dir = scratch();
    let (running, _) = start_job_args(&five, dir.path(), &[], "exec sleep 60");
    five.servers[2].kill();
    let v = lr()
        .arg("status")
        .args(five.url_args())
        .args(["--json", "job"])
        .run()
        .expect(0)
        .json();
    assert_eq!(v["held"], true);
    assert_eq!(v["quorum"], 3);
    assert_eq!(v["fence"], 1);
    assert_eq!(v["holder"]["pid"], running.pid());
    let servers = v["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 5);
    assert_eq!(servers.iter().filter(|s| s["held"] == true).count(), 4);
    assert!(
        servers[2]["error"]
            .as_str()
            .unwrap()
            .contains("cannot reach")
    );

    let text = lr().arg("status").args(five.url_args()).name("job").run();
    assert!(
        text.stdout
            .lines()
            .next()
            .unwrap()
            .ends_with("4 of 5 servers hold it, a quorum is 3"),
        "{}",
        text.stdout
    );
    // The summary, each server, and the last run's line.
    assert_eq!(text.stdout.lines().count(), 7, "{}", text.stdout);
    signal(running.pid(), libc::SIGTERM);
    let _ = running.wait();
}

#[test]
fn bad_server_lists_are_refused() {
    let five = Five::start();
    let url = five.servers[0].url();
    let out = lr()
        .url(&url)
        .url(&five.servers[1].url())
        .url(&url)
        .args(["job", "true"])
        .run()
        .expect(2);
    assert!(out.stderr.contains("is given twice"), "{}", out.stderr);

    let out = lr()
        .url(&url)
        .url(&five.servers[1].url())
        .args(["job", "true"])
        .run()
        .expect(2);
    assert!(
        out.stderr.contains("at least 3 independent servers"),
        "{}",
        out.stderr
    );

    let out = lr()
        .args(&five.url_args()[..8])
        .args(["-v", "job", "true"])
        .run()
        .expect(0);
    assert!(
        out.stderr
            .contains("4 servers: a quorum is 3, so only 1 may fail"),
        "{}",
        out.stderr
    );

    // Several URLs in LOCKED_RUN_URL, comma-separated.
    let list = five
        .servers
        .iter()
        .map(Redis::url)
        .collect::<Vec<_>>()
        .join(",");
    let out = lr()
        .env("LOCKED_RUN_URL", list)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert!(
        out.stdout.trim().parse::<u64>().unwrap() > 1,
        "{}",
        out.stdout
    );
}

/// Renewals take back a server that lost the key only while a quorum is still ours: a lock
/// released everywhere by `release --force` stays released, and its holder is stopped (76).
#[test]
fn a_forced_release_is_not_taken_back_by_the_renewals() {
    let five = Five::start();
    let dir = scratch();
    let (running, child) = start_job_args(
        &five,
        dir.path(),
        &["--ttl", "2s", "--node-timeout", "500ms"],
        "exec sleep 60",
    );
    lr().args(["release", "--force"])
        .args(five.url_args())
        .name("job")
        .run()
        .expect(0);
    assert!(wait_pid_exit(child, Duration::from_secs(5)), "stopped");
    running.wait().expect(76);
    for server in &five.servers {
        assert!(!server.exists("lock:{job}"), "not taken back");
    }
}
