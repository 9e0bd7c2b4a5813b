//! `doctor` for one Redis server: each hop before it (the sentinels, a cluster's seeds),
//! reachability and TLS, what server and version it is, role, cluster mode, eviction,
//! persistence, permissions and clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::version::{Feature, Server};
use super::{Check, Facts, Level, parse_info, permissions};
use crate::lease::Timings;
use crate::name::LockName;
use crate::redis::node::Node;
use crate::redis::resp::Reply;
use crate::text::show;

pub(super) async fn check_server(node: &Node, name: &LockName) -> (Vec<Check>, Facts) {
    let server = node.address().to_owned();
    let mut checks = Vec::new();
    let mut facts = Facts::default();
    let mut add = |check: &'static str, level: Level, detail: String| {
        checks.push(Check {
            server: server.clone(),
            check,
            level,
            detail,
        })
    };
    let timeout = node.connect_timeout();

    // The hops before the data node: each sentinel, or each seed of a cluster, on its own,
    // so that the one that fails is named.
    for (hop, said) in node.hops(timeout).await {
        let check = if hop.starts_with("sentinel") {
            "sentinel"
        } else {
            "seed"
        };
        match said {
            Ok(detail) => add(check, Level::Ok, format!("{hop}: {detail}")),
            Err(e) => add(check, Level::Fail, e),
        }
    }

    // Reachability: the first PING connects, the second measures the round trip.
    if let Err(e) = node.exchange(&[&[b"PING"]], timeout, None).await {
        add("reachable", Level::Fail, e.to_string());
        return (checks, facts);
    }
    let started = Instant::now();
    let _ = node.exchange(&[&[b"PING"]], timeout, None).await;
    add(
        "reachable",
        Level::Ok,
        format!(
            "round trip {:.2} ms",
            started.elapsed().as_secs_f64() * 1000.0
        ),
    );
    if node.is_tls() {
        add(
            "tls",
            Level::Ok,
            "the server's certificate verified (--tls-ca-cert, or the system's CAs)".into(),
        );
    }

    // INFO: version, role, cluster mode, identity.
    let info = match node
        .exchange(&[&[b"INFO"]], timeout, None)
        .await
        .map(|mut r| r.remove(0))
    {
        Ok(Reply::Error(e)) => {
            add(
                "info",
                Level::Warn,
                format!("cannot read INFO ({e}): version and role not checked"),
            );
            HashMap::new()
        }
        Ok(reply) => parse_info(&reply.as_text().unwrap_or_default()),
        Err(e) => {
            add("info", Level::Warn, format!("{e}"));
            HashMap::new()
        }
    };
    let kind = Server::from_info(&info);
    if let Some(kind) = &kind {
        let (level, detail) = kind.judged();
        add("version", level, detail);
        let missing = kind.missing(node.is_cluster());
        if !missing.is_empty() {
            add(
                "features",
                Level::Warn,
                format!("{kind} has no {}", missing.join("; no ")),
            );
        }
    }
    facts.run_id = info.get("run_id").cloned();
    match info.get("role").map(String::as_str) {
        Some("slave") => {
            let primary = format!(
                "{}:{}",
                info.get("master_host").map_or("?", String::as_str),
                info.get("master_port").map_or("?", String::as_str)
            );
            add(
                "role",
                Level::Fail,
                format!(
                    "a replica of {primary}: it refuses writes (READONLY), and a lock held on a replica is lost on failover; \
                     point --url at the primary (or use redis+sentinel://)"
                ),
            );
            facts.primary = Some(primary);
        }
        Some(role) => add("role", Level::Ok, role.replace("master", "primary")),
        None => {}
    }
    for (key, value) in &info {
        if key.starts_with("slave") && key[5..].chars().all(|c| c.is_ascii_digit()) {
            let field = |f: &str| {
                value
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{f}=")).map(str::to_owned))
            };
            if let (Some(ip), Some(port)) = (field("ip"), field("port")) {
                facts.replicas.push(format!("{ip}:{port}"));
            }
        }
    }
    if info.get("cluster_enabled").map(String::as_str) == Some("1") {
        if node.is_cluster() {
            add(
                "cluster",
                Level::Ok,
                format!(
                    "Redis Cluster, reached through {}",
                    if node.is_tls() {
                        "rediss+cluster://"
                    } else {
                        "redis+cluster://"
                    }
                ),
            );
        } else {
            add(
                "cluster",
                Level::Fail,
                "this server is part of a Redis Cluster: use redis+cluster:// so the lock's slot is found".into(),
            );
        }
    }

    // Configuration: eviction and persistence.
    let config = node
        .exchange(
            &[
                &[b"CONFIG", b"GET", b"maxmemory"],
                &[b"CONFIG", b"GET", b"maxmemory-policy"],
                &[b"CONFIG", b"GET", b"appendonly"],
                &[b"CONFIG", b"GET", b"appendfsync"],
            ],
            timeout,
            None,
        )
        .await;
    match config {
        Ok(replies) if replies.iter().all(|r| !matches!(r, Reply::Error(_))) => {
            let value = |i: usize| {
                replies
                    .get(i)
                    .and_then(|r| r.items().get(1))
                    .and_then(Reply::as_text)
                    .unwrap_or_default()
            };
            let (maxmemory, policy, aof, fsync) = (value(0), value(1), value(2), value(3));
            if maxmemory == "0" {
                add(
                    "maxmemory-policy",
                    Level::Ok,
                    "no memory limit: nothing is evicted".into(),
                );
            } else if policy == "noeviction" {
                add(
                    "maxmemory-policy",
                    Level::Ok,
                    "noeviction: nothing of the lock's is evicted; writes fail (OOM) when full"
                        .into(),
                );
            } else if policy.starts_with("allkeys") {
                add(
                    "maxmemory-policy",
                    Level::Warn,
                    format!(
                        "{policy}: can evict fence:{{NAME}} counters (fence tokens repeat) and held locks (two holders); use noeviction"
                    ),
                );
            } else {
                add(
                    "maxmemory-policy",
                    Level::Warn,
                    format!(
                        "{policy}: can evict keys with an expiry, a held lock among them; use noeviction"
                    ),
                );
            }
            match (aof.as_str(), fsync.as_str()) {
                ("yes", "always") => add("persistence", Level::Ok, "AOF with appendfsync always: fence counters survive a restart".into()),
                ("yes", _) => add(
                    "persistence",
                    Level::Warn,
                    format!("AOF with appendfsync {fsync}: a crash can lose the last second of writes, fence counters included; appendfsync always keeps fence tokens monotonic across restarts"),
                ),
                _ => add(
                    "persistence",
                    Level::Warn,
                    "no AOF: a restart loses or rewinds the fence counters (to the last snapshot), and fence tokens repeat; \
                     appendonly yes with appendfsync always keeps them monotonic"
                        .into(),
                ),
            }
        }
        Ok(replies) => {
            let why = replies.iter().find_map(|r| {
                if let Reply::Error(e) = r {
                    Some(e.clone())
                } else {
                    None
                }
            });
            add(
                "config",
                Level::Warn,
                format!(
                    "cannot read the configuration ({}): check maxmemory-policy (noeviction) and persistence (appendfsync always) yourself",
                    why.unwrap_or_default()
                ),
            );
        }
        Err(e) => add("config", Level::Warn, e.to_string()),
    }

    // Permissions: every command the lock's scripts and waiters use, on its keys.
    let (level, detail) = permissions::check(node, name, kind.as_ref(), timeout).await;
    add("permissions", level, detail);

    // The server's clock against this host's.
    let before = crate::backend::wall_clock_ms() as i64;
    let started = Instant::now();
    let time = node.exchange(&[&[b"TIME"]], timeout, None).await;
    let rtt = started.elapsed();
    let reply = match time {
        Ok(mut replies) if !replies.is_empty() => replies.remove(0),
        Ok(_) => Reply::Bulk(None),
        Err(e) => Reply::Error(e.to_string()),
    };
    let items = reply.items();
    match (
        items.first().and_then(Reply::as_int),
        items.get(1).and_then(Reply::as_int),
    ) {
        (Some(secs), Some(micros)) => {
            let server = secs * 1000 + micros / 1000;
            let local = before + rtt.as_millis() as i64 / 2;
            let skew = server - local;
            facts.skew_ms = Some(skew);
            let allowance = Timings::drift_for(Duration::from_secs(30));
            let level = if skew.unsigned_abs() > allowance.as_millis() as u64 {
                Level::Warn
            } else {
                Level::Ok
            };
            add(
                "clock",
                level,
                format!(
                    "{skew:+} ms against this host (drift allowance of the default lease: {}){}",
                    show(allowance),
                    if level == Level::Warn {
                        "; leases hold only while clocks drift apart by less than that: check NTP"
                    } else {
                        ""
                    }
                ),
            );
        }
        _ => {
            let why = match reply {
                Reply::Error(e) => e,
                _ => "an unexpected reply".into(),
            };
            add(
                "clock",
                Level::Warn,
                format!("cannot read the server's TIME ({why}): its clock not checked"),
            );
        }
    }
    (checks, facts)
}

impl Server {
    /// The version check: too old for the scripts is FAIL, before RESP3 a WARN.
    fn judged(&self) -> (Level, String) {
        if !self.valkey && self.version.0 < 3 {
            return (
                Level::Fail,
                format!("{self}: too old for the lock's scripts; use Redis 6 or newer, or Valkey"),
            );
        }
        if !self.has(Feature::Resp3) {
            return (
                Level::Warn,
                format!(
                    "{self}: no RESP3, so waiters need a second connection; Redis 6 or newer is better"
                ),
            );
        }
        (Level::Ok, self.to_string())
    }

    /// What this version lacks that locked-run would use here, and what that means.
    fn missing(&self, cluster: bool) -> Vec<String> {
        let mut missing = Vec::new();
        if cluster && !self.has(Feature::ShardedPubSub) {
            missing.push(
                "sharded pub/sub: a release is announced with PUBLISH, which every node of the \
                 cluster relays (waiters still wake at once)"
                    .to_owned(),
            );
        }
        if !self.has(Feature::AclDryRun) {
            missing.push("ACL DRYRUN: doctor cannot check the user's permissions".to_owned());
        }
        missing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(pairs: &[(&str, &str)]) -> Server {
        let info = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Server::from_info(&info).unwrap()
    }

    #[test]
    fn servers_are_named_with_their_own_version() {
        let valkey = server(&[
            ("redis_version", "7.2.4"),
            ("server_name", "valkey"),
            ("valkey_version", "8.1.8"),
        ]);
        assert_eq!(valkey.to_string(), "Valkey 8.1.8");
        assert!(valkey.has(Feature::ShardedPubSub) && valkey.has(Feature::AclDryRun));
        assert!(valkey.missing(true).is_empty());

        let redis62 = server(&[("redis_version", "6.2.14")]);
        assert_eq!(redis62.to_string(), "Redis 6.2.14");
        assert!(redis62.has(Feature::Resp3));
        assert!(!redis62.has(Feature::ShardedPubSub) && !redis62.has(Feature::AclDryRun));
        assert_eq!(redis62.missing(false).len(), 1, "ACL DRYRUN");
        assert_eq!(
            redis62.missing(true).len(),
            2,
            "and sharded pub/sub on a cluster"
        );
        assert_eq!(redis62.judged().0, Level::Ok);

        let redis7 = server(&[("redis_version", "7.0.15")]);
        assert!(redis7.missing(true).is_empty());
        assert_eq!(
            server(&[("redis_version", "5.0.7")]).judged().0,
            Level::Warn
        );
        assert_eq!(
            server(&[("redis_version", "2.8.0")]).judged().0,
            Level::Fail
        );
    }
}
