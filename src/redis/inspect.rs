//! What the operators' commands read of a lock on one server, and `release --force`: the
//! lock's state in one MULTI/EXEC (one holder's keys and a semaphore's alike), the waiters
//! subscribed to its channel, and the forced release script.

use std::collections::HashMap;
use std::time::Duration;

use super::lock::ServerLock;
use super::replies::{expiry, holder};
use super::resp::Reply;
use super::scripts;

/// What `lock:{NAME}` holds while shared holders hold (see `shared`).
const SHARED_MARKER: &str = "shared";
use crate::backend::{
    BackendError, Busy, Expiry, Freed, History, Holder, KEPT, MAX_RECORD, Reader, Report, SCANNED,
    Slot,
};

impl ServerLock {
    /// `release --force`: deletes the holder whose token is `token` (or every holder, one or
    /// a semaphore's), never the fence counter, and wakes the waiters whose turn it is; says whom it was taken
    /// from (none: it was free), and the last fence.
    pub async fn force_release_here(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        let publish = self.publish_command();
        let reply = self
            .node
            .eval(
                &scripts::FORCE_RELEASE,
                &[
                    &self.keys.lock,
                    &self.keys.holder,
                    &self.keys.fence,
                    &self.keys.holders,
                    &self.keys.holders_meta,
                    &self.keys.queue,
                    &self.keys.queue_alive,
                ],
                &[&self.keys.channel, publish, token.unwrap_or("")],
                self.node.connect_timeout(),
                None,
            )
            .await?;
        let [fence, released] = reply.items() else {
            return Err(self.unexpected(&reply));
        };
        let holders = released
            .items()
            .iter()
            .map(|r| {
                let text = |i: usize| r.items().get(i).and_then(Reply::as_text);
                holder(text(1), text(2), text(3), text(4), text(5))
            })
            .collect();
        Ok(Freed::Released {
            holders,
            fence: fence.as_text().and_then(|f| f.parse().ok()),
        })
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
                &[&[b"PUBSUB", numsub, self.keys.channel.as_bytes()]],
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

    /// The NAME's last `limit` runs, newest first, as this server keeps them (`history:{NAME}`,
    /// which the release scripts add to), read by [`scripts::HISTORY`]: a record larger than
    /// [`MAX_RECORD`] never leaves the server, and is counted with what is not one of ours.
    pub async fn history_here(&self, limit: usize) -> Result<History, BackendError> {
        if limit == 0 {
            return Ok(History::default());
        }
        let (limit, scanned, largest) = (
            limit.min(KEPT).to_string(),
            SCANNED.to_string(),
            MAX_RECORD.to_string(),
        );
        let reply = self
            .node
            .eval(
                &scripts::HISTORY,
                &[&self.keys.history],
                &[&limit, &scanned, &largest],
                self.node.connect_timeout(),
                None,
            )
            .await?;
        let [skipped, records] = reply.items() else {
            return Err(self.unexpected(&reply));
        };
        let mut reader = Reader::new();
        reader.skipped(skipped.as_int().unwrap_or(0).max(0) as usize);
        for record in records.items() {
            match record {
                Reply::Bulk(Some(bytes)) => reader.take(bytes),
                _ => reader.skipped(1),
            }
        }
        Ok(reader.finish(KEPT))
    }

    /// Reads the lock's state without changing it (one MULTI/EXEC, so the parts agree): one
    /// holder's key, or a semaphore's holders, whichever is there.
    pub async fn inspect_here(&self) -> Result<Report, BackendError> {
        let (lock, holder_key, fence, holders, meta) = (
            self.keys.lock.as_bytes(),
            self.keys.holder.as_bytes(),
            self.keys.fence.as_bytes(),
            self.keys.holders.as_bytes(),
            self.keys.holders_meta.as_bytes(),
        );
        let alive = self.keys.queue_alive.as_bytes();
        let commands: [&[&[u8]]; 10] = [
            &[b"MULTI"],
            &[b"GET", lock],
            &[b"PTTL", lock],
            &[b"HGETALL", holder_key],
            &[b"GET", fence],
            &[b"TIME"],
            &[b"ZRANGE", holders, b"0", b"-1", b"WITHSCORES"],
            &[b"HGETALL", meta],
            &[b"ZRANGE", alive, b"0", b"-1", b"WITHSCORES"],
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
        let [value, pttl, holder_hash, fence, time, members, meta, queued] = exec.items() else {
            return Err(self.unexpected(&exec));
        };
        let now_ms = match time.items() {
            [secs, micros] => {
                secs.as_int().unwrap_or(0) * 1000 + micros.as_int().unwrap_or(0) / 1000
            }
            _ => return Err(self.unexpected(&exec)),
        };
        // The live waiters in the queue: a place whose keep-alive ended (a SIGKILLed waiter)
        // is not counted, though no attempt has dropped it yet.
        let waiters = Some(
            scored(queued)
                .iter()
                .filter(|(_, ends)| *ends as i64 > now_ms)
                .count() as u64,
        );
        let fence = fence.as_text().and_then(|f| f.parse().ok());
        let marker = value.as_text().filter(|v| v == SHARED_MARKER);
        if let Some(value) = value.as_text().filter(|_| marker.is_none()) {
            let fields = hash(holder_hash);
            let field = |k: &str| fields.get(k).cloned();
            let holder = if fields.get("token") == Some(&value) {
                holder(
                    field("host"),
                    field("pid"),
                    field("command"),
                    field("since"),
                    field("fence"),
                )
            } else {
                Holder::default()
            };
            let busy = Busy {
                holder,
                expiry: expiry(pttl.as_int().unwrap_or(-1)),
            };
            return Ok(Report {
                fence,
                held: Some(busy.clone()),
                value: Some(value.clone()),
                holders: vec![Slot {
                    token: Some(value),
                    busy,
                }],
                limit: Some(1),
                waiters,
                ..Report::default()
            });
        }
        let meta = hash(meta);
        let slots: Vec<Slot> = scored(members)
            .into_iter()
            .filter_map(|(token, ends)| {
                let left = ends as i64 - now_ms;
                (left > 0).then(|| Slot {
                    busy: Busy {
                        holder: packed(meta.get(&token).map(String::as_str)),
                        expiry: Expiry::In(Duration::from_millis(left as u64)),
                    },
                    token: Some(token),
                })
            })
            .collect();
        // Shared holders keep their marker in the lock's key; a marker whose holders all
        // lapsed is held by nobody, and goes by itself.
        let shared =
            !slots.is_empty() && meta.get("limit").map(String::as_str) == Some(SHARED_MARKER);
        Ok(Report {
            fence,
            held: slots.first().map(|s| s.busy.clone()),
            limit: (!slots.is_empty() && !shared)
                .then(|| meta.get("limit").and_then(|l| l.parse().ok()))
                .flatten(),
            holders: slots,
            waiters,
            shared,
            ..Report::default()
        })
    }
}

/// A sorted set's members with their scores (`ZRANGE ... WITHSCORES`: flat pairs in RESP2, an
/// array of [member, score] in RESP3).
fn scored(reply: &Reply) -> Vec<(String, f64)> {
    let flat: Vec<&Reply> = reply
        .items()
        .iter()
        .flat_map(|m| match m {
            Reply::Array(Some(pair)) => pair.iter().collect(),
            other => vec![other],
        })
        .collect();
    flat.chunks(2)
        .filter_map(|pair| {
            let score = pair.get(1)?.as_text()?.parse().ok()?;
            Some((pair.first()?.as_text()?, score))
        })
        .collect()
}

/// A hash's reply (a flat list of fields and values) as a map.
fn hash(reply: &Reply) -> HashMap<String, String> {
    reply
        .items()
        .chunks(2)
        .filter_map(|pair| Some((pair.first()?.as_text()?, pair.get(1)?.as_text()?)))
        .collect()
}

/// A semaphore holder's metadata: host, pid, command, since and fence, tab-separated.
fn packed(meta: Option<&str>) -> Holder {
    let mut fields = meta.unwrap_or_default().split('\t').map(str::to_owned);
    holder(
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    )
}
