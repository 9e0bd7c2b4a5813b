//! Production Redis: secrets that never show, replicas that must acknowledge the lock, TLS,
//! Sentinel and Cluster.

use std::time::Duration;

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

const SECRET: &str = "hunter2-secret";

fn all_output(out: &Output) -> String {
    format!("{}{}", out.stdout, out.stderr)
}

#[test]
fn a_password_on_the_command_line_draws_a_warning_and_is_never_printed() {
    let redis = Redis::start_with(&["--requirepass", SECRET]);
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", redis.port);

    let mut cmd = locked_run();
    cmd.args(["-u", &url, "-vv", "job", "--", "true"]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stderr
            .contains("visible to every user of this machine (ps)"),
        "{}",
        out.stderr
    );
    assert!(!all_output(&out).contains(SECRET), "{out:?}");

    for json in [false, true] {
        let mut status = locked_run();
        status.args(["status", "-u", &url, "-v", "job"]);
        if json {
            status.arg("--json");
        }
        let out = run(status);
        assert_eq!(out.code(), Some(1), "{out:?}");
        assert!(!all_output(&out).contains(SECRET), "{out:?}");
    }

    // Failing: unreachable, and a wrong password.
    let unreachable = format!("redis://:{SECRET}@127.0.0.1:{}", free_port());
    let wrong = format!("redis://:{SECRET}x@127.0.0.1:{}", redis.port);
    for url in [&unreachable, &wrong] {
        let mut cmd = locked_run();
        cmd.args(["-u", url, "-vv", "job", "--", "true"]);
        let out = run(cmd);
        assert_eq!(out.code(), Some(69), "{out:?}");
        assert!(!all_output(&out).contains(SECRET), "{out:?}");
    }

    // Through the environment: no warning, and still no password shown.
    let mut cmd = locked_run();
    cmd.env("LOCKED_RUN_URL", &url)
        .args(["-v", "job", "--", "true"]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(
        !out.stderr.contains("visible to every user"),
        "{}",
        out.stderr
    );
    assert!(!all_output(&out).contains(SECRET));
}

#[test]
fn a_password_file_is_read_for_urls_without_one() {
    let redis = Redis::start_with(&["--requirepass", SECRET]);
    let dir = scratch();
    let file_path = file(&dir, "password");
    std::fs::write(&file_path, format!("{SECRET}\n")).unwrap();
    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &redis.url(),
        "--password-file",
        path_str(&file_path),
        "job",
        "--",
        "true",
    ]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(!all_output(&out).contains(SECRET));

    std::fs::write(&file_path, "").unwrap();
    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &redis.url(),
        "--password-file",
        path_str(&file_path),
        "job",
        "--",
        "true",
    ]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("is empty"), "{}", out.stderr);

    // Unreadable even for root: a directory.
    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &redis.url(),
        "--password-file",
        path_str(dir.path()),
        "job",
        "--",
        "true",
    ]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(
        out.stderr
            .starts_with("locked-run: cannot read --password-file"),
        "{}",
        out.stderr
    );
}

#[test]
fn too_few_replica_acknowledgements_release_the_lock_and_exit_69() {
    let primary = Redis::start();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    wait_until("the replica is in sync", Duration::from_secs(10), || {
        primary
            .cmd::<String>(&["INFO", "replication"])
            .contains("connected_slaves:1")
            && replica
                .cmd::<String>(&["INFO", "replication"])
                .contains("master_link_status:up")
    });
    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &primary.url(),
        "--wait-replicas",
        "1",
        "job",
        "--",
        "sh",
        "-c",
        "echo $LOCKED_RUN_FENCE",
    ]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "1");

    let dir = scratch();
    let marker = file(&dir, "ran");
    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &primary.url(),
        "--wait-replicas",
        "2",
        "--wait-replicas-timeout",
        "200ms",
        "job",
        "--",
    ])
    .args(["touch", path_str(&marker)]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert!(
        out.stderr
            .contains("only 1 of the 2 replicas asked for (--wait-replicas) acknowledged lock job"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1);
    assert!(!marker.exists(), "nothing was run");
    assert!(!primary.exists("lock:{job}"), "nothing is held");
}

#[test]
fn tls_with_the_tests_ca_and_client_certificates() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let certs = Certs::make();
    let redis = Redis::start_tls(&certs, false);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let ca = path_str(&certs.ca);

    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &url,
        "--tls-ca-cert",
        ca,
        "job",
        "--",
        "sh",
        "-c",
        "echo $LOCKED_RUN_FENCE",
    ]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "1");
    let mut status = locked_run();
    status.args(["status", "-u", &url, "--tls-ca-cert", ca, "job"]);
    assert_eq!(run(status).code(), Some(1), "status over TLS says free");
    // By name too: the certificate is for localhost as well.
    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &format!("rediss://localhost:{}", redis.port),
        "--tls-ca-cert",
        ca,
        "job",
        "true",
    ]);
    assert_eq!(run(cmd).code(), Some(0));

    // A CA that did not sign the server's certificate, or the system's CAs (which did not
    // either): refused, with a line that says where to look.
    for args in [vec!["--tls-ca-cert", path_str(&certs.other_ca)], vec![]] {
        let mut cmd = locked_run();
        cmd.args(["-u", &url]).args(&args).args(["job", "true"]);
        let out = run(cmd);
        assert_eq!(out.code(), Some(69), "{args:?}: {out:?}");
        assert!(out.stderr.contains("certificate"), "{}", out.stderr);
        assert!(out.stderr.contains("--tls-ca-cert"), "{}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1);
    }
}

#[test]
fn tls_client_certificates_when_the_server_asks() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let certs = Certs::make();
    let redis = Redis::start_tls(&certs, true);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let ca = path_str(&certs.ca);
    let mut cmd = locked_run();
    cmd.args(["-u", &url, "--tls-ca-cert", ca, "job", "true"]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(69), "no client certificate: {out:?}");

    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &url,
        "--tls-ca-cert",
        ca,
        "--tls-cert",
        path_str(&certs.client_cert),
    ])
    .args(["--tls-key", path_str(&certs.client_key), "job", "true"]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
}

/// A sentinel that does not answer at all (its host is gone) is given only its share of the
/// time, so the next one can still say where the primary is.
#[test]
fn a_sentinel_that_never_answers_does_not_use_up_the_time() {
    let watched = Watched::start();
    let gone = Proxy::start(watched.ports[0]);
    gone.set(Mode::Blackhole);
    let url = watched.url().replace(
        "redis+sentinel://",
        &format!("redis+sentinel://127.0.0.1:{},", gone.port),
    );
    let mut cmd = locked_run();
    cmd.args(["-u", &url, "--connect-timeout", "1s", "job", "--", "true"]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
}

#[test]
fn through_sentinels_a_failover_that_kept_the_lock_goes_on() {
    let watched = Watched::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let mut cmd = locked_run();
    cmd.args(["-u", &watched.url(), "--ttl", "20s", "job"])
        .args(sh(&format!(
            "echo $LOCKED_RUN_FENCE > {d}/up; while [ ! -e {d}/go ]; do sleep 0.01; done"
        )));
    let running = spawn(cmd);
    assert_eq!(
        wait_for_file(&file(&dir, "up"), Duration::from_secs(10), |t| t
            .ends_with('\n')),
        "1\n"
    );
    assert!(
        watched.primary.exists("lock:{job}"),
        "taken on the primary the sentinels named"
    );
    wait_until(
        "the key reached the replica",
        Duration::from_secs(10),
        || watched.replica.exists("lock:{job}"),
    );

    watched.fail_over();
    // Renewals (every 3.3 s) follow the sentinels to the new primary: its copy of the key is
    // pushed back to a full lease.
    wait_until(
        "a renewal on the new primary",
        Duration::from_secs(15),
        || watched.replica.cmd::<i64>(&["PTTL", "lock:{job}"]) > 19_000,
    );
    std::fs::write(file(&dir, "go"), "").unwrap();
    let out = running.wait();
    assert_eq!(
        out.code(),
        Some(0),
        "the lock survived the failover: {out:?}"
    );
    assert!(
        !watched.replica.exists("lock:{job}"),
        "released on the new primary"
    );
}

#[test]
fn through_sentinels_a_failover_that_lost_the_lock_stops_the_command() {
    let watched = Watched::start();
    let dir = scratch();
    let (running, child) = start_job(
        &watched.url(),
        dir.path(),
        &["--ttl", "20s"],
        "exec sleep 60",
    );
    wait_until(
        "the key reached the replica",
        Duration::from_secs(10),
        || watched.replica.exists("lock:{job}"),
    );
    // As if the primary had died before replicating the grant: the replica never saw it.
    let _: String = watched
        .replica
        .cmd(&["CONFIG", "SET", "replica-read-only", "no"]);
    let _: i64 = watched.replica.cmd(&["DEL", "lock:{job}"]);
    watched.fail_over();
    assert!(
        wait_pid_exit(child, Duration::from_secs(30)),
        "the command was stopped"
    );
    let out = running.wait();
    assert_eq!(out.code(), Some(76), "{out:?}");
    assert!(out.stderr.contains("no longer ours"), "{}", out.stderr);
}

#[test]
fn a_cluster_keeps_each_locks_keys_in_one_slot_on_every_node() {
    let cluster = Cluster::start();
    // One NAME whose slot lives on each of the three nodes.
    let mut names: Vec<String> = Vec::new();
    for i in 0.. {
        let name = format!("job-{i}");
        let owner = cluster.owner(&format!("lock:{{{name}}}")).port;
        if !names
            .iter()
            .any(|n| cluster.owner(&format!("lock:{{{n}}}")).port == owner)
        {
            names.push(name);
        }
        if names.len() == 3 {
            break;
        }
    }
    for name in &names {
        let mut cmd = locked_run();
        cmd.args([
            "-u",
            &cluster.url(),
            name,
            "--",
            "sh",
            "-c",
            "echo $LOCKED_RUN_FENCE",
        ]);
        let out = run(cmd);
        assert_eq!(out.code(), Some(0), "{name}: {out:?}");
        assert_eq!(out.stdout.trim(), "1");
        let slots: Vec<i64> = ["lock", "fence", "holder", "released"]
            .iter()
            .map(|k| cluster.slot(&format!("{k}:{{{name}}}")))
            .collect();
        assert!(slots.iter().all(|&s| s == slots[0]), "{name}: {slots:?}");
        let owner = cluster.owner(&format!("fence:{{{name}}}"));
        assert_eq!(
            owner.get(&format!("fence:{{{name}}}")).as_deref(),
            Some("1"),
            "{name}: on the slot's owner"
        );
    }
}

#[test]
fn a_cluster_waiter_wakes_on_the_sharded_release() {
    let cluster = Cluster::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let mut holder = locked_run();
    holder.args(["-u", &cluster.url(), "job"]).args(sh(&format!(
        "echo up > {d}/up; while [ ! -e {d}/go ]; do sleep 0.01; done"
    )));
    let holder = spawn(holder);
    wait_for_file(&file(&dir, "up"), Duration::from_secs(10), |t| {
        !t.is_empty()
    });
    let mut waiter = locked_run();
    waiter.args([
        "-u",
        &cluster.url(),
        "job",
        "--",
        "sh",
        "-c",
        "echo $LOCKED_RUN_FENCE",
    ]);
    let waiter = spawn(waiter);
    let owner = cluster.owner("lock:{job}");
    wait_until(
        "the waiter listens on the slot's node",
        Duration::from_secs(10),
        || cluster_subscribers(owner) == 1,
    );
    std::fs::write(file(&dir, "go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    let released = std::time::Instant::now();
    let out = waiter.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "2");
    assert!(
        released.elapsed() < Duration::from_millis(500),
        "woken by the release message: {:?}",
        released.elapsed()
    );
}

#[test]
fn a_cluster_run_survives_its_slot_being_resharded() {
    let cluster = Cluster::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let mut cmd = locked_run();
    // T = 2 s: a renewal every 333 ms, through the migration.
    cmd.args(["-u", &cluster.url(), "--ttl", "2s", "-vv", "job"])
        .args(sh(&format!(
            "echo up > {d}/up; while [ ! -e {d}/go ]; do sleep 0.01; done"
        )));
    let running = spawn(cmd);
    wait_for_file(&file(&dir, "up"), Duration::from_secs(10), |t| {
        !t.is_empty()
    });
    let target = cluster.begin_moving("lock:{job}");
    // The slot is half-moved: renewals are answered with ASK for a while.
    std::thread::sleep(Duration::from_millis(800));
    cluster.finish_moving("lock:{job}", target);
    // Moved: renewals now hear MOVED and follow. One must land on the new owner.
    wait_until("a renewal on the new owner", Duration::from_secs(5), || {
        target.cmd::<i64>(&["PTTL", "lock:{job}"]) > 1_800
    });
    std::fs::write(file(&dir, "go"), "").unwrap();
    let out = running.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stderr.contains("is being moved to"),
        "ASK was followed: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("the lock's slot moved to"),
        "MOVED was followed: {}",
        out.stderr
    );
    assert!(!target.exists("lock:{job}"), "released on the new owner");
}

/// A request sent to the node a slot is moving to (ASK) runs only once that node took the
/// password: where it refuses it (and its default user needs none), nothing is taken there.
#[test]
fn an_ask_redirection_runs_nothing_before_the_password_is_taken() {
    let cluster = Cluster::start();
    for node in &cluster.nodes {
        let _: String = node.cmd(&["ACL", "SETUSER", "cron", "on", ">pw", "~*", "&*", "+@all"]);
    }
    let target = cluster.begin_moving("lock:{job}");
    // The importing node knows the script (EVALSHA would run it) and another password.
    let _: String = target.cmd(&["SCRIPT", "LOAD", locked_run::redis::scripts::ACQUIRE.source]);
    let _: String = target.cmd(&["ACL", "SETUSER", "cron", "resetpass", ">other"]);
    let url = cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://cron:pw@");
    let mut cmd = locked_run();
    cmd.env("LOCKED_RUN_URL", &url)
        .args(["-n", "job", "--", "true"]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert!(out.stderr.contains("WRONGPASS"), "{}", out.stderr);
    // ASKING makes the slot's keys visible on the importing node for one command.
    let exists: Vec<redis::Value> = {
        let mut conn = target.conn();
        redis::pipe()
            .cmd("ASKING")
            .cmd("EXISTS")
            .arg("lock:{job}")
            .query(&mut conn)
            .unwrap()
    };
    assert_eq!(
        exists.get(1),
        Some(&redis::Value::Int(0)),
        "nothing taken there"
    );
    cluster.finish_moving("lock:{job}", target);
}

/// When the lock's slot moves to another node, the server ends a waiter's sharded subscription
/// (a `sunsubscribe` push): the waiter subscribes again, on the new owner, and wakes on the
/// release there instead of sleeping out the holder's PTTL.
#[test]
fn a_cluster_waiter_follows_its_slot_to_the_new_owner() {
    let cluster = Cluster::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let mut cmd = locked_run();
    cmd.args(["-u", &cluster.url(), "--ttl", "30s", "job"])
        .args(sh(&format!(
            "echo up > {d}/up; while [ ! -e {d}/go ]; do sleep 0.01; done"
        )));
    let holder = spawn(cmd);
    wait_for_file(&file(&dir, "up"), Duration::from_secs(10), |t| {
        !t.is_empty()
    });
    let listening = |node: &Redis| cluster_subscribers(node) == 1;
    let source = cluster.owner("lock:{job}");
    let mut cmd = locked_run();
    cmd.args(["-u", &cluster.url(), "-v", "-w", "20s", "job", "--", "true"]);
    let waiter = spawn(cmd);
    wait_until(
        "the waiter listens on the owner",
        Duration::from_secs(10),
        || listening(source),
    );
    let target = cluster.begin_moving("lock:{job}");
    cluster.finish_moving("lock:{job}", target);
    // A sharded subscription is ended by the server when its slot moves, and made again on the
    // new owner. (Before Redis 7 the waiter listens on a plain channel, which every node of the
    // cluster hears: it need not move.)
    if server_kind().version >= (7, 0) {
        wait_until(
            "the waiter listens on the new owner",
            Duration::from_secs(10),
            || listening(target),
        );
    }
    std::fs::write(file(&dir, "go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    let out = waiter.wait_for(Duration::from_secs(10));
    assert_eq!(out.code(), Some(0), "{out:?}");
}

#[test]
fn doctor_tells_a_cluster_node_from_a_cluster() {
    let cluster = Cluster::start();
    let mut cmd = locked_run();
    cmd.args(["doctor", "-u", &cluster.url()]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stdout.contains("OK   redis+cluster://")
            && out.stdout.contains("cluster: Redis Cluster"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("FAIL "), "{}", out.stdout);

    // One node of it, named as a plain server: the lock's slot may live elsewhere.
    let mut cmd = locked_run();
    cmd.args(["doctor", "-u", &cluster.nodes[0].url()]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(
        out.stdout.contains("use redis+cluster://"),
        "{}",
        out.stdout
    );
}

/// The seeds are asked where the lock's slot lives as the URL's user: a cluster whose default
/// user may not run CLUSTER works with a user and password (given through LOCKED_RUN_URL).
#[test]
fn a_cluster_is_asked_with_the_urls_user() {
    let cluster = Cluster::start();
    for node in &cluster.nodes {
        let _: String = node.cmd(&["ACL", "SETUSER", "cron", "on", ">pw", "~*", "&*", "+@all"]);
        let _: String = node.cmd(&["ACL", "SETUSER", "default", "-cluster"]);
    }
    let url = cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://cron:pw@");
    let mut cmd = locked_run();
    cmd.env("LOCKED_RUN_URL", &url)
        .args(["job", "--", "sh", "-c", "echo $LOCKED_RUN_FENCE"]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "1");
    assert!(!out.stderr.contains("pw"), "{}", out.stderr);
}

/// How a cluster node counts a channel's subscribers: sharded ones from Redis 7 on; before it
/// (no sharded pub/sub), waiters subscribe to the plain channel.
fn numsub() -> &'static str {
    if server_kind().version >= (7, 0) {
        "SHARDNUMSUB"
    } else {
        "NUMSUB"
    }
}

fn cluster_subscribers(node: &Redis) -> i64 {
    let reply: Vec<redis::Value> = node.cmd(&["PUBSUB", numsub(), "released:{job}"]);
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("{other:?}"),
    }
}
