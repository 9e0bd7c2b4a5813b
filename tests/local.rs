//! The host-local backend, `file:///DIR`: flock on DIR/NAME.lock and a durable fence counter;
//! contention, waiting, `--min-hold`, `release`, `status`, `doctor`, and flock(1) on the same
//! file. Real processes contending on a real directory; no server. (What else may be found in
//! the directory: local_files.rs.)

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn processes_contending_on_one_directory_never_overlap() {
    let locks = scratch();
    let logs = scratch();
    let log = file(&logs, "log");
    let url = file_url(locks.path());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..8 {
                    lr().url(&url)
                        .name("shared")
                        .command(["perl", "-e", CRITICAL_SECTION])
                        .arg(&log)
                        .run()
                        .expect(0);
                }
            });
        }
    });
    assert_eq!(check_log(&log), 32);
    // One token per run: 32 in a row (of one block), the last the counter's.
    let fences = history_fences(&url, "shared");
    assert_eq!(fences.len(), 32);
    let last = status_json(&url, "shared")["fence"].as_u64().unwrap();
    let mut sorted = fences.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (last - 31..=last).collect::<Vec<u64>>(),
        "{fences:?}"
    );
}

#[test]
fn a_holder_killed_mid_run_frees_the_lock_at_once_and_its_fence_is_kept() {
    let locks = scratch();
    let dir = scratch();
    let url = file_url(locks.path());
    let (holder, child) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let status = status_json(&url, "job");
    assert_eq!(status["held"], true, "{status}");
    let first = status["fence"].as_u64().unwrap();
    assert_eq!(
        status["ttl_ms"], -1,
        "no lease: held while its holder lives"
    );
    assert_eq!(status["holder"]["pid"], holder.pid());

    // A waiter, blocked on the lock.
    let started = file(&dir, "waiter");
    let waiter = lr()
        .url(&url)
        .name("job")
        .sh(&format!("echo $LOCKED_RUN_FENCE > {}", path_str(&started)))
        .spawn();
    wait_until(
        "the waiter is blocked on the lock",
        Duration::from_secs(10),
        || status_json(&url, "job")["waiters"] == 1,
    );

    signal(holder.pid(), libc::SIGKILL);
    let killed = Instant::now();
    wait_for_file(&started, Duration::from_secs(5), |t| t.ends_with('\n'));
    let woke = killed.elapsed();
    assert!(
        woke < Duration::from_millis(500),
        "the waiter started {woke:?} after the holder died"
    );
    assert_eq!(
        std::fs::read_to_string(&started).unwrap(),
        format!("{}\n", first + 1)
    );
    assert!(
        wait_pid_exit(child, Duration::from_secs(5)),
        "PDEATHSIG ended the dead holder's command"
    );
    waiter.wait().expect(0);
    let _ = holder.wait();

    // And without a waiter: a run right after the holder's death gets the lock, once its job
    // is gone (the watcher keeps the lock until then, and lets go as it exits: so -w, not -n,
    // which could come in the instant between the job's death and the watcher's).
    let dir2 = scratch();
    let (holder, child) = start_job(&url, dir2.path(), &[], "exec sleep 60");
    signal(holder.pid(), libc::SIGKILL);
    assert!(wait_pid_exit(holder.pid(), Duration::from_secs(5)));
    assert!(wait_pid_exit(child, Duration::from_secs(5)));
    let out = lr()
        .args(["-w", "2s"])
        .url(&url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert_eq!(
        out.stdout,
        format!("{}\n", first + 3),
        "three fences were issued before, durably"
    );
    assert_eq!(status_json(&url, "job")["fence"], first + 3);
    let _ = holder.wait();
}

#[test]
fn waiting_is_bounded_by_dash_w_and_ends_when_the_holder_does() {
    let locks = scratch();
    let dir = scratch();
    let url = file_url(locks.path());
    let go = file(&dir, "go");
    let (holder, _) = start_job(
        &url,
        dir.path(),
        &[],
        &format!("while [ ! -e {} ]; do sleep 0.01; done", path_str(&go)),
    );

    let out = lr().arg("-n").url(&url).job(["true"]).run().expect(75);
    assert_eq!(out.stderr, "", "-n is silent");

    let out = lr()
        .args(["-w", "1s"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(75);
    assert!(
        out.stderr.contains("gave up waiting for lock job after 1s"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("pid {}", holder.pid())),
        "{}",
        out.stderr
    );
    assert!(
        out.elapsed >= Duration::from_secs(1) && out.elapsed < Duration::from_secs(3),
        "{:?}",
        out.elapsed
    );

    let patient = lr().args(["-w", "30s"]).url(&url).job(["true"]).spawn();
    wait_until(
        "the waiter is blocked on the lock",
        Duration::from_secs(10),
        || status_json(&url, "job")["waiters"] == 1,
    );
    std::fs::write(&go, "").unwrap();
    holder.wait().expect(0);
    let out = patient.wait().expect(0);
    assert!(out.elapsed < Duration::from_secs(30));
}

#[test]
fn there_is_no_lease_to_lose() {
    let locks = scratch();
    // T = 200 ms, and a command that runs ten times as long: no renewal, no kill.
    let out = lr()
        .args(["--ttl", "200ms"])
        .url(&file_url(locks.path()))
        .job(["sleep", "2"])
        .run()
        .expect(0);
    assert_eq!(out.stderr, "");
}

#[test]
fn the_command_does_not_hold_the_lock_and_a_daemon_it_leaves_does_not_keep_it() {
    let locks = scratch();
    let dir = scratch();
    let url = file_url(locks.path());
    let daemon = file(&dir, "daemon");
    lr().url(&url)
        .name("job")
        .sh(&format!(
            "ls -l /proc/$$/fd > {fds}; setsid -f sh -c 'echo $$ > {d}.tmp; mv {d}.tmp {d}; exec sleep 30' </dev/null >/dev/null 2>&1",
            fds = path_str(&file(&dir, "fds")),
            d = path_str(&daemon)
        ))
        .run()
        .expect(0);
    let fds = std::fs::read_to_string(file(&dir, "fds")).unwrap();
    assert!(
        !fds.contains("job.lock"),
        "the lock's descriptor is close-on-exec: {fds}"
    );
    let daemon_pid: i32 = wait_for_file(&daemon, Duration::from_secs(5), |t| t.ends_with('\n'))
        .trim()
        .parse()
        .unwrap();
    assert!(alive(daemon_pid), "the setsid daemon outlived the job");
    lr().arg("-n")
        .url(&url)
        .job(["true"])
        .run()
        .expect_with(0, "the daemon does not hold the lock");
    signal(daemon_pid, libc::SIGKILL);
}

#[test]
fn min_hold_keeps_the_lock_after_the_command_and_release_force_clears_it() {
    let locks = scratch();
    let url = file_url(locks.path());
    lr().args(["--min-hold", "30s"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(0);

    let status = status_json(&url, "job");
    assert_eq!(status["held"], true, "{status}");
    let first = status["fence"].as_u64().unwrap();
    let ttl = status["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 25_000 && ttl <= 30_000, "{ttl}");
    let out = lr()
        .args(["-v", "-n"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(75);
    assert!(out.stderr.contains("not waiting"), "{}", out.stderr);

    let out = lr().args(["release", "-u", &url, "job"]).run().expect(2);
    assert!(out.stderr.contains("--min-hold"), "{}", out.stderr);
    let out = lr()
        .args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(0);
    assert!(
        out.stdout.starts_with("released lock job, held by "),
        "{}",
        out.stdout
    );

    let out = lr()
        .arg("-n")
        .url(&url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    assert_eq!(out.stdout, format!("{}\n", first + 1));
}

#[test]
fn a_short_min_hold_is_waited_out() {
    let locks = scratch();
    let url = file_url(locks.path());
    lr().args(["--min-hold", "1s"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(0);
    let out = lr()
        .args(["-w", "10s"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(0);
    assert!(
        out.elapsed >= Duration::from_millis(700) && out.elapsed < Duration::from_secs(5),
        "waited {:?} for a 1s min-hold",
        out.elapsed
    );
}

#[test]
fn a_held_lock_cannot_be_released_by_force() {
    let locks = scratch();
    let dir = scratch();
    let url = file_url(locks.path());
    let (holder, _) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let out = lr()
        .args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(2);
    assert!(
        out.stderr.contains(&format!("kill {}", holder.pid())),
        "{}",
        out.stderr
    );
    signal(holder.pid(), libc::SIGTERM);
    let out = holder.wait();
    assert!(
        out.code() == Some(143) || out.status.code().is_none(),
        "{out:?}"
    );
    assert_eq!(status_json(&url, "job")["held"], false);
}

#[test]
fn file_urls_do_not_mix() {
    let locks = scratch();
    let url = file_url(locks.path());
    for (args, needle) in [
        (
            vec!["-u", &url, "-u", "redis://127.0.0.1:1", "job", "true"],
            "cannot be combined",
        ),
        (
            vec!["-u", &url, "-u", &url, "job", "true"],
            "cannot be combined",
        ),
        (vec!["-u", "file://elsewhere/x", "job", "true"], "localhost"),
        (
            vec!["-u", &url, "--wait-replicas", "1", "job", "true"],
            "file:// has no server",
        ),
    ] {
        let out = lr().args(&args).run().expect_with(2, format!("{args:?}"));
        assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn doctor_checks_the_directory() {
    let locks = scratch();
    let url = file_url(locks.path());
    let v = lr()
        .args(["doctor", "--json", "-u", &url])
        .run()
        .expect(0)
        .json();
    let checks: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        [
            "directory",
            "writable",
            "filesystem",
            "location",
            "files",
            "cron PATH"
        ]
    );
    let location = &v["checks"][3];
    assert_eq!(
        location["status"], "WARN",
        "a temporary directory: {location}"
    );

    // A lock file planted as a link, for the NAME asked about, is a FAIL.
    std::os::unix::fs::symlink("/etc/hostname", locks.path().join("planted.lock")).unwrap();
    let out = lr()
        .args(["doctor", "--name", "planted", "-u", &url])
        .run()
        .expect(1);
    assert!(out.stdout.contains("symbolic link"), "{}", out.stdout);

    let out = lr()
        .args(["doctor", "-u", "file:///no/such/parent/dir"])
        .run()
        .expect(1);
    assert!(out.stdout.contains("FAIL"), "{}", out.stdout);

    // /dev/shm is a tmpfs: fence counters would not survive a reboot.
    if Path::new("/dev/shm").is_dir() {
        let out = lr().args(["doctor", "-u", "file:///dev/shm"]).run();
        assert!(
            out.stdout.contains("WARN") && out.stdout.contains("tmpfs"),
            "{}",
            out.stdout
        );
    }
}

#[test]
fn flock_and_locked_run_exclude_each_other_on_the_same_file() {
    let locks = scratch();
    let dir = scratch();
    let url = file_url(locks.path());
    let lock_file = locks.path().join("job.lock");
    // A locked-run SIGKILLed mid-run leaves its metadata in the lock file.
    let dead = scratch();
    let (killed, child) = start_job(&url, dead.path(), &[], "exec sleep 60");
    signal(killed.pid(), libc::SIGKILL);
    assert!(wait_pid_exit(child, Duration::from_secs(5)));
    let _ = killed.wait();

    let up = file(&dir, "up");
    let go = file(&dir, "go");
    let mut flock = std::process::Command::new("flock");
    flock.arg(&lock_file).args(sh(&format!(
        "echo up > {}; while [ ! -e {} ]; do sleep 0.01; done",
        path_str(&up),
        path_str(&go)
    )));
    let flock = spawn(flock);
    wait_for_file(&up, Duration::from_secs(10), |t| t.ends_with('\n'));
    // The holder named is flock, as /proc/locks tells, not the dead locked-run of the metadata.
    let flock_holder = format!("pid {} (flock)", flock.pid());
    let out = lr()
        .args(["-v", "-n"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(75);
    assert!(out.stderr.contains(&flock_holder), "{}", out.stderr);
    let status = status_json(&url, "job");
    assert_eq!(status["holder"]["pid"], flock.pid(), "{status}");
    assert_eq!(status["holder"]["command"], "flock", "{status}");
    let out = lr().args(["release", "-u", &url, "job"]).run();
    assert!(
        out.stderr.contains(&format!("kill {}", flock.pid())),
        "{}",
        out.stderr
    );
    std::fs::write(&go, "").unwrap();
    flock.wait().expect(0);

    let (holder, _) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let mut flock = std::process::Command::new("flock");
    flock.args(["-n"]).arg(&lock_file).arg("true");
    run(flock).expect_with(1, "flock -n finds it busy");
    signal(holder.pid(), libc::SIGTERM);
    let _ = holder.wait();
}

#[test]
fn release_force_reaches_a_waiter_sleeping_out_a_min_hold() {
    let locks = scratch();
    let dir = scratch();
    let url = file_url(locks.path());
    lr().args(["--min-hold", "60s"])
        .url(&url)
        .job(["true"])
        .run()
        .expect(0);
    let log = file(&dir, "waiter.log");
    let mut waiter = lr()
        .args(["-vv", "-w", "30s"])
        .url(&url)
        .job(["true"])
        .with(|c| c.stderr(std::fs::File::create(&log).unwrap()))
        .into_command()
        .spawn()
        .unwrap();
    wait_for_file(&log, Duration::from_secs(10), |t| {
        t.contains("sleeping up to")
    });

    lr().args(["release", "--force", "-u", &url, "job"])
        .run()
        .expect(0);
    let released = Instant::now();
    let status = wait_timeout(&mut waiter, Duration::from_secs(20)).expect("the waiter ended");
    assert_eq!(status.code(), Some(0));
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the waiter ran {took:?} after the release, with 60 s of min-hold left"
    );
}
