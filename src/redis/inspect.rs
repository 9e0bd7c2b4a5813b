//! What the operators' commands read of a lock on one server, and `release --force`: the
//! lock's state in one MULTI/EXEC, the waiters subscribed to its channel, and the forced
//! release script.

use super::lock::{ServerLock, expiry, holder_at};
use super::resp::Reply;
use super::scripts;
use crate::backend::{BackendError, Busy, Freed, Holder, Report};

impl ServerLock {
    /// `release --force`: deletes the lock whoever holds it (never the fence counter) and wakes
    /// the waiters; says whom it was taken from (none: it was free), and the last fence.
    pub async fn force_release_here(&self) -> Result<Freed, BackendError> {
        let publish = self.publish_command();
        let reply = self
            .node
            .eval(
                &scripts::FORCE_RELEASE,
                &[&self.lock_key, &self.holder_key, &self.fence_key],
                &[&self.channel, publish],
                self.node.connect_timeout(),
                None,
            )
            .await?;
        let items = reply.items();
        let fence = items
            .get(1)
            .and_then(Reply::as_text)
            .and_then(|f| f.parse().ok());
        match items.first().and_then(Reply::as_int) {
            Some(0) => Ok(Freed::Released {
                holder: None,
                fence,
            }),
            Some(1) => Ok(Freed::Released {
                holder: Some(holder_at(items)),
                fence,
            }),
            _ => Err(self.unexpected(&reply)),
        }
    }

    /// How many clients wait for this lock (subscribed to its release channel).
    pub async fn waiters(&self) -> Result<u64, BackendError> {
        let numsub: &[u8] = if self.node.sharded_pubsub() {
            b"SHARDNUMSUB"
        } else {
            b"NUMSUB"
        };
        let replies = self
            .node
            .exchange(
                &[&[b"PUBSUB", numsub, self.channel.as_bytes()]],
                self.node.connect_timeout(),
                None,
            )
            .await?;
        match replies.first() {
            Some(Reply::Error(e)) if self.node.fall_back_from_sharded(e) => {
                Box::pin(self.waiters()).await
            }
            Some(Reply::Error(e)) => Err(self.node.refused(e)),
            Some(reply) => Ok(reply.items().get(1).and_then(Reply::as_int).unwrap_or(0) as u64),
            None => Ok(0),
        }
    }

    /// Reads the lock's state without changing it (one MULTI/EXEC, so the parts agree).
    pub async fn inspect_here(&self) -> Result<Report, BackendError> {
        let (lock, holder, fence) = (
            self.lock_key.as_bytes(),
            self.holder_key.as_bytes(),
            self.fence_key.as_bytes(),
        );
        let commands: [&[&[u8]]; 6] = [
            &[b"MULTI"],
            &[b"GET", lock],
            &[b"PTTL", lock],
            &[b"HGETALL", holder],
            &[b"GET", fence],
            &[b"EXEC"],
        ];
        let replies = self
            .node
            .exchange(&commands, self.node.connect_timeout(), None)
            .await?;
        if let Some(e) = crate::redis::resp::refusal(&replies) {
            return Err(self.node.refused(&e));
        }
        let exec = replies.last().cloned().unwrap_or(Reply::Array(None));
        let [value, pttl, meta, fence] = exec.items() else {
            return Err(self.unexpected(&exec));
        };
        let fence = fence.as_text().and_then(|f| f.parse().ok());
        let Some(value) = value.as_text() else {
            return Ok(Report {
                fence,
                held: None,
                value: None,
                ..Report::default()
            });
        };
        let fields: std::collections::HashMap<String, String> = meta
            .items()
            .chunks(2)
            .filter_map(|pair| Some((pair.first()?.as_text()?, pair.get(1)?.as_text()?)))
            .collect();
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
                expiry: expiry(pttl.as_int().unwrap_or(-1)),
            }),
            value: Some(value),
            ..Report::default()
        })
    }
}
