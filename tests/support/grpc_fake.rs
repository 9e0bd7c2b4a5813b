//! A fake etcd speaking gRPC over HTTP/2 (h2's server, prost's messages: the ones generated
//! from etcd's protos), for the tests that every reply is bounded: it answers as much of the
//! lock's conversation as a run needs to hold or to wait (a lease, a key that holds or waits
//! behind another, keep-alives, a watch confirmed), and one gRPC method of the test's choosing
//! with something hostile: a message announced as 4 GiB, messages without end, silence, a
//! header list of 1 MiB, one-byte frames, a reply that is no gRPC. Served in a thread of its
//! own, on a runtime of its own; stops accepting when dropped.

use std::net::TcpListener as StdListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::thread;

use bytes::{Buf, Bytes, BytesMut};
use h2::RecvStream;
use h2::server::SendResponse;
use http::{HeaderMap, Request, Response};
use prost::Message;

#[path = "../../src/etcd/proto/mod.rs"]
#[allow(dead_code, unused_imports)]
mod proto;

use proto::etcdserverpb as pb;
use proto::mvccpb::KeyValue;

/// Whether this run's key comes first (it holds) or after another's (it waits).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Standing {
    Holds,
    Waits,
}

/// What the hostile method answers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Answer {
    /// A message whose prefix announces 4 GiB, then zeros for ever.
    Announced4GiB,
    /// Messages of 1 MiB, one after the other, for ever.
    EndlessMessages,
    /// The reply's headers, then nothing.
    Silence,
    /// A header of 1 MiB.
    HugeHeaders,
    /// A message announced as 64 KiB, then its bytes one a frame, for ever slower.
    OneByteFrames,
    /// A 200 that is no gRPC reply (`text/html`).
    NotGrpc,
}

pub struct FakeEtcd {
    pub port: u16,
    stop: Arc<AtomicBool>,
    /// Keep-alive requests received, on every stream.
    kept: Arc<AtomicUsize>,
}

impl FakeEtcd {
    /// Serves the lock's conversation, `standing`, with `method` (`/etcdserverpb.KV/Range`,
    /// ...) answered by `answer`.
    pub fn start(standing: Standing, method: &'static str, answer: Answer) -> FakeEtcd {
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let kept = Arc::new(AtomicUsize::new(0));
        let counted = kept.clone();
        thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let leases = Arc::new(AtomicI64::new(7));
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    if stopped.load(Ordering::Relaxed) {
                        return;
                    }
                    let leases = leases.clone();
                    let counted = counted.clone();
                    tokio::spawn(async move {
                        let Ok(mut conn) = h2::server::handshake(tcp).await else {
                            return;
                        };
                        while let Some(Ok((request, respond))) = conn.accept().await {
                            let (leases, counted) = (leases.clone(), counted.clone());
                            tokio::spawn(async move {
                                let shared = (leases, counted);
                                serve(request, respond, standing, method, answer, shared).await;
                            });
                        }
                    });
                }
            });
        });
        FakeEtcd { port, stop, kept }
    }

    pub fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    /// How many keep-alive requests came, on every stream.
    pub fn keep_alives(&self) -> usize {
        self.kept.load(Ordering::Relaxed)
    }
}

impl Drop for FakeEtcd {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = std::net::TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// One request.
async fn serve(
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    standing: Standing,
    method: &'static str,
    answer: Answer,
    (leases, kept): (Arc<AtomicI64>, Arc<AtomicUsize>),
) {
    let path = request.uri().path().to_owned();
    let mut body = Messages {
        body: request.into_body(),
        buf: BytesMut::new(),
    };
    if path == method {
        let _ = hostile(&mut respond, answer).await;
        return;
    }
    let Some(first) = body.next().await else {
        return;
    };
    let reply = match path.as_str() {
        "/etcdserverpb.Lease/LeaseGrant" => pb::LeaseGrantResponse {
            id: leases.fetch_add(1, Ordering::Relaxed),
            ttl: 60,
            ..Default::default()
        }
        .encode_to_vec(),
        "/etcdserverpb.Lease/LeaseRevoke" => pb::LeaseRevokeResponse::default().encode_to_vec(),
        "/etcdserverpb.Lease/LeaseTimeToLive" => pb::LeaseTimeToLiveResponse {
            id: 7,
            ttl: 60,
            granted_ttl: 60,
            ..Default::default()
        }
        .encode_to_vec(),
        "/etcdserverpb.KV/Range" => range(vec![first_key(standing)]).encode_to_vec(),
        "/etcdserverpb.KV/Txn" => txn(standing, &first).encode_to_vec(),
        "/etcdserverpb.Lease/LeaseKeepAlive" => {
            return keep_alives(respond, body, first, &kept).await;
        }
        "/etcdserverpb.Watch/Watch" => {
            let created = pb::WatchResponse {
                header: Some(header(11)),
                watch_id: 1,
                created: true,
                ..Default::default()
            };
            let Ok(mut send) = respond.send_response(grpc_head(), false) else {
                return;
            };
            let _ = send.send_data(framed(&created.encode_to_vec()), false);
            // Never fires; held open until the client goes.
            while body.next().await.is_some() {}
            return;
        }
        _ => Vec::new(),
    };
    if let Ok(mut send) = respond.send_response(grpc_head(), false) {
        let _ = send.send_data(framed(&reply), false);
        let _ = send.send_trailers(ok_trailers());
    }
}

/// Each keep-alive answered, its lease alive for a minute.
async fn keep_alives(
    mut respond: SendResponse<Bytes>,
    mut body: Messages,
    first: Bytes,
    kept: &AtomicUsize,
) {
    let Ok(mut send) = respond.send_response(grpc_head(), false) else {
        return;
    };
    let mut next = Some(first);
    while let Some(request) = next {
        kept.fetch_add(1, Ordering::Relaxed);
        let id = pb::LeaseKeepAliveRequest::decode(request).map_or(0, |r| r.id);
        let reply = pb::LeaseKeepAliveResponse {
            header: Some(header(10)),
            id,
            ttl: 60,
        };
        if send
            .send_data(framed(&reply.encode_to_vec()), false)
            .is_err()
        {
            return;
        }
        next = body.next().await;
    }
}

/// The hostile answer.
async fn hostile(respond: &mut SendResponse<Bytes>, answer: Answer) -> Result<(), h2::Error> {
    let head = match answer {
        Answer::HugeHeaders => {
            let mut head = grpc_head();
            let huge = "x".repeat(1 << 20);
            head.headers_mut()
                .insert("x-padding", huge.parse().unwrap());
            head
        }
        Answer::NotGrpc => Response::builder()
            .header("content-type", "text/html")
            .body(())
            .unwrap(),
        _ => grpc_head(),
    };
    let mut send = respond.send_response(head, false)?;
    match answer {
        Answer::Announced4GiB => {
            send.send_data(Bytes::from_static(&[0, 0xff, 0xff, 0xff, 0xff]), false)?;
            endless(&mut send, Bytes::from(vec![0u8; 16 << 10])).await
        }
        Answer::EndlessMessages => {
            // A watch message for another watch (so read and passed over), of 1 MiB.
            let other = pb::WatchResponse {
                header: Some(header(12)),
                watch_id: 99,
                events: vec![proto::mvccpb::Event {
                    kv: Some(KeyValue {
                        key: Bytes::from_static(b"x"),
                        value: Bytes::from(vec![b'x'; 1 << 20]),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            };
            endless(&mut send, framed(&other.encode_to_vec())).await
        }
        Answer::OneByteFrames => {
            send.send_data(Bytes::from_static(&[0, 0, 1, 0, 0]), false)?;
            endless(&mut send, Bytes::from_static(b"x")).await
        }
        Answer::Silence | Answer::HugeHeaders | Answer::NotGrpc => {
            std::future::pending::<()>().await;
            Ok(())
        }
    }
}

/// `chunk` sent again and again, as fast as flow control lets it, until the client resets.
async fn endless(send: &mut h2::SendStream<Bytes>, chunk: Bytes) -> Result<(), h2::Error> {
    loop {
        send.reserve_capacity(chunk.len());
        std::future::poll_fn(|cx| send.poll_capacity(cx)).await;
        send.send_data(chunk.clone(), false)?;
    }
}

/// The answer to each transaction the lock sends (recognised by its shape): ours is `job/7`,
/// created at revision 10 on lease 7; another's, `job/1`, at revision 5 when this run waits.
fn txn(standing: Standing, request: &Bytes) -> pb::TxnResponse {
    let request = pb::TxnRequest::decode(request.clone()).unwrap_or_default();
    let ranged = |c: &pb::Compare| !c.range_end.is_empty();
    let creates = |c: &pb::Compare| {
        c.range_end.is_empty()
            && c.target_union == Some(pb::compare::TargetUnion::CreateRevision(0))
    };
    let put = || response(pb::response_op::Response::ResponsePut(Default::default()));
    let of = |kvs: Vec<KeyValue>| response(pb::response_op::Response::ResponseRange(range(kvs)));
    let (succeeded, responses) = match request.compare.first() {
        // The take of a free lock: `NAME/` empty.
        Some(c) if ranged(c) && request.compare.len() == 1 => match standing {
            Standing::Holds => (true, vec![put()]),
            Standing::Waits => (false, vec![of(vec![other()]), of(vec![])]),
        },
        // A place in the line, made.
        Some(c) if creates(c) => (
            true,
            vec![
                put(),
                of(vec![first_key(standing)]),
                of(vec![ours(), other()]),
            ],
        ),
        // Reads (a renewal's check of our key, a waiter's view of the line): ours, the key
        // before it and the first.
        None => (
            true,
            vec![
                of(vec![ours()]),
                of(vec![first_key(standing)]),
                of(vec![first_key(standing)]),
            ],
        ),
        // A grant (our key moved to its holding lease) or a release: granted only to a run
        // that holds; a waiter reads its key, the one before it and the first.
        Some(_) => match standing {
            Standing::Holds => (true, vec![of(vec![ours()])]),
            Standing::Waits => (
                false,
                vec![of(vec![ours()]), of(vec![other()]), of(vec![other()])],
            ),
        },
    };
    pb::TxnResponse {
        header: Some(header(10)),
        succeeded,
        responses,
    }
}

fn response(response: pb::response_op::Response) -> pb::ResponseOp {
    pb::ResponseOp {
        response: Some(response),
    }
}

fn range(kvs: Vec<KeyValue>) -> pb::RangeResponse {
    pb::RangeResponse {
        header: Some(header(10)),
        count: kvs.len() as i64,
        kvs,
        more: false,
    }
}

fn ours() -> KeyValue {
    KeyValue {
        key: Bytes::from_static(b"job/7"),
        create_revision: 10,
        mod_revision: 10,
        version: 1,
        lease: 7,
        ..Default::default()
    }
}

fn other() -> KeyValue {
    KeyValue {
        key: Bytes::from_static(b"job/1"),
        create_revision: 5,
        mod_revision: 5,
        version: 1,
        lease: 1,
        ..Default::default()
    }
}

fn first_key(standing: Standing) -> KeyValue {
    match standing {
        Standing::Holds => ours(),
        Standing::Waits => other(),
    }
}

fn header(revision: i64) -> pb::ResponseHeader {
    pb::ResponseHeader {
        cluster_id: 1,
        member_id: 1,
        revision,
        raft_term: 2,
    }
}

fn grpc_head() -> Response<()> {
    Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap()
}

fn ok_trailers() -> HeaderMap {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    trailers
}

fn framed(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    Bytes::from(out)
}

/// A request's stream of messages.
struct Messages {
    body: RecvStream,
    buf: BytesMut,
}

impl Messages {
    /// The next whole message (`None` once the stream ended or broke).
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.buf.len() >= 5 {
                let b = &self.buf;
                let len = u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize;
                if self.buf.len() >= 5 + len {
                    self.buf.advance(5);
                    return Some(self.buf.split_to(len).freeze());
                }
            }
            let data = self.body.data().await?.ok()?;
            let _ = self.body.flow_control().release_capacity(data.len());
            self.buf.extend_from_slice(&data);
        }
    }
}
