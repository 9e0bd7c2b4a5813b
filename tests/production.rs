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

/// A primary, a replica in sync, and three sentinels watching them as `mymaster`.
struct Watched {
    primary: Redis,
    replica: Redis,
    sentinels: Vec<std::process::Child>,
    ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl Drop for Watched {
    fn drop(&mut self) {
        for s in &mut self.sentinels {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

impl Watched {
    fn start() -> Watched {
        let primary = Redis::start();
        let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
        wait_until("the replica is in sync", Duration::from_secs(10), || {
            replica
                .cmd::<String>(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        let dir = scratch();
        let mut sentinels = Vec::new();
        let mut ports = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = file(&dir, &format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {d}\nsentinel monitor mymaster 127.0.0.1 {p} 2\n\
                     sentinel down-after-milliseconds mymaster 2000\nsentinel failover-timeout mymaster 10000\n",
                    d = path_str(dir.path()),
                    p = primary.port
                ),
            )
            .unwrap();
            let child = std::process::Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            sentinels.push(child);
            ports.push(port);
        }
        let watched = Watched {
            primary,
            replica,
            sentinels,
            ports,
            _dir: dir,
        };
        let replica_port = watched.replica.port.to_string();
        wait_until(
            "the sentinels know the primary and its replica",
            Duration::from_secs(20),
            || {
                watched.ports.iter().all(|p| {
                    let out = sentinel_cli(*p, &["SENTINEL", "replicas", "mymaster"]);
                    out.contains(&replica_port) && !out.contains("s_down")
                })
            },
        );
        watched
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/mymaster", hosts.join(","))
    }

    /// Forces a failover and waits until the replica is the primary the sentinels name.
    fn fail_over(&self) {
        // Until a sentinel has had the replica's own INFO, it calls no replica suitable
        // (NOGOODSLAVE): ask until it accepts.
        wait_until(
            "SENTINEL FAILOVER accepted",
            Duration::from_secs(30),
            || {
                let out = sentinel_cli(self.ports[0], &["SENTINEL", "FAILOVER", "mymaster"]);
                assert!(
                    out.contains("OK") || out.contains("NOGOODSLAVE"),
                    "SENTINEL FAILOVER: {out}"
                );
                out.contains("OK")
            },
        );
        let replica_port = self.replica.port.to_string();
        wait_until("the replica was promoted", Duration::from_secs(30), || {
            sentinel_cli(
                self.ports[0],
                &["SENTINEL", "get-master-addr-by-name", "mymaster"],
            )
            .contains(&replica_port)
                && self
                    .replica
                    .cmd::<String>(&["INFO", "replication"])
                    .contains("role:master")
        });
    }
}

fn sentinel_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
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

/// Three primaries of a Redis Cluster, created with `redis-cli --cluster create`.
struct Cluster {
    nodes: Vec<Redis>,
}

impl Cluster {
    fn start() -> Cluster {
        let nodes: Vec<Redis> = (0..3)
            .map(|_| {
                let bus = free_port().to_string();
                Redis::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect();
        let mut create = std::process::Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        wait_until("the cluster is up", Duration::from_secs(20), || {
            cluster.nodes.iter().all(|n| {
                n.cmd::<String>(&["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            })
        });
        cluster
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Starts moving `key`'s slot, and the keys in it, to another node (returned); until
    /// `finish_moving`, its old owner answers ASK for keys no longer there.
    fn begin_moving(&self, key: &str) -> &Redis {
        let slot = self.slot(key).to_string();
        let source = self.owner(key);
        let target = self.nodes.iter().find(|n| n.port != source.port).unwrap();
        let (source_id, target_id): (String, String) = (
            source.cmd(&["CLUSTER", "MYID"]),
            target.cmd(&["CLUSTER", "MYID"]),
        );
        let _: String = target.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id]);
        let _: String = source.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id]);
        let keys: Vec<String> = source.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
        let mut migrate = vec![
            "MIGRATE".to_owned(),
            "127.0.0.1".into(),
            target.port.to_string(),
            "".into(),
            "0".into(),
            "5000".into(),
            "KEYS".into(),
        ];
        migrate.extend(keys);
        let migrate: Vec<&str> = migrate.iter().map(String::as_str).collect();
        let _: String = source.cmd(&migrate);
        target
    }

    /// Gives `key`'s slot to `target` on every node (after `begin_moving`).
    fn finish_moving(&self, key: &str, target: &Redis) {
        let slot = self.slot(key).to_string();
        let target_id: String = target.cmd(&["CLUSTER", "MYID"]);
        for n in &self.nodes {
            let _: String = n.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
        }
    }

    fn slot(&self, key: &str) -> i64 {
        self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key])
    }

    /// The node that owns `key`'s slot.
    fn owner(&self, key: &str) -> &Redis {
        let owner = self.owner_id(self.slot(key));
        self.nodes
            .iter()
            .find(|n| n.cmd::<String>(&["CLUSTER", "MYID"]) == owner)
            .unwrap()
    }

    fn owner_id(&self, slot: i64) -> String {
        let slots: Vec<redis::Value> = self.nodes[0].cmd(&["CLUSTER", "SLOTS"]);
        for range in slots {
            let redis::Value::Array(items) = range else {
                continue;
            };
            let (redis::Value::Int(start), redis::Value::Int(end)) = (&items[0], &items[1]) else {
                continue;
            };
            if (*start..=*end).contains(&slot) {
                if let redis::Value::Array(primary) = &items[2] {
                    if let Some(redis::Value::BulkString(id)) = primary.get(2) {
                        return String::from_utf8_lossy(id).into_owned();
                    }
                }
            }
        }
        panic!("nobody owns slot {slot}")
    }
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
        || {
            let reply: Vec<redis::Value> = owner.cmd(&["PUBSUB", "SHARDNUMSUB", "released:{job}"]);
            reply.get(1) == Some(&redis::Value::Int(1))
        },
    );
    std::fs::write(file(&dir, "go"), "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    let released = std::time::Instant::now();
    let out = waiter.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout.trim(), "2");
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by SPUBLISH: {:?}",
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
    let _: String = target.cmd(&["SCRIPT", "LOAD", locked_run::scripts::ACQUIRE.source]);
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
    let listening = |node: &Redis| {
        let reply: Vec<redis::Value> = node.cmd(&["PUBSUB", "SHARDNUMSUB", "released:{job}"]);
        matches!(reply.get(1), Some(redis::Value::Int(1)))
    };
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
    wait_until(
        "the waiter listens on the new owner",
        Duration::from_secs(10),
        || listening(target),
    );
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
