//! Waiting for a held lock on Redis, beyond what the conformance suite's `busy`,
//! `wait_runs_out` and `signalled_waiter` ask of every backend: the wake-up on release, no
//! polling, every signal that ends a wait, a crashed holder's expiry, a server lost while
//! waiting, servers without RESP3, users who may not subscribe.

use std::time::Duration;

use crate::support::proxy::{Mode, Proxy};
use crate::support::*;

#[test]
fn a_waiter_starts_right_after_the_release() {
    let redis = Redis::start();
    // A 30 s lease: without the release message the waiter would sleep for most of it.
    let holder = Holder::start(&redis, "job", &["--ttl", "30s"]);
    let dir = scratch();
    let started = file(&dir, "started");
    let waiter = lr()
        .url(&redis.url())
        .name("job")
        .sh(&format!(
            "date +%s%N > {s}.tmp; echo $LOCKED_RUN_FENCE >> {s}.tmp; mv {s}.tmp {s}",
            s = path_str(&started)
        ))
        .spawn();
    wait_until("the waiter subscribed", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 1
    });

    let (finished, logs) = holder.finish_keeping_logs();
    finished.expect(0);
    waiter.wait_for(Duration::from_secs(20)).expect(0);
    let ended: u128 = std::fs::read_to_string(logs.path().join("ended"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let text = std::fs::read_to_string(&started).unwrap();
    let mut lines = text.lines();
    let began: u128 = lines.next().unwrap().parse().unwrap();
    assert_eq!(
        lines.next(),
        Some("2"),
        "the waiter's fence follows the holder's"
    );
    let handoff = Duration::from_nanos((began - ended) as u64);
    assert!(
        handoff < Duration::from_millis(500),
        "handoff took {handoff:?}"
    );
}

#[test]
fn a_waiter_sends_a_handful_of_commands_not_hundreds() {
    // The waiter waits 4 s; a client polling every 10 ms would send 400 commands. A fair
    // waiter keeps its place in the queue alive (an attempt every 2 s / 3): 6 more. With
    // --holders 2, two holders hold both slots and each may renew once meanwhile.
    let holders_2: &[&str] = &["--holders", "2"];
    for (mode, holders, most) in [
        (&[][..], 1, 5 + 6),
        // A --no-fair waiter keeps its place as a racer alive the same way.
        (&["--no-fair"][..], 1, 5 + 6),
        (holders_2, 2, 6 + 6),
    ] {
        let redis = Redis::start();
        let holding: Vec<Holder> = (0..holders)
            .map(|_| Holder::start(&redis, "job", if holders > 1 { mode } else { &[] }))
            .collect();
        let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
        let waiter = lr().url(&redis.url()).args(mode).job(["true"]).spawn();
        wait_until("the waiter subscribed", Duration::from_secs(10), || {
            subscribers(&redis, "job") == 1
        });
        std::thread::sleep(Duration::from_secs(4));
        let during = command_stats(&redis, &["evalsha", "eval", "subscribe"], "calls");
        for holder in holding {
            holder.finish().expect(0);
        }
        waiter.wait().expect(0);
        // 2 acquire attempts and SUBSCRIBE from the waiter, at most one renewal from each
        // holder; and the keep-alive of a fair one.
        assert!(
            during <= most,
            "{mode:?}: {during} commands while waiting:\n{}",
            redis.cmd::<String>(&["INFO", "commandstats"])
        );
    }
}

#[test]
fn a_signal_ends_the_wait_with_nothing_run_and_nothing_held() {
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &[]);
    let token = redis.get("lock:{job}").unwrap();
    let dir = scratch();
    let marker = file(&dir, "ran");
    for (sig, name) in [
        (libc::SIGTERM, "TERM"),
        (libc::SIGINT, "INT"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGQUIT, "QUIT"),
    ] {
        let waiter = lr()
            .url(&redis.url())
            .job(["touch", path_str(&marker)])
            .spawn();
        wait_until("the waiter queued", Duration::from_secs(10), || {
            subscribers(&redis, "job") == 1 && redis.exists("queue:{job}")
        });
        signal(waiter.pid(), sig);
        let out = waiter
            .wait_for(Duration::from_secs(10))
            .expect_with(128 + sig, name);
        assert!(
            out.stderr
                .contains("while waiting for lock job: nothing was run"),
            "{}",
            out.stderr
        );
        assert!(!marker.exists(), "{name}: the command did not run");
        assert_eq!(subscribers(&redis, "job"), 0, "{name}: the waiter left");
        assert!(
            !redis.exists("queue:{job}"),
            "{name}: and its place in the queue"
        );
        assert_eq!(
            redis.get("lock:{job}"),
            Some(token.clone()),
            "the holder's lock is untouched"
        );
    }
    holder.finish().expect(0);
}

#[test]
fn a_crashed_holder_frees_the_lock_after_its_ttl() {
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &["--ttl", "1s"]);
    let waiter = lr()
        .url(&redis.url())
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .spawn();
    wait_until("the waiter subscribed", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 1
    });
    // No release message will come: the waiter must wake on the holder's expiry.
    signal(holder.running.pid(), libc::SIGKILL);
    let out = waiter.wait_for(Duration::from_secs(10)).expect(0);
    assert_eq!(out.stdout.trim(), "2");
    assert!(
        out.elapsed < Duration::from_secs(4),
        "woke on the expiry: {:?}",
        out.elapsed
    );
    let _ = holder.running.wait_for(Duration::from_secs(10));
}

#[test]
fn a_server_lost_while_waiting_is_69_at_the_deadline() {
    let mut redis = Redis::start();
    let holder = Holder::start(&redis, "job", &[]);
    let waiter = lr()
        .url(&redis.url())
        .args(["-w", "2s"])
        .job(["true"])
        .spawn();
    // Its place in the queue is the evidence that it waits (the holder's own subscription,
    // ended without waiting for the answer, may still be counted for a moment).
    wait_until("the waiter queued", Duration::from_secs(10), || {
        queued(&redis) == 1
    });
    redis.kill();
    let out = waiter.wait_for(Duration::from_secs(20)).expect(69);
    assert!(
        out.elapsed >= Duration::from_secs(2),
        "retried until the deadline: {:?}",
        out.elapsed
    );
    assert!(
        out.stderr
            .starts_with("locked-run: gave up waiting for lock job after 2s: cannot reach Redis"),
        "{}",
        out.stderr
    );
    let _ = holder.finish();
}

/// A [`Holder`], and a waiter whose child prints its fence.
/// Returns how long the waiter took after the holder finished, and the holder's stderr.
fn handoff(url: &str, redis: &Redis, holder_args: &[&str], hold: Duration) -> (Duration, String) {
    let holder = Holder::with(lr().url(url).args(holder_args), "job");
    // A holder whose UNSUBSCRIBE was refused stays counted (Redis 6 counts it, Redis 7 not).
    let before = subscribers(redis, "job");
    let waiter = lr().url(url).job(sh("echo $LOCKED_RUN_FENCE")).spawn();
    wait_until("the waiter subscribed", Duration::from_secs(10), || {
        subscribers(redis, "job") == before + 1
    });
    std::thread::sleep(hold); // the holder renews meanwhile
    let holder = holder.finish().expect(0);
    let released = std::time::Instant::now();
    let out = waiter.wait_for(Duration::from_secs(40)).expect(0);
    assert_eq!(out.stdout.trim(), "2");
    (released.elapsed(), holder.stderr)
}

#[test]
fn a_server_without_resp3_still_wakes_waiters_at_once() {
    // As Redis 5: no HELLO. Subscriptions then take a connection of their own.
    let redis = Redis::start_with(&["--rename-command", "HELLO", ""]);
    let (after, _) = handoff(&redis.url(), &redis, &[], Duration::ZERO);
    assert!(
        after < Duration::from_secs(2),
        "woken by the release, not the 30 s expiry: {after:?}"
    );
}

#[test]
fn a_user_who_may_not_unsubscribe_keeps_its_replies_in_order() {
    // The holder's UNSUBSCRIBE is refused in-band (NOPERM); that answer must not be taken for
    // the reply to a renewal (T = 1 s: a renewal every 166 ms, two or three of them while it
    // holds; a shorter T is at the mercy of two loaded cores) or to the release.
    let redis = Redis::start();
    let _: String = redis.cmd(&[
        "ACL",
        "SETUSER",
        "cron",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-unsubscribe",
    ]);
    let url = format!("redis://cron:pw@127.0.0.1:{}", redis.port);
    let (after, holder) = handoff(
        &url,
        &redis,
        &["-v", "--ttl", "1s"],
        Duration::from_millis(400),
    );
    assert!(after < Duration::from_secs(2), "{after:?}");
    assert!(
        !holder.contains("renewal failed"),
        "a renewal read the refusal as its reply:\n{holder}"
    );
}

/// A grant that comes too late to leave R + K of the lease is given back at once, not kept by
/// a wrapper that runs nothing (until its expiry, or for good when each retry refreshes it).
#[test]
fn a_grant_too_late_to_use_is_given_back() {
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &[]);
    // 100 ms each way: a grant is known 200 ms after it was asked for, leaving 1 s - D - 200 ms
    // = 788 ms of the lease, less than R + K = 300 + 650 ms.
    let proxy = Proxy::start(redis.port);
    proxy.set(Mode::Latency(Duration::from_millis(100)));
    let dir = scratch();
    let marker = file(&dir, "ran");
    let log = file(&dir, "stderr");
    // Its log is read while it runs: -v says when a grant came too late.
    let waiter = lr_stderr_to(&log)
        .args([
            "-v",
            "-u",
            &proxy.url(),
            "--ttl",
            "1s",
            "--renew-every",
            "300ms",
        ])
        .args(["--kill-after", "650ms", "-w", "3s", "job", "--"])
        .args(["touch", path_str(&marker)])
        .spawn();
    wait_until("the waiter subscribed", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 1
    });
    holder.finish().expect(0);
    wait_for_file(&log, Duration::from_secs(10), |t| {
        t.contains("to grant lock job")
    });
    // The next try is at least a round trip (200 ms) away: the lock is free until then.
    assert!(
        !redis.exists("lock:{job}"),
        "the late grant was given back before the waiter said so"
    );
    let out = waiter.wait();
    assert_ne!(out.code(), Some(0), "{out:?}");
    assert!(!marker.exists(), "nothing was run");
    assert!(!redis.exists("lock:{job}"), "nothing is held");
}

/// A user without permission on the release channel (Redis 7 gives new ACL users none unless
/// `acl-pubsub-default allchannels`): the refused SUBSCRIBE, sent with the first attempt, must
/// not be taken for the attempt's reply. Such a user runs its command, and waits by polling.
#[test]
fn a_user_who_may_not_subscribe_runs_and_waits_by_polling() {
    let redis = Redis::start();
    let _: String = redis.cmd(&[
        "ACL",
        "SETUSER",
        "cron",
        "on",
        ">pw",
        "resetchannels",
        "~*",
        "+@all",
    ]);
    let url = format!("redis://cron:pw@127.0.0.1:{}", redis.port);
    let dir = scratch();
    let marker = file(&dir, "ran");
    lr().env("LOCKED_RUN_URL", &url)
        .job(["touch", path_str(&marker)])
        .run()
        .expect(0);
    assert!(marker.exists(), "the command ran");
    assert!(!redis.exists("lock:{job}"), "nothing is held");

    let holder = Holder::start(&redis, "job", &[]);
    // Every run's first write carries a SUBSCRIBE (refused here): counted from now on, the
    // waiter's own.
    let before = command_stats(&redis, &["subscribe"], "rejected_calls");
    let waiter = lr()
        .env("LOCKED_RUN_URL", &url)
        .arg("-v")
        .job(["true"])
        .spawn();
    // The waiter's first attempt found the lock held (its fence is not spent), then it polls.
    wait_until("the waiter tried", Duration::from_secs(10), || {
        command_stats(&redis, &["subscribe"], "rejected_calls") > before
    });
    holder.finish().expect(0);
    let out = waiter
        .wait()
        .expect_with(0, "the waiter ran after the holder");
    assert!(
        out.stderr.contains("cannot subscribe to release messages"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("could not release"), "{}", out.stderr);
    assert!(!redis.exists("lock:{job}"), "nothing is held");
}
