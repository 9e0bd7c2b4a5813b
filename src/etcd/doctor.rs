//! `doctor` for an `etcd://` cluster: each endpoint (reachable, TLS verified, its version, its
//! view of the Raft leader), the cluster (one leader agreed, every member listed in the URL),
//! the user (signs in, may read and write under `NAME/`), and etcd's shortest lease.
//!
//! Member by member, reads go without the user where etcd allows (its status, before 3.5), so a
//! wrong password is one FAIL (`auth`), not one per check; a member that reads its status to
//! signed-in users only is asked as the URL's user, and said not read when that user cannot
//! sign in.

use std::time::Duration;

use tokio::time::Instant;

use super::Client;
use super::members::{Seen, leader_agreed, membership, version_of, wants_a_user};
use super::proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse,
    MemberListRequest, MemberListResponse, StatusRequest, StatusResponse, TxnResponse,
};
use super::wire;
use crate::backend::{Check, Level};
use crate::name::LockName;

/// The default `--ttl`: a shortest lease above a third of it leaves little room.
const DEFAULT_TTL_SECS: i64 = 30;

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
