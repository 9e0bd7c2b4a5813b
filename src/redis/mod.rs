//! The Redis backends and what they stand on, by concern:
//!
//! - [`url`]: Redis URLs: parsing, checking every part, printing them without a password.
//! - [`node`]: one server reached through a URL: its connection, requests, script calls,
//!   and what its refusals mean.
//! - [`sentinel`]: asking the sentinels where the primary is.
//! - [`cluster`]: the node that owns the lock's slot, and redirections.
//! - [`pubsub`]: release messages: subscribing, and waiting for one.
//! - [`resp`]: the protocol client (RESP2/RESP3), one connection at a time.
//! - [`tls`]: TLS for `rediss://` (rustls).
//! - [`scripts`]: the Lua scripts of the protocol; [`semaphore`]: those of `--holders N`;
//!   [`replies`]: what they answer, read.
//! - [`lock`]: the single-server backend ([`lock::ServerLock`]).
//! - [`inspect`]: what `status` and `release` read of (and do to) a lock on one server.
//! - [`redlock`]: Redlock over several servers, with monotonic fencing tokens: a round's
//!   quorum, each server's part, and what their reports mean together.

pub mod cluster;
pub mod inspect;
pub mod lock;
pub mod node;
pub mod pubsub;
pub mod redlock;
pub mod replies;
pub mod resp;
pub mod scripts;
pub mod semaphore;
pub mod sentinel;
pub mod tls;
pub mod url;
