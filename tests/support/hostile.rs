//! Hostile fake servers, for the tests that every reply is bounded: a listener on 127.0.0.1
//! whose every connection is served by a script in a thread of its own (an endless RESP bulk
//! string or array, a `$-5`, a PostgreSQL message of 4 GiB, a port that hangs up on anything
//! but HTTP; HTTP/2 that breaks its rules: a frame of 16 MiB, headers that never end, no HTTP/2
//! at all), and `locked-run` run with its peak memory measured and its address space capped, so
//! that an unbounded read fails visibly (and cannot eat the shared machine); and a run on a host
//! whose name another party chose. The fake etcd that speaks gRPC is `grpc_fake`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

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

/// Each request's deadline: a read bounded only by time ends here.
pub const TIMEOUT: &str = "5s";
/// Well within it.
pub const PROMPTLY: Duration = Duration::from_millis(2500);
/// Some 30 MB with a 16 MiB reply buffered; an unbounded read reaches gigabytes.
pub const PEAK_KIB: u64 = 96 << 10;

/// `locked-run ARGS` against `url` (a run, or `status`), measured and capped: its output and
/// its peak resident memory in KiB, if measured.
pub fn measured(url: &str, args: &[&str]) -> (Output, Option<u64>) {
    let (subcommand, rest) = match args.first() {
        Some(&"status") => (&args[..1], &args[1..]),
        _ => (&args[..0], args),
    };
    let mut all = subcommand.to_vec();
    all.extend(["-u", url, "--connect-timeout", TIMEOUT]);
    all.extend(rest);
    run_measured(&all)
}

/// Within the memory bound, when measured (the address-space cap holds either way).
#[track_caller]
pub fn bounded(peak: Option<u64>, what: &str) {
    if let Some(peak) = peak {
        assert!(peak < PEAK_KIB, "{what} peaked at {peak} KiB");
    }
}

/// A run and `status` against `server` both end with 69, promptly, in one line that says
/// `what`, within the memory bound.
#[track_caller]
pub fn both_refuse(url: &str, what: &str) {
    for args in [&["-n", "job", "--", "true"][..], &["status", "job"]] {
        let (out, peak) = measured(url, args);
        let out = out.expect_one_line(69, what);
        assert!(!out.stderr.contains("in time"), "not late: {}", out.stderr);
        assert!(
            !out.stderr.contains("did not answer"),
            "not late: {}",
            out.stderr
        );
        assert!(out.elapsed < PROMPTLY, "{args:?} took {:?}", out.elapsed);
        bounded(peak, &format!("{args:?}"));
        let shown = (out.elapsed, peak, out.stderr.trim());
        println!("{args:?}: {shown:?} (time, peak KiB, line)");
    }
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

/// Reads HTTP/2's client preface (24 bytes) and answers with an empty SETTINGS frame: the
/// stream is then HTTP/2 as far as the client knows.
fn h2_opened(conn: &mut TcpStream) -> bool {
    let mut preface = [0u8; 24];
    conn.read_exact(&mut preface).is_ok()
        && preface.starts_with(b"PRI * HTTP/2.0")
        && conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).is_ok()
}

/// HTTP/2 opened, then a DATA frame announced as 16 MiB (a client allows 16 KiB unless it
/// says otherwise), then its bytes for ever.
pub fn h2_frame_too_large(mut conn: TcpStream) {
    if h2_opened(&mut conn)
        && conn
            .write_all(&[0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1])
            .is_ok()
    {
        forever(&mut conn, &[b'x'; 64 << 10]);
    }
}

/// HTTP/2 opened, then the headers of a reply on the first stream that never end: a HEADERS
/// frame without END_HEADERS, then CONTINUATION frames of header fields for ever.
pub fn h2_endless_headers(mut conn: TcpStream) {
    // An HPACK literal header field without indexing: a name of 1 byte, a value of 100.
    let mut field = vec![0x00, 0x01, b'x', 100];
    field.extend([b'y'; 100]);
    let fields = field.repeat(150);
    let frame = |kind: u8, payload: &[u8]| {
        let len = (payload.len() as u32).to_be_bytes();
        let mut f = vec![len[1], len[2], len[3], kind, 0, 0, 0, 0, 1];
        f.extend_from_slice(payload);
        f
    };
    if h2_opened(&mut conn) && conn.write_all(&frame(1, &fields)).is_ok() {
        forever(&mut conn, &frame(9, &fields));
    }
}

/// Bytes that are no HTTP/2 at all (an HTTP/1.1 reply), then a hang-up.
pub fn h2_not_at_all(mut conn: TcpStream) {
    let mut preface = [0u8; 24];
    if conn.read_exact(&mut preface).is_ok() {
        let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
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
