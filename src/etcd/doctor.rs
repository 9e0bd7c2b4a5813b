//! `doctor` for an `etcd://` cluster: each endpoint (reachable, TLS verified, its version, its
//! view of the Raft leader), the cluster (one leader agreed, every member listed in the URL),
//! the user (signs in, may read and write under `NAME/`), and etcd's shortest lease.
//!
//! Member by member, reads go without the user where etcd allows (its status, before 3.5), so a
//! wrong password is one FAIL (`auth`), not one per check; a member that reads its status to
//! signed-in users only is asked as the URL's user, and said not read when that user cannot
//! sign in.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Client;
use super::proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, Member,
    MemberListRequest, MemberListResponse, StatusRequest, StatusResponse, TxnResponse,
};
use super::wire;
use crate::backend::{Check, Level};
use crate::name::LockName;

/// The default `--ttl`: a shortest lease above a third of it leaves little room.
const DEFAULT_TTL_SECS: i64 = 30;

/// The oldest etcd this backend is proven on (its comparisons of a key range and nested
/// requests came in 3.3).
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
    let signed = client.each_endpoint(true);
    let mut seen = Vec::new();
    let mut unread = 0;
    for ((endpoint, member), (_, as_user)) in members.iter().zip(&signed) {
        let started = Instant::now();
        let tls = if cluster.starts_with("etcds://") {
            ", its certificate verified"
        } else {
            ""
        };
        let answered = member
            .call::<_, StatusResponse>(wire::STATUS, &StatusRequest {}, deadline())
            .await;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        let mut said = false;
        let status = match answered {
            Ok(Ok(status)) => status,
            // etcd 3.5 and later read their status to signed-in users only: as the URL's user.
            Ok(Err(status)) if wants_a_user(&status) && client.user().is_some() => {
                push(
                    endpoint,
                    "reachable",
                    Level::Ok,
                    format!("answered in {took:.1} ms{tls} (its status to a user only)"),
                );
                said = true;
                match as_user
                    .must::<_, StatusResponse>(wire::STATUS, &StatusRequest {}, deadline())
                    .await
                {
                    Ok(status) => status,
                    Err(e) => {
                        unread += 1;
                        push(
                            endpoint,
                            "raft",
                            Level::Warn,
                            format!("not read: its status is for a signed-in user ({e})"),
                        );
                        continue;
                    }
                }
            }
            Ok(Err(status)) => {
                push(
                    endpoint,
                    "reachable",
                    Level::Fail,
                    member.refused(&status).to_string(),
                );
                continue;
            }
            Err(e) => {
                push(endpoint, "reachable", Level::Fail, e.to_string());
                continue;
            }
        };
        if !said {
            push(
                endpoint,
                "reachable",
                Level::Ok,
                format!("answered in {took:.1} ms{tls}"),
            );
        }
        let (level, detail) = version_of(&status.version);
        push(endpoint, "version", level, detail);
        let header = status.header.unwrap_or_default();
        let s = Seen {
            endpoint: endpoint.clone(),
            member: header.member_id,
            leader: status.leader,
            term: status.raft_term,
            cluster: header.cluster_id,
        };
        let errors: Vec<String> = status
            .errors
            .iter()
            .map(|e| crate::text::printable(e))
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

    let (level, detail) = match (seen.is_empty(), unread) {
        (true, 1..) => (
            Level::Warn,
            "not checked: no member's status could be read as the URL's user (see auth)".into(),
        ),
        _ => leader_agreed(&seen, members.len()),
    };
    push(&cluster, "leader", level, detail);
    let answering = members
        .iter()
        .find(|(e, _)| seen.iter().any(|s| &s.endpoint == e));
    if let Some((_, member)) = answering {
        let list = MemberListRequest {
            linearizable: false,
        };
        let (level, detail) = match member
            .must::<_, MemberListResponse>(wire::MEMBER_LIST, &list, deadline())
            .await
        {
            Ok(list) => membership(&list.members, &members, &seen),
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

/// Whether etcd refused a request for want of a signed-in user.
fn wants_a_user(status: &super::grpc::Status) -> bool {
    status.code == super::grpc::UNAUTHENTICATED
        || (status.code == super::grpc::INVALID_ARGUMENT
            && status.message.contains("user name is empty"))
}

/// The member's version (`3.4.23`): WARN below 3.4.
fn version_of(server: &str) -> (Level, String) {
    let server = crate::text::printable(server);
    let detail = format!("etcd {server}");
    let parsed = |v: &str| {
        let mut parts = v.split('.').map(|p| p.parse::<u64>().ok());
        Some((parts.next()??, parts.next()??))
    };
    match parsed(&server) {
        Some(v) if v >= OLDEST && revokes_after_a_stall(&server) => (
            Level::Warn,
            format!(
                "{detail}: before 3.4.31 and 3.5.13 etcd may revoke a live lease once a leader \
                 stalled longer than the lease resumes (etcd issue 12528), which ends a holder's \
                 lock under its running command; upgrade etcd"
            ),
        ),
        Some(v) if v >= OLDEST => (Level::Ok, detail),
        Some(_) => (
            Level::Warn,
            format!(
                "{detail}: older than {}.{}, the oldest locked-run is proven on",
                OLDEST.0, OLDEST.1
            ),
        ),
        None => (
            Level::Warn,
            format!("{detail}: not a version locked-run reads"),
        ),
    }
}

/// Whether etcd `version` has the old leader's lease revokes (etcd issue 12528, fixed in
/// 3.4.31, 3.5.13 and 3.6.0): a leader that stalled (stopped, starved of CPU, stuck in an
/// fsync) past a lease's TTL may, as it resumes, propose the revoke of leases it thinks
/// expired, and the new leader commits it though the lease was kept alive there.
fn revokes_after_a_stall(version: &str) -> bool {
    let mut parts = version
        .split(['.', '-', '+'])
        .map(|p| p.parse::<u64>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    match (major, minor) {
        (3, 4) => patch < 31,
        (3, 5) => patch < 13,
        (3, m) => m < 4,
        _ => false,
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
fn membership(
    members: &[Member],
    endpoints: &[(String, Client)],
    seen: &[Seen],
) -> (Level, String) {
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
    let addresses = |m: &Member| -> Vec<String> {
        m.client_ur_ls
            .iter()
            .map(|u| {
                let u = u.split_once("://").map_or(u.as_str(), |(_, rest)| rest);
                crate::text::printable(u.trim_end_matches('/'))
            })
            .collect()
    };
    let listed = |m: &Member| {
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
            let name = crate::text::printable(&m.name);
            let at = addresses(m).join(" ");
            match (name.is_empty(), at.is_empty()) {
                (_, true) => format!("{:x} (not started)", m.id),
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
    let key = format!("{prefix}doctor");
    let mut never = wire::absent(&key);
    never.result = super::proto::etcdserverpb::compare::CompareResult::Less as i32;
    never.target = super::proto::etcdserverpb::compare::CompareTarget::Version as i32;
    never.target_union = Some(super::proto::etcdserverpb::compare::TargetUnion::Version(0));
    let mut first = wire::range_first(&prefix);
    first.sort_order = 0;
    first.sort_target = 0;
    let probe = wire::txn(
        vec![never],
        vec![wire::put(&key, b"", 0), wire::read(first)],
        Vec::new(),
    );
    match client
        .call::<_, TxnResponse>(wire::TXN, &probe, deadline)
        .await
    {
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
    let grant = LeaseGrantRequest { ttl: 1, id: 0 };
    let granted: LeaseGrantResponse = match client.must(wire::LEASE_GRANT, &grant, deadline).await {
        Ok(granted) => granted,
        Err(e) => return (Level::Fail, format!("cannot grant a lease: {e}")),
    };
    let (lease, ttl) = (granted.id, granted.ttl);
    // Revoked at once; should that go unanswered, the lease lapses within its TTL.
    let revoke = LeaseRevokeRequest { id: lease };
    if let Err(e) = client
        .must::<_, LeaseRevokeResponse>(wire::LEASE_REVOKE, &revoke, deadline)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_versions_whose_old_leader_revokes_live_leases_are_warned_of() {
        for (version, bad) in [
            ("3.4.23", true),
            ("3.4.31", false),
            ("3.5.12", true),
            ("3.5.13", false),
            ("3.6.0", false),
            ("3.7.2", false),
        ] {
            assert_eq!(revokes_after_a_stall(version), bad, "{version}");
        }
        assert_eq!(version_of("3.4.23").0, Level::Warn);
        assert_eq!(version_of("3.7.2").0, Level::Ok);
    }
}
