//! A client of etcd's JSON gateway (the gRPC gateway every etcd v3 member serves under `/v3/`)
//! over HTTP/1.1 with hyper: up to two kept-alive connections for requests (a woken waiter
//! sends two at once) and one per watch. The gateway takes HTTP/1.1 only where etcd serves
//! without TLS: every HTTP/2 connection on that port goes to its gRPC server. The
//! cluster's endpoints are tried in turn when one cannot be reached, did not answer in time, or
//! sent a reply past the bounds `reply.rs` sets, and the one that answered is asked first from
//! then on. With a user, its token (`/v3/auth/authenticate`) goes in the `Authorization`
//! header, and is asked for again when etcd says it expired.

use std::cell::{Cell, RefCell};
use std::io;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};
use tokio_rustls::TlsConnector;

use super::reply::{self, Failed, exchange};
use super::url::{Endpoint, EtcdUrl};
use crate::backend::BackendError;
use crate::endpoints::PasswordFrom;
use crate::text::show;

use super::wire::{FAILED_PRECONDITION, UNAUTHENTICATED};
pub use super::wire::{INVALID_ARGUMENT, NOT_FOUND, Status};

type Sender = SendRequest<Full<Bytes>>;

/// How many idle connections a client keeps: two requests may be in flight at once (a woken
/// waiter's keep-alive and its read), each on a connection that is open already.
const KEPT_CONNECTIONS: usize = 2;

/// A watch's response, streaming, and what keeps its connection open.
pub struct Stream {
    pub body: Incoming,
    _sender: Sender,
    /// The endpoint that answered.
    pub at: String,
}

/// One etcd cluster, as the URL names it.
pub struct Client {
    url: EtcdUrl,
    tls: Option<TlsConnector>,
    connect_timeout: Duration,
    /// The endpoint to ask first: the last that answered.
    current: Cell<usize>,
    /// The kept-alive connections for requests, and their endpoints; each taken out while in
    /// use, at most [`KEPT_CONNECTIONS`].
    idle: RefCell<Vec<(usize, Sender)>>,
    /// The user's token, once authenticated.
    token: RefCell<Option<String>>,
    /// The user was authenticated, or etcd said it has no authentication enabled.
    authenticated: Cell<bool>,
}

impl Client {
    pub fn new(url: EtcdUrl, tls: Option<TlsConnector>, connect_timeout: Duration) -> Client {
        Client {
            url,
            tls,
            connect_timeout,
            current: Cell::new(0),
            idle: RefCell::new(Vec::new()),
            token: RefCell::new(None),
            authenticated: Cell::new(false),
        }
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
        Ok(self.token.borrow().is_some())
    }

    /// `GET path` (`/version`, `/health`: plain HTTP, outside the gateway) on a connection of
    /// its own: the JSON answered.
    pub async fn get(&self, path: &str, deadline: Instant) -> Result<Value, BackendError> {
        let (at, mut sender) = self.connect(deadline).await.map_err(BackendError::unsent)?;
        let request = Request::get(path)
            .header(HOST, self.endpoint(at).to_string())
            .body(Full::new(Bytes::new()))
            .map_err(|e| BackendError::Refused(format!("cannot send a request to etcd: {e}")))?;
        let exchanged = timeout_at(deadline, exchange(&mut sender, request)).await;
        match exchanged {
            Ok(Ok((status, body))) => match self.answer(at, path, status, &body)? {
                Ok(json) => Ok(json),
                Err(status) => Err(self.refused(&status)),
            },
            Ok(Err(failed)) => Err(self.failed(at, &failed)),
            Err(_) => Err(self.lost(at, "no answer in time")),
        }
    }

    fn endpoint(&self, i: usize) -> &Endpoint {
        &self.url.endpoints[i % self.url.endpoints.len()]
    }

    /// POSTs `body` to `path` (`/v3/kv/txn`, ...) by `deadline`: the reply, or the error etcd
    /// answered (`Ok(Err(status))`); transient errors and no answer are `Err`.
    pub async fn call(
        &self,
        path: &str,
        body: &Value,
        deadline: Instant,
    ) -> Result<Result<Value, Status>, BackendError> {
        let mut renewed_token = false;
        loop {
            self.authenticate(deadline).await?;
            let (at, answer) = self.post(path, body, deadline).await?;
            return match answer {
                Ok(reply) => Ok(Ok(reply)),
                // A token expires after a while unused (--auth-token-ttl): ask for another.
                Err(status)
                    if status.code == UNAUTHENTICATED
                        && self.url.user.is_some()
                        && !renewed_token =>
                {
                    renewed_token = true;
                    self.token.replace(None);
                    self.authenticated.set(false);
                    continue;
                }
                Err(status) if status.transient() => {
                    self.move_on_from(at);
                    Err(BackendError::Transient(format!(
                        "etcd at {} answered: {}",
                        self.endpoint(at),
                        status.message
                    )))
                }
                Err(status) => Ok(Err(status)),
            };
        }
    }

    /// [`Client::call`], with every error etcd may answer taken as a refusal.
    pub async fn must(
        &self,
        path: &str,
        body: &Value,
        deadline: Instant,
    ) -> Result<Value, BackendError> {
        self.call(path, body, deadline)
            .await?
            .map_err(|status| self.refused(&status))
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

    /// Opens a streaming response (a watch) on a connection of its own.
    pub async fn stream(
        &self,
        path: &str,
        body: &Value,
        deadline: Instant,
    ) -> Result<Stream, BackendError> {
        self.authenticate(deadline).await?;
        let (at, mut sender) = self.connect(deadline).await.map_err(BackendError::unsent)?;
        let request = self.request(at, path, body)?;
        let sent = timeout_at(deadline, async {
            sender.ready().await?;
            sender.send_request(request).await
        })
        .await;
        let response = match sent {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(self.failed(at, &Failed::Http(e))),
            Err(_) => return Err(self.lost(at, "no answer in time")),
        };
        if response.status() != StatusCode::OK {
            let status = response.status();
            let body = match timeout_at(deadline, reply::body(response)).await {
                Ok(Ok(body)) => body,
                Ok(Err(failed)) => return Err(self.failed(at, &failed)),
                Err(_) => return Err(self.lost(at, "no answer in time")),
            };
            return Err(match self.answer(at, path, status, &body)? {
                Ok(_) => self.unexpected(at, path, &body),
                Err(status) => self.refused(&status),
            });
        }
        Ok(Stream {
            body: response.into_body(),
            _sender: sender,
            at: self.endpoint(at).to_string(),
        })
    }

    /// Authenticates the URL's user, unless done already (or there is none).
    async fn authenticate(&self, deadline: Instant) -> Result<(), BackendError> {
        let (Some(user), false) = (&self.url.user, self.authenticated.get()) else {
            return Ok(());
        };
        let Some(password) = &self.url.password else {
            return Err(BackendError::Refused(format!(
                "etcd user {user} has no password: give it in the URL, --password-file or \
                 REDISCLI_AUTH"
            )));
        };
        let body = json!({"name": user, "password": password});
        let (at, answer) = self.post("/v3/auth/authenticate", &body, deadline).await?;
        match answer {
            Ok(reply) => {
                let token = reply["token"].as_str().map(str::to_owned);
                self.token.replace(token);
            }
            // Authentication is not enabled: requests go without a token.
            Err(status) if status.code == FAILED_PRECONDITION => {
                tracing::debug!("etcd at {}: {}", self.endpoint(at), status.message);
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
            Err(status) if status.transient() => {
                self.move_on_from(at);
                return Err(BackendError::Transient(format!(
                    "etcd at {} answered: {}",
                    self.endpoint(at),
                    status.message
                )));
            }
            Err(status) => return Err(self.refused(&status)),
        }
        self.authenticated.set(true);
        Ok(())
    }

    /// One request on the kept-alive connection (a new one if there is none, or if the kept
    /// one turns out closed); the endpoint that answered, and its answer. A member that fails
    /// or goes silent gets its share of the time left, and the request goes on to the next
    /// member: one hung member must not cost a run while the others answer.
    async fn post(
        &self,
        path: &str,
        body: &Value,
        deadline: Instant,
    ) -> Result<(usize, Result<Value, Status>), BackendError> {
        let kept = self.kept();
        let (mut at, mut sender, mut reused) = match kept {
            Some((at, sender)) => (at, sender, true),
            // Nothing was sent yet: a cluster that cannot be reached was asked nothing.
            None => {
                let (at, sender) = self.connect(deadline).await.map_err(BackendError::unsent)?;
                (at, sender, false)
            }
        };
        let members = self.url.endpoints.len();
        let mut tried = 0;
        loop {
            let request = self.request(at, path, body)?;
            let left = deadline.saturating_duration_since(Instant::now());
            let share = Instant::now() + left / (members - tried).max(1) as u32;
            let exchanged = timeout_at(share, exchange(&mut sender, request)).await;
            match exchanged {
                Ok(Ok((status, bytes))) => {
                    self.keep(at, sender);
                    return Ok((at, self.answer(at, path, status, &bytes)?));
                }
                // A kept-alive connection the server closed meanwhile: once more on a new
                // one. Every request of this backend may be sent twice (see `lock`).
                Ok(Err(Failed::Http(_))) if reused => {
                    (at, sender) = self.connect(deadline).await?;
                    reused = false;
                }
                failed => {
                    let lost = match failed {
                        Ok(Err(failed)) => self.failed(at, &failed),
                        _ => self.lost(at, "no answer in time"),
                    };
                    tried += 1;
                    if tried >= members || Instant::now() >= deadline {
                        return Err(lost);
                    }
                    tracing::debug!("{lost}: asking the next member");
                    (at, sender) = self.connect(deadline).await?;
                    reused = false;
                }
            }
        }
    }

    fn request(
        &self,
        at: usize,
        path: &str,
        body: &Value,
    ) -> Result<Request<Full<Bytes>>, BackendError> {
        // `hasleader` (gRPC metadata, through the gateway): a member cut off from its leader
        // answers "no leader" at once, and cancels its watches, rather than hang (a request
        // then moves on to another member).
        let mut request = Request::post(path)
            .header(HOST, self.endpoint(at).to_string())
            .header(CONTENT_TYPE, "application/json")
            .header("grpc-metadata-hasleader", "true");
        if let Some(token) = &*self.token.borrow() {
            request = request.header(AUTHORIZATION, token.as_str());
        }
        request
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| BackendError::Refused(format!("cannot send a request to etcd: {e}")))
    }

    /// A reply's status and body: JSON for a 200, else the error etcd answered; a reply that
    /// is not etcd's (a 404 from another server, or a member without its gateway) is refused.
    fn answer(
        &self,
        at: usize,
        path: &str,
        status: StatusCode,
        body: &[u8],
    ) -> Result<Result<Value, Status>, BackendError> {
        let json: Option<Value> = serde_json::from_slice(body).ok();
        if status == StatusCode::OK {
            return json.map(Ok).ok_or_else(|| self.unexpected(at, path, body));
        }
        if let Some(status) = json.as_ref().and_then(Status::of) {
            return Ok(Err(status));
        }
        let at = self.endpoint(at);
        Err(match status {
            StatusCode::NOT_FOUND => BackendError::Refused(format!(
                "{at} answered 404 to {path}: not an etcd v3 member, or its JSON gateway is \
                 off (--enable-grpc-gateway)"
            )),
            s if s.is_server_error() => {
                BackendError::Transient(format!("etcd at {at} answered HTTP {s}"))
            }
            s => BackendError::Refused(format!("etcd at {at} answered HTTP {s} to {path}")),
        })
    }

    fn unexpected(&self, at: usize, path: &str, body: &[u8]) -> BackendError {
        let mut text = String::from_utf8_lossy(body).into_owned();
        text.truncate(200);
        BackendError::Refused(format!(
            "{} gave an answer to {path} that is not etcd's: {text:?}",
            self.endpoint(at)
        ))
    }

    /// A connection that failed or went silent: the next request goes to the next endpoint.
    fn lost(&self, at: usize, why: &str) -> BackendError {
        self.move_on_from(at);
        BackendError::Transient(format!("etcd at {}: {why}", self.endpoint(at)))
    }

    /// A reply that could not be read (too large, malformed, cut off), as a connection lost:
    /// the next request goes to the next endpoint, on a new connection.
    fn failed(&self, at: usize, failed: &Failed) -> BackendError {
        self.move_on_from(at);
        failed.line(self.endpoint(at))
    }

    fn move_on_from(&self, at: usize) {
        if self.current.get() == at {
            self.current.set((at + 1) % self.url.endpoints.len());
        }
        self.idle.borrow_mut().clear();
    }

    /// An idle connection still open, if any.
    fn kept(&self) -> Option<(usize, Sender)> {
        let mut idle = self.idle.borrow_mut();
        while let Some((at, sender)) = idle.pop() {
            if !sender.is_closed() {
                return Some((at, sender));
            }
        }
        None
    }

    /// Keeps a connection that answered for the next request, unless enough are kept; one to
    /// an endpoint that is no longer the one to ask first goes.
    fn keep(&self, at: usize, sender: Sender) {
        let mut idle = self.idle.borrow_mut();
        if at == self.current.get() && idle.len() < KEPT_CONNECTIONS {
            idle.push((at, sender));
        }
    }

    /// Opens connections until [`KEPT_CONNECTIONS`] are idle, off the path of a request (a
    /// waiter, as it settles down to wait): a connection that cannot be opened now is opened
    /// when a request needs it.
    pub async fn warm(&self, deadline: Instant) {
        loop {
            let before = self.idle.borrow().len();
            if before >= KEPT_CONNECTIONS {
                return;
            }
            match self.connect(deadline).await {
                Ok((at, sender)) => self.keep(at, sender),
                Err(_) => return,
            }
            if self.idle.borrow().len() == before {
                return;
            }
        }
    }

    /// A new connection, to the first endpoint that takes one: each in turn from the one
    /// that answered last, each within its share of what is left of the connect timeout.
    async fn connect(&self, deadline: Instant) -> Result<(usize, Sender), BackendError> {
        let n = self.url.endpoints.len();
        let first = self.current.get();
        let until = deadline.min(Instant::now() + self.connect_timeout);
        let mut failures = Vec::new();
        for k in 0..n {
            let at = (first + k) % n;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let share = left / (n - k) as u32;
            match timeout(share, self.open(self.endpoint(at))).await {
                Ok(Ok(sender)) => {
                    self.current.set(at);
                    return Ok((at, sender));
                }
                Ok(Err(e)) => failures.push(format!("{}: {e}", self.endpoint(at))),
                Err(_) => failures.push(format!(
                    "{}: no connection within {}",
                    self.endpoint(at),
                    show(share)
                )),
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

    async fn open(&self, endpoint: &Endpoint) -> io::Result<Sender> {
        let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
        stream.set_nodelay(true)?;
        match &self.tls {
            Some(tls) => {
                let name = rustls_pki_types::ServerName::try_from(endpoint.host.clone())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                handshake(tls.connect(name, stream).await?).await
            }
            None => handshake(stream).await,
        }
    }
}

/// HTTP/1.1 on an open stream; the connection is driven by a task of its own, which ends
/// with the connection.
async fn handshake<T>(io: T) -> io::Result<Sender>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}
