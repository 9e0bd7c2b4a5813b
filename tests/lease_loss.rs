//! Losing the lease while the child runs: the child must be dead before the server could give
//! the lock to anyone else, and the status is 76. T = 2 s throughout, so D = 22 ms is not lost
//! in scheduler noise; margins are printed (run with --nocapture to see them).

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;

const TTL: &str = "2s";

fn start(redis: &Redis, dir: &Path, extra: &[&str], child: &str) -> (Running, i32) {
    let mut all = vec!["--ttl", TTL];
    all.extend_from_slice(extra);
    start_job(&redis.url(), dir, &all, child)
}

fn margin(expiry: Instant, death: Instant, what: &str) -> Duration {
    assert!(
        death < expiry,
        "{what}: the child died {:?} AFTER the key's expiry",
        death - expiry
    );
    let margin = expiry - death;
    eprintln!("kill margin [{what}]: child dead {margin:?} before the key's expiry");
    margin
}

#[test]
fn redis_frozen_mid_run_the_child_is_dead_before_the_key_expires() {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = start(&redis, dir.path(), &[], "exec sleep 60");
    let expiry = expiry_lower_bound(&redis);
    redis.pause(); // a blackhole: connections are accepted, nothing is answered
    assert!(
        wait_pid_exit(child, Duration::from_secs(10)),
        "the child was stopped"
    );
    let death = Instant::now();
    let m = margin(expiry, death, "blackhole, child obeys SIGTERM");
    // SIGTERM goes out at V - D - K: about K (666 ms) + 2D before the expiry.
    assert!(m > Duration::from_millis(500), "{m:?}");
    let out = running.wait().expect(76);
    assert!(
        out.stderr
            .contains("lost the lock job while the command ran: the lease could not be renewed"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr
            .contains("stopped it with SIGTERM (it was ended by SIGTERM)"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1, "one line: {}", out.stderr);
    redis.resume();
}

#[test]
fn redis_killed_mid_run_the_child_is_dead_before_the_key_would_expire() {
    let mut redis = Redis::start();
    let dir = scratch();
    let (running, child) = start(&redis, dir.path(), &[], "exec sleep 60");
    let expiry = expiry_lower_bound(&redis);
    redis.kill(); // connection refused from here on
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    margin(expiry, Instant::now(), "server killed, child obeys SIGTERM");
    let out = running.wait().expect(76);
    assert!(
        out.stderr.contains("Connection refused"),
        "names the cause: {}",
        out.stderr
    );
}

#[test]
fn a_child_that_ignores_sigterm_is_killed_k_later_and_before_the_expiry() {
    let redis = Redis::start();
    let dir = scratch();
    let terms = dir.path().join("terms");
    let child = format!(
        "trap 'date +%s%N >> {t}' TERM; while :; do sleep 0.05; done",
        t = path_str(&terms)
    );
    let (running, shell) = start(&redis, dir.path(), &["--kill-after", "800ms"], &child);
    let expiry = expiry_lower_bound(&redis);
    redis.pause();
    assert!(wait_pid_exit(shell, Duration::from_secs(10)));
    let death = Instant::now();
    let death_wall = std::time::SystemTime::now();
    margin(expiry, death, "blackhole, child ignores SIGTERM");
    let term: u128 = std::fs::read_to_string(&terms)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let death_ns = death_wall
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let grace = Duration::from_nanos((death_ns - term) as u64);
    assert!(
        grace >= Duration::from_millis(700),
        "SIGKILL came {grace:?} after SIGTERM, not ~800ms"
    );
    running.wait().expect(76);
    redis.resume();
}

#[test]
fn an_outage_shorter_than_a_third_of_the_ttl_leaves_the_child_alone() {
    let redis = Redis::start();
    let dir = scratch();
    let go = dir.path().join("go");
    let child = format!(
        "while [ ! -e {g} ]; do sleep 0.01; done; exit 5",
        g = path_str(&go)
    );
    let (running, pid) = start(&redis, dir.path(), &[], &child);
    redis.pause();
    std::thread::sleep(Duration::from_millis(600)); // the outage itself
    redis.resume();
    assert!(alive(pid), "the child survived the outage");
    std::fs::write(&go, "").unwrap();
    let out = running.wait().expect(5);
    assert_eq!(out.stderr, "");
}

#[test]
fn a_deleted_key_stops_the_child_at_the_next_renewal() {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = start(
        &redis,
        dir.path(),
        &["--lost-exit-code", "9"],
        "exec sleep 60",
    );
    let deleted = Instant::now();
    let _: i64 = redis.cmd(&["DEL", "lock:{job}"]);
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    // "Not the owner" is a loss now: SIGTERM at the next renewal (R = 333 ms), not at V - D - K.
    assert!(
        deleted.elapsed() < Duration::from_millis(600),
        "{:?}",
        deleted.elapsed()
    );
    let out = running.wait().expect_with(9, "--lost-exit-code");
    assert!(
        out.stderr.contains("the server says it is no longer ours"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_key_taken_over_by_another_owner_stops_the_child_and_is_left_alone() {
    let redis = Redis::start();
    let dir = scratch();
    let (running, child) = start(&redis, dir.path(), &[], "exec sleep 60");
    let _: String = redis.cmd(&["SET", "lock:{job}", "someone-else", "PX", "60000"]);
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    running.wait().expect(76);
    assert_eq!(
        redis.get("lock:{job}").as_deref(),
        Some("someone-else"),
        "release is compare-and-delete"
    );
}

#[test]
fn a_process_that_changed_group_is_stopped_before_the_expiry_too() {
    // coreutils `timeout` puts itself and its command in a group of their own.
    let redis = Redis::start();
    let dir = scratch();
    let inner = dir.path().join("inner");
    let child = format!(
        "timeout 60 sh -c 'echo $$ > {i}.tmp; mv {i}.tmp {i}; exec sleep 60'",
        i = path_str(&inner)
    );
    let (running, _) = start(&redis, dir.path(), &[], &child);
    let inner: i32 = wait_for_file(&inner, Duration::from_secs(10), |t| t.ends_with('\n'))
        .trim()
        .parse()
        .unwrap();
    let expiry = expiry_lower_bound(&redis);
    redis.pause();
    assert!(wait_pid_exit(inner, Duration::from_secs(10)));
    margin(
        expiry,
        Instant::now(),
        "a process in another group of the session",
    );
    running.wait().expect(76);
    redis.resume();
}

/// Whoever reads locked-run's stderr may stop reading (a stuck log shipper): the lease clock
/// runs on the thread that writes the log lines, and must not stop with it. Here the command
/// fills the pipe first, then locked-run logs every renewal (-vv) into the full pipe for longer
/// than T: the lease is renewed all along, and the lines that did not fit are counted.
#[test]
fn a_full_stderr_pipe_does_not_stop_the_renewals() {
    let redis = Redis::start();
    let dir = scratch();
    let d = path_str(dir.path());
    let fifo = file(&dir, "stderr");
    let path = std::ffi::CString::new(path_str(&fifo)).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    // Opened for reading, not read until the end (non-blocking, so opening does not wait for
    // a writer).
    let reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let child = format!(
        "head -c 1000000 /dev/zero >&2 & echo $LOCKED_RUN_TOKEN > {d}/token.tmp; \
         mv {d}/token.tmp {d}/token; while [ ! -e {d}/go ]; do sleep 0.01; done"
    );
    let running = lr_stderr_to(&fifo)
        .args(["-vv", "-u", &redis.url(), "--ttl", "1s", "job"])
        .args(sh(&child))
        .spawn();
    let token = wait_for_file(&file(&dir, "token"), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    });
    // A measurement window: longer than T, with renewals due every 166 ms.
    std::thread::sleep(Duration::from_millis(2000));
    let held = redis.get("lock:{job}");
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
    std::fs::write(file(&dir, "go"), "").unwrap();
    // Read the pipe out, so that the writers can finish.
    let drain = std::thread::spawn(move || {
        let mut reader = reader;
        let mut text = Vec::new();
        loop {
            match std::io::Read::read_to_end(&mut reader, &mut text) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("{e}"),
            }
        }
        String::from_utf8_lossy(&text).replace('\0', "")
    });
    let out = running.wait();
    let log = drain.join().unwrap();
    assert_eq!(held.as_deref(), Some(token.trim()), "the lease was kept");
    assert!(pttl > 500, "and renewed: {pttl} ms left of 1 s");
    out.expect(0);
    assert!(
        log.contains("log lines were dropped: stderr was not being read"),
        "{log}"
    );
}

/// `locked-run -u URL --ttl 2s job -- touch MARKER`, held up between the grant and the start
/// of its command: strace delays every prctl(2) by 1.2 s (the wrapper's own as it readies the
/// job, and the child's just before it execs).
fn held_up(url: &str, marker: &Path) -> Output {
    let mut cmd = without_our_settings("strace");
    cmd.args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=prctl"])
        .args(["-e", "inject=prctl:delay_enter=1200000"])
        .arg(BIN)
        .args(["-u", url, "--ttl", TTL, "job", "--", "touch"])
        .arg(marker);
    run(cmd)
}

/// Held up past the point where the kill signal would go (T = 2 s), a run starts nothing: the
/// command would run on a lease that may already be another run's. 76, one line, the command
/// never ran, and nothing is left held.
#[test]
fn a_wrapper_held_up_past_the_kill_point_before_the_start_runs_nothing() {
    let redis = Redis::start();
    let dir = scratch();
    let marker = file(&dir, "ran");
    let out = held_up(&redis.url(), &marker).expect(76);
    // strace may say things of its own on the same stderr.
    let ours: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("locked-run: "))
        .collect();
    assert_eq!(ours.len(), 1, "one line: {}", out.stderr);
    assert!(
        ours[0].starts_with("locked-run: lost the lock job before the command could start"),
        "{}",
        out.stderr
    );
    assert!(!marker.exists(), "the command ran past the kill point");
    lr().args(["-u", &redis.url(), "-n", "job", "--", "true"])
        .run()
        .expect(0);
}

/// A lock the kernel holds (`file://`) has no lease to run out: held up as long, the run
/// starts its command.
#[test]
fn a_host_local_lock_held_up_as_long_still_runs_its_command() {
    let locks = scratch();
    let marker = file(&locks, "ran");
    held_up(&file_url(locks.path()), &marker).expect(0);
    assert!(marker.exists(), "the command did not run");
}

/// The program's exec blocks past the kill point of a 2 s lease. The wrapper waits for the
/// exec no longer than that point: the child is killed before the program could run, 76, one
/// line.
#[test]
fn a_command_whose_exec_blocks_past_the_kill_point_never_runs() {
    let redis = Redis::start();
    let dir = scratch();
    let program = file(&dir, "program");
    let marker = file(&dir, "ran");
    let mut holder = leased_program(&program, 3);
    let out = lr()
        .args(["-u", &redis.url(), "--ttl", TTL, "job", "--"])
        .args([path_str(&program), path_str(&marker)])
        .run();
    let _ = holder.kill();
    let _ = holder.wait();
    out.expect_opening(76, "lost the lock job before the command could start");
    assert!(!marker.exists(), "the command ran past the kill point");
}

/// The same blocked exec, with the wrapper itself SIGSTOPped from just after the clone until
/// the lease on the program is gone (3 s, past the 2 s lease): the wrapper cannot kill its
/// child then, but the watcher, which the SIGSTOP does not stop, kills it at the kill point,
/// still short of its exec. So the command never starts, not even once its exec could go on
/// beside the next holder; 76 once the wrapper resumes.
#[test]
fn a_blocked_exec_is_killed_at_the_kill_point_while_the_wrapper_is_stopped() {
    let redis = Redis::start();
    let dir = scratch();
    let program = file(&dir, "program");
    let marker = file(&dir, "ran");
    let mut holder = leased_program(&program, 3);
    let run = lr()
        .args(["-u", &redis.url(), "--ttl", TTL, "job", "--"])
        .args([path_str(&program), path_str(&marker)])
        .spawn();
    stop_across_the_start(run.pid(), &mut holder);
    run.wait()
        .expect_opening(76, "lost the lock job before the command could start");
    assert!(!marker.exists(), "the command started past the kill point");
}

/// A stderr file on a stalled disk (strace holds the third write to it for 3 s; a regular file
/// always polls writable) holds up neither the renewals nor the kill: log lines are written by
/// a thread of their own. With `--log-format json` every renewal is a line; the 2.5 s command
/// runs to its end under a 2 s lease, 0.
#[test]
fn a_stalled_stderr_file_does_not_hold_up_the_lease() {
    let redis = Redis::start();
    let dir = scratch();
    let log = file(&dir, "stderr");
    let mut cmd = without_our_settings("strace");
    cmd.args(["-f", "-qq", "-o", "/dev/null", "-P", path_str(&log)])
        .args([
            "-e",
            "trace=write",
            "-e",
            "inject=write:delay_enter=3000000:when=3",
        ])
        .args(["sh", "-c", r#"exec "$0" "$@" 2>> "$LOG""#])
        .arg(BIN)
        .args([
            "--log-format",
            "json",
            "-u",
            &redis.url(),
            "--ttl",
            TTL,
            "job",
        ])
        .args(["--", "sleep", "2.5"])
        .env("LOG", &log);
    run(cmd).expect(0);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains(r#""event":"renewed""#), "{said}");
    assert!(!said.contains(r#""event":"lost""#), "{said}");
}
