//! The Redis backends as the conformance suite runs them: one server, a primary behind three
//! sentinels, a Cluster of three primaries, and Redlock over five servers.

use super::{
    Backend, HostileStore, Queue, Servers, Store, Supports, TOO_LARGE, Tenure, one_hostile,
    url_args,
};
use crate::support::hostile::{self, Hostile};
use crate::support::*;

/// Adds `record` to the head of `history:{job}` on `redis` (Redis keeps the newest first).
fn push_history(redis: &Redis, record: &str) {
    let _: i64 = redis.cmd(&["LPUSH", "history:{job}", record]);
}

/// The holder's hash (`holder:{job}`, beside the lock's key) gets a `since` no date can show.
fn far_since(redis: &Redis) {
    assert!(redis.exists("holder:{job}"), "job is held");
    let _: i64 = redis.cmd(&[
        "HSET",
        "holder:{job}",
        "since",
        &super::FAR_SINCE_MS.to_string(),
    ]);
}

/// One Redis server.
pub struct OneRedis;

impl Servers for Redis {
    fn add_history_record(&self, record: &str) {
        push_history(self, record);
    }

    fn plant_far_since(&self) {
        far_since(self);
    }
}

impl Backend for OneRedis {
    fn supports(&self) -> Supports {
        Supports::EVERYTHING
    }

    fn start(&self) -> Store {
        let redis = Redis::start();
        Store::at(redis.url(), redis)
    }

    fn unreachable(&self) -> Vec<String> {
        url_args("redis://127.0.0.1:1".into())
    }

    fn hostile(&self) -> Option<HostileStore> {
        one_hostile(
            hostile::endless_bulk,
            |port| format!("redis://127.0.0.1:{port}"),
            TOO_LARGE,
        )
    }
}

/// A primary and its replica behind three sentinels.
pub struct Sentinel;

impl Servers for Watched {
    fn add_history_record(&self, record: &str) {
        push_history(&self.primary, record);
    }

    fn plant_far_since(&self) {
        far_since(&self.primary);
    }
}

impl Backend for Sentinel {
    fn supports(&self) -> Supports {
        Supports::EVERYTHING
    }

    fn start(&self) -> Store {
        let watched = Watched::start();
        Store::at(watched.url(), watched)
    }

    fn unreachable(&self) -> Vec<String> {
        url_args("redis+sentinel://127.0.0.1:1/mymaster".into())
    }

    /// A sentinel whose reply never ends.
    fn hostile(&self) -> Option<HostileStore> {
        one_hostile(
            hostile::endless_bulk,
            |port| format!("redis+sentinel://127.0.0.1:{port}/mymaster"),
            TOO_LARGE,
        )
    }
}

/// Three primaries of a Redis Cluster.
pub struct RedisCluster;

impl Servers for Cluster {
    fn add_history_record(&self, record: &str) {
        push_history(self.owner("history:{job}"), record);
    }

    fn plant_far_since(&self) {
        far_since(self.owner("holder:{job}"));
    }
}

impl Backend for RedisCluster {
    fn supports(&self) -> Supports {
        Supports::EVERYTHING
    }

    fn start(&self) -> Store {
        let cluster = Cluster::start();
        Store::at(cluster.url(), cluster)
    }

    fn unreachable(&self) -> Vec<String> {
        url_args("redis+cluster://127.0.0.1:1".into())
    }

    /// A seed node whose reply never ends.
    fn hostile(&self) -> Option<HostileStore> {
        one_hostile(
            hostile::endless_bulk,
            |port| format!("redis+cluster://127.0.0.1:{port}"),
            TOO_LARGE,
        )
    }
}

/// Redlock over five independent servers.
pub struct Redlock;

impl Servers for Five {
    fn add_history_record(&self, record: &str) {
        for server in &self.servers {
            push_history(server, record);
        }
    }

    /// On every server that holds it (each keeps the holder's hash).
    fn plant_far_since(&self) {
        for server in self.servers.iter().filter(|s| s.exists("holder:{job}")) {
            far_since(server);
        }
    }
}

impl Backend for Redlock {
    fn supports(&self) -> Supports {
        Supports {
            holders: false,
            shared: false,
            queue: Queue::Racing,
            tenure: Tenure::Lease,
            // What each server says, and how many make a quorum.
            status_keys: &["quorum", "servers"],
            history_order: true,
        }
    }

    fn start(&self) -> Store {
        let five = Five::start();
        Store {
            urls: five.url_args(),
            // Each server may take up to 500 ms to answer: the default, T/100, is missed by
            // five servers and their clients on two loaded cores (see `locked_run_on`).
            run_args: vec!["--node-timeout".into(), "500ms".into()],
            servers: Box::new(five),
        }
    }

    fn unreachable(&self) -> Vec<String> {
        (1..=5)
            .flat_map(|port| url_args(format!("redis://127.0.0.1:{port}")))
            .collect()
    }

    /// Five servers whose every reply never ends: no quorum can be had of them.
    fn hostile(&self) -> Option<HostileStore> {
        let servers: Vec<Hostile> = (0..5)
            .map(|_| Hostile::start(hostile::endless_bulk))
            .collect();
        Some(HostileStore {
            urls: servers
                .iter()
                .flat_map(|s| url_args(format!("redis://127.0.0.1:{}", s.port())))
                .collect(),
            says: TOO_LARGE,
            _keep: Box::new(servers),
        })
    }
}
