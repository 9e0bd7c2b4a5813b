//! The lines of issue 28, each held to its exact opening words (the words docs/faq.md is keyed
//! by): a refused password says where it came from and who refused it, a negative duration, a
//! port that is not a number, an unknown URL scheme, a port that speaks HTTP, a lock never
//! taken, an unknown option before the command; and every subcommand's `--help` names its
//! exit statuses.
// See: issue 28 ("messages that name the cause").

use std::io::{Read, Write};
use std::net::TcpListener;

use crate::support::*;

/// A server with a password; a wrong one given through each source is named by its source,
/// and never printed.
#[test]
fn a_refused_password_says_where_it_came_from() {
    let redis = Redis::start_with(&["--requirepass", "hunter2"]);
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let dir = scratch();
    let password = file(&dir, "pw");
    std::fs::write(&password, "wrong-one\n").unwrap();

    let out = lr()
        .url(&url)
        .args(["--password-file", path_str(&password), "-n"])
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!(
                "the password from --password-file {} was refused (WRONGPASS) by Redis at {url}",
                path_str(&password)
            ),
        );
    assert!(!out.stderr.contains("wrong-one"), "{}", out.stderr);

    let out = lr()
        .env("REDISCLI_AUTH", "wrong-one")
        .url(&url)
        .args(["status", "job"])
        .run()
        .expect_opening(
            69,
            &format!("the password from REDISCLI_AUTH was refused (WRONGPASS) by Redis at {url}"),
        );
    assert!(!out.stderr.contains("wrong-one"), "{}", out.stderr);

    let out = lr()
        .env(
            "LOCKED_RUN_URL",
            format!("redis://:wrong-one@127.0.0.1:{}", redis.port),
        )
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!("the password from the URL was refused (WRONGPASS) by Redis at {url}"),
        );
    assert!(!out.stderr.contains("wrong-one"), "{}", out.stderr);

    // None at all: our own short line, not Redis's 200-character NOAUTH text.
    let out = lr().url(&url).arg("-n").job(["true"]).run().expect_opening(
        69,
        &format!("no password was given, and Redis at {url} wants one (NOAUTH)"),
    );
    assert!(!out.stderr.contains("HELLO"), "{}", out.stderr);
    assert!(out.stderr.len() < 200, "{}", out.stderr);
    // A waiting run that could not give back its place says the refusal once, not twice.
    let out = lr().url(&url).job(["true"]).run().expect_opening(
        69,
        &format!("no password was given, and Redis at {url} wants one (NOAUTH)"),
    );
    assert_eq!(out.stderr.matches("wants one").count(), 1, "{}", out.stderr);
}

/// Behind a Cluster, the line names the node that refused.
#[test]
fn a_password_refused_in_a_cluster_names_the_node() {
    let cluster = Cluster::start();
    for node in &cluster.nodes {
        let _: String = node.cmd(&["ACL", "SETUSER", "cron", "on", ">pw", "~*", "&*", "+@all"]);
    }
    let url = cluster
        .url()
        .replace("redis+cluster://", "redis+cluster://cron@");
    let out = lr()
        .env("LOCKED_RUN_URL", &url)
        .env("REDISCLI_AUTH", "wrong-one")
        .job(["true"])
        .run()
        .expect_opening(
            69,
            "the password from REDISCLI_AUTH was refused (WRONGPASS) by cluster node 127.0.0.1:",
        );
    assert!(
        cluster.nodes.iter().any(|n| out
            .stderr
            .contains(&format!("cluster node 127.0.0.1:{} ", n.port))),
        "names a node of the cluster: {}",
        out.stderr
    );
}

/// Behind sentinels: the primary they name is the node that refused the data nodes'
/// password; a sentinel that refuses its own is named with the source of that password.
#[test]
fn a_password_refused_behind_sentinels_names_the_hop() {
    let watched = Watched::start();
    let _: String = watched
        .primary
        .cmd(&["ACL", "SETUSER", "cron", "on", ">pw", "~*", "&*", "+@all"]);
    let url = watched
        .url()
        .replace("redis+sentinel://", "redis+sentinel://cron@");
    lr().env("LOCKED_RUN_URL", &url)
        .env("REDISCLI_AUTH", "wrong-one")
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!(
                "the password from REDISCLI_AUTH was refused (WRONGPASS) by the primary 127.0.0.1:{} \
                 that the sentinels name",
                watched.primary.port
            ),
        );

    // One sentinel, with a password of its own.
    let sentinel = watched.ports[0];
    sentinel_cli(sentinel, &["ACL", "SETUSER", "default", "on", ">spw"]);
    let one = format!("redis+sentinel://127.0.0.1:{sentinel}/mymaster");
    let dir = scratch();
    let password = file(&dir, "sentinel-pw");
    std::fs::write(&password, "wrong-one\n").unwrap();
    lr().env("LOCKED_RUN_URL", &one)
        .args(["--sentinel-password-file", path_str(&password)])
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!(
                "the password from --sentinel-password-file {} was refused (WRONGPASS) by \
                 sentinel 127.0.0.1:{sentinel}",
                path_str(&password)
            ),
        );
    lr().env("LOCKED_RUN_URL", &one)
        .env("LOCKED_RUN_SENTINEL_AUTH", "wrong-one")
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!(
                "the password from LOCKED_RUN_SENTINEL_AUTH was refused (WRONGPASS) by sentinel \
                 127.0.0.1:{sentinel}"
            ),
        );
    lr().env("LOCKED_RUN_URL", &one)
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!("no password was given, and sentinel 127.0.0.1:{sentinel} wants one (NOAUTH)"),
        );
}

#[test]
fn a_negative_duration_is_our_own_usage_error() {
    lr().args(["-w", "-1s", "job", "true"])
        .run()
        .expect_opening(
            2,
            "invalid value '-1s' for '--wait <DUR>': a duration is never negative",
        );
    lr().args(["--ttl", "-5s", "job", "true"])
        .run()
        .expect_opening(
            2,
            "invalid value '-5s' for '--ttl <DUR>': a duration is never negative",
        );
    // A negative number is a value to refuse, not an unknown option `-1`.
    lr().args(["--holders", "-1", "job", "true"])
        .run()
        .expect_opening(2, "invalid value '-1' for '--holders <N>'");
}

#[test]
fn a_port_that_is_not_a_number_is_said_so() {
    lr().args(["-u", "redis://h:17391x", "job", "true"])
        .run()
        .expect_opening(2, "redis://h:17391x has a port that is not a number");
    lr().args(["-u", "redis+sentinel://h:2637x/m", "job", "true"])
        .run()
        .expect_opening(
            2,
            "redis+sentinel://h:2637x/m: port \"2637x\" is not a number",
        );
}

#[test]
fn an_unknown_scheme_lists_every_url_form() {
    let out = lr()
        .args(["-u", "fille:///tmp/locks", "job", "true"])
        .run()
        .expect_opening(
            2,
            "unknown URL scheme \"fille\" in fille:///tmp/locks: use redis://",
        );
    for form in [
        "rediss://",
        "redis+unix://",
        "redis+sentinel://",
        "rediss+sentinel://",
        "redis+cluster://",
        "rediss+cluster://",
        "file:///DIR",
        "etcd://",
        "etcds://",
        "postgres://",
    ] {
        assert!(out.stderr.contains(form), "{form} missing: {}", out.stderr);
    }
    // See issue 44: a typo of postgres:// was answered with every form but postgres's, from a
    // list kept apart from the backends.
    lr().args(["-u", "postgress://db/locks", "job", "true"])
        .run()
        .expect_one_line(2, "postgres://[user@]host[:port][,...]/DB");
}

/// A port that answers HTTP (an etcd's, a web server's), given as a Redis URL.
#[test]
fn a_port_that_answers_http_is_not_a_redis_server() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten().take(8) {
            let mut request = [0u8; 512];
            let _ = conn.read(&mut request);
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    lr().url(&url)
        .args(["-n"])
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!("{url} is not a Redis server; it answered like HTTP"),
        );
    lr().url(&url).args(["status", "job"]).run().expect_opening(
        69,
        &format!("{url} is not a Redis server; it answered like HTTP"),
    );
}

#[test]
fn a_lock_never_taken_has_no_fence_yet() {
    let locks = scratch();
    let url = format!("file://{}", path_str(locks.path()));
    lr().url(&url).job(["true"]).run().expect(0);
    let out = lr().url(&url).args(["status", "never"]).run().expect(1);
    assert_eq!(
        out.stdout,
        "never: free (no fence issued yet)\n  never taken (no run in its history: is the NAME right?)\n"
    );
    let redis = Redis::start();
    let out = lr()
        .url(&redis.url())
        .args(["status", "never"])
        .run()
        .expect(1);
    assert_eq!(
        out.stdout,
        "never: free (no fence issued yet)\n  never taken (no run in its history: is the NAME right?)\n"
    );
}

/// One rule: before the command every option is locked-run's, and an unknown one is an
/// error; from the command's first word on, everything is the command's.
#[test]
fn an_unknown_option_before_the_command_is_an_error() {
    let locks = scratch();
    let url = format!("file://{}", path_str(locks.path()));
    let ran = file(&locks, "ran");
    for args in [
        vec!["job", "-x", "--", "touch", path_str(&ran)],
        vec!["-x", "job", "--", "touch", path_str(&ran)],
        vec!["job", "-x", "touch", path_str(&ran)],
        vec!["run", "job", "--frobnicate", "--", "touch", path_str(&ran)],
    ] {
        lr().url(&url)
            .args(&args)
            .run()
            .expect_opening(2, "unknown option -");
        assert!(!ran.exists(), "{args:?} ran nothing");
    }
    let out = lr()
        .url(&url)
        .args(["job", "-x", "--", "true"])
        .run()
        .expect_opening(
            2,
            "unknown option -x: an option before the command is locked-run's own",
        );
    assert!(out.stderr.contains("`-- -x"), "{}", out.stderr);

    // A known one between NAME and the command is locked-run's; after the command's first
    // word, an option is the command's.
    let out = lr()
        .url(&url)
        .args(["job", "-n", "--", "echo", "-n", "x"])
        .run()
        .expect(0);
    assert_eq!(out.stdout, "x");
    let out = lr()
        .url(&url)
        .args(["job", "echo", "-n", "--ttl", "y"])
        .run()
        .expect(0);
    assert_eq!(out.stdout, "--ttl y");
}

#[test]
fn every_subcommands_help_names_its_exit_statuses() {
    let help = |sub: &str| lr().args([sub, "--help"]).run().expect(0).stdout;
    let run = help("run");
    assert!(run.contains("Exit status: the command's own"), "{run}");
    assert!(
        run.contains("75") && run.contains("69") && run.contains("127"),
        "{run}"
    );
    assert!(
        run.contains("an unknown one there is a usage error"),
        "{run}"
    );
    let status = help("status");
    assert!(
        status.contains("Exit status: 0 held; 1 free; 69"),
        "{status}"
    );
    for field in [
        "name", "held", "fence", "ttl_ms", "holder", "holders", "limit", "mode", "waiters",
        "quorum", "servers",
    ] {
        assert!(status.contains(field), "{field} missing: {status}");
    }
    let release = help("release");
    assert!(release.contains("Exit status: 0 released; 1"), "{release}");
    assert!(
        release.contains("; 2 ") && release.contains("; 69 "),
        "{release}"
    );
    let doctor = help("doctor");
    assert!(doctor.contains("1 when any check FAILs"), "{doctor}");
    let top = lr().arg("--help").run().expect(0).stdout;
    assert!(top.contains("Where options go:"), "{top}");
}
