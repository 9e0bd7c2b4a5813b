//! Which server answered a Redis URL, Redis or Valkey, and what its version has that
//! `locked-run` uses: what `doctor` judges the server by and checks permissions with.

use std::collections::HashMap;

/// Which server answered, and its version: Valkey names itself (`server_name:valkey`,
/// `valkey_version`) and keeps `redis_version` at 7.2.4 for clients that test it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Server {
    pub(crate) valkey: bool,
    pub(crate) version: (u32, u32, u32),
    pub(crate) text: String,
}

/// What locked-run uses that not every version has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Feature {
    /// `HELLO 3`: one connection both waits and acquires (else a second one for the waiter).
    Resp3,
    /// `SPUBLISH`/`SSUBSCRIBE`: a Cluster's release message stays on the lock's shard.
    ShardedPubSub,
    /// `ACL DRYRUN`: what `doctor` checks the permissions with.
    AclDryRun,
}

impl Server {
    pub(crate) fn from_info(info: &HashMap<String, String>) -> Option<Server> {
        let valkey = info.get("server_name").is_some_and(|n| n == "valkey");
        let text = match valkey {
            true => info.get("valkey_version").or(info.get("redis_version"))?,
            false => info.get("redis_version")?,
        };
        let mut parts = text.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        let version = (
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
        );
        Some(Server {
            valkey,
            version,
            text: text.clone(),
        })
    }

    pub(crate) fn has(&self, feature: Feature) -> bool {
        let at_least = |v: (u32, u32)| (self.version.0, self.version.1) >= v;
        match feature {
            // Valkey began as a fork of Redis 7.2.4: it has everything Redis 7 has.
            _ if self.valkey => true,
            Feature::Resp3 => at_least((6, 0)),
            Feature::ShardedPubSub | Feature::AclDryRun => at_least((7, 0)),
        }
    }
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = if self.valkey { "Valkey" } else { "Redis" };
        write!(f, "{name} {}", self.text)
    }
}
