//! Hostile fake servers, for the tests that every reply is bounded: a listener on 127.0.0.1
//! whose every connection is served by a script in a thread of its own (a body announced as
//! 40 GB, an endless chunked one, bytes that are not HTTP, an endless RESP bulk string, a
//! `$-5`, a PostgreSQL message of 4 GiB, a port that hangs up on anything but HTTP, a JSON
//! gateway whose watch or keep-alive never ends), and `locked-run` run with its peak memory
//! measured and its address space capped, so that an unbounded read fails visibly (and cannot
//! eat the shared machine); and a run on a host whose name another party chose.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use super::BIN;
use super::process::{Output, locked_run, spawn, without_our_settings};

/// Makes `cmd` run in a UTS namespace of its own (as root) whose host name is `name` (at most
/// 64 bytes), as a container's owner may name its host.
pub fn on_host_named<'a>(cmd: &'a mut Command, name: &'static str) -> &'a mut Command {
    // SAFETY: unshare(2) and sethostname(2) only, both async-signal-safe, between fork and
    // exec; the name is a static buffer.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWUTS) != 0
                || libc::sethostname(name.as_ptr().cast(), name.len()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Whether [`on_host_named`] can work here (a UTS namespace needs root).
pub fn can_name_hosts() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A fake server; stops accepting when dropped (a script writing forever ends when its client
/// hangs up).
pub struct Hostile {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Hostile {
    /// Serves every connection with `script`, each in a thread of its own.
    pub fn start(script: impl Fn(TcpStream) + Send + Sync + 'static) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let (script, stopped) = (Arc::new(script), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let script = script.clone();
                thread::spawn(move || script(conn));
            }
        });
        Hostile { port, stop }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn etcd_url(&self) -> String {
        format!("etcd://127.0.0.1:{}", self.port)
    }

    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept, which then sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// The address space a measured `locked-run` may take: far above what it needs (some 30 MB
/// resident), far below what an unbounded read takes before its deadline (gigabytes).
pub const ADDRESS_SPACE: u64 = 512 << 20;

/// GNU time, which reports its child's peak resident memory. (The test binary cannot read it
/// itself: a child's `ru_maxrss` starts from its parent's own peak, which exec carries over,
/// and this binary's is large.)
const TIME: &str = "/usr/bin/time";

/// `locked-run ARGS` to completion under the hard timeout, with its address space capped at
/// [`ADDRESS_SPACE`] (past it an allocation fails and the process aborts, a status no test
/// expects): its output, and its peak resident memory in KiB when GNU time is installed.
pub fn run_measured(args: &[&str]) -> (Output, Option<u64>) {
    let report = tempfile::NamedTempFile::new().unwrap();
    let timed = Path::new(TIME).exists();
    let mut cmd = match timed {
        true => {
            let mut cmd = without_our_settings(TIME);
            cmd.args(["-f", "%M", "-o"]).arg(report.path()).arg(BIN);
            cmd
        }
        false => locked_run(),
    };
    cmd.args(args);
    cap_address_space(&mut cmd, ADDRESS_SPACE);
    let out = spawn(cmd).wait();
    // GNU time writes "Command exited with non-zero status N" first when it did.
    let peak = std::fs::read_to_string(report.path())
        .ok()
        .and_then(|r| r.lines().last()?.trim().parse().ok())
        .filter(|_| timed);
    if !timed {
        println!("peak memory not measured: no {TIME} (Debian's `time` package)");
    }
    (out, peak)
}

/// Caps the address space of what `cmd` runs at `bytes`: past it an allocation fails (and a
/// Rust program aborts) instead of taking the machine's memory.
pub fn cap_address_space(cmd: &mut Command, bytes: u64) {
    // SAFETY: setrlimit(2) only, which is async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            match libc::setrlimit(libc::RLIMIT_AS, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            }
        });
    }
}

/// Writes `bytes` again and again until the client hangs up.
fn forever(conn: &mut TcpStream, bytes: &[u8]) {
    while conn.write_all(bytes).is_ok() {}
}

/// Reads one HTTP request (its head and its Content-Length body): its path, or `None` once
/// the client hung up or sent something that is not HTTP.
fn request(conn: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 64 << 10 || conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    let mut body = vec![0u8; length.min(1 << 20)];
    conn.read_exact(&mut body).ok()?;
    head.split_whitespace().nth(1).map(str::to_owned)
}

/// A 200 whose head announces a 40 GB body, then an endless body.
pub fn huge_content_length(mut conn: TcpStream) {
    if request(&mut conn).is_some() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                     Content-Length: 40000000000\r\n\r\n";
        if conn.write_all(head).is_ok() {
            forever(&mut conn, &[b'x'; 64 << 10]);
        }
    }
}

/// A 200 with a chunked body that never ends (it announces nothing).
pub fn endless_chunked(mut conn: TcpStream) {
    if request(&mut conn).is_some() {
        endless_json(&mut conn);
    }
}

/// A chunked 200 whose body opens a JSON message and never ends it: a string that goes on for
/// ever (no newline either), so a reader waiting for the message's end reads on.
fn endless_json(conn: &mut TcpStream) {
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                 Transfer-Encoding: chunked\r\n\r\n";
    let opening = br#"{"result":{"created":true,"events":""#;
    let mut first = format!("{:x}\r\n", opening.len()).into_bytes();
    first.extend_from_slice(opening);
    first.extend_from_slice(b"\r\n");
    if conn.write_all(head).is_ok() && conn.write_all(&first).is_ok() {
        let mut chunk = b"10000\r\n".to_vec();
        chunk.resize(chunk.len() + 0x10000, b'x');
        chunk.extend_from_slice(b"\r\n");
        forever(conn, &chunk);
    }
}

/// A 200 whose body is valid JSON of 16 MiB less a little, every third byte a value
/// (`[[],[],...]`): within the byte limit, some 420 MB once parsed into a tree.
pub fn json_bomb(mut conn: TcpStream) {
    if request(&mut conn).is_some() {
        let mut body = b"[".to_vec();
        body.extend(b"[],".repeat(((16 << 20) - 64) / 3));
        *body.last_mut().unwrap() = b']';
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = conn.write_all(head.as_bytes());
        let _ = conn.write_all(&body);
        let _ = conn.read(&mut [0u8; 1]);
    }
}

/// A chunked 200 whose body comes one byte a chunk, for ever: a reader that keeps a frame for
/// each chunk pays some 40 bytes of memory for every byte of the body.
pub fn tiny_chunks(mut conn: TcpStream) {
    if request(&mut conn).is_some() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                     Transfer-Encoding: chunked\r\n\r\n";
        if conn.write_all(head).is_ok() {
            forever(&mut conn, &b"1\r\n \r\n".repeat(8 << 10));
        }
    }
}

/// A chunked 200 head, then nothing: a watch that is never confirmed.
pub fn head_then_silence(conn: &mut TcpStream) {
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                 Transfer-Encoding: chunked\r\n\r\n";
    if conn.write_all(head).is_ok() {
        let _ = conn.read(&mut [0u8; 1]);
    }
}

/// Bytes that are no HTTP reply, then a hang-up.
pub fn not_http(mut conn: TcpStream) {
    if request(&mut conn).is_some() {
        let _ = conn.write_all(b"\x00\xffSSH-2.0-not-http\r\n\r\n");
    }
}

/// An endless RESP bulk string: `$99999999999\r\n`, then its bytes, for ever.
pub fn endless_bulk(mut conn: TcpStream) {
    if conn.read(&mut [0u8; 4096]).unwrap_or(0) > 0 && conn.write_all(b"$99999999999\r\n").is_ok() {
        forever(&mut conn, &[b'x'; 64 << 10]);
    }
}

/// A RESP array announcing 99999999999 elements, then elements for ever.
pub fn endless_array(mut conn: TcpStream) {
    if conn.read(&mut [0u8; 4096]).unwrap_or(0) > 0 && conn.write_all(b"*99999999999\r\n").is_ok() {
        forever(&mut conn, &b":1\r\n".repeat(16 << 10));
    }
}

/// `$-5` (no RESP reply: only -1 is a nil) to every request.
pub fn negative_length(mut conn: TcpStream) {
    while conn.read(&mut [0u8; 4096]).unwrap_or(0) > 0 {
        if conn.write_all(b"$-5\r\n").is_err() {
            return;
        }
    }
}

/// An error of a megabyte, full of terminal escapes, to every request (a Redis that says
/// more than anyone should print).
pub fn megabyte_error(mut conn: TcpStream) {
    let mut error = b"-ERR \x1b]0;PWNED\x07\x1b[2K\rlocked-run: FORGED ".to_vec();
    error.extend(std::iter::repeat_n(b'A', 1 << 20));
    error.extend(b"\r\n");
    while conn.read(&mut [0u8; 4096]).unwrap_or(0) > 0 {
        if conn.write_all(&error).is_err() {
            return;
        }
    }
}

/// A PostgreSQL server whose answer to the start-up announces a message of 4 GiB, then sends
/// its bytes for ever.
pub fn four_gib_postgres_message(mut conn: TcpStream) {
    let mut len = [0u8; 4];
    if conn.read_exact(&mut len).is_err() {
        return;
    }
    let mut rest = vec![
        0u8;
        (u32::from_be_bytes(len) as usize)
            .saturating_sub(4)
            .min(1 << 16)
    ];
    if conn.read_exact(&mut rest).is_ok() && conn.write_all(&[b'R', 0xff, 0xff, 0xff, 0xf0]).is_ok()
    {
        forever(&mut conn, &[0u8; 64 << 10]);
    }
}

/// As etcd's client port does: HTTP is answered (a 404 here), anything else is hung up on.
pub fn http_only(mut conn: TcpStream) {
    let mut first = [0u8; 4];
    if conn.read_exact(&mut first).is_ok() && (&first == b"GET " || &first == b"POST") {
        let _ = request(&mut conn);
        let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
    }
}

/// Whether this run's key, in the fake gateway's answers, comes first (it holds) or after
/// another's (it waits).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Holds,
    Waits,
}

/// A fake etcd JSON gateway: a lease granted, a key created that holds or waits, keep-alives
/// and revokes answered; the request to `hostile_path` (`/v3/watch`, `/v3/lease/keepalive`)
/// is answered with a JSON message that never ends ([`endless_json`]).
pub fn gateway(standing: Standing, hostile_path: &'static str) -> impl Fn(TcpStream) {
    gateway_answering(standing, hostile_path, endless_json)
}

/// The same fake gateway, answering `hostile_path` with `answer`.
pub fn gateway_answering(
    standing: Standing,
    hostile_path: &'static str,
    answer: fn(&mut TcpStream),
) -> impl Fn(TcpStream) {
    move |mut conn| {
        while let Some(path) = request(&mut conn) {
            if path == hostile_path {
                return answer(&mut conn);
            }
            let body = match path.as_str() {
                "/v3/lease/grant" => r#"{"ID":"7","TTL":"60"}"#.to_owned(),
                "/v3/lease/keepalive" => r#"{"result":{"ID":"7","TTL":"60"}}"#.to_owned(),
                "/v3/kv/txn" => txn(standing),
                _ => "{}".to_owned(),
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            if conn.write_all(head.as_bytes()).is_err() || conn.write_all(body.as_bytes()).is_err()
            {
                return;
            }
        }
    }
}

/// One answer to every transaction the lock sends (the create, then the read of the keys
/// before ours): ours is `job/7`, created at revision 10; another's, `job/1`, at revision 5
/// when this run waits.
fn txn(standing: Standing) -> String {
    let ours = r#"{"key":"am9iLzc=","create_revision":"10","lease":"7"}"#;
    let other = r#"{"key":"am9iLzE=","create_revision":"5","lease":"1"}"#;
    let first = match standing {
        Standing::Holds => ours,
        Standing::Waits => other,
    };
    let range = |kv: &str| format!(r#"{{"response_range":{{"kvs":[{kv}],"count":"1"}}}}"#);
    format!(
        r#"{{"header":{{"revision":"10"}},"succeeded":true,"responses":[{},{},{}]}}"#,
        range(ours),
        range(first),
        range(first)
    )
}
