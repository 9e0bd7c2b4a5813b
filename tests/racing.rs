//! `--no-fair` wake-ups: a release wakes two racers, chosen at random among those that may take
//! the lock, each on a channel of its own, not every racer of the NAME; a woken racer that is
//! SIGKILLed holds up no one (the other one woken goes), one that gives up hands its wake-up
//! on, and a handoff among racers costs a handful of commands however many race. Racers are
//! stopped (SIGSTOP) across a release, so that what that one release sent can be read alone.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::support::*;
use crate::wakeups::Observer;

/// A racer whose command appends `who` to `log`.
fn racer(redis: &Redis, log: &Path, who: &str) -> Running {
    lr().url(&redis.url())
        .arg("--no-fair")
        .name("job")
        .sh(&format!("echo {who} >> {}", path_str(log)))
        .spawn()
}

/// The tokens of the queue of `job`, head first (every member a racer's).
fn racer_tokens(redis: &Redis) -> Vec<String> {
    let members: Vec<String> = redis.cmd(&["ZRANGE", "queue:{job}", "0", "-1"]);
    members
        .iter()
        .map(|m| m.strip_prefix('~').expect("a racer's place").to_owned())
        .collect()
}

/// What was published on `job`'s release channels until now: a message of the test's own on
/// a channel nobody listens on marks the end, so nothing sent before it is missed.
fn told_so_far(redis: &Redis, observer: &Observer) -> Vec<(String, String)> {
    let mark = format!("mark-{}", observer.seen().len());
    let _: i64 = redis.cmd(&["PUBLISH", "released:{job}:mark", &mark]);
    let seen = observer.until(|seen| seen.iter().any(|(_, m)| *m == mark));
    seen.into_iter().take_while(|(_, m)| *m != mark).collect()
}

/// Every command the server is sent (`MONITOR`), as its arguments: from the acquire attempts
/// (their token and pid), which racer process holds which token.
struct Monitor {
    lines: Arc<Mutex<Vec<Vec<String>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Monitor {
    fn start(redis: &Redis) -> Monitor {
        let mut conn = TcpStream::connect(("127.0.0.1", redis.port)).unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        conn.write_all(b"MONITOR\r\n").unwrap();
        let mut reader = BufReader::new(conn);
        let mut ok = String::new();
        reader.read_line(&mut ok).unwrap();
        assert_eq!(ok, "+OK\r\n");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (lines, stop) = (lines.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut line = String::new();
                while !stop.load(Ordering::Relaxed) {
                    // A read that times out keeps what it read: the line goes on next time.
                    if reader.read_line(&mut line).is_ok_and(|n| n > 0) && line.ends_with('\n') {
                        lines.lock().unwrap().push(arguments(&line));
                        line.clear();
                    }
                }
            })
        };
        Monitor {
            lines,
            stop,
            thread: Some(thread),
        }
    }

    /// The pid a racer with `token` sent with its acquire attempts (`--no-fair`'s `race`
    /// mode: the script's ARGV is token, ttl, host, pid, command, since, mode).
    fn pid_of(&self, token: &str) -> i32 {
        let lines = self.lines.lock().unwrap();
        let argv = lines.iter().find_map(|args| {
            let keys: usize = args.get(2)?.parse().ok()?;
            let argv = args.get(3 + keys..)?;
            (args[0].starts_with("EVAL") && argv.first()? == token && argv.get(6)? == "race")
                .then_some(argv)
        });
        argv.unwrap_or_else(|| panic!("no acquire attempt of {token} was seen"))[3]
            .parse()
            .unwrap()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The arguments of a MONITOR line (`+TIME [DB ADDR] "ARG" "ARG" ...`, each quoted with
/// backslash escapes), unescaped as far as the tests need (tokens, numbers, names).
fn arguments(line: &str) -> Vec<String> {
    let rest = line.split_once("] ").map_or("", |(_, r)| r);
    let (mut args, mut arg, mut quoted, mut escaped) = (Vec::new(), String::new(), false, false);
    for c in rest.chars() {
        match (quoted, escaped, c) {
            (true, true, _) => {
                arg.push(c);
                escaped = false;
            }
            (true, false, '\\') => escaped = true,
            (true, false, '"') => {
                args.push(std::mem::take(&mut arg));
                quoted = false;
            }
            (true, false, _) => arg.push(c),
            (false, _, '"') => quoted = true,
            (false, _, _) => {}
        }
    }
    args
}

/// A holder, `n` racers (r1, r2, ...: [`racer`]s logging to `log`) queued behind it and
/// listening, each on its own channel; then every racer stopped, the holder finished, and what
/// its release told (and to whom) read. Returns the racers, the queue's tokens and what was
/// told.
fn stopped_across_a_release(
    redis: &Redis,
    observer: &Observer,
    log: &Path,
    n: usize,
) -> (Vec<Running>, Vec<String>, Vec<(String, String)>) {
    let holder = Holder::start(redis, "job", &[]);
    let mut racers = Vec::new();
    for i in 1..=n {
        racers.push(racer(redis, log, &format!("r{i}")));
        wait_until("the racer queued", Duration::from_secs(10), || {
            queued(redis) == i as i64
        });
    }
    wait_until("every racer listening", Duration::from_secs(10), || {
        subscribers(redis, "job") == n as i64
    });
    let tokens = racer_tokens(redis);
    let mut channels = release_channels(redis, "job");
    channels.sort();
    let mut own: Vec<(String, i64)> = tokens
        .iter()
        .map(|t| (format!("released:{{job}}:{t}"), 1))
        .collect();
    own.sort();
    assert_eq!(channels, own, "each racer listens on its own channel alone");
    for r in &racers {
        signal(r.pid(), libc::SIGSTOP);
    }
    let before = observer.seen().len();
    holder.finish().expect(0);
    let told = told_so_far(redis, observer).split_off(before);
    (racers, tokens, told)
}

/// The tokens `told` names, each checked to be told on its own channel.
fn named(told: &[(String, String)]) -> Vec<String> {
    told.iter()
        .map(|(channel, token)| {
            assert_eq!(*channel, format!("released:{{job}}:{token}"), "{told:?}");
            token.clone()
        })
        .collect()
}

#[test]
fn a_release_wakes_two_racers_not_every_one() {
    let redis = Redis::start();
    let dir = scratch();
    let log = dir.path().join("log");
    let observer = Observer::start(&redis);
    let (racers, tokens, told) = stopped_across_a_release(&redis, &observer, &log, 6);
    let woken = named(&told);
    assert_eq!(woken.len(), 2, "two of six racers told: {told:?}");
    assert_ne!(woken[0], woken[1]);
    assert!(woken.iter().all(|t| tokens.contains(t)), "{woken:?}");
    for r in &racers {
        signal(r.pid(), libc::SIGCONT);
    }
    for r in racers {
        r.wait().expect(0);
    }
    let mut ran: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    ran.sort();
    assert_eq!(ran, ["r1", "r2", "r3", "r4", "r5", "r6"]);
    // Every release told two racers at most (one when one was left), and nothing was ever
    // published for every racer at once.
    let seen = observer.seen();
    assert!(
        seen.iter()
            .all(|(c, m)| c != "released:{job}" || m == "released"),
        "{seen:?}"
    );
}

#[test]
fn a_woken_racer_that_is_sigkilled_holds_up_no_one() {
    let redis = Redis::start();
    let monitor = Monitor::start(&redis);
    let dir = scratch();
    let log = dir.path().join("log");
    let observer = Observer::start(&redis);
    let (racers, _, told) = stopped_across_a_release(&redis, &observer, &log, 4);
    let woken = named(&told);
    assert_eq!(woken.len(), 2, "{told:?}");
    let index = |token: &str| {
        let pid = monitor.pid_of(token);
        racers.iter().position(|r| r.pid() == pid).unwrap()
    };
    let (dead, spare) = (index(&woken[0]), index(&woken[1]));
    signal(racers[dead].pid(), libc::SIGKILL);
    signal(racers[spare].pid(), libc::SIGCONT);
    // The other racer woken takes the lock and runs while every other racer is still stopped.
    let spare_name = format!("r{}", spare + 1);
    wait_for_file(&log, Duration::from_secs(10), |t| {
        t.lines().any(|l| l == spare_name)
    });
    for r in &racers {
        signal(r.pid(), libc::SIGCONT);
    }
    let mut ran = 0;
    for (i, r) in racers.into_iter().enumerate() {
        let out = r.wait();
        if i == dead {
            assert_eq!(out.code(), None, "SIGKILLed");
        } else {
            out.expect(0);
            ran += 1;
        }
    }
    let lines = std::fs::read_to_string(&log).unwrap();
    assert_eq!(lines.lines().count(), ran, "{lines}");
    assert!(!lines.contains(&format!("r{}\n", dead + 1)), "{lines}");
}

#[test]
fn a_woken_racer_that_gives_up_hands_its_wake_up_on() {
    let redis = Redis::start();
    let monitor = Monitor::start(&redis);
    let dir = scratch();
    let log = dir.path().join("log");
    let observer = Observer::start(&redis);
    let (racers, tokens, told) = stopped_across_a_release(&redis, &observer, &log, 5);
    let woken = named(&told);
    assert_eq!(woken.len(), 2, "{told:?}");
    // One not at the head of the queue: a fair waiter's give-back tells the next one only
    // when it headed the queue; a racer woken from anywhere must hand its wake-up on too.
    let leaving = woken.iter().find(|t| **t != tokens[0]).unwrap();
    let pid = monitor.pid_of(leaving);
    let before = observer.seen().len();
    signal(pid, libc::SIGTERM);
    signal(pid, libc::SIGCONT);
    let handed = observer.until(|seen| seen.len() > before)[before..].to_vec();
    let handed_to = named(&handed[..1]);
    assert_ne!(handed_to[0], *leaving, "{handed:?}");
    for r in &racers {
        signal(r.pid(), libc::SIGCONT);
    }
    for r in racers {
        let gave_up = r.pid() == pid;
        let out = r.wait();
        match gave_up {
            true => assert_eq!(out.code(), Some(143), "{out:?}"),
            false => {
                out.expect(0);
            }
        }
    }
}

/// Every release woke every racer, which all asked again: at 24 racers, about 17 commands a
/// handoff, growing with their number.
#[test]
fn a_handoff_among_many_racers_costs_a_handful_of_commands() {
    const RACERS: usize = 24;
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &[]);
    let racers: Vec<Running> = (0..RACERS)
        .map(|_| {
            lr().url(&redis.url())
                .arg("--no-fair")
                .job(["true"])
                .spawn()
        })
        .collect();
    wait_until(
        "every racer queued and listening",
        Duration::from_secs(30),
        || queued(&redis) == RACERS as i64 && subscribers(&redis, "job") == RACERS as i64,
    );
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    holder.finish().expect(0);
    for r in racers {
        r.wait().expect(0);
    }
    // What the clients sent (the scripts' own commands are not counted): each racer's
    // attempts, keep-alives included, and its UNSUBSCRIBE; the releases.
    let sent = command_stats(
        &redis,
        &["evalsha", "eval", "hello", "subscribe", "unsubscribe"],
        "calls",
    );
    let per_handoff = sent as f64 / RACERS as f64;
    assert!(
        per_handoff <= 12.0,
        "{per_handoff:.1} commands a handoff:\n{}",
        redis.cmd::<String>(&["INFO", "commandstats"])
    );
}
