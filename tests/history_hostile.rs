//! A history any user of the lock can write, on every backend (Redlock: on each of its
//! servers): twenty records of 1 MB pushed beside the runs' own are skipped and counted, never
//! a reason for `history` to fail (69) or for `status` to say the lock has no last run;
//! `file://` reads and trims only the tail of `NAME.history`, whatever is before it (a line of
//! 600 MB).

use std::io::Write;
use std::process::Stdio;

use serde_json::Value;

use crate::support::hostile::run_measured;
use crate::support::postgres::Postgres;
use crate::support::*;

/// How many oversized records are planted, and how large each is.
const PLANTED: usize = 20;
const SIZE: usize = 1_000_000;

/// A record of [`SIZE`] bytes that looks like one of ours but for its size.
fn oversized(i: usize) -> String {
    format!(
        "{{\"host\":\"{}\",\"token\":\"junk-{i}\",\"fence\":999999}}",
        "x".repeat(SIZE)
    )
}

fn fence_of_a_run(url: &[String], run_args: &[&str]) -> u64 {
    let out = lr()
        .args(url)
        .args(run_args)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    out.stdout.trim().parse().unwrap()
}

/// Two runs, [`PLANTED`] oversized records planted by `plant`, one run more: `history` shows
/// the runs (the newest first) and says how many records it skipped (`skipped`; none where
/// the release itself trimmed them away), and `status` has the last run's line. `run_args`:
/// what the runs take besides the `-u` arguments `url`.
fn oversized_records_are_skipped(
    url: &[String],
    run_args: &[&str],
    plant: impl Fn(),
    skipped: usize,
) {
    let older = [fence_of_a_run(url, run_args), fence_of_a_run(url, run_args)];
    plant();
    let newest = fence_of_a_run(url, run_args);
    let out = lr()
        .args(url)
        .args(["history", "--json", "job"])
        .run()
        .expect(0);
    let runs = fences_in(&out.json());
    assert_eq!(runs.first(), Some(&newest), "{runs:?}");
    match skipped {
        0 => assert!(out.stderr.is_empty(), "{}", out.stderr),
        n => {
            assert_eq!(runs, [newest, older[1], older[0]]);
            let said =
                format!("skipped {n} unreadable records in lock job's history: larger than 4096");
            assert!(out.stderr.contains(&said), "{}", out.stderr);
        }
    }
    let status = lr().args(url).args(["status", "job"]).run().expect(1);
    assert!(
        status.stdout.contains("  last run: ")
            && status.stdout.contains(&format!("fence {newest}")),
        "{status:?}"
    );
    assert!(status.stdout.len() < 4096, "{status:?}");
}

/// Issue 43: 20 entries of 1 MB on `history:{NAME}` made `history` exit 69 ("reply too
/// large") and `status` say "last run: none in its history".
#[test]
fn redis_skips_oversized_records_on_the_server() {
    let redis = Redis::start();
    let plant = || {
        for i in 0..PLANTED {
            let _: i64 = redis.cmd(&["LPUSH", "history:{job}", &oversized(i)]);
        }
    };
    oversized_records_are_skipped(&["-u".into(), redis.url()], &[], plant, PLANTED);
}

/// Redlock reads every server's history, each through the same script: what each skipped is
/// added up.
#[test]
fn redlock_skips_oversized_records_on_every_server() {
    let five = Five::start();
    let plant = || {
        for server in &five.servers {
            for i in 0..PLANTED {
                let _: i64 = server.cmd(&["LPUSH", "history:{job}", &oversized(i)]);
            }
        }
    };
    // Redlock's per-server timeout at its default (T/100) is missed on two loaded cores.
    let run_args = ["--node-timeout", "300ms"];
    oversized_records_are_skipped(&five.url_args(), &run_args, plant, 5 * PLANTED);
}

#[test]
fn postgres_skips_oversized_records_on_the_server() {
    let pg = Postgres::start();
    let plant = || {
        pg.psql(&format!(
            "INSERT INTO locked_run.history (name, token, ended_at, run) SELECT 'job', \
             'junk-' || g, clock_timestamp() + interval '1 hour', repeat('x', {SIZE}) \
             FROM generate_series(1, {PLANTED}) AS g"
        ));
    };
    // Rows that are no record go at the next run's trim (conformance's history_bounds reads
    // them before one).
    oversized_records_are_skipped(&["-u".into(), pg.url()], &[], plant, 0);
}

#[test]
fn etcd_skips_oversized_records_a_few_at_a_time() {
    let etcd = Etcd::start();
    let plant = || {
        for i in 0..PLANTED {
            // Sorted after every run's key: read first.
            let key = format!("locked-run/history/job/9999999999999999-junk-{i:02}");
            let mut put = etcd.ctl_command(&["put", &key]);
            put.stdin(Stdio::piped()).stdout(Stdio::null());
            let mut child = put.spawn().unwrap();
            child
                .stdin
                .take()
                .unwrap()
                .write_all(oversized(i).as_bytes())
                .unwrap();
            assert!(child.wait().unwrap().success(), "etcdctl put {key}");
        }
    };
    oversized_records_are_skipped(&["-u".into(), etcd.url()], &[], plant, PLANTED);
}

/// On `file://` the release that follows trims what is not a record away.
#[test]
fn file_trims_oversized_records_away() {
    let locks = scratch();
    let history = locks.path().join("job.history");
    let plant = || {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&history)
            .unwrap();
        for i in 0..PLANTED {
            writeln!(file, "{}", oversized(i)).unwrap();
        }
    };
    oversized_records_are_skipped(&["-u".into(), file_url(locks.path())], &[], plant, 0);
    let len = std::fs::metadata(&history).unwrap().len();
    assert!(len < 4096, "trimmed to the runs: {len} bytes");
}

/// Issue 43: a line of 400 MB appended to `NAME.history` by any writer of DIR made every
/// release read and rewrite the whole file under the lock (395 MB resident a run), and
/// `history` read it whole. Here a line of 600 MB (a sparse file: it takes no disk), under an
/// address space capped at 512 MiB: the release and `history` read only the last 1 MiB.
#[test]
fn file_reads_only_the_tail_of_a_huge_history() {
    let locks = scratch();
    let url = file_url(locks.path());
    lr().url(&url).job(["true"]).run().expect(0);
    let history = locks.path().join("job.history");
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(&history)
        .unwrap();
    file.set_len(file.metadata().unwrap().len() + 600_000_000)
        .unwrap();
    (&file).write_all(b"\n").unwrap();
    let (out, peak) = run_measured(&["-u", &url, "job", "true"]);
    out.expect(0);
    if let Some(kb) = peak {
        assert!(kb < 64 * 1024, "the release took {kb} KiB");
    }
    let len = std::fs::metadata(&history).unwrap().len();
    assert!(len < 4096, "trimmed to its last run: {len} bytes");
    // The trim renamed a new file over it: the huge line again, in that one, then a record.
    let record = std::fs::read_to_string(&history).unwrap();
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(&history)
        .unwrap();
    file.set_len(600_000_000).unwrap();
    (&file).write_all(b"\n").unwrap();
    (&file).write_all(record.as_bytes()).unwrap();
    let (out, peak) = run_measured(&["history", "-u", &url, "--json", "job"]);
    let out = out.expect(0);
    if let Some(kb) = peak {
        assert!(kb < 64 * 1024, "history took {kb} KiB");
    }
    let runs: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("skipped 1 unreadable record in lock job's history"),
        "{out:?}"
    );
}

/// Holders that share a NAME (`--shared`, `--holders N`) append beside each other, and one of
/// them cuts a long history, under the flock on DIR: a NAME only ever run so kept every record
/// for ever (the trim was an exclusive release's alone).
#[test]
fn file_trims_the_history_of_holders_that_share_a_name() {
    for mode in [&["--shared"][..], &["--holders", "2"][..]] {
        let locks = scratch();
        let url = file_url(locks.path());
        lr().url(&url).args(mode).job(["true"]).run().expect(0);
        let history = locks.path().join("job.history");
        let record = std::fs::read_to_string(&history).unwrap();
        std::fs::write(&history, record.repeat(250)).unwrap();
        lr().url(&url).args(mode).job(["true"]).run().expect(0);
        let kept = std::fs::read_to_string(&history).unwrap();
        assert_eq!(kept.lines().count(), 100, "{mode:?}: the newest hundred");
        assert_ne!(
            kept.lines().last(),
            record.lines().next(),
            "{mode:?}: its own last"
        );
    }
}

/// Issue 43's review: a history whose last line was cut short (`printf '{"partial":1' >>
/// job.history`, any writer of the directory) swallowed the next run's record, appended to
/// that line and then skipped with it; after a sparse file of gigabytes with no newline at
/// all, the trim left the history empty. A record now starts on a line of its own.
#[test]
fn file_starts_every_record_on_a_line_of_its_own() {
    let locks = scratch();
    let url = file_url(locks.path());
    let a = fence_of_a_run(&["-u".into(), url.clone()], &[]);
    let history = locks.path().join("job.history");
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(&history)
        .unwrap();
    (&file).write_all(b"{\"partial\":1").unwrap();
    let b = fence_of_a_run(&["-u".into(), url.clone()], &[]);
    let out = lr().args(["history", "--json", "-u", &url, "job"]).run();
    assert_eq!(fences_in(&out.json()), [b, a], "{out:?}");
    assert!(
        out.stderr.contains("skipped 1 unreadable record"),
        "{out:?}"
    );

    // Four gigabytes of no newline (sparse: no disk), then a run, which trims: its own record
    // is what is left.
    file.set_len(file.metadata().unwrap().len() + 4_000_000_000)
        .unwrap();
    let c = fence_of_a_run(&["-u".into(), url.clone()], &[]);
    assert_eq!(history_fences(&url, "job"), [c]);
    assert!(std::fs::metadata(&history).unwrap().len() < 4096);
}
