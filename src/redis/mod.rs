//! The Redis backends and what they stand on, by concern:
//!
//! - [`url`]: Redis URLs: parsing, checking every part, printing them without a password.
//! - [`auth`]: where a password came from, and the line said when a server refuses it.
//! - [`node`]: one server reached through a URL: its connection, requests, script calls,
//!   and what its refusals mean.
//! - [`sentinel`]: asking the sentinels where the primary is.
//! - [`cluster`]: the node that owns the lock's slot, and redirections.
//! - [`pubsub`]: release messages: subscribing, and waiting for one.
//! - [`resp`]: the protocol client (RESP2/RESP3), one connection at a time, and its parser,
//!   which reads a reply in one pass whatever pieces it arrives in.
//! - [`tls`]: TLS for `rediss://` (rustls).
//! - [`scripts`]: the Lua scripts of the protocol (their shared functions in `lua.rs`);
//!   [`semaphore`]: those of `--holders N`;
//!   [`shared`]: those of `--shared`;
//!   [`replies`]: what they answer, read.
//! - [`lock`]: the single-server backend ([`lock::ServerLock`]).
//! - [`inspect`]: what `status` and `release` read of (and do to) a lock on one server.
//! - [`redlock`]: Redlock over several servers, with monotonic fencing tokens: a round's
//!   quorum, each server's part, and what their reports mean together.

pub mod auth;
pub mod cluster;
pub mod doctor;
pub mod give_back;
pub mod inspect;
pub mod keys;
pub mod lock;
mod lua;
pub mod node;
pub mod open;
pub mod pubsub;
pub mod redlock;
pub mod replies;
pub mod resp;
pub mod scripts;
pub mod semaphore;
pub mod sentinel;
pub mod shared;

pub mod url;

use crate::backend::{Can, Declaration, Modes, Queue, Several, any_name, says};
use crate::endpoints::Scheme;
use scripts::Script;

/// One Redis server (plain, TLS, a Unix socket, Sentinel, Cluster), or Redlock over several
/// independent ones, as the registry knows them.
pub const BACKEND: Declaration = Declaration {
    called: "one Redis server (plain, Sentinel, Cluster)",
    schemes: &[
        Scheme::plain("redis", "redis://[user@]host[:port][/db]"),
        Scheme {
            tls: true,
            ..Scheme::plain("rediss", "rediss:// (TLS)")
        },
        Scheme {
            path: true,
            ..Scheme::plain("redis+unix", "redis+unix:///path")
        },
        Scheme {
            sentinels: true,
            ..Scheme::plain("redis+sentinel", "redis+sentinel://host:port[,...]/MASTER")
        },
        Scheme {
            tls: true,
            sentinels: true,
            ..Scheme::plain("rediss+sentinel", "rediss+sentinel://")
        },
        Scheme::plain("redis+cluster", "redis+cluster://host:port[,...]"),
        Scheme {
            tls: true,
            ..Scheme::plain("rediss+cluster", "rediss+cluster://")
        },
    ],
    help: "redis://[user@]host[:port][/db], rediss:// (TLS), redis+unix:///path, \
           redis+sentinel://host:port[,...]/MASTER, redis+cluster://host:port[,...] (TLS at every \
           hop: rediss+sentinel://, rediss+cluster://); three or more for Redlock",
    doctor: "Redis (reachability, role, memory policy, persistence, permissions, clocks)",
    modes: Modes {
        holders: Can::Yes,
        shared: Can::Yes,
        wait_replicas: Can::Yes,
        queue: Queue::Fair,
    },
    several: Several::Together {
        called: "Redlock over several Redis servers",
        modes: Modes {
            holders: Can::No("Redlock over several servers holds one lock at a time"),
            shared: Can::No("Redlock over several servers holds one lock at a time"),
            wait_replicas: Can::No("Redlock's servers are independent primaries"),
            queue: Queue::Racing,
        },
    },
    no_tls: Some(says!(
        "--tls-ca-cert, --tls-cert and --tls-key are for rediss:// URLs (and \
         rediss+sentinel://, rediss+cluster://), and none is given (redis+sentinel:// and \
         redis+cluster:// connect without TLS)"
    )),
    name_rule: any_name,
    open: open::open,
};

/// Every script of the protocol, for the tests that check their SHA1s against their sources
/// and against a server's `SCRIPT LOAD`.
pub const SCRIPTS: [&Script; 14] = [
    &scripts::ACQUIRE,
    &scripts::RENEW,
    &scripts::RENEW_OR_RETAKE,
    &scripts::RELEASE,
    &scripts::RAISE_FENCE,
    &scripts::FORCE_RELEASE,
    &scripts::GIVE_BACK,
    &scripts::HISTORY,
    &semaphore::ACQUIRE,
    &semaphore::RENEW,
    &semaphore::RELEASE,
    &shared::ACQUIRE,
    &shared::RENEW,
    &shared::RELEASE,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A constant SHA1 that is not its source's would cost two round trips a call (NOSCRIPT,
    /// then EVAL): each is checked here, and against a server's SCRIPT LOAD by a test.
    #[test]
    fn every_scripts_sha1_is_its_sources() {
        let wrong: Vec<String> = SCRIPTS
            .iter()
            .filter_map(|script| {
                let digest = ring::digest::digest(
                    &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
                    script.source.as_bytes(),
                );
                let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
                (hex != script.sha1).then(|| format!("{} should be {hex}", script.sha1))
            })
            .collect();
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
