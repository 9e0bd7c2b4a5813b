//! `locked-run status NAME [--json]`: exit 0 held, 1 free, 69 unreachable; the holder's program
//! name only, never its arguments; how many wait (live places in the queue, not subscribers).

use std::time::Duration;

use crate::support::*;

fn status(redis_url: &str, json: bool) -> Output {
    lr().args(["status", "-u", redis_url])
        .args(json.then_some("--json"))
        .name("job")
        .run()
}

#[test]
fn free_held_and_free_again() {
    let redis = Redis::start();
    let out = status(&redis.url(), true).expect_with(1, "free");
    assert_eq!(
        out.json(),
        serde_json::json!({"name": "job", "held": false, "fence": null, "ttl_ms": null, "holder": null, "holders": [], "limit": null, "mode": null, "waiters": 0, "last_run": null})
    );

    let dir = scratch();
    let up = file(&dir, "up");
    let holder = lr()
        .url(&redis.url())
        .args(["--ttl", "20s"])
        .job(["sh", "-c"])
        .arg(format!("echo up > {}; exec sleep 60", path_str(&up)))
        .arg("--secret=hunter2")
        .spawn();
    wait_for_file(&up, Duration::from_secs(10), |t| !t.is_empty());

    let out = status(&redis.url(), true).expect_with(0, "held");
    let v = out.json();
    assert_eq!(v["held"], true);
    assert_eq!(v["fence"], 1);
    let ttl = v["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 15_000 && ttl <= 20_000, "{ttl}");
    assert_eq!(v["holder"]["pid"], holder.pid());
    assert_eq!(v["holder"]["command"], "sh", "the program name only");
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    assert_eq!(v["holder"]["host"], host.as_str());
    assert!(v["holder"]["since"].as_str().unwrap().ends_with('Z'));
    assert!(!out.stdout.contains("hunter2"), "arguments are never shown");

    let text = status(&redis.url(), false).expect(0);
    assert!(
        text.stdout.starts_with(&format!(
            "job: held by {host} pid {} (sh) since ",
            holder.pid()
        )),
        "{}",
        text.stdout
    );
    assert!(text.stdout.contains("; fence 1; "), "{}", text.stdout);

    signal(holder.pid(), libc::SIGTERM);
    let _ = holder.wait();
    let out = status(&redis.url(), false).expect(1);
    let (free, last) = out.stdout.split_once('\n').unwrap();
    assert_eq!(free, "job: free (last fence 1)");
    assert!(
        last.starts_with("  last run: ") && last.contains("  fence 1  "),
        "the last run's line: {}",
        out.stdout
    );
}

#[test]
fn a_lock_held_by_another_program_shows_no_holder_details() {
    let redis = Redis::start();
    let _: String = redis.cmd(&["SET", "lock:{job}", "other-tool-token", "PX", "9000"]);
    let v = status(&redis.url(), true).expect(0).json();
    assert_eq!(v["held"], true);
    assert_eq!(
        v["holder"],
        serde_json::json!({"host": null, "pid": null, "command": null, "since": null})
    );
    let _: String = redis.cmd(&["SET", "lock:{job}", "other-tool-token"]);
    let v = status(&redis.url(), true).json();
    assert_eq!(v["ttl_ms"], -1, "a key without expiry");
}

#[test]
fn an_unreachable_server_is_69() {
    let out = status(&format!("redis://127.0.0.1:{}", free_port()), true).expect(69);
    assert!(
        out.stderr.starts_with("locked-run: cannot reach Redis"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");
}

#[test]
fn status_counts_the_waiters() {
    let redis = Redis::start();
    let dir = scratch();
    let (holder, _) = start_job(&redis.url(), dir.path(), &[], "exec sleep 60");
    let waiter = lr().url(&redis.url()).job(["true"]).spawn();
    wait_until("the waiter subscribed", Duration::from_secs(10), || {
        status_json(&redis.url(), "job")["waiters"] == 1
    });
    let text = status(&redis.url(), false);
    assert!(
        text.stdout
            .lines()
            .next()
            .unwrap()
            .ends_with("left; 1 waiting"),
        "{}",
        text.stdout
    );
    signal(holder.pid(), libc::SIGTERM);
    let _ = holder.wait();
    waiter.wait().expect(0);
}

// See: commit bd8102f. `status` counted the subscribers of the release channel
// as waiters, so a stopped (or vanished) waiter counted for as long as its connection lived.
#[test]
fn status_counts_live_places_not_subscribers() {
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &[]);
    let w = lr().url(&redis.url()).job(["true"]).spawn();
    wait_until("queued", Duration::from_secs(10), || queued(&redis) == 1);
    signal(w.pid(), libc::SIGSTOP);
    wait_until(
        "the stopped waiter's place lapsed",
        Duration::from_secs(8),
        || status_json(&redis.url(), "job")["waiters"] == 0,
    );
    signal(w.pid(), libc::SIGCONT);
    holder.finish().expect(0);
    w.wait().expect(0);
}
