//! The basic run: the child gets the lease in its environment, its status comes back, the lock
//! is released, fences grow, and nothing is locked for a command that cannot run.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use crate::support::*;

#[test]
fn runs_the_command_with_the_lease_in_its_environment_and_releases() {
    let redis = Redis::start();
    let dir = scratch();
    let env_file = file(&dir, "env");
    let go = file(&dir, "go");
    let script = format!(
        "env | grep ^LOCKED_RUN_ | sort > {env}.tmp && mv {env}.tmp {env}; \
         while [ ! -e {go} ]; do sleep 0.01; done; exit 7",
        env = path_str(&env_file),
        go = path_str(&go)
    );
    let running = lr()
        .url(&redis.url())
        .args(["--ttl", "5s"])
        .name("nightly")
        .command(sh(&script))
        .spawn();

    let env = wait_for_file(&env_file, Duration::from_secs(10), |t| {
        t.contains("LOCKED_RUN_TTL_MS")
    });
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} missing from {env}"))
            .to_owned()
    };
    assert_eq!(var("LOCKED_RUN_FENCE"), "1");
    assert_eq!(var("LOCKED_RUN_NAME"), "nightly");
    assert_eq!(var("LOCKED_RUN_KEY"), "lock:{nightly}");
    assert_eq!(var("LOCKED_RUN_TTL_MS"), "5000");
    // The token is the lock's value while the child runs; the fence is the counter's.
    assert_eq!(
        redis.get("lock:{nightly}").as_deref(),
        Some(var("LOCKED_RUN_TOKEN").as_str())
    );
    assert_eq!(redis.get("fence:{nightly}").as_deref(), Some("1"));
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{nightly}"]);
    assert!(pttl > 0 && pttl <= 5000, "{pttl}");

    std::fs::write(&go, "").unwrap();
    let out = running.wait().expect(7);
    assert_eq!(out.stderr, "", "quiet on success");
    assert!(!redis.exists("lock:{nightly}"), "released");
    assert!(
        !redis.exists("holder:{nightly}"),
        "holder metadata released too"
    );
    assert_eq!(
        redis.get("fence:{nightly}").as_deref(),
        Some("1"),
        "the fence counter is kept"
    );
}

#[test]
fn fence_grows_with_every_run_and_the_status_is_the_commands() {
    let redis = Redis::start();
    for (i, code) in [0, 1, 42].into_iter().enumerate() {
        let out = lr()
            .url(&redis.url())
            .name("job")
            .sh(&format!("echo $LOCKED_RUN_FENCE; exit {code}"))
            .run()
            .expect(code);
        assert_eq!(
            out.stdout.trim(),
            (i + 1).to_string(),
            "stdout is the child's, unchanged"
        );
    }
}

#[test]
fn the_child_inherits_stdin() {
    let redis = Redis::start();
    let mut running = lr()
        .url(&redis.url())
        .job(["cat"])
        .with(|c| c.stdin(std::process::Stdio::piped()))
        .spawn();
    {
        use std::io::Write;
        let mut stdin = running.child.stdin.take().unwrap();
        stdin.write_all(b"through the wrapper\n").unwrap();
    }
    let out = running.wait();
    assert_eq!(out.stdout, "through the wrapper\n");
}

#[test]
fn command_not_found_is_127_and_nothing_is_locked() {
    let redis = Redis::start();
    let out = lr()
        .url(&redis.url())
        .job(["no-such-command-anywhere"])
        .run()
        .expect(127);
    assert!(
        out.stderr
            .starts_with("locked-run: no-such-command-anywhere: command not found"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1);
    assert!(
        !redis.exists("fence:{job}"),
        "resolved before the lock was taken"
    );

    lr().url(&redis.url())
        .job(["/no/such/path"])
        .run()
        .expect(127);
}

#[test]
fn command_not_executable_is_126_and_nothing_is_locked() {
    let redis = Redis::start();
    let dir = scratch();
    let script = file(&dir, "not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    for program in [path_str(&script), path_str(dir.path())] {
        let out = lr()
            .url(&redis.url())
            .job([program])
            .run()
            .expect_with(126, program);
        assert!(out.stderr.starts_with("locked-run: "), "{}", out.stderr);
        assert!(!redis.exists("fence:{job}"));
    }
}

#[test]
fn a_lease_shorter_than_the_run_is_renewed() {
    let redis = Redis::start();
    // T = 300 ms, run 1.5 s: five TTLs, so only renewals keep it.
    let out = lr()
        .url(&redis.url())
        .args(["--ttl", "300ms"])
        .job(["sleep", "1.5"])
        .run()
        .expect(0);
    assert_eq!(out.stderr, "");
    let renewals: u64 = redis
        .cmd::<String>(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
        .sum();
    // acquire + release + about 1.5 s / 50 ms renewals
    assert!(renewals >= 20, "{renewals} script calls");
}

#[test]
fn min_hold_keeps_the_lock_after_a_short_run() {
    let redis = Redis::start();
    lr().url(&redis.url())
        .args(["--min-hold", "5s"])
        .job(["true"])
        .run()
        .expect(0);
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
    assert!(
        pttl > 3_000 && pttl <= 5_000,
        "kept for the rest of --min-hold: {pttl}"
    );

    lr().url(&redis.url())
        .arg("-n")
        .job(["true"])
        .run()
        .expect_with(75, "a second run inside --min-hold is refused");
}

#[test]
fn a_flushed_script_cache_falls_back_to_eval() {
    let redis = Redis::start();
    let holder = Holder::start(&redis, "job", &["--ttl", "400ms"]);
    // As after a restart: the server forgets every script; renewals must still work.
    let _: String = redis.cmd(&["SCRIPT", "FLUSH"]);
    let _: String = redis.cmd(&["CONFIG", "RESETSTAT"]);
    wait_until("a renewal through EVAL", Duration::from_secs(5), || {
        redis
            .cmd::<String>(&["INFO", "commandstats"])
            .contains("cmdstat_eval:")
    });
    holder.finish().expect(0);
    assert!(!redis.exists("lock:{job}"));
}

#[test]
fn the_guides_minimal_acl_rule_is_enough_to_run_wait_and_use_the_operators_commands() {
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide.md")).unwrap();
    let rule = guide
        .lines()
        .find(|l| l.starts_with("ACL SETUSER locked-run "))
        .expect("the guide documents the ACL rule")
        .replace(">PASSWORD", ">hunter2");
    let redis = Redis::start();
    let words: Vec<&str> = rule.split_whitespace().collect();
    let _: String = redis.cmd(&words);
    let url = format!("redis://locked-run:hunter2@127.0.0.1:{}/3", redis.port);

    let holder = Holder::start_on(&url, "job", &[]);

    let waiter = lr().url(&url).job(sh("echo $LOCKED_RUN_FENCE")).spawn();
    wait_until("the waiter subscribed", Duration::from_secs(10), || {
        subscribers(&redis, "job") == 1
    });
    let status = lr().args(["status", "-u", &url, "job"]).run().expect(0);
    assert!(status.stdout.contains("; 1 waiting"), "{}", status.stdout);
    let release = lr()
        .args(["release", "-u", &url, "job"])
        .run()
        .expect_with(2, "shows the holder");
    assert!(release.stderr.contains("add --force"), "{}", release.stderr);
    // doctor checks what this user may read, and says what it could not check.
    let doctor = lr().args(["doctor", "-u", &url]).run().expect(0);
    assert!(
        doctor
            .stdout
            .lines()
            .any(|l| l.starts_with("WARN") && !l.contains("cron PATH:")),
        "{}",
        doctor.stdout
    );

    holder.finish().expect(0);
    let out = waiter.wait().expect(0);
    assert_eq!(out.stdout.trim(), "2");
    assert!(
        out.elapsed < Duration::from_secs(5),
        "woken by the release, not the expiry: {:?}",
        out.elapsed
    );
    let mut db3 = redis.conn();
    let _: () = redis::cmd("SELECT").arg(3).query(&mut db3).unwrap();
    let fence: Option<String> = redis::cmd("GET")
        .arg("fence:{job}")
        .query(&mut db3)
        .unwrap();
    assert_eq!(fence.as_deref(), Some("2"), "the URL's database was used");
    assert!(!redis.exists("fence:{job}"), "not database 0");
}

#[test]
fn a_command_that_fails_to_exec_is_126_and_the_lock_is_released() {
    let redis = Redis::start();
    let dir = scratch();
    let script = file(&dir, "bad-interpreter");
    std::fs::write(&script, "#!/no/such/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = lr()
        .url(&redis.url())
        .job([path_str(&script)])
        .run()
        .expect(126);
    assert!(out.stderr.contains("cannot run it"), "{}", out.stderr);
    assert!(
        out.stderr.contains("the lock was released"),
        "{}",
        out.stderr
    );
    assert_eq!(
        redis.get("fence:{job}").as_deref(),
        Some("1"),
        "it was taken"
    );
    assert!(!redis.exists("lock:{job}"), "and released");
}

#[test]
fn the_scripts_sha1s_are_the_servers() {
    // A stale constant would still work (NOSCRIPT, then EVAL), at two round trips a call.
    let redis = Redis::start();
    for script in locked_run::internals::redis::SCRIPTS {
        let sha: String = redis.cmd(&["SCRIPT", "LOAD", script.source]);
        assert_eq!(sha, script.sha1);
    }
}

#[test]
fn verbose_and_log_filter_say_what_happens() {
    let redis = Redis::start();
    let out = lr()
        .url(&redis.url())
        .arg("-v")
        .job(["true"])
        .run()
        .expect(0);
    assert!(
        out.stderr
            .starts_with("locked-run: info: acquired lock job with fence 1 after waiting"),
        "{}",
        out.stderr
    );

    let out = lr()
        .env("LOCKED_RUN_LOG", "debug")
        .url(&redis.url())
        .job(["true"])
        .run()
        .expect(0);
    assert!(
        out.stderr
            .contains("locked-run: debug: released lock job (ours: true)"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_unix_socket_url_works() {
    let dir = scratch();
    let socket = file(&dir, "redis.sock");
    let redis = Redis::start_with(&["--unixsocket", path_str(&socket)]);
    let out = lr()
        .url(&format!("redis+unix://{}?db=2", path_str(&socket)))
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert_eq!(out.stdout.trim(), "1");
    let mut db2 = redis.conn();
    let _: () = redis::cmd("SELECT").arg(2).query(&mut db2).unwrap();
    let fence: Option<String> = redis::cmd("GET")
        .arg("fence:{job}")
        .query(&mut db2)
        .unwrap();
    assert_eq!(fence.as_deref(), Some("1"), "the URL's database");
}
