//! What `doctor` says of a PostgreSQL primary and its standbys, from real servers: the README's
//! primary and synchronous standby (OK), two primaries (FAIL), a synchronous standby waited for
//! and gone (FAIL: every grant would wait for it), and, of each standby in the URL, what the
//! primary says of it: synchronous (a failover keeps every grant), asynchronous or cascading
//! (a WARN: a failover can lose grants).

use crate::support::postgres::Postgres;
use crate::support::*;

/// The `-u` URL of these servers, as the superuser.
fn url_of(servers: &[&Postgres]) -> String {
    let hosts: Vec<String> = servers
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    format!(
        "postgres://postgres@{}/postgres?sslmode=disable",
        hosts.join(",")
    )
}

/// Whether `doctor`'s output has a line starting `level` that contains `has`.
fn said(stdout: &str, level: &str, has: &str) -> bool {
    stdout
        .lines()
        .any(|l| l.starts_with(level) && l.contains(has))
}

/// Issue 43: the README's recommended setup, a primary and a synchronous standby in one URL,
/// failed `doctor` ("FAIL ... primary: a standby"). The standby is now an OK line with its
/// replication state, and the hosts' one primary an OK line; once the standby is promoted
/// beside the old primary, two primaries are a FAIL.
#[test]
fn doctor_takes_a_primary_and_its_standby_and_fails_two_primaries() {
    let pg = Postgres::start_with(&["synchronous_standby_names=*"]);
    let standby = pg.standby();
    lr().url(&pg.url()).job(["true"]).run().expect(0);
    let both = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?sslmode=disable",
        pg.port, standby.port
    );
    let doctor = lr().args(["doctor", "-u", &both]).run().expect(0);
    let line = |start: &str, has: &str| {
        doctor
            .stdout
            .lines()
            .any(|l| l.starts_with(start) && l.contains(has))
    };
    assert!(
        line(
            "OK",
            &format!("127.0.0.1:{}  standby: a standby", standby.port)
        ) && line("OK", "received WAL to"),
        "{}",
        doctor.stdout
    );
    assert!(
        line(
            "OK",
            &format!(
                "primary: 127.0.0.1:{} is the primary, 1 standby(s)",
                pg.port
            )
        ),
        "{}",
        doctor.stdout
    );
    assert!(!doctor.stdout.contains("FAIL "), "{}", doctor.stdout);
    standby.promote();
    let doctor = lr().args(["doctor", "-u", &both]).run().expect(1);
    assert!(
        doctor
            .stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains("2 hosts of the URL are primaries")),
        "{}",
        doctor.stdout
    );
}

/// Issue 43's review: `synchronous_standby_names` names a standby that is not connected:
/// every grant waits for it until its deadline and every run fails, yet doctor said OK ("no
/// standby is connected"). A FAIL now.
#[test]
fn a_synchronous_standby_waited_for_and_not_connected_is_a_fail() {
    let pg = Postgres::start_with(&["synchronous_standby_names=s1"]);
    let doctor = lr().args(["doctor", "-u", &pg.url()]).run().expect(1);
    assert!(
        said(
            &doctor.stdout,
            "FAIL",
            "replication: synchronous_standby_names = 's1' waits for 1 synchronous standby(s), \
             and 0 is connected"
        ),
        "{}",
        doctor.stdout
    );
}

/// Issue 43's review: a cascading standby (fed by another standby, so never synchronous) was
/// "OK ... a failover to it keeps what it has". Each standby of the URL is now judged by what
/// the primary says of it: the synchronous one OK, an asynchronous one and a cascading one WARN.
#[test]
fn each_standby_is_judged_by_what_the_primary_says_of_it() {
    let pg = Postgres::start_with(&["synchronous_standby_names=s1"]);
    let s1 = pg.standby_named("s1");
    let s2 = pg.standby_named("s2");
    let s3 = s1.standby_named("s3");
    lr().url(&pg.url()).job(["true"]).run().expect(0);
    let url = url_of(&[&pg, &s1, &s2, &s3]);
    // Each standby connected as the primary (or s1) lists it: doctor reads what they say.
    wait_until(
        "s3 streams from s1",
        std::time::Duration::from_secs(20),
        || s1.psql("SELECT count(*) FROM pg_stat_replication") == "1",
    );
    let doctor = lr().args(["doctor", "-u", &url]).run();
    let out = &doctor.stdout;
    let host = |s: &Postgres| format!("127.0.0.1:{}", s.port);
    assert!(
        said(out, "OK", &format!("{}  standby: ", host(&s1)))
            && said(
                out,
                "OK",
                "a synchronous standby: a failover to it keeps every grant"
            ),
        "{out}"
    );
    assert!(
        said(out, "WARN", &format!("{}  standby: ", host(&s2)))
            && said(
                out,
                "WARN",
                "an asynchronous standby (sync_state async on the primary)"
            ),
        "{out}"
    );
    assert!(
        said(out, "WARN", &format!("{}  standby: ", host(&s3)))
            && said(
                out,
                "WARN",
                &format!(
                    "a cascading standby (it streams from {}, not from the primary)",
                    host(&s1)
                )
            ),
        "{out}"
    );
    assert!(
        said(out, "OK", "replication: 2 standby(s), 1 synchronous"),
        "{out}"
    );
    assert!(!out.contains("keeps what it has"), "{out}");
    assert!(!said(out, "FAIL", ""), "{out}");
}
