//! A client of one etcd cluster over its gRPC API: one HTTP/2 connection at a time (requests,
//! the lease's keep-alive stream and a waiter's watch all share it, each a stream of its own),
//! to the endpoint that answered last. A member that cannot be reached, did not answer in
//! time, answered that it has no leader, or sent a reply past the bounds `grpc` sets, gets its
//! share of the time left, and the request goes on to the next member on a new connection.
//! With a user, its token (`Authenticate`) goes with every request, and is asked for again
//! when etcd says it expired. Safe to share between tasks (`Send + Sync`): no lock of it is
//! held across an await but the async ones that serialise a connect and the keep-alives.

use std::sync::Mutex;
use std::time::Duration;

use prost::Message;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_rustls::TlsConnector;

use super::grpc::call::unary;
use super::grpc::conn::{self, Conn};
use super::grpc::frame::{decode, encode};
use super::grpc::stream::Duplex;
use super::grpc::{FAILED_PRECONDITION, Failed, INVALID_ARGUMENT, Status, UNAUTHENTICATED};
use super::proto::etcdserverpb::{AuthenticateRequest, AuthenticateResponse};
use super::url::{Endpoint, EtcdUrl};
use crate::backend::BackendError;
use crate::endpoints::PasswordFrom;
use crate::text::show;

pub use super::grpc::NOT_FOUND;

/// The connection, the endpoint to ask first, and the user's token.
#[derive(Default)]
struct Shared {
    /// The endpoint to ask first: the last that answered.
    current: usize,
    conn: Option<Conn>,
    /// Connections opened so far (each one's id).
    opened: u64,
    token: Option<String>,
    /// The user was authenticated, or etcd said it has no authentication enabled.
    authenticated: bool,
    /// A request was sent and got neither a reply nor a refusal on its connection (timed out,
    /// its connection lost, answered with a transient error such as etcd's "request timed
    /// out", or sent again elsewhere): it may still reach a member and be applied, later.
    unanswered: bool,
}

/// The open keep-alive stream, which `keepalive.rs` speaks on.
pub struct KeepAlive {
    pub(super) duplex: Duplex,
    /// Keep-alives sent on it and not answered yet.
    pub(super) unanswered: usize,
}

/// One etcd cluster, as the URL names it.
pub struct Client {
    url: EtcdUrl,
    tls: Option<TlsConnector>,
    connect_timeout: Duration,
    shared: Mutex<Shared>,
    /// Held while a connection is being opened: requests that find none wait for the one
    /// being opened rather than open one each.
    connecting: tokio::sync::Mutex<()>,
    /// The lease's keep-alive stream (see `keepalive.rs`).
    pub(super) keepalive: tokio::sync::Mutex<Option<KeepAlive>>,
}

impl Client {
    pub fn new(url: EtcdUrl, tls: Option<TlsConnector>, connect_timeout: Duration) -> Client {
        Client {
            url,
            tls,
            connect_timeout,
            shared: Mutex::new(Shared::default()),
            connecting: tokio::sync::Mutex::new(()),
            keepalive: tokio::sync::Mutex::new(None),
        }
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a request of this client was sent and went unanswered: it may still land (a
    /// take that creates a key on the holding lease, after the run released).
    pub(super) fn unanswered(&self) -> bool {
        self.shared().unanswered
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The URL without its password, for messages.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// The user the URL names, if any (never its password).
    pub fn user(&self) -> Option<&str> {
        self.url.user.as_deref()
    }

    /// One client per endpoint of the URL, with the same TLS and timeout, for checks member
    /// by member (`doctor`); `with_user` keeps the URL's user and password.
    pub fn each_endpoint(&self, with_user: bool) -> Vec<(String, Client)> {
        let mut url = self.url.clone();
        if !with_user {
            url.user = None;
            url.password = None;
            url.password_from = None;
        }
        self.url
            .endpoints
            .iter()
            .map(|endpoint| {
                let one = EtcdUrl {
                    endpoints: vec![endpoint.clone()],
                    ..url.clone()
                };
                let client = Client::new(one, self.tls.clone(), self.connect_timeout);
                (endpoint.to_string(), client)
            })
            .collect()
    }

    /// Signs the URL's user in now (a no-op without a user): true when etcd gave a token,
    /// false when it has authentication off.
    pub async fn sign_in(&self, deadline: Instant) -> Result<bool, BackendError> {
        self.authenticate(deadline).await?;
        Ok(self.shared().token.is_some())
    }

    pub(super) fn endpoint(&self, i: usize) -> &Endpoint {
        &self.url.endpoints[i % self.url.endpoints.len()]
    }

    pub(super) fn members(&self) -> usize {
        self.url.endpoints.len()
    }

    pub(super) fn token(&self) -> Option<String> {
        self.shared().token.clone()
    }

    /// The request `path` (`/etcdserverpb.KV/Txn`, ...) with `request`, by `deadline`: the
    /// reply, or the error etcd answered (`Ok(Err(status))`); transient errors and no answer
    /// are `Err`.
    pub async fn call<Q: Message, A: Message + Default>(
        &self,
        path: &str,
        request: &Q,
        deadline: Instant,
    ) -> Result<Result<A, Status>, BackendError> {
        let mut renewed_token = false;
        loop {
            self.authenticate(deadline).await?;
            let answer = self.exchange(path, request, deadline).await?;
            return match answer {
                Ok(reply) => Ok(Ok(reply)),
                // A token expires after a while unused (--auth-token-ttl): ask for another.
                Err(status) if self.expired(&status) && !renewed_token => {
                    renewed_token = true;
                    continue;
                }
                Err(status) => Ok(Err(status)),
            };
        }
    }

    /// [`Client::call`], with every error etcd may answer taken as a refusal.
    pub async fn must<Q: Message, A: Message + Default>(
        &self,
        path: &str,
        request: &Q,
        deadline: Instant,
    ) -> Result<A, BackendError> {
        self.call(path, request, deadline)
            .await?
            .map_err(|status| self.refused(&status))
    }

    /// Whether `status` says the user's token expired: forgotten, for a new one.
    pub(super) fn expired(&self, status: &Status) -> bool {
        if status.code != UNAUTHENTICATED || self.url.user.is_none() {
            return false;
        }
        let mut shared = self.shared();
        shared.token = None;
        shared.authenticated = false;
        true
    }

    /// An error etcd answered, as a refusal naming the cluster.
    pub fn refused(&self, status: &Status) -> BackendError {
        let message = match status.code {
            INVALID_ARGUMENT if status.message.contains("user name is empty") => {
                crate::text::message!(
                    "etcd at {} requires a user: give it in the URL (etcd://USER@HOST), the \
                 password in --password-file or REDISCLI_AUTH",
                    self.url()
                )
            }
            _ => crate::text::message!("etcd at {} refused: {}", self.url(), status.message),
        };
        BackendError::Refused(message)
    }

    /// Authenticates the URL's user, unless done already (or there is none).
    async fn authenticate(&self, deadline: Instant) -> Result<(), BackendError> {
        let Some(user) = &self.url.user else {
            return Ok(());
        };
        if self.shared().authenticated {
            return Ok(());
        }
        let Some(password) = &self.url.password else {
            return Err(BackendError::Refused(format!(
                "etcd user {user} has no password: give it in the URL, --password-file or \
                 REDISCLI_AUTH"
            )));
        };
        let request = AuthenticateRequest {
            name: user.clone(),
            password: password.clone(),
        };
        let path = "/etcdserverpb.Auth/Authenticate";
        match self
            .exchange::<_, AuthenticateResponse>(path, &request, deadline)
            .await?
        {
            Ok(reply) => self.shared().token = Some(reply.token),
            // Authentication is not enabled: requests go without a token.
            Err(status) if status.code == FAILED_PRECONDITION => {
                tracing::debug!("etcd at {}: {}", self.url(), status.message);
            }
            Err(status) if status.code == INVALID_ARGUMENT => {
                let from = self
                    .url
                    .password_from
                    .as_ref()
                    .unwrap_or(&PasswordFrom::Url);
                return Err(BackendError::Refused(format!(
                    "the password from {from} was refused (authentication failed) by etcd at {} \
                     (as user {user}): check it against the user's password in etcd",
                    self.url()
                )));
            }
            Err(status) => return Err(self.refused(&status)),
        }
        self.shared().authenticated = true;
        Ok(())
    }

    /// One request, on the connection (a new one if there is none, or if it turns out
    /// closed): etcd's answer. A member that fails, goes silent or answers a transient error
    /// gets its share of the time left, and the request goes on to the next member.
    async fn exchange<Q: Message, A: Message + Default>(
        &self,
        path: &str,
        request: &Q,
        deadline: Instant,
    ) -> Result<Result<A, Status>, BackendError> {
        let message = encode(request);
        let members = self.members();
        let mut tried = 0;
        let mut fresh_retry = true;
        let mut sent = false;
        loop {
            // Nothing was sent yet: a cluster that cannot be reached was asked nothing.
            let (conn, reused) = self.conn(deadline).await.map_err(|e| e.unsent_if(!sent))?;
            sent = true;
            let token = self.token();
            let left = deadline.saturating_duration_since(Instant::now());
            let share = Instant::now() + left / (members - tried).max(1) as u32;
            let exchanged =
                timeout_at(share, unary(&conn, path, message.clone(), token.as_deref())).await;
            // Anything but a reply or a refusal leaves the request possibly on its way: etcd's
            // own "request timed out" (a transient status) may still be applied later.
            if !matches!(&exchanged, Ok(Ok(Ok(_))))
                && !matches!(&exchanged, Ok(Ok(Err(status))) if !status.transient())
            {
                self.shared().unanswered = true;
            }
            let lost = match exchanged {
                Ok(Ok(Ok(reply))) => {
                    self.answered(&conn);
                    return match decode::<A>(reply) {
                        Ok(reply) => Ok(Ok(reply)),
                        Err(failed) => Err(self.failed(&conn, &failed)),
                    };
                }
                Ok(Ok(Err(status))) if status.transient() => {
                    self.drop_conn(&conn);
                    BackendError::Transient(crate::text::message!(
                        "etcd at {} answered: {}",
                        self.endpoint(conn.at),
                        status.message
                    ))
                }
                Ok(Ok(Err(status))) => {
                    self.answered(&conn);
                    return Ok(Err(status));
                }
                // A connection the member closed meanwhile (a restart, an idle timeout): once
                // more on a new one. Every request of this backend may be sent twice.
                Ok(Err(failed)) if reused && fresh_retry && failed.lost_connection() => {
                    fresh_retry = false;
                    self.drop_conn(&conn);
                    continue;
                }
                Ok(Err(failed)) => self.failed(&conn, &failed),
                Err(_) => self.lost(&conn, "no answer in time"),
            };
            tried += 1;
            if tried >= members || Instant::now() >= deadline {
                return Err(lost);
            }
            tracing::debug!("{lost}: asking the next member");
        }
    }

    /// The connection, opened if there is none (or it closed), and whether it was open
    /// already.
    pub(super) async fn conn(&self, deadline: Instant) -> Result<(Conn, bool), BackendError> {
        if let Some(conn) = self.open_conn() {
            return Ok((conn, true));
        }
        let _connecting = match timeout_at(deadline, self.connecting.lock()).await {
            Ok(guard) => guard,
            Err(_) => {
                return Err(BackendError::Transient(
                    "cannot reach etcd: no time left to connect".into(),
                ));
            }
        };
        // Opened by another request while this one waited.
        if let Some(conn) = self.open_conn() {
            return Ok((conn, true));
        }
        let conn = self.connect(deadline).await?;
        self.shared().conn = Some(conn.clone());
        Ok((conn, false))
    }

    /// Whether connection `id` is the one requests go on, and still open: a stream on another
    /// (a watch opened before a fail-over) hears nothing more.
    pub(super) fn is_current(&self, id: u64) -> bool {
        self.shared()
            .conn
            .as_ref()
            .is_some_and(|c| c.id == id && !c.is_closed())
    }

    fn open_conn(&self) -> Option<Conn> {
        let mut shared = self.shared();
        match &shared.conn {
            Some(conn) if !conn.is_closed() => Some(conn.clone()),
            Some(_) => {
                shared.conn = None;
                None
            }
            None => None,
        }
    }

    /// A connection that answered: its endpoint is asked first from now on.
    fn answered(&self, conn: &Conn) {
        self.shared().current = conn.at;
    }

    /// Gives up `conn` (unless another replaced it): it is closed, with every stream on it,
    /// and the next endpoint is asked first.
    pub(super) fn drop_conn(&self, conn: &Conn) {
        conn.close();
        let mut shared = self.shared();
        if shared.conn.as_ref().is_some_and(|c| c.id == conn.id) {
            shared.conn = None;
        }
        if shared.current == conn.at {
            shared.current = (conn.at + 1) % self.url.endpoints.len();
        }
    }

    /// A connection that failed or went silent: the next request goes to the next endpoint.
    pub(super) fn lost(&self, conn: &Conn, why: &str) -> BackendError {
        self.drop_conn(conn);
        BackendError::Transient(format!("etcd at {}: {why}", self.endpoint(conn.at)))
    }

    /// A reply that could not be read (too large, malformed, cut off, reset), as a
    /// connection lost: the next request goes to the next endpoint, on a new connection.
    pub(super) fn failed(&self, conn: &Conn, failed: &Failed) -> BackendError {
        self.drop_conn(conn);
        failed.line(self.endpoint(conn.at))
    }

    /// A new connection, to the first endpoint that takes one: each in turn from the one
    /// that answered last, each within its share of what is left of the connect timeout.
    async fn connect(&self, deadline: Instant) -> Result<Conn, BackendError> {
        let n = self.url.endpoints.len();
        let first = self.shared().current;
        let until = deadline.min(Instant::now() + self.connect_timeout);
        let mut failures = Vec::new();
        for k in 0..n {
            let at = (first + k) % n;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let share = left / (n - k) as u32;
            let id = {
                let mut shared = self.shared();
                shared.opened += 1;
                shared.opened
            };
            let endpoint = self.endpoint(at);
            match timeout(share, conn::open(endpoint, at, id, self.tls.as_ref())).await {
                Ok(Ok(conn)) => {
                    self.shared().current = at;
                    return Ok(conn);
                }
                Ok(Err(e)) => failures.push(format!("{endpoint}: {e}")),
                Err(_) => {
                    failures.push(format!("{endpoint}: no connection within {}", show(share)))
                }
            }
        }
        if failures.is_empty() {
            failures.push("no time left to connect".into());
        }
        Err(BackendError::Transient(format!(
            "cannot reach etcd ({})",
            failures.join("; ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library's `Lock` moves into `tokio::spawn` on a multi-thread runtime: the client
    /// and what its requests await must be `Send` (and the client `Sync`, shared by them).
    #[test]
    fn the_client_and_its_requests_are_send() {
        fn sync<T: Send + Sync>(_: &T) {}
        fn send<T: Send>(_: T) {}
        let url = super::super::url::parse("etcd://127.0.0.1:1").unwrap();
        let client = Client::new(url, None, Duration::from_secs(1));
        sync(&client);
        let request = super::super::proto::etcdserverpb::RangeRequest::default();
        let deadline = Instant::now();
        send(
            client.call::<_, super::super::proto::etcdserverpb::RangeResponse>(
                "/etcdserverpb.KV/Range",
                &request,
                deadline,
            ),
        );
        send(client.keep_alive(&[1], deadline));
    }
}
