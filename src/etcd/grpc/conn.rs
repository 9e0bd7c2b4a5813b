//! One HTTP/2 connection to one etcd member: TCP, or TLS offering ALPN `h2` (etcd's gRPC
//! server over TLS speaks HTTP/2 only when asked so), with HTTP/2 settings that bound what the
//! member may send before this client reads it. The connection is driven by a task of its
//! own, which ends with the connection; requests share it, each on a stream of its own.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use h2::client::SendRequest;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::super::url::Endpoint;

/// The most a header list (a reply's headers, or its trailers) may take, HPACK-decoded: etcd's
/// are a few hundred bytes (h2's default would let a server send 16 MiB of them).
pub const MAX_HEADERS: u32 = 64 << 10;

/// How much of a stream's replies the member may send before this client has read them
/// (HTTP/2 flow control), and of all streams together: unread data is bounded by these, never
/// by what a server chooses to send.
const STREAM_WINDOW: u32 = 1 << 20;
const CONNECTION_WINDOW: u32 = 2 << 20;

/// An open connection.
#[derive(Clone)]
pub struct Conn {
    pub sender: SendRequest<Bytes>,
    /// Which endpoint of the URL it goes to.
    pub at: usize,
    /// `host:port`, for the requests' `:authority`.
    pub authority: String,
    pub tls: bool,
    /// A number of its own, never reused by the client that made it.
    pub id: u64,
    /// Set once the connection's task has ended (closed by either side, or failed).
    closed: Arc<AtomicBool>,
    /// The connection's task, to end it (and every stream on it) when it is given up.
    task: tokio::task::AbortHandle,
}

impl Conn {
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Ends the connection now: every stream on it (a watch, the keep-alive stream) fails at
    /// once rather than wait on a member given up, whose connection may stay open and silent
    /// (stopped, or cut off without a reset).
    pub fn close(&self) {
        self.task.abort();
        self.closed.store(true, Ordering::Relaxed);
    }

    /// The URI of `path` (`/etcdserverpb.KV/Txn`) on this connection.
    pub fn uri(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.authority)
    }
}

/// A new connection to `endpoint` (number `at` of the URL's), TLS through `tls`.
pub async fn open(
    endpoint: &Endpoint,
    at: usize,
    id: u64,
    tls: Option<&TlsConnector>,
) -> io::Result<Conn> {
    let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port)).await?;
    stream.set_nodelay(true)?;
    let closed = Arc::new(AtomicBool::new(false));
    let (sender, task) = match tls {
        Some(tls) => {
            let name = rustls_pki_types::ServerName::try_from(endpoint.host.clone())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let stream = tls.connect(name, stream).await?;
            handshake(stream, closed.clone()).await?
        }
        None => handshake(stream, closed.clone()).await?,
    };
    Ok(Conn {
        sender,
        at,
        authority: endpoint.to_string(),
        tls: tls.is_some(),
        id,
        closed,
        task,
    })
}

/// HTTP/2 on an open stream, its task spawned.
async fn handshake<T>(
    io: T,
    closed: Arc<AtomicBool>,
) -> io::Result<(SendRequest<Bytes>, tokio::task::AbortHandle)>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = h2::client::Builder::new()
        .enable_push(false)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_header_list_size(MAX_HEADERS)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(io::Error::other)?;
    let task = tokio::spawn(async move {
        let ended = connection.await;
        closed.store(true, Ordering::Relaxed);
        if let Err(e) = ended {
            tracing::debug!("an HTTP/2 connection to etcd ended: {e}");
        }
    });
    Ok((sender, task.abort_handle()))
}
