//! Production Redis: secrets that never show, replicas that must acknowledge the lock, TLS,
//! Sentinel and Cluster.

use std::time::Duration;

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
        let out = sentinel_cli(self.ports[0], &["SENTINEL", "FAILOVER", "mymaster"]);
        assert!(out.contains("OK"), "SENTINEL FAILOVER: {out}");
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
