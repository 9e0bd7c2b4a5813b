//! The consensus backend, `etcd://`: real etcd members on loopback (one, or a cluster of
//! three), real runs of the binary, and etcdctl on the same keys. Order, exclusion and the
//! lease clock are checked from evidence: the children's logs, the pids they leave, and what
//! etcd holds, read with etcdctl.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

/// A run holding `job` until the test writes `go` in its directory: its command writes
/// `FENCE KEY` to `started` first, and the time it ends (ns since the epoch) to `ended`.
struct Held {
    running: Running,
    dir: tempfile::TempDir,
    fence: i64,
    key: String,
}

impl Held {
    fn start(url: &str, extra: &[&str]) -> Held {
        Held::start_with(lr().url(url).args(extra))
    }

    fn start_with(locked_run: LockedRun) -> Held {
        let dir = scratch();
        let d = path_str(dir.path());
        let script = format!(
            "echo $LOCKED_RUN_FENCE $LOCKED_RUN_KEY > {d}/started.tmp; mv {d}/started.tmp {d}/started; \
             echo $$ > {d}/pid.tmp; mv {d}/pid.tmp {d}/pid; \
             while [ ! -e {d}/go ]; do sleep 0.01; done; date +%s%N > {d}/ended"
        );
        let running = locked_run.name("job").sh(&script).spawn();
        let started = wait_for_file(&dir.path().join("started"), Duration::from_secs(20), |t| {
            t.ends_with('\n')
        });
        let (fence, key) = started.trim().split_once(' ').unwrap();
        let fence = fence.parse().unwrap();
        let key = key.to_owned();
        wait_for_file(&dir.path().join("pid"), Duration::from_secs(5), |t| {
            t.ends_with('\n')
        });
        Held {
            running,
            dir,
            fence,
            key,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The pid of the command (the shell).
    fn child(&self) -> i32 {
        std::fs::read_to_string(self.path("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The lease's id in hex: the end of the key.
    fn lease_hex(&self) -> &str {
        self.key.rsplit_once('/').unwrap().1
    }

    fn finish(self) -> (Output, u128) {
        std::fs::write(self.path("go"), "").unwrap();
        let ended = self.path("ended");
        let out = self.running.wait();
        let ended = read_ns(&ended);
        (out, ended)
    }
}

fn read_ns(path: &Path) -> u128 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_run_is_fenced_by_its_keys_create_revision_and_leaves_nothing_behind() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let held = Held::start(&url, &[]);
    assert!(held.key.starts_with("job/"), "{}", held.key);
    let keys = etcd.keys("job/");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let (key, created, lease) = &keys[0];
    assert_eq!(key, &held.key, "LOCKED_RUN_KEY is the key");
    assert_eq!(
        *created, held.fence,
        "LOCKED_RUN_FENCE is its create revision"
    );
    assert_eq!(
        held.lease_hex(),
        format!("{lease:x}"),
        "NAME/<lease id in hex>"
    );

    let out = lr().arg("-n").url(&url).job(["true"]).run().expect(75);
    assert_eq!(out.stderr, "", "-n is silent");
    assert_eq!(etcd.keys("job/").len(), 1, "-n did not queue");
    let out = lr()
        .args(["-w", "1s"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(75);
    assert!(out.stderr.contains("gave up waiting"), "{}", out.stderr);
    assert_eq!(
        etcd.keys("job/").len(),
        1,
        "the waiter that gave up left no key"
    );
    assert_eq!(etcd.leases(), 1, "nor its lease");

    let fence = held.fence;
    let lease_hex = format!("{lease:x}");
    let (out, _) = held.finish();
    out.expect(0);
    assert_eq!(etcd.keys("job/"), [], "the key is deleted");
    // Deleted in the release's transaction: the lease, holding nothing, is not revoked (one
    // request fewer a handoff) but no longer kept alive, and lapses within T (30 s).
    assert_eq!(etcd.leases_holding_keys(), 0, "the lease holds nothing");
    let left = etcd.time_to_live(&lease_hex);
    assert!((1..=30).contains(&left), "its TTL left: {left}");

    let out = lr()
        .url(&url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    let next: i64 = out.stdout.trim().parse().unwrap();
    assert!(next > fence, "fence {next} after {fence}");
    // A run's leases, keyless once it held, lapse by themselves.
    assert_eq!(etcd.leases_holding_keys(), 0);
}

#[test]
fn waiters_are_served_in_arrival_order_each_woken_by_its_watch() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let logs = scratch();
    let held = Held::start(&url, &[]);
    let mut waiters = Vec::new();
    for i in 1..=3 {
        let started = file(&logs, &format!("started{i}"));
        let waiter = lr()
            .args(["-w", "60s"])
            .url(&url)
            .name("job")
            .sh(&format!(
                "date +%s%N > {s}.tmp; mv {s}.tmp {s}; echo $LOCKED_RUN_FENCE >> {log}",
                s = path_str(&started),
                log = path_str(&file(&logs, "order"))
            ))
            .spawn();
        // Each comes after the one before has its key.
        wait_until("the waiter has its key", Duration::from_secs(10), || {
            etcd.keys("job/").len() == 1 + i
        });
        waiters.push((waiter, started));
    }
    let queued: Vec<i64> = etcd.keys("job/").iter().map(|k| k.1).collect();
    let (out, mut previous_end) = held.finish();
    out.expect(0);
    for (i, (waiter, started)) in waiters.into_iter().enumerate() {
        let out = waiter.wait();
        let out = out.expect(0);
        let start = read_ns(&started);
        let handoff = Duration::from_nanos((start.saturating_sub(previous_end)) as u64);
        eprintln!("handoff {}: {handoff:?}", i + 1);
        assert!(
            start > previous_end,
            "waiter {} started before the one before it ended",
            i + 1
        );
        // Woken by the watch: a waiter that only asked again on its keep-alive would take
        // up to 667 ms.
        assert!(
            handoff < Duration::from_millis(300),
            "waiter {} started {handoff:?} after the one before it ended: {}",
            i + 1,
            out.stderr
        );
        previous_end = start;
    }
    let order: Vec<i64> = std::fs::read_to_string(file(&logs, "order"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(
        order,
        queued[1..],
        "served in arrival order, each with its own key's fence"
    );
    assert_eq!(etcd.keys("job/"), []);
}

/// NAME's history on etcd grows by one record a run, with no read of the records and no
/// delete, until it is twice the hundred kept; the run that finds it so cuts it to the newest
/// hundred, its own record with them.
#[test]
fn etcds_history_is_cut_to_the_newest_hundred_once_twice_as_long() {
    let etcd = Etcd::start();
    let url = etcd.url();
    // Records of other runs, older than the run's own by when they were written (not by the
    // time in their keys' names, which is 0 to 199 ms here), put by one etcdctl transaction each batch (`etcdctl txn` reads its operations from stdin).
    let older = |from: u32, to: u32| {
        let puts: String = (from..to)
            .map(|i| format!("put locked-run/history/job/{i:016}-old {{}}\n"))
            .collect();
        let out = etcd.ctl_with_input(&["txn"], &format!("\n{puts}\n\n"));
        assert_eq!(out.code(), Some(0), "{out:?}");
    };
    let records = || etcd.keys("locked-run/history/job/");
    // Batches of 101 and 49 keys, each one transaction (one revision), then the run.
    older(0, 101);
    older(101, 150);
    lr().url(&url).job(["true"]).run().expect(0);
    assert_eq!(records().len(), 151, "the run's record added, none deleted");
    older(150, 199);
    lr().url(&url).job(["true"]).run().expect(0);
    let kept = records();
    assert_eq!(kept.len(), 100, "the newest hundred");
    let batch_of_101 = |key: &str| {
        let when = key.rsplit('/').next().unwrap().split('-').next().unwrap();
        key.ends_with("-old") && when.parse::<u32>().unwrap() < 101
    };
    assert!(
        !kept.iter().any(|(key, _, _)| batch_of_101(key)),
        "the oldest batch is gone: {kept:?}"
    );
    let runs = kept.iter().filter(|(key, _, _)| !key.ends_with("-old"));
    assert_eq!(runs.count(), 2, "both runs' records among them: {kept:?}");
}

#[test]
fn etcdctl_lock_and_locked_run_exclude_each_other() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let dir = scratch();
    let d = path_str(dir.path());

    // etcdctl holds: a run that will not wait is refused, one that waits starts after it.
    let etcdctl = spawn(etcd.ctl_command(&[
        "lock",
        "job",
        "--",
        "sh",
        "-c",
        &format!(
            "touch {d}/ctl-up; while [ ! -e {d}/ctl-go ]; do sleep 0.01; done; date +%s%N > {d}/ctl-ended"
        ),
    ]));
    wait_for_file(&file(&dir, "ctl-up"), Duration::from_secs(10), |_| true);
    let out = lr()
        .args(["-v", "-n"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(75);
    assert!(
        out.stderr.contains("another program"),
        "etcdctl's key names no holder: {}",
        out.stderr
    );
    let waiter = lr()
        .args(["-w", "30s"])
        .url(&url)
        .job(sh(&format!("date +%s%N > {d}/lr-started")))
        .spawn();
    wait_until(
        "locked-run queued behind etcdctl",
        Duration::from_secs(10),
        || etcd.keys("job/").len() == 2,
    );
    std::fs::write(file(&dir, "ctl-go"), "").unwrap();
    let out = etcdctl.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    waiter.wait().expect(0);
    assert!(read_ns(&file(&dir, "lr-started")) > read_ns(&file(&dir, "ctl-ended")));

    // locked-run holds: etcdctl waits until its command has ended.
    let held = Held::start(&url, &[]);
    let etcdctl = spawn(etcd.ctl_command(&[
        "lock",
        "job",
        "--",
        "sh",
        "-c",
        &format!("date +%s%N > {d}/ctl-started"),
    ]));
    wait_until(
        "etcdctl queued behind locked-run",
        Duration::from_secs(10),
        || etcd.keys("job/").len() == 2,
    );
    assert!(!file(&dir, "ctl-started").exists());
    let (out, ended) = held.finish();
    out.expect(0);
    let out = etcdctl.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(read_ns(&file(&dir, "ctl-started")) > ended);
}

#[test]
fn a_partition_stops_the_command_before_its_lease_could_expire() {
    // In every mode: a shared holder's and a semaphore's lease are each run's own.
    for mode in [&[][..], &["--shared"], &["--holders", "2"]] {
        let etcd = Etcd::start();
        let proxy = Proxy::start(etcd.members[0].client_port);
        let url = format!("etcd://127.0.0.1:{}", proxy.port);
        let held = Held::start_with(lr().url(&url).args(["--ttl", "6s"]).args(mode));
        let child = held.child();
        // A lower bound of what is left of the lease at the fault: etcd truncates to seconds.
        let left = etcd.time_to_live(held.lease_hex());
        proxy.set(Mode::Blackhole);
        let fault = Instant::now();
        assert!(
            wait_pid_exit(child, Duration::from_secs(20)),
            "{mode:?}: the command outlived the lease"
        );
        let dead = fault.elapsed();
        assert!(
            dead < Duration::from_secs(left as u64),
            "{mode:?}: the command died {dead:?} after the fault; the lease had {left}s left then"
        );
        assert_eq!(
            etcd.keys("job/").len(),
            1,
            "{mode:?}: the lease had not expired when the command was dead"
        );
        let out = held.running.wait();
        assert_eq!(out.code(), Some(76), "{mode:?}: {out:?}");
    }
}

/// A release that cannot reach etcd says so, once: the history that could not be written
/// with it never claims the lock was released.
#[test]
fn a_release_that_cannot_reach_etcd_never_says_the_lock_is_released() {
    let etcd = Etcd::start();
    let proxy = Proxy::start(etcd.members[0].client_port);
    let url = format!("etcd://127.0.0.1:{}", proxy.port);
    let held = Held::start_with(
        lr().url(&url)
            .args(["--ttl", "6s", "--connect-timeout", "1s"]),
    );
    proxy.set(Mode::Blackhole);
    let (out, _) = held.finish();
    assert!(out.stderr.contains("could not release lock job"), "{out:?}");
    assert!(!out.stderr.contains("the lock is released"), "{out:?}");
}

#[test]
fn the_leader_killed_during_a_hold_changes_nothing_and_the_next_fence_is_larger() {
    let mut etcd = Etcd::start_cluster();
    // The run talks to the leader: its connection breaks too.
    let leader = etcd.leader();
    let url = etcd.url_from(leader);
    let held = Held::start(&url, &["--ttl", "6s"]);
    let (child, fence) = (held.child(), held.fence);
    let old = etcd.leader_id().unwrap();
    etcd.members[leader].kill();
    wait_until("a new leader", Duration::from_secs(20), || {
        etcd.leader_id().is_some_and(|id| id != old)
    });
    // Longer than the lease, had it not been renewed through the new leader.
    assert!(
        !wait_pid_exit(child, Duration::from_secs(7)),
        "the command was stopped when the leader died: {}",
        etcd.log((leader + 1) % 3)
    );
    let (out, _) = held.finish();
    out.expect(0);
    let out = lr()
        .url(&url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    let next: i64 = out.stdout.trim().parse().unwrap();
    assert!(next > fence, "fence {next} after {fence}");
}

#[test]
fn status_shows_the_holder_and_release_force_frees_it_and_stops_its_command() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let out = lr()
        .args(["status", "--json", "-u", &url, "job"])
        .run()
        .expect(1);
    let status = out.json();
    assert_eq!(status["held"], false, "{status}");
    assert_eq!(status["fence"], serde_json::Value::Null);

    let held = Held::start(&url, &["--ttl", "6s"]);
    let status = status_json(&url, "job");
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(status["fence"], held.fence, "{status}");
    assert_eq!(status["holder"]["pid"], held.running.pid(), "{status}");
    assert_eq!(status["holders"][0]["token"], held.key.as_str(), "{status}");
    assert_eq!(status["waiters"], 0, "{status}");
    let ttl = status["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 3_000 && ttl <= 6_000, "{ttl}");

    let out = lr().args(["release", "-u", &url, "job"]).run().expect(2);
    assert!(out.stderr.contains("--force"), "{}", out.stderr);
    let out = lr()
        .args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(0);
    assert!(
        out.stdout.starts_with("released lock job, held by "),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!("pid {}", held.running.pid())),
        "{}",
        out.stdout
    );
    let child = held.child();
    assert!(
        wait_pid_exit(child, Duration::from_secs(10)),
        "the next renewal found the key gone and stopped the command"
    );
    let out = held.running.wait();
    assert_eq!(out.code(), Some(76), "{out:?}");
    assert_eq!(etcd.keys("job/"), []);
}

#[test]
fn what_etcd_cannot_give_is_a_usage_error() {
    let url = "etcd://127.0.0.1:1";
    for (extra, needle) in [
        (&["--shared", "--holders", "2"][..], "--shared"),
        (&["--wait-replicas", "1"][..], "--wait-replicas"),
        (&["--tls-ca-cert", "/nonexistent"][..], "etcds://"),
    ] {
        lr().url(url)
            .args(extra)
            .job(["true"])
            .run()
            .expect_one_line(2, needle);
    }
    lr().url(url)
        .url("redis://127.0.0.1:1")
        .job(["true"])
        .run()
        .expect_one_line(2, "etcd://");
    lr().url("etcd://127.0.0.1:1/prefix")
        .job(["true"])
        .run()
        .expect_one_line(2, "not a usable etcd URL");
    // Lock `p` would take lock `p/job`'s keys (under `p/job/`) for its own contenders.
    lr().url(url)
        .args(["p/job", "true"])
        .run()
        .expect_one_line(2, "lock names on etcd:// hold no '/'");
}

/// A member that takes connections and never answers (a hung process, a half-open link)
/// listed first: every request moves on to the next member within its share of the time, so
/// runs and releases go on while two of three answer.
#[test]
fn a_hung_member_listed_first_costs_a_share_of_the_time_not_the_run() {
    let etcd = Etcd::start_cluster();
    let proxy = Proxy::start(etcd.members[0].client_port);
    proxy.set(Mode::Blackhole);
    let others: Vec<String> = etcd.members[1..].iter().map(|m| m.endpoint()).collect();
    let url = format!("etcd://127.0.0.1:{},{}", proxy.port, others.join(","));
    for _ in 0..2 {
        let out = lr()
            .url(&url)
            .job(["sh", "-c", "echo $LOCKED_RUN_FENCE"])
            .run()
            .expect(0);
        assert!(out.stdout.trim().parse::<u64>().unwrap() > 0, "{out:?}");
    }
    assert!(
        etcd.keys("job/").is_empty(),
        "released on a member that answers"
    );
    assert_eq!(etcd.leases_holding_keys(), 0, "no lease holds a key");
}

#[test]
fn an_unreachable_cluster_is_69_naming_each_endpoint_and_no_password() {
    let (a, b) = (free_port(), free_port());
    let url = format!("etcd://app:hunter2@127.0.0.1:{a},127.0.0.1:{b}");
    let out = lr()
        .env("LOCKED_RUN_URL", &url)
        .job(["true"])
        .run()
        .expect_one_line(69, &format!("127.0.0.1:{a}"));
    assert!(
        out.stderr.contains(&format!("127.0.0.1:{b}")),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("hunter2"), "{}", out.stderr);
}

#[test]
fn etcds_takes_the_tls_options() {
    let certs = Certs::make();
    let etcd = Etcd::start_tls(&certs);
    let url = etcd.url();
    let (ca, cert, key) = (
        path_str(&certs.ca),
        path_str(&certs.client_cert),
        path_str(&certs.client_key),
    );
    let out = lr()
        .url(&url)
        .args(["--tls-ca-cert", ca, "--tls-cert", cert, "--tls-key", key])
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert!(out.stdout.trim().parse::<i64>().unwrap() > 0, "{out:?}");
    assert_eq!(etcd.keys("job/"), []);
    // The server's certificate is not trusted by the system's CAs; and without a client
    // certificate, the member refuses the handshake.
    lr().url(&url)
        .job(["true"])
        .run()
        .expect_one_line(69, "127.0.0.1");
    lr().url(&url)
        .args(["--tls-ca-cert", ca])
        .job(["true"])
        .run()
        .expect_one_line(69, "127.0.0.1");
}

#[test]
fn min_hold_leaves_the_key_on_a_lease_of_its_own() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let out = lr()
        .args(["--min-hold", "3s"])
        .url(&url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    let fence: i64 = out.stdout.trim().parse().unwrap();
    let status = status_json(&url, "job");
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(
        status["fence"], fence,
        "the same key, its create revision kept"
    );
    let ttl = status["ttl_ms"].as_u64().unwrap();
    assert!(ttl <= 3_000, "{ttl}");
    assert_eq!(etcd.leases(), 1, "the run's own lease is revoked");
    lr().arg("-n").url(&url).job(["true"]).run().expect(75);
    let out = lr()
        .args(["-w", "20s"])
        .url(&url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert!(out.elapsed > Duration::from_secs(1), "{:?}", out.elapsed);
    let next: i64 = out.stdout.trim().parse().unwrap();
    assert!(next > fence, "fence {next} after {fence}");
    // The --min-hold lease lapsed, with the key; the runs' leases hold nothing.
    assert_eq!(etcd.leases_holding_keys(), 0);
}
