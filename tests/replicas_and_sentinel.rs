//! A primary and its replicas: `--wait-replicas` acknowledgements, and Sentinel, whose
//! failovers a run follows (and is stopped by, when the new primary never saw the lock).

use std::time::Duration;

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

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
    let out = lr()
        .url(&primary.url())
        .args(["--wait-replicas", "1"])
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert_eq!(out.stdout.trim(), "1");

    let dir = scratch();
    let marker = file(&dir, "ran");
    let out = lr()
        .url(&primary.url())
        .args(["--wait-replicas", "2", "--wait-replicas-timeout", "200ms"])
        .job(["touch", path_str(&marker)])
        .run()
        .expect(69);
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

/// With `--holders N`, each renewal of a slot is acknowledged like a single holder's: a run
/// that outlasts its TTL several times over keeps its slot and ends with its own status.
#[test]
fn a_holders_slot_is_renewed_under_wait_replicas() {
    let primary = Redis::start();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    wait_until("the replica is in sync", Duration::from_secs(10), || {
        replica
            .cmd::<String>(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
    // T = 500 ms, so R = 83 ms: a 1.5 s command lives on about 18 acknowledged renewals.
    let args = ["--holders", "2", "--wait-replicas", "1", "--ttl", "500ms"];
    lr().url(&primary.url())
        .args(args)
        .job(sh("sleep 1.5; exit 7"))
        .run()
        .expect(7);
    assert!(!primary.exists("holders:{job}"), "the slot was given back");
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
    lr().url(&url)
        .args(["--connect-timeout", "1s"])
        .job(["true"])
        .run()
        .expect(0);
}

#[test]
fn through_sentinels_a_failover_that_kept_the_lock_goes_on() {
    let watched = Watched::start();
    let holder = Holder::start_on(&watched.url(), "job", &["--ttl", "20s"]);
    assert_eq!(holder.fence(), 1);
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
    holder
        .finish()
        .expect_with(0, "the lock survived the failover");
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
    let out = running.wait().expect(76);
    assert!(out.stderr.contains("no longer ours"), "{}", out.stderr);
}
