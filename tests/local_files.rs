//! The host-local backend's files against what else may be in the lock directory, or not: each
//! NAME's own files, a missing, unwritable or sticky directory, links and FIFOs planted under
//! the lock's names, lock files deleted or replaced under a waiter, another process holding
//! the directory or a lock file.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::*;

#[test]
fn names_with_dots_dashes_and_slashes_get_their_own_files_inside_the_directory() {
    let since = clock_us();
    let locks = scratch();
    let url = file_url(locks.path());
    for (name, stem) in [
        ("db.migrate-v2.1", "db.migrate-v2.1"),
        ("team/job", "team%2Fjob"),
        ("..", "%2E."),
        (".hidden", "%2Ehidden"),
        ("job", "job"),
        ("job.lock", "job.lock"),
    ] {
        let out = lr()
            .arg("run")
            .url(&url)
            .name(name)
            .command(sh("echo $LOCKED_RUN_KEY"))
            .run()
            .expect_with(0, name);
        let key = locks.path().join(format!("{stem}.lock"));
        assert_eq!(out.stdout.trim(), key.to_str().unwrap(), "{name}");
        assert!(key.exists(), "{name}");
        assert!(
            locks.path().join(format!("{stem}.fence")).exists(),
            "{name}: a counter of its own"
        );
        let fence = status_json(&url, name)["fence"].as_u64().unwrap();
        assert!(
            fence > since,
            "{name}: a fence of its own, from the clock: {fence}"
        );
    }
    let mut files: Vec<String> = std::fs::read_dir(locks.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    files.sort();
    // Each NAME's lock, fence counter and history.
    assert_eq!(files.len(), 18, "nothing else, nothing outside: {files:?}");
    assert!(!locks.path().join("team").exists());
}

#[test]
fn a_missing_directory_is_created_if_its_parent_exists() {
    let parent = scratch();
    let dir = parent.path().join("locks");
    lr().url(&file_url(&dir)).job(["true"]).run().expect(0);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & !0o022, 0o755 & !0o022, "{mode:o}");

    let nowhere = parent.path().join("no/such/dir");
    let out = lr().url(&file_url(&nowhere)).job(["true"]).run().expect(2);
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
    let out = lr()
        .url(&file_url(&ro))
        .job(["touch"])
        .arg(&ran)
        .with(|cmd| {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                cmd.uid(65534).gid(65534)
            } else {
                cmd
            }
        })
        .run()
        .expect(69);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.contains("Permission denied"), "{}", out.stderr);
    assert!(out.stderr.contains("write access"), "{}", out.stderr);
    assert!(!ran.exists());
}

#[test]
fn links_planted_in_the_directory_are_never_followed() {
    let since = clock_us();
    let locks = scratch();
    let elsewhere = scratch();
    let url = file_url(locks.path());
    let victim = elsewhere.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();

    // The lock file as a link: refused, and the target untouched.
    std::os::unix::fs::symlink(&victim, locks.path().join("job.lock")).unwrap();
    let out = lr().url(&url).job(["true"]).run().expect(69);
    assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);

    // A link under the temporary name an older release used: never written through.
    std::os::unix::fs::symlink(&victim, locks.path().join(".other.fence.tmp")).unwrap();
    lr().url(&url)
        .name("other")
        .command(["true"])
        .run()
        .expect(0);
    assert!(status_json(&url, "other")["fence"].as_u64().unwrap() > since);

    // The fence counter as a link: refused, never read through.
    std::os::unix::fs::symlink(&victim, locks.path().join("third.fence")).unwrap();
    let out = lr()
        .url(&url)
        .name("third")
        .command(["true"])
        .run()
        .expect(69);
    assert!(!out.stderr.contains("precious"), "{}", out.stderr);

    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

#[test]
fn a_waiter_whose_lock_file_was_replaced_waits_on_the_new_one() {
    let locks = scratch();
    let dir = scratch();
    let url = file_url(locks.path());
    let (first, _) = start_job(&url, dir.path(), &[], "exec sleep 60");
    let first_fence = status_json(&url, "job")["fence"].as_u64().unwrap();
    let marker = file(&dir, "waiter");
    let waiter = lr()
        .url(&url)
        .name("job")
        .sh(&format!("echo $LOCKED_RUN_FENCE > {}", path_str(&marker)))
        .spawn();
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
    let fence_of = |text: String| text.trim().parse::<u64>().unwrap();
    let second_fence = fence_of(wait_for_file(
        &file(&dir, "second"),
        Duration::from_secs(10),
        |t| t.ends_with('\n'),
    ));
    assert_eq!(second_fence, first_fence + 1);

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
    second.wait().expect(0);
    waiter.wait().expect(0);
    assert_eq!(
        fence_of(std::fs::read_to_string(&marker).unwrap()),
        first_fence + 2
    );
}

/// A FIFO planted under the fence counter's name would hang the open (the lock held, deaf to
/// signals); a hard link planted under the lock file's name would have the holder's metadata
/// written into the file it links to. Both are refused at once, with one line.
#[test]
fn fifos_and_hard_links_planted_in_the_directory_are_refused() {
    let locks = scratch();
    let url = file_url(locks.path());
    let fifo = std::ffi::CString::new(path_str(&locks.path().join("job.fence"))).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
    let dir = scratch();
    let ran = file(&dir, "ran");
    let out = lr()
        .url(&url)
        .job(["touch", path_str(&ran)])
        .run()
        .expect(69);
    assert!(out.stderr.contains("not a regular file"), "{}", out.stderr);
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    assert!(!ran.exists());
    lr().args(["status", "-u", &url, "job"])
        .run()
        .expect_with(69, "status does not hang on it either");

    let linked = scratch();
    let victim = file(&dir, "victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::hard_link(&victim, linked.path().join("job.lock")).unwrap();
    let out = lr()
        .url(&file_url(linked.path()))
        .job(["touch", path_str(&ran)])
        .run()
        .expect(69);
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
    lr().url(&file_url(&sticky)).job(["true"]).run().expect(0);
    let out = lr()
        .url(&file_url(&sticky))
        .job(["true"])
        .with(|c| c.uid(65534).gid(65534))
        .run()
        .expect(69);
    assert!(out.stderr.contains("is sticky"), "{}", out.stderr);
    let left: Vec<_> = std::fs::read_dir(&sticky)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// Waiting for the brief lock on the directory (someone else holds it) does not make
/// `locked-run` deaf to signals: SIGTERM ends the wait at once.
#[test]
fn a_signal_ends_a_wait_for_the_directory() {
    let locks = scratch();
    let url = file_url(locks.path());
    let dir = scratch();
    let held = file(&dir, "held");
    let blocker = spawn(hold_flock(locks.path(), &held));
    wait_until(
        "another process holds the directory",
        Duration::from_secs(10),
        || held.exists(),
    );
    let waiting = lr().url(&url).job(["true"]).spawn();
    wait_until(
        "locked-run holds job.lock, waiting for the directory",
        Duration::from_secs(10),
        || status_json(&url, "job")["held"] == true,
    );
    let signalled = Instant::now();
    signal(waiting.pid(), libc::SIGTERM);
    waiting.wait().expect(128 + libc::SIGTERM);
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
    let url = file_url(locks.path());
    let lock = locks.path().join("job.lock");
    lr().url(&url)
        .args(["--min-hold", "3s"])
        .job(["true"])
        .run()
        .expect(0);
    // The waiter opens the lock file and sleeps out the --min-hold deadline written in it.
    let dir = scratch();
    let log = file(&dir, "stderr");
    let waiter = lr_stderr_to(&log)
        .args(["-vv", "-u", &url, "-w", "15s", "job", "--", "true"])
        .spawn();
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
    waiter.wait().expect_with(0, "it took the new file");
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

/// Issue 43's review: a run SIGKILLed while it reserved a block of fences or trimmed the
/// history left `.NAME.fence.<token>.tmp` or `.NAME.history.<token>.tmp` for ever. The next
/// reservation (or trim) removes such files of this user's once they are a minute old, and
/// nothing else.
#[test]
fn temporary_files_a_killed_run_left_are_removed_once_old() {
    let locks = scratch();
    let dir = locks.path();
    let token = |n: u32| format!("{n:08}-0000-4000-8000-000000000000");
    let left = |what: &str, n: u32| dir.join(format!(".job.{what}.{}.tmp", token(n)));
    let (old_fence, young_fence) = (left("fence", 1), left("fence", 2));
    let (old_history, other) = (
        left("history", 3),
        dir.join(format!(".jobs.fence.{}.tmp", token(4))),
    );
    for path in [&old_fence, &young_fence, &old_history, &other] {
        std::fs::write(path, "").unwrap();
    }
    for path in [&old_fence, &old_history, &other] {
        two_minutes_old(path);
    }
    // The first run reserves a block.
    let url = file_url(dir);
    lr().url(&url).job(["true"]).run().expect(0);
    assert!(!old_fence.exists(), "removed by the reservation");
    assert!(young_fence.exists() && other.exists() && old_history.exists());
    // A history long enough to be trimmed.
    let lines = "not a record\n".repeat(20_000);
    std::fs::write(dir.join("job.history"), lines).unwrap();
    lr().url(&url).job(["true"]).run().expect(0);
    assert!(!old_history.exists(), "removed by the trim");
    assert!(young_fence.exists() && other.exists());
}
