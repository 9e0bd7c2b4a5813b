//! The lock as a Rust type (the seed's class), for programs that want the protocol without the
//! wrapper: `acquire` returns the fence token, `extend` and `release` say whether the lease was
//! still ours.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! let lock = locked_run::Lock::new("redis://127.0.0.1:6379", "report", Duration::from_secs(30))?;
//! if let Some(fence) = lock.acquire().await? {
//!     // ... pass `fence` to the storage you write to, so it can refuse a stale holder ...
//!     lock.extend().await?;
//!     lock.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! The lease length lives in one place, the lock's [`Timings`], checked as the command line
//! checks `--ttl` (at least 100 ms), and handed to the server with every grant and renewal.

use std::time::Duration;

use crate::backend::{Attempt, BackendError, env_password};
use crate::lease::Timings;
use crate::name::LockName;
use crate::redis::lock::ServerLock;
use crate::redis::node::Node;

/// A lease on one NAME in one Redis server.
pub struct Lock {
    server: ServerLock,
    timings: Timings,
}

impl Lock {
    /// A lock named `name` on the server at `url`, with lease length `ttl` (renewal interval and
    /// kill grace at their defaults, T/6 and T/3); a password missing from the URL is taken from
    /// `REDISCLI_AUTH`. A TTL shorter than 100 ms is refused.
    pub fn new(url: &str, name: &str, ttl: Duration) -> Result<Lock, String> {
        Lock::with_timings(url, name, Timings::new(ttl, None, None)?)
    }

    /// A lock with timings of its own (`Timings::new` has checked them together).
    pub fn with_timings(url: &str, name: &str, timings: Timings) -> Result<Lock, String> {
        let password = env_password();
        let node = Node::open(url, Duration::from_secs(5), password.as_deref())?;
        let name = LockName::new(name)?;
        Ok(Lock {
            server: ServerLock::on(node, name, "library"),
            timings,
        })
    }

    pub fn name(&self) -> &LockName {
        self.server.name()
    }

    /// The owner's unique token: the value of `lock:{NAME}` while we hold it.
    pub fn token(&self) -> String {
        self.server.token()
    }

    /// The lease's timings: T is what every grant and renewal asks the server for.
    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// Takes the lock if it is free: `Some(fence)`, strictly larger than any fence issued
    /// before on this NAME; `None` when someone else holds it.
    pub async fn acquire(&self) -> Result<Option<u64>, BackendError> {
        Ok(match self.attempt().await? {
            Attempt::Acquired { fence } => Some(fence),
            Attempt::Busy(_) | Attempt::Mismatch { .. } => None,
        })
    }

    /// Like [`Lock::acquire`], but says who holds the lock and for how long.
    pub async fn attempt(&self) -> Result<Attempt, BackendError> {
        self.server.attempt_listening(&self.timings, false).await
    }

    /// Extends the lease to a full TTL from now, if it is still ours.
    pub async fn extend(&self) -> Result<bool, BackendError> {
        self.server
            .extend_within(&self.timings, self.server.connect_timeout())
            .await
    }

    /// Releases the lock if it is still ours, waking waiters.
    pub async fn release(&self) -> Result<bool, BackendError> {
        self.server
            .release_within(None, self.server.connect_timeout())
            .await
    }
}
