//! The nemesis's TCP proxy, one per backend server: it passes bytes, and on demand delays one
//! connection's bytes on their way to the server, stalls a connection (holds its bytes both
//! ways, then lets them through in order), blackholes it (drops its bytes), resets it (RST), or
//! blackholes every connection for a while, or turns hostile on one connection: what the server
//! says is dropped, and in its place comes a reply no honest server sends (a huge or endless
//! body, a malformed header), as fast as the client takes it. Faults are per connection, so one
//! client's acquire can arrive late while the others are served.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// What one connection suffers.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Pass,
    /// Bytes on the way to the server read before `until` are held `by`.
    DelayToServer {
        by: Duration,
        until: Instant,
    },
    /// Bytes both ways are held until `until`.
    Stall {
        until: Instant,
    },
    /// Bytes both ways are dropped from now on.
    Blackhole,
}

struct Conn {
    client: TcpStream,
    server: TcpStream,
    fault: Mutex<Fault>,
    closed: AtomicBool,
}

struct Shared {
    upstream: u16,
    conns: Mutex<Vec<Arc<Conn>>>,
    /// The next connections accepted get this delay: (how many, by, for how long each).
    delay_next: Mutex<VecDeque<(Duration, Duration)>>,
    blackhole_until: Mutex<Option<Instant>>,
    stop: AtomicBool,
}

pub struct FaultProxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            upstream,
            conns: Mutex::new(Vec::new()),
            delay_next: Mutex::new(VecDeque::new()),
            blackhole_until: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        thread::spawn(move || accept_loop(listener, s));
        FaultProxy { port, shared }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn live(&self) -> Vec<Arc<Conn>> {
        let mut conns = self.shared.conns.lock().unwrap();
        conns.retain(|c| !c.closed.load(Ordering::SeqCst));
        conns.clone()
    }

    /// The next `count` connections accepted have their requests held `by`, for `window` after
    /// they open (a grant that arrives too late, a give-back that lands after a retry).
    pub fn delay_next(&self, count: usize, by: Duration, window: Duration) {
        let mut next = self.shared.delay_next.lock().unwrap();
        next.clear();
        next.extend(std::iter::repeat_n((by, window), count));
    }

    /// Connection `pick` (modulo the open ones) has its requests held `by` for `window`.
    pub fn delay_one(&self, pick: u64, by: Duration, window: Duration) -> bool {
        self.with_one(
            pick,
            Fault::DelayToServer {
                by,
                until: Instant::now() + window,
            },
        )
    }

    /// Connection `pick` has its bytes held both ways for `for_`.
    pub fn stall_one(&self, pick: u64, for_: Duration) -> bool {
        self.with_one(
            pick,
            Fault::Stall {
                until: Instant::now() + for_,
            },
        )
    }

    /// Connection `pick` has its bytes dropped from now on (its client must time out).
    pub fn blackhole_one(&self, pick: u64) -> bool {
        self.with_one(pick, Fault::Blackhole)
    }

    /// Connection `pick` is reset.
    pub fn reset_one(&self, pick: u64) -> bool {
        let live = self.live();
        if live.is_empty() {
            return false;
        }
        reset(&live[pick as usize % live.len()]);
        true
    }

    /// Connection `pick` turns hostile: the server's bytes are dropped both ways from now on,
    /// and `hostile` is written to the client instead (see [`Hostile`]).
    pub fn hostile_one(&self, pick: u64, hostile: Hostile) -> bool {
        let live = self.live();
        if live.is_empty() {
            return false;
        }
        let conn = live[pick as usize % live.len()].clone();
        *conn.fault.lock().unwrap() = Fault::Blackhole;
        thread::spawn(move || hostile.send(&conn));
        true
    }

    /// Every connection is reset.
    pub fn reset_all(&self) {
        for conn in self.live() {
            reset(&conn);
        }
    }

    /// Every byte, on every connection, is dropped for `for_`.
    pub fn blackhole_all(&self, for_: Duration) {
        *self.shared.blackhole_until.lock().unwrap() = Some(Instant::now() + for_);
    }

    fn with_one(&self, pick: u64, fault: Fault) -> bool {
        let live = self.live();
        if live.is_empty() {
            return false;
        }
        *live[pick as usize % live.len()].fault.lock().unwrap() = fault;
        true
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for conn in self.live() {
            reset(&conn);
        }
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn accept_loop(listener: TcpListener, s: Arc<Shared>) {
    for client in listener.incoming() {
        if s.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = client else { continue };
        let Ok(server) = TcpStream::connect(("127.0.0.1", s.upstream)) else {
            // The server is down: the client sees a reset, as it would without the proxy.
            linger_zero(&client);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let fault = match s.delay_next.lock().unwrap().pop_front() {
            Some((by, window)) => Fault::DelayToServer {
                by,
                until: Instant::now() + window,
            },
            None => Fault::Pass,
        };
        let conn = Arc::new(Conn {
            client,
            server,
            fault: Mutex::new(fault),
            closed: AtomicBool::new(false),
        });
        s.conns.lock().unwrap().push(conn.clone());
        pump(s.clone(), conn.clone(), true);
        pump(s.clone(), conn, false);
    }
}

/// One direction of one connection: a reader that stamps each chunk with the instant it may be
/// delivered (never before the previous chunk's, so order holds), and a writer that waits for
/// that instant.
fn pump(s: Arc<Shared>, conn: Arc<Conn>, to_server: bool) {
    let (tx, rx) = mpsc::channel::<Option<(Instant, Vec<u8>)>>();
    let reader_conn = conn.clone();
    thread::spawn(move || {
        let conn = reader_conn;
        let mut from = if to_server {
            &conn.client
        } else {
            &conn.server
        };
        let mut buf = vec![0u8; 16 * 1024];
        let mut last = Instant::now();
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let now = Instant::now();
            if s.blackhole_until.lock().unwrap().is_some_and(|u| now < u) {
                continue;
            }
            let at = match *conn.fault.lock().unwrap() {
                Fault::Pass => now,
                Fault::DelayToServer { by, until } if to_server && now < until => now + by,
                Fault::DelayToServer { .. } => now,
                Fault::Stall { until } => until.max(now),
                Fault::Blackhole => continue,
            };
            last = last.max(at);
            if tx.send(Some((last, buf[..n].to_vec()))).is_err() {
                break;
            }
        }
        let _ = tx.send(None);
    });
    thread::spawn(move || {
        let mut to = if to_server {
            &conn.server
        } else {
            &conn.client
        };
        while let Ok(Some((at, bytes))) = rx.recv() {
            let wait = at.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                thread::sleep(wait);
            }
            if to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
        conn.closed.store(true, Ordering::SeqCst);
    });
}

/// A reply no honest server sends: `prefix`, then `filler` over and over (none: the prefix
/// alone) until the client closes, [`HOSTILE_CAP`] bytes are out, or [`HOSTILE_FOR`] passed.
#[derive(Clone, Debug)]
pub struct Hostile {
    pub what: &'static str,
    pub prefix: Vec<u8>,
    pub filler: Vec<u8>,
}

/// The most a hostile connection sends: far past every limit a client may keep.
const HOSTILE_CAP: u64 = 1 << 30;
/// The longest a hostile connection keeps sending.
const HOSTILE_FOR: Duration = Duration::from_secs(20);

impl Hostile {
    fn send(&self, conn: &Conn) {
        let mut to = &conn.client;
        let _ = to.set_write_timeout(Some(Duration::from_secs(2)));
        if to.write_all(&self.prefix).is_err() || self.filler.is_empty() {
            return;
        }
        let mut chunk = Vec::with_capacity(64 * 1024 + self.filler.len());
        while chunk.len() < 64 * 1024 {
            chunk.extend_from_slice(&self.filler);
        }
        let (began, mut sent) = (Instant::now(), 0u64);
        while sent < HOSTILE_CAP && began.elapsed() < HOSTILE_FOR {
            if to.write_all(&chunk).is_err() {
                break;
            }
            sent += chunk.len() as u64;
        }
        reset(conn);
    }
}

/// Closes with RST rather than FIN: SO_LINGER on, timeout 0.
fn linger_zero(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt on a socket we hold, with a correctly sized option.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn reset(conn: &Conn) {
    for stream in [&conn.client, &conn.server] {
        linger_zero(stream);
        let _ = stream.shutdown(Shutdown::Both);
    }
    conn.closed.store(true, Ordering::SeqCst);
}
