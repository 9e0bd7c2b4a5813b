//! The host-local backend, `file:///DIR`: flock on DIR/NAME.lock and a durable fence counter.
//! Real processes contending on a real directory; no server.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;

fn url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

fn status_json(url: &str, name: &str) -> serde_json::Value {
    let out = run_args(&["status", "--json", "-u", url, name]);
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

fn fence_file(dir: &Path, stem: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{stem}.fence"))).unwrap()
}

#[test]
fn processes_contending_on_one_directory_never_overlap() {
    let locks = scratch();
    let logs = scratch();
    let log = file(&logs, "log");
    let url = url(locks.path());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..8 {
                    let mut cmd = locked_run();
                    cmd.args(["-u", &url, "shared", "--", "perl", "-e", CRITICAL_SECTION])
                        .arg(&log);
                    let out = run(cmd);
                    assert_eq!(out.code(), Some(0), "{out:?}");
                }
            });
        }
    });
    assert_eq!(check_log(&log), 32);
    assert_eq!(
        fence_file(locks.path(), "shared"),
        "32\n",
        "one token per run"
    );
}

#[test]
fn a_holder_killed_mid_run_frees_the_lock_at_once_and_its_fence_is_kept() {
    let locks = scratch();
    let dir = scratch();
    let url = url(locks.path());
    let (holder, child) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let status = status_json(&url, "job");
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(status["fence"], 1);
    assert_eq!(
        status["ttl_ms"], -1,
        "no lease: held while its holder lives"
    );
    assert_eq!(status["holder"]["pid"], holder.pid());

    // A waiter, blocked on the lock.
    let started = file(&dir, "waiter");
    let mut waiter = locked_run();
    waiter.args(["-u", &url, "job"]).args(sh(&format!(
        "echo $LOCKED_RUN_FENCE > {}",
        path_str(&started)
    )));
    let waiter = spawn(waiter);
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
    assert_eq!(std::fs::read_to_string(&started).unwrap(), "2\n");
    assert!(
        wait_pid_exit(child, Duration::from_secs(5)),
        "PDEATHSIG ended the dead holder's command"
    );
    assert_eq!(waiter.wait().code(), Some(0));
    let _ = holder.wait();

    // And without a waiter: a -n run right after the holder's death gets the lock.
    let dir2 = scratch();
    let (holder, child) = start_job(&url, dir2.path(), &[], "exec sleep 60");
    signal(holder.pid(), libc::SIGKILL);
    assert!(wait_pid_exit(holder.pid(), Duration::from_secs(5)));
    let out = run_args(&[
        "-n",
        "-u",
        &url,
        "job",
        "--",
        "sh",
        "-c",
        "echo $LOCKED_RUN_FENCE",
    ]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout, "4\n", "fences 1..3 were issued before, durably");
    assert_eq!(fence_file(locks.path(), "job"), "4\n");
    assert!(wait_pid_exit(child, Duration::from_secs(5)));
    let _ = holder.wait();
}

#[test]
fn waiting_is_bounded_by_dash_w_and_ends_when_the_holder_does() {
    let locks = scratch();
    let dir = scratch();
    let url = url(locks.path());
    let go = file(&dir, "go");
    let (holder, _) = start_job(
        &url,
        dir.path(),
        &[],
        &format!("while [ ! -e {} ]; do sleep 0.01; done", path_str(&go)),
    );

    let out = run_args(&["-n", "-u", &url, "job", "--", "true"]);
    assert_eq!(out.code(), Some(75), "{out:?}");
    assert_eq!(out.stderr, "", "-n is silent");

    let out = run_args(&["-w", "1s", "-u", &url, "job", "--", "true"]);
    assert_eq!(out.code(), Some(75), "{out:?}");
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

    let mut patient = locked_run();
    patient.args(["-w", "30s", "-u", &url, "job", "--", "true"]);
    let patient = spawn(patient);
    wait_until(
        "the waiter is blocked on the lock",
        Duration::from_secs(10),
        || status_json(&url, "job")["waiters"] == 1,
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(holder.wait().code(), Some(0));
    let out = patient.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.elapsed < Duration::from_secs(30));
}

#[test]
fn there_is_no_lease_to_lose() {
    let locks = scratch();
    // T = 200 ms, and a command that runs ten times as long: no renewal, no kill.
    let out = run_args(&[
        "--ttl",
        "200ms",
        "-u",
        &url(locks.path()),
        "job",
        "--",
        "sleep",
        "2",
    ]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stderr, "");
}

#[test]
fn names_with_dots_dashes_and_slashes_get_their_own_files_inside_the_directory() {
    let locks = scratch();
    let url = url(locks.path());
    for (name, stem) in [
        ("db.migrate-v2.1", "db.migrate-v2.1"),
        ("team/job", "team%2Fjob"),
        ("..", "%2E."),
        (".hidden", "%2Ehidden"),
        ("job", "job"),
        ("job.lock", "job.lock"),
    ] {
        let mut cmd = locked_run();
        cmd.args([
            "run",
            "-u",
            &url,
            name,
            "--",
            "sh",
            "-c",
            "echo $LOCKED_RUN_KEY",
        ]);
        let out = run(cmd);
        assert_eq!(out.code(), Some(0), "{name}: {out:?}");
        let key = locks.path().join(format!("{stem}.lock"));
        assert_eq!(out.stdout.trim(), key.to_str().unwrap(), "{name}");
        assert!(key.exists(), "{name}");
        assert_eq!(
            fence_file(locks.path(), stem),
            "1\n",
            "{name}: a counter of its own"
        );
    }
    let mut files: Vec<String> = std::fs::read_dir(locks.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    assert_eq!(files.len(), 12, "nothing else, nothing outside: {files:?}");
    assert!(!locks.path().join("team").exists());
}

#[test]
fn the_command_does_not_hold_the_lock_and_a_daemon_it_leaves_does_not_keep_it() {
    let locks = scratch();
    let dir = scratch();
    let url = url(locks.path());
    let daemon = file(&dir, "daemon");
    let mut cmd = locked_run();
    cmd.args(["-u", &url, "job"]).args(sh(&format!(
        "ls -l /proc/$$/fd > {fds}; setsid -f sh -c 'echo $$ > {d}.tmp; mv {d}.tmp {d}; exec sleep 30' </dev/null >/dev/null 2>&1",
        fds = path_str(&file(&dir, "fds")),
        d = path_str(&daemon)
    )));
    assert_eq!(run(cmd).code(), Some(0));
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
    let mut next = locked_run();
    next.args(["-n", "-u", &url, "job", "--", "true"]);
    assert_eq!(
        run(next).code(),
        Some(0),
        "the daemon does not hold the lock"
    );
    signal(daemon_pid, libc::SIGKILL);
}

#[test]
fn min_hold_keeps_the_lock_after_the_command_and_release_force_clears_it() {
    let locks = scratch();
    let url = url(locks.path());
    let mut cmd = locked_run();
    cmd.args(["--min-hold", "30s", "-u", &url, "job", "--", "true"]);
    assert_eq!(run(cmd).code(), Some(0));

    let status = status_json(&url, "job");
    assert_eq!(status["held"], true, "{status}");
    let ttl = status["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 25_000 && ttl <= 30_000, "{ttl}");
    let out = run_args(&["-v", "-n", "-u", &url, "job", "--", "true"]);
    assert_eq!(out.code(), Some(75), "{out:?}");
    assert!(out.stderr.contains("not waiting"), "{}", out.stderr);

    let out = run_args(&["release", "-u", &url, "job"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("--min-hold"), "{}", out.stderr);
    let out = run_args(&["release", "--force", "-u", &url, "job"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(
        out.stdout.starts_with("released lock job, held by "),
        "{}",
        out.stdout
    );

    let out = run_args(&[
        "-n",
        "-u",
        &url,
        "job",
        "--",
        "sh",
        "-c",
        "echo $LOCKED_RUN_FENCE",
    ]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout, "2\n");
}

#[test]
fn a_short_min_hold_is_waited_out() {
    let locks = scratch();
    let url = url(locks.path());
    let mut cmd = locked_run();
    cmd.args(["--min-hold", "1s", "-u", &url, "job", "--", "true"]);
    assert_eq!(run(cmd).code(), Some(0));
    let out = run_args(&["-w", "10s", "-u", &url, "job", "--", "true"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
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
    let url = url(locks.path());
    let (holder, _) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let out = run_args(&["release", "--force", "-u", &url, "job"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
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
fn a_missing_directory_is_created_if_its_parent_exists() {
    let parent = scratch();
    let dir = parent.path().join("locks");
    let mut cmd = locked_run();
    cmd.args(["-u", &url(&dir), "job", "--", "true"]);
    assert_eq!(run(cmd).code(), Some(0));
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & !0o022, 0o755 & !0o022, "{mode:o}");

    let nowhere = parent.path().join("no/such/dir");
    let out = run_args(&["-u", &url(&nowhere), "job", "--", "true"]);
    assert_eq!(out.code(), Some(2), "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("does not exist, nor does its parent"),
        "{}",
        out.stderr
    );
    assert!(!nowhere.exists());
}

#[test]
fn an_unwritable_directory_is_69_and_nothing_runs() {
    let parent = scratch();
    // The test's user must be able to reach the directory, but not write it. Root ignores
    // permission bits, so as root the run drops to nobody.
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let ro = parent.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    let ran = parent.path().join("ran");
    let mut cmd = locked_run();
    cmd.args(["-u", &url(&ro), "job", "--", "touch"]).arg(&ran);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(65534).gid(65534);
    }
    let out = run(cmd);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("Permission denied"), "{}", out.stderr);
    assert!(out.stderr.contains("write access"), "{}", out.stderr);
    assert!(!ran.exists());
}

#[test]
fn file_urls_do_not_mix() {
    let locks = scratch();
    let url = url(locks.path());
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
            "not for file://",
        ),
    ] {
        let mut cmd = locked_run();
        cmd.args(&args);
        let out = run(cmd);
        assert_eq!(out.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stderr.contains(needle), "{args:?}: {}", out.stderr);
    }
}

#[test]
fn doctor_checks_the_directory() {
    let locks = scratch();
    let out = run_args(&["doctor", "--json", "-u", &url(locks.path())]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let checks: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap())
        .collect();
    assert_eq!(
        checks,
        ["directory", "writable", "filesystem", "location", "files"]
    );
    let location = &v["checks"][3];
    assert_eq!(
        location["status"], "WARN",
        "a temporary directory: {location}"
    );

    // A lock file planted as a link, for the NAME asked about, is a FAIL.
    std::os::unix::fs::symlink("/etc/hostname", locks.path().join("planted.lock")).unwrap();
    let out = run_args(&["doctor", "--name", "planted", "-u", &url(locks.path())]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stdout.contains("symbolic link"), "{}", out.stdout);

    let out = run_args(&["doctor", "-u", "file:///no/such/parent/dir"]);
    assert_eq!(out.code(), Some(1), "{out:?}");
    assert!(out.stdout.contains("FAIL"), "{}", out.stdout);

    // /dev/shm is a tmpfs: fence counters would not survive a reboot.
    if Path::new("/dev/shm").is_dir() {
        let mut cmd = locked_run();
        cmd.args(["doctor", "-u", "file:///dev/shm"]);
        let out = run(cmd);
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
    let url = url(locks.path());
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
    let out = run_args(&["-v", "-n", "-u", &url, "job", "--", "true"]);
    assert_eq!(out.code(), Some(75), "{out:?}");
    assert!(out.stderr.contains(&flock_holder), "{}", out.stderr);
    let status = status_json(&url, "job");
    assert_eq!(status["holder"]["pid"], flock.pid(), "{status}");
    assert_eq!(status["holder"]["command"], "flock", "{status}");
    let out = run_args(&["release", "-u", &url, "job"]);
    assert!(
        out.stderr.contains(&format!("kill {}", flock.pid())),
        "{}",
        out.stderr
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(flock.wait().code(), Some(0));

    let (holder, _) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let mut flock = std::process::Command::new("flock");
    flock.args(["-n"]).arg(&lock_file).arg("true");
    assert_eq!(run(flock).code(), Some(1), "flock -n finds it busy");
    signal(holder.pid(), libc::SIGTERM);
    let _ = holder.wait();
}

#[test]
fn links_planted_in_the_directory_are_never_followed() {
    let locks = scratch();
    let elsewhere = scratch();
    let url = url(locks.path());
    let victim = elsewhere.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();

    // The lock file as a link: refused, and the target untouched.
    std::os::unix::fs::symlink(&victim, locks.path().join("job.lock")).unwrap();
    let out = run_args(&["-u", &url, "job", "--", "true"]);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);

    // The fence's temporary file as a link: replaced by a fresh file, the target untouched.
    std::os::unix::fs::symlink(&victim, locks.path().join(".other.fence.tmp")).unwrap();
    let out = run_args(&["-u", &url, "other", "--", "true"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(fence_file(locks.path(), "other"), "1\n");

    // The fence counter as a link: refused, never read through.
    std::os::unix::fs::symlink(&victim, locks.path().join("third.fence")).unwrap();
    let out = run_args(&["-u", &url, "third", "--", "true"]);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert!(!out.stderr.contains("precious"), "{}", out.stderr);

    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

#[test]
fn a_waiter_whose_lock_file_was_replaced_waits_on_the_new_one() {
    let locks = scratch();
    let dir = scratch();
    let url = url(locks.path());
    let (first, _) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let marker = file(&dir, "waiter");
    let mut waiter = locked_run();
    waiter.args(["-u", &url, "job"]).args(sh(&format!(
        "echo $LOCKED_RUN_FENCE > {}",
        path_str(&marker)
    )));
    let waiter = spawn(waiter);
    wait_until("the waiter is blocked", Duration::from_secs(10), || {
        status_json(&url, "job")["waiters"] == 1
    });

    // Someone deletes the lock file while it is held (never do this), and a new run takes a
    // lock on the new file: two holders, but never the same fence.
    std::fs::remove_file(locks.path().join("job.lock")).unwrap();
    let go = file(&dir, "go");
    let second_dir = scratch();
    let (second, _) = start_job(
        &url,
        second_dir.path(),
        &["-n"],
        &format!(
            "echo $LOCKED_RUN_FENCE > {}; while [ ! -e {} ]; do sleep 0.01; done",
            path_str(&file(&dir, "second")),
            path_str(&go)
        ),
    );
    assert_eq!(
        wait_for_file(&file(&dir, "second"), Duration::from_secs(10), |t| t
            .ends_with('\n')),
        "2\n"
    );

    // The first holder ends: its (deleted) file is free, but the waiter must not take that
    // one; it finds the file at the path replaced and waits on the new one.
    signal(first.pid(), libc::SIGTERM);
    let _ = first.wait();
    wait_until(
        "the waiter waits on the new file",
        Duration::from_secs(10),
        || status_json(&url, "job")["waiters"] == 1,
    );
    assert!(!marker.exists(), "the waiter ran beside the second holder");

    std::fs::write(&go, "").unwrap();
    assert_eq!(second.wait().code(), Some(0));
    let out = waiter.wait();
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "3\n");
}

#[test]
fn release_force_reaches_a_waiter_sleeping_out_a_min_hold() {
    let locks = scratch();
    let dir = scratch();
    let url = url(locks.path());
    assert_eq!(
        run_args(&["--min-hold", "60s", "-u", &url, "job", "--", "true"]).code(),
        Some(0)
    );
    let log = file(&dir, "waiter.log");
    let mut waiter = locked_run();
    waiter
        .args(["-vv", "-w", "30s", "-u", &url, "job", "--", "true"])
        .stderr(std::fs::File::create(&log).unwrap());
    let mut waiter = waiter.spawn().unwrap();
    wait_for_file(&log, Duration::from_secs(10), |t| {
        t.contains("sleeping up to")
    });

    let out = run_args(&["release", "--force", "-u", &url, "job"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let released = Instant::now();
    let status = wait_timeout(&mut waiter, Duration::from_secs(20)).expect("the waiter ended");
    assert_eq!(status.code(), Some(0));
    let took = released.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the waiter ran {took:?} after the release, with 60 s of min-hold left"
    );
}

/// A FIFO planted under the fence counter's name would hang the open (the lock held, deaf to
/// signals); a hard link planted under the lock file's name would have the holder's metadata
/// written into the file it links to. Both are refused at once, with one line.
#[test]
fn fifos_and_hard_links_planted_in_the_directory_are_refused() {
    let locks = scratch();
    let url = url(locks.path());
    let fifo = std::ffi::CString::new(path_str(&locks.path().join("job.fence"))).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    let dir = scratch();
    let ran = file(&dir, "ran");
    let mut cmd = locked_run();
    cmd.args(["-u", &url, "job", "--", "touch", path_str(&ran)]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert!(out.stderr.contains("not a regular file"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(!ran.exists());
    let mut status = locked_run();
    status.args(["status", "-u", &url, "job"]);
    assert_eq!(
        run(status).code(),
        Some(69),
        "status does not hang on it either"
    );

    let linked = scratch();
    let victim = file(&dir, "victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::hard_link(&victim, linked.path().join("job.lock")).unwrap();
    let mut cmd = locked_run();
    cmd.args([
        "-u",
        &self::url(linked.path()),
        "job",
        "--",
        "touch",
        path_str(&ran),
    ]);
    let out = run(cmd);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert!(out.stderr.contains("hard links"), "{}", out.stderr);
    assert!(!ran.exists());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

/// In a sticky directory (mode 1777, as /tmp is) only a file's owner may replace it: the second
/// user of a lock there is told so, and leaves no temporary file behind.
#[test]
fn a_sticky_directory_says_why_a_second_user_cannot_use_it() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root, to run as two users");
        return;
    }
    let parent = scratch();
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sticky = parent.path().join("shared");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let mut first = locked_run();
    first.args(["-u", &url(&sticky), "job", "--", "true"]);
    assert_eq!(run(first).code(), Some(0));
    let mut second = locked_run();
    second
        .args(["-u", &url(&sticky), "job", "--", "true"])
        .uid(65534)
        .gid(65534);
    let out = run(second);
    assert_eq!(out.code(), Some(69), "{out:?}");
    assert!(out.stderr.contains("is sticky"), "{}", out.stderr);
    assert!(
        !sticky.join(".job.fence.tmp").exists(),
        "no temporary file left"
    );
}

/// Waiting for the brief lock on the directory (someone else holds it) does not make
/// `locked-run` deaf to signals: SIGTERM ends the wait at once.
#[test]
fn a_signal_ends_a_wait_for_the_directory() {
    let locks = scratch();
    let url = url(locks.path());
    let dir = scratch();
    let held = file(&dir, "held");
    let blocker = spawn(hold_flock(locks.path(), &held));
    wait_until(
        "another process holds the directory",
        Duration::from_secs(10),
        || held.exists(),
    );
    let mut cmd = locked_run();
    cmd.args(["-u", &url, "job", "--", "true"]);
    let waiting = spawn(cmd);
    wait_until(
        "locked-run holds job.lock, waiting for the directory",
        Duration::from_secs(10),
        || status_json(&url, "job")["held"] == true,
    );
    let signalled = Instant::now();
    signal(waiting.pid(), libc::SIGTERM);
    let out = waiting.wait();
    assert_eq!(out.code(), Some(128 + libc::SIGTERM), "{out:?}");
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "{:?}",
        signalled.elapsed()
    );
    assert_eq!(status_json(&url, "job")["held"], false, "nothing is held");
    signal(blocker.pid(), libc::SIGKILL);
    let _ = blocker.wait();
}

/// A waiter whose own lock file was replaced while someone else holds the old one takes the
/// new one (the lock is the file at the path) instead of trying the old one again and again.
#[test]
fn a_waiter_whose_file_was_replaced_under_another_holder_does_not_spin() {
    let locks = scratch();
    let url = url(locks.path());
    let lock = locks.path().join("job.lock");
    let mut first = locked_run();
    first.args(["-u", &url, "--min-hold", "3s", "job", "--", "true"]);
    assert_eq!(run(first).code(), Some(0));
    // The waiter opens the lock file and sleeps out the --min-hold deadline written in it.
    let dir = scratch();
    let log = file(&dir, "stderr");
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(format!("exec \"$0\" \"$@\" 2> {}", path_str(&log)))
        .arg(locked_run().get_program())
        .args(["-vv", "-u", &url, "-w", "15s", "job", "--", "true"]);
    let waiter = spawn(cmd);
    wait_for_file(&log, Duration::from_secs(10), |t| {
        t.contains("sleeping up to")
    });
    // Meanwhile flock(1) takes that file, and someone replaces it at the path.
    let held = file(&dir, "held");
    let other = spawn(hold_flock(&lock, &held));
    wait_until(
        "another process holds the old file",
        Duration::from_secs(10),
        || held.exists(),
    );
    std::fs::remove_file(&lock).unwrap();
    std::fs::write(&lock, "").unwrap();
    let started = Instant::now();
    let out = waiter.wait();
    assert_eq!(out.code(), Some(0), "it took the new file: {out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    signal(other.pid(), libc::SIGKILL);
    let _ = other.wait();
}

/// One process that takes an exclusive flock on `path` (a file or a directory), creates `held`,
/// and keeps the lock until it is killed.
fn hold_flock(path: &Path, held: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("perl");
    cmd.args([
        "-e",
        r#"use Fcntl qw(:flock O_RDONLY); sysopen(my $f, $ARGV[0], O_RDONLY) or die "$!";
           flock($f, LOCK_EX) or die "$!"; open(my $h, ">", $ARGV[1]) or die "$!"; close $h;
           sleep 30"#,
    ])
    .arg(path)
    .arg(held);
    cmd
}
