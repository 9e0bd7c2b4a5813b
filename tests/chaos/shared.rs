//! Chaos: `--shared`, whose every holder has a lease of its own: one shared holder's lease
//! taken away, or the server killed while two hold (each stopped before its own lease can
//! end), and a shared holder SIGKILLed while a writer waits (the writer goes within T).

use std::time::{Duration, Instant};

use crate::holders::slot_expiry;
use crate::support::*;
use crate::*;

/// A shared holder, with the token it holds.
fn reader(url: &str, dir: &std::path::Path) -> (Running, i32, String) {
    let (running, child) = job(
        url,
        dir,
        &["--shared"],
        &format!(
            "echo $LOCKED_RUN_TOKEN > {d}/token.tmp; mv {d}/token.tmp {d}/token; exec sleep 60",
            d = path_str(dir)
        ),
    );
    let token = wait_for_file(&dir.join("token"), Duration::from_secs(10), |t| {
        t.ends_with('\n')
    });
    (running, child, token.trim().to_owned())
}

pub fn shared_server_killed() -> Figure {
    let mut redis = Redis::start();
    let (one, two) = (scratch(), scratch());
    let (first, first_child, first_token) = reader(&redis.url(), one.path());
    let (second, second_child, second_token) = reader(&redis.url(), two.path());
    let ends = [
        slot_expiry(&redis, &first_token),
        slot_expiry(&redis, &second_token),
    ];
    redis.kill();
    let mut worst = None;
    for (child, end) in [(first_child, ends[0]), (second_child, ends[1])] {
        assert!(wait_pid_exit(child, Duration::from_secs(10)));
        let figure = margin(end, Instant::now());
        if let Figure::Margin(m) = figure {
            worst = Some(worst.map_or(m, |w: Duration| w.min(m)));
        }
    }
    expect_lost(first);
    expect_lost(second);
    Figure::Margin(worst.expect("two margins"))
}

pub fn shared_lease_stolen() -> Figure {
    let redis = Redis::start();
    let (one, two) = (scratch(), scratch());
    let (running, child, token) = reader(&redis.url(), one.path());
    let (other, other_child, _) = reader(&redis.url(), two.path());
    let _: i64 = redis.cmd(&["ZREM", "holders:{job}", &token]);
    let lost = Instant::now();
    assert!(wait_pid_exit(child, Duration::from_secs(10)));
    let after = lost.elapsed();
    expect_lost(running);
    assert!(after < Duration::from_millis(1_000), "{after:?}");
    // The other reader holds on, and the marker with it.
    assert!(alive(other_child), "the other shared holder was left alone");
    assert_eq!(redis.cmd::<String>(&["GET", "lock:{job}"]), "shared");
    signal(other.pid(), libc::SIGTERM);
    let _ = other.wait();
    Figure::StoppedAfter(after, "its shared lease was taken away")
}

pub fn shared_holder_sigkilled() -> Figure {
    let redis = Redis::start();
    let dir = scratch();
    let (reader_run, _, _) = reader(&redis.url(), dir.path());
    let started = dir.path().join("writer");
    let mut writer = locked_run();
    writer
        .args(lease_args(&["-u", &redis.url(), "-w", "10s"]))
        .arg("job")
        .args(sh(&format!("echo up > {}", path_str(&started))));
    let writer = spawn(writer);
    wait_until("the writer waits", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 1
    });
    let killed = Instant::now();
    signal(reader_run.pid(), libc::SIGKILL);
    wait_for_file(&started, Duration::from_secs(10), |t| !t.is_empty());
    let freed = killed.elapsed();
    assert!(
        freed <= Duration::from_millis(2_300),
        "the writer went {freed:?} after the SIGKILL, T is 2 s"
    );
    assert_eq!(writer.wait().code(), Some(0));
    let _ = reader_run.wait();
    Figure::Note(format!(
        "the waiting writer ran {} after the shared holder's SIGKILL (T = 2 s)",
        ms(freed)
    ))
}
