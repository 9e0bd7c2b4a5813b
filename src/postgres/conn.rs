//! One connection to a PostgreSQL server: TCP (or the server's Unix socket), TLS negotiated as
//! `sslmode` asks, every byte read through the framing bound (`frames`), the start-up and
//! authentication by tokio-postgres, and a task that drives it: it keeps the notifications a
//! waiter listens for (a bounded handful: each only shortens a wait) and counts the warnings
//! that say a commit's wait for the synchronous standby was cancelled (such a commit is no
//! acknowledgement). Queries go as simple-protocol strings (one round trip for a whole
//! transaction, no prepared statement a transaction-pooling PgBouncer would lose), and what
//! comes back is bounded in rows.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc;
use tokio_postgres::{AsyncMessage, NoTls, SimpleQueryMessage, SimpleQueryStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::frames::{Bounded, Refusal};
use super::url::{Host, SslMode};

/// The most rows one query may return (the lock's own queries return far fewer).
pub const MAX_ROWS: usize = 10_000;

/// One row of a simple query: each column's text, or NULL.
pub type Row = Vec<Option<String>>;

/// A byte stream to the server: plain, TLS, or a Unix socket.
pub enum Stream {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Stream::Tcp($s) => $e,
            Stream::Tls($s) => $e,
            Stream::Unix($s) => $e,
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        each!(self, s => Pin::new(s).poll_write(cx, b))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, s => Pin::new(s).poll_shutdown(cx))
    }
}

/// What a connection needs: who logs in, to which database, with which TLS.
#[derive(Clone)]
pub struct Login {
    pub user: String,
    pub dbname: String,
    pub application_name: String,
    pub sslmode: SslMode,
    pub tls: Option<TlsConnector>,
}

/// Why a query or a connection failed.
#[derive(Debug)]
pub enum PgError {
    /// The server's error, with its SQLSTATE.
    Db { code: String, message: String },
    /// No usable answer: a connection refused, reset or closed, or a reply refused by the
    /// framing bound (then the reason says "too large" or "malformed").
    Io(String),
    /// The server refused the connection's set-up: TLS, the password, the database.
    Setup(String),
}

/// What the driving task shares with the connection.
struct Shared {
    refusal: Refusal,
    /// How many commits' waits for the synchronous standby were cancelled.
    unconfirmed: AtomicU64,
}

/// An open connection.
pub struct Conn {
    client: tokio_postgres::Client,
    shared: Arc<Shared>,
    driver: tokio::task::JoinHandle<()>,
    notifications: tokio::sync::Mutex<mpsc::Receiver<String>>,
    pub host: Host,
    pub tls: bool,
    /// The channel this connection LISTENs on, once the server confirmed it.
    pub listening: std::cell::RefCell<Option<String>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The request that asks the server for TLS (protocol 3.0's SSLRequest).
const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];

/// Connects to `host` and logs in, within `timeout`.
pub async fn connect(
    host: &Host,
    login: &Login,
    password: Option<&str>,
    timeout: Duration,
) -> Result<Conn, PgError> {
    match tokio::time::timeout(timeout, connect_now(host, login, password)).await {
        Ok(connected) => connected,
        Err(_) => Err(PgError::Io(crate::text::message!(
            "no connection within {} (--connect-timeout)",
            crate::text::show(timeout)
        ))),
    }
}

async fn connect_now(host: &Host, login: &Login, password: Option<&str>) -> Result<Conn, PgError> {
    let io = |e: io::Error| PgError::Io(e.to_string());
    let (stream, tls) = match host {
        Host::Unix(dir, port) => {
            let path = dir.join(format!(".s.PGSQL.{port}"));
            (
                Stream::Unix(UnixStream::connect(&path).await.map_err(io)?),
                false,
            )
        }
        Host::Tcp(name, port) => {
            let tcp = TcpStream::connect((name.as_str(), *port))
                .await
                .map_err(io)?;
            let _ = tcp.set_nodelay(true);
            negotiate(tcp, name, login).await?
        }
    };
    let refusal = Refusal::default();
    let bounded = Bounded::new(stream, refusal.clone());
    let mut config = tokio_postgres::Config::new();
    config
        .user(&login.user)
        .dbname(&login.dbname)
        .application_name(&login.application_name)
        .ssl_mode(tokio_postgres::config::SslMode::Disable);
    if let Some(password) = password {
        config.password(password);
    }
    let (client, mut connection) = match config.connect_raw(bounded, NoTls).await {
        Ok(pair) => pair,
        Err(e) => {
            let reason = refusal.lock().ok().and_then(|r| r.clone());
            return Err(match (reason, e.as_db_error()) {
                (Some(reason), _) => PgError::Io(reason),
                // A server starting up or shutting down, or out of connections: worth asking
                // again (a waiter goes on waiting through a restart), not a refusal.
                (None, Some(db)) if PASSING.contains(&db.code().code()) => {
                    PgError::Io(crate::text::printable(db.message()))
                }
                (None, Some(db)) => PgError::Setup(crate::text::printable(db.message())),
                (None, None) => PgError::Io(e.to_string()),
            });
        }
    };
    let shared = Arc::new(Shared {
        refusal,
        unconfirmed: AtomicU64::new(0),
    });
    let (tx, rx) = mpsc::channel(16);
    let driving = shared.clone();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notice(notice))) => {
                    // PostgreSQL's words when a commit stops waiting for the synchronous
                    // standby: committed here, perhaps not there.
                    if notice
                        .message()
                        .contains("wait for synchronous replication")
                    {
                        driving.unconfirmed.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Some(Ok(AsyncMessage::Notification(n))) => {
                    // Full: the waiter has wake-ups enough to ask again.
                    let _ = tx.try_send(n.payload().to_owned());
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return,
            }
        }
    });
    Ok(Conn {
        client,
        shared,
        driver,
        notifications: tokio::sync::Mutex::new(rx),
        host: host.clone(),
        tls,
        listening: std::cell::RefCell::new(None),
    })
}

/// Asks for TLS as `sslmode` says, and shakes hands; the stream and whether it is encrypted.
async fn negotiate(
    mut tcp: TcpStream,
    name: &str,
    login: &Login,
) -> Result<(Stream, bool), PgError> {
    let Some(connector) = login
        .tls
        .as_ref()
        .filter(|_| login.sslmode != SslMode::Disable)
    else {
        return Ok((Stream::Tcp(tcp), false));
    };
    let io = |e: io::Error| PgError::Io(e.to_string());
    tcp.write_all(&SSL_REQUEST).await.map_err(io)?;
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await.map_err(io)?;
    match answer[0] {
        b'S' => {}
        b'N' if login.sslmode == SslMode::Prefer => return Ok((Stream::Tcp(tcp), false)),
        b'N' => {
            return Err(PgError::Setup(crate::text::message!(
                "the server does not speak TLS (sslmode={}): enable ssl on the server, or \
                 give sslmode=disable where plain text is acceptable",
                login.sslmode.word()
            )));
        }
        other => {
            return Err(PgError::Io(crate::text::message!(
                "a malformed reply: {:?} to the request for TLS, which a PostgreSQL server \
                 answers with S or N",
                other as char
            )));
        }
    }
    let server = rustls_pki_types::ServerName::try_from(name.to_owned())
        .map_err(|e| PgError::Setup(crate::text::message!("TLS: the host {name}: {e}")))?;
    match connector.connect(server, tcp).await {
        Ok(tls) => Ok((Stream::Tls(Box::new(tls)), true)),
        Err(e) => Err(PgError::Setup(crate::text::message!("TLS: {e}"))),
    }
}

/// The start-up refusals that pass: `cannot_connect_now` (starting up, shutting down, in
/// recovery), `too_many_connections`, `admin_shutdown`, `crash_shutdown`.
const PASSING: [&str; 4] = ["57P03", "53300", "57P01", "57P02"];

/// How long a cancel request may take: a connect and one message (about a millisecond on a
/// LAN); a server that is unreachable costs this much once more.
const CANCEL_WITHIN: Duration = Duration::from_millis(500);

/// Sent ahead of every string of statements, in its implicit transaction: names in them (a
/// function, an operator such as `integer * interval`, a type) resolve in `pg_catalog` only,
/// whatever the role's search_path, so no role that may create objects in a schema on it (as
/// anyone once could in `public`) can put its own in their place.
const PINNED_PATH: &str = "SET LOCAL search_path = pg_catalog, pg_temp";

impl Conn {
    /// Runs `sql` (one or more statements, one round trip): each statement's rows, in order.
    pub async fn run(&self, sql: &str) -> Result<Vec<Vec<Row>>, PgError> {
        let sent = self.send(sql).await?;
        self.collect(sent).await
    }

    /// Sends `sql` without waiting for its answer: what is sent before an answer is read goes
    /// out in the same write (a pipeline).
    pub async fn send(&self, sql: &str) -> Result<SimpleQueryStream, PgError> {
        self.client
            .simple_query_raw(&format!("{PINNED_PATH};\n{sql}"))
            .await
            .map_err(|e| self.error(e))
    }

    /// The answer to what [`Conn::send`] sent: each statement's rows, in order.
    pub async fn collect(&self, sent: SimpleQueryStream) -> Result<Vec<Vec<Row>>, PgError> {
        let mut stream = std::pin::pin!(sent);
        let mut sets = vec![Vec::new()];
        let mut rows = 0;
        while let Some(message) = stream.next().await {
            match message.map_err(|e| self.error(e))? {
                SimpleQueryMessage::Row(row) => {
                    rows += 1;
                    if rows > MAX_ROWS {
                        return Err(PgError::Io(format!(
                            "a reply too large: more than {MAX_ROWS} rows"
                        )));
                    }
                    let row = (0..row.len()).map(|i| row.get(i).map(str::to_owned));
                    sets.last_mut().expect("a set").push(row.collect());
                }
                SimpleQueryMessage::CommandComplete(_) => sets.push(Vec::new()),
                _ => {}
            }
        }
        sets.pop();
        // The first answer is the pinned search_path's.
        if !sets.is_empty() {
            sets.remove(0);
        }
        Ok(sets)
    }

    fn error(&self, e: tokio_postgres::Error) -> PgError {
        if let Some(reason) = self.shared.refusal.lock().ok().and_then(|r| r.clone()) {
            return PgError::Io(reason);
        }
        match e.as_db_error() {
            Some(db) => PgError::Db {
                code: db.code().code().to_owned(),
                message: db.message().to_owned(),
            },
            // Messages the client library could not read, or did not expect.
            None if e.to_string().contains("parsing") || e.to_string().contains("unexpected") => {
                PgError::Io(format!("a malformed reply: {e}"))
            }
            None => PgError::Io(e.to_string()),
        }
    }

    /// Asks the server, on a connection of its own, to cancel what this connection runs: a
    /// commit waiting for a synchronous standby that does not answer waits for ever otherwise
    /// (`statement_timeout` ends before the commit), holding the NAME's fence row for every
    /// later attempt, and its backend stays (a `-n` run from cron each time: one more, until
    /// the role's connection limit). Awaited, within [`CANCEL_WITHIN`]: a task left in the
    /// background dies with a run that ends at once, before it has sent anything.
    pub async fn cancel(&self) {
        let token = self.client.cancel_token();
        let host = self.host.clone();
        {
            let cancel = async {
                match &host {
                    Host::Tcp(name, port) => {
                        let tcp = TcpStream::connect((name.as_str(), *port)).await.ok()?;
                        token.cancel_query_raw(tcp, NoTls).await.ok()
                    }
                    Host::Unix(dir, port) => {
                        let path = dir.join(format!(".s.PGSQL.{port}"));
                        let unix = UnixStream::connect(path).await.ok()?;
                        token.cancel_query_raw(unix, NoTls).await.ok()
                    }
                }
            };
            let _ = tokio::time::timeout(CANCEL_WITHIN, cancel).await;
        }
    }

    /// How many commits so far stopped waiting for the synchronous standby.
    pub fn unconfirmed(&self) -> u64 {
        self.shared.unconfirmed.load(Ordering::SeqCst)
    }

    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// The next notification's payload; `None` once the connection is gone.
    pub async fn notification(&self) -> Option<String> {
        self.notifications.lock().await.recv().await
    }

    /// Drops what notifications came so far (for a token given back, say).
    pub fn forget_notifications(&self) {
        if let Ok(mut rx) = self.notifications.try_lock() {
            while rx.try_recv().is_ok() {}
        }
    }
}
