//! `locked-run doctor` against servers configured each way: a sound server, persistence,
//! eviction policies, a replica, a user without scripts, Redlock servers that are not
//! independent, a clock that is off. (`file://` directories: local.rs; a Cluster: cluster.rs.)

use std::time::Duration;

use crate::support::*;

/// doctor's JSON: (check, status) pairs, and the exit status.
fn doctor(urls: &[String]) -> (Vec<(String, String, String)>, Option<i32>) {
    let mut doctor = lr().args(["doctor", "--json"]);
    for url in urls {
        doctor = doctor.url(url);
    }
    let out = doctor.run();
    let v = out.json();
    let checks = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["check"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
                c["detail"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(v["ok"], out.code() == Some(0));
    (checks, out.code())
}

fn status_of<'a>(checks: &'a [(String, String, String)], check: &str) -> (&'a str, &'a str) {
    checks
        .iter()
        .find(|(c, _, _)| c == check)
        .map(|(_, s, d)| (s.as_str(), d.as_str()))
        .unwrap_or_else(|| panic!("no {check} check in {checks:?}"))
}

#[test]
fn doctor_passes_a_sound_server_and_warns_about_persistence() {
    let plain = Redis::start();
    let (checks, code) = doctor(&[plain.url()]);
    assert_eq!(code, Some(0), "{checks:?}");
    assert_eq!(status_of(&checks, "reachable").0, "OK");
    assert_eq!(status_of(&checks, "role"), ("OK", "primary"));
    let kind = server_kind();
    let named = format!(
        "{} {}.{}.",
        if kind.valkey { "Valkey" } else { "Redis" },
        kind.version.0,
        kind.version.1
    );
    let (level, version) = status_of(&checks, "version");
    assert!(
        level == "OK" && version.starts_with(&named),
        "{version}, not {named}"
    );
    let dry_run = kind.valkey || kind.version >= (7, 0);
    if dry_run {
        assert_eq!(status_of(&checks, "permissions").0, "OK");
        assert!(
            !checks.iter().any(|(c, _, _)| c == "features"),
            "{checks:?}"
        );
    } else {
        // Redis 6: no ACL DRYRUN, and doctor says what it could not check rather than FAIL.
        let (level, detail) = status_of(&checks, "permissions");
        assert!(
            level == "WARN" && detail.contains("not checked"),
            "{detail}"
        );
        assert!(status_of(&checks, "features").1.contains("ACL DRYRUN"));
    }
    assert_eq!(status_of(&checks, "clock").0, "OK");
    let (level, detail) = status_of(&checks, "persistence");
    assert_eq!(level, "WARN");
    assert!(detail.contains("fence tokens repeat"), "{detail}");

    let durable = Redis::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let (checks, _) = doctor(&[durable.url()]);
    assert_eq!(status_of(&checks, "persistence").0, "OK");
    let (checks, _) = doctor(&[Redis::start_with(&["--appendonly", "yes"]).url()]);
    assert!(
        status_of(&checks, "persistence")
            .1
            .contains("appendfsync everysec")
    );
}

#[test]
fn doctor_warns_about_eviction_policies() {
    for (policy, expected, why) in [
        ("noeviction", "OK", "nothing of the lock's is evicted"),
        ("allkeys-lru", "WARN", "can evict fence:{NAME}"),
        ("volatile-ttl", "WARN", "a held lock among them"),
    ] {
        let redis = Redis::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", policy]);
        let (checks, code) = doctor(&[redis.url()]);
        assert_eq!(code, Some(0));
        let (level, detail) = status_of(&checks, "maxmemory-policy");
        assert_eq!(level, expected, "{policy}: {detail}");
        assert!(detail.contains(why), "{policy}: {detail}");
    }
}

#[test]
fn doctor_fails_a_replica_and_a_user_who_may_not_run_scripts() {
    let primary = Redis::start();
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let (checks, code) = doctor(&[replica.url()]);
    assert_eq!(code, Some(1));
    let (level, detail) = status_of(&checks, "role");
    assert_eq!(level, "FAIL");
    assert!(
        detail.contains(&format!("a replica of 127.0.0.1:{}", primary.port)),
        "{detail}"
    );

    let _: String = primary.cmd(&[
        "ACL", "SETUSER", "cron", "on", ">pw", "~*", "&*", "+@all", "-eval", "-evalsha", "-publish",
    ]);
    if skip_unless(
        server_kind().valkey || server_kind().version >= (7, 0),
        "no ACL DRYRUN to check permissions with (Redis 6)",
    ) {
        return;
    }
    let (checks, code) = doctor(&[format!("redis://cron:pw@127.0.0.1:{}", primary.port)]);
    assert_eq!(code, Some(1));
    let (level, detail) = status_of(&checks, "permissions");
    assert_eq!(level, "FAIL");
    assert!(
        detail.contains("EVALSHA, EVAL") && detail.contains("PUBLISH"),
        "{detail}"
    );
}

#[test]
fn doctor_fails_redlock_servers_that_are_not_independent() {
    let a = Redis::start();
    let b = Redis::start();
    let c = Redis::start();
    let (checks, code) = doctor(&[a.url(), b.url(), c.url()]);
    assert_eq!(code, Some(0), "{checks:?}");
    assert_eq!(status_of(&checks, "independence").0, "OK");

    // The same server under another name.
    let (checks, code) = doctor(&[a.url(), b.url(), format!("redis://localhost:{}", a.port)]);
    assert_eq!(code, Some(1));
    let (level, detail) = status_of(&checks, "independence");
    assert_eq!(level, "FAIL");
    assert!(detail.contains("same run_id"), "{detail}");

    // A replica of another listed server.
    let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &a.port.to_string()]);
    wait_until("the replica is attached", Duration::from_secs(10), || {
        a.cmd::<String>(&["INFO", "replication"])
            .contains("connected_slaves:1")
    });
    let (checks, code) = doctor(&[a.url(), b.url(), replica.url()]);
    assert_eq!(code, Some(1));
    assert!(
        checks
            .iter()
            .any(|(c, s, d)| c == "independence" && s == "FAIL" && d.contains("replicates")),
        "{checks:?}"
    );
}

#[test]
fn doctor_warns_about_a_server_whose_clock_is_off() {
    let Some(lib) = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists()) else {
        panic!("libfaketime is not installed (apt-get install faketime); .ci/run installs it");
    };
    // libfaketime cannot be preloaded into redis-server (jemalloc reads the clock while
    // libfaketime initialises), so this host's clock runs 5 s slow instead: the same skew,
    // seen from the other side. The monotonic clocks the lease runs on are left alone.
    let redis = Redis::start();
    let v = lr()
        .args(["doctor", "--json", "-u", &redis.url()])
        .env("LD_PRELOAD", lib)
        .env("FAKETIME", "-5s")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .run()
        .expect(0)
        .json();
    let clock = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "clock")
        .unwrap();
    assert_eq!(clock["status"], "WARN", "{clock}");
    let detail = clock["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("+49") || detail.starts_with("+50"),
        "{detail}"
    );
    assert!(detail.contains("check NTP"), "{detail}");

    // Without the skew, the same server is OK.
    let (checks, _) = doctor(&[redis.url()]);
    assert_eq!(status_of(&checks, "clock").0, "OK");
}

/// The guide's least ACL user (docs/guide.md, Passwords and ACLs) passes the permissions check, and the same user without the
/// fair-waiting queue's keys fails it, named: every key and command a run uses is checked, not
/// only the lock's own.
#[test]
fn doctor_checks_every_key_a_run_uses_with_the_guides_least_acl() {
    if skip_unless(
        server_kind().valkey || server_kind().version >= (7, 0),
        "no ACL DRYRUN to check permissions with (Redis 6)",
    ) {
        return;
    }
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide.md")).unwrap();
    let least = guide
        .lines()
        .find(|l| l.starts_with("ACL SETUSER locked-run "))
        .expect("the guide's least ACL user");
    let redis = Redis::start();
    for (user, without) in [("least", None), ("noqueue", Some("~queue:*"))] {
        let args: Vec<&str> = least
            .split_whitespace()
            .map(|w| match w {
                "locked-run" => user,
                ">PASSWORD" => ">pw",
                w => w,
            })
            .filter(|w| Some(*w) != without)
            // What doctor itself reads, so that it checks this user's permissions.
            .chain(["+acl|whoami", "+acl|dryrun", "+info", "+config|get"])
            .collect();
        let _: String = redis.cmd(&args);
        let (checks, code) = doctor(&[format!("redis://{user}:pw@127.0.0.1:{}", redis.port)]);
        let (level, detail) = status_of(&checks, "permissions");
        match without {
            None => assert_eq!((level, code), ("OK", Some(0)), "{detail}"),
            Some(_) => {
                assert_eq!((level, code), ("FAIL", Some(1)), "{detail}");
                assert!(detail.contains("ZADD queue:{doctor}"), "{detail}");
                assert!(!detail.contains("lock:{doctor}"), "{detail}");
            }
        }
    }
}

/// Whatever the backend (a Redis, one that cannot be reached, a `file://` directory), the last
/// line says whether cron's default PATH finds this binary, and what to write when it does not.
/// See issue 39: the README's install put locked-run in ~/.cargo/bin, and the README's cron
/// line then failed every minute with 127 ("locked-run: not found").
///
/// The binary under test is never the one cron finds: where a package installed
/// /usr/bin/locked-run, cron's PATH finds that one instead, which the line names (see issue 47:
/// the test failed on a machine with the .deb installed).
#[test]
fn doctor_says_whether_cron_finds_this_binary_on_every_backend() {
    let redis = Redis::start();
    let locks = scratch();
    let unreachable = format!("redis://127.0.0.1:{}", free_port());
    let exe = env!("CARGO_BIN_EXE_locked-run");
    let dir = std::path::Path::new(exe)
        .parent()
        .unwrap()
        .display()
        .to_string();
    let installed = installed_on_crons_path();
    for url in [redis.url(), unreachable, file_url(locks.path())] {
        let (checks, _) = doctor(std::slice::from_ref(&url));
        let (check, level, detail) = checks.last().unwrap();
        assert_eq!(
            (check.as_str(), level.as_str()),
            ("cron PATH", "WARN"),
            "{url}"
        );
        let opening = match installed.as_deref() {
            Some(other) => format!(
                "cron's default PATH finds another locked-run ({other}), not this one ({exe})"
            ),
            None => "cron's default PATH does not find this locked-run".to_owned(),
        };
        assert!(
            detail.starts_with(&opening)
                && detail.contains(&format!("write its full path ({exe})"))
                && detail.contains(&format!("PATH={dir}:/usr/bin:/bin")),
            "{url}: {detail}"
        );
    }
}

/// The locked-run cron's default PATH (/usr/bin:/bin) finds on this machine, if any: one a
/// package installed.
fn installed_on_crons_path() -> Option<String> {
    ["/usr/bin/locked-run", "/bin/locked-run"]
        .into_iter()
        .find(|p| std::path::Path::new(p).is_file())
        .map(str::to_owned)
}
