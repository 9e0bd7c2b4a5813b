//! The host-local backend's fence across crashes: a run SIGKILLed at each step of issuing its
//! token (strace kills it on entry to the system call that would take the next step), a power
//! cut of the whole file system (the device's content copied while the runs' writes that were
//! never synced sit in memory, then mounted again), and the directory restored from a copy
//! (`cp -a`, in place or anew), its count edited or its counter set back by hand. Every way, a
//! later run gets a larger token than any run was given before; and a run writes nothing
//! durably before its command starts, but once per block of tokens.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::*;

/// One run of `job` at `url`, its command printing its fence: the token.
fn fence_of_a_run(url: &str) -> u64 {
    let out = lr()
        .url(url)
        .job(sh("echo $LOCKED_RUN_FENCE"))
        .run()
        .expect(0);
    out.stdout.trim().parse().unwrap()
}

/// A run of `job` traced by strace, SIGKILLed on entry to the `when`-th call of `syscall`: its
/// command (which would write a file) must never start.
fn killed_at(url: &str, dir: &Path, syscall: &str, when: u32) {
    let started = dir.join(format!("started-{syscall}-{when}"));
    let mut cmd = without_our_settings("strace");
    cmd.args(["-f", "-qq", "-o", "/dev/null", "-e"])
        .arg(format!("trace={syscall}"))
        .arg("-e")
        .arg(format!("inject={syscall}:signal=SIGKILL:when={when}"))
        .args([BIN, "-u", url, "job", "--", "touch"])
        .arg(&started);
    let out = run(cmd);
    assert!(
        !out.status.success() && !started.exists(),
        "not killed before its command at {syscall} #{when} (strace installed?): {out:?}"
    );
}

/// The token a killed run wrote into the lock file, if it got that far.
fn left_in_lock_file(locks: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(locks.join("job.lock")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("fence="))
        .map(|f| f.parse().unwrap())
}

/// The counter file replaced by a fresh one with the same value, as the previous release
/// writes it: the next run reserves a block (durably) instead of counting in the last one.
fn as_the_previous_release_left_it(locks: &Path) {
    let value = fence_file(locks, "job");
    let tmp = locks.join(".job.fence.tmp");
    std::fs::write(&tmp, value).unwrap();
    std::fs::rename(&tmp, locks.join("job.fence")).unwrap();
}

#[test]
fn a_run_killed_at_any_step_of_taking_its_fence_never_lets_a_later_run_have_it_again() {
    let locks = scratch();
    let logs = scratch();
    let url = file_url(locks.path());
    let mut highest = 0;
    for _ in 0..3 {
        let fence = fence_of_a_run(&url);
        assert!(fence > highest, "{fence} after {highest}");
        highest = fence;
    }
    // (reserving: whether the run reserves a block, system call, which call of it)
    let steps = [
        // Counting in the block: before it is read, before the count is raised, before the
        // lock file names the holder, before the command is started.
        (false, "fgetxattr", 1),
        (false, "fsetxattr", 1),
        (false, "pwrite64", 1),
        (false, "clone", 1),
        // Reserving a block: the temporary file written but not synced, not renamed, its
        // directory entry not synced (the new block is seen, not yet on disk: it must not be
        // counted from), its count not set, the lock file not written, the command not
        // started.
        (true, "fsync", 1),
        (true, "rename", 1),
        (true, "fsync", 2),
        (true, "fsetxattr", 1),
        (true, "pwrite64", 1),
        (true, "clone", 1),
    ];
    for (reserving, syscall, when) in steps {
        if reserving {
            as_the_previous_release_left_it(locks.path());
        }
        killed_at(&url, logs.path(), syscall, when);
        if (reserving, syscall, when) == (true, "fsync", 2) {
            // Renamed, perhaps not on disk: a run that counted from it could give, after a
            // crash, a token the block on disk also holds.
            assert_eq!(counted(&locks.path().join("job.fence")), None);
        }
        let issued = left_in_lock_file(locks.path()).unwrap_or(0).max(highest);
        let fence = fence_of_a_run(&url);
        assert!(
            fence > issued,
            "killed at {syscall} #{when}: {fence} after {issued}"
        );
        highest = fence;
        // The counter still reads as one for the previous release: a number and a newline.
        let counter = fence_file(locks.path(), "job");
        assert!(
            counter.trim().parse::<u64>().unwrap() >= fence,
            "{counter:?}"
        );
    }
}

#[test]
fn a_run_writes_nothing_durably_before_its_command_but_once_per_block() {
    let locks = scratch();
    let trace_dir = scratch();
    let url = file_url(locks.path());
    let traced = |n: u32| -> Vec<String> {
        let trace = trace_dir.path().join(format!("trace-{n}"));
        let mut cmd = without_our_settings("strace");
        cmd.args(["-f", "-qq", "-o", path_str(&trace)])
            .args([
                "-e",
                "trace=fsync,fdatasync,sync_file_range,rename,renameat2,execve",
            ])
            .args([BIN, "-u", &url, "job", "--", "true"]);
        run(cmd).expect(0);
        let text = std::fs::read_to_string(&trace).expect("strace is installed (see .ci/run)");
        // Up to the command's exec (the first execve is the wrapper's own).
        let calls: Vec<String> = text.lines().map(str::to_owned).collect();
        let command = calls
            .iter()
            .skip(1)
            .position(|c| c.contains("execve(") && c.contains("true"))
            .unwrap_or_else(|| panic!("the command never started: {calls:#?}"));
        calls[1..=command].to_vec()
    };
    let first = traced(0);
    assert!(
        first.iter().any(|c| c.contains("fsync(")) && first.iter().any(|c| c.contains("rename")),
        "the first run reserves a block durably: {first:#?}"
    );
    for n in 1..4 {
        let calls = traced(n);
        let durable: Vec<_> = calls.iter().filter(|c| !c.contains("execve(")).collect();
        assert!(durable.is_empty(), "run {n}: {durable:#?}");
    }
}

/// A file system of its own on a loop device (root only), unmounted and detached when dropped.
struct LoopFs {
    image: PathBuf,
    device: String,
    mount: PathBuf,
}

impl LoopFs {
    fn mount(image: &Path, mount: &Path) -> LoopFs {
        let device = checked(
            "losetup",
            ["-f".as_ref(), "--show".as_ref(), image.as_os_str()],
        );
        std::fs::create_dir_all(mount).unwrap();
        // Journal commits only when something syncs: what the runs did not sync stays in memory.
        let options = ["-o", "commit=300", device.trim()];
        checked(
            "mount",
            options
                .iter()
                .map(|o| o.as_ref())
                .chain([mount.as_os_str()]),
        );
        LoopFs {
            image: image.to_owned(),
            device: device.trim().to_owned(),
            mount: mount.to_owned(),
        }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// Runs `program ARGS...` to success, under the hard timeout; its stdout.
fn checked<S: AsRef<std::ffi::OsStr>>(program: &str, args: impl IntoIterator<Item = S>) -> String {
    let mut cmd = Command::new(program);
    cmd.args(args);
    let out = run(cmd);
    assert!(out.status.success(), "{program}: {out:?}");
    out.stdout
}

/// The counter file's extended attribute, as text (none when it has none).
fn attribute(counter: &Path) -> Option<String> {
    let path = std::ffi::CString::new(path_str(counter)).unwrap();
    let mut buf = [0u8; 128];
    // SAFETY: the path and name are NUL-terminated; the buffer is live and as long as said.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"user.locked-run".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    String::from_utf8(buf[..usize::try_from(n).ok()?].to_vec()).ok()
}

/// The count of tokens issued that the counter file's extended attribute says (its fourth word:
/// BOOT MOUNT TOP LAST, then the file it was set on).
fn counted(counter: &Path) -> Option<u64> {
    attribute(counter)?.split(' ').nth(3)?.parse().ok()
}

#[test]
fn after_a_power_cut_the_next_run_goes_above_every_fence_issued_before_it() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["losetup", "mkfs.ext4", "mount"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if skip_unless(
        root && tools && Path::new("/dev/loop-control").exists(),
        "needs root and loop devices",
    ) {
        return;
    }
    let scratch = scratch();
    let image = scratch.path().join("disk.img");
    checked(
        "truncate",
        ["-s".as_ref(), "64M".as_ref(), image.as_os_str()],
    );
    checked(
        "mkfs.ext4",
        ["-q".as_ref(), "-F".as_ref(), image.as_os_str()],
    );
    let disk = LoopFs::mount(&image, &scratch.path().join("disk"));
    let locks = disk.mount.join("locks");
    let url = file_url(&locks);
    // Three runs, then everything synced (the count included), then five runs more whose
    // count is in memory only.
    let first = fence_of_a_run(&url);
    for want in 1..3 {
        assert_eq!(fence_of_a_run(&url), first + want);
    }
    checked("sync", ["-f".as_ref(), locks.as_os_str()]);
    let mut highest = 0;
    for _ in 0..5 {
        highest = fence_of_a_run(&url);
    }
    assert_eq!(highest, first + 7);

    // The power cut: what the device holds now, mounted again (the journal replayed).
    let copy = scratch.path().join("after-the-cut.img");
    checked("cp", [image.as_os_str(), copy.as_os_str()]);
    let after = LoopFs::mount(&copy, &scratch.path().join("after"));
    let locks_after = after.mount.join("locks");
    // What the test is for: the device counts fewer tokens than were issued (the count in
    // memory is lost), yet the next run goes above them all.
    let count = counted(&locks_after.join("job.fence"));
    assert!(
        count.is_none_or(|c| c < highest),
        "the device counts {count:?}: the count in memory reached it before the cut"
    );
    let fence = fence_of_a_run(&file_url(&locks_after));
    assert!(
        fence > highest,
        "{fence} after {highest}, issued before the cut"
    );
    assert_eq!(fence_of_a_run(&file_url(&locks_after)), fence + 1);
    drop(after);
    drop(disk);
}

/// The count in the counter's attribute forgotten, as after a reboot (or read through another
/// mount of the directory): `status` says the fence the holder was given, and once it is free
/// the last fence a run recorded, not the top of the block no token has reached.
#[test]
fn status_tells_the_fence_issued_not_the_blocks_top_once_the_count_is_forgotten() {
    let dir = scratch();
    let url = format!("file://{}", dir.path().display());
    let fence_file = dir.path().join("job.fence");
    let first = fence_of_a_run(&url);
    forget_the_count(&fence_file);
    let holder = Holder::start_on(&url, "job", &[]);
    let given = holder.fence();
    assert!(
        given > first,
        "a new block after the count was forgotten: {given}"
    );
    forget_the_count(&fence_file);
    let top: u64 = std::fs::read_to_string(&fence_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        top > given,
        "the block's top {top} is above the fence {given}"
    );
    let held = lr().args(["status", "--json", "-u", &url, "job"]).run();
    assert_eq!(held.json()["fence"], given, "{held:?}");
    let text = lr().args(["status", "-u", &url, "job"]).run();
    assert!(text.stdout.contains(&format!("fence {given}")), "{text:?}");
    holder.finish().expect(0);
    forget_the_count(&fence_file);
    let free = lr().args(["status", "--json", "-u", &url, "job"]).run();
    assert_eq!(free.json()["fence"], given, "{free:?}");
}

/// Removes the counter's attribute, as a reboot makes it untrusted.
fn forget_the_count(fence_file: &Path) {
    let path = std::ffi::CString::new(fence_file.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and attribute name.
    unsafe { libc::removexattr(path.as_ptr(), c"user.locked-run".as_ptr()) };
}

/// `cp -a FROM TO`, to success.
fn cp_a(from: &Path, to: &Path) {
    checked("cp", ["-a".as_ref(), from.as_os_str(), to.as_os_str()]);
}

/// Restores the copy `backup` of `locks` with `cp -a`: `in_place`, the files' contents and
/// attributes written back over the same inodes; else the directory removed and the copy put
/// in its place.
fn restore(backup: &Path, locks: &Path, in_place: bool) {
    if in_place {
        let command = format!("cp -a {}/. {}/", path_str(backup), path_str(locks));
        checked("sh", ["-c", command.as_str()]);
    } else {
        std::fs::remove_dir_all(locks).unwrap();
        cp_a(backup, locks);
    }
}

/// Issue 43: a directory backed up with `cp -a` after fences 1-3, five runs more, then the
/// copy restored in the same boot and mount: the count in the counter's attribute came back
/// with it (the counter itself reads 1024 throughout), and the next runs got 4, 5, 6 again.
/// Restored in place (`cp -a` over the files: the same inodes) or anew (the directory removed
/// first), the next run now goes past every fence issued.
#[test]
fn a_directory_restored_from_a_copy_never_gives_a_fence_again() {
    let scratch = scratch();
    let locks = scratch.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let url = file_url(&locks);
    let first = fence_of_a_run(&url);
    for want in 1..3 {
        assert_eq!(fence_of_a_run(&url), first + want);
    }
    if counted(&locks.join("job.fence")) != Some(first + 2) {
        println!("SKIPPED: no user extended attributes here, so no count to restore");
        return;
    }
    for (i, in_place) in [true, false].into_iter().enumerate() {
        let backup = scratch.path().join(format!("backup-{i}"));
        cp_a(&locks, &backup);
        let before = counted(&backup.join("job.fence"));
        let mut highest = 0;
        for _ in 0..5 {
            highest = fence_of_a_run(&url);
        }
        restore(&backup, &locks, in_place);
        assert_eq!(
            counted(&locks.join("job.fence")),
            before,
            "the count came back"
        );
        let fence = fence_of_a_run(&url);
        assert!(
            fence > highest,
            "{fence} after {highest}, restored {}",
            if in_place { "in place" } else { "anew" }
        );
        assert_eq!(fence_of_a_run(&url), fence + 1, "counted in the new block");
    }
}

/// Issue 43: the count edited by hand (the fifth set back to the first) gave the second, third
/// and fourth again.
#[test]
fn a_count_edited_by_hand_never_gives_a_fence_again() {
    let locks = scratch();
    let url = file_url(locks.path());
    let first = fence_of_a_run(&url);
    for want in 1..5 {
        assert_eq!(fence_of_a_run(&url), first + want);
    }
    let counter = locks.path().join("job.fence");
    if counted(&counter) != Some(first + 4) {
        println!("SKIPPED: no user extended attributes here");
        return;
    }
    let text = attribute(&counter).unwrap();
    let mut words: Vec<&str> = text.split(' ').collect();
    let set_back = first.to_string();
    words[3] = &set_back;
    let edited = words.join(" ");
    let path = std::ffi::CString::new(path_str(&counter)).unwrap();
    // SAFETY: NUL-terminated path and name; the value is live and as long as said.
    let rc = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"user.locked-run".as_ptr(),
            edited.as_ptr().cast(),
            edited.len(),
            0,
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(counted(&counter), Some(first));
    let fence = fence_of_a_run(&url);
    assert!(fence > first + 4, "{fence} after {}", first + 4);
}

/// Issue 43: a counter set back by hand, or removed, is behind the history; `doctor --name`
/// says so, and the next run's fence goes past the largest the history shows.
#[test]
fn a_counter_set_back_goes_past_the_history_and_doctor_says_so() {
    let locks = scratch();
    let url = file_url(locks.path());
    let first = fence_of_a_run(&url);
    for want in 1..3 {
        assert_eq!(fence_of_a_run(&url), first + want);
    }
    let third = first + 2;
    let counter = locks.path().join("job.fence");
    let set_back = locks.path().join("set-back");
    std::fs::write(&set_back, "1\n").unwrap();
    std::fs::rename(&set_back, &counter).unwrap();
    let doctor = lr().args(["doctor", "-u", &url, "--name", "job"]).run();
    let said = format!("is below fence {third} of lock job's history (counter: 1)");
    assert!(
        doctor
            .stdout
            .lines()
            .any(|l| l.starts_with("WARN") && l.contains(&said)),
        "{doctor:?}"
    );
    let fourth = fence_of_a_run(&url);
    assert!(fourth > third, "past the history's, not the counter's 1");
    std::fs::remove_file(&counter).unwrap();
    assert!(
        fence_of_a_run(&url) > fourth,
        "past the history's, without a counter"
    );
    let doctor = lr().args(["doctor", "-u", &url, "--name", "job"]).run();
    assert!(!doctor.stdout.contains("is below fence"), "{doctor:?}");
}

/// Issue 43's review: a copy restored after a block was reserved since it was made (one reboot
/// between the backup and the restore, or an earlier restore of the same copy) gave that
/// block's tokens again: the counter and the history come back with the directory, so neither
/// can tell. A new block starts at the wall clock in microseconds, which a restore does not
/// take back: the same copy restored twice, anew and in place, never gives a fence again.
#[test]
fn a_copy_restored_after_a_block_was_reserved_since_never_gives_a_fence_again() {
    let scratch = scratch();
    let locks = scratch.path().join("locks");
    std::fs::create_dir(&locks).unwrap();
    let url = file_url(&locks);
    let mut issued: Vec<u64> = (0..3).map(|_| fence_of_a_run(&url)).collect();
    let backup = scratch.path().join("backup");
    cp_a(&locks, &backup);
    // As a reboot does: the count is not believed, and the next run reserves a block.
    forget_the_count(&locks.join("job.fence"));
    issued.extend((0..3).map(|_| fence_of_a_run(&url)));
    for in_place in [false, true, false] {
        restore(&backup, &locks, in_place);
        for _ in 0..3 {
            let highest = *issued.iter().max().unwrap();
            let fence = fence_of_a_run(&url);
            assert!(
                fence > highest,
                "{fence} after {highest}, the copy restored (in place: {in_place}): {issued:?}"
            );
            issued.push(fence);
        }
    }
}

/// A history record is any user's to write: one whose fence is past `i64::MAX` (the fence of
/// no store) is no record, and moves no fence; the fence never goes past `i64::MAX`, where the
/// counter says it is at its maximum (69); one far above the counter and the clock, though
/// below that, lifts the next fence, and `doctor --name` says so first.
#[test]
fn a_history_record_never_takes_the_fence_past_i64_max_and_doctor_names_one_far_ahead() {
    const MAX: u64 = i64::MAX as u64;
    let locks = scratch();
    let url = file_url(locks.path());
    let first = fence_of_a_run(&url);
    let record = |fence: u64| {
        format!(
            "{{\"host\":\"h\",\"pid\":1,\"user\":\"u\",\"fence\":{fence},\"mode\":\"exclusive\",\
             \"started_at\":\"2026-01-01T00:00:00.000Z\",\"ended_at\":\"2026-01-01T00:00:01.000Z\",\
             \"waited_ms\":0,\"status\":0,\"ended\":\"exit\",\"token\":\"t{fence}\"}}\n"
        )
    };
    let append = |text: &str| {
        use std::io::Write;
        let mut history = std::fs::OpenOptions::new()
            .append(true)
            .open(locks.path().join("job.history"))
            .unwrap();
        history.write_all(text.as_bytes()).unwrap();
    };
    // Issue 43's review: one line of 2^64 - 2 gave the next run 2^64 - 1, then 69 for ever.
    append(&record(u64::MAX - 1));
    let next = fence_of_a_run(&url);
    assert_eq!(next, first + 1, "the record moved the fence");
    let out = lr().args(["history", "-u", &url, "job"]).run().expect(0);
    assert!(
        out.stderr.contains("skipped 1 unreadable record"),
        "{out:?}"
    );

    // A record far ahead but within range: doctor says so, and the next run goes past it.
    append(&record(MAX - 3));
    let doctor = lr().args(["doctor", "-u", &url, "--name", "job"]).run();
    assert!(
        doctor.stdout.lines().any(|l| l.starts_with("WARN")
            && l.contains(&format!(
                "fence {} in lock job's history is far above its counter",
                MAX - 3
            ))),
        "{doctor:?}"
    );
    assert_eq!(fence_of_a_run(&url), MAX - 2);
    assert_eq!(fence_of_a_run(&url), MAX - 1);
    assert_eq!(fence_of_a_run(&url), MAX);
    let out = lr().url(&url).job(["true"]).run();
    out.expect_one_line(69, &format!("job.fence is at its maximum ({MAX})"));
}
