//! Who may own a `file://` lock's files (issue 35, item 3: in a sticky directory that others
//! can write, a lock file's owner renamed it away under a holder and let a second run in). There,
//! a lock, slot, fence or queue file of another user is refused (69, one line naming it and its
//! owner), and so is a link planted under any of their names; `doctor` says the same; a
//! directory of one group (mode 2770) is shared by its members. Needs root, to act as two
//! users (root and nobody, uid 65534).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::support::*;

const NOBODY: u32 = 65534;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root, to act as two users");
    }
    root
}

/// A directory of `mode` (and group `gid`) inside a scratch directory that every user can reach.
fn directory(parent: &tempfile::TempDir, mode: u32, gid: u32) -> PathBuf {
    std::fs::set_permissions(parent.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = parent.path().join("locks");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(0), Some(gid)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// `sh -c SCRIPT` as nobody, with umask 0 (files it makes are 0666: the world's to write), in
/// `dir`; its exit status.
fn as_nobody(dir: &Path, script: &str) -> Output {
    let mut sh = Command::new("sh");
    sh.args(["-c", &format!("umask 0; {script}")])
        .current_dir(dir)
        .uid(NOBODY)
        .gid(NOBODY);
    run(sh)
}

/// The one line refusing `file` as nobody's.
fn refused_as_nobodys(out: Output, file: &Path) {
    let line = format!("{} belongs to user nobody (uid 65534)", file.display());
    let out = out.expect_one_line(69, &line);
    assert!(out.stderr.contains("2770"), "{}", out.stderr);
}

#[test]
fn files_another_user_owns_are_refused_in_a_sticky_directory_and_used_in_a_group_one() {
    if !root() {
        return;
    }
    let parent = scratch();
    let sticky = directory(&parent, 0o1777, 0);
    let url = file_url(&sticky);
    let ran = parent.path().join("ran");
    let touch = ["touch", ran.to_str().unwrap()];

    // Each file a run stands on, made by nobody first.
    as_nobody(&sticky, ": > job.lock").expect(0);
    refused_as_nobodys(lr().url(&url).job(touch).run(), &sticky.join("job.lock"));
    as_nobody(&sticky, "echo 5 > other.fence").expect(0);
    let out = lr().url(&url).name("other").command(touch).run();
    refused_as_nobodys(out, &sticky.join("other.fence"));
    as_nobody(&sticky, ": > slots.lock.0").expect(0);
    let out = lr()
        .url(&url)
        .args(["--holders", "2", "slots"])
        .command(touch)
        .run();
    refused_as_nobodys(out, &sticky.join("slots.lock.0"));
    as_nobody(&sticky, ": > queued.queue").expect(0);
    let out = lr()
        .url(&url)
        .args(["-n", "--shared", "queued"])
        .command(touch)
        .run();
    refused_as_nobodys(out, &sticky.join("queued.queue"));
    assert!(!ran.exists(), "a command ran on a file nobody could swap");

    // doctor says the same of the NAME asked about.
    let out = lr()
        .args(["doctor", "--name", "job", "-u", &url])
        .run()
        .expect(1);
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("FAIL") && l.contains("belongs to user nobody (uid 65534)")),
        "{}",
        out.stdout
    );
    // Nobody's runs use nobody's files; root's own files are used by root.
    lr().url(&url)
        .job(["true"])
        .with(|c| c.uid(NOBODY).gid(NOBODY))
        .run()
        .expect(0);
    lr().url(&url)
        .name("mine")
        .command(["true"])
        .run()
        .expect(0);

    // A directory of one group, 2770 (no sticky bit, no world write): its members are
    // trusted alike, and use each other's files.
    let group = scratch();
    let shared = directory(&group, 0o2770, NOBODY);
    let url = file_url(&shared);
    as_nobody(&shared, ": > job.lock").expect(0);
    lr().url(&url)
        .job(["true"])
        .with(|c| c.uid(NOBODY).gid(NOBODY))
        .run()
        .expect_with(0, "nobody, a member");
    lr().url(&url)
        .job(["true"])
        .run()
        .expect_with(0, "root, on nobody's files");
    lr().url(&url)
        .job(["true"])
        .with(|c| c.uid(NOBODY).gid(NOBODY))
        .run()
        .expect_with(0, "nobody, after root");
    let fences = history_fences(&url, "job");
    assert_eq!(fences.len(), 3, "{fences:?}");
    assert_eq!(fences, [fences[2] + 2, fences[2] + 1, fences[2]]);
    assert_eq!(status_json(&url, "job")["fence"], fences[0]);
    let out = lr()
        .args(["doctor", "--name", "job", "-u", &url])
        .run()
        .expect(0);
    assert!(
        !out.stdout.lines().any(|l| l.starts_with("FAIL")),
        "{}",
        out.stdout
    );
}

// See: issue 35, item 3 (file:// in a sticky world-writable directory lets two holders in).
#[test]
fn a_lock_file_renamed_away_by_its_owner_never_lets_a_second_run_in() {
    if !root() {
        return;
    }
    let parent = scratch();
    let sticky = directory(&parent, 0o1777, 0);
    let url = file_url(&sticky);
    let evidence = scratch();
    let (a_up, b_ran) = (file(&evidence, "a.up"), file(&evidence, "b.ran"));
    let go = file(&evidence, "go");

    // nobody makes the lock file, as any user may in /tmp; root's job A takes the lock.
    as_nobody(&sticky, ": > job.lock").expect(0);
    let a = lr()
        .url(&url)
        .name("job")
        .sh(&format!(
            "touch {}; n=0; until [ -e {} ] || [ $n -ge 6000 ]; do sleep 0.01; n=$((n+1)); done",
            path_str(&a_up),
            path_str(&go)
        ))
        .spawn();
    wait_until("A holds, or was refused", Duration::from_secs(10), || {
        a_up.exists() || !alive(a.pid())
    });
    // nobody swaps the file (an owner may, in a sticky directory); root's `-n` job B comes.
    as_nobody(&sticky, "mv job.lock job.lock.away && : > job.lock").expect(0);
    let b = lr()
        .url(&url)
        .arg("-n")
        .job(["touch", b_ran.to_str().unwrap()])
        .run();
    std::fs::write(&go, "").unwrap();
    let a = a.wait();
    assert!(
        !(a_up.exists() && b_ran.exists()),
        "A and B held the lock at once: {a:?} {b:?}"
    );
    refused_as_nobodys(a, &sticky.join("job.lock"));
    refused_as_nobodys(b, &sticky.join("job.lock"));
    assert!(!a_up.exists() && !b_ran.exists());

    // With root's own lock file, the swap itself is what the sticky bit refuses to nobody.
    std::fs::remove_file(sticky.join("job.lock")).unwrap();
    std::fs::remove_file(sticky.join("job.lock.away")).unwrap();
    std::fs::remove_file(&go).unwrap();
    let a = lr()
        .url(&url)
        .name("job")
        .sh(&format!(
            "touch {}; until [ -e {} ]; do sleep 0.01; done",
            path_str(&a_up),
            path_str(&go)
        ))
        .spawn();
    wait_for_file(&a_up, Duration::from_secs(10), |_| true);
    let swap = as_nobody(&sticky, "mv job.lock job.lock.away");
    assert_ne!(
        swap.code(),
        Some(0),
        "nobody renamed root's lock file: {swap:?}"
    );
    lr().url(&url).arg("-n").job(["true"]).run().expect(75);
    std::fs::write(&go, "").unwrap();
    a.wait().expect(0);
}

#[test]
fn links_planted_under_any_of_a_locks_names_in_a_sticky_directory_are_refused() {
    if !root() {
        return;
    }
    let parent = scratch();
    let sticky = directory(&parent, 0o1777, 0);
    let url = file_url(&sticky);
    let victim = parent.path().join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let plant = |name: &str| {
        as_nobody(&sticky, &format!("ln -s {} {name}", path_str(&victim))).expect(0);
        sticky.join(name)
    };
    let link_refused = |out: Output, link: &Path| {
        let out = out.expect_one_line(69, "symbolic link");
        assert!(out.stderr.contains(path_str(link)), "{}", out.stderr);
    };

    let link = plant("job.lock");
    link_refused(lr().url(&url).job(["true"]).run(), &link);
    let link = plant("fenced.fence");
    link_refused(lr().url(&url).name("fenced").command(["true"]).run(), &link);
    let link = plant("slots.lock.1");
    // Slot 0 is taken, so slot 1 is tried.
    let holder = Holder::start_on(&url, "slots", &["--holders", "2"]);
    let out = lr()
        .url(&url)
        .args(["--holders", "2", "-n", "slots"])
        .command(["true"])
        .run();
    link_refused(out, &link);
    holder.finish().expect(0);
    let link = plant("queued.queue");
    let out = lr()
        .url(&url)
        .args(["-n", "--shared", "queued"])
        .command(["true"])
        .run();
    link_refused(out, &link);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

// See: the review of issue 35's mend. A place nobody planted with the largest ticket ended the
// tickets: every new place got the same one, readers queued behind a writer found no writer
// before them and went ahead of it, and the counter kept the value after the file was gone.
#[test]
fn a_place_planted_by_another_user_does_not_end_the_queues_order() {
    if !root() {
        return;
    }
    let parent = scratch();
    let sticky = directory(&parent, 0o1777, 0);
    let url = file_url(&sticky);
    let evidence = scratch();
    let d = evidence.path();
    as_nobody(&sticky, ": > job.wait.18446744073709551615.shared").expect(0);
    let r0 = logged(&url, d, "r0", &["--shared"]);
    wait_until("r0 holds", Duration::from_secs(10), || {
        log_of(d).contains("start r0 ")
    });
    let w = logged(&url, d, "w", &[]);
    wait_until("the writer queues", Duration::from_secs(10), || {
        list(&sticky).iter().any(|n| n.ends_with(".exclusive"))
    });
    let r1 = logged(&url, d, "r1", &["--shared"]);
    wait_until("the reader queues", Duration::from_secs(10), || {
        list(&sticky)
            .iter()
            .filter(|n| n.ends_with(".shared"))
            .count()
            == 2
    });
    let places = list(&sticky);
    assert!(
        places.contains(&"job.wait.1.exclusive".to_owned())
            && places.contains(&"job.wait.2.shared".to_owned()),
        "tickets counted from the planted place: {places:?}"
    );
    go(d, "r0");
    r0.wait().expect(0);
    wait_until("the writer starts", Duration::from_secs(10), || {
        log_of(d).contains("start w ")
    });
    go(d, "w");
    w.wait().expect(0);
    go(d, "r1");
    r1.wait().expect(0);
    let log = log_of(d);
    assert!(
        log.find("end w").unwrap() < log.find("start r1 ").unwrap(),
        "the reader went ahead of the writer queued before it:\n{log}"
    );
}

/// The queue's places in `dir`, by name.
fn list(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("job.wait."))
        .collect()
}

// See: the review of issue 35's mend. A directory another user owns (made first by them, as
// under /tmp) lets that user rename root's lock file away and a second run in; `doctor` said
// only that it was under /tmp.
#[test]
fn doctor_warns_of_a_lock_directory_another_user_owns() {
    if !root() {
        return;
    }
    let parent = scratch();
    let dir = directory(&parent, 0o755, 0);
    let url = file_url(&dir);
    let warned = |out: &Output| {
        out.stdout.lines().any(|l| {
            l.starts_with("WARN")
                && l.contains("belongs to user nobody (uid 65534), who can rename")
        })
    };
    let out = lr().args(["doctor", "-u", &url, "--name", "job"]).run();
    assert!(!warned(&out), "root's own directory: {}", out.stdout);
    std::os::unix::fs::chown(&dir, Some(NOBODY), None).unwrap();
    let out = lr().args(["doctor", "-u", &url, "--name", "job"]).run();
    assert!(warned(&out), "{}", out.stdout);
}

// See: the review of this round's mends. The fence's temporary file had one name, which a run
// removed before it wrote a new one: in a sticky directory only its owner may remove it, so a
// link nobody planted under that name denied the NAME to every other user for good.
#[test]
fn a_link_planted_under_a_temporary_name_denies_no_one() {
    if !root() {
        return;
    }
    let parent = scratch();
    let sticky = directory(&parent, 0o1777, 0);
    let url = file_url(&sticky);
    as_nobody(
        &sticky,
        "ln -s /nonexistent .job.fence.tmp && ln -s /nonexistent .job.history.tmp",
    )
    .expect(0);
    let out = lr()
        .url(&url)
        .name("job")
        .sh("echo $LOCKED_RUN_FENCE")
        .with(|c| c.uid(1001).gid(1001))
        .run();
    assert_eq!(out.code(), Some(0), "{out:?}");
    assert!(out.stdout.trim().parse::<u64>().unwrap() > 0, "{out:?}");
}

/// Run with umask 0 (as a cron or unit may be), a lock's files are still not the world's to
/// write: another user cannot set the fence counter back, and the next run's fence goes on.
#[test]
fn with_umask_0_no_file_of_a_lock_is_the_worlds_to_write() {
    if !root() {
        return;
    }
    let parent = scratch();
    let dir = directory(&parent, 0o1777, 0);
    let url = format!("file://{}", dir.display());
    let bin = BIN;
    let mut first = Command::new("sh");
    first.args([
        "-c",
        &format!("umask 0; exec {bin} -u {url} job -- sh -c 'echo $LOCKED_RUN_FENCE'"),
    ]);
    let out = run(first);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let first_fence: u64 = out.stdout.trim().parse().unwrap();
    for name in ["job.lock", "job.fence", "job.history"] {
        let mode = std::fs::metadata(dir.join(name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o002, 0, "{name} is {mode:o}");
    }
    let reset = as_nobody(&dir, "echo 0 > job.fence");
    assert_ne!(
        reset.code(),
        Some(0),
        "nobody wrote the fence counter: {reset:?}"
    );
    let next = lr()
        .url(&url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    let fence: u64 = next.stdout.trim().parse().unwrap();
    assert!(fence > first_fence, "{fence}");
    // doctor says so of one that was made open to all (by an older version, or another tool).
    let warned = |out: &Output| {
        out.stdout
            .lines()
            .any(|l| l.starts_with("WARN") && l.contains("writable by every user: anyone may set"))
            && !out.stdout.contains("  the lock")
    };
    let out = lr().args(["doctor", "-u", &url, "--name", "job"]).run();
    assert!(!warned(&out), "{}", out.stdout);
    let fence_file = dir.join("job.fence");
    std::fs::set_permissions(&fence_file, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = lr().args(["doctor", "-u", &url, "--name", "job"]).run();
    assert!(warned(&out), "{}", out.stdout);
    assert!(
        out.stdout.contains(&fence_file.display().to_string()),
        "{}",
        out.stdout
    );
}
