//! One Redis server: its URL (printable without the password), a lazily opened connection
//! that is dropped after any failure (or an abandoned request) so the next attempt starts
//! fresh, script calls with EVALSHA and an EVAL fallback, and release subscriptions.

use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use percent_encoding::percent_decode_str;

use crate::backend::{BackendError, Wakeups};
use crate::lease::show;
use crate::resp::{Addr, Connection, Reply, within};
use crate::scripts::Script;
use crate::tls::TlsOptions;

/// A Redis server reached through one URL.
pub struct Node {
    addr: Addr,
    address: String,
    user: Option<String>,
    password: Option<String>,
    db: i64,
    connect_timeout: Duration,
    /// For `rediss://`.
    tls: Option<tokio_rustls::TlsConnector>,
    /// For `redis+sentinel://`: who to ask where the primary is; `addr` is then unused.
    sentinel: Option<Sentinel>,
    /// For `redis+cluster://`: the seed nodes; the server is the one that owns `slot`.
    cluster: Option<Vec<(String, u16)>>,
    /// The hash slot of the lock's keys (set by the lock, from its NAME).
    slot: std::sync::OnceLock<u16>,
    /// The cluster node last found to own `slot` (updated on MOVED).
    route: std::sync::Mutex<Option<Addr>>,
    /// Cleared when the server turns out not to speak RESP3 (Redis 5): subscriptions then
    /// need a connection of their own.
    resp3: AtomicBool,
    /// Cleared when a Cluster's server turns out to have no sharded pub/sub (Redis 6).
    sharded: AtomicBool,
    /// The idle connection. A request owns it while it runs, so an abandoned request drops it
    /// and the next one connects afresh; waiting for a release message only borrows it.
    conn: tokio::sync::Mutex<Option<Connection>>,
    /// Why the server last refused a subscription sent with a request (an ACL user without
    /// the channel): `subscribe` reports it, and the waiter falls back to polling.
    listen_refused: std::sync::Mutex<Option<String>>,
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
    /// Parses `url`: `redis://[user[:password]@]host[:port][/db]` or
    /// `redis+unix:///path[?db=N&user=U&pass=P]`. A password missing from the URL is
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
        if url.starts_with("redis+sentinel://") || url.starts_with("redis+cluster://") {
            return Node::open_multi(url, connect_timeout, default_password);
        }
        let parsed = url::Url::parse(url).map_err(|e| match e {
            url::ParseError::InvalidPort => port_out_of_range(url),
            url::ParseError::EmptyHost => format!("{} has no host", shown(url)),
            _ => bad_url(url),
        })?;
        let address = redact(&parsed);
        let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        let query = |names: &[&str]| {
            parsed
                .query_pairs()
                .find(|(k, _)| names.contains(&k.as_ref()))
                .map(|(_, v)| v.into_owned())
        };
        let secure = parsed.scheme() == "rediss";
        let (addr, mut user, mut password, db) = match parsed.scheme() {
            "redis" | "rediss" => {
                let host = match parsed.host() {
                    Some(url::Host::Domain(d)) if !d.is_empty() => d.to_owned(),
                    Some(url::Host::Ipv4(ip)) => ip.to_string(),
                    Some(url::Host::Ipv6(ip)) => ip.to_string(),
                    _ => return Err(format!("the Redis URL {address} has no host")),
                };
                if parsed.port() == Some(0) {
                    return Err(port_out_of_range(url));
                }
                known_parameters(&parsed, &address, &[])?;
                let db = parsed.path().trim_matches('/');
                let db = if db.is_empty() {
                    None
                } else {
                    Some(db.to_owned())
                };
                let user = Some(decode(parsed.username())).filter(|u| !u.is_empty());
                let tcp = Addr::Tcp {
                    host,
                    port: parsed.port().unwrap_or(6379),
                };
                (tcp, user, parsed.password().map(decode), db)
            }
            "redis+unix" => {
                if parsed.path().is_empty() || parsed.path() == "/" {
                    return Err(format!("the Redis URL {address} has no socket path"));
                }
                known_parameters(&parsed, &address, &["db", "user", "pass", "password"])?;
                let path = PathBuf::from(decode(parsed.path()));
                (
                    Addr::Unix(path),
                    query(&["user"]),
                    query(&["pass", "password"]),
                    query(&["db"]),
                )
            }
            _ => return Err(bad_url(url)),
        };
        let db = match db {
            None => 0,
            Some(db) => database(&db).ok_or_else(|| {
                format!(
                    "the Redis URL {address} names database {db:?}: a database is a number, 0 or more"
                )
            })?,
        };
        if password.is_none() {
            password = default_password.map(str::to_owned);
        }
        if password.is_none() {
            user = None; // AUTH needs a password; a bare user name means the default user
        }
        let tls = match (secure, tls) {
            (false, _) => None,
            (true, Some(tls)) => Some(tls.clone()),
            (true, None) => Some(crate::tls::connector(&TlsOptions::default())?),
        };
        Ok(Node {
            addr,
            address,
            user,
            password,
            db,
            connect_timeout,
            tls,
            sentinel: None,
            cluster: None,
            slot: std::sync::OnceLock::new(),
            route: std::sync::Mutex::new(None),
            resp3: AtomicBool::new(true),
            sharded: AtomicBool::new(true),
            conn: tokio::sync::Mutex::new(None),
            listen_refused: std::sync::Mutex::new(None),
        })
    }

    /// URLs that name several hosts:
    /// - `redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER[/DB]`: the
    ///   primary is asked of the sentinels (port 26379 by default) at every new connection, so
    ///   after a failover the next attempt reaches the new primary;
    /// - `redis+cluster://[user[:password]@]host[:port][,host[:port]...]`: seed nodes of a
    ///   Redis Cluster, asked which node owns the lock's hash slot.
    fn open_multi(
        url: &str,
        connect_timeout: Duration,
        default_password: Option<&str>,
    ) -> Result<Node, String> {
        let is_cluster = url.starts_with("redis+cluster://");
        let usage = || {
            if is_cluster {
                format!(
                    "{} is not a cluster URL: use redis+cluster://[user[:password]@]host[:port][,host[:port]...]",
                    redact_multi(url)
                )
            } else {
                format!(
                    "{} is not a sentinel URL: use redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER[/DB]",
                    redact_multi(url)
                )
            }
        };
        let rest = url.split_once("://").map_or("", |(_, rest)| rest);
        let (auth, hosts_part, path) = split_multi(rest);
        if path.unwrap_or(hosts_part).contains(['?', '#']) {
            return Err(format!(
                "{}: sentinel and cluster URLs take no ?parameters",
                redact_multi(url)
            ));
        }
        let path = if is_cluster {
            if path.is_some_and(|p| !p.is_empty()) {
                return Err(format!(
                    "{}: a Redis Cluster has only database 0",
                    redact_multi(url)
                ));
            }
            "cluster"
        } else {
            path.ok_or_else(usage)?
        };
        let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        let (mut user, mut password) = match auth.map(|a| a.split_once(':').unwrap_or((a, ""))) {
            Some((u, p)) => (
                Some(decode(u)).filter(|u| !u.is_empty()),
                Some(decode(p)).filter(|p| !p.is_empty()),
            ),
            None => (None, None),
        };
        let mut hosts = Vec::new();
        for host in hosts_part.split(',') {
            if host.is_empty() {
                return Err(format!("{}: an empty host in the list", redact_multi(url)));
            }
            let (name, port) = match host.rsplit_once(':') {
                Some((name, port))
                    if !name.ends_with(':') && (!name.starts_with('[') || name.ends_with(']')) =>
                {
                    let number = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
                    match port.parse::<u16>() {
                        Ok(port) if port > 0 => (name, port),
                        _ if number => {
                            return Err(format!(
                                "{}: port {port} is out of range: use 1 to 65535",
                                redact_multi(url)
                            ));
                        }
                        _ => return Err(usage()),
                    }
                }
                _ => (host, if is_cluster { 6379 } else { 26379 }),
            };
            if name.is_empty() || name == "[]" {
                return Err(format!("{}: an empty host in the list", redact_multi(url)));
            }
            hosts.push((
                name.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned(),
                port,
            ));
        }
        let mut segments = path.split('/');
        let master = segments
            .next()
            .filter(|m| !m.is_empty())
            .ok_or_else(usage)?
            .to_owned();
        let db = match segments.next() {
            None | Some("") => 0,
            Some(db) => database(db).ok_or_else(|| {
                format!(
                    "{} names database {db:?}: a database is a number, 0 or more",
                    redact_multi(url)
                )
            })?,
        };
        if segments.next().is_some() {
            return Err(usage());
        }
        if hosts.is_empty() {
            return Err(usage());
        }
        if password.is_none() {
            password = default_password.map(str::to_owned);
        }
        if password.is_none() {
            user = None;
        }
        Ok(Node {
            addr: Addr::Tcp {
                host: hosts[0].0.clone(),
                port: hosts[0].1,
            },
            address: redact_multi(url),
            user,
            password,
            db,
            connect_timeout,
            tls: None,
            sentinel: (!is_cluster).then(|| Sentinel {
                hosts: hosts.clone(),
                master,
            }),
            cluster: is_cluster.then_some(hosts),
            slot: std::sync::OnceLock::new(),
            route: std::sync::Mutex::new(None),
            resp3: AtomicBool::new(true),
            sharded: AtomicBool::new(true),
            conn: tokio::sync::Mutex::new(None),
            listen_refused: std::sync::Mutex::new(None),
        })
    }

    /// The commands a new connection starts with: HELLO 3 (with AUTH) or AUTH, and SELECT.
    fn hello(&self, resp3: bool) -> Vec<Vec<Vec<u8>>> {
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
        self.addr.to_string()
    }

    /// Sets the hash slot of the lock's keys from their hash tag (the NAME), for a Cluster.
    pub fn set_hash_tag(&self, tag: &str) {
        let _ = self.slot.set(crc16(tag.as_bytes()) % 16384);
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster.is_some()
    }

    /// Whether releases go on a sharded channel (`SPUBLISH`, `SSUBSCRIBE`): on a Cluster, where
    /// only those live in the lock's slot, unless the server turned out to predate them
    /// (Redis 6, where a plain PUBLISH reaches every node of the cluster).
    pub fn sharded_pubsub(&self) -> bool {
        self.cluster.is_some() && self.sharded.load(Ordering::Relaxed)
    }

    fn subscribe_command(&self) -> &'static [u8] {
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
        if unknown && self.sharded_pubsub() {
            tracing::info!(
                "Redis at {} has no sharded pub/sub (before Redis 7): releases are heard through \
                 PUBLISH, which reaches every node of the cluster",
                self.address
            );
            self.sharded.store(false, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Whether `other` names the same server and database (Redlock must not count it twice).
    pub fn same_server(&self, other: &Node) -> bool {
        self.addr == other.addr
            && self.db == other.db
            && self.sentinel == other.sentinel
            && self.cluster == other.cluster
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
            if self.cluster.is_none() {
                return Ok(replies);
            }
            match redirection(&replies) {
                Some(("MOVED", target)) => {
                    tracing::debug!("the lock's slot moved to {target}");
                    *self.route.lock().unwrap_or_else(|p| p.into_inner()) = Some(target);
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
                Connection::connect(target, self.tls.as_ref()),
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
            Ok(Err(refusal)) => Err(self.refused(&refusal)),
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
        match within(timeout, self.exchange_on(taken, commands, timeout, listen)).await {
            Ok(Ok((conn, replies))) => {
                *slot = Some(conn);
                Ok(replies)
            }
            Ok(Err(refusal)) => Err(self.refused(&refusal)),
            Err(e) => {
                // The cluster node may be gone for good (its replica promoted): ask the seeds
                // again at the next connection.
                if self.cluster.is_some() {
                    *self.route.lock().unwrap_or_else(|p| p.into_inner()) = None;
                }
                Err(self.unreachable(&e, timeout))
            }
        }
    }

    async fn exchange_on(
        &self,
        conn: Option<Connection>,
        commands: &[&[&[u8]]],
        timeout: Duration,
        listen: Option<&str>,
    ) -> io::Result<Result<(Connection, Vec<Reply>), String>> {
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
                    return Box::pin(self.exchange_on(None, commands, timeout, listen)).await;
                }
                return Ok(Err(e));
            }
            return Box::pin(self.exchange_on(Some(conn), commands, timeout, listen)).await;
        }
        // Replies to set-up commands come first; a RESP3 SUBSCRIBE is answered by a push,
        // which the connection takes, not by a reply.
        let set_up = batch.len();
        let subscribe: [&[u8]; 2];
        let subscribing = listen.is_some_and(|_| resp3 && !conn.subscribed());
        if let Some(channel) = listen.filter(|_| subscribing) {
            subscribe = [self.subscribe_command(), channel.as_bytes()];
            batch.push(&subscribe);
        }
        batch.extend_from_slice(commands);
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
                return Box::pin(self.exchange_on(None, commands, timeout, listen)).await;
            }
            return Ok(Err(e));
        }
        Ok(Ok((conn, tail)))
    }

    async fn connect(&self, timeout: Duration) -> io::Result<Connection> {
        let timeout = timeout.min(self.connect_timeout);
        if let Some(sentinel) = &self.sentinel {
            let primary = sentinel.primary(timeout).await?;
            return within(timeout, Connection::connect(&primary, None)).await;
        }
        if let Some(seeds) = &self.cluster {
            let known = self.route.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let owner = match known {
                Some(owner) => owner,
                None => {
                    let slot = self.slot.get().copied().unwrap_or(0);
                    let owner = slot_owner(seeds, slot, &self.hello(false), timeout).await?;
                    *self.route.lock().unwrap_or_else(|p| p.into_inner()) = Some(owner.clone());
                    owner
                }
            };
            return within(timeout, Connection::connect(&owner, None)).await;
        }
        within(timeout, Connection::connect(&self.addr, self.tls.as_ref())).await
    }

    /// Drops the idle connection: the next request connects afresh (and, through sentinels,
    /// to whichever server is the primary by then).
    async fn forget(&self) {
        *self.conn.lock().await = None;
    }

    /// Runs a script: EVALSHA, and EVAL when the server does not know it (restarted, flushed);
    /// EVAL also caches it, so that costs one extra round trip once. `listen`: see
    /// [`Node::exchange`].
    pub async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        timeout: Duration,
        listen: Option<&str>,
    ) -> Result<Reply, BackendError> {
        let (reply, _) = self
            .eval_then(script, keys, args, timeout, listen, &[])
            .await?;
        Ok(reply)
    }

    /// [`Node::eval`], with `then` sent right after the script in the same write (`WAIT`,
    /// whose count covers the script's writes): the script's reply, and the replies to `then`.
    pub async fn eval_then(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        timeout: Duration,
        listen: Option<&str>,
        then: &[&[&[u8]]],
    ) -> Result<(Reply, Vec<Reply>), BackendError> {
        let numkeys = keys.len().to_string();
        let mut command: Vec<&[u8]> = vec![b"EVALSHA", script.sha1.as_bytes(), numkeys.as_bytes()];
        command.extend(keys.iter().map(|k| k.as_bytes()));
        command.extend(args.iter().map(|a| a.as_bytes()));
        let mut replies = {
            let mut batch: Vec<&[&[u8]]> = vec![&command];
            batch.extend_from_slice(then);
            self.exchange(&batch, timeout, listen).await?
        };
        if matches!(replies.first(), Some(Reply::Error(e)) if e.starts_with("NOSCRIPT")) {
            command[0] = b"EVAL";
            command[1] = script.source.as_bytes();
            let mut batch: Vec<&[&[u8]]> = vec![&command];
            batch.extend_from_slice(then);
            replies = self.exchange(&batch, timeout, listen).await?;
        }
        let reply = if replies.is_empty() {
            Reply::Array(None)
        } else {
            replies.remove(0)
        };
        match reply {
            Reply::Error(e) => {
                // After a refusal, start afresh: a server that says READONLY may have been
                // demoted, and the sentinels know the new primary.
                self.forget().await;
                Err(self.refused(&e))
            }
            reply => Ok((reply, replies)),
        }
    }

    /// Release messages on `channel`, confirmed by the server when this returns. With RESP3
    /// they come on the command connection, which [`Node::eval`] with `listen` has usually
    /// subscribed already (then `covered` is true: the subscription preceded the last
    /// attempt); with RESP2, on a connection of their own.
    pub async fn subscribe(&self, channel: &str) -> Result<(Subscription<'_>, bool), BackendError> {
        if self.resp3.load(Ordering::Relaxed) {
            let covered = self.listening().await;
            if !covered {
                self.exchange(&[], self.connect_timeout, Some(channel))
                    .await?;
                let subscribed = self.listening().await;
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
            let refusal = refusal(&conn.pipeline(&batch).await?);
            Ok::<_, io::Error>((conn, refusal))
        };
        match within(timeout, attempt).await {
            Ok((conn, None)) => Ok((Subscription::Own(conn, self.address.clone()), false)),
            Ok((_, Some(refusal))) if self.fall_back_from_sharded(&refusal) => {
                Box::pin(self.subscribe(channel)).await
            }
            Ok((_, Some(refusal))) => Err(self.refused(&refusal)),
            Err(e) => Err(self.unreachable(&e, timeout)),
        }
    }

    /// Whether the command connection is subscribed (RESP3).
    async fn listening(&self) -> bool {
        self.conn
            .lock()
            .await
            .as_ref()
            .is_some_and(Connection::subscribed)
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
    async fn next_message(&self) -> Result<(), BackendError> {
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

    fn unreachable(&self, error: &io::Error, timeout: Duration) -> BackendError {
        let address = &self.address;
        // A TLS handshake that failed (certificates, protocol), rather than no connection.
        let handshake = !matches!(
            error.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut | io::ErrorKind::NotFound
        );
        let tls_hint = if self.tls.is_some() && handshake {
            "; check the server's certificate against --tls-ca-cert (or the system's CAs), and \
             --tls-cert/--tls-key if the server wants a client certificate"
        } else {
            ""
        };
        BackendError::Transient(match error.kind() {
            io::ErrorKind::TimedOut => {
                format!("Redis at {address} did not answer within {}", show(timeout))
            }
            _ => format!("cannot reach Redis at {address}: {error}{tls_hint}"),
        })
    }

    /// Turns an error reply into a message that names the server (never its password) and
    /// says whether retrying can help.
    pub fn refused(&self, error: &str) -> BackendError {
        let error = script_error(error);
        let address = &self.address;
        let (code, detail) = error.split_once(' ').unwrap_or((error, ""));
        // A server that is starting, busy with a script, or failing over may answer properly
        // in a moment: worth retrying (while waiting; at first contact it is 69 all the same).
        let failing_over = self.sentinel.is_some() && code == "READONLY";
        if failing_over
            || matches!(
                code,
                "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN"
            )
        {
            return BackendError::Transient(format!("Redis at {address} is not ready: {error}"));
        }
        // An unauthenticated client may not even send a long command: Redis answers with a
        // protocol error instead of NOAUTH.
        let kind = if detail.contains("unauthenticated") {
            "NOAUTH"
        } else {
            code
        };
        let hint = match kind {
            "READONLY" => "; point --url at the primary, not a replica",
            "NOPERM" => {
                "; the Redis user needs EVAL, EVALSHA, PUBLISH and SUBSCRIBE on the lock's keys (see the README's ACL section)"
            }
            "NOAUTH" | "WRONGPASS" => {
                "; the server requires a password: give it in the URL through LOCKED_RUN_URL, or in REDISCLI_AUTH"
            }
            "OOM" => {
                "; the server is out of memory (maxmemory reached): free memory or raise maxmemory"
            }
            "WRONGTYPE" => {
                "; another program uses this key for something else: pick another NAME or remove the key"
            }
            _ => "",
        };
        BackendError::Refused(format!("Redis at {address} refused: {error}{hint}"))
    }
}

/// The error a script's command raised, as Redis 7 and Valkey report it (`READONLY You can't
/// write...`). Redis 6 wraps it: `ERR Error running script (call to f_SHA): @user_script:6:
/// @user_script: 6: -READONLY You can't write...`; its code would otherwise read as `ERR`.
fn script_error(error: &str) -> &str {
    let Some(rest) = error.strip_prefix("ERR Error running script") else {
        return error;
    };
    let mut inner = rest.split_once("): ").map_or(rest, |(_, inner)| inner);
    // "@user_script:6: " and "@user_script: 6: ", as often as they come.
    while let Some(after) = inner.strip_prefix("@user_script") {
        let line = after.trim_start_matches([':', ' ']);
        inner = line.trim_start_matches(|c: char| c.is_ascii_digit());
        inner = inner.strip_prefix(": ").unwrap_or(inner);
    }
    let inner = inner.trim_start_matches('-');
    if inner.is_empty() { error } else { inner }
}

/// A database number as a URL gives it: decimal digits, no sign.
fn database(text: &str) -> Option<i64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse::<u32>().ok().map(i64::from))
        .flatten()
}

/// Refuses query parameters other than `known`: a misspelt `?db=` must not silently mean
/// database 0.
fn known_parameters(parsed: &url::Url, address: &str, known: &[&str]) -> Result<(), String> {
    match parsed
        .query_pairs()
        .find(|(k, _)| !known.contains(&k.as_ref()))
    {
        None => Ok(()),
        Some((k, _)) if known.is_empty() => Err(format!(
            "the Redis URL {address} has a parameter ?{k}=, and redis:// takes none \
             (the database goes in the path: redis://host:port/DB)"
        )),
        Some((k, _)) => Err(format!(
            "the Redis URL {address} has an unknown parameter ?{k}= (known: {})",
            known.join(", ")
        )),
    }
}

fn port_out_of_range(url: &str) -> String {
    format!("{} has a port out of range: use 1 to 65535", shown(url))
}

/// A URL that may not parse, as it may be printed: without a password.
fn shown(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(parsed) => redact(&parsed),
        Err(_) if url.contains('@') => "(a URL with credentials, not shown)".to_owned(),
        Err(_) => format!("{url:?}"),
    }
}

fn bad_url(url: &str) -> String {
    if url.starts_with("file://") {
        return "file:// names the host-local backend (a directory of this host), not a Redis server"
            .into();
    }
    format!(
        "{} is not a supported Redis URL: use redis://[user[:password]@]host[:port][/db], \
         rediss:// (TLS) or redis+unix:///path/to/socket",
        shown(url)
    )
}

/// The sentinels of a `redis+sentinel://` URL and the name of the primary they watch.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sentinel {
    hosts: Vec<(String, u16)>,
    master: String,
}

impl Sentinel {
    /// Asks the sentinels in turn where the primary is, each within its share of `timeout`:
    /// a sentinel that is gone (its host with it: no answer at all) must not leave the others
    /// no time to answer.
    async fn primary(&self, timeout: Duration) -> io::Result<Addr> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no sentinel given");
        let timeout = share(timeout, self.hosts.len());
        for (host, port) in &self.hosts {
            let sentinel = Addr::Tcp {
                host: host.clone(),
                port: *port,
            };
            let ask = async {
                let mut conn = Connection::connect(&sentinel, None).await?;
                conn.command(&[
                    b"SENTINEL",
                    b"get-master-addr-by-name",
                    self.master.as_bytes(),
                ])
                .await
            };
            match within(timeout, ask).await {
                Ok(Reply::Error(e)) => {
                    last = io::Error::other(format!("sentinel {sentinel} refused: {e}"));
                }
                Ok(reply) => match reply.items() {
                    [ip, port] => {
                        if let (Some(host), Some(port)) = (ip.as_text(), port.as_int()) {
                            return Ok(Addr::Tcp {
                                host,
                                port: port as u16,
                            });
                        }
                    }
                    _ => {
                        last = io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "sentinel {sentinel} does not know a primary named {:?}",
                                self.master
                            ),
                        )
                    }
                },
                Err(e) => last = io::Error::new(e.kind(), format!("sentinel {sentinel}: {e}")),
            }
        }
        Err(last)
    }
}

/// Owned commands (`Node::hello`'s) as the argument lists a pipeline takes.
fn as_batch(commands: &[Vec<Vec<u8>>]) -> Vec<Vec<&[u8]>> {
    commands
        .iter()
        .map(|c| c.iter().map(Vec::as_slice).collect())
        .collect()
}

/// The first error among `replies`: what the server refused, if anything.
pub(crate) fn refusal(replies: &[Reply]) -> Option<String> {
    replies.iter().find_map(|r| match r {
        Reply::Error(e) => Some(e.clone()),
        _ => None,
    })
}

/// One of `n` servers asked in turn gets this part of `timeout` (the last part is for the
/// connection to the server they name).
fn share(timeout: Duration, n: usize) -> Duration {
    (timeout / (n as u32 + 1)).max(Duration::from_millis(1))
}

/// The node of a Redis Cluster that owns `slot`, asked of the seeds in turn (CLUSTER SLOTS),
/// after `auth` (the URL's user and password, if any).
async fn slot_owner(
    seeds: &[(String, u16)],
    slot: u16,
    auth: &[Vec<Vec<u8>>],
    timeout: Duration,
) -> io::Result<Addr> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no cluster node given");
    let timeout = share(timeout, seeds.len());
    for (host, port) in seeds {
        let seed = Addr::Tcp {
            host: host.clone(),
            port: *port,
        };
        let ask = async {
            let mut conn = Connection::connect(&seed, None).await?;
            let auth = as_batch(auth);
            let mut batch: Vec<&[&[u8]]> = auth.iter().map(Vec::as_slice).collect();
            let slots: [&[u8]; 2] = [b"CLUSTER", b"SLOTS"];
            batch.push(&slots);
            let replies = conn.pipeline(&batch).await?;
            // A refused AUTH is the answer; else the last reply is CLUSTER SLOTS'.
            let refused = replies.iter().find(|r| matches!(r, Reply::Error(_)));
            refused
                .or(replies.last())
                .cloned()
                .ok_or_else(|| io::Error::other("no reply to CLUSTER SLOTS"))
        };
        match within(timeout, ask).await {
            Ok(Reply::Error(e)) => last = io::Error::other(format!("cluster node {seed}: {e}")),
            Ok(reply) => {
                for range in reply.items() {
                    let items = range.items();
                    let (Some(start), Some(end)) = (
                        items.first().and_then(Reply::as_int),
                        items.get(1).and_then(Reply::as_int),
                    ) else {
                        continue;
                    };
                    if (start..=end).contains(&i64::from(slot)) {
                        let primary = items.get(2).map(Reply::items).unwrap_or_default();
                        if let (Some(ip), Some(port)) = (
                            primary.first().and_then(Reply::as_text),
                            primary.get(1).and_then(Reply::as_int),
                        ) {
                            // An empty address means "the node you asked".
                            let host = if ip.is_empty() { host.clone() } else { ip };
                            return Ok(Addr::Tcp {
                                host,
                                port: port as u16,
                            });
                        }
                    }
                }
                last = io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no node of the cluster owns slot {slot}"),
                );
            }
            Err(e) => last = io::Error::new(e.kind(), format!("cluster node {seed}: {e}")),
        }
    }
    Err(last)
}

/// A MOVED or ASK among the replies: the kind, and where to go.
fn redirection(replies: &[Reply]) -> Option<(&'static str, Addr)> {
    replies.iter().find_map(|reply| {
        let Reply::Error(e) = reply else { return None };
        let mut words = e.split_whitespace();
        let kind = match words.next()? {
            "MOVED" => "MOVED",
            "ASK" => "ASK",
            _ => return None,
        };
        let (host, port) = words.nth(1)?.rsplit_once(':')?;
        Some((
            kind,
            Addr::Tcp {
                host: host.to_owned(),
                port: port.parse().ok()?,
            },
        ))
    })
}

/// CRC16/XMODEM, Redis Cluster's key hash (slot = crc16(tag) mod 16384).
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A sentinel or cluster URL (several hosts) without its password.
fn redact_multi(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (auth, hosts, path) = split_multi(rest);
    let hosts = match auth {
        Some(auth) => match auth.split_once(':') {
            Some((user, _)) if !user.is_empty() => format!("{user}@{hosts}"),
            None if !auth.is_empty() => format!("{auth}@{hosts}"),
            _ => hosts.to_owned(),
        },
        None => hosts.to_owned(),
    };
    format!("{scheme}://{hosts}/{}", path.unwrap_or_default())
}

/// Splits what follows `scheme://` in a sentinel or cluster URL into the user part, the hosts
/// and the path. The user part ends at the last `@`: a password may hold a `/` (a URL should
/// percent-encode it, but secrets get pasted as they are), and it must never be taken for the
/// start of the path, and printed. The hosts end at the first `/` after it.
fn split_multi(rest: &str) -> (Option<&str>, &str, Option<&str>) {
    let (auth, after) = match rest.rsplit_once('@') {
        Some((auth, after)) => (Some(auth), after),
        None => (None, rest),
    };
    match after.split_once('/') {
        Some((hosts, path)) => (auth, hosts, Some(path)),
        None => (auth, after, None),
    }
}

/// Whether `url` carries a password (in its user part or a `pass`/`password` parameter).
pub fn url_has_password(url: &str) -> bool {
    if let Some(rest) = url
        .strip_prefix("redis+sentinel://")
        .or_else(|| url.strip_prefix("redis+cluster://"))
    {
        let (auth, _, _) = split_multi(rest);
        return auth.is_some_and(|auth| auth.split_once(':').is_some_and(|(_, p)| !p.is_empty()));
    }
    url::Url::parse(url).is_ok_and(|u| {
        u.password().is_some() || u.query_pairs().any(|(k, _)| k == "pass" || k == "password")
    })
}

/// The URL with any password removed, so it can be printed.
pub fn redact(url: &url::Url) -> String {
    let mut url = url.clone();
    if url.password().is_some() {
        let _ = url.set_password(None);
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| k != "pass" && k != "password")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if pairs.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
    }
    url.to_string()
}

/// Release messages on one server's channel.
pub enum Subscription<'a> {
    /// On the node's command connection (RESP3).
    Shared(&'a Node),
    /// On a connection of its own (RESP2), and the URL for messages.
    Own(Connection, String),
}

impl Wakeups for Subscription<'_> {
    async fn next(&mut self) -> Result<(), BackendError> {
        match self {
            Subscription::Shared(node) => node.next_message().await,
            Subscription::Own(conn, address) => conn.next_message().await.map_err(|e| {
                BackendError::Transient(format!(
                    "lost the subscription connection to Redis at {address}: {e}"
                ))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(url: &str) -> Result<Node, String> {
        Node::open(url, Duration::from_secs(1), None)
    }

    #[test]
    fn a_default_password_fills_in_only_where_the_url_has_none() {
        let n = Node::open("redis://h", Duration::from_secs(1), Some("fromfile")).unwrap();
        assert_eq!(n.hello(false)[0], [b"AUTH".to_vec(), b"fromfile".to_vec()]);
        let n = Node::open("redis://:inurl@h", Duration::from_secs(1), Some("fromfile")).unwrap();
        assert_eq!(n.hello(false)[0], [b"AUTH".to_vec(), b"inurl".to_vec()]);
    }

    /// Whether the URL itself carries a password (for the warning about `ps`).
    #[test]
    fn passwords_in_urls_are_noticed() {
        assert!(url_has_password("redis://:pw@h"));
        assert!(url_has_password("redis+unix:///s?pass=pw"));
        assert!(!url_has_password("redis://user@h"));
        assert!(!url_has_password("not a url"));
    }

    #[test]
    fn tcp_urls() {
        let n = open("redis://127.0.0.1:6380/2").unwrap();
        assert_eq!(
            n.addr,
            Addr::Tcp {
                host: "127.0.0.1".into(),
                port: 6380
            }
        );
        assert_eq!(
            n.hello(true),
            [
                vec![b"HELLO".to_vec(), b"3".to_vec()],
                vec![b"SELECT".to_vec(), b"2".to_vec()]
            ]
        );
        let n = open("redis://cron:p%40ss@[::1]").unwrap();
        assert_eq!(
            n.addr,
            Addr::Tcp {
                host: "::1".into(),
                port: 6379
            }
        );
        assert_eq!(
            n.hello(false),
            [vec![b"AUTH".to_vec(), b"cron".to_vec(), b"p@ss".to_vec()]]
        );
        assert_eq!(
            n.hello(true)[0],
            [&b"HELLO"[..], b"3", b"AUTH", b"cron", b"p@ss"]
        );
        assert_eq!(n.address(), "redis://cron@[::1]");
        assert!(open("redis://").unwrap_err().contains("no host"));
        assert!(open("redis://h/x").unwrap_err().contains("a database is a number"));
    }

    #[test]
    fn unix_urls() {
        let n = open("redis+unix:///run/redis.sock?db=3&pass=secret").unwrap();
        assert_eq!(n.addr, Addr::Unix("/run/redis.sock".into()));
        assert_eq!(n.hello(false)[0], [b"AUTH".to_vec(), b"secret".to_vec()]);
        assert_eq!(n.hello(false)[1], [b"SELECT".to_vec(), b"3".to_vec()]);
        assert_eq!(
            n.hello(true)[0],
            [&b"HELLO"[..], b"3", b"AUTH", b"default", b"secret"]
        );
        assert_eq!(n.address(), "redis+unix:///run/redis.sock?db=3");
    }

    #[test]
    fn sentinel_urls() {
        let n = open("redis+sentinel://:pw@s1:26380,s2,[::1]:26381/mymaster/2").unwrap();
        let s = n.sentinel.as_ref().unwrap();
        assert_eq!(s.master, "mymaster");
        assert_eq!(
            s.hosts,
            [
                ("s1".to_owned(), 26380),
                ("s2".to_owned(), 26379),
                ("::1".to_owned(), 26381)
            ]
        );
        assert_eq!(n.db, 2);
        assert_eq!(n.hello(false)[0], [b"AUTH".to_vec(), b"pw".to_vec()]);
        assert_eq!(
            n.address(),
            "redis+sentinel://s1:26380,s2,[::1]:26381/mymaster/2"
        );
        assert!(url_has_password("redis+sentinel://:pw@s1/m"));
        assert!(!url_has_password("redis+sentinel://s1/m"));
        assert!(!url_has_password("redis+sentinel://user@s1/m"));
        assert!(open("redis+sentinel://s1").is_err());
        assert!(open("redis+sentinel://s1/").is_err());
    }

    /// A password with a `/` in it (not percent-encoded) is a password, not a path: it is
    /// used, noticed, and never printed, in sentinel and cluster URLs alike.
    #[test]
    fn a_slash_in_a_password_stays_in_the_password() {
        let n = open("redis+sentinel://u:pa/ss@s1:26380/mymaster").unwrap();
        assert_eq!(
            n.hello(false)[0],
            [b"AUTH".to_vec(), b"u".to_vec(), b"pa/ss".to_vec()]
        );
        assert_eq!(n.address(), "redis+sentinel://u@s1:26380/mymaster");
        let n = open("redis+cluster://:pa/ss@n1:7000").unwrap();
        assert_eq!(n.hello(false)[0], [b"AUTH".to_vec(), b"pa/ss".to_vec()]);
        for url in [
            "redis+sentinel://:pa/ss@127.0.0.1:1/m",
            "redis+cluster://:pa/ss@127.0.0.1:1",
        ] {
            assert!(url_has_password(url), "{url}");
            assert!(!redact_multi(url).contains("ss"), "{}", redact_multi(url));
        }
        let bad = open("redis+sentinel://:pa/ss@127.0.0.1:1").unwrap_err();
        assert!(!bad.contains("ss@"), "{bad}");
    }

    #[test]
    fn cluster_urls_and_slots() {
        let n = open("redis+cluster://:pw@n1:7000,n2:7001,n3").unwrap();
        assert_eq!(
            n.cluster.as_deref().unwrap(),
            [
                ("n1".to_owned(), 7000),
                ("n2".to_owned(), 7001),
                ("n3".to_owned(), 6379)
            ]
        );
        assert_eq!(n.address(), "redis+cluster://n1:7000,n2:7001,n3/");
        assert!(url_has_password("redis+cluster://:pw@n1"));
        assert!(
            open("redis+cluster://n1:7000/1")
                .unwrap_err()
                .contains("only database 0")
        );
        // The reference value of CLUSTER KEYSLOT 123456789.
        assert_eq!(crc16(b"123456789") % 16384, 12739);
        let e = Reply::Error("MOVED 3999 127.0.0.1:6381".into());
        assert_eq!(
            redirection(&[Reply::Int(1), e]),
            Some((
                "MOVED",
                Addr::Tcp {
                    host: "127.0.0.1".into(),
                    port: 6381
                }
            ))
        );
    }

    #[test]
    fn redis_6_script_errors_are_unwrapped() {
        assert_eq!(
            script_error(
                "ERR Error running script (call to f_b011): @user_script:6: @user_script: 6: \
                 -READONLY You can't write against a read only replica."
            ),
            "READONLY You can't write against a read only replica."
        );
        assert_eq!(
            script_error(
                "ERR Error running script (call to f_b0): @user_script:18: WRONGTYPE Operation"
            ),
            "WRONGTYPE Operation"
        );
        assert_eq!(script_error("NOPERM this user"), "NOPERM this user");
    }

    #[test]
    fn other_schemes_are_refused_without_showing_passwords() {
        assert!(
            open("http://h")
                .unwrap_err()
                .contains("not a supported Redis URL")
        );
        assert!(!open("ftp://u:hunter2@h").unwrap_err().contains("hunter2"));
        assert!(open("rediss://h").is_ok(), "TLS with the system roots");
        assert!(open("file:///tmp").unwrap_err().contains("host-local"));
        assert!(open("not a url").is_err());
    }
}
