//! A small Redis protocol client (RESP2, and RESP3 with pushes): one connection, one request at
//! a time, replies parsed as they come.
//!
//! `locked-run` sends a handful of commands per run; a general client's connection machinery
//! (a multiplexing task, channels, a driver) cost more than the round trips themselves. Here a
//! request is a write and the reads for its reply, on the caller's task. With RESP3 a
//! connection may be subscribed and still send commands: release messages arrive as pushes,
//! counted aside while replies are read, so one connection both waits and acquires.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use parse::{MAX_REPLY_BYTES, Parser, reply_too_long};

mod parse;

/// A reply. RESP3's extra types are folded into these: null is a nil bulk string, maps and sets
/// are flat arrays, booleans are integers, doubles and big numbers are bulk strings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    /// `-CODE detail`
    Error(String),
    Int(i64),
    /// `None`: nil.
    Bulk(Option<Vec<u8>>),
    /// `None`: the nil array.
    Array(Option<Vec<Reply>>),
    /// An out-of-band RESP3 push (pub/sub confirmations and messages).
    Push(Vec<Reply>),
}

impl Reply {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            Reply::Bulk(Some(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        }
    }

    pub fn as_text(&self) -> Option<String> {
        match self {
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Reply::Status(s) => Some(s.clone()),
            Reply::Int(i) => Some(i.to_string()),
            _ => None,
        }
    }

    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(items)) | Reply::Push(items) => items,
            _ => &[],
        }
    }

    /// The kind of a pub/sub reply or push (`subscribe`, `message`, ...).
    fn pubsub_kind(&self) -> Option<String> {
        self.items().first()?.as_text()
    }
}

/// How many unread release messages a connection keeps (the newest).
const MESSAGES_KEPT: usize = 16;

/// Where a server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Addr {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Tcp { host, port } => write!(f, "{host}:{port}"),
            Addr::Unix(path) => write!(f, "{}", path.display()),
        }
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// One connection to a server.
pub struct Connection {
    stream: Box<dyn Stream>,
    buf: Vec<u8>,
    /// Bytes of `buf` already parsed.
    start: usize,
    /// The parse of the reply at `buf[start..]`, resumed after each read.
    parser: Parser,
    /// Pub/sub messages received and not yet taken by [`Connection::next_message`]: their
    /// payloads (the release's, naming the waiter whose turn it is), the newest few.
    messages: VecDeque<Vec<u8>>,
    /// Subscription confirmations received (RESP3 pushes).
    confirmed: u64,
    /// The channel last subscribed to with [`Connection::pipeline`] (a fair waiter's is named
    /// by its token, which changes when it gives back).
    channel: Option<Vec<u8>>,
    /// An UNSUBSCRIBE was sent and its answer not read yet: a push when it worked, an
    /// in-band error (NOPERM) when it did not, which must not be taken for the next reply.
    unsubscribing: bool,
    /// The server's address, as messages name it (`host:port`, or the socket's path).
    peer: String,
}

impl Connection {
    /// Connects (TCP with Nagle off, or a Unix socket), through TLS when `tls` is given.
    pub async fn connect(
        addr: &Addr,
        tls: Option<&tokio_rustls::TlsConnector>,
    ) -> io::Result<Connection> {
        let stream: Box<dyn Stream> = match addr {
            Addr::Tcp { host, port } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                match tls {
                    Some(tls) => {
                        let name = rustls_pki_types::ServerName::try_from(host.clone())
                            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
                        Box::new(tls.connect(name, stream).await?)
                    }
                    None => Box::new(stream),
                }
            }
            Addr::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
        };
        Ok(Connection {
            stream,
            buf: Vec::with_capacity(512),
            start: 0,
            parser: Parser::new(),
            messages: VecDeque::new(),
            confirmed: 0,
            channel: None,
            unsubscribing: false,
            peer: addr.to_string(),
        })
    }

    /// The server's address (`host:port`, or the socket's path): behind sentinels or a
    /// Cluster, the node a message must name.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Sends several commands in one write and reads their replies in order. On a RESP3
    /// connection a SUBSCRIBE is answered by a push, not a reply: it gets no entry in the
    /// result, and this returns once the subscription is confirmed.
    pub async fn pipeline(&mut self, commands: &[&[&[u8]]]) -> io::Result<Vec<Reply>> {
        let mut out = Vec::with_capacity(256);
        for args in commands {
            encode(&mut out, args);
        }
        self.stream.write_all(&out).await?;
        // TLS holds back what the socket would not take at once until flushed.
        self.stream.flush().await?;
        let mut replies = Vec::with_capacity(commands.len());
        for args in commands {
            if args[0].eq_ignore_ascii_case(b"SUBSCRIBE")
                || args[0].eq_ignore_ascii_case(b"SSUBSCRIBE")
            {
                self.channel = args.get(1).map(|c| c.to_vec());
                let wanted = self.confirmed + 1;
                while self.confirmed < wanted {
                    match self.read_any().await? {
                        Reply::Push(items) => self.note_push(&Reply::Push(items)),
                        // RESP2: the confirmation is an ordinary reply (the last command).
                        reply @ Reply::Array(_)
                            if matches!(
                                reply.pubsub_kind().as_deref(),
                                Some("subscribe" | "ssubscribe")
                            ) =>
                        {
                            self.confirmed += 1;
                            replies.push(reply);
                        }
                        reply @ Reply::Error(_) => {
                            replies.push(reply);
                            break;
                        }
                        other => return Err(unexpected(&other)),
                    }
                }
            } else {
                replies.push(self.read_reply().await?);
            }
        }
        Ok(replies)
    }

    /// Sends one command and reads its reply.
    pub async fn command(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut replies = self.pipeline(&[args]).await?;
        replies.pop().ok_or_else(|| protocol_error("no reply"))
    }

    /// Whether a subscription has been confirmed on this connection.
    pub fn subscribed(&self) -> bool {
        self.confirmed > 0
    }

    /// Whether this connection is subscribed to `channel`.
    pub fn subscribed_to(&self, channel: &str) -> bool {
        self.subscribed() && self.channel.as_deref() == Some(channel.as_bytes())
    }

    /// Ends every subscription without waiting for the confirmation (a push the next read
    /// sets aside): a lock holder should not count as a waiter, and should not pay a round
    /// trip to say so.
    pub async fn unsubscribe(&mut self, sharded: bool) -> io::Result<()> {
        let mut out = Vec::new();
        encode(
            &mut out,
            &[if sharded {
                &b"SUNSUBSCRIBE"[..]
            } else {
                b"UNSUBSCRIBE"
            }],
        );
        self.stream.write_all(&out).await?;
        // TLS holds back what the socket would not take at once until flushed.
        self.stream.flush().await?;
        self.confirmed = 0;
        self.messages.clear();
        self.unsubscribing = true;
        Ok(())
    }

    /// Waits for the next pub/sub message (one already received counts): a RESP3 push, or on
    /// a RESP2 connection in subscribed mode an ordinary array. Returns its payload.
    pub async fn next_message(&mut self) -> io::Result<Vec<u8>> {
        while self.messages.is_empty() {
            if !self.subscribed() {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "the server ended the subscription",
                ));
            }
            match self.read_any().await? {
                reply @ (Reply::Push(_) | Reply::Array(_)) => self.note_push(&reply),
                other => return Err(unexpected(&other)),
            }
        }
        Ok(self.messages.pop_front().unwrap_or_default())
    }

    /// Reads the next reply, setting RESP3 pushes aside (counted).
    async fn read_reply(&mut self) -> io::Result<Reply> {
        loop {
            match self.read_any().await? {
                push @ Reply::Push(_) => self.note_push(&push),
                Reply::Error(e) if self.unsubscribing => {
                    self.unsubscribing = false;
                    tracing::debug!("UNSUBSCRIBE refused: {e}");
                }
                reply => return Ok(reply),
            }
        }
    }

    fn note_push(&mut self, push: &Reply) {
        match push.pubsub_kind().as_deref() {
            Some("message" | "smessage") => {
                // Only the newest matter: a waiter asks the server again on any of them.
                if self.messages.len() >= MESSAGES_KEPT {
                    self.messages.pop_front();
                }
                let payload = push.items().get(2).and_then(Reply::as_text);
                self.messages
                    .push_back(payload.unwrap_or_default().into_bytes());
            }
            Some("subscribe" | "ssubscribe") => self.confirmed += 1,
            Some("unsubscribe" | "sunsubscribe") => {
                if !self.unsubscribing {
                    // Not asked for: the server ended the subscription (on a Cluster, when
                    // the channel's slot moved to another node).
                    self.confirmed = 0;
                }
                self.unsubscribing = false;
            }
            _ => {}
        }
    }

    /// Reads the next reply or push. Cancel-safe: what has been read stays in the buffer, and
    /// how far it was parsed in the connection, for the next call.
    async fn read_any(&mut self) -> io::Result<Reply> {
        loop {
            if let Some((reply, used)) = self.parser.parse(&self.buf[self.start..])? {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                return Ok(reply);
            }
            // The parser counts from the reply's first byte, so this moves nothing under it.
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            // `parse` fails for a reply that cannot end within MAX_REPLY_BYTES, so reading no
            // further bounds what one reply can make this buffer hold, whatever it announces.
            let mut chunk = [0u8; 4096];
            let room = MAX_REPLY_BYTES.saturating_sub(self.buf.len());
            if room == 0 {
                return Err(reply_too_long());
            }
            let want = room.min(chunk.len());
            let n = self.stream.read(&mut chunk[..want]).await?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Appends `args` as a RESP array of bulk strings.
fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// What a server that speaks HTTP is called (an etcd's port, a web server's, given as
/// `redis://`): its reply starts `HTTP/` or `<` (an HTML page), bytes that start no RESP reply.
pub const ANSWERED_LIKE_HTTP: &str = "not a Redis server; it answered like HTTP";

/// A reply this client will not read: malformed, or past one of the limits that bound what a
/// reply can make it hold (`parse`). Either ends the request as a server gone would, and
/// the line that says so names which it was, never that the server was late.
#[derive(Debug)]
pub struct BadReply {
    /// Past a limit (its size, its values, its depth), rather than malformed.
    pub too_large: bool,
    pub what: String,
}

impl fmt::Display for BadReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad reply from the server: {}", self.what)
    }
}

impl std::error::Error for BadReply {}

/// The reply `error` refused, if it is one.
pub fn bad_reply(error: &io::Error) -> Option<&BadReply> {
    error.get_ref()?.downcast_ref()
}

/// A reply that `hop` (a sentinel, a cluster seed) sent and this client refused, said in the
/// words one server's is said in: `HOP sent a reply too large: ...` or `HOP sent a malformed
/// reply: ...`. `None` when `error` is no such reply.
pub fn hop_sent_bad_reply(hop: &str, error: &io::Error) -> Option<io::Error> {
    let bad = bad_reply(error)?;
    let said = match bad.too_large {
        true => "sent a reply too large",
        false => "sent a malformed reply",
    };
    Some(io::Error::new(
        error.kind(),
        format!("{hop} {said}: {}", bad.what),
    ))
}

fn protocol_error(what: &str) -> io::Error {
    let what = what.to_owned();
    io::Error::new(
        io::ErrorKind::InvalidData,
        BadReply {
            too_large: false,
            what,
        },
    )
}

/// A reply past one of the limits.
fn limit_error(what: &str) -> io::Error {
    let what = what.to_owned();
    io::Error::new(
        io::ErrorKind::InvalidData,
        BadReply {
            too_large: true,
            what,
        },
    )
}

fn unexpected(reply: &Reply) -> io::Error {
    // The start of it: a reply may be megabytes long.
    let shown: String = format!("{reply:?}").chars().take(200).collect();
    protocol_error(&format!("unexpected {shown}"))
}

/// `tokio::time::timeout` with the error a caller of this module expects.
pub async fn within<T>(timeout: Duration, f: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    match tokio::time::timeout(timeout, f).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "timed out")),
    }
}

/// One of `n` hosts asked in turn gets this part of `timeout` (the last part is for the
/// connection to the server they name): one that never answers leaves the others time.
pub fn share(timeout: Duration, n: usize) -> Duration {
    (timeout / (n as u32 + 1)).max(Duration::from_millis(1))
}

/// Owned commands (`Node::hello`'s) as the argument lists a pipeline takes.
pub fn as_batch(commands: &[Vec<Vec<u8>>]) -> Vec<Vec<&[u8]>> {
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

#[cfg(test)]
mod tests;
