//! How much of etcd's replies this client reads, and what a reply it could not read says: a
//! body is refused as soon as it announces more than [`MAX_REPLY_BYTES`], or once that much
//! of it has come (a chunked one announces nothing); a watch's messages are bounded alike
//! (`watch.rs`). Without a bound, a server (or whatever answers on its port) announcing a
//! 40 GB body was read into memory until the request's deadline, gigabytes of it.

use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};

use super::url::Endpoint;
use crate::backend::BackendError;

/// The most of one reply (a body, or one message of a watch) this client reads: 16 MiB, as
/// much as the Redis client reads of one reply (DESIGN allows up to 64). The largest reply it
/// asks for is a range of one NAME's keys (`status`, and a `--shared` or `--holders` run
/// reading the keys before its own): some 400 bytes a key as the gateway writes it, so tens of
/// thousands of contenders fit; every other reply is one small object.
pub const MAX_REPLY_BYTES: usize = 16 << 20;

/// The most JSON values one reply may hold, counted as the bytes that open or separate them
/// (`[`, `{`, `,`, `:`; inside strings too, which only counts more). A parsed value takes some
/// 75 bytes, so 16 MiB of `[],` would have taken 420 MB once parsed; this keeps a reply's
/// tree under about 40 MB. A key as the gateway writes it counts 13, so some 38 000 keys fit.
pub const MAX_VALUES: usize = 500_000;

/// Why an exchange brought no reply to read.
#[derive(Debug)]
pub enum Failed {
    /// hyper's: no connection, a connection closed, or bytes that are not an HTTP reply.
    Http(hyper::Error),
    /// A body past [`MAX_REPLY_BYTES`] or [`MAX_VALUES`]: by how much, in words.
    TooLarge(String),
}

impl From<hyper::Error> for Failed {
    fn from(error: hyper::Error) -> Failed {
        Failed::Http(error)
    }
}

impl Failed {
    /// Whether the server hung up before a whole reply: on a new connection, a server that
    /// does not speak HTTP (Redis closes a connection that sends it an HTTP request), or a
    /// member going down.
    fn hung_up(&self) -> bool {
        let Failed::Http(e) = self else {
            return false;
        };
        let reset = std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                )
            });
        e.is_incomplete_message() || reset
    }

    /// The line for this failure at `at`: a transient error, as a server gone would be
    /// (another member is asked, a waiter or holder tries again), that says what came.
    pub fn line(&self, at: &Endpoint) -> BackendError {
        BackendError::Transient(match self {
            Failed::TooLarge(what) => {
                crate::text::message!("etcd at {at} sent a reply too large: {what}")
            }
            // hyper bounds a reply's head (about 400 KiB), and says so only in words.
            Failed::Http(e) if e.is_parse() && e.to_string().contains("too large") => {
                crate::text::message!(
                    "etcd at {at} sent a reply too large: its HTTP head is longer than this client \
                 reads"
                )
            }
            Failed::Http(e) if e.is_parse() || e.is_parse_status() => crate::text::message!(
                "etcd at {at} sent a malformed reply ({e}): it does not answer as etcd's JSON \
                 gateway; check the URL's port"
            ),
            Failed::Http(e) if self.hung_up() => crate::text::message!(
                "etcd at {at} does not answer as etcd's gateway: it closed the connection \
                 before a whole HTTP reply ({e}); check the URL's port (Redis's?), or the \
                 member is going down"
            ),
            Failed::Http(e) => crate::text::message!("etcd at {at}: {e}"),
        })
    }
}

/// One request on `sender`, and the whole reply: its status and body.
pub async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Result<(StatusCode, Bytes), Failed> {
    sender.ready().await?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    Ok((status, body(response).await?))
}

/// A reply's whole body, within [`MAX_REPLY_BYTES`] and [`MAX_VALUES`].
pub async fn body(response: Response<Incoming>) -> Result<Bytes, Failed> {
    let body = response.into_body();
    let most = MAX_REPLY_BYTES >> 20;
    // A Content-Length past the limit is refused before a byte of the body is read.
    let announced = body.size_hint().lower();
    if announced > MAX_REPLY_BYTES as u64 {
        return Err(Failed::TooLarge(format!(
            "it announced {announced} bytes, over the {most} MiB this client reads"
        )));
    }
    // Copied piece by piece into one buffer: a body sent in countless tiny chunks must cost
    // its bytes, not a kept frame (and the read buffer it points into) for each chunk.
    let mut body = body;
    let mut bytes = Vec::with_capacity(announced.min(64 * 1024) as usize);
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.map_err(Failed::Http)?.data_ref() {
            if bytes.len() + data.len() > MAX_REPLY_BYTES {
                return Err(Failed::TooLarge(format!(
                    "more than the {most} MiB this client reads"
                )));
            }
            bytes.extend_from_slice(data);
        }
    }
    within_values(&bytes).map_err(Failed::TooLarge)?;
    Ok(Bytes::from(bytes))
}

/// Refuses JSON text that could hold more than [`MAX_VALUES`] values, before it is parsed.
pub fn within_values(json: &[u8]) -> Result<(), String> {
    let values = json
        .iter()
        .filter(|b| matches!(b, b'[' | b'{' | b',' | b':'))
        .count();
    if values <= MAX_VALUES {
        return Ok(());
    }
    // Words for the line that names the server (`Failed::line`, a watch's `broke`).
    let what = format!("some {values} JSON values, over the {MAX_VALUES} this client reads");
    Err(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_before_the_parse() {
        assert_eq!(
            within_values(br#"{"kvs":[{"key":"am9i","lease":"7"}]}"#),
            Ok(())
        );
        let bomb = b"[],".repeat(MAX_VALUES);
        let refused = within_values(&bomb).unwrap_err();
        assert!(refused.contains("over the 500000"), "{refused}");
    }
}
