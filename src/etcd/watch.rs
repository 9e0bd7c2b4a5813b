//! A waiter's wake-up: a watch on what its standing in the line awaits (see `line`: the key
//! before its own, or any key of the line), covering everything since the read that found
//! it, so that a change between that read and the watch is still seen. Each attempt says what
//! to await: a watch on something else is replaced.
//!
//! etcd serves a watch that starts at a revision it has already reached (anything at all was
//! written in the cluster since the read) from its history, in a loop that runs every 100 ms:
//! even a delete made after the watch was confirmed then comes up to 100 ms late (94 ms
//! median, measured on etcd 3.4). A watch on a key therefore starts now instead (revision 0,
//! which etcd serves live), and when the cluster moved on since the read, the key is read
//! once after the watch is confirmed: gone (or, where a write is awaited, written) since the
//! read, it wakes the waiter at once.

use http_body_util::BodyExt;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::EtcdLock;
use super::client::{Status, Stream};
use super::line::Awaited;
use super::reply::{MAX_REPLY_BYTES, within_values};
use super::wire::{b64, int, prefix_end};
use crate::backend::{BackendError, Wakeup, Wakeups};

/// What a waiter waits for, and the revision its watch starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Predecessor {
    pub awaited: Awaited,
    pub from: i64,
}

/// One watch.
pub struct Watch {
    awaited: Awaited,
    /// The key watched (`NAME/` for the whole line), for messages.
    key: String,
    stream: Stream,
    /// Bytes received and not yet parsed: the gateway writes each message as one line of
    /// JSON, and a line may come in pieces.
    buf: Vec<u8>,
    /// Where in `buf` the unread part starts: lines before it were taken.
    start: usize,
    /// How much of `buf` is known to hold no line's end: each byte is searched once.
    searched: usize,
    /// A delete came with the confirmation: the revision of its message.
    seen: Option<i64>,
    /// Its number, for [`EtcdLock`]'s note of the watch standing (see `EtcdLock::unchanged`).
    number: u64,
}

impl Watch {
    /// Watches what `on` awaits, covering everything since `on.from` (see above), once etcd
    /// confirmed the watch.
    pub async fn open(lock: &EtcdLock, on: &Predecessor) -> Result<Watch, BackendError> {
        let deadline = Instant::now() + lock.client.connect_timeout();
        // A put counts only when awaited; a delete always does. Any delete in the line has
        // no one key to read after the watch: it is watched from the read's revision on.
        let (key, puts, from) = match &on.awaited {
            Awaited::Key { key, puts } => (key.clone(), *puts, 0),
            Awaited::AnyDelete => (lock.prefix.clone(), false, on.from),
        };
        let mut request = json!({"start_revision": from.to_string()});
        if on.awaited == Awaited::AnyDelete {
            request["range_end"] = json!(b64(&prefix_end(lock.prefix.as_bytes())));
        }
        request["key"] = json!(b64(key.as_bytes()));
        if !puts {
            request["filters"] = json!(["NOPUT"]);
        }
        let request = json!({ "create_request": request });
        let stream = lock.client.stream("/v3/watch", &request, deadline).await?;
        let number = lock.watches.get() + 1;
        lock.watches.set(number);
        let mut watch = Watch {
            awaited: on.awaited.clone(),
            key,
            stream,
            buf: Vec::new(),
            start: 0,
            searched: 0,
            seen: None,
            number,
        };
        loop {
            let message = tokio::time::timeout_at(deadline, watch.message())
                .await
                .map_err(|_| watch.broke("no confirmation in time"))??;
            if message["result"]["created"] == true {
                watch.seen = has_events(&message).then(|| revision(&message));
                let at = revision(&message);
                if watch.seen.is_none() && from == 0 && at >= on.from {
                    watch.seen = gone_since(lock, &watch.key, puts, on.from, at, deadline).await?;
                }
                if watch.seen.is_none() {
                    lock.watching.replace(Some((number, watch.awaited.clone())));
                }
                return Ok(watch);
            }
        }
    }

    /// Resolves when what is awaited happens (the filters keep every other event out), with
    /// the revision etcd was at when it said so.
    async fn happened(&mut self) -> Result<i64, BackendError> {
        if let Some(revision) = self.seen {
            return Ok(revision);
        }
        loop {
            let message = self.message().await?;
            if has_events(&message) {
                return Ok(revision(&message));
            }
        }
    }

    /// The next message of the stream; an error etcd sent, or a watch it cancelled
    /// (compacted past its start), is an error. A message is parsed once its line has ended
    /// (the gateway's delimiter is a newline), not again after each piece of it, and one
    /// longer than [`MAX_REPLY_BYTES`] is refused: a stream that never ends a line must not
    /// fill the memory.
    async fn message(&mut self) -> Result<Value, BackendError> {
        let mut blank = 0u32;
        loop {
            let unsearched = &self.buf[self.searched..];
            if let Some(at) = unsearched.iter().position(|&b| b == b'\n') {
                let end = self.searched + at + 1;
                let line = &self.buf[self.start..end];
                let empty = line.trim_ascii().is_empty();
                let result = if empty {
                    None
                } else if let Err(what) = within_values(line) {
                    Some(Err(self.broke(&format!("a message too large: {what}"))))
                } else {
                    Some(self.read(line))
                };
                // Lines are taken from the front by moving a mark, and the buffer is cut
                // only once most of it is read: a piece of many short lines costs linear time.
                self.start = end;
                self.searched = end;
                if self.start * 2 > self.buf.len() {
                    self.buf.drain(..self.start);
                    self.searched -= self.start;
                    self.start = 0;
                }
                if let Some(result) = result {
                    return result;
                }
                // The gateway sends no blank lines; a server that sends them without end must
                // not keep this task from letting a signal or a deadline in.
                blank += 1;
                if blank % 256 == 0 {
                    tokio::task::yield_now().await;
                }
                continue;
            }
            self.searched = self.buf.len();
            if self.buf.len() - self.start > MAX_REPLY_BYTES {
                return Err(self.broke(&format!(
                    "a message too large: more than the {} MiB this client reads",
                    MAX_REPLY_BYTES >> 20
                )));
            }
            match self.stream.body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.buf.extend_from_slice(data);
                    }
                }
                Some(Err(e)) => return Err(self.broke(&e.to_string())),
                None => return Err(self.broke("the stream ended")),
            }
        }
    }

    /// One message, from its line.
    fn read(&self, line: &[u8]) -> Result<Value, BackendError> {
        let message: Value = serde_json::from_slice(line)
            .map_err(|e| self.broke(&format!("a malformed message: {e}")))?;
        if let Some(status) = Status::of(&message) {
            return Err(self.broke(&status.message));
        }
        if message["result"]["canceled"] == true {
            let why = match int(&message["result"]["compact_revision"]) {
                0 => message["result"]["cancel_reason"]
                    .as_str()
                    .unwrap_or("no reason given")
                    .to_owned(),
                r => format!("its history was compacted up to revision {r}"),
            };
            return Err(self.broke(&format!("etcd cancelled the watch: {why}")));
        }
        Ok(message)
    }

    fn broke(&self, why: &str) -> BackendError {
        BackendError::Transient(format!(
            "the watch on {} at etcd {} broke: {why}",
            self.key, self.stream.at
        ))
    }
}

/// Whether `key` went (or, with `puts`, was written) since revision `since` - 1, read at
/// revision `at` or later (the watch's, which covers what comes after): the revision read at
/// when it did.
async fn gone_since(
    lock: &EtcdLock,
    key: &str,
    puts: bool,
    since: i64,
    at: i64,
    deadline: Instant,
) -> Result<Option<i64>, BackendError> {
    let mut read = json!({"key": b64(key.as_bytes()), "serializable": true});
    let mut reply = lock.client.must("/v3/kv/range", &read, deadline).await?;
    if int(&reply["header"]["revision"]) < at {
        // A member behind the one that confirmed the watch: the leader's word.
        read["serializable"] = json!(false);
        reply = lock.client.must("/v3/kv/range", &read, deadline).await?;
    }
    let changed = match reply["kvs"].as_array().and_then(|kvs| kvs.first()) {
        None => true,
        Some(kv) => puts && int(&kv["mod_revision"]) >= since,
    };
    Ok(changed.then(|| int(&reply["header"]["revision"])))
}

/// The revision a watch message was sent at (its header's).
fn revision(message: &Value) -> i64 {
    int(&message["result"]["header"]["revision"])
}

/// Whether a watch message holds an event (the gateway leaves a put's type out).
fn has_events(message: &Value) -> bool {
    message["result"]["events"]
        .as_array()
        .is_some_and(|events| !events.is_empty())
}

/// A waiter's wake-ups: what its standing awaits.
pub struct EtcdWakeups<'a> {
    pub(super) lock: &'a EtcdLock,
    pub(super) watch: Option<Watch>,
}

#[async_trait::async_trait(?Send)]
impl Wakeups for EtcdWakeups<'_> {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        let Some(on) = self.lock.waits_on() else {
            // No key before ours at the last attempt: nothing to wait for.
            return std::future::pending().await;
        };
        if self.watch.as_ref().is_none_or(|w| w.awaited != on.awaited) {
            self.close();
            self.watch = Some(Watch::open(self.lock, &on).await?);
        }
        let watch = self.watch.as_mut().expect("opened above");
        let happened = watch.happened().await;
        self.close();
        self.lock.woken_at.set(happened?);
        Ok(Wakeup::Anyone)
    }
}

impl EtcdWakeups<'_> {
    /// Ends the watch (fired, broken or replaced): the lock no longer counts on it.
    fn close(&mut self) {
        if let Some(watch) = self.watch.take() {
            let mut watching = self.lock.watching.borrow_mut();
            if watching.as_ref().is_some_and(|(n, _)| *n == watch.number) {
                *watching = None;
            }
        }
    }
}

impl Drop for EtcdWakeups<'_> {
    fn drop(&mut self) {
        self.close();
    }
}
