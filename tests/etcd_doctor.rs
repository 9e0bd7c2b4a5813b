//! `doctor` on `etcd://`: real etcd members on loopback (one, or three with one killed), TLS
//! and authentication on; each member's rows read from `doctor --json`.

use crate::support::*;

/// `doctor --json EXTRA...` on an etcd URL: (server, check, status, detail) rows, and the exit status.
fn etcd_doctor(locked_run: LockedRun, extra: &[&str]) -> (Vec<[String; 4]>, Output) {
    let out = locked_run.args(["doctor", "--json"]).args(extra).run();
    let v = out.json();
    assert_eq!(v["ok"], out.code() == Some(0), "{out:?}");
    let rows = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| ["server", "check", "status", "detail"].map(|f| c[f].as_str().unwrap().to_owned()))
        .collect();
    (rows, out)
}

fn row<'a>(rows: &'a [[String; 4]], server: &str, check: &str) -> (&'a str, &'a str) {
    rows.iter()
        .find(|r| r[0] == server && r[1] == check)
        .map(|r| (r[2].as_str(), r[3].as_str()))
        .unwrap_or_else(|| panic!("no {check} check for {server} in {rows:?}"))
}

#[test]
fn doctor_on_one_member_says_its_version_leader_and_shortest_lease() {
    let etcd = Etcd::start();
    let url = etcd.url();
    let endpoint = etcd.members[0].endpoint();
    let out = lr().args(["doctor"]).url(&url).run().expect(0);
    // An etcd that may revoke live leases after a stalled leader (Debian's 3.4.23) is a WARN.
    let flawed = crate::support::etcd::revokes_after_a_stalled_leader();
    let version = match flawed {
        true => "WARN",
        false => "OK",
    };
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with(version) && l.contains("version: ")),
        "no {version} version line in {}",
        out.stdout
    );
    for line in [
        "reachable",
        "raft",
        "leader",
        "members",
        "permissions",
        "lease",
    ] {
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with("OK") && l.contains(&format!("{line}: "))),
            "no OK {line} line in {}",
            out.stdout
        );
    }
    assert!(
        // The one WARN: this test's binary is not where cron looks (doctor's cron PATH line).
        out.stdout.contains(match flawed {
            true => "doctor: 6 OK, 2 WARN, 0 FAIL",
            false => "doctor: 7 OK, 1 WARN, 0 FAIL",
        }) && out.stdout.contains("cron PATH: "),
        "{}",
        out.stdout
    );
    let (rows, out) = etcd_doctor(lr().url(&url), &[]);
    assert_eq!(out.code(), Some(0), "{rows:?}");
    let (_, version) = row(&rows, &endpoint, "version");
    assert!(version.starts_with("etcd 3."), "{version}");
    let (_, lease) = row(&rows, &url, "lease");
    assert!(lease.starts_with("leases last at least "), "{lease}");
    assert!(lease.ends_with("--ttl below that is raised"), "{lease}");
    assert_eq!(etcd.leases(), 0, "doctor's lease revoked");
    assert_eq!(etcd.keys(""), [], "doctor writes no key");
}

#[test]
fn doctor_on_three_members_names_each_and_fails_the_one_killed() {
    let mut etcd = Etcd::start_cluster();
    let url = etcd.url();
    let (rows, out) = etcd_doctor(lr().url(&url), &[]);
    assert_eq!(out.code(), Some(0), "{rows:?}");
    for member in &etcd.members {
        let endpoint = member.endpoint();
        assert_eq!(row(&rows, &endpoint, "reachable").0, "OK");
        assert_eq!(row(&rows, &endpoint, "raft").0, "OK");
    }
    assert_eq!(row(&rows, &url, "leader").0, "OK");
    assert_eq!(row(&rows, &url, "members").0, "OK");
    // Two of the three in the URL: the third is named, for the URL to list it.
    let two = format!(
        "etcd://{},{}",
        etcd.members[0].endpoint(),
        etcd.members[1].endpoint()
    );
    let (rows, out) = etcd_doctor(lr().url(&two), &[]);
    assert_eq!(out.code(), Some(0), "{rows:?}");
    let (level, detail) = row(&rows, &two, "members");
    assert_eq!(level, "WARN", "{detail}");
    assert!(detail.contains(&etcd.members[2].endpoint()), "{detail}");
    // A member killed: its endpoint FAILs, the two others still agree on a leader.
    let victim = if etcd.leader() == 0 { 1 } else { 0 };
    let dead = etcd.members[victim].endpoint();
    etcd.members[victim].kill();
    let out = lr().args(["doctor"]).url(&url).run().expect(1);
    let failed: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("FAIL"))
        .collect();
    assert_eq!(failed.len(), 1, "{}", out.stdout);
    assert!(
        failed[0].contains(&dead) && failed[0].contains("reachable: "),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("OK") && l.contains("leader: ")),
        "{}",
        out.stdout
    );
}

#[test]
fn doctor_fails_a_wrong_password_naming_the_user_and_never_the_password() {
    let etcd = Etcd::start();
    for args in [
        &["user", "add", "root", "--new-user-password=rootpw-7q"][..],
        &["user", "add", "app", "--new-user-password=right-pw-7q"],
        &["role", "add", "app"],
        &[
            "role",
            "grant-permission",
            "app",
            "--prefix",
            "readwrite",
            "job/",
        ],
        &["user", "grant-role", "app", "app"],
        &["auth", "enable"],
    ] {
        let out = etcd.ctl(args);
        assert_eq!(out.code(), Some(0), "etcdctl {args:?}: {out:?}");
    }
    let at = etcd.members[0].endpoint();
    let wrong = format!("etcd://app:wrong-pw-7q@{at}");
    let (rows, out) = etcd_doctor(lr().env("LOCKED_RUN_URL", &wrong), &[]);
    assert_eq!(out.code(), Some(1), "{rows:?}");
    let server = format!("etcd://app@{at}");
    let (level, detail) = row(&rows, &server, "auth");
    assert_eq!(level, "FAIL");
    assert!(detail.contains("user app"), "{detail}");
    let out = lr()
        .env("LOCKED_RUN_URL", &wrong)
        .arg("doctor")
        .run()
        .expect(1);
    assert!(out.stdout.contains("user app"), "{}", out.stdout);
    for text in [&out.stdout, &out.stderr] {
        assert!(!text.contains("wrong-pw-7q"), "{text}");
    }
    // A run says where the refused password came from: the URL, or --password-file.
    let out = lr()
        .env("LOCKED_RUN_URL", &wrong)
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!(
                "the password from the URL was refused (authentication failed) by etcd at \
                 {server} (as user app)"
            ),
        );
    assert!(!out.stderr.contains("wrong-pw-7q"), "{}", out.stderr);
    let dir = scratch();
    let password = file(&dir, "pw");
    std::fs::write(&password, "wrong-pw-7q\n").unwrap();
    let out = lr()
        .url(&server)
        .args(["--password-file", path_str(&password)])
        .job(["true"])
        .run()
        .expect_opening(
            69,
            &format!(
                "the password from --password-file {} was refused (authentication failed) by \
                 etcd at {server} (as user app)",
                path_str(&password)
            ),
        );
    assert!(!out.stderr.contains("wrong-pw-7q"), "{}", out.stderr);
    // The right password, and the NAME its role covers; another NAME is refused.
    let right = format!("etcd://app:right-pw-7q@{at}");
    let (rows, out) = etcd_doctor(lr().env("LOCKED_RUN_URL", &right), &["--name", "job"]);
    assert_eq!(out.code(), Some(0), "{rows:?}");
    assert_eq!(row(&rows, &server, "auth").0, "OK");
    assert_eq!(row(&rows, &server, "permissions").0, "OK");
    let (rows, out) = etcd_doctor(lr().env("LOCKED_RUN_URL", &right), &["--name", "other"]);
    assert_eq!(out.code(), Some(1), "{rows:?}");
    let (level, detail) = row(&rows, &server, "permissions");
    assert_eq!(level, "FAIL");
    assert!(
        detail.contains("user app") && detail.contains("other/"),
        "{detail}"
    );
    for r in &rows {
        assert!(!r[3].contains("right-pw-7q"), "{r:?}");
    }
}

#[test]
fn doctor_on_etcds_verifies_each_members_certificate() {
    let certs = Certs::make();
    let etcd = Etcd::start_tls(&certs);
    let (ca, cert, key) = (
        path_str(&certs.ca),
        path_str(&certs.client_cert),
        path_str(&certs.client_key),
    );
    let tls = ["--tls-ca-cert", ca, "--tls-cert", cert, "--tls-key", key];
    let (rows, out) = etcd_doctor(lr().url(&etcd.url()).args(tls), &[]);
    assert_eq!(out.code(), Some(0), "{rows:?}");
    let (_, detail) = row(&rows, &etcd.members[0].endpoint(), "reachable");
    assert!(detail.contains("certificate verified"), "{detail}");
    // Without the CA, the member's certificate is not trusted: that endpoint FAILs.
    let (rows, out) = etcd_doctor(lr().url(&etcd.url()), &[]);
    assert_eq!(out.code(), Some(1), "{rows:?}");
    assert_eq!(
        row(&rows, &etcd.members[0].endpoint(), "reachable").0,
        "FAIL"
    );
}
