//! What `doctor` makes of an etcd cluster's members: each one's version (and whether it has
//! etcd's flaw of a stalled leader revoking live leases), the leader they agree on, and the
//! URL's endpoints against the cluster's membership.

use std::collections::HashMap;

use super::Client;
use super::proto::etcdserverpb::Member;
use crate::backend::Level;

/// The oldest etcd this backend is proven on (its comparisons of a key range and nested
/// requests came in 3.3).
const OLDEST: (u64, u64) = (3, 4);

/// What one member said of itself in its status.
pub struct Seen {
    pub endpoint: String,
    pub member: u64,
    pub leader: u64,
    pub term: u64,
    pub cluster: u64,
}

/// Whether etcd refused a request for want of a signed-in user.
pub fn wants_a_user(status: &super::grpc::Status) -> bool {
    status.code == super::grpc::UNAUTHENTICATED
        || (status.code == super::grpc::INVALID_ARGUMENT
            && status.message.contains("user name is empty"))
}

/// The member's version (`3.4.23`): WARN below 3.4.
pub fn version_of(server: &str) -> (Level, String) {
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
pub fn leader_agreed(seen: &[Seen], listed: usize) -> (Level, String) {
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
pub fn membership(
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
