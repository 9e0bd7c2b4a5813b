//! One Redis server reached through a URL: a lazily opened connection that is dropped after any
//! failure (or an abandoned request) so the next attempt starts fresh, the set-up every new
//! connection starts with, requests (following a Cluster's redirections), script calls with
//! EVALSHA and an EVAL fallback; what the server's failures and refusals mean is in
//! `refusals.rs`.

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::auth::Credentials;
use super::cluster::{Cluster, redirection};
use super::resp::{Addr, Connection, Reply, as_batch, refusal, within};
use super::sentinel::Sentinel;
use super::url::Topology;
use crate::backend::BackendError;
use crate::endpoints::PasswordFrom;
use crate::endpoints::SentinelAuth;
use refusals::SetUpRefused;

/// A Redis server reached through one URL.
pub struct Node {
    pub(super) address: String,
    user: Option<String>,
    password: Option<String>,
    /// Where the password came from, for the line that says it was refused.
    password_from: Option<PasswordFrom>,
    db: i64,
    pub(super) connect_timeout: Duration,
    pub(super) topology: Topology,
    /// Cleared when the server turns out not to speak RESP3 (Redis 5): subscriptions then
    /// need a connection of their own.
    pub(super) resp3: AtomicBool,
    /// The idle connection. A request owns it while it runs, so an abandoned request drops it
    /// and the next one connects afresh; waiting for a release message only borrows it.
    pub(super) conn: tokio::sync::Mutex<Option<Connection>>,
    /// Why the server last refused a subscription sent with a request (an ACL user without
    /// the channel): `subscribe` reports it, and the waiter falls back to polling.
    pub(super) listen_refused: std::sync::Mutex<Option<String>>,
    /// The server has answered in Redis's protocol at least once: a hang-up is then a
    /// server's failure, never a sign of another protocol (see `why_closed`).
    pub(super) spoke: AtomicBool,
}

/// Shows the address only, never the password.
impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Opens (without connecting) the server `url` names; a password missing from the URL is
    /// `default_password` (`--password-file`, `REDISCLI_AUTH`). Errors are usage errors, never
    /// showing the password.
    pub fn open(
        url: &str,
        connect_timeout: Duration,
        default_password: Option<&str>,
    ) -> Result<Node, String> {
        Node::open_with(url, connect_timeout, default_password, None)
    }

    /// [`Node::open`], with the TLS set-up for `rediss://` URLs (built once for all of them;
    /// without one, the system's CAs).
    pub fn open_with(
        url: &str,
        connect_timeout: Duration,
        default_password: Option<&str>,
        tls: Option<&tokio_rustls::TlsConnector>,
    ) -> Result<Node, String> {
        let target = super::url::parse(url, default_password, tls)?;
        let password_from = match (&target.password, target.password_in_url) {
            (None, _) => None,
            (Some(_), true) => Some(PasswordFrom::Url),
            // The library's default; the command line says which of its sources it used.
            (Some(_), false) => Some(PasswordFrom::Env("REDISCLI_AUTH")),
        };
        Ok(Node {
            address: target.address,
            user: target.user,
            password: target.password,
            password_from,
            db: target.db,
            connect_timeout,
            topology: target.topology,
            resp3: AtomicBool::new(true),
            conn: tokio::sync::Mutex::new(None),
            listen_refused: std::sync::Mutex::new(None),
            spoke: AtomicBool::new(false),
        })
    }

    /// The sentinels' own credentials (`LOCKED_RUN_SENTINEL_AUTH`, `--sentinel-password-file`),
    /// for a sentinel URL; without them the sentinels are asked with the data nodes'.
    pub fn with_sentinel_auth(mut self, auth: Option<SentinelAuth>) -> Node {
        if let Topology::Sentinel(sentinel) = &mut self.topology {
            sentinel.set_auth(auth);
        }
        self
    }

    /// Where a password the URL does not carry came from (`--password-file FILE`,
    /// `REDISCLI_AUTH`), for the line that says it was refused.
    pub fn with_default_password_from(mut self, from: Option<PasswordFrom>) -> Node {
        if self
            .password_from
            .as_ref()
            .is_some_and(|f| *f != PasswordFrom::Url)
        {
            self.password_from = from;
        }
        self
    }

    /// The sentinels of a sentinel URL.
    pub fn sentinel(&self) -> Option<&Sentinel> {
        match &self.topology {
            Topology::Sentinel(sentinel) => Some(sentinel),
            _ => None,
        }
    }

    /// The data nodes' user and password, which the sentinels share unless given their own.
    pub(crate) fn credentials(&self) -> Credentials<'_> {
        Credentials {
            user: self.user.as_deref(),
            password: self.password.as_deref(),
            from: self.password_from.as_ref(),
        }
    }

    /// Whether every hop speaks TLS.
    pub fn is_tls(&self) -> bool {
        self.tls().is_some()
    }

    /// The TLS set-up of every hop, if this URL speaks TLS.
    pub(crate) fn tls(&self) -> Option<&tokio_rustls::TlsConnector> {
        match &self.topology {
            Topology::Direct { tls, .. } => tls.as_ref(),
            Topology::Sentinel(sentinel) => sentinel.tls.as_ref(),
            Topology::Cluster(cluster) => cluster.tls(),
        }
    }

    /// Each hop before the data node, asked on its own (for `doctor`): every sentinel of a
    /// sentinel URL (reached, TLS verified, authenticated, naming the primary), or every seed of
    /// a cluster URL (naming the owner of the lock's slot). Each is the hop's name and what it
    /// said, or why it failed; empty for one server.
    pub async fn hops(&self, timeout: Duration) -> Vec<(String, Result<String, String>)> {
        let timeout = timeout.min(self.connect_timeout);
        let tls = if self.is_tls() { ", TLS verified" } else { "" };
        let mut hops = Vec::new();
        match &self.topology {
            Topology::Direct { .. } => {}
            Topology::Sentinel(sentinel) => {
                let auth = match sentinel.authenticates(self.password.as_deref()) {
                    true => ", authenticated",
                    false => "",
                };
                for addr in sentinel.addrs() {
                    let said = sentinel.ask(&addr, self.credentials(), timeout).await;
                    hops.push((
                        format!("sentinel {addr}"),
                        said.map(|primary| {
                            format!("reached{tls}{auth}; names the primary {primary}")
                        })
                        .map_err(|e| e.to_string()),
                    ));
                }
            }
            Topology::Cluster(cluster) => {
                let auth = match self.password.is_some() {
                    true => ", authenticated",
                    false => "",
                };
                for addr in cluster.seed_addrs() {
                    let said = cluster
                        .ask(&addr, &self.hello(false), self.credentials(), timeout)
                        .await;
                    hops.push((
                        format!("cluster node {addr}"),
                        said.map(|owner| {
                            format!("reached{tls}{auth}; slot {} is on {owner}", cluster.slot())
                        })
                        .map_err(|e| e.to_string()),
                    ));
                }
            }
        }
        hops
    }

    /// The commands a new connection starts with: HELLO 3 (with AUTH) or AUTH, and SELECT.
    pub(super) fn hello(&self, resp3: bool) -> Vec<Vec<Vec<u8>>> {
        let mut hello = Vec::new();
        let user = self.user.as_deref().unwrap_or("default");
        match (&self.password, resp3) {
            (Some(password), true) => hello.push(vec![
                b"HELLO".to_vec(),
                b"3".to_vec(),
                b"AUTH".to_vec(),
                user.as_bytes().to_vec(),
                password.as_bytes().to_vec(),
            ]),
            (None, true) => hello.push(vec![b"HELLO".to_vec(), b"3".to_vec()]),
            (Some(password), false) => {
                let mut auth = vec![b"AUTH".to_vec()];
                auth.extend(self.user.as_ref().map(|u| u.as_bytes().to_vec()));
                auth.push(password.as_bytes().to_vec());
                hello.push(auth);
            }
            (None, false) => {}
        }
        if self.db != 0 {
            hello.push(vec![b"SELECT".to_vec(), self.db.to_string().into_bytes()]);
        }
        hello
    }

    /// `host:port` (or the socket path) this URL names directly, to compare with what servers
    /// say of their replicas.
    pub fn endpoint(&self) -> String {
        self.topology.endpoint()
    }

    /// Sets the hash slot of the lock's keys from their hash tag (the NAME), for a Cluster.
    pub fn set_hash_tag(&self, tag: &str) {
        if let Some(cluster) = self.cluster() {
            cluster.set_hash_tag(tag);
        }
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster().is_some()
    }

    pub(super) fn cluster(&self) -> Option<&Cluster> {
        match &self.topology {
            Topology::Cluster(cluster) => Some(cluster),
            _ => None,
        }
    }

    /// Whether `other` names the same server and database (Redlock must not count it twice).
    pub fn same_server(&self, other: &Node) -> bool {
        self.db == other.db && self.topology.same(&other.topology)
    }

    /// The URL without its password, for messages.
    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Sends `commands` in one write and returns their replies, within `timeout`, connecting
    /// (and authenticating) first if needed. With `listen`, the connection is subscribed to
    /// `listen`'s channel first, in the same write, so the subscription is confirmed before the
    /// commands run (RESP3; with RESP2 `listen` is ignored). Error replies are returned as
    /// replies.
    pub async fn exchange(
        &self,
        commands: &[&[&[u8]]],
        timeout: Duration,
        listen: Option<&str>,
    ) -> Result<Vec<Reply>, BackendError> {
        // On a Cluster, follow redirections: MOVED (the slot has a new owner: go there from now
        // on) and ASK (the slot is being moved: this one request goes to the importing node).
        for _ in 0..5 {
            let replies = self.exchange_once(commands, timeout, listen).await?;
            let Some(cluster) = self.cluster() else {
                return Ok(replies);
            };
            match redirection(&replies) {
                Some(("MOVED", target)) => {
                    tracing::debug!("the lock's slot moved to {target}");
                    cluster.moved(target);
                    *self.conn.lock().await = None;
                }
                Some((_, target)) => {
                    tracing::debug!("the lock's slot is being moved to {target}: asking there");
                    return self.exchange_asking(&target, commands, timeout).await;
                }
                None => return Ok(replies),
            }
        }
        Err(BackendError::Transient(format!(
            "the Redis Cluster at {} kept redirecting the lock's slot",
            self.address
        )))
    }

    /// One request to the node that is importing the slot (ASK), on a connection of its own.
    async fn exchange_asking(
        &self,
        target: &Addr,
        commands: &[&[&[u8]]],
        timeout: Duration,
    ) -> Result<Vec<Reply>, BackendError> {
        let attempt = async {
            let mut conn = within(
                timeout.min(self.connect_timeout),
                Connection::connect(target, self.tls()),
            )
            .await?;
            // As on any new connection: nothing runs before the password is taken.
            let hello = self.hello(self.resp3.load(Ordering::Relaxed));
            let hello_args = as_batch(&hello);
            let set_up: Vec<&[&[u8]]> = hello_args.iter().map(Vec::as_slice).collect();
            if let Some(refused) = refusal(&conn.pipeline(&set_up).await?) {
                return Ok(Err(refused));
            }
            let asking: [&[u8]; 1] = [b"ASKING"];
            let mut batch: Vec<&[&[u8]]> = vec![&asking];
            batch.extend_from_slice(commands);
            let mut replies = conn.pipeline(&batch).await?;
            Ok::<_, io::Error>(Ok(replies.split_off(1)))
        };
        match within(timeout, attempt).await {
            Ok(Ok(replies)) => Ok(replies),
            Ok(Err(refusal)) => Err(self.refused_by(&refusal, Some(&target.to_string()))),
            Err(e) => Err(self.unreachable(&e, timeout)),
        }
    }

    async fn exchange_once(
        &self,
        commands: &[&[&[u8]]],
        timeout: Duration,
        listen: Option<&str>,
    ) -> Result<Vec<Reply>, BackendError> {
        let mut slot = self.conn.lock().await;
        let taken = slot.take();
        let deadline = tokio::time::Instant::now() + timeout;
        // Set once the commands are written: before that, a failure took nothing.
        let sent = Cell::new(false);
        let exchanged = self.exchange_on(taken, commands, timeout, listen, &sent);
        match within(timeout, exchanged).await {
            Ok(Ok((conn, replies))) => {
                self.spoke.store(true, Ordering::Relaxed);
                *slot = Some(conn);
                Ok(replies)
            }
            Ok(Err(refused)) => {
                self.spoke.store(true, Ordering::Relaxed);
                Err(self.refused_set_up(refused))
            }
            Err(e) => {
                // The cluster node may be gone for good (its replica promoted): ask the seeds
                // again at the next connection.
                if let Some(cluster) = self.cluster() {
                    cluster.forget_route();
                }
                let error = self.unreachable(&self.why_closed(e, deadline).await, timeout);
                Err(error.unsent_if(!sent.get()))
            }
        }
    }

    async fn exchange_on(
        &self,
        conn: Option<Connection>,
        commands: &[&[&[u8]]],
        timeout: Duration,
        listen: Option<&str>,
        sent: &Cell<bool>,
    ) -> io::Result<Result<(Connection, Vec<Reply>), SetUpRefused>> {
        let (mut conn, fresh) = match conn {
            Some(conn) => (conn, false),
            None => (self.connect(timeout).await?, true),
        };
        let resp3 = self.resp3.load(Ordering::Relaxed);
        let hello = if fresh { self.hello(resp3) } else { Vec::new() };
        let hello_args = as_batch(&hello);
        let mut batch: Vec<&[&[u8]]> = hello_args.iter().map(Vec::as_slice).collect();
        if fresh && (self.password.is_some() || self.db != 0) {
            // A password or a database can be refused while the commands after them still
            // run: as the default user (where it needs no password), or in database 0. A
            // lock taken there would stay held, and `release --force` would delete another
            // database's lock: such a set-up is confirmed first, in a round trip of its own.
            if let Some(e) = refusal(&conn.pipeline(&batch).await?) {
                if resp3 && (e.contains("unknown command") || e.starts_with("NOPROTO")) {
                    self.resp3.store(false, Ordering::Relaxed);
                    return Box::pin(self.exchange_on(None, commands, timeout, listen, sent)).await;
                }
                return Ok(Err(SetUpRefused {
                    error: e,
                    peer: conn.peer().to_owned(),
                    before_commands: true,
                }));
            }
            return Box::pin(self.exchange_on(Some(conn), commands, timeout, listen, sent)).await;
        }
        // Replies to set-up commands come first; a RESP3 SUBSCRIBE is answered by a push,
        // which the connection takes, not by a reply.
        let set_up = batch.len();
        let subscribe: [&[u8]; 2];
        let subscribing = listen.is_some_and(|channel| resp3 && !conn.subscribed_to(channel));
        if subscribing && conn.subscribed() {
            // Subscribed to another channel (a fair waiter's token changed): that one goes.
            conn.unsubscribe(self.sharded_pubsub()).await?;
        }
        if let Some(channel) = listen.filter(|_| subscribing) {
            subscribe = [self.subscribe_command(), channel.as_bytes()];
            batch.push(&subscribe);
        }
        batch.extend_from_slice(commands);
        sent.set(true);
        let mut replies = conn.pipeline(&batch).await?;
        if subscribing && replies.len() > set_up + commands.len() {
            // The SUBSCRIBE was refused: its answer is an error reply where a push was due.
            // The commands after it ran all the same, and their replies follow.
            // (Or, without RESP3, a confirmation in RESP2's form: the caller starts again.)
            if let Reply::Error(refusal) = replies.remove(set_up) {
                tracing::debug!(
                    "Redis at {} refused the subscription: {refusal}",
                    self.address
                );
                *self
                    .listen_refused
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(refusal);
            }
        }
        let tail = replies.split_off(set_up.min(replies.len()));
        if let Some(e) = refusal(&replies) {
            if resp3 && fresh && (e.contains("unknown command") || e.starts_with("NOPROTO")) {
                // Redis 5 has no HELLO: speak RESP2 from now on. The commands ran all the
                // same, as RESP2 runs them: their replies stand, unless one failed (a
                // SUBSCRIBE turned the connection to subscribed mode, a script was unknown),
                // and then they are sent again on a new connection. Running them twice would
                // say "was free" of a lock `release --force` had just released.
                self.resp3.store(false, Ordering::Relaxed);
                if !subscribing && refusal(&tail).is_none() {
                    return Ok(Ok((conn, tail)));
                }
                return Box::pin(self.exchange_on(None, commands, timeout, listen, sent)).await;
            }
            let before_commands = e.starts_with("NOAUTH");
            return Ok(Err(SetUpRefused {
                error: e,
                peer: conn.peer().to_owned(),
                before_commands,
            }));
        }
        Ok(Ok((conn, tail)))
    }

    pub(super) async fn connect(&self, timeout: Duration) -> io::Result<Connection> {
        // A little under the caller's own limit: when a hop (a sentinel, the primary it names,
        // a cluster node) goes silent, its own error, which names it, comes first.
        let timeout = timeout.min(self.connect_timeout).mul_f64(0.95);
        match &self.topology {
            Topology::Direct { addr, tls } => {
                within(timeout, Connection::connect(addr, tls.as_ref())).await
            }
            Topology::Sentinel(sentinel) => {
                let primary = sentinel.primary(self.credentials(), timeout).await?;
                let tls = sentinel.tls.as_ref();
                within(timeout, Connection::connect(&primary, tls))
                    .await
                    .map_err(|e| hop(&e, "the primary", &primary, tls.is_some()))
            }
            Topology::Cluster(cluster) => {
                let owner = cluster
                    .owner(&self.hello(false), self.credentials(), timeout)
                    .await?;
                within(timeout, Connection::connect(&owner, cluster.tls()))
                    .await
                    .map_err(|e| hop(&e, "cluster node", &owner, cluster.tls().is_some()))
            }
        }
    }

    /// Drops the idle connection: the next request connects afresh (and, through sentinels,
    /// to whichever server is the primary by then).
    pub(super) async fn forget(&self) {
        *self.conn.lock().await = None;
    }
}

/// A failure to reach a server the sentinels or a cluster's seeds named, naming that hop.
fn hop(error: &io::Error, what: &str, addr: &Addr, tls: bool) -> io::Error {
    let detail = match error.kind() {
        io::ErrorKind::InvalidData if tls => format!("TLS handshake failed: {error}"),
        _ => error.to_string(),
    };
    let tls = if tls { " (TLS)" } else { "" };
    io::Error::new(error.kind(), format!("{what} {addr}{tls}: {detail}"))
}

mod refusals;
mod scripts;
#[cfg(test)]
mod tests;
