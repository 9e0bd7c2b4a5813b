//! Release messages: subscribing to a lock's channel (on the command connection with RESP3, on
//! one of its own without), waiting for the next message, and speaking to a Cluster without
//! sharded pub/sub (Redis 6) in the plain commands.

use std::io;
use std::sync::atomic::Ordering;

use super::node::Node;
use super::resp::{Connection, as_batch, within};
use crate::backend::{BackendError, Wakeup, Wakeups};

impl Node {
    /// Whether releases go on a sharded channel (`SPUBLISH`, `SSUBSCRIBE`): on a Cluster, where
    /// only those live in the lock's slot, unless the server turned out to predate them
    /// (Redis 6, where a plain PUBLISH reaches every node of the cluster).
    pub fn sharded_pubsub(&self) -> bool {
        self.cluster().is_some_and(|c| c.sharded())
    }

    pub(super) fn subscribe_command(&self) -> &'static [u8] {
        if self.sharded_pubsub() {
            b"SSUBSCRIBE"
        } else {
            b"SUBSCRIBE"
        }
    }

    /// After a refused SSUBSCRIBE or SHARDNUMSUB: a server without sharded pub/sub (Redis 6)
    /// is spoken to with the plain commands from now on. True when that changed something.
    pub fn fall_back_from_sharded(&self, refusal: &str) -> bool {
        let unknown = refusal.contains("unknown command") || refusal.contains("nknown subcommand");
        match self.cluster() {
            Some(cluster) if unknown && cluster.sharded() => {
                tracing::info!(
                    "Redis at {} has no sharded pub/sub (before Redis 7): releases are heard through \
                     PUBLISH, which reaches every node of the cluster",
                    self.address
                );
                cluster.without_sharded_pubsub();
                true
            }
            _ => false,
        }
    }

    /// Release messages on `channel`, confirmed by the server when this returns. With RESP3
    /// they come on the command connection, which [`Node::eval`] with `listen` has usually
    /// subscribed already (then `covered` is true: the subscription preceded the last
    /// attempt); with RESP2, on a connection of their own.
    pub async fn subscribe(&self, channel: &str) -> Result<(Subscription<'_>, bool), BackendError> {
        if self.resp3.load(Ordering::Relaxed) {
            let covered = self.listening(channel).await;
            if !covered {
                self.exchange(&[], self.connect_timeout, Some(channel))
                    .await?;
                let subscribed = self.listening(channel).await;
                let refusal = self
                    .listen_refused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let (false, Some(refusal)) = (subscribed, refusal) {
                    if self.fall_back_from_sharded(&refusal) {
                        return Box::pin(self.subscribe(channel)).await;
                    }
                    return Err(self.refused(&refusal));
                }
            }
            if self.resp3.load(Ordering::Relaxed) {
                return Ok((Subscription::Shared(self), covered));
            }
        }
        let timeout = self.connect_timeout;
        let attempt = async {
            let mut conn = self.connect(timeout).await?;
            let hello = self.hello(false);
            let hello_args = as_batch(&hello);
            let mut batch: Vec<&[&[u8]]> = hello_args.iter().map(Vec::as_slice).collect();
            let subscribe: [&[u8]; 2] = [self.subscribe_command(), channel.as_bytes()];
            batch.push(&subscribe);
            let refusal = super::resp::refusal(&conn.pipeline(&batch).await?);
            Ok::<_, io::Error>((conn, refusal))
        };
        match within(timeout, attempt).await {
            Ok((conn, None)) => Ok((
                Subscription::Own(Box::new(conn), self.address.clone()),
                false,
            )),
            Ok((_, Some(refusal))) if self.fall_back_from_sharded(&refusal) => {
                Box::pin(self.subscribe(channel)).await
            }
            Ok((_, Some(refusal))) => Err(self.refused(&refusal)),
            Err(e) => Err(self.unreachable(&e, timeout)),
        }
    }

    /// Whether the command connection is subscribed to `channel` (RESP3).
    async fn listening(&self, channel: &str) -> bool {
        self.conn
            .lock()
            .await
            .as_ref()
            .is_some_and(|conn| conn.subscribed_to(channel))
    }

    /// Stops listening for release messages on the command connection (after acquiring).
    pub async fn stop_listening(&self) {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_mut().filter(|c| c.subscribed()) {
            if conn.unsubscribe(self.sharded_pubsub()).await.is_err() {
                *slot = None;
            }
        }
    }

    /// Waits for a release message on the shared connection. Cancel-safe: the connection
    /// stays, with what it has read so far.
    pub(super) async fn next_message(&self) -> Result<Vec<u8>, BackendError> {
        let mut slot = self.conn.lock().await;
        let result = match slot.as_mut() {
            Some(conn) => conn.next_message().await,
            None => Err(io::Error::new(io::ErrorKind::NotConnected, "not connected")),
        };
        result.map_err(|e| {
            *slot = None;
            BackendError::Transient(format!(
                "lost the subscription to Redis at {}: {e}",
                self.address
            ))
        })
    }
}

/// Release messages on one server's channel.
pub enum Subscription<'a> {
    /// On the node's command connection (RESP3).
    Shared(&'a Node),
    /// On a connection of its own (RESP2), and the URL for messages.
    Own(Box<Connection>, String),
}

#[async_trait::async_trait(?Send)]
impl Wakeups for Subscription<'_> {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        let payload = match self {
            Subscription::Shared(node) => node.next_message().await?,
            Subscription::Own(conn, address) => conn.next_message().await.map_err(|e| {
                BackendError::Transient(format!(
                    "lost the subscription connection to Redis at {address}: {e}"
                ))
            })?,
        };
        Ok(Wakeup::from_message(&payload))
    }
}
