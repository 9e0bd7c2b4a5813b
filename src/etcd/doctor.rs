//! `doctor` for an `etcd://` cluster: each endpoint (reachable, TLS verified, its version, its
//! view of the Raft leader), the cluster (one leader agreed, every member listed in the URL),
//! the user (signs in, may read and write under `NAME/`), and etcd's shortest lease.
//!
//! Member by member, reads go without the user: `/version` and the maintenance status need
//! none, so a wrong password is one FAIL (`auth`), not one per check.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Client;
use crate::backend::{Check, Level};
use crate::name::LockName;

/// The default `--ttl`: a shortest lease above a third of it leaves little room.
const DEFAULT_TTL_SECS: i64 = 30;

/// The oldest etcd whose JSON gateway serves the `/v3/` paths this backend uses.
const OLDEST: (u64, u64) = (3, 4);

/// What one member said of itself in its status.
struct Seen {
    endpoint: String,
    member: u64,
    leader: u64,
    term: u64,
    cluster: u64,
}

/// The checks, in the order they are printed.
pub async fn check_etcd(client: &Client, name: &LockName) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut push = |server: &str, check: &'static str, level: Level, detail: String| {
        checks.push(Check {
            server: server.to_owned(),
            check,
            level,
            detail,
        })
    };
    let cluster = client.url();
    let deadline = || Instant::now() + client.connect_timeout();
    let members = client.each_endpoint(false);
    let mut seen = Vec::new();
    for (endpoint, member) in &members {
        let started = Instant::now();
        let version = match member.get("/version", deadline()).await {
            Ok(version) => version,
            Err(e) => {
                push(endpoint, "reachable", Level::Fail, e.to_string());
                continue;
            }
        };
        let tls = if cluster.starts_with("etcds://") {
            ", its certificate verified"
        } else {
            ""
        };
        let took = started.elapsed().as_secs_f64() * 1000.0;
        push(
            endpoint,
            "reachable",
            Level::Ok,
            format!("answered in {took:.1} ms{tls}"),
        );
        let (level, detail) = version_of(&version);
        push(endpoint, "version", level, detail);
        let status = match member
            .must("/v3/maintenance/status", &json!({}), deadline())
            .await
        {
            Ok(status) => status,
            Err(e) => {
                push(endpoint, "raft", Level::Fail, e.to_string());
                continue;
            }
        };
        let s = Seen {
            endpoint: endpoint.clone(),
            member: uint(&status["header"]["member_id"]),
            leader: uint(&status["leader"]),
            term: uint(&status["raftTerm"]),
            cluster: uint(&status["header"]["cluster_id"]),
        };
        let errors: Vec<&str> = status["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let (level, detail) = match (s.leader, errors.is_empty()) {
            (0, _) => (
                Level::Fail,
                format!("member {:x} knows no leader (term {})", s.member, s.term),
            ),
            (_, false) => (
                Level::Fail,
                format!(
                    "member {:x} reports {} (writes may be refused until it is mended)",
                    s.member,
                    errors.join("; ")
                ),
            ),
            (leader, true) if leader == s.member => (
                Level::Ok,
                format!("member {:x}, the leader (term {})", s.member, s.term),
            ),
            (leader, true) => (
                Level::Ok,
                format!(
                    "member {:x}, follows leader {leader:x} (term {})",
                    s.member, s.term
                ),
            ),
        };
        push(endpoint, "raft", level, detail);
        seen.push(s);
    }

    let (level, detail) = leader_agreed(&seen, members.len());
    push(&cluster, "leader", level, detail);
    let answering = members
        .iter()
        .find(|(e, _)| seen.iter().any(|s| &s.endpoint == e));
    if let Some((_, member)) = answering {
        let (level, detail) = match member
            .must("/v3/cluster/member/list", &json!({}), deadline())
            .await
        {
            Ok(list) => membership(&list, &members, &seen),
            Err(e) => (Level::Warn, format!("the member list was not read: {e}")),
        };
        push(&cluster, "members", level, detail);
    }

    // The user, on the whole cluster, as a run would sign in.
    let signed_in = match client.user() {
        None => Some(false),
        Some(user) => match client.sign_in(deadline()).await {
            Ok(true) => {
                push(
                    &cluster,
                    "auth",
                    Level::Ok,
                    format!("user {user} signed in"),
                );
                Some(true)
            }
            Ok(false) => {
                push(
                    &cluster,
                    "auth",
                    Level::Warn,
                    format!(
                        "etcd has authentication off: user {user} is not asked for, and anyone \
                         who reaches the cluster may take or free any lock"
                    ),
                );
                Some(false)
            }
            Err(e) => {
                push(&cluster, "auth", Level::Fail, e.to_string());
                None
            }
        },
    };
    let Some(signed_in) = signed_in else {
        push(
            &cluster,
            "permissions",
            Level::Warn,
            "not checked: the user could not sign in".into(),
        );
        push(
            &cluster,
            "lease",
            Level::Warn,
            "not checked: the user could not sign in".into(),
        );
        return checks;
    };
    let (level, detail) = permissions(client, name, signed_in, deadline()).await;
    push(&cluster, "permissions", level, detail);
    let (level, detail) = shortest_lease(client, deadline()).await;
    push(&cluster, "lease", level, detail);
    checks
}

/// `{"etcdserver":"3.4.23","etcdcluster":"3.4.0"}`: WARN below 3.4.
fn version_of(version: &Value) -> (Level, String) {
    let server = version["etcdserver"].as_str().unwrap_or("?");
    let cluster = version["etcdcluster"].as_str().unwrap_or("?");
    let detail = format!("etcd {server} (cluster version {cluster})");
    let parsed = |v: &str| {
        let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
        Some((parts.next()??, parts.next()??))
    };
    match parsed(server) {
        Some(v) if v >= OLDEST => (Level::Ok, detail),
        Some(_) => (
            Level::Warn,
            format!(
                "{detail}: older than {}.{}, whose JSON gateway serves the /v3/ paths locked-run uses",
                OLDEST.0, OLDEST.1
            ),
        ),
        None => (
            Level::Warn,
            format!("{detail}: not a version locked-run reads"),
        ),
    }
}

/// One leader, named by every member that answered.
fn leader_agreed(seen: &[Seen], listed: usize) -> (Level, String) {
    let leaders: Vec<u64> = seen.iter().map(|s| s.leader).filter(|&l| l != 0).collect();
    let Some(&leader) = leaders.first() else {
        return (
            Level::Fail,
            format!(
                "no leader: {} of {listed} endpoints answered and none knows one (a quorum lost?)",
                seen.len()
            ),
        );
    };
    if leaders.len() < seen.len() || leaders.iter().any(|&l| l != leader) {
        let views: Vec<String> = seen
            .iter()
            .map(|s| format!("{} says {:x}", s.endpoint, s.leader))
            .collect();
        return (
            Level::Warn,
            format!(
                "the members do not agree on a leader (an election under way?): {}",
                views.join(", ")
            ),
        );
    }
    let at = seen
        .iter()
        .find(|s| s.member == leader)
        .map_or(String::new(), |s| format!(" at {}", s.endpoint));
    let term = seen.iter().map(|s| s.term).max().unwrap_or(0);
    (
        Level::Ok,
        format!(
            "member {leader:x}{at} leads (term {term}), agreed by the {} of {listed} endpoints that answered",
            seen.len()
        ),
    )
}

/// The URL's endpoints against the cluster's members: each endpoint a member of the same
/// cluster, and every member listed, so that a run survives losing one.
fn membership(list: &Value, endpoints: &[(String, Client)], seen: &[Seen]) -> (Level, String) {
    let mut problems = Vec::new();
    // The cluster most endpoints belong to.
    let mut clusters: HashMap<u64, usize> = HashMap::new();
    for s in seen {
        *clusters.entry(s.cluster).or_default() += 1;
    }
    let ours = clusters.iter().max_by_key(|(_, n)| **n).map(|(c, _)| *c);
    for s in seen {
        if Some(s.cluster) != ours {
            problems.push(format!(
                "{} belongs to another cluster ({:x})",
                s.endpoint, s.cluster
            ));
        }
    }
    let members = list["members"].as_array().cloned().unwrap_or_default();
    let addresses = |m: &Value| -> Vec<String> {
        m["clientURLs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|u| {
                let u = u.split_once("://").map_or(u, |(_, rest)| rest);
                u.trim_end_matches('/').to_owned()
            })
            .collect()
    };
    let listed = |m: &Value| {
        addresses(m)
            .iter()
            .any(|a| endpoints.iter().any(|(e, _)| e == a))
    };
    for (endpoint, _) in endpoints {
        let member = members.iter().any(|m| addresses(m).contains(endpoint));
        let other = seen
            .iter()
            .any(|s| &s.endpoint == endpoint && Some(s.cluster) != ours);
        if !member && !other {
            problems.push(format!(
                "{endpoint} is not a client URL of any member (a proxy, or another name for one?)"
            ));
        }
    }
    let unlisted: Vec<String> = members
        .iter()
        .filter(|m| !listed(m))
        .map(|m| {
            let name = m["name"].as_str().unwrap_or("");
            let at = addresses(m).join(" ");
            match (name.is_empty(), at.is_empty()) {
                (_, true) => format!("{:x} (not started)", uint(&m["ID"])),
                (true, false) => at,
                (false, false) => format!("{name} at {at}"),
            }
        })
        .collect();
    if !unlisted.is_empty() {
        problems.push(format!(
            "the cluster has {} members and the URL lists {}: add {}, so that a run survives \
             losing the members it lists",
            members.len(),
            endpoints.len(),
            unlisted.join(", ")
        ));
    }
    match problems.is_empty() {
        true => (
            Level::Ok,
            format!(
                "the URL lists every member of the cluster ({})",
                members.len()
            ),
        ),
        false => (Level::Warn, problems.join("; ")),
    }
}

/// The user may read and write keys under `NAME/`: a transaction whose comparison can never
/// hold (a version below 0) writes nothing, yet etcd checks the permissions of every
/// operation in it, as it would for the lock's own.
async fn permissions(
    client: &Client,
    name: &LockName,
    signed_in: bool,
    deadline: Instant,
) -> (Level, String) {
    let prefix = format!("{}/", name.as_str());
    let key = STANDARD.encode(format!("{prefix}doctor"));
    let probe = json!({
        "compare": [{"key": key, "target": "VERSION", "result": "LESS", "version": "0"}],
        "success": [
            {"request_put": {"key": key, "value": ""}},
            {"request_range": {"key": STANDARD.encode(&prefix), "range_end": STANDARD.encode(crate::etcd::prefix_end(prefix.as_bytes())), "limit": "1"}},
        ],
        "failure": [],
    });
    match client.call("/v3/kv/txn", &probe, deadline).await {
        Ok(Ok(_)) if signed_in => (
            Level::Ok,
            format!(
                "user {} may read and write keys under {prefix} (checked by a transaction that \
                 writes nothing)",
                client.user().unwrap_or("")
            ),
        ),
        Ok(Ok(_)) => (
            Level::Ok,
            format!("keys under {prefix} may be read and written"),
        ),
        Ok(Err(status)) if status.message.contains("permission denied") => (
            Level::Fail,
            format!(
                "user {} may not read and write keys under {prefix}: give its role readwrite \
                 on that prefix (etcdctl role grant-permission ROLE --prefix readwrite {prefix})",
                client.user().unwrap_or("")
            ),
        ),
        Ok(Err(status)) => (Level::Fail, client.refused(&status).to_string()),
        Err(e) => (Level::Fail, e.to_string()),
    }
}

/// A lease of 1 s, granted and revoked at once: etcd raises its TTL to its shortest.
async fn shortest_lease(client: &Client, deadline: Instant) -> (Level, String) {
    let granted = match client
        .must("/v3/lease/grant", &json!({"TTL": "1"}), deadline)
        .await
    {
        Ok(granted) => granted,
        Err(e) => return (Level::Fail, format!("cannot grant a lease: {e}")),
    };
    let (lease, ttl) = (int(&granted["ID"]), int(&granted["TTL"]));
    // Revoked at once; should that go unanswered, the lease lapses within its TTL.
    if let Err(e) = client
        .must(
            "/v3/lease/revoke",
            &json!({"ID": lease.to_string()}),
            deadline,
        )
        .await
    {
        tracing::info!("the lease {lease:x} doctor took lapses by itself: {e}");
    }
    let shortest = crate::text::show(Duration::from_secs(ttl.max(0) as u64));
    if ttl * 3 > DEFAULT_TTL_SECS {
        return (
            Level::Warn,
            format!(
                "leases last at least {shortest}, more than a third of the default --ttl \
                 ({DEFAULT_TTL_SECS}s): a run whose lease is lost keeps others out that long, \
                 and --ttl below it is raised (etcd's election timeout is long)"
            ),
        );
    }
    (
        Level::Ok,
        format!("leases last at least {shortest}: --ttl below that is raised"),
    )
}

/// An int64 field (a JSON string, left out at 0).
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// A uint64 field (member and cluster ids).
fn uint(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}
