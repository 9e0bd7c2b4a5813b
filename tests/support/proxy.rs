//! A TCP fault proxy between `locked-run` and a real redis-server: it passes traffic, blackholes
//! it (accepts, drops bytes both ways), delays it, or resets connections, switchable mid-test.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
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
                pump(
                    s.clone(),
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    false,
                );
                pump(s.clone(), server, client, true);
            }
        });
        Proxy { port, shared }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
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

/// Copies `from` to `to` as the mode says; `replies` is the server-to-client direction.
fn pump(shared: Arc<Shared>, mut from: TcpStream, mut to: TcpStream, replies: bool) {
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
            if to.write_all(&buf[..n]).is_err() {
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
