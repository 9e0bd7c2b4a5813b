//! The lock as a Rust type (the seed's class): `acquire` returns the fence token, `extend` and
//! `release` say whether the lease was still ours. It is also the single-server backend of the
//! command line.
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

use std::time::Duration;

use redis::Value;

use crate::backend::{Attempt, Backend, BackendError, Busy, Expiry, Holder, wall_clock_ms};
use crate::name::LockName;
use crate::node::{Node, Subscription};
use crate::scripts;

/// A lease on one NAME in one Redis server.
pub struct Lock {
    node: Node,
    name: LockName,
    lock_key: String,
    fence_key: String,
    holder_key: String,
    channel: String,
    token: String,
    ttl: Duration,
    ttl_ms: String,
    host: String,
    pid: String,
    command: String,
}

/// What `status` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// The last fence token issued (the current holder's while held), if any.
    pub fence: Option<u64>,
    /// `None` when free.
    pub held: Option<Busy>,
}

impl Lock {
    /// A lock named `name` on the server at `url`, with lease length `ttl`.
    pub fn new(url: &str, name: &str, ttl: Duration) -> Result<Lock, String> {
        let node = Node::open(url, Duration::from_secs(5))?;
        let name = LockName::new(name)?;
        Ok(Lock::on(node, name, ttl, "library"))
    }

    /// A lock on an opened node; `command` is the program name shown to `status`.
    pub fn on(node: Node, name: LockName, ttl: Duration, command: &str) -> Lock {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "unknown".into());
        Lock {
            lock_key: name.lock_key(),
            fence_key: name.fence_key(),
            holder_key: name.holder_key(),
            channel: name.channel(),
            node,
            name,
            token: uuid::Uuid::new_v4().to_string(),
            ttl,
            ttl_ms: ttl.as_millis().max(1).to_string(),
            host,
            pid: std::process::id().to_string(),
            command: command.to_owned(),
        }
    }

    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The owner's unique token: the value of `lock:{NAME}` while we hold it.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The server's URL without its password.
    pub fn address(&self) -> &str {
        self.node.address()
    }

    /// Takes the lock if it is free: `Some(fence)`, strictly larger than any fence issued
    /// before on this NAME; `None` when someone else holds it.
    pub async fn acquire(&self) -> Result<Option<u64>, BackendError> {
        Ok(match self.attempt().await? {
            Attempt::Acquired { fence } => Some(fence),
            Attempt::Busy(_) => None,
        })
    }

    /// Like [`Lock::acquire`], but says who holds the lock and for how long.
    pub async fn attempt(&self) -> Result<Attempt, BackendError> {
        let since = wall_clock_ms().to_string();
        let reply = self
            .node
            .eval(
                &scripts::ACQUIRE,
                &[&self.lock_key, &self.fence_key, &self.holder_key],
                &[
                    &self.token,
                    &self.ttl_ms,
                    &self.host,
                    &self.pid,
                    &self.command,
                    &since,
                ],
                // A grant that takes half the lease to arrive is worth little.
                self.node.connect_timeout().min(self.ttl / 2),
            )
            .await?;
        parse_attempt(&reply).ok_or_else(|| self.unexpected(&reply))
    }

    /// Extends the lease to a full TTL from now, if it is still ours.
    pub async fn extend(&self) -> Result<bool, BackendError> {
        self.extend_within(self.node.connect_timeout()).await
    }

    async fn extend_within(&self, timeout: Duration) -> Result<bool, BackendError> {
        let reply = self
            .node
            .eval(
                &scripts::RENEW,
                &[&self.lock_key, &self.holder_key],
                &[&self.token, &self.ttl_ms],
                timeout,
            )
            .await?;
        as_flag(&reply).ok_or_else(|| self.unexpected(&reply))
    }

    /// Releases the lock if it is still ours, waking waiters.
    pub async fn release(&self) -> Result<bool, BackendError> {
        self.release_within(None, self.node.connect_timeout()).await
    }

    async fn release_within(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
    ) -> Result<bool, BackendError> {
        let keep_ms = keep_for.map_or(0, |d| d.as_millis().max(1)).to_string();
        let reply = self
            .node
            .eval(
                &scripts::RELEASE,
                &[&self.lock_key, &self.holder_key],
                &[&self.token, &keep_ms, &self.channel],
                timeout,
            )
            .await?;
        as_flag(&reply).ok_or_else(|| self.unexpected(&reply))
    }

    /// Reads the lock's state without changing it.
    pub async fn inspect(&self) -> Result<Report, BackendError> {
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("GET")
            .arg(&self.lock_key)
            .cmd("PTTL")
            .arg(&self.lock_key)
            .cmd("HGETALL")
            .arg(&self.holder_key)
            .cmd("GET")
            .arg(&self.fence_key);
        let replies = self.node.query(&pipe, self.node.connect_timeout()).await?;
        let [value, pttl, meta, fence] = replies.as_slice() else {
            return Err(self.unexpected(&Value::Array(replies.clone())));
        };
        let fence = as_text(fence).and_then(|f| f.parse().ok());
        let Some(value) = as_text(value) else {
            return Ok(Report { fence, held: None });
        };
        let mut fields = std::collections::HashMap::new();
        if let Value::Array(items) | Value::Set(items) = meta {
            for pair in items.chunks(2) {
                if let [k, v] = pair {
                    fields.insert(
                        as_text(k).unwrap_or_default(),
                        as_text(v).unwrap_or_default(),
                    );
                }
            }
        } else if let Value::Map(pairs) = meta {
            for (k, v) in pairs {
                fields.insert(
                    as_text(k).unwrap_or_default(),
                    as_text(v).unwrap_or_default(),
                );
            }
        }
        let holder = if fields.get("token") == Some(&value) {
            Holder {
                host: fields.get("host").cloned(),
                pid: fields.get("pid").and_then(|p| p.parse().ok()),
                command: fields.get("command").cloned(),
                since_ms: fields.get("since").and_then(|s| s.parse().ok()),
                fence: fields.get("fence").and_then(|f| f.parse().ok()),
            }
        } else {
            Holder::default()
        };
        Ok(Report {
            fence,
            held: Some(Busy {
                holder,
                expiry: expiry(as_int(pttl).unwrap_or(-1)),
            }),
        })
    }

    fn unexpected(&self, reply: &Value) -> BackendError {
        BackendError::Refused(format!(
            "Redis at {} gave an unexpected answer to the lock script: {reply:?}",
            self.node.address()
        ))
    }
}

impl Backend for Lock {
    type Wakeups = Subscription;

    fn has_lease(&self) -> bool {
        true
    }

    fn key(&self) -> &str {
        &self.lock_key
    }

    fn token(&self) -> &str {
        &self.token
    }

    async fn try_acquire(&self) -> Result<Attempt, BackendError> {
        self.attempt().await
    }

    async fn renew(&self, timeout: Duration) -> Result<bool, BackendError> {
        self.extend_within(timeout).await
    }

    async fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
    ) -> Result<bool, BackendError> {
        self.release_within(keep_for, timeout).await
    }

    async fn subscribe(&self) -> Result<Subscription, BackendError> {
        self.node.subscribe(&self.channel).await
    }
}

fn expiry(pttl: i64) -> Expiry {
    if pttl < 0 {
        Expiry::Never
    } else {
        Expiry::In(Duration::from_millis(pttl as u64))
    }
}

fn parse_attempt(reply: &Value) -> Option<Attempt> {
    let Value::Array(items) = reply else {
        return None;
    };
    match as_int(items.first()?)? {
        1 => Some(Attempt::Acquired {
            fence: u64::try_from(as_int(items.get(1)?)?).ok()?,
        }),
        0 => {
            let text = |i: usize| items.get(i).and_then(as_text);
            let holder = Holder {
                host: text(2),
                pid: text(3).and_then(|p| p.parse().ok()),
                command: text(4),
                since_ms: text(5).and_then(|s| s.parse().ok()),
                fence: text(6).and_then(|f| f.parse().ok()),
            };
            Some(Attempt::Busy(Busy {
                holder,
                expiry: expiry(as_int(items.get(1)?)?),
            }))
        }
        _ => None,
    }
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

fn as_flag(v: &Value) -> Option<bool> {
    as_int(v).map(|i| i == 1)
}

fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn parses_a_grant() {
        let reply = Value::Array(vec![Value::Int(1), Value::Int(42)]);
        assert_eq!(parse_attempt(&reply), Some(Attempt::Acquired { fence: 42 }));
    }

    #[test]
    fn parses_a_busy_reply_with_and_without_metadata() {
        let reply = Value::Array(vec![
            Value::Int(0),
            Value::Int(1500),
            bulk("web-3"),
            bulk("77"),
            bulk("backup.sh"),
            bulk("1764673200000"),
            bulk("9"),
        ]);
        let Some(Attempt::Busy(busy)) = parse_attempt(&reply) else {
            panic!("not busy")
        };
        assert_eq!(busy.expiry, Expiry::In(Duration::from_millis(1500)));
        assert_eq!(busy.holder.host.as_deref(), Some("web-3"));
        assert_eq!(busy.holder.pid, Some(77));
        assert_eq!(busy.holder.fence, Some(9));

        let foreign = Value::Array(vec![Value::Int(0), Value::Int(-1), Value::Nil, Value::Nil]);
        let Some(Attempt::Busy(busy)) = parse_attempt(&foreign) else {
            panic!("not busy")
        };
        assert_eq!(busy.expiry, Expiry::Never);
        assert!(!busy.holder.is_known());
    }
}
