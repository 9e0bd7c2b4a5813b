//! A small RESP2 client: one connection, one request at a time, replies parsed as they come.
//!
//! `locked-run` sends a handful of commands per run; a general client's connection machinery
//! (a multiplexing task, channels, a driver) cost more than the round trips themselves. Here a
//! request is a write and the reads for its reply, on the caller's task, and a request that is
//! abandoned (timeout, signal) takes its connection with it.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A reply, as RESP2 has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    /// `-CODE detail`
    Error(String),
    Int(i64),
    /// `None`: the nil bulk string.
    Bulk(Option<Vec<u8>>),
    /// `None`: the nil array.
    Array(Option<Vec<Reply>>),
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
            Reply::Array(Some(items)) => items,
            _ => &[],
        }
    }
}

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
}

impl Connection {
    /// Connects (TCP with Nagle off, or a Unix socket).
    pub async fn connect(addr: &Addr) -> io::Result<Connection> {
        let stream: Box<dyn Stream> = match addr {
            Addr::Tcp { host, port } => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                Box::new(stream)
            }
            Addr::Unix(path) => Box::new(tokio::net::UnixStream::connect(path).await?),
        };
        Ok(Connection {
            stream,
            buf: Vec::with_capacity(512),
            start: 0,
        })
    }

    /// Sends several commands in one write and reads their replies in order.
    pub async fn pipeline(&mut self, commands: &[&[&[u8]]]) -> io::Result<Vec<Reply>> {
        let mut out = Vec::with_capacity(256);
        for args in commands {
            encode(&mut out, args);
        }
        self.stream.write_all(&out).await?;
        let mut replies = Vec::with_capacity(commands.len());
        for _ in commands {
            replies.push(self.read_reply().await?);
        }
        Ok(replies)
    }

    /// Sends one command and reads its reply.
    pub async fn command(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        let mut replies = self.pipeline(&[args]).await?;
        Ok(replies.pop().expect("one reply per command"))
    }

    /// Reads the next reply (also a pushed pub/sub message).
    pub async fn read_reply(&mut self) -> io::Result<Reply> {
        loop {
            if let Some((reply, used)) = parse(&self.buf[self.start..])? {
                self.start += used;
                if self.start == self.buf.len() {
                    self.buf.clear();
                    self.start = 0;
                }
                return Ok(reply);
            }
            if self.start > 0 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            let len = self.buf.len();
            self.buf.resize(len + 4096, 0);
            let n = self.stream.read(&mut self.buf[len..]).await?;
            self.buf.truncate(len + n);
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                ));
            }
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

fn protocol_error(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("bad reply from the server: {what}"),
    )
}

/// Parses one reply from the front of `buf`: `None` if more bytes are needed.
fn parse(buf: &[u8]) -> io::Result<Option<(Reply, usize)>> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    if end == 0 {
        return Err(protocol_error("empty line"));
    }
    let line = &buf[1..end];
    let text = || String::from_utf8_lossy(line).into_owned();
    let number = || -> io::Result<i64> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| protocol_error("not a number"))
    };
    let after = end + 2;
    Ok(match buf[0] {
        b'+' => Some((Reply::Status(text()), after)),
        b'-' => Some((Reply::Error(text()), after)),
        b':' => Some((Reply::Int(number()?), after)),
        b'$' => {
            let len = number()?;
            if len < 0 {
                return Ok(Some((Reply::Bulk(None), after)));
            }
            let len = len as usize;
            if buf.len() < after + len + 2 {
                return Ok(None);
            }
            Some((
                Reply::Bulk(Some(buf[after..after + len].to_vec())),
                after + len + 2,
            ))
        }
        b'*' => {
            let count = number()?;
            if count < 0 {
                return Ok(Some((Reply::Array(None), after)));
            }
            let mut items = Vec::with_capacity(count as usize);
            let mut used = after;
            for _ in 0..count {
                match parse(&buf[used..])? {
                    Some((item, n)) => {
                        items.push(item);
                        used += n;
                    }
                    None => return Ok(None),
                }
            }
            Some((Reply::Array(Some(items)), used))
        }
        other => return Err(protocol_error(&format!("unknown type byte {other:#x}"))),
    })
}

/// `tokio::time::timeout` with the error a caller of this module expects.
pub async fn within<T>(timeout: Duration, f: impl Future<Output = io::Result<T>>) -> io::Result<T> {
    match tokio::time::timeout(timeout, f).await {
        Ok(result) => result,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "timed out")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_bulk_string_arrays() {
        let mut out = Vec::new();
        encode(&mut out, &[b"GET", b"lock:{x}"]);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$8\r\nlock:{x}\r\n");
    }

    #[test]
    fn parses_every_reply_type_and_waits_for_more() {
        let all = b"+OK\r\n-ERR no\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n$-1\r\n*-1\r\n";
        let mut at = 0;
        let mut got = Vec::new();
        while at < all.len() {
            let (reply, used) = parse(&all[at..]).unwrap().unwrap();
            got.push(reply);
            at += used;
        }
        assert_eq!(
            got,
            [
                Reply::Status("OK".into()),
                Reply::Error("ERR no".into()),
                Reply::Int(42),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Bulk(None),
                Reply::Array(Some(vec![Reply::Int(1), Reply::Bulk(None)])),
                Reply::Array(None),
            ]
        );
        // Every strict prefix of a reply asks for more bytes.
        let one = b"*2\r\n$5\r\nhello\r\n:7\r\n";
        for cut in 0..one.len() {
            assert_eq!(parse(&one[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert!(parse(b"?x\r\n").is_err());
    }
}
