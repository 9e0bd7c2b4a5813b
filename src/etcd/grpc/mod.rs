//! etcd's gRPC API on one HTTP/2 connection, with h2 and prost and no gRPC framework: a run is a
//! short-lived process whose cost is mostly page faults, and what it needs of gRPC is small (a
//! request and its reply; a stream of messages each way). `conn` opens the connection (TCP, or
//! TLS with ALPN `h2`), `call` sends a request and reads its reply, `stream` keeps a stream
//! open both ways (the lease's keep-alives, a watch), `frame` frames and bounds the messages.
//!
//! Every reply is bounded: HTTP/2's own limits (a header list of [`conn::MAX_HEADERS`], flow
//! control windows that let a server send only what this client has read), one message of at
//! most [`frame::MAX_MESSAGE`], a stream of at most [`frame::MAX_STREAM`] in all, and every
//! wait has a deadline (the callers' `timeout_at`).

pub mod call;
pub mod conn;
pub mod frame;
pub mod stream;

use super::url::Endpoint;
use crate::backend::BackendError;

/// gRPC status codes etcd answers with.
pub const CANCELLED: i32 = 1;
pub const INVALID_ARGUMENT: i32 = 3;
pub const NOT_FOUND: i32 = 5;
pub const FAILED_PRECONDITION: i32 = 9;
pub const UNAUTHENTICATED: i32 = 16;

/// An error etcd answered with (its gRPC status, not OK): its code and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: i32,
    pub message: String,
}

impl Status {
    /// The status a header list carries (`grpc-status`, `grpc-message`): `None` without one,
    /// `Some(Ok(()))` for OK. A message is percent-encoded on the wire.
    pub fn of(headers: &http::HeaderMap) -> Option<Result<(), Status>> {
        let code = headers.get("grpc-status")?;
        let code: i32 = code.to_str().ok()?.trim().parse().ok()?;
        if code == 0 {
            return Some(Ok(()));
        }
        let message = headers
            .get("grpc-message")
            .map(|m| {
                percent_encoding::percent_decode(m.as_bytes())
                    .decode_utf8_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        Some(Err(Status { code, message }))
    }

    /// Unavailable (no leader, leader changed, timed out), Aborted, DeadlineExceeded,
    /// Canceled, Unknown, and too many requests: worth trying again, on another member.
    pub fn transient(&self) -> bool {
        match self.code {
            1 | 2 | 4 | 10 | 14 => true,
            8 => !self.message.contains("space"),
            _ => false,
        }
    }
}

/// Why an exchange brought no reply to read.
#[derive(Debug)]
pub enum Failed {
    /// h2's: no connection, a connection closed or reset, a stream refused, or bytes that are
    /// not HTTP/2.
    Http(h2::Error),
    /// A reply past [`frame::MAX_MESSAGE`] or [`frame::MAX_STREAM`]: by how much, in words.
    TooLarge(String),
    /// A reply that is HTTP/2 but not etcd's gRPC: what it was, in words.
    Malformed(String),
    /// A stream that ended with a status (OK, or an error etcd answered).
    Ended(Result<(), Status>),
}

impl From<h2::Error> for Failed {
    fn from(error: h2::Error) -> Failed {
        Failed::Http(error)
    }
}

impl Failed {
    /// Whether the connection itself is gone or unusable (not just this one stream): the next
    /// request goes on a new one.
    pub fn lost_connection(&self) -> bool {
        match self {
            Failed::Http(e) => e.is_io() || e.is_go_away() || e.reason().is_none(),
            Failed::TooLarge(_) | Failed::Malformed(_) => true,
            Failed::Ended(_) => false,
        }
    }

    /// The line for this failure at `at`: a transient error, as a server gone would be
    /// (another member is asked, a waiter or holder tries again), that says what came.
    pub fn line(&self, at: &Endpoint) -> BackendError {
        BackendError::Transient(match self {
            Failed::TooLarge(what) => {
                crate::text::message!("etcd at {at} sent a reply too large: {what}")
            }
            Failed::Malformed(what) => crate::text::message!(
                "etcd at {at} sent a malformed reply ({what}): it does not answer as etcd's gRPC \
                 API; check the URL's port"
            ),
            // Frames that are not HTTP/2, or break its rules: h2 refused them.
            Failed::Http(e) if e.is_go_away() && e.is_library() => crate::text::message!(
                "etcd at {at} sent a malformed reply ({e}): it does not answer as etcd's gRPC \
                 API; check the URL's port"
            ),
            Failed::Http(e) if e.is_go_away() => {
                crate::text::message!("etcd at {at} closed the connection (going away): {e}")
            }
            Failed::Http(e) if e.is_reset() => {
                crate::text::message!("etcd at {at} reset the request: {e}")
            }
            Failed::Http(e) if e.is_io() => crate::text::message!(
                "etcd at {at} does not answer as etcd's gRPC API: {e}; check the URL's port \
                 (Redis's?), or the member is going down"
            ),
            Failed::Http(e) => crate::text::message!("etcd at {at}: {e}"),
            Failed::Ended(Ok(())) => crate::text::message!("etcd at {at} ended the stream"),
            Failed::Ended(Err(status)) => {
                crate::text::message!("etcd at {at} answered: {}", status.message)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_is_read_from_its_headers_and_its_message_decoded() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(Status::of(&headers), None);
        headers.insert("grpc-status", "0".parse().unwrap());
        assert_eq!(Status::of(&headers), Some(Ok(())));
        headers.insert("grpc-status", "14".parse().unwrap());
        headers.insert("grpc-message", "etcdserver: no%20leader".parse().unwrap());
        let status = Status::of(&headers).unwrap().unwrap_err();
        assert_eq!(status.code, 14);
        assert_eq!(status.message, "etcdserver: no leader");
        assert!(status.transient());
        let full = Status {
            code: 8,
            message: "etcdserver: mvcc: database space exceeded".into(),
        };
        assert!(!full.transient());
    }
}
