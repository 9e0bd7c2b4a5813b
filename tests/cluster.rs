//! Redis Cluster: every key of a lock in its NAME's slot, a waiter woken by the sharded release
//! (and following the slot when it moves), a run surviving a reshard, ASK and MOVED, the URL's
//! user and password on every node, and `doctor` telling a node from the cluster.

use std::time::Duration;

use crate::support::*;

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
        let out = lr()
            .url(&cluster.url())
            .name(name)
            .command(sh("echo $LOCKED_RUN_FENCE"))
            .run()
            .expect_with(0, name);
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
    let holder = Holder::with(lr().url(&cluster.url()), "job");
    let waiter = lr()
        .url(&cluster.url())
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .spawn();
    let owner = cluster.owner("lock:{job}");
    wait_until(
        "the waiter listens on the slot's node",
        Duration::from_secs(10),
        || cluster_subscribers(owner) == 1,
    );
    holder.finish().expect(0);
    let released = std::time::Instant::now();
    let out = waiter.wait().expect(0);
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
    // T = 2 s: a renewal every 333 ms, through the migration.
    let running = Holder::with(lr().url(&cluster.url()).args(["--ttl", "2s", "-vv"]), "job");
    let target = cluster.begin_moving("lock:{job}");
    // The slot is half-moved: renewals are answered with ASK for a while.
    std::thread::sleep(Duration::from_millis(800));
    cluster.finish_moving("lock:{job}", target);
    // Moved: renewals now hear MOVED and follow. One must land on the new owner.
    wait_until("a renewal on the new owner", Duration::from_secs(5), || {
        target.cmd::<i64>(&["PTTL", "lock:{job}"]) > 1_800
    });
    let out = running.finish().expect(0);
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
    let _: String = target.cmd(&[
        "SCRIPT",
        "LOAD",
        locked_run::internals::redis::scripts::ACQUIRE.source,
    ]);
    let _: String = target.cmd(&["ACL", "SETUSER", "cron", "resetpass", ">other"]);
    let url = cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://cron:pw@");
    let out = lr()
        .env("LOCKED_RUN_URL", &url)
        .arg("-n")
        .job(["true"])
        .run()
        .expect(69);
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
    let holder = Holder::with(lr().url(&cluster.url()).args(["--ttl", "30s"]), "job");
    let listening = |node: &Redis| cluster_subscribers(node) == 1;
    let source = cluster.owner("lock:{job}");
    let waiter = lr()
        .url(&cluster.url())
        .args(["-v", "-w", "20s"])
        .job(["true"])
        .spawn();
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
    holder.finish().expect(0);
    waiter.wait_for(Duration::from_secs(10)).expect(0);
}

#[test]
fn doctor_tells_a_cluster_node_from_a_cluster() {
    let cluster = Cluster::start();
    let out = lr().args(["doctor", "-u", &cluster.url()]).run().expect(0);
    assert!(
        out.stdout.contains("OK   redis+cluster://")
            && out.stdout.contains("cluster: Redis Cluster"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("FAIL "), "{}", out.stdout);

    // One node of it, named as a plain server: the lock's slot may live elsewhere.
    let out = lr()
        .args(["doctor", "-u", &cluster.nodes[0].url()])
        .run()
        .expect(1);
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
    let out = lr()
        .env("LOCKED_RUN_URL", &url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
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

/// The subscribers of job's release channels on `node`: the NAME's own and each fair
/// waiter's (`released:{job}:TOKEN`).
fn cluster_subscribers(node: &Redis) -> i64 {
    let channels = match numsub() {
        "SHARDNUMSUB" => "SHARDCHANNELS",
        _ => "CHANNELS",
    };
    let names: Vec<String> = node.cmd(&["PUBSUB", channels, "released:{job}*"]);
    names
        .iter()
        .map(|name| {
            let reply: Vec<redis::Value> = node.cmd(&["PUBSUB", numsub(), name]);
            match reply.get(1) {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("{other:?}"),
            }
        })
        .sum()
}
