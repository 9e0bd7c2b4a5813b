//! `--shared` and `--holders N` on `etcd://`, on real etcd: shared runs hold together and
//! never beside an exclusive one (locked-run's or `etcdctl lock`'s), in arrival order across
//! modes; a semaphore's N first keys hold, and its waiters take places in arrival order, each
//! woken by a watch; runs of another mode are usage errors; `status` and `release --force`
//! see every holder.

use std::time::{Duration, Instant};

use crate::support::*;

/// The most commands that ran at once, from the log's starts and ends.
fn most_at_once(log: &str) -> usize {
    let (mut now, mut most) = (0usize, 0);
    for line in log.lines() {
        if line.starts_with("start") {
            now += 1;
            most = most.max(now);
        } else if line.starts_with("end") {
            now -= 1;
        }
    }
    most
}

#[test]
fn shared_runs_hold_together_and_a_writer_is_served_in_arrival_order() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let dir = scratch();
    let d = dir.path();
    let keys = || etcd.keys("job/").len();
    let first = logged(&url, d, "r1", &["--shared"]);
    wait_until("r1 started", Duration::from_secs(10), || {
        log_of(d).contains("start r1 1")
    });
    let second = logged(&url, d, "r2", &["--shared"]);
    wait_until("r2 started beside r1", Duration::from_secs(10), || {
        log_of(d).contains("start r2 1")
    });
    // An exclusive run that will not wait is refused; one that waits queues.
    lr().arg("-n").url(&url).job(["true"]).run().expect(75);
    let writer = logged(&url, d, "w", &[]);
    wait_until("the writer queued", Duration::from_secs(10), || keys() == 3);
    // Readers arriving after the writer queue behind it: none passes it.
    lr().args(["-n", "--shared"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(75);
    let mut late = Vec::new();
    for (i, who) in ["r3", "r4"].into_iter().enumerate() {
        late.push(logged(&url, d, who, &["--shared"]));
        wait_until("the reader queued", Duration::from_secs(10), || {
            keys() == 4 + i
        });
    }
    let status = status_json(&url, "job");
    assert_eq!(status["mode"], "shared", "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");
    go(d, "r1");
    first.wait().expect(0);
    assert!(
        !log_of(d).contains("start w"),
        "the writer waits for r2 too"
    );
    let ended = Instant::now();
    go(d, "r2");
    second.wait().expect(0);
    wait_until("the writer started", Duration::from_secs(10), || {
        log_of(d).contains("start w 0")
    });
    // Woken by its watch, not by a heartbeat.
    assert!(
        ended.elapsed() < Duration::from_secs(2),
        "{:?}",
        ended.elapsed()
    );
    go(d, "w");
    writer.wait().expect(0);
    wait_until(
        "the late readers started together",
        Duration::from_secs(10),
        || {
            let l = log_of(d);
            l.contains("start r3") && l.contains("start r4")
        },
    );
    for who in ["r3", "r4"] {
        go(d, who);
    }
    for r in late {
        r.wait().expect(0);
    }
    let l = log_of(d);
    let at = |what: &str| l.find(what).unwrap_or_else(|| panic!("{what}: {l}"));
    assert!(
        at("end r2") < at("start w") && at("end w") < at("start r3"),
        "{l}"
    );
    assert_eq!(etcd.keys("job/"), []);
    // The runs' leases, keyless once they released, lapse by themselves.
    assert_eq!(etcd.leases_holding_keys(), 0);
}

#[test]
fn an_etcdctl_holder_keeps_shared_runs_out_and_shared_runs_keep_it_out() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let dir = scratch();
    let d = dir.path();
    let reader = logged(&url, d, "r", &["--shared"]);
    wait_until("the reader started", Duration::from_secs(10), || {
        log_of(d).contains("start r")
    });
    let etcdctl = spawn(etcd.ctl_command(&[
        "lock",
        "job",
        "--",
        "sh",
        "-c",
        &format!(
            "echo start ctl >> {l}; echo end ctl >> {l}",
            l = path_str(&d.join("log"))
        ),
    ]));
    wait_until("etcdctl queued", Duration::from_secs(10), || {
        etcd.keys("job/").len() == 2
    });
    // A reader after etcdctl's key waits for it: etcdctl's keys are exclusive.
    let late = logged(&url, d, "r2", &["--shared"]);
    wait_until("the late reader queued", Duration::from_secs(10), || {
        etcd.keys("job/").len() == 3
    });
    assert!(!log_of(d).contains("start ctl"), "{}", log_of(d));
    go(d, "r");
    reader.wait().expect(0);
    assert_eq!(etcdctl.wait().code(), Some(0));
    wait_until("the late reader started", Duration::from_secs(10), || {
        log_of(d).contains("start r2")
    });
    go(d, "r2");
    late.wait().expect(0);
    let l = log_of(d);
    let at = |what: &str| l.find(what).unwrap_or_else(|| panic!("{what}: {l}"));
    assert!(
        at("end r") < at("start ctl") && at("end ctl") < at("start r2"),
        "{l}"
    );
}

#[test]
fn a_semaphore_holds_n_at_once_and_its_waiters_take_places_in_arrival_order() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let dir = scratch();
    let d = dir.path();
    let two = ["--holders", "2"];
    let h1 = logged(&url, d, "h1", &two);
    let h2 = logged(&url, d, "h2", &two);
    wait_until("two hold", Duration::from_secs(10), || {
        let l = log_of(d);
        l.contains("start h1") && l.contains("start h2")
    });
    let mut waiters = Vec::new();
    for (i, who) in ["w1", "w2", "w3"].into_iter().enumerate() {
        waiters.push(logged(&url, d, who, &two));
        wait_until("the waiter queued", Duration::from_secs(10), || {
            etcd.keys("job/").len() == 3 + i
        });
    }
    // Runs of another mode are refused while the semaphore's keys are there.
    for other in [&["--holders", "3"][..], &[], &["--shared"]] {
        lr().url(&url)
            .args(other)
            .job(["true"])
            .run()
            .expect_one_line(2, "--holders 2");
    }
    let status = status_json(&url, "job");
    assert_eq!(status["limit"], 2, "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");
    assert_eq!(status["waiters"], 3, "{status}");
    // The second holder leaves first: the first waiter, watching every key, takes its place.
    go(d, "h2");
    h2.wait().expect(0);
    wait_until("w1 took a place", Duration::from_secs(10), || {
        log_of(d).contains("start w1")
    });
    // w1 wrote its key again on taking its place: w2, watching it, is the first waiter now
    // and takes the place h1 leaves.
    let w1_key = etcd
        .keys("job/")
        .into_iter()
        .map(|(key, ..)| key)
        .nth(1)
        .unwrap();
    let get = etcd.ctl(&["get", &w1_key, "-w", "json"]);
    let get: serde_json::Value = serde_json::from_str(&get.stdout).unwrap();
    assert_eq!(get["kvs"][0]["version"], 2, "{get}");
    let left = Instant::now();
    go(d, "h1");
    h1.wait().expect(0);
    wait_until("w2 took a place", Duration::from_secs(10), || {
        log_of(d).contains("start w2")
    });
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );
    assert!(!log_of(d).contains("start w3"));
    for who in ["w1", "w2", "w3"] {
        go(d, who);
    }
    for w in waiters {
        w.wait().expect(0);
    }
    let l = log_of(d);
    assert!(most_at_once(&l) <= 2, "{l}");
    let at = |what: &str| l.find(what).unwrap_or_else(|| panic!("{what}: {l}"));
    assert!(
        at("start w1") < at("start w2") && at("start w2") < at("start w3"),
        "{l}"
    );
    assert_eq!(etcd.keys("job/"), []);
}

#[test]
fn release_force_frees_one_holder_by_its_key_or_every_holder() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let a = Holder::start_on(&url, "job", &["--shared", "--renew-every", "200ms"]);
    let b = Holder::start_on(&url, "job", &["--shared", "--renew-every", "200ms"]);
    let fence_b = b.fence();
    let status = status_json(&url, "job");
    let token_a = status["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["pid"].as_i64() == Some(i64::from(a.pid())))
        .unwrap_or_else(|| panic!("{status}"))["token"]
        .as_str()
        .unwrap()
        .to_owned();
    lr().args(["release", "--force", "--token", &token_a, "-u", &url, "job"])
        .run()
        .expect(0);
    assert_eq!(a.running.wait().code(), Some(76));
    assert_eq!(etcd.keys("job/").len(), 1, "b holds on");
    lr().args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(0);
    assert_eq!(b.running.wait().code(), Some(76));
    assert_eq!(etcd.keys("job/"), []);
    // etcd keeps no last fence once the keys are gone: status says what bounds the next.
    let out = lr().args(["status", "-u", &url, "job"]).run().expect(1);
    let revision: u64 = out
        .stdout
        .lines()
        .next()
        .unwrap_or_default()
        .strip_prefix("job: free (no last fence kept; the next is above revision ")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{}", out.stdout))
        .parse()
        .unwrap();
    assert!(revision >= fence_b, "{}", out.stdout);
}
