//! Who may own the files a `file://` lock stands on. In a sticky directory that other users can
//! write (`/tmp`, `/var/lock`), the sticky bit lets a file's owner rename or delete it, and no
//! one else but root and the directory's owner: a lock file owned by another user could be
//! renamed away while a run holds it and replaced by a fresh one, which a second run then locks
//! beside the first (a fence counter so replaced would hand out old tokens again). There, the
//! lock's files must belong to the running user or to root, whatever the kernel's
//! `fs.protected_regular` says. A directory of one group (mode 2770, no sticky bit) has no such
//! rule: there every member may replace any file, and every member is trusted alike.
//!
//! The owner is read from the opened descriptor (`fstat`, which [`super::files::plain_file`]
//! does anyway), so the file judged is the file used: a check by path could be raced.

use std::ffi::CStr;
use std::fmt;
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::OnceLock;

use crate::backend::BackendError;

/// The error an open gives for a file another user could swap (see the module's notes): carried
/// inside an `io::Error`, so that every open of the backend refuses it the same way, and turned
/// into its own line by [`super::files::refused`].
#[derive(Debug)]
pub struct Foreign {
    pub uid: u32,
}

impl fmt::Display for Foreign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "it belongs to {}, who may replace it in this sticky directory",
            owner(self.uid)
        )
    }
}

impl std::error::Error for Foreign {}

/// `Err(Foreign)` when the file `meta` describes, at `path`, belongs to someone who could swap
/// it out from under a run: neither this user nor root, in a sticky directory that others can
/// write. The directory is looked at only for such a file, so the usual open costs nothing.
pub fn check(path: &Path, meta: &Metadata) -> io::Result<()> {
    let uid = meta.uid();
    if uid == 0 || uid == euid() || !owners_may_swap(path) {
        return Ok(());
    }
    Err(io::Error::other(Foreign { uid }))
}

/// The owner of the file at `path`, when it is someone who could swap it (see [`check`]): what
/// an open refused by the kernel itself (`fs.protected_regular`) is explained with.
pub fn foreign_at(path: &Path) -> Option<u32> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    check(path, &meta).err().map(|_| meta.uid())
}

/// The line that refuses a file another user could swap.
pub fn refusal(path: &Path, uid: u32) -> BackendError {
    let dir = path.parent().unwrap_or(Path::new("/"));
    BackendError::Refused(crate::text::message!(
        "{} belongs to {}, not to this user or root, and {} is a sticky directory that other \
         users can write: its owner could rename it away while a run holds the lock and put \
         another in its place, letting a second run in; remove it (as root or its owner), or \
         keep the locks in a directory of one group (mode 2770, no sticky bit: see the guide)",
        path.display(),
        owner(uid),
        dir.display()
    ))
}

/// Whether `path`'s directory lets other users create files while its sticky bit lets each
/// file's owner rename its own: the place where only this user's and root's files are safe.
pub fn owners_may_swap(path: &Path) -> bool {
    path.parent()
        .and_then(|dir| dir.metadata().ok())
        .is_some_and(|m| m.mode() & 0o1000 != 0 && m.mode() & 0o022 != 0)
}

/// The owner of a directory or file, `user NAME (uid N)`, if it is neither this user nor root:
/// one who can rename or replace every file in a directory of theirs, whatever its mode.
pub fn other_owner(uid: u32) -> Option<String> {
    (uid != euid() && uid != 0).then(|| owner(uid))
}

/// `user NAME (uid N)`, or `uid N` for a uid with no name on this host.
fn owner(uid: u32) -> String {
    match user_name(uid) {
        Some(name) => format!("user {name} (uid {uid})"),
        None => format!("uid {uid}"),
    }
}

fn euid() -> u32 {
    static EUID: OnceLock<u32> = OnceLock::new();
    // SAFETY: geteuid has no preconditions and cannot fail.
    *EUID.get_or_init(|| unsafe { libc::geteuid() })
}

/// The name of user `uid`, through the C library (so NSS sources count, as `ls -l` shows it).
fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: an all-zero passwd is a valid value (null pointers, zero ids); it is only read
    // after getpwuid_r filled it.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to live memory of the size given; the strings getpwuid_r
    // writes live in `buf`, which outlives their use below.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: pw_name points to a NUL-terminated string in `buf`, still alive.
    let name = unsafe { CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn users_are_named_when_the_host_knows_them() {
        assert_eq!(owner(0), "user root (uid 0)");
        assert_eq!(owner(4_000_000_000), "uid 4000000000");
    }

    /// Whether the kernel lets the open through (`fs.protected_regular` = 0) or refuses it
    /// (1, 2), the line is the same.
    #[test]
    fn another_users_file_in_a_sticky_directory_is_refused_with_its_owner() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let file = dir.path().join("job.lock");
        std::fs::write(&file, "").unwrap();
        std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
        let opened = crate::file::files::open_lock_file(&file).unwrap_err();
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        for e in [opened, denied] {
            let line = crate::file::files::refused(&file, "open", &e).to_string();
            let owner = format!("{} belongs to user nobody (uid 65534)", file.display());
            assert!(line.starts_with(&owner), "{line}");
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o2770)).unwrap();
        assert!(
            crate::file::files::open_lock_file(&file).is_ok(),
            "a group's directory"
        );
    }

    #[test]
    fn only_a_sticky_directory_that_others_write_lets_owners_swap_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("job.lock");
        for (mode, swap) in [
            (0o1777, true),
            (0o1770, true),
            (0o2770, false),
            (0o0777, false),
            (0o1755, false),
        ] {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(owners_may_swap(&file), swap, "{mode:o}");
        }
    }
}
