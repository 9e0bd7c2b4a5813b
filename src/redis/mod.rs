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

use scripts::Script;

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
