//! A gRPC stream open both ways on a connection (etcd's `LeaseKeepAlive`, `Watch`): messages
//! sent as they are asked for, and read as they come, each bounded, the stream's total too
//! (see `frame`). Reading is cancel-safe: a read dropped half-way (a signal, a deadline) loses
//! nothing, what came is kept for the next.

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use prost::Message;

use super::call::{headers_say, start};
use super::conn::Conn;
use super::frame::{Deframer, encode};
use super::{Failed, Status};

/// How many messages a read takes in a row before it lets the runtime run something else: a
/// server that sends messages without end must not keep a signal or a deadline out.
const IN_A_ROW: u32 = 64;

/// One open stream.
pub struct Duplex {
    send: SendStream<Bytes>,
    recv: RecvStream,
    deframer: Deframer,
    /// The id of the connection it is on.
    pub conn: u64,
}

impl Duplex {
    /// Opens a stream to `path` on `conn`, sends `first`, and waits for the reply's headers:
    /// an error etcd answered at once (its trailers-only reply) ends it here.
    pub async fn open<M: Message>(
        conn: &Conn,
        path: &str,
        token: Option<&str>,
        first: &M,
    ) -> Result<Duplex, Failed> {
        let (response, mut send) = start(conn, path, token).await?;
        send.send_data(encode(first), false)?;
        let response = response.await?;
        if let Some(ended) = headers_say(&response)? {
            return Err(Failed::Ended(ended.and(Err(Status {
                code: super::CANCELLED,
                message: "the stream ended as it opened".into(),
            }))));
        }
        Ok(Duplex {
            send,
            recv: response.into_body(),
            deframer: Deframer::default(),
            conn: conn.id,
        })
    }

    /// Sends `message` (HTTP/2 buffers it; flow control permitting, it goes at once).
    pub fn send<M: Message>(&mut self, message: &M) -> Result<(), Failed> {
        Ok(self.send.send_data(encode(message), false)?)
    }

    /// The next message; the stream's end (with its status) is [`Failed::Ended`].
    pub async fn next(&mut self) -> Result<Bytes, Failed> {
        let mut taken = 0u32;
        loop {
            if let Some(message) = self.deframer.next()? {
                return Ok(message);
            }
            taken += 1;
            if taken % IN_A_ROW == 0 {
                tokio::task::yield_now().await;
            }
            match self.recv.data().await {
                Some(data) => {
                    let data = data?;
                    let _ = self.recv.flow_control().release_capacity(data.len());
                    self.deframer.push(&data)?;
                }
                None => {
                    if self.deframer.partial() {
                        return Err(Failed::Malformed("a message cut off".into()));
                    }
                    let trailers = self.recv.trailers().await?.unwrap_or_default();
                    return Err(Failed::Ended(Status::of(&trailers).unwrap_or(Ok(()))));
                }
            }
        }
    }
}
