//! The single-server backend: one NAME on one Redis server (plain, TLS, a Unix socket, behind
//! Sentinel or in a Cluster), through the Lua scripts of the protocol. It keeps no lease length
//! of its own: every grant and renewal is given the run's [`Timings`].

use std::cell::{Cell, RefCell};
use std::time::Duration;

use crate::backend::new_token;
use crate::backend::{
    Attempt, Backend, BackendError, Check, Freed, History, KEEP_ALIVE, KEPT, Report, Run, Tenure,
    View, Wakeups, wall_clock_ms,
};
use crate::lease::Timings;
use crate::name::LockName;
use crate::redis::keys::Keys;
use crate::redis::node::Node;
use crate::redis::pubsub::Subscription;
use crate::redis::replies::{as_flag, field, parse_attempt, queued};
use crate::redis::resp::Reply;
use crate::redis::{scripts, semaphore, shared};

/// How long a NAME's history outlives its last run.
pub const HISTORY_OUTLIVES: Duration = Duration::from_secs(30 * 24 * 3600);

/// How long a token given back stays buried: an attempt of it that reaches the server later
/// than this (held up in a proxy, a stalled network) could still take the lock.
pub const BURY_FOR: Duration = Duration::from_secs(600);

/// A lease on one NAME in one Redis server.
pub struct ServerLock {
    pub(super) node: Node,
    pub(super) name: LockName,
    /// The NAME's keys and release channel.
    pub(super) keys: Keys,
    /// Fair waiting (the default; not for Redlock): a waiter keeps a place in the queue.
    fair: bool,
    /// Whether waiters use the queue at all (not on Redlock's servers, whose waiters race).
    queueing: bool,
    /// This lock's last attempt may have joined the queue (or kept its place there): set
    /// before a listening attempt is sent, cleared by a reply that says otherwise.
    pub(super) queued: Cell<bool>,
    /// A request with the current token that could take the lock went unanswered: it may
    /// still land, so the release buries the token (an attempt landing after the release must
    /// not take the lock again for a run that has ended).
    pub(super) stray: Cell<bool>,
    /// `--holders N`: 1 is one holder's layout (`lock:{NAME}`), more a semaphore.
    holders: u32,
    /// `--shared`: held with other shared holders (see `shared`), never beside an exclusive one.
    shared: bool,
    /// The owner's unique token. A token that was given back is buried on the server and
    /// never used again: the run goes on with a fresh one ([`Backend::give_back`]).
    token: RefCell<String>,
    pub(super) host: String,
    pub(super) pid: String,
    pub(super) command: String,
    /// `--wait-replicas`: replicas that must acknowledge a grant, and how long they may take.
    wait_replicas: Option<(u32, Duration)>,
}

impl ServerLock {
    /// A lock on an opened node; `command` is the program name shown to `status`.
    pub fn on(node: Node, name: LockName, command: &str) -> ServerLock {
        node.set_hash_tag(name.as_str());
        // Kept as they are (only printing escapes them), save the tab that separates a
        // semaphore's fields (see `replies::field`).
        let host = field(&crate::backend::hostname());
        ServerLock {
            keys: Keys::of(&name),
            fair: false,
            queueing: true,
            queued: Cell::new(false),
            stray: Cell::new(false),
            holders: 1,
            shared: false,
            node,
            name,
            token: RefCell::new(new_token()),
            host,
            pid: std::process::id().to_string(),
            command: field(command),
            wait_replicas: None,
        }
    }

    /// Requires `replicas` replicas to acknowledge every grant within `timeout` (WAIT): the
    /// answer to a failover that would otherwise promote a replica that never saw the lock.
    pub fn with_wait_replicas(mut self, replicas: u32, timeout: Duration) -> ServerLock {
        self.wait_replicas = Some((replicas, timeout));
        self
    }

    /// Waiters are served in the order they arrived (a queue in the `{NAME}` slot), rather
    /// than racing at every release.
    pub fn with_fair(mut self, fair: bool) -> ServerLock {
        self.fair = fair;
        self
    }

    /// Waiters keep no place in the queue and race at every release, whatever other runs do
    /// (Redlock's servers: its waiters wake on any server's release).
    pub(crate) fn without_queue(mut self) -> ServerLock {
        self.queueing = false;
        self
    }

    /// Up to `holders` runs may hold the lock at once (a semaphore; 1 is one holder).
    pub fn with_holders(mut self, holders: u32) -> ServerLock {
        self.holders = holders;
        self
    }

    /// Held in shared mode (`--shared`).
    pub fn with_shared(mut self, shared: bool) -> ServerLock {
        self.shared = shared;
        self
    }

    /// `--holders N`.
    pub(crate) fn holders(&self) -> u32 {
        self.holders
    }

    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The owner's unique token: the value of `lock:{NAME}` while we hold it.
    pub fn token(&self) -> String {
        self.token.borrow().clone()
    }

    /// Takes `token` as the owner's token from now on (Redlock: one token on every server).
    pub(crate) fn set_token(&self, token: &str) {
        token.clone_into(&mut self.token.borrow_mut());
        self.stray.set(false);
    }

    /// The server's URL without its password.
    pub fn address(&self) -> &str {
        self.node.address()
    }

    /// An attempt; with `listen`, subscribed to release messages before it runs. A grant that
    /// takes half the lease to arrive is worth little: it may take `--connect-timeout` or T/2,
    /// whichever is shorter.
    pub(crate) async fn attempt_listening(
        &self,
        timings: &Timings,
        listen: bool,
    ) -> Result<Attempt, BackendError> {
        let timeout = self.node.connect_timeout().min(timings.ttl / 2);
        self.attempt_within(timings, listen, timeout).await
    }

    /// An attempt that gives up after `timeout` (Redlock's per-server timeout).
    pub(crate) async fn attempt_within(
        &self,
        timings: &Timings,
        listen: bool,
        timeout: Duration,
    ) -> Result<Attempt, BackendError> {
        let since = wall_clock_ms().to_string();
        let ttl_ms = timings.ttl_ms();
        let keep_alive = KEEP_ALIVE.as_millis().to_string();
        // `-n` never queues and never goes before a waiter; a fair waiter queues, and so does
        // a `--no-fair` one that finds the lock busy (it races only other racers).
        let mode = match (listen, self.queueing, self.fair) {
            (false, _, _) => "peek",
            (true, false, _) => "any",
            (true, true, true) => "queue",
            (true, true, false) => "race",
        };
        let token = self.token();
        let channel = self.listen_channel(&token);
        let listen = listen.then_some(channel.as_str());
        // Set before the request leaves: a run interrupted before the reply may hold a place.
        let queued_before = self.queued.replace(mode == "queue" || mode == "race");
        // Both scripts take the same keys and arguments, but the semaphore's takes no holder
        // hash (its metadata lives in holders-meta) and its N after the TTL.
        let limit = self.holders.to_string();
        let every = self.keys.every();
        let head = [token.as_str(), &ttl_ms];
        let tail = [
            &self.host,
            &self.pid,
            &self.command,
            &since,
            mode,
            &keep_alive,
        ];
        let (script, keys, args) = match self.holders {
            _ if self.shared => (
                &shared::ACQUIRE,
                every.to_vec(),
                [&head[..], &tail].concat(),
            ),
            1 => (
                &scripts::ACQUIRE,
                every.to_vec(),
                [&head[..], &tail].concat(),
            ),
            _ => (
                &semaphore::ACQUIRE,
                [&every[..2], &every[3..]].concat(),
                [&head[..], &[limit.as_str()], &tail].concat(),
            ),
        };
        let sent = self.node.eval(script, &keys, &args, timeout, listen).await;
        if matches!(&sent, Err(e) if e.is_unsent()) {
            // The request never left (or met no Redis): it took no place.
            self.queued.set(queued_before);
        }
        let reply = self.sent_astray(sent)?;
        if reply.items().first().and_then(Reply::as_int) == Some(3) {
            // Our own token, buried: every give-back is followed by a fresh token, so only a
            // bug (or another program reusing the token) gets here. Say so, rather than wait.
            return Err(BackendError::Refused(format!(
                "Redis at {} refused lock {}: its token was already given back",
                self.node.address(),
                self.name
            )));
        }
        let attempt = parse_attempt(&reply).ok_or_else(|| self.unexpected(&reply))?;
        self.queued.set(queued(&reply));
        if let (Attempt::Acquired { .. }, Some((replicas, wait))) = (&attempt, self.wait_replicas) {
            self.replicas_acknowledge(replicas, wait).await?;
        }
        Ok(attempt)
    }

    /// WAIT for `replicas` acknowledgements of the grant just made (on the same connection, so
    /// they cover it); too few, and the lock is given back before the error is returned.
    async fn replicas_acknowledge(
        &self,
        replicas: u32,
        wait: Duration,
    ) -> Result<(), BackendError> {
        let (count, ms) = (replicas.to_string(), wait.as_millis().max(1).to_string());
        let timeout = wait + self.node.connect_timeout();
        let acked = match self
            .node
            .exchange(
                &[&[b"WAIT", count.as_bytes(), ms.as_bytes()]],
                timeout,
                None,
            )
            .await
        {
            Ok(replies) => match replies.first() {
                Some(Reply::Error(e)) => Err(self.node.refused(e)),
                Some(reply) => reply.as_int().ok_or_else(|| self.unexpected(reply)),
                None => Err(self.unexpected(&Reply::Array(None))),
            },
            Err(e) => Err(e),
        };
        match acked {
            Ok(acked) if acked >= i64::from(replicas) => Ok(()),
            other => {
                // The grant is given back and its token retired: a WAIT that timed out may
                // leave the give-back unconfirmed, and the next attempt must not be "ours".
                let _ = Backend::give_back(self, self.node.connect_timeout()).await;
                Err(match other {
                    Ok(acked) => BackendError::Refused(format!(
                        "only {acked} of the {replicas} replicas asked for (--wait-replicas) acknowledged lock {} \
                         within {}; it was released. Check the replicas (INFO replication) or lower --wait-replicas",
                        self.name,
                        crate::text::show(wait)
                    )),
                    Err(e) => e,
                })
            }
        }
    }

    /// Extends the lease to a full TTL from now, if it is still ours (compare-and-PEXPIRE).
    ///
    /// With `--wait-replicas`, the renewal counts only once the replicas acknowledged it: WAIT
    /// goes in the same write, and too few acknowledgements make the attempt a failure, so V
    /// moves no further than what a promoted replica would hold. (The primary has extended
    /// its key all the same; that only keeps the lock longer, never shorter.)
    pub(crate) async fn extend_within(
        &self,
        timings: &Timings,
        timeout: Duration,
    ) -> Result<bool, BackendError> {
        let ttl_ms = timings.ttl_ms();
        let k = &self.keys;
        let (script, keys): (_, &[&str]) = match self.holders {
            _ if self.shared => (&shared::RENEW, &[&k.holders, &k.holders_meta, &k.lock]),
            1 => (&scripts::RENEW, &[&k.lock, &k.holder]),
            _ => (&semaphore::RENEW, &[&k.holders, &k.holders_meta]),
        };
        let token = self.token();
        let args = [token.as_str(), ttl_ms.as_str()];
        let Some((replicas, wait)) = self.wait_replicas else {
            let reply = self.node.eval(script, keys, &args, timeout, None).await?;
            return as_flag(&reply).ok_or_else(|| self.unexpected(&reply));
        };
        // Within half the attempt's own time limit: room for the round trip, and a server
        // checks blocked clients' timeouts only so often (Valkey's WAIT overran 3/4).
        let wait = wait.min(timeout / 2).max(Duration::from_millis(1));
        let (count, ms) = (replicas.to_string(), wait.as_millis().to_string());
        let wait_command: [&[u8]; 3] = [b"WAIT", count.as_bytes(), ms.as_bytes()];
        let (reply, then) = self
            .node
            .eval_then(script, keys, &args, timeout, None, &[&wait_command])
            .await?;
        let ours = as_flag(&reply).ok_or_else(|| self.unexpected(&reply))?;
        let acked = match then.first() {
            Some(Reply::Error(e)) => return Err(self.node.refused(e)),
            Some(reply) => reply.as_int().ok_or_else(|| self.unexpected(reply))?,
            None => return Err(self.unexpected(&Reply::Array(None))),
        };
        if ours && acked < i64::from(replicas) {
            return Err(BackendError::Transient(format!(
                "the renewal was acknowledged by only {acked} of the {replicas} replicas asked for \
                 (--wait-replicas) within {}",
                crate::text::show(wait)
            )));
        }
        Ok(ours)
    }

    pub(crate) async fn release_within(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError> {
        let publish = self.publish_command();
        let record = run.map(Run::to_line);
        match self
            .release_script(keep_for, publish, timeout, record.as_deref())
            .await
        {
            // A user the ACL keeps from `history:{NAME}` (Redis 7 checks a script's keys
            // before it runs: nothing was done) is released without it.
            Err(BackendError::Refused(why)) if record.is_some() && why.contains("NOPERM") => {
                tracing::warn!(
                    "Redis at {} refused this user the history key {} ({why}); lock {} is \
                     released without adding the run to its history",
                    self.node.address(),
                    self.keys.history,
                    self.name
                );
                self.release_script(keep_for, publish, timeout, None).await
            }
            released => released,
        }
    }

    /// The release script; `record` (a run's history record) goes in the same call.
    pub(super) async fn release_script(
        &self,
        keep_for: Option<Duration>,
        publish: &str,
        timeout: Duration,
        record: Option<&str>,
    ) -> Result<bool, BackendError> {
        let keep_ms = keep_for.map_or(0, |d| d.as_millis().max(1)).to_string();
        let k = &self.keys;
        let (script, key, meta) = match self.holders {
            _ if self.shared => (&shared::RELEASE, &k.holders, &k.holders_meta),
            1 => (&scripts::RELEASE, &k.lock, &k.holder),
            _ => (&semaphore::RELEASE, &k.holders, &k.holders_meta),
        };
        // The shared release also takes the marker in `lock:{NAME}`; the others ignore it. The
        // history key goes only with a record, so that a user the ACL keeps from it can release.
        let mut keys = vec![
            key.as_str(),
            meta,
            &k.queue,
            &k.queue_alive,
            &k.gone,
            &k.lock,
        ];
        if record.is_some() {
            keys.push(&k.history);
        }
        let token = self.token();
        let bury_ms = match self.stray.get() {
            true => BURY_FOR.as_millis().to_string(),
            false => "0".into(),
        };
        let holders = self.holders.to_string();
        let kept = KEPT.to_string();
        let outlives = HISTORY_OUTLIVES.as_millis().to_string();
        let args = [
            token.as_str(),
            &keep_ms,
            &self.keys.channel,
            publish,
            &bury_ms,
            &holders,
            record.unwrap_or(""),
            &kept,
            &outlives,
        ];
        let reply = self.node.eval(script, &keys, &args, timeout, None).await?;
        as_flag(&reply).ok_or_else(|| self.unexpected(&reply))
    }

    /// How a release is announced: on a Cluster only a sharded channel lives in the lock's slot
    /// (the scripts fall back to PUBLISH on a server without SPUBLISH, Redis 6).
    pub(super) fn publish_command(&self) -> &'static str {
        if self.node.sharded_pubsub() {
            "SPUBLISH"
        } else {
            "PUBLISH"
        }
    }

    /// The channel this run's waiter listens on: its own (`released:{NAME}:TOKEN`, where a
    /// release names it alone when its turn comes, or, for a racer, when it is among the few
    /// racers a release wakes), else the NAME's (`released` messages, for Redlock's waiters,
    /// which keep no place in a queue).
    fn listen_channel(&self, token: &str) -> String {
        match self.queueing {
            true => format!("{}:{token}", self.keys.channel),
            false => self.keys.channel.clone(),
        }
    }

    pub(crate) fn node(&self) -> &Node {
        &self.node
    }

    pub(crate) fn channel(&self) -> &str {
        &self.keys.channel
    }

    /// Release notifications of this server, as a waiter of this lock listens for them.
    pub async fn subscribe_here(&self) -> Result<(Subscription<'_>, bool), BackendError> {
        self.node
            .subscribe(&self.listen_channel(&self.token()))
            .await
    }

    pub(super) fn unexpected(&self, reply: &Reply) -> BackendError {
        // The start of it: a reply may be megabytes long.
        let shown: String = format!("{reply:?}").chars().take(200).collect();
        BackendError::Refused(format!(
            "Redis at {} gave an unexpected answer to the lock script: {shown}",
            self.node.address()
        ))
    }
}

#[async_trait::async_trait(?Send)]
impl Backend for ServerLock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    fn key(&self) -> String {
        self.keys.lock.clone()
    }

    fn token(&self) -> String {
        ServerLock::token(self)
    }

    async fn try_acquire(&self, timings: &Timings, listen: bool) -> Result<Attempt, BackendError> {
        let attempt = self.attempt_listening(timings, listen).await;
        // A holder does not listen: subscribers to a NAME's channels are its waiters.
        if listen && matches!(attempt, Ok(Attempt::Acquired { .. })) {
            self.node.stop_listening().await;
        }
        attempt
    }

    async fn renew(&self, timings: &Timings, timeout: Duration) -> Result<bool, BackendError> {
        self.extend_within(timings, timeout).await
    }

    async fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError> {
        self.release_within(keep_for, timeout, run).await
    }

    async fn subscribe(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError> {
        let (subscription, covered) = self.subscribe_here().await?;
        Ok((Box::new(subscription), covered))
    }

    fn queues(&self) -> bool {
        self.queued.get()
    }

    fn races(&self) -> bool {
        !self.fair
    }

    async fn give_back(&self, timeout: Duration) -> Result<bool, BackendError> {
        let given = self.give_back_within(self.publish_command(), timeout).await;
        self.set_token(&new_token());
        given
    }
}

#[async_trait::async_trait(?Send)]
impl View for ServerLock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    async fn inspect(&self) -> Result<Report, BackendError> {
        let mut report = self.inspect_here().await?;
        // Every waiter of a queueing lock keeps a live place in the queue, which counts them
        // (a dead or stopped one drops out within its keep-alive). Redlock's waiters keep none:
        // there the subscribers are counted, a permission the ACL may deny (PUBSUB): no error.
        if !self.queueing {
            report.waiters = self.waiters().await.ok();
        }
        Ok(report)
    }

    async fn force_release(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        self.force_release_here(token).await
    }

    async fn history(&self, limit: usize) -> Result<History, BackendError> {
        self.history_here(limit).await
    }

    async fn checks(&self) -> Vec<Check> {
        crate::redis::doctor::check_servers(&[self.node()], &self.name).await
    }
}
