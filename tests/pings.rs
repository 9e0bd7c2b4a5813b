//! `--ping URL`: a monitor on loopback records what each run sent: `/start` as the command
//! starts and the status after (the bare URL on 0), the query kept, one `rid` pairing them;
//! nothing for a skip; the end after the start even when the start's answer is slow; and a dead
//! monitor changes no status and costs the run at most the ping's time.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;

/// A monitor that answers 200 to every GET (the start's after `start_delay`) and records the
/// request targets in order.
struct Monitor {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(start_delay: Duration) -> Monitor {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let record = record.clone();
                std::thread::spawn(move || {
                    let mut line = String::new();
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    if reader.read_line(&mut line).is_err() {
                        return;
                    }
                    let target = line.split(' ').nth(1).unwrap_or("").to_owned();
                    if target.contains("/start") {
                        std::thread::sleep(start_delay);
                    }
                    record.lock().unwrap().push(target);
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK");
                });
            }
        });
        Monitor { port, seen }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/ping/check-1?create=1", self.port)
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// The `rid` of a request target.
fn rid(target: &str) -> &str {
    target.split("rid=").nth(1).unwrap_or("")
}

#[test]
fn a_run_pings_its_start_then_its_status_and_a_skip_pings_nothing() {
    let redis = Redis::start();
    let monitor = Monitor::start(Duration::ZERO);
    lr().url(&redis.url())
        .args(["--ping", &monitor.url()])
        .job(["true"])
        .run()
        .expect(0);
    lr().url(&redis.url())
        .args(["--ping", &monitor.url()])
        .name("job")
        .sh("exit 3")
        .run()
        .expect(3);
    let seen = monitor.seen();
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(
        seen[0].starts_with("/ping/check-1/start?create=1&rid="),
        "{seen:?}"
    );
    assert!(
        seen[1].starts_with("/ping/check-1?create=1&rid="),
        "{seen:?}"
    );
    assert!(
        seen[2].starts_with("/ping/check-1/start?create=1&rid="),
        "{seen:?}"
    );
    assert!(
        seen[3].starts_with("/ping/check-1/3?create=1&rid="),
        "{seen:?}"
    );
    assert_eq!(rid(&seen[0]), rid(&seen[1]), "one run's pings pair up");
    assert_ne!(rid(&seen[0]), rid(&seen[2]), "two runs, two rids");

    let holder = Holder::start(&redis, "job", &[]);
    lr().url(&redis.url())
        .args(["--ping", &monitor.url(), "-n"])
        .job(["true"])
        .run()
        .expect(75);
    holder.finish();
    assert_eq!(monitor.seen().len(), 4, "a skip pings nothing");
}

/// A command shorter than its start ping's answer: the end's ping goes after the start's was
/// answered, so the monitor sees them in order; the command itself did not wait for it.
#[test]
fn the_end_is_pinged_after_the_start_even_when_the_start_is_slow_to_answer() {
    let locks = scratch();
    let monitor = Monitor::start(Duration::from_millis(800));
    let dir = scratch();
    let started = file(&dir, "started");
    let out = lr()
        .url(&file_url(locks.path()))
        .args(["--ping", &monitor.url()])
        .name("job")
        .sh(&format!("date +%s%N > {}", path_str(&started)))
        .run()
        .expect(0);
    let seen = monitor.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].contains("/start?"), "start first: {seen:?}");
    assert!(seen[1].starts_with("/ping/check-1?"), "{seen:?}");
    assert!(
        out.elapsed >= Duration::from_millis(800),
        "waited for the start at exit"
    );
    assert!(started.exists());
}

/// A monitor that is not there (a closed port): the status is the command's, with one warning,
/// and the run's end waits no more than the ping's time (3 s, and one retry).
#[test]
fn a_dead_monitor_changes_no_status_and_costs_at_most_its_timeout() {
    let locks = scratch();
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let began = Instant::now();
    let out = lr()
        .url(&file_url(locks.path()))
        .args(["--ping", &format!("http://127.0.0.1:{closed}/ping/x")])
        .name("job")
        .sh("exit 5")
        .run()
        .expect(5);
    assert!(
        began.elapsed() < Duration::from_secs(12),
        "{:?}",
        began.elapsed()
    );
    assert!(
        out.stderr.contains("the monitor was not pinged"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("/ping/x"),
        "the ping URL's path is not shown"
    );
}

#[test]
fn a_ping_url_that_is_not_http_is_refused_before_anything_runs() {
    lr().args([
        "-u",
        "redis://127.0.0.1:1",
        "--ping",
        "ftp://example.invalid/x",
    ])
    .job(["true"])
    .run()
    .expect_one_line(2, "is not an http:// or https:// URL");
}
