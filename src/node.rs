//! One Redis server: its URL (printable without the password), a lazily opened connection
//! that is dropped after any failure (or an abandoned request) so the next attempt starts
//! fresh, script calls with EVALSHA and an EVAL fallback, and release subscriptions.

use std::io;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use percent_encoding::percent_decode_str;

use crate::backend::{BackendError, Wakeups};
use crate::lease::show;
use crate::resp::{Addr, Connection, Reply, within};
use crate::scripts::Script;

/// A Redis server reached through one URL.
pub struct Node {
    addr: Addr,
    address: String,
    /// AUTH and SELECT, sent ahead of the first request on every new connection.
    hello: Vec<Vec<Vec<u8>>>,
    connect_timeout: Duration,
    conn: Mutex<Option<Connection>>,
}

/// Shows the address only: `hello` holds the password.
impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Parses `url`: `redis://[user[:password]@]host[:port][/db]` or
    /// `redis+unix:///path[?db=N&user=U&pass=P]`. A password missing from the URL is taken from
    /// `REDISCLI_AUTH`, as `redis-cli` does. Errors are usage errors, never showing the password.
    pub fn open(url: &str, connect_timeout: Duration) -> Result<Node, String> {
        let parsed = url::Url::parse(url).map_err(|_| bad_url(url))?;
        let address = redact(&parsed);
        let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        let query = |names: &[&str]| {
            parsed
                .query_pairs()
                .find(|(k, _)| names.contains(&k.as_ref()))
                .map(|(_, v)| v.into_owned())
        };
        let (addr, mut user, mut password, db) = match parsed.scheme() {
            "redis" => {
                let host = match parsed.host() {
                    Some(url::Host::Domain(d)) if !d.is_empty() => d.to_owned(),
                    Some(url::Host::Ipv4(ip)) => ip.to_string(),
                    Some(url::Host::Ipv6(ip)) => ip.to_string(),
                    _ => return Err(format!("the Redis URL {address} has no host")),
                };
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
        let db: i64 = match db {
            None => 0,
            Some(db) => db.parse().map_err(|_| {
                format!("the Redis URL {address} names database {db:?}, not a number")
            })?,
        };
        if password.is_none() {
            password = std::env::var("REDISCLI_AUTH")
                .ok()
                .filter(|p| !p.is_empty());
        }
        if password.is_none() {
            user = None; // AUTH needs a password; a bare user name means the default user
        }
        let mut hello = Vec::new();
        if let Some(password) = password {
            let mut auth = vec![b"AUTH".to_vec()];
            auth.extend(user.map(String::into_bytes));
            auth.push(password.into_bytes());
            hello.push(auth);
        }
        if db != 0 {
            hello.push(vec![b"SELECT".to_vec(), db.to_string().into_bytes()]);
        }
        Ok(Node {
            addr,
            address,
            hello,
            connect_timeout,
            conn: Mutex::new(None),
        })
    }

    /// The URL without its password, for messages.
    pub fn address(&self) -> &str {
        &self.address
    }

    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The idle connection, if there is one; a request owns it while it runs, so a request
    /// that is abandoned drops it and the next one connects afresh.
    fn take(&self) -> Option<Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn put_back(&self, conn: Connection) {
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
    }

    /// Sends `commands` in one write and returns their replies, within `timeout` (connecting,
    /// and authenticating, first if needed). Error replies are returned as replies.
    pub async fn exchange(
        &self,
        commands: &[&[&[u8]]],
        timeout: Duration,
    ) -> Result<Vec<Reply>, BackendError> {
        let attempt = async {
            let (mut conn, fresh) = match self.take() {
                Some(conn) => (conn, false),
                None => {
                    let connect = Connection::connect(&self.addr);
                    (
                        within(timeout.min(self.connect_timeout), connect).await?,
                        true,
                    )
                }
            };
            let hello: Vec<Vec<&[u8]>> = if fresh {
                self.hello
                    .iter()
                    .map(|c| c.iter().map(Vec::as_slice).collect())
                    .collect()
            } else {
                Vec::new()
            };
            let mut batch: Vec<&[&[u8]]> = hello.iter().map(Vec::as_slice).collect();
            batch.extend_from_slice(commands);
            let mut replies = conn.pipeline(&batch).await?;
            let tail = replies.split_off(hello.len());
            let refusal = hello_error(&batch[..hello.len()], &replies)?;
            Ok::<_, io::Error>((conn, refusal, tail))
        };
        match within(timeout, attempt).await {
            Ok((conn, None, replies)) => {
                self.put_back(conn);
                Ok(replies)
            }
            Ok((_, Some(refusal), _)) => Err(self.refused(&refusal)),
            Err(e) => Err(self.unreachable(&e, timeout)),
        }
    }

    /// Runs a script: EVALSHA, and EVAL when the server does not know it (restarted, flushed);
    /// EVAL also caches it, so that costs one extra round trip once.
    pub async fn eval(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
        timeout: Duration,
    ) -> Result<Reply, BackendError> {
        let numkeys = keys.len().to_string();
        let mut command: Vec<&[u8]> = vec![b"EVALSHA", script.sha1.as_bytes(), numkeys.as_bytes()];
        command.extend(keys.iter().map(|k| k.as_bytes()));
        command.extend(args.iter().map(|a| a.as_bytes()));
        let mut reply = self.exchange(&[&command], timeout).await?.remove(0);
        if matches!(&reply, Reply::Error(e) if e.starts_with("NOSCRIPT")) {
            command[0] = b"EVAL";
            command[1] = script.source.as_bytes();
            reply = self.exchange(&[&command], timeout).await?.remove(0);
        }
        match reply {
            Reply::Error(e) => Err(self.refused(&e)),
            reply => Ok(reply),
        }
    }

    /// Subscribes to `channel` on a connection of its own; the server has confirmed the
    /// subscription when this returns.
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription, BackendError> {
        let timeout = self.connect_timeout;
        let attempt = async {
            let mut conn = Connection::connect(&self.addr).await?;
            let mut batch: Vec<&[&[u8]]> = Vec::new();
            let hello: Vec<Vec<&[u8]>> = self
                .hello
                .iter()
                .map(|c| c.iter().map(Vec::as_slice).collect())
                .collect();
            batch.extend(hello.iter().map(Vec::as_slice));
            let subscribe: [&[u8]; 2] = [b"SUBSCRIBE", channel.as_bytes()];
            batch.push(&subscribe);
            let replies = conn.pipeline(&batch).await?;
            let refusal = hello_error(&batch, &replies)?;
            Ok::<_, io::Error>((conn, refusal))
        };
        match within(timeout, attempt).await {
            Ok((conn, None)) => Ok(Subscription {
                conn,
                address: self.address.clone(),
            }),
            Ok((_, Some(refusal))) => Err(self.refused(&refusal)),
            Err(e) => Err(self.unreachable(&e, timeout)),
        }
    }

    fn unreachable(&self, error: &io::Error, timeout: Duration) -> BackendError {
        let address = &self.address;
        BackendError::Transient(match error.kind() {
            io::ErrorKind::TimedOut => {
                format!("Redis at {address} did not answer within {}", show(timeout))
            }
            _ => format!("cannot reach Redis at {address}: {error}"),
        })
    }

    /// Turns an error reply into a message that names the server (never its password) and
    /// says whether retrying can help.
    pub fn refused(&self, error: &str) -> BackendError {
        let address = &self.address;
        let (code, detail) = error.split_once(' ').unwrap_or((error, ""));
        // A server that is starting, busy with a script, or failing over may answer properly
        // in a moment: worth retrying (while waiting; at first contact it is 69 all the same).
        if matches!(
            code,
            "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN"
        ) {
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

/// The first error among the replies to `commands` that are AUTH/SELECT/SUBSCRIBE set-up
/// (any error there means the connection is unusable), if any.
fn hello_error(commands: &[&[&[u8]]], replies: &[Reply]) -> io::Result<Option<String>> {
    for (command, reply) in commands.iter().zip(replies) {
        if let Reply::Error(e) = reply {
            return Ok(Some(e.clone()));
        }
        if command[0] == b"SUBSCRIBE"
            && reply.items().first().and_then(Reply::as_text).as_deref() != Some("subscribe")
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the server did not confirm the subscription",
            ));
        }
    }
    Ok(None)
}

fn bad_url(url: &str) -> String {
    if url.starts_with("rediss://") {
        return "rediss:// (TLS) is not supported by this version of locked-run; use redis:// over a trusted network or a tunnel".into();
    }
    if url.starts_with("file://") {
        return "file:// (the host-local backend) is not supported by this version of locked-run"
            .into();
    }
    let shown = match url::Url::parse(url) {
        Ok(parsed) => redact(&parsed),
        Err(_) if url.contains('@') => "(a URL with credentials, not shown)".to_owned(),
        Err(_) => format!("{url:?}"),
    };
    format!(
        "{shown} is not a supported Redis URL: use redis://[user[:password]@]host[:port][/db] \
         or redis+unix:///path/to/socket"
    )
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
pub struct Subscription {
    conn: Connection,
    address: String,
}

impl Wakeups for Subscription {
    async fn next(&mut self) -> Result<(), BackendError> {
        loop {
            match self.conn.read_reply().await {
                Ok(reply)
                    if reply.items().first().and_then(Reply::as_text).as_deref()
                        == Some("message") =>
                {
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) => {
                    return Err(BackendError::Transient(format!(
                        "lost the subscription connection to Redis at {}: {e}",
                        self.address
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(url: &str) -> Result<Node, String> {
        Node::open(url, Duration::from_secs(1))
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
        assert_eq!(n.hello, [vec![b"SELECT".to_vec(), b"2".to_vec()]]);
        let n = open("redis://cron:p%40ss@[::1]").unwrap();
        assert_eq!(
            n.addr,
            Addr::Tcp {
                host: "::1".into(),
                port: 6379
            }
        );
        assert_eq!(
            n.hello,
            [vec![b"AUTH".to_vec(), b"cron".to_vec(), b"p@ss".to_vec()]]
        );
        assert_eq!(n.address(), "redis://cron@[::1]");
        assert!(open("redis://").unwrap_err().contains("no host"));
        assert!(open("redis://h/x").unwrap_err().contains("not a number"));
    }

    #[test]
    fn unix_urls() {
        let n = open("redis+unix:///run/redis.sock?db=3&pass=secret").unwrap();
        assert_eq!(n.addr, Addr::Unix("/run/redis.sock".into()));
        assert_eq!(n.hello[0], [b"AUTH".to_vec(), b"secret".to_vec()]);
        assert_eq!(n.hello[1], [b"SELECT".to_vec(), b"3".to_vec()]);
        assert_eq!(n.address(), "redis+unix:///run/redis.sock?db=3");
    }

    #[test]
    fn other_schemes_are_refused_without_showing_passwords() {
        assert!(
            open("http://h")
                .unwrap_err()
                .contains("not a supported Redis URL")
        );
        assert!(!open("ftp://u:hunter2@h").unwrap_err().contains("hunter2"));
        assert!(open("rediss://h").unwrap_err().contains("TLS"));
        assert!(open("file:///tmp").unwrap_err().contains("host-local"));
        assert!(open("not a url").is_err());
    }
}
