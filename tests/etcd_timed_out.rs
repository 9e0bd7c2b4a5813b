//! A take etcd answered "request timed out" (a transient answer) is still in the member's Raft
//! log and may commit later, after its run retried, held and released: the run must revoke
//! its lease as it releases, so that the take, landing, takes nothing (issue 45's second
//! review; `etcd_late.rs` has the take held up on its way). A gRPC proxy of this file's own
//! answers the marked request so and passes it on to the member later.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};

use crate::support::*;

/// A gRPC proxy (HTTP/2 both sides) in front of a real member that answers, once, the first
/// request whose message holds `marker` with etcd's own "etcdserver: request timed out"
/// (UNAVAILABLE, a transient answer: `locked-run` asks the next member, or fails the attempt),
/// and passes that request on to the member `delay` later, on a connection of its own: what a
/// member does whose proposal is in the Raft log and commits after the member gave up waiting
/// for it (etcd says of this answer that the request may still be applied). Every other
/// request and stream passes both ways.
struct TimedOutThenLate {
    port: u16,
    shared: Arc<Late>,
}

struct Late {
    marker: &'static [u8],
    delay: Duration,
    armed: AtomicBool,
    /// Requests answered "request timed out".
    answered: AtomicUsize,
    /// Of those, passed on later and answered by the member.
    passed: AtomicUsize,
    /// Of those, answered OK.
    landed: AtomicUsize,
}

impl TimedOutThenLate {
    fn start(upstream: u16, marker: &'static [u8], delay: Duration) -> TimedOutThenLate {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Late {
            marker,
            delay,
            armed: AtomicBool::new(false),
            answered: AtomicUsize::new(0),
            passed: AtomicUsize::new(0),
            landed: AtomicUsize::new(0),
        });
        let s = shared.clone();
        thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        continue;
                    };
                    let s = s.clone();
                    tokio::spawn(async move {
                        let _ = connection(tcp, upstream, s).await;
                    });
                }
            });
        });
        TimedOutThenLate { port, shared }
    }

    fn arm(&self) {
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    fn answered(&self) -> usize {
        self.shared.answered.load(Ordering::SeqCst)
    }

    fn passed(&self) -> usize {
        self.shared.passed.load(Ordering::SeqCst)
    }

    fn landed(&self) -> usize {
        self.shared.landed.load(Ordering::SeqCst)
    }

    fn url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }
}

/// One client connection, passed to one connection to the member.
async fn connection(tcp: tokio::net::TcpStream, upstream: u16, s: Arc<Late>) -> Option<()> {
    let _ = tcp.set_nodelay(true);
    let mut server = h2::server::handshake(tcp).await.ok()?;
    let up = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
        .await
        .ok()?;
    let _ = up.set_nodelay(true);
    let (sender, conn) = h2::client::handshake(up).await.ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    while let Some(Ok((request, respond))) = server.accept().await {
        let (sender, s) = (sender.clone(), s.clone());
        tokio::spawn(async move {
            let _ = pass(request, respond, sender, upstream, s).await;
        });
    }
    Some(())
}

/// One request (or stream), both ways; the marked one answered at once and passed on later.
async fn pass(
    request: Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    sender: h2::client::SendRequest<Bytes>,
    upstream: u16,
    s: Arc<Late>,
) -> Option<()> {
    let (parts, mut body) = request.into_parts();
    let mut first = body.data().await?.ok()?;
    let _ = body.flow_control().release_capacity(first.len());
    if first.windows(s.marker.len()).any(|w| w == s.marker) && s.armed.swap(false, Ordering::SeqCst)
    {
        // The whole message (a unary request ends its stream with it).
        let mut whole = first.to_vec();
        while let Some(Ok(more)) = body.data().await {
            let _ = body.flow_control().release_capacity(more.len());
            whole.extend_from_slice(&more);
        }
        first = Bytes::from(whole);
        let head = Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .header("grpc-status", "14")
            .header("grpc-message", "etcdserver: request timed out")
            .body(())
            .unwrap();
        let _ = respond.send_response(head, true);
        s.answered.fetch_add(1, Ordering::SeqCst);
        let path = parts.uri.path().to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(s.delay).await;
            let ok = late(upstream, &path, parts.headers, first).await;
            if ok == Some(true) {
                s.landed.fetch_add(1, Ordering::SeqCst);
            }
            s.passed.fetch_add(1, Ordering::SeqCst);
        });
        return Some(());
    }
    let mut up = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .body(())
        .unwrap();
    *up.headers_mut() = parts.headers.clone();
    let mut sender = sender.ready().await.ok()?;
    let ended = body.is_end_stream();
    let (response, mut up_send) = sender.send_request(up, false).ok()?;
    up_send.send_data(first, ended).ok()?;
    if !ended {
        tokio::spawn(async move {
            while let Some(Ok(data)) = body.data().await {
                let _ = body.flow_control().release_capacity(data.len());
                if up_send.send_data(data, false).is_err() {
                    return;
                }
            }
            let _ = up_send.send_data(Bytes::new(), true);
        });
    }
    let (head, mut up_body) = response.await.ok()?.into_parts();
    let done = up_body.is_end_stream();
    let mut down = respond
        .send_response(Response::from_parts(head, ()), done)
        .ok()?;
    if done {
        return Some(());
    }
    while let Some(Ok(data)) = up_body.data().await {
        let _ = up_body.flow_control().release_capacity(data.len());
        down.send_data(data, false).ok()?;
    }
    match up_body.trailers().await {
        Ok(Some(trailers)) => down.send_trailers(trailers).ok(),
        _ => down.send_data(Bytes::new(), true).ok(),
    }
}

/// The request `path` with `message`, sent on a new connection to the member: whether it
/// answered OK.
async fn late(upstream: u16, path: &str, headers: HeaderMap, message: Bytes) -> Option<bool> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
        .await
        .ok()?;
    let (sender, conn) = h2::client::handshake(tcp).await.ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut request = Request::post(format!("http://127.0.0.1:{upstream}{path}"))
        .body(())
        .unwrap();
    *request.headers_mut() = headers;
    let mut sender = sender.ready().await.ok()?;
    let (response, mut send) = sender.send_request(request, false).ok()?;
    send.send_data(message, true).ok()?;
    let response = response.await.ok()?;
    if let Some(status) = response.headers().get("grpc-status") {
        eprintln!("the late request was answered grpc-status {status:?}");
        return Some(status == "0");
    }
    let mut body = response.into_body();
    while let Some(Ok(data)) = body.data().await {
        let _ = body.flow_control().release_capacity(data.len());
    }
    let trailers = body.trailers().await.ok()??;
    let status = trailers.get("grpc-status")?;
    eprintln!("the late request was answered grpc-status {status:?}");
    Some(status == "0")
}

/// A take answered "etcdserver: request timed out" (a transient answer, not the silence
/// `Client::exchange` marks as unanswered) is still in the member's Raft log, and commits
/// later: after its run retried, held, ran and released. The release, with no request marked
/// unanswered, leaves the holding lease to lapse instead of revoking it, so the late take
/// creates the key on NAME anew, on a lease nobody keeps and nobody releases: NAME held by a
/// run that has ended, until the lease lapses (T). The flag must be set by every answer that
/// leaves a request possibly applied later, the transient errors etcd answers too.
#[test]
fn a_take_answered_request_timed_out_that_commits_after_its_run_released_takes_nothing() {
    let etcd = Etcd::start();
    let port: u16 = etcd.url().rsplit(':').next().unwrap().parse().unwrap();
    let proxy = TimedOutThenLate::start(port, b"MARKER-TIMEDOUT", Duration::from_secs(12));
    let holder = Holder::start_on(&etcd.url(), "job", &[]);
    // The key's value names the program: a link to `true` carries the marker.
    let dir = scratch();
    let program = dir.path().join("MARKER-TIMEDOUT");
    std::os::unix::fs::symlink(on_path("true"), &program).unwrap();
    let a = lr()
        .url(&proxy.url())
        .args(["--ttl", "20s", "-w", "60s", "-v"])
        .job([path_str(&program)])
        .spawn();
    wait_until("A queued", Duration::from_secs(10), || {
        etcd.keys("job/").len() == 2
    });
    // A's place goes with its queue lease (as when it lapses): its next round takes afresh,
    // and that take is answered "request timed out", and commits 12 s later.
    proxy.arm();
    let waiting = etcd.keys("job/").into_iter().max_by_key(|k| k.1).unwrap();
    let out = etcd.ctl(&["lease", "revoke", &format!("{:x}", waiting.2)]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    wait_until(
        "A's take answered request timed out",
        Duration::from_secs(10),
        || proxy.answered() == 1,
    );
    wait_until("A queued again", Duration::from_secs(20), || {
        etcd.keys("job/").len() == 2
    });
    holder.finish().expect(0);
    let out = a.wait().expect(0);
    eprintln!("{}", out.stderr);
    assert!(
        out.stderr.contains("request timed out"),
        "A was answered so: {}",
        out.stderr
    );
    assert_eq!(proxy.passed(), 0, "A ended first");
    assert_eq!(etcd.keys("job/"), [], "released");
    wait_until(
        "the take that timed out reached the member",
        Duration::from_secs(20),
        || proxy.passed() >= 1,
    );
    let keys = etcd.keys("job/");
    assert_eq!(
        keys,
        [],
        "the take answered 'request timed out' made a key for a run that has ended: {keys:?}"
    );
    assert_eq!(proxy.landed(), 0, "its lease was revoked: the take failed");
}
