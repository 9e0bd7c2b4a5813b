//! The lock as a Rust type, for programs that want the protocol without the wrapper: `acquire`
//! returns the fence token, `extend` and `release` say whether the lease was still ours. It is
//! generic over the [`Backend`], so every backend has a library API; [`Lock::new`] opens the
//! one a URL names.
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

use crate::backend::{AnyBackend, Attempt, Backend, BackendError, env_password};
use crate::etcd::{self, EtcdLock};
use crate::file::{self, FileLock};
use crate::lease::Timings;
use crate::name::LockName;
use crate::redis::lock::ServerLock;
use crate::redis::node::Node;
use crate::redis::tls::{self, TlsOptions};

/// How long one call may take (the command line's default `--connect-timeout`).
const TIMEOUT: Duration = Duration::from_secs(5);

/// A lease on one NAME, held through any backend.
pub struct Lock<B: Backend = AnyBackend> {
    backend: B,
    name: LockName,
    timings: Timings,
}

impl Lock {
    /// A lock named `name` in what `url` names (a Redis server, an etcd cluster, or a `file://`
    /// directory), with lease length `ttl` (renewal interval and kill grace at their defaults,
    /// T/6 and T/3); a password missing from a Redis or etcd URL is taken from
    /// `REDISCLI_AUTH`. A TTL shorter than 100 ms is refused.
    pub fn new(url: &str, name: &str, ttl: Duration) -> Result<Lock, String> {
        Lock::with_timings(url, name, Timings::new(ttl, None, None)?)
    }

    /// A lock with timings of its own (`Timings::new` has checked them together).
    pub fn with_timings(url: &str, name: &str, timings: Timings) -> Result<Lock, String> {
        let name = LockName::new(name)?;
        let backend = match file::is_file_url(url) {
            true => {
                let lock = FileLock::at(url, name.clone(), "library").map_err(|f| f.message)?;
                lock.prepare().map_err(|f| f.message)?;
                AnyBackend::new(lock)
            }
            false if etcd::is_etcd_url(url) => AnyBackend::new(etcd_lock(url, &name)?),
            false => {
                let password = env_password();
                let node = Node::open(url, TIMEOUT, password.as_deref())?;
                AnyBackend::new(ServerLock::on(node, name.clone(), "library"))
            }
        };
        Ok(Lock::on(backend, name, timings))
    }
}

/// The lock `name` in the etcd cluster `url` names (`etcds://`: verified against the system's
/// CAs); a password missing from the URL is taken from `REDISCLI_AUTH`.
fn etcd_lock(url: &str, name: &LockName) -> Result<EtcdLock, String> {
    etcd::check_name(name)?;
    let mut parsed = etcd::parse_url(url)?;
    if parsed.user.is_some() && parsed.password.is_none() {
        parsed.password = env_password();
        parsed.password_from = parsed
            .password
            .as_ref()
            .map(|_| crate::redis::auth::PasswordFrom::Env("REDISCLI_AUTH"));
    }
    let tls = match parsed.tls {
        true => Some(tls::connector(&TlsOptions::default())?),
        false => None,
    };
    let client = etcd::Client::new(parsed, tls, TIMEOUT);
    Ok(EtcdLock::on(client, name.clone(), "library"))
}

impl<B: Backend> Lock<B> {
    /// The lock `backend` holds, named `name`, with `timings`.
    pub fn on(backend: B, name: LockName, timings: Timings) -> Lock<B> {
        Lock {
            backend,
            name,
            timings,
        }
    }

    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The owner's unique token: the value of `lock:{NAME}` while we hold it.
    pub fn token(&self) -> String {
        self.backend.token()
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
        self.backend.try_acquire(&self.timings, false).await
    }

    /// Extends the lease to a full TTL from now, if it is still ours.
    pub async fn extend(&self) -> Result<bool, BackendError> {
        self.backend.renew(&self.timings, TIMEOUT).await
    }

    /// Releases the lock if it is still ours, waking waiters.
    pub async fn release(&self) -> Result<bool, BackendError> {
        self.backend.release(None, TIMEOUT).await
    }
}
