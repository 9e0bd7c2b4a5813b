//! A waiter's wake-up: a watch (a `Watch` stream on the client's connection) on what its
//! standing in the line awaits (see `line`: the key before its own, or any key of the line),
//! covering everything since the read that found it, so that a change between that read and
//! the watch is still seen. Each attempt says what to await: a watch on something else is
//! replaced.
//!
//! etcd serves a watch that starts at a revision it has already reached (anything at all was
//! written in the cluster since the read) from its history, in a loop that runs every 100 ms:
//! even a delete made after the watch was confirmed then comes up to 100 ms late (94 ms
//! median, measured on etcd 3.4). A watch on a key therefore starts now instead (revision 0,
//! which etcd serves live), and when the cluster moved on since the read, the key is read
//! once after the watch is confirmed: gone (or, where a write is awaited, written) since the
//! read, it wakes the waiter at once.

use tokio::time::{Instant, timeout_at};

use super::EtcdLock;
use super::client::Client;
use super::grpc::frame::decode;
use super::grpc::stream::Duplex;
use super::grpc::{Failed, Status};
use super::line::Awaited;
use super::proto::etcdserverpb::watch_create_request::FilterType;
use super::proto::etcdserverpb::watch_request::RequestUnion;
use super::proto::etcdserverpb::{RangeResponse, WatchCreateRequest, WatchRequest, WatchResponse};
use super::wire::{self, prefix_end};
use crate::backend::{BackendError, KEEP_ALIVE, Wakeup, Wakeups};

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
    stream: Duplex,
    /// The endpoint it is on, for messages.
    at: String,
    watch_id: i64,
    /// What is awaited came with the confirmation: the revision etcd said so at.
    seen: Option<i64>,
    /// Its number, for [`EtcdLock`]'s note of the watch standing (see `EtcdLock::unchanged`).
    number: u64,
}

impl Watch {
    /// Watches what `on` awaits, covering everything since `on.from` (see above), once etcd
    /// confirmed the watch.
    pub async fn open(lock: &EtcdLock, on: &Predecessor) -> Result<Watch, BackendError> {
        let deadline = Instant::now() + lock.client.connect_timeout();
        // Confirmed within a heartbeat, or not waited for: the waiter's heartbeats (its queue
        // lease's keep-alives, and a read of where it stands while no watch stands) go on
        // meanwhile, and it subscribes again later. A proxy that passes no Watch stream then
        // costs the waiter its wake-up's speed, not its place (a wait for the confirmation
        // until --connect-timeout kept its keep-alives from going, and its place lapsed).
        let confirm_by = (Instant::now() + KEEP_ALIVE / 3).min(deadline);
        // A put counts only when awaited; a delete always does. Any delete in the line has
        // no one key to read after the watch: it is watched from the read's revision on.
        let (key, puts, from) = match &on.awaited {
            Awaited::Key { key, puts } => (key.clone(), *puts, 0),
            Awaited::AnyDelete => (lock.prefix.clone(), false, on.from),
        };
        let mut create = WatchCreateRequest {
            key: key.clone().into_bytes().into(),
            start_revision: from,
            ..WatchCreateRequest::default()
        };
        if on.awaited == Awaited::AnyDelete {
            create.range_end = prefix_end(lock.prefix.as_bytes()).into();
        }
        if !puts {
            create.filters = vec![FilterType::Noput as i32];
        }
        let (stream, at, created) = lock.client.watch(create, deadline, confirm_by).await?;
        let number = {
            let mut st = lock.st();
            st.watches += 1;
            st.watches
        };
        let mut watch = Watch {
            awaited: on.awaited.clone(),
            key,
            stream,
            at,
            watch_id: created.watch_id,
            seen: None,
            number,
        };
        let revision = revision_of(&created);
        watch.seen = (!created.events.is_empty()).then_some(revision);
        if watch.seen.is_none() && from == 0 && revision >= on.from {
            watch.seen = gone_since(lock, &watch.key, puts, on.from, revision, deadline).await?;
        }
        if watch.seen.is_none() {
            lock.st().watching = Some((number, watch.awaited.clone(), watch.stream.conn));
        }
        Ok(watch)
    }

    /// Resolves when what is awaited happens (the filters keep every other event out), with
    /// the revision etcd was at when it said so.
    async fn happened(&mut self) -> Result<i64, BackendError> {
        if let Some(revision) = self.seen {
            return Ok(revision);
        }
        loop {
            let message = self.message().await?;
            if message.watch_id == self.watch_id && !message.events.is_empty() {
                return Ok(revision_of(&message));
            }
        }
    }

    /// The next message of the stream; an error etcd sent, or a watch it cancelled
    /// (compacted past its start), is an error.
    async fn message(&mut self) -> Result<WatchResponse, BackendError> {
        let bytes = self
            .stream
            .next()
            .await
            .map_err(|f| self.broke(&failure(&f)))?;
        let message: WatchResponse = decode(bytes).map_err(|f| self.broke(&failure(&f)))?;
        if message.canceled && message.watch_id == self.watch_id {
            let why = match message.compact_revision {
                0 if message.cancel_reason.is_empty() => "no reason given".to_owned(),
                0 => message.cancel_reason.clone(),
                r => format!("its history was compacted up to revision {r}"),
            };
            return Err(self.broke(&format!("etcd cancelled the watch: {why}")));
        }
        Ok(message)
    }

    fn broke(&self, why: &str) -> BackendError {
        BackendError::Transient(crate::text::message!(
            "the watch on {} at etcd {} broke: {why}",
            self.key,
            self.at
        ))
    }
}

/// A failed read of the watch stream, in words.
fn failure(failed: &Failed) -> String {
    match failed {
        Failed::TooLarge(what) => format!("a message too large: {what}"),
        Failed::Malformed(what) => format!("a malformed message: {what}"),
        Failed::Http(e) => e.to_string(),
        Failed::Ended(Ok(())) => "the stream ended".into(),
        Failed::Ended(Err(status)) => status.message.clone(),
    }
}

impl Client {
    /// A watch created with `create`, on the connection (made by `deadline`), confirmed by
    /// `confirm_by`: its stream, the endpoint it is on, and the confirmation (which may carry
    /// events already). A confirmation that does not come in time gives the watch up, not the
    /// connection: the requests beside it say whether the member is gone.
    pub(super) async fn watch(
        &self,
        create: WatchCreateRequest,
        deadline: Instant,
        confirm_by: Instant,
    ) -> Result<(Duplex, String, WatchResponse), BackendError> {
        let request = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create)),
        };
        let mut renewed_token = false;
        let started = Instant::now();
        loop {
            let (conn, _) = self.conn(deadline).await?;
            let at = self.endpoint(conn.at).to_string();
            let token = self.token();
            let opened = timeout_at(confirm_by, async {
                let mut stream =
                    Duplex::open(&conn, wire::WATCH, token.as_deref(), &request).await?;
                // Progress notices or another watch's messages may come first: the first
                // that says created is ours.
                loop {
                    let message: WatchResponse = decode(stream.next().await?)?;
                    if message.created {
                        return Ok::<_, Failed>((stream, message));
                    }
                }
            })
            .await;
            return match opened {
                Ok(Ok((_, created))) if created.canceled => Err(self.refused(&Status {
                    code: super::grpc::FAILED_PRECONDITION,
                    message: format!("etcd refused the watch: {}", created.cancel_reason),
                })),
                Ok(Ok((stream, created))) => Ok((stream, at, created)),
                Ok(Err(Failed::Ended(Err(status)))) if self.expired(&status) && !renewed_token => {
                    renewed_token = true;
                    continue;
                }
                Ok(Err(Failed::Ended(Err(status)))) if !status.transient() => {
                    Err(self.refused(&status))
                }
                Ok(Err(failed)) => Err(BackendError::Transient(crate::text::message!(
                    "the watch at etcd {at} could not be opened: {}",
                    failure(&failed)
                ))),
                Err(_) => Err(BackendError::Transient(format!(
                    "etcd {at} did not confirm the watch within {}",
                    crate::text::show(confirm_by.saturating_duration_since(started))
                ))),
            };
        }
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
    let mut read = wire::one(key);
    read.serializable = true;
    let mut reply: RangeResponse = lock.client.must(wire::RANGE, &read, deadline).await?;
    if header_revision(&reply) < at {
        // A member behind the one that confirmed the watch: the leader's word.
        read.serializable = false;
        reply = lock.client.must(wire::RANGE, &read, deadline).await?;
    }
    // A key of that name created since is not the one awaited (a waiter whose queue lease
    // lapsed queues again under the same name): the awaited one went.
    let changed = match reply.kvs.first() {
        None => true,
        Some(kv) => kv.create_revision >= since || (puts && kv.mod_revision >= since),
    };
    Ok(changed.then(|| header_revision(&reply)))
}

fn header_revision(reply: &RangeResponse) -> i64 {
    reply.header.as_ref().map_or(0, |h| h.revision)
}

/// The revision a watch message was sent at (its header's).
fn revision_of(message: &WatchResponse) -> i64 {
    message.header.as_ref().map_or(0, |h| h.revision)
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
        // A watch on something else, or on a connection given up since (it hears nothing
        // more), is replaced.
        let stale =
            |w: &Watch| w.awaited != on.awaited || !self.lock.client.is_current(w.stream.conn);
        if self.watch.as_ref().is_none_or(stale) {
            self.close();
            self.watch = Some(Watch::open(self.lock, &on).await?);
        }
        let watch = self.watch.as_mut().expect("opened above");
        let happened = watch.happened().await;
        self.close();
        self.lock.st().woken_at = happened?;
        Ok(Wakeup::Anyone)
    }
}

impl EtcdWakeups<'_> {
    /// Ends the watch (fired, broken or replaced): the lock no longer counts on it.
    fn close(&mut self) {
        if let Some(watch) = self.watch.take() {
            let mut st = self.lock.st();
            if st
                .watching
                .as_ref()
                .is_some_and(|(n, _, _)| *n == watch.number)
            {
                st.watching = None;
            }
        }
    }
}

impl Drop for EtcdWakeups<'_> {
    fn drop(&mut self) {
        self.close();
    }
}
