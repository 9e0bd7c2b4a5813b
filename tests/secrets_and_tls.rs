//! Secrets and TLS: a password never shows (on the command line, through the environment, in
//! `--password-file`), and `rediss://` with the tests' own CA and client certificates.

use crate::support::*;

const SECRET: &str = "hunter2-secret";

fn all_output(out: &Output) -> String {
    format!("{}{}", out.stdout, out.stderr)
}

#[test]
fn a_password_on_the_command_line_draws_a_warning_and_is_never_printed() {
    let redis = Redis::start_with(&["--requirepass", SECRET]);
    let url = format!("redis://:{SECRET}@127.0.0.1:{}", redis.port);

    let out = lr().url(&url).arg("-vv").job(["true"]).run().expect(0);
    assert!(
        out.stderr
            .contains("visible to every user of this machine (ps)"),
        "{}",
        out.stderr
    );
    assert!(!all_output(&out).contains(SECRET), "{out:?}");

    for json in [false, true] {
        let out = lr()
            .args(["status", "-u", &url, "-v", "job"])
            .args(json.then_some("--json"))
            .run()
            .expect(1);
        assert!(!all_output(&out).contains(SECRET), "{out:?}");
    }

    // Failing: unreachable, and a wrong password.
    let unreachable = format!("redis://:{SECRET}@127.0.0.1:{}", free_port());
    let wrong = format!("redis://:{SECRET}x@127.0.0.1:{}", redis.port);
    for url in [&unreachable, &wrong] {
        let out = lr().url(url).arg("-vv").job(["true"]).run().expect(69);
        assert!(!all_output(&out).contains(SECRET), "{out:?}");
    }

    // Through the environment: no warning, and still no password shown.
    let out = lr()
        .env("LOCKED_RUN_URL", &url)
        .arg("-v")
        .job(["true"])
        .run()
        .expect(0);
    assert!(
        !out.stderr.contains("visible to every user"),
        "{}",
        out.stderr
    );
    assert!(!all_output(&out).contains(SECRET));
}

#[test]
fn a_password_file_is_read_for_urls_without_one() {
    let redis = Redis::start_with(&["--requirepass", SECRET]);
    let dir = scratch();
    let file_path = file(&dir, "password");
    std::fs::write(&file_path, format!("{SECRET}\n")).unwrap();
    let with_password_file = |path: &std::path::Path| {
        lr().url(&redis.url())
            .args(["--password-file", path_str(path)])
            .job(["true"])
            .run()
    };
    let out = with_password_file(&file_path).expect(0);
    assert!(!all_output(&out).contains(SECRET));

    std::fs::write(&file_path, "").unwrap();
    let out = with_password_file(&file_path).expect(2);
    assert!(out.stderr.contains("is empty"), "{}", out.stderr);

    // Unreadable even for root: a directory.
    let out = with_password_file(dir.path()).expect(2);
    assert!(
        out.stderr
            .starts_with("locked-run: cannot read --password-file"),
        "{}",
        out.stderr
    );
}

#[test]
fn tls_with_the_tests_ca_and_client_certificates() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let certs = Certs::make();
    let redis = Redis::start_tls(&certs, false);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let ca = path_str(&certs.ca);

    let out = lr()
        .url(&url)
        .args(["--tls-ca-cert", ca])
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert_eq!(out.stdout.trim(), "1");
    lr().args(["status", "-u", &url, "--tls-ca-cert", ca, "job"])
        .run()
        .expect_with(1, "status over TLS says free");
    // By name too: the certificate is for localhost as well.
    lr().url(&format!("rediss://localhost:{}", redis.port))
        .args(["--tls-ca-cert", ca, "job", "true"])
        .run()
        .expect(0);

    // A CA that did not sign the server's certificate, or the system's CAs (which did not
    // either): refused, with a line that says where to look.
    for args in [vec!["--tls-ca-cert", path_str(&certs.other_ca)], vec![]] {
        let out = lr()
            .url(&url)
            .args(&args)
            .args(["job", "true"])
            .run()
            .expect_with(69, format!("{args:?}"));
        assert!(out.stderr.contains("certificate"), "{}", out.stderr);
        assert!(out.stderr.contains("--tls-ca-cert"), "{}", out.stderr);
        assert_eq!(out.stderr.lines().count(), 1);
    }
}

#[test]
fn tls_client_certificates_when_the_server_asks() {
    if skip_unless(server_kind().tls, "built without TLS") {
        return;
    }
    let certs = Certs::make();
    let redis = Redis::start_tls(&certs, true);
    let url = format!("rediss://127.0.0.1:{}", redis.port);
    let ca = path_str(&certs.ca);
    lr().url(&url)
        .args(["--tls-ca-cert", ca, "job", "true"])
        .run()
        .expect_with(69, "no client certificate");

    lr().url(&url)
        .args([
            "--tls-ca-cert",
            ca,
            "--tls-cert",
            path_str(&certs.client_cert),
        ])
        .args(["--tls-key", path_str(&certs.client_key), "job", "true"])
        .run()
        .expect(0);
}
