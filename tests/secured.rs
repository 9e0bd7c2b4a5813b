//! Secured Sentinel and Cluster: `rediss+sentinel://` and `rediss+cluster://` against servers
//! that are TLS-only at every hop, with ACL users on the data nodes and the sentinels' own
//! apart (`LOCKED_RUN_SENTINEL_AUTH`, `--sentinel-password-file`); each failing hop a one-line
//! 69 that names it, and `doctor` checking each hop. See: issue 27.

use std::time::Duration;

use crate::support::cluster::SecuredCluster;
use crate::support::sentinel::SecuredWatched;
use crate::support::tls::{DATA_PASS, DATA_USER, SENTINEL_PASS, SENTINEL_USER};
use crate::support::*;

fn sentinel_auth() -> String {
    format!("{SENTINEL_USER}:{SENTINEL_PASS}")
}

/// `locked-run` through the secured sentinels: the URL (with the data nodes' password) in
/// LOCKED_RUN_URL, the sentinels' credentials in LOCKED_RUN_SENTINEL_AUTH, the TLS options.
fn through(watched: &SecuredWatched) -> LockedRun {
    lr().env("LOCKED_RUN_URL", watched.url())
        .env("LOCKED_RUN_SENTINEL_AUTH", sentinel_auth())
        .args(watched.tls_args())
}

fn no_secret_in(out: &Output) {
    let all = format!("{}{}", out.stdout, out.stderr);
    assert!(
        !all.contains(DATA_PASS) && !all.contains(SENTINEL_PASS),
        "{out:?}"
    );
}

#[test]
fn a_run_holds_through_tls_sentinels_with_their_own_user() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let watched = SecuredWatched::start();
    let holder = Holder::with(through(&watched), "job");
    assert_eq!(holder.fence(), 1);
    assert_eq!(
        watched
            .data(&watched.primary, &["EXISTS", "lock:{job}"])
            .trim(),
        "1",
        "taken on the primary the sentinels named, over TLS, as the data nodes' user"
    );
    let status = through(&watched).args(["status", "job"]).run().expect(0);
    no_secret_in(&status);
    let out = holder.finish().expect(0);
    no_secret_in(&out);
    assert_eq!(
        watched
            .data(&watched.primary, &["EXISTS", "lock:{job}"])
            .trim(),
        "0",
        "released"
    );

    // The sentinels' credentials from a file instead, its first line.
    let secrets = scratch();
    let path = file(&secrets, "sentinel-auth");
    std::fs::write(&path, format!("{}\n", sentinel_auth())).unwrap();
    let out = lr()
        .env("LOCKED_RUN_URL", watched.url())
        .args(watched.tls_args())
        .args(["--sentinel-password-file", path_str(&path)])
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert_eq!(out.stdout.trim(), "2");
    no_secret_in(&out);
}

#[test]
fn through_tls_sentinels_a_failover_during_a_hold_goes_on() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let watched = SecuredWatched::start();
    let holder = Holder::with(through(&watched).args(["--ttl", "20s"]), "job");
    wait_until(
        "the key reached the replica",
        Duration::from_secs(10),
        || {
            watched
                .data(&watched.replica, &["EXISTS", "lock:{job}"])
                .trim()
                == "1"
        },
    );
    watched.fail_over();
    // Renewals (every 3.3 s) follow the sentinels to the new primary, over TLS.
    wait_until(
        "a renewal on the new primary",
        Duration::from_secs(15),
        || {
            let pttl = watched.data(&watched.replica, &["PTTL", "lock:{job}"]);
            pttl.trim().parse::<i64>().unwrap_or(0) > 19_000
        },
    );
    holder
        .finish()
        .expect_with(0, "the lock survived the failover");
    assert_eq!(
        watched
            .data(&watched.replica, &["EXISTS", "lock:{job}"])
            .trim(),
        "0",
        "released on the new primary"
    );
}

/// Each hop that fails is one line, status 69, naming the hop: a sentinel's certificate, a
/// sentinel refusing its password (or the data nodes' password, when it has no other), a
/// plain client against TLS sentinels; and `doctor` says which hop fails.
#[test]
fn each_failing_hop_is_a_one_line_69_that_names_it() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let watched = SecuredWatched::start();
    let other_ca = path_str(&watched.trust.certs.other_ca).to_owned();
    let client = [
        "--tls-cert",
        path_str(&watched.trust.certs.client_cert),
        "--tls-key",
        path_str(&watched.trust.certs.client_key),
    ];

    // A CA that did not sign the sentinels' certificates.
    let out = lr()
        .env("LOCKED_RUN_URL", watched.url())
        .env("LOCKED_RUN_SENTINEL_AUTH", sentinel_auth())
        .args(["--tls-ca-cert", &other_ca])
        .args(client)
        .job(["true"])
        .run()
        .expect_one_line(69, "sentinel 127.0.0.1:");
    assert!(out.stderr.contains("certificate"), "{}", out.stderr);
    assert!(out.stderr.contains("--tls-ca-cert"), "{}", out.stderr);

    // The sentinels' own password, wrong.
    let out = through(&watched)
        .env("LOCKED_RUN_SENTINEL_AUTH", format!("{SENTINEL_USER}:wrong"))
        .job(["true"])
        .run()
        .expect_one_line(
            69,
            "the password from LOCKED_RUN_SENTINEL_AUTH was refused (WRONGPASS) by sentinel",
        );
    assert!(out.stderr.contains("sentinel 127.0.0.1:"), "{}", out.stderr);

    // None given: the data nodes' credentials, which the sentinels do not take.
    let out = lr()
        .env("LOCKED_RUN_URL", watched.url())
        .args(watched.tls_args())
        .job(["true"])
        .run()
        .expect_one_line(69, "LOCKED_RUN_SENTINEL_AUTH");
    assert!(out.stderr.contains("sentinel 127.0.0.1:"), "{}", out.stderr);
    no_secret_in(&out);

    // A plain client against TLS sentinels.
    let plain = watched
        .url()
        .replace("rediss+sentinel://", "redis+sentinel://");
    lr().env("LOCKED_RUN_URL", &plain)
        .env("LOCKED_RUN_SENTINEL_AUTH", sentinel_auth())
        .job(["true"])
        .run()
        .expect_one_line(69, "use rediss+sentinel://");
    // ... and the TLS options with a plain URL: a usage error.
    lr().env("LOCKED_RUN_URL", &plain)
        .args(watched.tls_args())
        .job(["true"])
        .run()
        .expect_one_line(2, "rediss+sentinel://");

    // doctor: every hop OK, then the failing one named.
    let out = through(&watched).arg("doctor").run().expect(0);
    assert_eq!(
        out.stdout.matches("sentinel: sentinel 127.0.0.1:").count(),
        3,
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("TLS verified, authenticated"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("tls: "), "{}", out.stdout);
    no_secret_in(&out);
    let out = through(&watched)
        .env("LOCKED_RUN_SENTINEL_AUTH", format!("{SENTINEL_USER}:wrong"))
        .arg("doctor")
        .run()
        .expect(1);
    assert!(
        out.stdout.lines().any(|l| l.starts_with("FAIL")
            && l.contains("sentinel 127.0.0.1:")
            && l.contains("the password from LOCKED_RUN_SENTINEL_AUTH was refused")),
        "{}",
        out.stdout
    );
    no_secret_in(&out);
}

/// The sentinels verify, the primary they name does not: its hop is the one named.
#[test]
fn a_primary_whose_certificate_does_not_verify_is_named() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let watched = SecuredWatched::start_with(true);
    let out = through(&watched)
        .job(["true"])
        .run()
        .expect_one_line(69, "the primary 127.0.0.1:");
    assert!(out.stderr.contains("certificate"), "{}", out.stderr);
    let out = through(&watched).arg("doctor").run().expect(1);
    assert_eq!(
        out.stdout.matches("sentinel: sentinel 127.0.0.1:").count(),
        3,
        "every sentinel verified: {}",
        out.stdout
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains("the primary 127.0.0.1:")),
        "{}",
        out.stdout
    );
}

#[test]
fn a_run_holds_through_a_tls_cluster() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let cluster = SecuredCluster::start();
    let out = lr()
        .env("LOCKED_RUN_URL", cluster.url())
        .args(cluster.trust.client_args())
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert_eq!(out.stdout.trim(), "1");
    no_secret_in(&out);
    let out = lr()
        .env("LOCKED_RUN_URL", cluster.url())
        .args(cluster.trust.client_args())
        .arg("doctor")
        .run()
        .expect(0);
    assert_eq!(
        out.stdout.matches("seed: cluster node").count(),
        3,
        "{}",
        out.stdout
    );
    // A CA that did not sign the nodes' certificates: the seed is named.
    let out = lr()
        .env("LOCKED_RUN_URL", cluster.url())
        .args(["--tls-ca-cert", path_str(&cluster.trust.certs.other_ca)])
        .args([
            "--tls-cert",
            path_str(&cluster.trust.certs.client_cert),
            "--tls-key",
            path_str(&cluster.trust.certs.client_key),
        ])
        .job(["true"])
        .run()
        .expect_one_line(69, "cluster node 127.0.0.1:");
    assert!(out.stderr.contains("certificate"), "{}", out.stderr);
}

/// A slot migrated during a hold on a TLS cluster: renewals follow ASK, then MOVED, to the
/// new owner, over TLS with the same certificates and user, and the hold goes on.
#[test]
fn a_tls_cluster_run_survives_its_slot_being_resharded() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let cluster = SecuredCluster::start();
    let user = (DATA_USER, DATA_PASS);
    let cli = |port: u16, args: &[&str]| cluster.trust.cli(port, user, args).trim().to_owned();
    let running = Holder::with(
        lr().env("LOCKED_RUN_URL", cluster.url())
            .args(cluster.trust.client_args())
            .args(["--ttl", "2s", "-vv"]),
        "job",
    );
    let slot = cli(cluster.nodes[0].port, &["CLUSTER", "KEYSLOT", "lock:{job}"]);
    let has = |port: u16| cli(port, &["CLUSTER", "COUNTKEYSINSLOT", &slot]) != "0";
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let source = *ports.iter().find(|&&p| has(p)).expect("the lock's owner");
    let target = *ports.iter().find(|&&p| p != source).unwrap();
    let (source_id, target_id) = (
        cli(source, &["CLUSTER", "MYID"]),
        cli(target, &["CLUSTER", "MYID"]),
    );
    cli(
        target,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id],
    );
    cli(
        source,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id],
    );
    let keys = cli(source, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
    let port = target.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000"];
    migrate.extend(["AUTH2", user.0, user.1, "KEYS"]);
    migrate.extend(keys.lines().map(str::trim).filter(|k| !k.is_empty()));
    let migrated = cli(source, &migrate);
    assert_eq!(migrated, "OK", "MIGRATE over TLS");
    // Half-moved: renewals hear ASK for a while.
    std::thread::sleep(Duration::from_millis(800));
    for &p in &ports {
        cli(p, &["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
    }
    wait_until("a renewal on the new owner", Duration::from_secs(5), || {
        cli(target, &["PTTL", "lock:{job}"])
            .parse::<i64>()
            .is_ok_and(|ms| ms > 1_800)
    });
    let out = running.finish().expect(0);
    assert!(
        out.stderr.contains("is being moved to"),
        "ASK: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("the lock's slot moved to"),
        "MOVED: {}",
        out.stderr
    );
    assert_eq!(
        cli(target, &["EXISTS", "lock:{job}"]),
        "0",
        "released on the new owner"
    );
}

/// A primary that stops answering (SIGSTOPped) behind answering sentinels: the one line names
/// the hop that went silent, not only the URL.
#[test]
fn a_silent_primary_is_named_in_the_timeout() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let watched = SecuredWatched::start();
    signal(watched.primary.pid(), libc::SIGSTOP);
    let out = through(&watched)
        .args(["--connect-timeout", "2s", "job", "true"])
        .run()
        .expect_one_line(69, "did not answer within 2s: the primary 127.0.0.1:");
    no_secret_in(&out);
    signal(watched.primary.pid(), libc::SIGCONT);
}
