//! What a server's failures mean, in one line each: a server that could not be reached (or a
//! hop before it, or a port that speaks HTTP, asked once when it hung up), a reply too large
//! or malformed, and a refusal, which names the server (behind sentinels or a Cluster, the
//! data node) and says whether retrying can help; never a password. Whether a failure took
//! nothing (it came before any command of the lock ran) is said with the error.

use std::io;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::Node;
use crate::backend::BackendError;
use crate::redis::auth::{Hop, Refused, refusal_line};
use crate::redis::resp::{ANSWERED_LIKE_HTTP, Addr, bad_reply, within};
use crate::redis::url::Topology;
use crate::text::show;

/// The connection's set-up (HELLO, AUTH, SELECT) refused by the server at `peer`.
pub(super) struct SetUpRefused {
    pub error: String,
    pub peer: String,
    /// No command of the request ran: the set-up was confirmed in a round trip of its own,
    /// or refused as NOAUTH, which the server answers every command after it with too.
    pub before_commands: bool,
}

impl Node {
    /// A refused set-up, as a refusal by the server it names; one that ran no command of the
    /// request took nothing.
    pub(super) fn refused_set_up(&self, refused: SetUpRefused) -> BackendError {
        let error = self.refused_by(&refused.error, Some(&refused.peer));
        error.unsent_if(refused.before_commands)
    }

    pub(in crate::redis) fn unreachable(
        &self,
        error: &io::Error,
        timeout: Duration,
    ) -> BackendError {
        let address = &self.address;
        if let Some(line) = Refused::line(error) {
            // A sentinel or cluster node that refused the password, in a line of its own.
            return BackendError::Refused(line.to_owned());
        }
        if error.kind() == io::ErrorKind::PermissionDenied {
            // A sentinel or cluster seed that refused the password: retrying will not fix it.
            return BackendError::Refused(format!("Redis at {address}: {error}"));
        }
        let text = error.to_string();
        if text == ANSWERED_LIKE_HTTP {
            // The wrong port: retrying will not fix it, and no lock can have been taken there.
            return BackendError::Refused(format!(
                "{address} is not a Redis server; it answered like HTTP (an etcd's or a web \
                 server's port?): check the URL's port"
            ))
            .unsent();
        }
        if let Some(bad) = bad_reply(error) {
            // As a server gone would (retried while waiting or holding), but saying what came.
            let what = &bad.what;
            return BackendError::Transient(match bad.too_large {
                true => crate::text::message!("Redis at {address} sent a reply too large: {what}"),
                false => crate::text::message!("Redis at {address} sent a malformed reply: {what}"),
            });
        }
        // A TLS handshake that failed (certificates, protocol), rather than no connection, a
        // refusal (an ACL's NOPERM) or a connection closed mid-way (a failover).
        let handshake = !matches!(
            error.kind(),
            io::ErrorKind::ConnectionRefused
                | io::ErrorKind::TimedOut
                | io::ErrorKind::NotFound
                | io::ErrorKind::UnexpectedEof
        ) && !text.contains("refused:")
            && (text.contains("certificate") || text.contains("handshake") || text.contains("TLS"));
        let tls_hint = match (self.is_tls(), handshake, error.kind()) {
            (true, true, _) => {
                "; check the server's certificate against --tls-ca-cert (or the system's CAs), and \
                 --tls-cert/--tls-key if the server wants a client certificate"
            }
            // A server that wants TLS hangs up on a plain client.
            (false, _, io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset) => {
                match &self.topology {
                    Topology::Sentinel(_) => "; if the sentinels speak TLS, use rediss+sentinel://",
                    Topology::Cluster(_) => "; if the cluster speaks TLS, use rediss+cluster://",
                    Topology::Direct { .. } => "; if the server speaks TLS, use rediss://",
                }
            }
            _ => "",
        };
        BackendError::Transient(match error.kind() {
            io::ErrorKind::TimedOut if text == "timed out" => {
                crate::text::message!("Redis at {address} did not answer within {}", show(timeout))
            }
            // A hop that went silent, named.
            io::ErrorKind::TimedOut => crate::text::message!(
                "Redis at {address} did not answer within {}: {text}",
                show(timeout)
            ),
            _ => crate::text::message!("cannot reach Redis at {address}: {error}{tls_hint}"),
        })
    }

    /// Why a server that never spoke Redis's protocol to this run hung up on it: a port that
    /// answers HTTP (an etcd's: it closes a connection that opens with no HTTP method) is
    /// asked once, `GET /` on a connection of its own, by `deadline`; `error` is then
    /// [`ANSWERED_LIKE_HTTP`]. Only five bytes of the answer are read. A server that once
    /// answered is never asked, so this is never on the lease clock's path.
    pub(super) async fn why_closed(&self, error: io::Error, deadline: Instant) -> io::Error {
        let hung_up = matches!(
            error.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        );
        let Topology::Direct {
            addr: Addr::Tcp { host, port },
            tls: None,
        } = &self.topology
        else {
            return error;
        };
        if !hung_up || self.spoke.load(Ordering::Relaxed) {
            return error;
        }
        let probe = async {
            let mut stream = TcpStream::connect((host.as_str(), *port)).await?;
            let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await?;
            let mut head = [0u8; 5];
            stream.read_exact(&mut head).await?;
            Ok(&head == b"HTTP/")
        };
        let left = deadline.saturating_duration_since(Instant::now());
        match within(left, probe).await {
            Ok(true) => io::Error::new(io::ErrorKind::InvalidData, ANSWERED_LIKE_HTTP),
            _ => error,
        }
    }

    /// Turns an error reply into a message that names the server (never its password) and
    /// says whether retrying can help.
    pub fn refused(&self, error: &str) -> BackendError {
        self.refused_by(error, None)
    }

    /// [`Node::refused`], by the server at `peer` (behind sentinels or a Cluster, the data
    /// node a refused password must name).
    pub(super) fn refused_by(&self, error: &str, peer: Option<&str>) -> BackendError {
        let error = script_error(error);
        let address = &self.address;
        let server = match (&self.topology, peer) {
            (Topology::Sentinel(_), Some(peer)) => {
                format!("the primary {peer} that the sentinels name")
            }
            (Topology::Cluster(_), Some(peer)) => format!("cluster node {peer}"),
            _ => format!("Redis at {address}"),
        };
        if let Some(line) = refusal_line(&server, error, self.credentials(), Hop::Data) {
            return BackendError::Refused(line);
        }
        let (code, detail) = error.split_once(' ').unwrap_or((error, ""));
        // A server that is starting, busy with a script, or failing over may answer properly
        // in a moment: worth retrying (while waiting; at first contact it is 69 all the same).
        let failing_over = matches!(self.topology, Topology::Sentinel(_)) && code == "READONLY";
        if failing_over
            || matches!(
                code,
                "LOADING" | "BUSY" | "MASTERDOWN" | "TRYAGAIN" | "CLUSTERDOWN"
            )
        {
            return BackendError::Transient(format!(
                "Redis at {address} is not ready: {}",
                crate::text::printable(error)
            ));
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
            "NOAUTH" | "WRONGPASS" if self.sentinel().is_some() => {
                "; the primary the sentinels name wants the data nodes' password (in the URL \
                 through LOCKED_RUN_URL, --password-file or REDISCLI_AUTH; the sentinels' own \
                 goes in LOCKED_RUN_SENTINEL_AUTH)"
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
        // The server's own words: in the printable form, once, where they enter a line.
        BackendError::Refused(format!(
            "Redis at {address} refused: {}{hint}",
            crate::text::printable(error)
        ))
    }
}

/// The error a script's command raised, as Redis 7 and Valkey report it (`READONLY You can't
/// write...`). Redis 6 wraps it: `ERR Error running script (call to f_SHA): @user_script:6:
/// @user_script: 6: -READONLY You can't write...`; its code would otherwise read as `ERR`.
pub(super) fn script_error(error: &str) -> &str {
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
