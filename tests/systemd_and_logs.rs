//! What operators' tooling reads of a run: sd_notify status and readiness for systemd units,
//! and `--log-format json` for log shippers.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

/// A notify socket the test listens on, as systemd would.
fn notify_socket(dir: &tempfile::TempDir, name: &str) -> (UnixDatagram, String) {
    let path = file(dir, name);
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    (socket, path_str(&path).to_owned())
}

fn receive(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).expect("a notification within 10 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn sd_notify_says_waiting_for_whom_then_holding_and_ready() {
    let redis = Redis::start();
    let dir = scratch();
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    let (holder_socket, holder_path) = notify_socket(&dir, "holder.sock");
    let (waiter_socket, waiter_path) = notify_socket(&dir, "waiter.sock");

    let holder = lr()
        .env("NOTIFY_SOCKET", &holder_path)
        .url(&redis.url())
        .name("job")
        .sh(&format!(
            "while [ ! -e {d}/go ]; do sleep 0.01; done",
            d = path_str(dir.path())
        ))
        .spawn();
    assert_eq!(
        receive(&holder_socket),
        "READY=1\nSTATUS=holding lock job (fence 1)"
    );

    let waiter = lr()
        .env("NOTIFY_SOCKET", &waiter_path)
        .url(&redis.url())
        .job(["true"])
        .spawn();
    assert_eq!(
        receive(&waiter_socket),
        format!(
            "STATUS=waiting for lock job (held by {host} pid {}, fence 1)",
            holder.pid()
        )
    );
    std::fs::write(file(&dir, "go"), "").unwrap();
    holder.wait().expect(0);
    assert_eq!(
        receive(&waiter_socket),
        "READY=1\nSTATUS=holding lock job (fence 2)"
    );
    waiter.wait().expect(0);
}

#[test]
fn sd_notify_reaches_an_abstract_socket() {
    let redis = Redis::start();
    let name = format!("locked-run-test-{}", std::process::id());
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            name.as_bytes(),
        )
        .unwrap();
    let socket = UnixDatagram::bind_addr(&addr).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    lr().env("NOTIFY_SOCKET", format!("@{name}"))
        .url(&redis.url())
        .job(["true"])
        .run()
        .expect(0);
    assert_eq!(
        receive(&socket),
        "READY=1\nSTATUS=holding lock job (fence 1)"
    );
}

fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: not JSON: {l}")))
        .collect()
}

fn events(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l["event"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn json_logs_carry_every_milestone_of_a_run() {
    let redis = Redis::start();
    // T = 300 ms: renewals every 50 ms during a 200 ms command.
    let out = lr()
        .url(&redis.url())
        .args(["--log-format", "json", "--ttl", "300ms"])
        .job(["sleep", "0.2"])
        .run()
        .expect(0);
    let lines = json_lines(&out.stderr);
    let events = events(&lines);
    assert_eq!(
        events.first().map(String::as_str),
        Some("acquired"),
        "{events:?}"
    );
    assert!(
        events.iter().filter(|e| *e == "renewed").count() >= 2,
        "{events:?}"
    );
    let n = events.len();
    assert_eq!(&events[n - 2..], ["child_exited", "released"], "{events:?}");
    let acquired = &lines[0];
    assert_eq!(acquired["fence"], 1);
    assert!(acquired["waited_ms"].is_u64());
    assert_eq!(acquired["lock"], "job");
    assert_eq!(acquired["level"], "info");
    assert!(acquired["ts"].as_str().unwrap().ends_with('Z'));
    assert!(
        acquired["message"]
            .as_str()
            .unwrap()
            .starts_with("acquired lock job")
    );
    assert_eq!(lines[n - 2]["status"], 0);
    assert_eq!(lines[n - 1]["still_ours"], true);
}

/// Issue 43's review: a server's error of a megabyte (escapes and all) reached the JSON log
/// whole, one line of a megabyte per event, where the text log cuts each line at 2000
/// characters. JSON lines are cut the same way: each stays one short line that parses.
#[test]
fn json_log_lines_are_bounded_as_text_lines_are() {
    let server = crate::support::hostile::Hostile::start(crate::support::hostile::megabyte_error);
    for format in ["json", "text"] {
        let out = lr()
            .args(["-v", "--log-format", format, "-u", &server.redis_url()])
            .job(["true"])
            .run()
            .expect(69);
        assert!(
            out.stderr.len() < 64 << 10,
            "{format}: {} bytes",
            out.stderr.len()
        );
        for line in out.stderr.lines() {
            assert!(
                line.len() < 16 << 10,
                "{format}: a line of {} bytes",
                line.len()
            );
            assert!(!line.contains('\u{1b}'), "{format}: {line}");
        }
        if format == "json" {
            assert!(!json_lines(&out.stderr).is_empty());
        }
    }
}

#[test]
fn json_logs_tell_a_lost_lease_and_end_with_the_failure() {
    let mut redis = Redis::start();
    let dir = scratch();
    let (running, child) = start_job(
        &redis.url(),
        dir.path(),
        &[
            "--log-format",
            "json",
            "--ttl",
            "300ms",
            "--connect-timeout",
            "200ms",
        ],
        "exec sleep 60",
    );
    redis.kill();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let out = running.wait().expect(76);
    let lines = json_lines(&out.stderr);
    let events = events(&lines);
    assert!(events.contains(&"renewal_failed".to_owned()), "{events:?}");
    let lost = lines
        .iter()
        .find(|l| l["event"] == "lost")
        .expect("a lost event");
    assert_eq!(lost["signal"], "SIGTERM");
    let last = lines.last().unwrap();
    assert_eq!(last["event"], "failed");
    assert_eq!(last["status"], 76);
    assert_eq!(last["level"], "error");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .starts_with("lost the lock job")
    );
}

/// A pipe: (read end, write end).
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors, owned at once.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// `locked-run ARGS` with `stderr` as its stderr: its exit code (minus the signal that ended
/// it), and how long it took; None if it was still running after 10 s (then killed).
fn status_with_stderr(args: &[&str], stderr: OwnedFd) -> Option<(i32, Duration)> {
    let mut cmd = lr().args(args).into_command();
    cmd.stdout(Stdio::null()).stderr(Stdio::from(stderr));
    let started = Instant::now();
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    let Some(status) = wait_timeout(&mut child, Duration::from_secs(10)) else {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    };
    let code = status
        .code()
        .unwrap_or_else(|| -status.signal().unwrap_or(0));
    Some((code, started.elapsed()))
}

/// stderr a pipe whose reader is gone (a restarted journald, a CI step's closed log pipe): the
/// failure line cannot be written, and the status is still the one the contract gives, not an
/// abort.
#[test]
fn a_stderr_whose_reader_is_gone_changes_no_exit_status() {
    let locks = scratch();
    let url = file_url(locks.path());
    let holder = Holder::start_on(&url, "job", &[]);
    let cases: [(&[&str], i32); 3] = [
        (&["-u", &url, "job", "--", "no-such-command-7q"], 127),
        (&["-u", &url, "--ttl", "5", "job", "--", "true"], 2),
        (&["-u", &url, "-w", "200ms", "job", "--", "true"], 75),
    ];
    for (args, expected) in cases {
        let (read, write) = pipe();
        drop(read);
        let found = status_with_stderr(args, write).map(|(code, _)| code);
        assert_eq!(found, Some(expected), "{args:?}");
    }
    holder.finish().expect(0);
}

/// stderr a full pipe nobody reads: the failure line is given up after a second, and the run
/// ends with its status instead of blocking in the write for as long as nobody reads; so is a
/// line longer than the room left in the pipe (a 20 KB usage line, two pages free).
#[test]
fn a_full_stderr_pipe_nobody_reads_does_not_hold_up_the_exit() {
    let locks = scratch();
    let url = file_url(locks.path());
    let holder = Holder::start_on(&url, "job", &[]);
    let cases: [(&[&str], i32); 2] = [
        (&["-u", &url, "job", "--", "no-such-command-7q"], 127),
        (&["-vv", "-u", &url, "-w", "300ms", "job", "--", "true"], 75),
    ];
    for (args, expected) in cases {
        let (read, write) = pipe();
        fill(&write);
        let found = status_with_stderr(args, write);
        let (code, took) = found.unwrap_or_else(|| panic!("{args:?} still running after 10 s"));
        assert_eq!(code, expected, "{args:?}");
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
        drop(read);
    }
    let (read, write) = pipe();
    fill(&write);
    let mut two_pages = [0u8; 8192];
    std::io::Read::read_exact(&mut File::from(read.try_clone().unwrap()), &mut two_pages).unwrap();
    let ttl = "9".repeat(20_000);
    let (code, took) = status_with_stderr(&["--ttl", &ttl, "job", "--", "true"], write)
        .expect("a long last line: still running after 10 s");
    assert_eq!(code, 2);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(read);
    holder.finish().expect(0);
}

/// Fills a pipe to the brim through its write end (non-blocking meanwhile, blocking again
/// after: the flag belongs to the open file, which the child shares).
fn fill(write: &OwnedFd) {
    let fd = write.as_raw_fd();
    // SAFETY: fcntl and write on a descriptor we own, from a buffer we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        let chunk = [b'x'; 4096];
        while libc::write(fd, chunk.as_ptr().cast(), chunk.len()) > 0 {}
        libc::fcntl(fd, libc::F_SETFL, flags);
    }
}
