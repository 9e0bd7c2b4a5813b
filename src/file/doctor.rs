//! `doctor` for `file://`: the directory can be used, and its filesystem suits locks.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::trust::other_owner;
use crate::backend::{Check, Level};
use crate::file;
use crate::name::LockName;

/// The host-local backend: the directory can be used, and its filesystem suits locks.
pub fn check_dir(url: &str, dir: &Path, name: &LockName) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut add = |check: &'static str, level: Level, detail: String| {
        checks.push(Check {
            server: url.to_owned(),
            check,
            level,
            detail,
        })
    };
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let existing = if dir.is_dir() {
        add("directory", Level::Ok, format!("{} exists", dir.display()));
        dir
    } else if dir.exists() {
        add(
            "directory",
            Level::Fail,
            format!("{} is not a directory", dir.display()),
        );
        return checks;
    } else if parent.is_dir() {
        add(
            "directory",
            Level::Ok,
            format!(
                "{} does not exist yet: the first run creates it (0755)",
                dir.display()
            ),
        );
        parent
    } else {
        add(
            "directory",
            Level::Fail,
            format!(
                "neither {} nor its parent exist: create it, or fix the URL",
                dir.display()
            ),
        );
        return checks;
    };
    match nix::unistd::access(
        existing,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    ) {
        Ok(()) => add(
            "writable",
            Level::Ok,
            format!("{} is writable by this user", existing.display()),
        ),
        Err(e) => add(
            "writable",
            Level::Fail,
            format!(
                "{} is not writable by this user ({e}): every user of a lock needs to create and write its files there",
                existing.display()
            ),
        ),
    }
    match nix::sys::statfs::statfs(existing) {
        Ok(fs) => {
            // The magic number's C type differs between targets.
            #[allow(clippy::unnecessary_cast)]
            let (level, detail) = filesystem(fs.filesystem_type().0 as i64);
            add("filesystem", level, detail);
        }
        Err(e) => add(
            "filesystem",
            Level::Warn,
            format!("cannot tell the filesystem: {e}"),
        ),
    }
    // The directory's owner may swap any file in it, sticky bit or not.
    let owner = existing.metadata().ok().and_then(|m| other_owner(m.uid()));
    if let Some(owner) = owner.filter(|_| existing == dir) {
        add(
            "owner",
            Level::Warn,
            format!(
                "{} belongs to {owner}, who can rename or replace any lock file in it, also while \
                 a run holds it, and let a second run in: give it to root or to this user (for a \
                 team: root's, of one group, mode 2770)",
                dir.display()
            ),
        );
    }
    // Who else may write there.
    let mode = existing.metadata().map_or(0, |m| m.permissions().mode());
    let (shared, sticky) = (mode & 0o002 != 0, mode & 0o1000 != 0);
    let temporary = ["/tmp", "/var/tmp"].iter().any(|t| dir.starts_with(t));
    if temporary {
        add(
            "location",
            Level::Warn,
            format!(
                "{} is under a temporary directory: systemd-tmpfiles deletes files there that were not \
                 used for days (a fence counter deleted starts again at 1), and another user can create \
                 the directory first; use a directory of its own on disk (/var/lib/locked-run)",
                dir.display()
            ),
        );
    } else if shared && sticky {
        add(
            "location",
            Level::Warn,
            format!(
                "{} is sticky and writable by every user (as /var/lock is): its locks serve one \
                 user and root, as lock files of another user are refused there (their owner \
                 could swap them); for a team, give it to one group (mode 2770, no sticky bit)",
                existing.display()
            ),
        );
    } else if shared {
        add(
            "location",
            Level::Warn,
            format!(
                "{} is writable by every user: anyone can delete or replace its lock files; \
                 give it to the users of the locks (a group, mode 2770)",
                existing.display()
            ),
        );
    } else {
        add(
            "location",
            Level::Ok,
            format!("{} is not writable by every user", existing.display()),
        );
    }
    match file::check_files(dir, name) {
        Ok(detail) => add("files", Level::Ok, detail),
        Err(detail) => add("files", Level::Fail, detail),
    }
    if let Some(detail) = counter_behind(dir, name) {
        add("fence", Level::Warn, detail);
    }
    let open_to_all = file::writable_by_all(dir, name);
    if !open_to_all.is_empty() {
        add(
            "modes",
            Level::Warn,
            format!(
                "{} writable by every user: anyone may set the fence back or rewrite who holds \
                 the lock; chmod o-w (runs now make them 0664 less the umask; these were made \
                 with umask 0, or by another program)",
                open_to_all.join(", ")
            ),
        );
    }
    checks
}

/// What to say when NAME's fence counter is below the largest fence its history shows: a
/// little (the directory restored from a copy, or the counter set back or removed by hand), or
/// far, beyond any fence this host's clock could have given (a record written by hand, which
/// would lift every fence after it: see `fence`).
fn counter_behind(dir: &Path, name: &LockName) -> Option<String> {
    let paths = super::files::Paths::new(dir, name);
    let largest = super::history::largest_fence(&paths).ok().flatten()?;
    let counter = paths.read_fence().ok()?;
    let clock_us = crate::backend::wall_clock_ms().saturating_mul(1000);
    let reach = counter.unwrap_or(0).max(clock_us) + 2 * super::reserve::BLOCK;
    if largest > reach {
        return Some(crate::text::message!(
            "fence {largest} in lock {name}'s history is far above its counter ({}) and above              any fence this host's clock could have given: a record written by hand or by              another program? The next run's fence goes past it; if it is no run's, remove its              line from {} first",
            counter.map_or_else(|| "none".to_owned(), |c| c.to_string()),
            paths.history().display()
        ));
    }
    (counter.unwrap_or(0) < largest).then(|| {
        crate::text::message!(
            "{} is below fence {largest} of lock {name}'s history (counter: {}): was the \
             directory restored from a copy, or the counter set back by hand? The next run's \
             fence goes past {largest} all the same",
            paths.fence.display(),
            counter.map_or_else(|| "none".to_owned(), |c| c.to_string())
        )
    })
}

const NFS: i64 = 0x6969;

/// What a filesystem (by `statfs` magic number) means for flock and fence counters.
fn filesystem(magic: i64) -> (Level, String) {
    const VOLATILE: &[(i64, &str)] = &[(0x0102_1994, "tmpfs"), (0x8584_58f6, "ramfs")];
    const NETWORK: &[(i64, &str)] = &[
        (0x517b, "SMB"),
        (0xff53_4d42, "CIFS"),
        (0xfe53_4d42, "SMB2"),
        (0x6573_5546, "FUSE"),
        (0x00c3_6400, "Ceph"),
        (0x0102_1997, "9p"),
    ];
    if let Some((_, fs)) = VOLATILE.iter().find(|(m, _)| *m == magic) {
        return (
            Level::Warn,
            format!(
                "{fs}: the fence counters are lost at reboot, and fence tokens start again at 1; use a directory on disk (/var/lib/...)"
            ),
        );
    }
    if magic == NFS {
        return (
            Level::Fail,
            "NFS: flock there is emulated with byte-range locks, which lock exclusively only \
             files open for writing, and raising a fence locks the directory: every run would \
             fail (69); keep file:// locks on a local filesystem, and use Redis across hosts"
                .into(),
        );
    }
    if let Some((_, fs)) = NETWORK.iter().find(|(m, _)| *m == magic) {
        return (
            Level::Warn,
            format!(
                "{fs}, a network filesystem: flock there may be local to this host or emulated with leases the server can drop; \
                 for locks across hosts use Redis"
            ),
        );
    }
    (Level::Ok, format!("a local filesystem (type {magic:#x})"))
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Where file:// cannot work at all, doctor fails; where it works with limits, it warns.
    #[test]
    fn filesystems_are_judged_by_what_flock_does_there() {
        assert_eq!(filesystem(NFS).0, Level::Fail);
        assert_eq!(filesystem(0x0102_1994).0, Level::Warn, "tmpfs");
        assert_eq!(filesystem(0xff53_4d42).0, Level::Warn, "CIFS");
        assert_eq!(filesystem(0xef53).0, Level::Ok, "ext4");
    }
}
