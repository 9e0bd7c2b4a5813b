//! Every reply bounded: the PostgreSQL byte stream, read through a wrapper that follows the
//! protocol's framing (a tag byte, then a length that counts itself) and fails the read at a
//! message's header when it announces more than [`MAX_MESSAGE`], when a reply (what comes
//! before the next ReadyForQuery) passes [`MAX_REPLY`], when notices, notifications and
//! parameter reports pile up past [`MAX_ASIDE`], or when the bytes are no protocol message at
//! all. tokio-postgres itself reserves whatever length a header announces (up to 4 GiB) and
//! keeps every parameter report and every notice of the start-up in memory; this wrapper stops
//! both before they grow. The reason is kept for the line that ends the attempt: the client
//! library only says that the connection closed.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The longest protocol message read: far above any row of the lock's tables.
pub const MAX_MESSAGE: u32 = 16 << 20;
/// The most one reply may carry, all its rows together.
pub const MAX_REPLY: u64 = 16 << 20;
/// The most notices, notifications and parameter reports may carry between two replies.
pub const MAX_ASIDE: u64 = 1 << 20;

/// Why a read was refused, shared with the connection that reports it.
pub type Refusal = Arc<Mutex<Option<String>>>;

/// A stream whose reads follow the backend's message framing.
pub struct Bounded<S> {
    inner: S,
    header: [u8; 5],
    have: usize,
    /// Body bytes of the current message not yet seen.
    body: u64,
    reply: u64,
    aside: u64,
    refusal: Refusal,
}

impl<S> Bounded<S> {
    pub fn new(inner: S, refusal: Refusal) -> Bounded<S> {
        Bounded {
            inner,
            header: [0; 5],
            have: 0,
            body: 0,
            reply: 0,
            aside: 0,
            refusal,
        }
    }

    /// Follows `bytes`, the next bytes of the stream: `Err` with the reason at the first
    /// header that announces too much, or that is no message of the protocol.
    fn follow(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while !bytes.is_empty() {
            if self.body > 0 {
                let skip = (self.body.min(bytes.len() as u64)) as usize;
                self.body -= skip as u64;
                bytes = &bytes[skip..];
                continue;
            }
            self.header[self.have] = bytes[0];
            self.have += 1;
            bytes = &bytes[1..];
            if self.have < 5 {
                continue;
            }
            self.have = 0;
            let tag = self.header[0];
            let length = u32::from_be_bytes([
                self.header[1],
                self.header[2],
                self.header[3],
                self.header[4],
            ]);
            self.check(tag, length)?;
            self.body = u64::from(length) - 4;
        }
        Ok(())
    }

    fn check(&mut self, tag: u8, length: u32) -> Result<(), String> {
        // The backend's message tags (protocol 3.0), but COPY's (G, H, W, c, d): the lock never
        // copies, and an `HTTP/1.1` answer would otherwise read as a CopyOutResponse.
        const TAGS: &[u8] = b"RKSZTDCEINAnst123V";
        if !TAGS.contains(&tag) {
            return Err(format!(
                "a malformed reply: a message tagged {:?} is no PostgreSQL message",
                tag as char
            ));
        }
        if length < 4 {
            return Err(format!("a malformed reply: a message length of {length}"));
        }
        if length > MAX_MESSAGE {
            return Err(format!(
                "a reply too large: a message of {length} bytes, more than the {} MiB a \
                 message may have",
                MAX_MESSAGE >> 20
            ));
        }
        let size = u64::from(length) + 1;
        match tag {
            b'Z' => {
                self.reply = 0;
                self.aside = 0;
            }
            b'N' | b'A' | b'S' => {
                self.aside += size;
                if self.aside > MAX_ASIDE {
                    return Err(format!(
                        "a reply too large: more than the {} MiB of notices, notifications and \
                         parameters allowed between two replies",
                        MAX_ASIDE >> 20
                    ));
                }
            }
            _ => {
                self.reply += size;
                if self.reply > MAX_REPLY {
                    return Err(format!(
                        "a reply too large: more than the {} MiB a reply may have",
                        MAX_REPLY >> 20
                    ));
                }
            }
        }
        Ok(())
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = buf.filled()[before..].to_vec();
            if let Err(why) = self.follow(&new) {
                if let Ok(mut refusal) = self.refusal.lock() {
                    refusal.get_or_insert(why.clone());
                }
                return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)));
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded() -> Bounded<()> {
        Bounded::new((), Refusal::default())
    }

    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend(((body.len() + 4) as u32).to_be_bytes());
        m.extend(body);
        m
    }

    #[test]
    fn messages_pass_whatever_way_they_are_cut() {
        let mut stream = message(b'R', &[0, 0, 0, 0]);
        stream.extend(message(b'D', &[7; 300]));
        stream.extend(message(b'Z', b"I"));
        for cut in [1, 2, 5, 7, 100, stream.len()] {
            let mut b = bounded();
            for piece in stream.chunks(cut) {
                b.follow(piece).unwrap();
            }
            assert_eq!((b.have, b.body, b.reply), (0, 0, 0));
        }
    }

    #[test]
    fn a_huge_or_impossible_header_is_refused_before_its_body() {
        let e = bounded()
            .follow(&[b'D', 0xff, 0xff, 0xff, 0xff])
            .unwrap_err();
        assert!(
            e.starts_with("a reply too large: a message of 4294967295 bytes"),
            "{e}"
        );
        let e = bounded().follow(&[b'D', 0, 0, 0, 2]).unwrap_err();
        assert_eq!(e, "a malformed reply: a message length of 2");
        let e = bounded().follow(b"HTTP/1.1 400").unwrap_err();
        assert!(
            e.starts_with("a malformed reply: a message tagged 'H'"),
            "{e}"
        );
    }

    #[test]
    fn an_endless_reply_is_refused_at_its_bound() {
        let mut b = bounded();
        let row = message(b'D', &[0; 1 << 20]);
        let refused = (0..20).find_map(|_| b.follow(&row).err()).unwrap();
        assert!(
            refused.contains("more than the 16 MiB a reply"),
            "{refused}"
        );
        let mut b = bounded();
        let notice = message(b'N', &[b'x'; 4096]);
        let refused = (0..300).find_map(|_| b.follow(&notice).err()).unwrap();
        assert!(refused.contains("notices"), "{refused}");
    }
}
