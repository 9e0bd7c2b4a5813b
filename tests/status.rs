//! `locked-run status NAME [--json]`: exit 0 held, 1 free, 69 unreachable; the holder's program
//! name only, never its arguments.

use std::time::Duration;

use crate::support::*;

fn status(redis_url: &str, json: bool) -> Output {
    let mut cmd = locked_run();
    cmd.args(["status", "-u", redis_url]);
    if json {
        cmd.arg("--json");
    }
    cmd.arg("job");
    run(cmd)
}

fn parse(out: &Output) -> serde_json::Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

#[test]
fn free_held_and_free_again() {
    let redis = Redis::start();
    let out = status(&redis.url(), true);
    assert_eq!(out.code(), Some(1), "free: {out:?}");
    assert_eq!(
        parse(&out),
        serde_json::json!({"name": "job", "held": false, "fence": null, "ttl_ms": null, "holder": null, "holders": [], "limit": null, "waiters": 0})
    );

    let dir = scratch();
    let up = file(&dir, "up");
    let mut cmd = locked_run();
    cmd.args(["-u", &redis.url(), "--ttl", "20s", "job", "--", "sh", "-c"])
        .arg(format!("echo up > {}; exec sleep 60", path_str(&up)))
        .arg("--secret=hunter2");
    let holder = spawn(cmd);
    wait_for_file(&up, Duration::from_secs(10), |t| !t.is_empty());

    let out = status(&redis.url(), true);
    assert_eq!(out.code(), Some(0), "held: {out:?}");
    let v = parse(&out);
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

    let text = status(&redis.url(), false);
    assert_eq!(text.code(), Some(0));
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
    let out = status(&redis.url(), false);
    assert_eq!(out.code(), Some(1));
    assert_eq!(out.stdout, "job: free (last fence 1)\n");
}

#[test]
fn a_lock_held_by_another_program_shows_no_holder_details() {
    let redis = Redis::start();
    let _: String = redis.cmd(&["SET", "lock:{job}", "other-tool-token", "PX", "9000"]);
    let out = status(&redis.url(), true);
    assert_eq!(out.code(), Some(0));
    let v = parse(&out);
    assert_eq!(v["held"], true);
    assert_eq!(
        v["holder"],
        serde_json::json!({"host": null, "pid": null, "command": null, "since": null})
    );
    let _: String = redis.cmd(&["SET", "lock:{job}", "other-tool-token"]);
    let v = parse(&status(&redis.url(), true));
    assert_eq!(v["ttl_ms"], -1, "a key without expiry");
}

#[test]
fn an_unreachable_server_is_69() {
    let out = status(&format!("redis://127.0.0.1:{}", free_port()), true);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert!(
        out.stderr.starts_with("locked-run: cannot reach Redis"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout, "");
}
