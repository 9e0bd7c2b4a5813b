//! `postgres://` against a real PostgreSQL (tests/support/postgres.rs): the lock, its fence and
//! its key; a waiter woken at the release; exclusion under a hammer of runs whose renewals race
//! the expiries of SIGKILLed holders; another program holding the lock with the guide's plain
//! SQL, and `locked-run` excluding it in turn; the tables made by two first runs at once.

use std::time::Duration;

use crate::support::postgres::Postgres;
use crate::support::*;

/// The guide's transaction by which another program takes lock NAME for 30 s: one row in
/// `locked_run.holder` (after the expired ones are gone), under the fence row's lock, only
/// when no live row is left; answers the fence when granted, nothing when busy.
pub fn plain_sql_grant(name: &str, token: &str) -> String {
    format!(
        "BEGIN;
         INSERT INTO locked_run.fence (name, fence) VALUES ('{name}', 0) ON CONFLICT (name) DO NOTHING;
         SELECT FROM locked_run.fence WHERE name = '{name}' FOR UPDATE;
         DELETE FROM locked_run.holder WHERE name = '{name}' AND expires_at <= clock_timestamp();
         WITH bumped AS (UPDATE locked_run.fence SET fence = fence + 1 WHERE name = '{name}'
                 AND NOT EXISTS (SELECT FROM locked_run.holder WHERE name = '{name}')
                 AND NOT EXISTS (SELECT FROM locked_run.queue WHERE name = '{name}'
                                 AND alive_until > clock_timestamp())
               RETURNING fence)
         INSERT INTO locked_run.holder (name, token, mode, holders, fence, host, pid, command, since, expires_at)
           SELECT '{name}', '{token}', 'exclusive', 1, fence, 'java-1', 77, 'billing', clock_timestamp(),
                  clock_timestamp() + interval '30 seconds' FROM bumped
           RETURNING fence;
         COMMIT;"
    )
}

/// The guide's release: the row deleted by its token.
pub fn plain_sql_release(name: &str, token: &str) -> String {
    format!("DELETE FROM locked_run.holder WHERE name = '{name}' AND token = '{token}'")
}

#[test]
fn a_run_gets_the_fence_and_key_and_status_tells_held_from_free() {
    let pg = Postgres::start();
    let url = pg.url();
    for fence in 1..=2 {
        let out = lr()
            .url(&url)
            .job(["sh", "-c", "echo $LOCKED_RUN_FENCE $LOCKED_RUN_KEY"])
            .run()
            .expect(0);
        assert_eq!(out.stdout.trim(), format!("{fence} locked_run.holder/job"));
    }
    let free = status_json(&url, "job");
    assert_eq!(
        (free["held"].clone(), free["fence"].clone()),
        (false.into(), 2.into())
    );
    let holder = Holder::start_on(&url, "job", &[]);
    let held = status_json(&url, "job");
    assert_eq!(held["held"], true, "{held}");
    assert_eq!(held["fence"], 3);
    assert_eq!(held["holder"]["command"], "sh");
    assert!(held["ttl_ms"].as_u64().unwrap() > 25_000, "{held}");
    lr().url(&url)
        .args(["-n", "-v"])
        .job(["true"])
        .run()
        .expect(75);
    holder.finish().expect(0);
    // The fence row is the counter: what psql sees is what the runs saw.
    assert_eq!(
        pg.psql("SELECT fence FROM locked_run.fence WHERE name = 'job'"),
        "3"
    );
    lr().args(["status", "-u", &url, "never-taken"])
        .run()
        .expect(1);
}

#[test]
fn a_waiter_is_woken_by_the_release_not_by_polling() {
    let pg = Postgres::start();
    let url = pg.url();
    let holder = Holder::start_on(&url, "job", &[]);
    let dir = scratch();
    let started = dir.path().join("started");
    let waiter = lr()
        .url(&url)
        .args(["-w", "30s"])
        .name("job")
        .sh(&format!("date +%s%N > {}", path_str(&started)))
        .spawn();
    // The waiter is queued once its place is in the table.
    wait_until("the waiter's place", Duration::from_secs(10), || {
        pg.psql("SELECT count(*) FROM locked_run.queue WHERE name = 'job'") == "1"
    });
    let (out, logs) = holder.finish_keeping_logs();
    out.expect(0);
    waiter.wait().expect(0);
    let ended: u128 = std::fs::read_to_string(logs.path().join("ended"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let began: u128 = std::fs::read_to_string(&started)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let handoff = Duration::from_nanos((began - ended) as u64);
    println!("handoff: {handoff:?}");
    // A poll would wait for the next heartbeat (keep-alive/3, some 667 ms).
    assert!(
        handoff < Duration::from_millis(400),
        "handoff took {handoff:?}"
    );
}

/// Many runs on one NAME with a short lease (renewals every 40 ms), some of them SIGKILLed
/// while they hold, so that the grants of the waiters race the expiries of the dead holders'
/// rows and the renewals of the live ones: the children's own log shows no two of them ever
/// ran at once, and fences growing in the order they ran.
#[test]
fn a_hammer_of_runs_with_renewals_racing_expiries_never_has_two_holders() {
    let pg = Postgres::start();
    let url = pg.url();
    let dir = scratch();
    let log = dir.path().join("log");
    let script = format!(
        "echo start $LOCKED_RUN_FENCE $(date +%s%N) >> {l}; sleep 0.0$(shuf -i 2-9 -n 1); \
         echo end $LOCKED_RUN_FENCE $(date +%s%N) >> {l}",
        l = path_str(&log)
    );
    let timings = [
        "--ttl",
        "300ms",
        "--renew-every",
        "40ms",
        "-k",
        "60ms",
        "-w",
        "40s",
    ];
    let mut runs: Vec<Running> = (0..14)
        .map(|_| {
            lr().url(&url)
                .args(timings)
                .name("hammer")
                .sh(&script)
                .spawn()
        })
        .collect();
    // Holders SIGKILLed mid-hold (their command dies with them): their rows lapse on the
    // server while the others' grants and renewals go on.
    let victims: Vec<Running> = (0..4)
        .map(|_| {
            lr().url(&url)
                .args(timings)
                .name("hammer")
                .sh(&format!(
                    "echo start $LOCKED_RUN_FENCE $(date +%s%N) >> {l}; exec sleep 30",
                    l = path_str(&log)
                ))
                .spawn()
        })
        .collect();
    for victim in victims {
        let pid = victim.pid();
        std::thread::sleep(Duration::from_millis(150));
        signal(pid, libc::SIGKILL);
        runs.push(victim);
    }
    for run in runs {
        let out = run.wait();
        assert!(matches!(out.code(), Some(0) | None), "{out:?}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    // Each fence's start and end (a killed holder's command ends at its wrapper's death, at
    // the latest when the lease lapses: its end is taken as the next start's bound below).
    let mut events: Vec<(u128, &str, u64)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[2].parse().unwrap(), f[0], f[1].parse().unwrap())
        })
        .collect();
    events.sort();
    let mut holding: Option<u64> = None;
    let mut last_fence = 0;
    for (at, what, fence) in &events {
        match *what {
            "start" => {
                if let Some(other) = holding {
                    // Only a SIGKILLed holder never writes its end: its row must have lapsed.
                    assert!(
                        !events.iter().any(|(_, w, f)| *w == "end" && *f == other),
                        "fence {fence} started at {at} while fence {other} ran:\n{text}"
                    );
                }
                assert!(*fence > last_fence, "fences out of order:\n{text}");
                last_fence = *fence;
                holding = Some(*fence);
            }
            _ => {
                assert_eq!(holding, Some(*fence), "end of a run not holding:\n{text}");
                holding = None;
            }
        }
    }
    assert!(
        events.iter().filter(|e| e.1 == "start").count() >= 14,
        "{text}"
    );
}

#[test]
fn another_program_holding_with_plain_sql_excludes_locked_run_and_the_reverse() {
    let pg = Postgres::start();
    let url = pg.url();
    // The tables exist once any run used them (an administrator may make them instead).
    lr().url(&url).job(["true"]).run().expect(0);
    let granted = pg.psql(&plain_sql_grant("job", "java-token"));
    assert_eq!(granted, "2", "the plain-SQL grant answers its fence");
    let out = lr()
        .url(&url)
        .args(["-n", "-v"])
        .job(["true"])
        .run()
        .expect(75);
    assert!(
        out.stderr.contains("java-1 pid 77 (billing)"),
        "{}",
        out.stderr
    );
    pg.psql(&plain_sql_release("job", "java-token"));
    let out = lr()
        .url(&url)
        .job(["sh", "-c", "echo $LOCKED_RUN_FENCE"])
        .run()
        .expect(0);
    assert_eq!(out.stdout.trim(), "3");
    // The reverse: while locked-run holds, the plain-SQL grant answers nothing.
    let holder = Holder::start_on(&url, "job", &[]);
    assert_eq!(pg.psql(&plain_sql_grant("job", "java-2")), "");
    holder.finish().expect(0);
    assert_eq!(pg.psql(&plain_sql_grant("job", "java-3")), "5");

    // Issue 43's review: another program's `since` of 'infinity' failed every query that read
    // it (its cast to milliseconds): the holder reads as one of unknown start.
    pg.psql("UPDATE locked_run.holder SET since = 'infinity' WHERE name = 'job'");
    let out = lr()
        .url(&url)
        .args(["-n", "-v"])
        .job(["true"])
        .run()
        .expect(75);
    assert!(out.stderr.contains("(billing) since ?"), "{}", out.stderr);
    let status = lr().args(["status", "-u", &url, "job"]).run().expect(0);
    assert!(status.stdout.contains("since ?"), "{status:?}");
    // Nor does an expiry of 'infinity' (a lock held for ever, as another program may):
    // `status` and a run's attempt read it as one that does not end soon.
    pg.psql("UPDATE locked_run.holder SET expires_at = 'infinity' WHERE name = 'job'");
    lr().args(["status", "-u", &url, "job"]).run().expect(0);
    lr().url(&url).args(["-n"]).job(["true"]).run().expect(75);
}

/// Two first runs at once on an empty database: both make (or find) the tables, neither fails.
#[test]
fn two_first_runs_at_once_make_the_tables_without_a_race() {
    let pg = Postgres::start();
    let url = pg.url();
    let runs: Vec<Running> = (0..4)
        .map(|i| {
            lr().url(&url)
                .args(["-w", "20s"])
                .name(&format!("first{}", i % 2))
                .command(["true"])
                .spawn()
        })
        .collect();
    for run in runs {
        run.wait().expect(0);
    }
    assert_eq!(pg.psql("SELECT count(*) FROM locked_run.fence"), "2");
}
