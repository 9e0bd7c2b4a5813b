//! Unit tests of the protocol client: every reply type and the limits. Arbitrary bytes that
//! must never panic nor allocate past the limits are in `properties`, replies read in pieces
//! in `piecewise`, the `redis` crate's parser as an oracle in `oracle`.

use super::parse::{MAX_DEPTH, PREALLOCATED};
use super::*;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::FutureExt;
use proptest::collection::vec;
use proptest::prelude::*;
use tokio::io::ReadBuf;

mod oracle;
mod piecewise;
mod properties;

use properties::*;

/// One reply parsed from the front of `buf` in one go, as from a read that brought it all.
fn parse(buf: &[u8]) -> io::Result<Option<(Reply, usize)>> {
    Parser::new().parse(buf)
}

fn all(bytes: &[u8]) -> Vec<Reply> {
    let mut at = 0;
    let mut got = Vec::new();
    while at < bytes.len() {
        let (reply, used) = parse(&bytes[at..]).unwrap().unwrap();
        got.push(reply);
        at += used;
    }
    got
}

#[test]
fn encodes_bulk_string_arrays() {
    let mut out = Vec::new();
    encode(&mut out, &[b"GET", b"lock:{x}"]);
    assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$8\r\nlock:{x}\r\n");
}

#[test]
fn parses_resp2_and_waits_for_more() {
    let got = all(b"+OK\r\n-ERR no\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n:1\r\n$-1\r\n*-1\r\n");
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

#[test]
fn folds_resp3_types() {
    let got = all(b"_\r\n#t\r\n,1.5\r\n%1\r\n$1\r\nk\r\n:2\r\n~1\r\n:3\r\n!5\r\nERR x\r\n=7\r\ntxt:abc\r\n|1\r\n+a\r\n+b\r\n:9\r\n>3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n");
    assert_eq!(got[0], Reply::Bulk(None));
    assert_eq!(got[1], Reply::Int(1));
    assert_eq!(got[2], Reply::Bulk(Some(b"1.5".to_vec())));
    assert_eq!(
        got[3],
        Reply::Array(Some(vec![Reply::Bulk(Some(b"k".to_vec())), Reply::Int(2)]))
    );
    assert_eq!(got[4], Reply::Array(Some(vec![Reply::Int(3)])));
    assert_eq!(got[5], Reply::Error("ERR x".into()));
    assert_eq!(got[6], Reply::Bulk(Some(b"abc".to_vec())));
    assert_eq!(got[7], Reply::Int(9), "the attribute is skipped");
    assert_eq!(got[8].pubsub_kind().as_deref(), Some("message"));
    assert!(matches!(got[8], Reply::Push(_)));
}

// Allocation is measured by a counting allocator that only counts on a thread that asked
// it to, inside `measure`: the other unit tests of this binary run in parallel threads and
// pay one read of a thread-local flag per allocation, nothing else. The thread-locals are
// `const`-initialised and have no destructor, so reading them never allocates itself.
struct Counting;

#[global_allocator]
static COUNTING: Counting = Counting;

#[derive(Clone, Copy)]
struct Meter {
    on: bool,
    live: isize,
    peak: isize,
}

thread_local! {
    static METER: Cell<Meter> = const { Cell::new(Meter { on: false, live: 0, peak: 0 }) };
}

fn note(bytes: isize) {
    let _ = METER.try_with(|meter| {
        let mut m = meter.get();
        if m.on {
            m.live += bytes;
            m.peak = m.peak.max(m.live);
            meter.set(m);
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size() as isize);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // The old block and the new one may both be live for a moment: count that peak.
        note(new_size as isize);
        note(-(layout.size() as isize));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` and returns, with its result, the most bytes this thread had allocated at once
/// meanwhile (what `f` returns included).
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize) {
    METER.with(|m| {
        m.set(Meter {
            on: true,
            live: 0,
            peak: 0,
        })
    });
    let out = f();
    let peak = METER.with(|m| {
        let peak = m.get().peak;
        m.set(Meter {
            on: false,
            live: 0,
            peak: 0,
        });
        peak
    });
    (out, peak.max(0) as usize)
}

/// The most `parse` may allocate for an input of `len` bytes, whatever the input announces:
/// the room reserved for the elements of the aggregates still open (at most `MAX_DEPTH`),
/// and otherwise a bounded multiple of what arrived (an element takes at least 3 bytes of
/// input and 32 bytes of a `Vec`, twice that while it grows; a status line, lossily
/// decoded, up to 3 bytes a byte), plus an error message.
fn allocation_bound(len: usize) -> usize {
    MAX_DEPTH * PREALLOCATED * size_of::<Reply>() + 32 * len + 4096
}

/// A server that sends `bytes` in reads of `sizes` bytes (in turn), then `forever` without
/// end, or closes the connection when that is `None`; what is written to it is dropped.
struct Feed {
    bytes: Vec<u8>,
    at: usize,
    sizes: Vec<usize>,
    turn: usize,
    forever: Option<u8>,
}

impl AsyncRead for Feed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let feed = &mut *self;
        if feed.at < feed.bytes.len() {
            let size = feed.sizes[feed.turn % feed.sizes.len()];
            feed.turn += 1;
            let n = size.min(out.remaining()).min(feed.bytes.len() - feed.at);
            out.put_slice(&feed.bytes[feed.at..feed.at + n]);
            feed.at += n;
        } else if let Some(byte) = feed.forever {
            let n = out.remaining();
            out.put_slice(&vec![byte; n]);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Feed {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Ok(b.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn connection(bytes: Vec<u8>, sizes: Vec<usize>, forever: Option<u8>) -> Connection {
    Connection {
        stream: Box::new(Feed {
            bytes,
            at: 0,
            sizes,
            turn: 0,
            forever,
        }),
        buf: Vec::with_capacity(512),
        start: 0,
        parser: Parser::new(),
        messages: VecDeque::new(),
        confirmed: 0,
        channel: None,
        unsubscribing: false,
        peer: "fed".into(),
    }
}

/// `read_any` on a server that is always ready: done in one poll.
fn read_now(conn: &mut Connection) -> io::Result<Reply> {
    conn.read_any()
        .now_or_never()
        .expect("a ready server never leaves a read pending")
}

fn nested(depth: usize) -> Vec<u8> {
    let mut bytes = b"*1\r\n".repeat(depth);
    bytes.extend_from_slice(b":1\r\n");
    bytes
}

fn refused(input: &[u8], what: &str) {
    let (parsed, peak) = measure(|| parse(input));
    let err = parsed.expect_err("over a limit");
    assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains(what), "{err}");
    assert!(peak < 64 << 10, "{peak} bytes allocated to refuse it");
}

// Before the limits, `$9223372036854775807\r\n` (or `*` with that count) was a reply the
// parser waited for forever, and a connection buffered whatever followed; some hundreds of
// nested arrays, or a long enough chain of attributes, overflowed the stack.
#[test]
fn refuses_what_no_reply_of_ours_comes_near() {
    let header = |len: usize| format!("${len}\r\n");
    let largest = MAX_REPLY_BYTES - 2 - header(MAX_REPLY_BYTES).len();
    assert_eq!(parse(header(largest).as_bytes()).unwrap(), None);
    refused(header(largest + 1).as_bytes(), "longer than the 16 MiB");
    refused(b"$9223372036854775807\r\n", "longer than");
    refused(b"=9223372036854775807\r\n", "longer than");
    refused(b"*2\r\n$16777200\r\n", "longer than");
    refused(b"*9223372036854775807\r\n", "over the 100000 values");
    refused(b"|9223372036854775807\r\n", "over the 100000 values");
    refused(b"%50001\r\n", "over the 100000 values");
    refused(
        b"*2\r\n*99999\r\n",
        "after 2 values, over the 100000 values",
    );
    refused(&nested(MAX_DEPTH + 1), "nested more than 64 deep");
    refused(&b"*1\r\n".repeat(100_000), "nested more than 64 deep");
    refused(b"$3\r\nabcXY", "not followed by CRLF");

    // A count is a claim: what it claims is not allocated before it arrives.
    let (parsed, peak) = measure(|| parse(b"*100000\r\n"));
    assert_eq!(parsed.unwrap(), None);
    assert!(peak <= PREALLOCATED * size_of::<Reply>(), "{peak}");
    assert_eq!(parse(b"%50000\r\n").unwrap(), None);
}

// See: issue 35, item 5. `$-5` was read as a nil, and the run then waited for the replies
// after it until its deadline: "did not answer within 1.5s" of a server that had answered.
#[test]
fn a_negative_length_but_nils_is_malformed_not_too_large() {
    for input in [
        &b"$-5\r\n"[..],
        b"*-2\r\n",
        b"%-9\r\n",
        b"*2\r\n:1\r\n!-3\r\n",
    ] {
        let err = parse(input).expect_err("malformed");
        let bad = super::bad_reply(&err).expect("a BadReply");
        assert!(!bad.too_large, "{err}");
        assert!(bad.what.contains("a length of -"), "{err}");
    }
    assert_eq!(parse(b"$-1\r\n").unwrap(), Some((Reply::Bulk(None), 5)));
    assert_eq!(parse(b"*-1\r\n").unwrap(), Some((Reply::Array(None), 5)));
    let err = parse(b"$9223372036854775807\r\n").unwrap_err();
    assert!(
        super::bad_reply(&err).is_some_and(|bad| bad.too_large),
        "{err}"
    );
}

#[test]
fn the_limits_leave_room_for_every_reply() {
    let (reply, used) = parse(&nested(MAX_DEPTH)).unwrap().unwrap();
    assert_eq!(used, nested(MAX_DEPTH).len());
    let mut depth = 0;
    let mut at = &reply;
    while let Reply::Array(Some(items)) = at {
        depth += 1;
        at = &items[0];
    }
    assert_eq!((depth, at), (MAX_DEPTH, &Reply::Int(1)));

    // Attributes are skipped in a loop: a long chain of them is no deeper than one.
    let mut chain = b"|0\r\n".repeat(100_000);
    chain.extend_from_slice(b":7\r\n");
    assert_eq!(parse(&chain).unwrap(), Some((Reply::Int(7), chain.len())));

    // `$16777203\r\n`, that many bytes and a CRLF: a reply of exactly the limit.
    let len = MAX_REPLY_BYTES - 13;
    let mut largest = format!("${len}\r\n").into_bytes();
    largest.resize(MAX_REPLY_BYTES - 2, b'x');
    largest.extend_from_slice(b"\r\n");
    let (reply, used) = parse(&largest).unwrap().unwrap();
    assert_eq!(used, MAX_REPLY_BYTES);
    assert!(matches!(reply, Reply::Bulk(Some(b)) if b.len() == len));
}

// A connection buffered a reply's bytes for as long as the reply was incomplete: 64 MiB
// of a bulk string announced as 2 GB, had the server sent that much before closing.
#[test]
fn a_connection_buffers_no_more_than_a_reply_may_take() {
    let mut conn = connection(b"$2000000000\r\n".to_vec(), vec![4096], Some(0));
    let err = read_now(&mut conn).unwrap_err();
    assert!(err.to_string().contains("longer than"), "{err}");
    assert!(conn.buf.len() <= 4096);

    // One that only shows it is too long once it has reached the limit: a bulk string
    // ending just short of it, then a line without end.
    let bulk = MAX_REPLY_BYTES - 64;
    let mut bytes = format!("*2\r\n${bulk}\r\n").into_bytes();
    bytes.resize(bytes.len() + bulk, b'x');
    bytes.extend_from_slice(b"\r\n+");
    let mut conn = connection(bytes, vec![4096], Some(b'a'));
    let err = read_now(&mut conn).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(err.to_string().contains("longer than"), "{err}");
    assert_eq!(conn.buf.len(), MAX_REPLY_BYTES);
    assert!(
        conn.buf.capacity() <= MAX_REPLY_BYTES,
        "{}",
        conn.buf.capacity()
    );
}
