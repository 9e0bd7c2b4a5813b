//! A hostile fake PostgreSQL server (DESIGN, "Every reply is bounded"): one that answers the
//! start-up with bytes that are no protocol, one that announces a message of 4 GiB, one whose
//! query answer is a DataRow of 2 GiB, one that sends small rows for ever, one that floods
//! notices. A run and `status` end with 69 promptly, in one line that says the reply was too
//! large or malformed (never that it was late), with a bounded peak memory (GNU time) and the
//! address space capped at 512 MiB.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::hostile::{Hostile, run_measured};

const PROMPTLY: Duration = Duration::from_millis(2500);
const PEAK_KIB: u64 = 96 << 10;

fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend(((body.len() + 4) as u32).to_be_bytes());
    m.extend(body);
    m
}

/// Reads the start-up message (a length that counts itself, then the rest).
fn startup(conn: &mut TcpStream) -> Option<()> {
    let mut len = [0u8; 4];
    conn.read_exact(&mut len).ok()?;
    let mut rest = vec![
        0u8;
        (u32::from_be_bytes(len) as usize)
            .saturating_sub(4)
            .min(1 << 16)
    ];
    conn.read_exact(&mut rest).ok()
}

/// Logs the client in (no password), then waits for its first query.
fn logged_in(conn: &mut TcpStream) -> Option<()> {
    startup(conn)?;
    let mut hello = message(b'R', &[0, 0, 0, 0]);
    hello.extend(message(b'Z', b"I"));
    conn.write_all(&hello).ok()?;
    let mut head = [0u8; 5];
    conn.read_exact(&mut head).ok()?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut query = vec![0u8; len.saturating_sub(4).min(1 << 20)];
    conn.read_exact(&mut query).ok()
}

fn forever(conn: &mut TcpStream, bytes: &[u8]) {
    while conn.write_all(bytes).is_ok() {}
}

fn not_postgres(mut conn: TcpStream) {
    if startup(&mut conn).is_some() {
        let _ = conn.write_all(b"\x00\xffSSH-2.0-not-postgres\r\n");
    }
}

fn four_gib_message(mut conn: TcpStream) {
    if startup(&mut conn).is_some() && conn.write_all(&[b'R', 0xff, 0xff, 0xff, 0xf0]).is_ok() {
        forever(&mut conn, &[0u8; 64 << 10]);
    }
}

fn two_gib_row(mut conn: TcpStream) {
    if logged_in(&mut conn).is_some() {
        let mut answer = message(
            b'T',
            &[
                0, 1, b'x', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 25, 255, 255, 255, 255, 255, 255, 0, 0,
            ],
        );
        answer.extend([b'D', 0x7f, 0xff, 0xff, 0xff, 0, 1]);
        if conn.write_all(&answer).is_ok() {
            forever(&mut conn, &[b'x'; 64 << 10]);
        }
    }
}

fn endless_rows(mut conn: TcpStream) {
    if logged_in(&mut conn).is_some() {
        let answer = message(
            b'T',
            &[
                0, 1, b'x', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 25, 255, 255, 255, 255, 255, 255, 0, 0,
            ],
        );
        let mut row = vec![0, 1, 0, 0, 0x0f, 0xf0];
        row.extend([b'x'; 0x0ff0]);
        let rows = message(b'D', &row).repeat(16);
        if conn.write_all(&answer).is_ok() {
            forever(&mut conn, &rows);
        }
    }
}

fn endless_notices(mut conn: TcpStream) {
    if startup(&mut conn).is_some() && conn.write_all(&message(b'R', &[0, 0, 0, 0])).is_ok() {
        let mut notice = b"SNOTICE\0C00000\0M".to_vec();
        notice.extend([b'x'; 4000]);
        notice.extend(b"\0\0");
        forever(&mut conn, &message(b'N', &notice).repeat(16));
    }
}

/// A run and `status` against `script` both end with 69, promptly, in one line that says
/// `what`, within the memory bound.
#[track_caller]
fn both_refuse(script: fn(TcpStream), what: &str) {
    let server = Hostile::start(script);
    let port = server.redis_url().rsplit(':').next().unwrap().to_owned();
    let url = format!("postgres://app@127.0.0.1:{port}/db?sslmode=disable");
    for args in [
        &[
            "-u",
            &url,
            "--connect-timeout",
            "5s",
            "-n",
            "job",
            "--",
            "true",
        ][..],
        &["status", "-u", &url, "--connect-timeout", "5s", "job"],
    ] {
        let (out, peak) = run_measured(args);
        let out = out.expect_one_line(69, what);
        assert!(!out.stderr.contains("in time"), "not late: {}", out.stderr);
        assert!(out.elapsed < PROMPTLY, "{args:?} took {:?}", out.elapsed);
        if let Some(peak) = peak {
            assert!(peak < PEAK_KIB, "{args:?} peaked at {peak} KiB");
        }
        println!("{:?}, {peak:?} KiB: {}", out.elapsed, out.stderr.trim());
    }
}

#[test]
fn a_postgres_start_up_answered_with_no_protocol_is_malformed() {
    both_refuse(
        not_postgres,
        "sent a malformed reply: a message tagged '\\0'",
    );
}

#[test]
fn a_postgres_message_announced_as_4_gib_is_refused_at_its_header() {
    both_refuse(
        four_gib_message,
        "sent a reply too large: a message of 4294967280 bytes",
    );
}

#[test]
fn a_postgres_data_row_of_2_gib_is_refused_at_its_header() {
    both_refuse(
        two_gib_row,
        "sent a reply too large: a message of 2147483647 bytes",
    );
}

#[test]
fn endless_postgres_rows_are_refused_at_16_mib() {
    both_refuse(
        endless_rows,
        "sent a reply too large: more than the 16 MiB a reply may have",
    );
}

#[test]
fn endless_postgres_notices_are_refused_at_1_mib() {
    both_refuse(
        endless_notices,
        "sent a reply too large: more than the 1 MiB of notices",
    );
}

/// The start-up answered with `code` and `text`, as a server starting up or out of
/// connections answers, or one that sends an error of megabytes with lines and escapes in it.
fn startup_error(conn: &mut TcpStream, code: &str, text: &str) {
    if startup(conn).is_some() {
        let mut body = Vec::new();
        for (field, value) in [(b'S', "FATAL"), (b'C', code), (b'M', text)] {
            body.push(field);
            body.extend(value.as_bytes());
            body.push(0);
        }
        body.push(0);
        let _ = conn.write_all(&message(b'E', &body));
    }
}

fn forged_error(mut conn: TcpStream) {
    let text = format!(
        "no\nlocked-run: forged line \x1b[31m{}",
        "x".repeat(1 << 20)
    );
    startup_error(&mut conn, "28000", &text);
}

// See: the review of the postgres backend. `doctor` printed a server's start-up error whole:
// 15 MB, a forged `locked-run:` line and raw escape sequences.
#[test]
fn doctor_prints_a_servers_error_on_one_cut_line() {
    let server = Hostile::start(forged_error);
    let port = server.redis_url().rsplit(':').next().unwrap().to_owned();
    let url = format!("postgres://app@127.0.0.1:{port}/db?sslmode=disable");
    let (out, _) = run_measured(&["doctor", "-u", &url, "--name", "job"]);
    assert!(out.stdout.len() < 8 << 10, "{} bytes", out.stdout.len());
    assert!(!out.stdout.contains('\x1b'), "{}", out.stdout);
    assert!(
        !out.stdout.lines().any(|l| l.starts_with("locked-run:")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("forged line"), "{}", out.stdout);
}
