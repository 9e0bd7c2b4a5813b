//! The lines of a first contact that failed (DESIGN, "Every reply is bounded"): each says
//! nothing was taken and never talks of giving back what was never held; a port of the other
//! kind of server says so (a Redis URL at etcd's port is no Redis server, an etcd URL at a
//! Redis port does not answer as etcd's gRPC API); an etcd NAME refused is shown as written.
//! See: issue 35, item 5 ("lines that mislead").

use std::net::TcpListener;

use crate::support::hostile::{self, Hostile};
use crate::support::*;

/// One line, status 69, ending with what DESIGN asks of a failed first contact.
#[track_caller]
fn nothing_taken(out: Output, opening: &str) {
    let out = out.expect_one_line(69, opening);
    assert!(
        out.stderr
            .trim_end()
            .ends_with("; nothing was run and nothing was taken"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("given back"), "{}", out.stderr);
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn a_refused_connection_says_nothing_was_taken() {
    let port = closed_port();
    // Fair waiting, the default, queues with the first attempt: that must not count either.
    let out = lr()
        .url(&format!("redis://127.0.0.1:{port}"))
        .job(["true"])
        .run();
    nothing_taken(out, "cannot reach Redis at");
    let out = lr()
        .url(&format!("etcd://127.0.0.1:{port}"))
        .job(["true"])
        .run();
    nothing_taken(out, "cannot reach etcd");
}

#[test]
fn a_password_or_database_refused_says_nothing_was_taken() {
    let redis = Redis::start_with(&["--requirepass", "hunter2"]);
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let out = lr().url(&url).job(["true"]).run();
    nothing_taken(out, "(NOAUTH)");
    let out = lr()
        .env("REDISCLI_AUTH", "wrong-one")
        .url(&url)
        .job(["true"])
        .run();
    nothing_taken(out, "(WRONGPASS)");
    let out = lr()
        .env("REDISCLI_AUTH", "hunter2")
        .url(&format!("{url}/99"))
        .job(["true"])
        .run();
    nothing_taken(out, "DB index is out of range");
}

/// etcd's client port hangs up on bytes that open no HTTP request: the run asks the port in
/// HTTP, once, and says what it is, not "if the server speaks TLS, use rediss://".
#[test]
fn a_redis_url_at_etcds_port_is_no_redis_server() {
    let etcd = Etcd::start();
    let url = format!("redis://{}", etcd.endpoints());
    let opening = format!("{url} is not a Redis server; it answered like HTTP");
    nothing_taken(lr().url(&url).job(["true"]).run(), &opening);
    let out = lr().args(["status", "-u", &url, "job"]).run();
    let out = out.expect_opening(69, &opening);
    assert!(!out.stderr.contains("rediss://"), "{}", out.stderr);
    // The same of a port that answers HTTP only (no etcd needed to see it).
    let port = Hostile::start(hostile::http_only);
    let url = port.redis_url();
    let opening = format!("{url} is not a Redis server; it answered like HTTP");
    nothing_taken(lr().url(&url).job(["true"]).run(), &opening);
}

/// Redis answers HTTP/2's opening with an error line, which is no HTTP/2 frame.
#[test]
fn an_etcd_url_at_a_redis_port_does_not_answer_as_etcds_grpc_api() {
    let redis = Redis::start();
    let url = format!("etcd://127.0.0.1:{}", redis.port);
    let opening = format!("etcd at 127.0.0.1:{} sent a malformed reply", redis.port);
    for args in [&["job", "--", "true"][..], &["status", "job"]] {
        let (subcommand, rest) = args.split_at(usize::from(args[0] == "status"));
        let out = lr().args(subcommand).url(&url).args(rest).run();
        let out = out.expect_opening(69, &opening);
        assert!(
            out.stderr
                .contains("it does not answer as etcd's gRPC API; check the URL's port"),
            "{}",
            out.stderr
        );
    }
}

#[test]
fn an_etcd_name_with_a_slash_is_refused_in_a_plain_line() {
    let url = format!("etcd://127.0.0.1:{}", closed_port());
    for args in [
        &["team/migrate", "--", "true"][..],
        &["doctor", "--name", "team/migrate"],
    ] {
        let (subcommand, rest) = args.split_at(usize::from(args[0] == "doctor"));
        let out = lr().args(subcommand).url(&url).args(rest).run();
        let out = out.expect_opening(
            2,
            "lock names on etcd:// hold no '/' (team/migrate has one): ",
        );
        assert!(!out.stderr.contains("LockName"), "{}", out.stderr);
    }
}
