//! Arrival order on `file://` across both modes (issue 35, item 4: a steady stream of `--shared`
//! runs kept an exclusive waiter out for as long as it went on). A shared newcomer never passes
//! an exclusive waiter, `-n --shared` is refused while one waits, a writer admits the readers
//! queued behind it before a writer that came after them, and a waiter that is SIGKILLed, gives
//! up or is stopped holds up no one. Real processes on a real directory; order is read from the
//! children's log, and a waiter is seen waiting in `/proc/locks` (blocked in `flock`).

use std::time::{Duration, Instant};

use crate::support::*;

/// Whether process `pid` is blocked in `flock` (a `->` line of `/proc/locks`): the kernel's own
/// evidence that a run waits, whatever it waits on.
fn blocked(pid: i32) -> bool {
    std::fs::read_to_string("/proc/locks").is_ok_and(|locks| {
        locks.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&"->")
                && fields.get(2) == Some(&"FLOCK")
                && fields.get(5) == Some(&pid.to_string().as_str())
        })
    })
}

fn started(dir: &std::path::Path, who: &str) -> bool {
    log_of(dir).contains(&format!("start {who} "))
}

/// Where `event` is in the log, which must have it.
fn at(dir: &std::path::Path, event: &str) -> usize {
    let log = log_of(dir);
    log.find(event)
        .unwrap_or_else(|| panic!("{event:?} not in the log:\n{log}"))
}

// See: issue 35, item 4 (file:// readers starve a writer).
#[test]
fn a_steady_stream_of_shared_runs_does_not_keep_a_writer_out() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let r0 = logged(&url, d, "r0", &["--shared"]);
    wait_until("r0 holds", Duration::from_secs(10), || started(d, "r0"));
    let w = logged(&url, d, "w", &[]);
    wait_until("the writer waits", Duration::from_secs(10), || {
        blocked(w.pid())
    });

    // The lock is held shared, but an exclusive run waits: -n --shared does not get in.
    lr().url(&url)
        .args(["-n", "--shared"])
        .job(["true"])
        .run()
        .expect_with(75, "-n --shared while a writer waits");

    // Readers keep arriving, each before the last one goes, so that the lock is never free
    // while they hold it: each either starts (beside the last: the bug) or waits.
    let mut stream = Vec::new();
    let mut last = "r0";
    let mut r0_ended = None;
    for who in ["r1", "r2", "r3", "r4"] {
        let reader = logged(&url, d, who, &["--shared"]);
        wait_until(
            "the reader started or waits",
            Duration::from_secs(10),
            || started(d, who) || blocked(reader.pid()),
        );
        go(d, last);
        if last == "r0" {
            // r0, the one reader that held when the writer came, ends.
            assert!(wait_pid_exit(r0.pid(), Duration::from_secs(10)));
            r0_ended = Some(Instant::now());
        }
        last = who;
        stream.push(reader);
    }
    r0.wait().expect(0);
    wait_until(
        "the writer got in while readers kept arriving",
        Duration::from_secs(10),
        || started(d, "w"),
    );
    // Woken when r0 let go, not once the stream stopped: within the stream's few steps.
    let waited = r0_ended.unwrap().elapsed();
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert!(
        at(d, "end r0") < at(d, "start w "),
        "the writer waited for the reader that held when it came"
    );
    for who in ["r1", "r2", "r3", "r4"] {
        assert!(
            !started(d, who),
            "{who} ran beside the writer:\n{}",
            log_of(d)
        );
    }
    go(d, "w");
    w.wait().expect(0);
    // The readers that queued behind the writer are admitted together once it ends.
    wait_until(
        "the queued readers started",
        Duration::from_secs(10),
        || ["r1", "r2", "r3", "r4"].iter().all(|who| started(d, who)),
    );
    go(d, "r4");
    for reader in stream {
        reader.wait().expect(0);
    }
    for who in ["r1", "r2", "r3", "r4"] {
        assert!(
            at(d, "end w") < at(d, &format!("start {who} ")),
            "{}",
            log_of(d)
        );
    }
    assert_eq!(status_json(&url, "job")["waiters"], 0);
}

/// The readers that queued behind a writer go when it ends, before a writer that came after
/// them; a reader that came after that writer waits for it.
#[test]
fn a_writer_admits_the_readers_queued_behind_it_before_a_later_writer() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let w1 = logged(&url, d, "w1", &[]);
    wait_until("w1 holds", Duration::from_secs(10), || started(d, "w1"));
    let r1 = logged(&url, d, "r1", &["--shared"]);
    wait_until("r1 waits", Duration::from_secs(10), || blocked(r1.pid()));
    let w2 = logged(&url, d, "w2", &[]);
    wait_until("w2 waits", Duration::from_secs(10), || blocked(w2.pid()));
    let r2 = logged(&url, d, "r2", &["--shared"]);
    wait_until("r2 waits", Duration::from_secs(10), || blocked(r2.pid()));
    assert_eq!(status_json(&url, "job")["waiters"], 3);

    go(d, "w1");
    w1.wait().expect(0);
    wait_until("r1 holds", Duration::from_secs(10), || started(d, "r1"));
    wait_until("w2 and r2 wait", Duration::from_secs(10), || {
        blocked(w2.pid()) && blocked(r2.pid())
    });
    assert!(!started(d, "w2") && !started(d, "r2"), "{}", log_of(d));

    go(d, "r1");
    r1.wait().expect(0);
    wait_until("w2 holds", Duration::from_secs(10), || started(d, "w2"));
    wait_until("r2 waits for w2", Duration::from_secs(10), || {
        blocked(r2.pid())
    });
    assert!(!started(d, "r2"), "{}", log_of(d));

    go(d, "w2");
    w2.wait().expect(0);
    wait_until("r2 holds", Duration::from_secs(10), || started(d, "r2"));
    go(d, "r2");
    r2.wait().expect(0);
    let order = [
        "start w1", "end w1", "start r1", "end r1", "start w2", "end w2", "start r2",
    ];
    let at: Vec<usize> = order.iter().map(|e| at(d, e)).collect();
    assert!(at.windows(2).all(|p| p[0] < p[1]), "{}", log_of(d));
}

/// A waiter SIGKILLed in the queue lets go of its place with its process: the reader queued
/// behind it goes at once. One whose `-w` ran out leaves its place, and its file, too.
#[test]
fn a_waiter_killed_or_out_of_time_in_the_queue_holds_up_no_one() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let r0 = logged(&url, d, "r0", &["--shared"]);
    wait_until("r0 holds", Duration::from_secs(10), || started(d, "r0"));
    let w = logged(&url, d, "w", &[]);
    wait_until("the writer waits", Duration::from_secs(10), || {
        blocked(w.pid())
    });
    let r1 = logged(&url, d, "r1", &["--shared"]);
    wait_until(
        "r1 waits behind the writer",
        Duration::from_secs(10),
        || blocked(r1.pid()),
    );
    assert!(!started(d, "r1"), "r1 passed the writer: {}", log_of(d));

    let killed = Instant::now();
    signal(w.pid(), libc::SIGKILL);
    let _ = w.wait();
    wait_until("r1 joined r0", Duration::from_secs(5), || started(d, "r1"));
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "{:?}",
        killed.elapsed()
    );
    assert!(!started(d, "w"));

    // A writer whose -w runs out while the readers hold: 75, and it leaves the queue.
    let out = lr().url(&url).args(["-w", "300ms"]).job(["true"]).run();
    out.expect(75);
    lr().url(&url)
        .args(["-n", "--shared"])
        .job(["true"])
        .run()
        .expect_with(0, "no writer waits any more");
    go(d, "r0");
    go(d, "r1");
    r0.wait().expect(0);
    r1.wait().expect(0);
    lr().url(&url).args(["-n"]).job(["true"]).run().expect(0);
    let places: Vec<String> = std::fs::read_dir(locks.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("job.wait."))
        .collect();
    // The killed writer's place (nobody held it: it counted for nothing) was removed by the
    // next run to take a place; the one that ran out of time removed its own.
    assert!(places.is_empty(), "{places:?}");
    assert_eq!(status_json(&url, "job")["waiters"], 0);
}

/// A waiter stopped in the queue (SIGSTOP, as Ctrl-Z does) cannot take its turn: the runs behind
/// it go on while it is stopped, and it goes when it is resumed and finds the lock free.
#[test]
fn a_stopped_waiter_holds_up_no_one_while_it_is_stopped() {
    let locks = scratch();
    let dir = scratch();
    let (url, d) = (file_url(locks.path()), dir.path());
    let r0 = logged(&url, d, "r0", &["--shared"]);
    wait_until("r0 holds", Duration::from_secs(10), || started(d, "r0"));
    let w = logged(&url, d, "w", &[]);
    wait_until("the writer waits", Duration::from_secs(10), || {
        blocked(w.pid())
    });
    let r1 = logged(&url, d, "r1", &["--shared"]);
    wait_until(
        "r1 waits behind the writer",
        Duration::from_secs(10),
        || blocked(r1.pid()),
    );

    signal(w.pid(), libc::SIGSTOP);
    let stopped = Instant::now();
    // Passed over at r1's next look, within the recheck of a waiter on a place (2 s).
    wait_until("r1 joined r0", Duration::from_secs(10), || started(d, "r1"));
    assert!(
        stopped.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopped.elapsed()
    );
    signal(w.pid(), libc::SIGCONT);
    go(d, "r0");
    go(d, "r1");
    r0.wait().expect(0);
    r1.wait().expect(0);
    wait_until(
        "the writer, resumed, holds",
        Duration::from_secs(10),
        || started(d, "w"),
    );
    go(d, "w");
    w.wait().expect(0);
    assert!(at(d, "end r1") < at(d, "start w "), "{}", log_of(d));
}
