//! The directory of a `file://` URL and the files of a NAME in it, opened safely: never through
//! a link, never blocking on a FIFO, never a file with another name, never one that another
//! user could swap (see `trust`); the errors they give, with what to do.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::trust;
use crate::backend::BackendError;
use crate::name::LockName;
use crate::plumbing::exit::Failure;

/// The mode every file of a lock is created with (less the umask): its owner's and its group's
/// to write, as a team's 2770 directory needs, and never the world's, whatever the umask: a
/// fence counter another user could write is a fence they could set back.
pub const FILE_MODE: u32 = 0o664;

/// The directory a `file:` URL names: `file:///abs/dir` (or `file://localhost/abs/dir`),
/// percent-decoded.
pub fn dir_of(url: &str) -> Result<PathBuf, String> {
    let bad = |why: &str| {
        crate::text::message!(
            "{url:?} is not a usable file:// URL: {why} (write file:///absolute/dir)"
        )
    };
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(bad("it has a ?query or #fragment"));
    }
    if parsed.path() == "/" {
        return Err(bad("it names the root directory"));
    }
    // to_file_path refuses any host but localhost: a lock on another host's disk is no lock.
    parsed
        .to_file_path()
        .map_err(|()| bad("the host must be empty (file:///dir) or localhost"))
}

/// The files of one NAME in one directory.
#[derive(Clone, Debug)]
pub struct Paths {
    pub dir: PathBuf,
    /// The stem of every file of this NAME ([`super::stem::of`]).
    pub stem: String,
    pub lock: PathBuf,
    pub fence: PathBuf,
}

impl Paths {
    pub fn new(dir: &Path, name: &LockName) -> Paths {
        let stem = super::stem::of(name);
        Paths {
            dir: dir.to_owned(),
            lock: dir.join(format!("{stem}.lock")),
            fence: dir.join(format!("{stem}.fence")),
            stem,
        }
    }

    /// A temporary file's name for what is then renamed over `STEM.WHAT`, new for each use:
    /// a fixed name could be taken by another user in a sticky directory (a link planted
    /// there, which only its owner may remove), and with it every write of the NAME.
    pub fn temporary(&self, what: &str) -> PathBuf {
        let unique = crate::backend::new_token();
        self.dir.join(format!(".{}.{what}.{unique}.tmp", self.stem))
    }

    /// The file of the shared holder whose token is `token` (`--shared`): `STEM.shared.TOKEN`.
    pub fn member(&self, token: &str) -> PathBuf {
        self.dir.join(format!("{}.shared.{token}", self.stem))
    }

    /// The token a shared holder's file is named after, if `file_name` is one of this NAME's:
    /// `STEM.shared.` and a UUID, nothing more. No other NAME's file has such a name: every
    /// file of a NAME ends in `.lock`, `.lock.N` or `.fence`, or starts with a dot, and two
    /// stems followed by `.shared.` and a UUID of fixed length differ where the stems do.
    pub fn member_token<'a>(&self, file_name: &'a str) -> Option<&'a str> {
        let token = file_name
            .strip_prefix(self.stem.as_str())?
            .strip_prefix(".shared.")?;
        (token.len() == 36 && uuid::Uuid::try_parse(token).is_ok()).then_some(token)
    }

    /// Slot `i` of a semaphore (`--holders N`): `STEM.lock.i`, created in order from 0, so
    /// the slots that ever existed are the ones up to the first missing.
    pub fn slot(&self, i: u32) -> PathBuf {
        let mut name = self.lock.clone().into_os_string();
        name.push(format!(".{i}"));
        PathBuf::from(name)
    }
}

/// The directory exists, or is created (0755) when its parent does.
pub fn prepare_dir(dir: &Path) -> Result<(), Failure> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Failure::usage(format!(
            "{} is not a directory: file:// names the directory that holds the locks",
            dir.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = dir.parent().unwrap_or(Path::new("/"));
            if !parent.is_dir() {
                return Err(Failure::usage(format!(
                    "{} does not exist, nor does its parent {}: create it, or fix the file:// URL",
                    dir.display(),
                    parent.display()
                )));
            }
            match DirBuilder::new().mode(0o755).create(dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(unreached(refused(dir, "create the directory", &e))),
            }
        }
        Err(e) => Err(unreached(refused(dir, "reach", &e))),
    }
}

/// A directory that could not be had, before anything was asked of it: as every backend's
/// first contact that failed, the line says that nothing was run and nothing was taken.
fn unreached(refused: BackendError) -> Failure {
    Failure::unavailable(format!("{refused}; nothing was run and nothing was taken"))
}

/// Opens (creating it) the lock file, refusing links and anything but a regular file.
pub fn open_lock_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    plain_file(path, file)
}

/// Opens a file of ours that exists, refusing links and anything but a regular file, without
/// blocking (a FIFO planted under its name would otherwise hang the open, the lock held).
pub fn open_existing(path: &Path, write: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    plain_file(path, file)
}

/// Creates a file of a run's own: a new one (`O_EXCL`, so never a link planted under its
/// name), readable by the lock's other users; one left under the same name is removed and
/// the file made again (the callers say why only a dead run can have left it).
pub fn create_afresh(path: &Path) -> io::Result<File> {
    let create = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
    };
    let file = match create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_file(path)?;
            create()?
        }
        made => made?,
    };
    plain_file(path, file)
}

/// `file` (opened at `path`), if it is a regular file with no other name, and one its owner
/// cannot swap out from under a run ([`trust::check`]): a hard link planted under a lock
/// file's name would have the holder's metadata written into (and truncated from) the file
/// it links to.
pub fn plain_file(path: &Path, file: File) -> io::Result<File> {
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.nlink() > 1 {
        return Err(io::Error::other(
            "it has other names (hard links), planted by someone else? remove it",
        ));
    }
    trust::check(path, &meta)?;
    Ok(file)
}

pub fn refused(path: &Path, what: &str, e: &io::Error) -> BackendError {
    if let Some(foreign) = e.get_ref().and_then(|e| e.downcast_ref::<trust::Foreign>()) {
        return trust::refusal(path, foreign.uid);
    }
    let denied = matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM));
    // In a sticky directory the kernel may refuse the open itself (another user's link, or
    // file with fs.protected_regular): the same line as when it lets the open through.
    let link = denied && fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    if denied && !link {
        if let Some(uid) = trust::foreign_at(path) {
            return trust::refusal(path, uid);
        }
    }
    let hint = match e.raw_os_error() {
        _ if link => {
            "; it is a symbolic link, which locked-run never follows there (planted by someone else?): remove it"
        }
        Some(libc::ELOOP) => {
            "; it is a symbolic link, which locked-run never follows there (planted by someone else?): remove it"
        }
        Some(libc::EACCES | libc::EPERM) if in_sticky_dir(path) => {
            "; the directory is sticky (as /tmp is): only the user who created a file there may \
             replace it (or, with fs.protected_regular, open it), so its locks serve one user: \
             give the lock's users a directory of their group instead (mode 2770)"
        }
        Some(libc::EACCES | libc::EPERM) => {
            "; every user of this lock needs write access to the directory and its files"
        }
        Some(libc::EROFS) => "; the filesystem is read-only",
        Some(libc::EBADF) => {
            "; this filesystem (NFS?) locks only files open for writing: keep file:// locks on a local filesystem"
        }
        Some(libc::ENOSPC | libc::EDQUOT) => "; the filesystem is full",
        _ => "",
    };
    BackendError::Refused(format!("cannot {what} {}: {e}{hint}", path.display()))
}

/// Removes what a run killed mid-write left in `dir`: files named `PREFIX<token>SUFFIX` (a
/// token of 36 characters, as [`crate::backend::new_token`] makes them) that are regular
/// files of this user, changed more than a minute ago (a live run's is seconds old at most).
/// Nothing else is touched, and nothing that fails is said: the next run tries again.
pub fn remove_stale(dir: &Path, prefix: &str, suffix: &str) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(token) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix)?.strip_suffix(suffix))
        else {
            continue;
        };
        let ours = entry.metadata().is_ok_and(|m| {
            m.file_type().is_file() && m.uid() == euid && m.modified().is_ok_and(|t| t < old)
        });
        if token.len() == 36 && ours {
            let _ = fs::remove_file(entry.path());
        }
    }
}

pub fn in_sticky_dir(path: &Path) -> bool {
    path.parent()
        .and_then(|dir| dir.metadata().ok())
        .is_some_and(|m| m.mode() & 0o1000 != 0)
}

/// `flock(2)`, restarted when a signal interrupts it.
pub fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor that `file` keeps open; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_an_absolute_local_directory() {
        assert_eq!(
            dir_of("file:///var/lock/jobs"),
            Ok(PathBuf::from("/var/lock/jobs"))
        );
        assert_eq!(
            dir_of("file://localhost/srv/locks"),
            Ok(PathBuf::from("/srv/locks"))
        );
        assert_eq!(
            dir_of("file:///tmp/with%20space"),
            Ok(PathBuf::from("/tmp/with space"))
        );
        assert!(
            dir_of("file://otherhost/srv")
                .unwrap_err()
                .contains("localhost")
        );
        assert!(dir_of("file:///").unwrap_err().contains("root"));
        assert!(dir_of("file:///x?y=1").unwrap_err().contains("query"));
    }
}
