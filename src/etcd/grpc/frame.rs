//! gRPC's framing of messages on an HTTP/2 stream: each message a flag byte (compressed or
//! not), a 4-byte big-endian length and the protobuf bytes. A reply is read as it comes, and
//! refused as soon as its length announces more than [`MAX_MESSAGE`] (before a byte of it is
//! kept), or once a stream has brought more than [`MAX_STREAM`] in all: no server can make this
//! client buffer more than one message's worth, nor read a stream without end.

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;

use super::Failed;

/// The most one message may hold: 16 MiB, as much as the Redis client reads of one reply
/// (DESIGN allows up to 64). The largest message this client asks for is a range of one
/// NAME's keys (`status`, a `--shared` or `--holders` run reading the keys before its own):
/// some 150 bytes a key, so some hundred thousand contenders fit.
pub const MAX_MESSAGE: usize = 16 << 20;

/// The most one stream may bring in all, its messages added up: 64 MiB. A watch and a
/// keep-alive stream live as long as a run; a keep-alive reply is some 30 bytes, so a stream
/// renewing every 5 s reaches it after months, and is then opened anew.
pub const MAX_STREAM: u64 = 64 << 20;

/// A message, framed.
pub fn encode<M: Message>(message: &M) -> Bytes {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.extend_from_slice(&[0]);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    message
        .encode(&mut buf)
        .expect("a buffer of the message's length");
    buf.freeze()
}

/// The messages of one stream, from its bytes as they come.
#[derive(Default)]
pub struct Deframer {
    buf: BytesMut,
    /// Bytes pushed, over the stream's life.
    total: u64,
}

impl Deframer {
    /// Takes the next piece of the stream: refused when its messages' framing announces one
    /// past [`MAX_MESSAGE`], or the stream passes [`MAX_STREAM`].
    pub fn push(&mut self, data: &[u8]) -> Result<(), Failed> {
        self.total += data.len() as u64;
        if self.total > MAX_STREAM {
            return Err(Failed::TooLarge(format!(
                "a stream of more than the {} MiB this client reads of one",
                MAX_STREAM >> 20
            )));
        }
        self.buf.extend_from_slice(data);
        self.announced().map(|_| ())
    }

    /// The length the next message announces, once its prefix is in; checked.
    fn announced(&self) -> Result<Option<usize>, Failed> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        match self.buf[0] {
            0 => {}
            // This client never asks for compression: a server that sends it anyway speaks
            // something else.
            1 => {
                return Err(Failed::Malformed(
                    "a compressed message, never asked for".into(),
                ));
            }
            flag => return Err(Failed::Malformed(format!("a message flagged {flag}"))),
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(Failed::TooLarge(format!(
                "a message of {len} bytes, over the {} MiB this client reads",
                MAX_MESSAGE >> 20
            )));
        }
        Ok(Some(len))
    }

    /// The next whole message, if one is in.
    pub fn next(&mut self) -> Result<Option<Bytes>, Failed> {
        let Some(len) = self.announced()? else {
            return Ok(None);
        };
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        Ok(Some(self.buf.split_to(len).freeze()))
    }

    /// Whether bytes of a message are still in: a stream that ends here ended mid-message.
    pub fn partial(&self) -> bool {
        !self.buf.is_empty()
    }
}

/// A message of type `M` from its bytes: bytes that are no such message are malformed.
pub fn decode<M: Message + Default>(bytes: Bytes) -> Result<M, Failed> {
    M::decode(bytes).map_err(|e| Failed::Malformed(format!("a message that is not etcd's ({e})")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::proto::etcdserverpb::LeaseKeepAliveRequest;

    #[test]
    fn messages_come_whole_in_any_pieces() {
        let one = encode(&LeaseKeepAliveRequest { id: 7 });
        let two = encode(&LeaseKeepAliveRequest { id: 300 });
        let stream = [one.as_ref(), two.as_ref()].concat();
        for cut in 0..stream.len() {
            let mut d = Deframer::default();
            let mut got = Vec::new();
            for piece in [&stream[..cut], &stream[cut..]] {
                d.push(piece).unwrap();
                while let Some(m) = d.next().unwrap() {
                    got.push(decode::<LeaseKeepAliveRequest>(m).unwrap().id);
                }
            }
            assert_eq!(got, [7, 300], "cut at {cut}");
            assert!(!d.partial());
        }
    }

    #[test]
    fn a_message_announced_past_the_limit_is_refused_at_its_prefix() {
        let mut d = Deframer::default();
        let refused = d.push(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert!(
            matches!(&refused, Failed::TooLarge(w) if w.contains("4294967295 bytes")),
            "{refused:?}"
        );
        let mut d = Deframer::default();
        assert!(matches!(
            d.push(&[1, 0, 0, 0, 1]),
            Err(Failed::Malformed(_))
        ));
    }

    #[test]
    fn a_stream_past_its_total_is_refused() {
        let mut d = Deframer::default();
        let empty = encode(&LeaseKeepAliveRequest { id: 0 });
        let chunk = empty.repeat(64 << 10);
        let mut refused = None;
        for _ in 0..(MAX_STREAM / chunk.len() as u64 + 2) {
            if let Err(e) = d.push(&chunk) {
                refused = Some(e);
                break;
            }
            while d.next().unwrap().is_some() {}
        }
        assert!(matches!(refused, Some(Failed::TooLarge(_))), "{refused:?}");
    }
}
