//! One gRPC request and its reply on a connection: the request's headers and its one message,
//! then the reply read as it comes (its headers, at most one message of at most
//! [`MAX_MESSAGE`](super::frame::MAX_MESSAGE), its trailers with the status). A reply that is
//! HTTP/2 but no gRPC reply (another status than 200, another content type, two messages, a
//! message cut off) is malformed.

use bytes::Bytes;
use h2::RecvStream;
use http::{HeaderMap, Request, Response};

use super::conn::Conn;
use super::frame::Deframer;
use super::{Failed, Status};

/// What etcd answered: its reply, or the error it answered with.
pub type Answer = Result<Bytes, Status>;

/// The request `path` with `message` (framed) on `conn`, with the user's `token`: etcd's
/// answer, once whole. The caller bounds it in time.
pub async fn unary(
    conn: &Conn,
    path: &str,
    message: Bytes,
    token: Option<&str>,
) -> Result<Answer, Failed> {
    let (response, mut send) = start(conn, path, token).await?;
    send.send_data(message, true)?;
    let response = response.await?;
    match headers_say(&response)? {
        Some(Err(status)) => return Ok(Err(status)),
        Some(Ok(())) => return Err(Failed::Malformed("an OK status with no message".into())),
        None => {}
    }
    let mut body = response.into_body();
    let mut deframer = Deframer::default();
    let mut reply = None;
    while let Some(data) = body.data().await {
        let data = data?;
        let _ = body.flow_control().release_capacity(data.len());
        deframer.push(&data)?;
        while let Some(message) = deframer.next()? {
            if reply.replace(message).is_some() {
                return Err(Failed::Malformed("two messages for one request".into()));
            }
        }
    }
    if deframer.partial() {
        return Err(Failed::Malformed("a message cut off".into()));
    }
    let trailers = body.trailers().await?.unwrap_or_default();
    match (Status::of(&trailers), reply) {
        (Some(Ok(())), Some(reply)) => Ok(Ok(reply)),
        (Some(Err(status)), _) => Ok(Err(status)),
        (Some(Ok(())), None) => Err(Failed::Malformed("an OK status with no message".into())),
        (None, _) => Err(Failed::Malformed("a reply without a gRPC status".into())),
    }
}

/// Sends the headers of a request to `path` (its message to follow): the response to come,
/// and the request's stream.
pub async fn start(
    conn: &Conn,
    path: &str,
    token: Option<&str>,
) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), Failed> {
    let mut request = Request::post(conn.uri(path))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        // A member cut off from its leader answers "no leader" at once, and cancels its
        // watches, rather than hang (the request then moves on to another member).
        .header("hasleader", "true");
    if let Some(token) = token {
        request = request.header("token", token);
    }
    let request = request
        .body(())
        .map_err(|e| Failed::Malformed(format!("a request that cannot be sent ({e})")))?;
    let mut sender = conn.sender.clone().ready().await?;
    Ok(sender.send_request(request, false)?)
}

/// Checks a reply's headers: `Some(status)` when they end it (gRPC's trailers-only reply, an
/// error as a rule), `None` when messages follow.
pub fn headers_say(response: &Response<RecvStream>) -> Result<Option<Result<(), Status>>, Failed> {
    if response.status() != http::StatusCode::OK {
        return Err(Failed::Malformed(format!(
            "HTTP status {}",
            response.status()
        )));
    }
    let headers: &HeaderMap = response.headers();
    let grpc = headers
        .get("content-type")
        .and_then(|t| t.to_str().ok())
        .is_some_and(|t| t.starts_with("application/grpc"));
    if !grpc {
        return Err(Failed::Malformed("a reply that is not gRPC".into()));
    }
    Ok(Status::of(headers))
}
