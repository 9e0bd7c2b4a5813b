//! A TCP fault proxy between `locked-run` and a real redis-server: it passes traffic, blackholes
//! it (accepts, drops bytes both ways), delays it, or resets connections, switchable mid-test.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// What the proxy does to traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Connections are accepted, bytes are read and dropped: requests vanish, nothing answers.
    Blackhole,
    /// Every chunk is held this long before it is passed on, both ways.
    Latency(Duration),
    /// Open connections are reset (RST) now, and new ones at once.
    Reset,
    /// Requests reach the server, replies are dropped: the server acts, the client never hears.
    DropReplies,
}

struct Shared {
    mode: Mutex<Mode>,
    conns: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
    /// Each open connection's own delay of its requests (client to server), set by
    /// [`Proxy::delay_requests_of_open_connections`]; new connections start without.
    request_delays: Mutex<Vec<Arc<Mutex<Option<Duration>>>>>,
    /// Request chunks held back by such a delay right now, and those passed on after one.
    held: AtomicUsize,
    passed_late: AtomicUsize,
}

pub struct Proxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            mode: Mutex::new(Mode::Pass),
            conns: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            request_delays: Mutex::new(Vec::new()),
            held: AtomicUsize::new(0),
            passed_late: AtomicUsize::new(0),
        });
        let s = shared.clone();
        thread::spawn(move || {
            for client in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let _ = client.set_nodelay(true);
                if *s.mode.lock().unwrap() == Mode::Reset {
                    reset(&client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    reset(&client);
                    continue;
                };
                let _ = server.set_nodelay(true);
                {
                    let mut conns = s.conns.lock().unwrap();
                    conns.push(client.try_clone().unwrap());
                    conns.push(server.try_clone().unwrap());
                }
                let delay = Arc::new(Mutex::new(None));
                s.request_delays.lock().unwrap().push(delay.clone());
                pump(
                    s.clone(),
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    Some(delay),
                );
                pump(s.clone(), server, client, None);
            }
        });
        Proxy { port, shared }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// From now on, the requests of every connection open now (one client's, say) are held
    /// `delay` each before they reach the server, even once the client gave up on them;
    /// connections opened later pass as the mode says.
    pub fn delay_requests_of_open_connections(&self, delay: Duration) {
        for conn in self.shared.request_delays.lock().unwrap().iter() {
            *conn.lock().unwrap() = Some(delay);
        }
    }

    /// Request chunks being held back now by [`Proxy::delay_requests_of_open_connections`].
    pub fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Request chunks passed on to the server after being held back.
    pub fn passed_late(&self) -> usize {
        self.shared.passed_late.load(Ordering::SeqCst)
    }

    pub fn set(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
        if mode == Mode::Reset {
            for conn in self.shared.conns.lock().unwrap().drain(..) {
                reset(&conn);
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for conn in self.shared.conns.lock().unwrap().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies `from` to `to` as the mode says; `delay` is given for the client-to-server direction
/// (requests), and holds each chunk that long while it is set.
fn pump(
    shared: Arc<Shared>,
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Option<Arc<Mutex<Option<Duration>>>>,
) {
    let replies = delay.is_none();
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mode = *shared.mode.lock().unwrap();
            match mode {
                Mode::Pass => {}
                Mode::Blackhole => continue,
                Mode::DropReplies if replies => continue,
                Mode::DropReplies => {}
                Mode::Latency(d) => thread::sleep(d),
                Mode::Reset => break,
            }
            let held = delay.as_ref().and_then(|d| *d.lock().unwrap());
            if let Some(d) = held {
                shared.held.fetch_add(1, Ordering::SeqCst);
                thread::sleep(d);
            }
            let written = to.write_all(&buf[..n]);
            if held.is_some() {
                shared.passed_late.fetch_add(1, Ordering::SeqCst);
                shared.held.fetch_sub(1, Ordering::SeqCst);
            }
            if written.is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}

/// Closes with RST rather than FIN: SO_LINGER on, timeout 0.
fn reset(stream: &TcpStream) {
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
    let _ = stream.shutdown(Shutdown::Both);
}
