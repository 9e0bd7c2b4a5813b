//! The host-local backend, `file:///DIR`: locks on one machine and no server, for teams that
//! start on one host (where they would reach for `flock -n` or `flock -w`). Moving to a fleet
//! later changes only the URL.
//!
//! - Exclusion: `flock(2)` on `DIR/STEM.lock` (the stem is [`LockName::file_stem`]). The kernel
//!   frees it the moment the holding process dies. The descriptor is close-on-exec, so the
//!   command never holds the lock on its own. The file is never unlinked: a waiter that had
//!   opened it would then lock a file that nobody else sees.
//! - Fencing: `DIR/STEM.fence` holds the last token issued, in decimal. It is raised under the
//!   lock and written durably (a temporary file, fsync, rename, fsync of the directory) before
//!   the command starts, so no token is issued twice, even when a holder is SIGKILLed.
//! - Holder metadata, for `status` and a waiter's messages: `key=value` lines in the lock file,
//!   written under the lock, emptied on release.
//! - `--min-hold`: a not-before deadline left in the lock file on release; the next holder
//!   honours it by waiting (or by 75 with `-n`).
//! - Waiting: a thread blocks in `flock(LOCK_EX)` on the waiter's own descriptor, so the kernel
//!   wakes it the moment the holder lets go. No polling.
//!
//! There is no lease: nothing to renew, and the lease clock never fires.

use std::cell::RefCell;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::{
    Attempt, Backend, BackendError, Busy, Expiry, Holder, Wakeups, wall_clock_ms,
};
use crate::exit::Failure;
use crate::lease::{BootClock, Clock};
use crate::lock::Report;
use crate::name::LockName;

/// Whether `url` names the host-local backend.
pub fn is_file_url(url: &str) -> bool {
    url.get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("file:"))
}

/// The directory a `file:` URL names: `file:///abs/dir` (or `file://localhost/abs/dir`),
/// percent-decoded.
pub fn dir_of(url: &str) -> Result<PathBuf, String> {
    let bad = |why: &str| {
        format!("{url:?} is not a usable file:// URL: {why} (write file:///absolute/dir)")
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
struct Paths {
    dir: PathBuf,
    lock: PathBuf,
    fence: PathBuf,
    fence_tmp: PathBuf,
}

impl Paths {
    fn new(dir: &Path, name: &LockName) -> Paths {
        let stem = name.file_stem();
        Paths {
            dir: dir.to_owned(),
            lock: dir.join(format!("{stem}.lock")),
            fence: dir.join(format!("{stem}.fence")),
            fence_tmp: dir.join(format!(".{stem}.fence.tmp")),
        }
    }

    /// The last fence token issued, if any.
    fn read_fence(&self) -> Result<Option<u64>, BackendError> {
        match fs::read_to_string(&self.fence) {
            Ok(text) => text.trim().parse().map(Some).map_err(|_| {
                BackendError::Refused(format!(
                    "{} holds {:?}, not a fence counter: it was changed by hand? Write the \
                     largest token ever issued into it (or remove it to restart at 1)",
                    self.fence.display(),
                    text.chars().take(40).collect::<String>()
                ))
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(refused(&self.fence, "read", &e)),
        }
    }

    /// Raises the fence counter by one, durably: a temporary file, fsync, rename over the
    /// counter, fsync of the directory. Called only under the lock.
    fn raise_fence(&self) -> Result<u64, BackendError> {
        let next = self
            .read_fence()?
            .unwrap_or(0)
            .checked_add(1)
            .ok_or_else(|| {
                BackendError::Refused(format!("{} is at its maximum", self.fence.display()))
            })?;
        let write = || -> io::Result<()> {
            let mut tmp = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o666)
                .open(&self.fence_tmp)?;
            tmp.write_all(format!("{next}\n").as_bytes())?;
            tmp.sync_all()?;
            fs::rename(&self.fence_tmp, &self.fence)?;
            File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| refused(&self.fence, "write", &e))?;
        Ok(next)
    }
}

fn refused(path: &Path, what: &str, e: &io::Error) -> BackendError {
    let hint = match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => {
            "; every user of this lock needs write access to the directory and its files"
        }
        Some(libc::EROFS) => "; the filesystem is read-only",
        Some(libc::ENOSPC | libc::EDQUOT) => "; the filesystem is full",
        _ => "",
    };
    BackendError::Refused(format!("cannot {what} {}: {e}{hint}", path.display()))
}

/// `flock(2)`, restarted when a signal interrupts it.
fn flock(file: &File, operation: libc::c_int) -> io::Result<()> {
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

/// A `--min-hold` deadline, on `CLOCK_BOOTTIME` of one boot, with the wall clock as the
/// fallback across a reboot.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NotBefore {
    boot_id: String,
    boot_ms: u64,
    wall_ms: u64,
}

impl NotBefore {
    fn after(hold: Duration) -> NotBefore {
        let hold_ms = hold.as_millis() as u64;
        NotBefore {
            boot_id: boot_id(),
            boot_ms: BootClock.now().as_millis() as u64 + hold_ms,
            wall_ms: wall_clock_ms() + hold_ms,
        }
    }

    /// How long until the deadline, if it is still ahead.
    fn left(&self) -> Option<Duration> {
        let left = if !self.boot_id.is_empty() && self.boot_id == boot_id() {
            self.boot_ms.checked_sub(BootClock.now().as_millis() as u64)
        } else {
            self.wall_ms.checked_sub(wall_clock_ms())
        };
        left.filter(|&ms| ms > 0).map(Duration::from_millis)
    }
}

/// This boot's id: `CLOCK_BOOTTIME` readings compare only within one boot.
fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// What the lock file says: `key=value` lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Meta {
    holder: Holder,
    token: Option<String>,
    not_before: Option<NotBefore>,
}

impl Meta {
    fn read(file: &File) -> Meta {
        let mut bytes = vec![0; 4096];
        let n = file.read_at(&mut bytes, 0).unwrap_or(0);
        Meta::parse(&String::from_utf8_lossy(&bytes[..n]))
    }

    fn parse(text: &str) -> Meta {
        let mut meta = Meta::default();
        for (key, value) in text.lines().filter_map(|l| l.split_once('=')) {
            match key {
                "host" => meta.holder.host = Some(value.to_owned()),
                "pid" => meta.holder.pid = value.parse().ok(),
                "command" => meta.holder.command = Some(value.to_owned()),
                "since_ms" => meta.holder.since_ms = value.parse().ok(),
                "fence" => meta.holder.fence = value.parse().ok(),
                "token" => meta.token = Some(value.to_owned()),
                "not_before" => {
                    let mut words = value.split(' ');
                    if let (Some(id), Some(Ok(boot_ms)), Some(Ok(wall_ms))) = (
                        words.next(),
                        words.next().map(str::parse),
                        words.next().map(str::parse),
                    ) {
                        meta.not_before = Some(NotBefore {
                            boot_id: id.to_owned(),
                            boot_ms,
                            wall_ms,
                        });
                    }
                }
                _ => {}
            }
        }
        meta
    }

    fn to_text(&self) -> String {
        // One line per field: a newline inside a value would start a forged field.
        let clean = |s: &str| s.replace(|c: char| c.is_control(), "?");
        let mut text = String::new();
        let h = &self.holder;
        let mut line = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                text.push_str(&format!("{key}={}\n", clean(&v)));
            }
        };
        line("host", h.host.clone());
        line("pid", h.pid.map(|p| p.to_string()));
        line("command", h.command.clone());
        line("since_ms", h.since_ms.map(|t| t.to_string()));
        line("fence", h.fence.map(|f| f.to_string()));
        line("token", self.token.clone());
        line(
            "not_before",
            self.not_before
                .as_ref()
                .map(|n| format!("{} {} {}", n.boot_id, n.boot_ms, n.wall_ms)),
        );
        text
    }

    /// Replaces the lock file's content (under the lock).
    fn write(&self, file: &File) -> io::Result<()> {
        let text = self.to_text();
        file.write_all_at(text.as_bytes(), 0)?;
        file.set_len(text.len() as u64)
    }
}

/// A lock on one NAME in one directory of this host.
pub struct FileLock {
    name: LockName,
    paths: Paths,
    key: String,
    token: String,
    holder: Holder,
    /// The lock file, opened once: the flock belongs to this open file description, which a
    /// waiting thread shares.
    file: Arc<File>,
    /// What was written into the lock file when it was taken; `None` when not held.
    held: RefCell<Option<Meta>>,
}

impl FileLock {
    /// Opens (creating it, and the directory if its parent exists) the lock file of `name`
    /// in the directory `url` names. A missing parent is a usage error (2); a directory or
    /// file that cannot be written is 69.
    pub fn open(url: &str, name: LockName, command: &str) -> Result<FileLock, Failure> {
        let dir = dir_of(url).map_err(Failure::usage)?;
        prepare_dir(&dir)?;
        let paths = Paths::new(&dir, &name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(&paths.lock)
            .map_err(|e| Failure::unavailable(refused(&paths.lock, "open", &e).to_string()))?;
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "unknown".into());
        Ok(FileLock {
            key: paths.lock.display().to_string(),
            name,
            paths,
            token: uuid::Uuid::new_v4().to_string(),
            holder: Holder {
                host: Some(host),
                pid: Some(std::process::id()),
                command: Some(command.to_owned()),
                since_ms: None,
                fence: None,
            },
            file: Arc::new(file),
            held: RefCell::new(None),
        })
    }

    pub fn name(&self) -> &LockName {
        &self.name
    }

    fn unlock(&self) {
        // Closing the descriptor at exit would unlock too; an error here changes nothing.
        let _ = flock(&self.file, libc::LOCK_UN);
    }

    fn refused(&self, e: BackendError) -> BackendError {
        self.unlock();
        e
    }
}

/// The directory exists, or is created (0755) when its parent does.
fn prepare_dir(dir: &Path) -> Result<(), Failure> {
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
                Err(e) => Err(Failure::unavailable(
                    refused(dir, "create the directory", &e).to_string(),
                )),
            }
        }
        Err(e) => Err(Failure::unavailable(refused(dir, "reach", &e).to_string())),
    }
}

impl Backend for FileLock {
    type Wakeups<'a> = FileWakeups<'a>;

    fn has_lease(&self) -> bool {
        false
    }

    fn key(&self) -> &str {
        &self.key
    }

    fn token(&self) -> &str {
        &self.token
    }

    async fn try_acquire(&self, _listen: bool) -> Result<Attempt, BackendError> {
        if let Some(meta) = &*self.held.borrow() {
            return Ok(Attempt::Acquired {
                fence: meta.holder.fence.unwrap_or(0),
            });
        }
        match flock(&self.file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let meta = Meta::read(&self.file);
                return Ok(Attempt::Busy(Busy {
                    holder: meta.holder,
                    expiry: Expiry::WithHolder,
                }));
            }
            Err(e) => return Err(refused(&self.paths.lock, "lock", &e)),
        }
        // Ours now; a --min-hold deadline left by the last holder still keeps it.
        let last = Meta::read(&self.file);
        if let Some(left) = last.not_before.as_ref().and_then(NotBefore::left) {
            self.unlock();
            return Ok(Attempt::Busy(Busy {
                holder: last.holder,
                expiry: Expiry::In(left),
            }));
        }
        let fence = self.paths.raise_fence().map_err(|e| self.refused(e))?;
        let meta = Meta {
            holder: Holder {
                since_ms: Some(wall_clock_ms()),
                fence: Some(fence),
                ..self.holder.clone()
            },
            token: Some(self.token.clone()),
            not_before: None,
        };
        meta.write(&self.file)
            .map_err(|e| self.refused(refused(&self.paths.lock, "write", &e)))?;
        *self.held.borrow_mut() = Some(meta);
        Ok(Attempt::Acquired { fence })
    }

    async fn renew(&self, _timeout: Duration) -> Result<bool, BackendError> {
        Ok(self.held.borrow().is_some())
    }

    async fn release(
        &self,
        keep_for: Option<Duration>,
        _timeout: Duration,
    ) -> Result<bool, BackendError> {
        let Some(mut meta) = self.held.borrow_mut().take() else {
            // A waiting thread may have been given the lock after all.
            self.unlock();
            return Ok(false);
        };
        let written = match keep_for {
            Some(hold) => {
                meta.not_before = Some(NotBefore::after(hold));
                meta.write(&self.file)
            }
            None => self.file.set_len(0),
        };
        self.unlock();
        written.map_err(|e| refused(&self.paths.lock, "write", &e))?;
        Ok(true)
    }

    async fn subscribe(&self) -> Result<(FileWakeups<'_>, bool), BackendError> {
        // A blocked flock cannot miss a release: it waits for a state, not a message.
        Ok((
            FileWakeups {
                lock: self,
                pending: None,
            },
            true,
        ))
    }
}

/// A thread blocked in `flock(LOCK_EX)` on the lock's own descriptor: when it returns, the
/// kernel has given the lock to this process, and the next attempt finds it taken by us.
pub struct FileWakeups<'a> {
    lock: &'a FileLock,
    pending: Option<oneshot::Receiver<io::Result<()>>>,
}

impl Wakeups for FileWakeups<'_> {
    async fn next(&mut self) -> Result<(), BackendError> {
        let lock = self.lock;
        let pending = self
            .pending
            .get_or_insert_with(|| block_until_locked(lock.file.clone()));
        let result = pending.await;
        self.pending = None;
        match result {
            Ok(Ok(())) => {
                // Given to us; but a --min-hold deadline is slept out without holding it.
                let left = Meta::read(&lock.file)
                    .not_before
                    .as_ref()
                    .and_then(NotBefore::left);
                if let Some(left) = left {
                    lock.unlock();
                    tokio::time::sleep(left).await;
                }
                Ok(())
            }
            Ok(Err(e)) => Err(lock.refused(refused(&lock.paths.lock, "wait for", &e))),
            Err(_) => Err(BackendError::Transient(
                "the thread waiting for the lock could not be started".into(),
            )),
        }
    }
}

/// Starts a thread that blocks until this process holds the lock. The thread is not joined:
/// a wait that ends another way leaves it blocked until the process exits.
fn block_until_locked(file: Arc<File>) -> oneshot::Receiver<io::Result<()>> {
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("flock-wait".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // Signals are the main thread's business.
            let _ = nix::sys::signal::SigSet::all().thread_block();
            let _ = tx.send(flock(&file, libc::LOCK_EX));
        });
    if let Err(e) = spawned {
        tracing::info!("cannot start a thread to wait for the lock: {e}");
    }
    rx
}

/// `status` of a NAME in a directory, without creating or locking anything in the common case.
pub fn inspect(url: &str, name: &LockName) -> Result<Report, BackendError> {
    let dir = dir_of(url).map_err(BackendError::Refused)?;
    if !dir.is_dir() {
        return Err(BackendError::Refused(format!(
            "{} is not a directory (no lock was ever taken there, or the file:// URL is wrong)",
            dir.display()
        )));
    }
    let paths = Paths::new(&dir, name);
    let fence = paths.read_fence()?;
    let file = match File::open(&paths.lock) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Report {
                fence,
                held: None,
                value: None,
            });
        }
        Err(e) => return Err(refused(&paths.lock, "read", &e)),
    };
    let meta = Meta::read(&file);
    let expiry = if is_locked(&file).map_err(|e| refused(&paths.lock, "check", &e))? {
        Some(Expiry::WithHolder)
    } else {
        meta.not_before
            .as_ref()
            .and_then(NotBefore::left)
            .map(Expiry::In)
    };
    Ok(Report {
        fence,
        held: expiry.map(|expiry| Busy {
            holder: meta.holder,
            expiry,
        }),
        value: expiry.and(meta.token),
    })
}

/// Frees a lock that only a `--min-hold` deadline keeps; a lock that a live process holds
/// cannot be taken from it. Returns the holder it was taken from, and the last fence.
pub fn clear_min_hold(
    url: &str,
    name: &LockName,
) -> Result<(Option<Holder>, Option<u64>), BackendError> {
    let dir = dir_of(url).map_err(BackendError::Refused)?;
    let paths = Paths::new(&dir, name);
    let fence = paths.read_fence()?;
    let file = match OpenOptions::new().read(true).write(true).open(&paths.lock) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((None, fence)),
        Err(e) => return Err(refused(&paths.lock, "open", &e)),
    };
    flock(&file, libc::LOCK_EX | libc::LOCK_NB).map_err(|e| refused(&paths.lock, "lock", &e))?;
    let meta = Meta::read(&file);
    let holder = meta
        .not_before
        .as_ref()
        .and_then(NotBefore::left)
        .map(|_| meta.holder.clone());
    if holder.is_some() {
        file.set_len(0)
            .map_err(|e| refused(&paths.lock, "write", &e))?;
    }
    Ok((holder, fence))
}

/// How many processes are blocked waiting for the lock, from `/proc/locks` (waiters in this
/// PID namespace only); `None` when that cannot be told.
pub fn waiters(url: &str, name: &LockName) -> Option<u64> {
    let dir = dir_of(url).ok()?;
    let meta = fs::metadata(Paths::new(&dir, name).lock).ok()?;
    let locks = fs::read_to_string("/proc/locks").ok()?;
    let dev = (
        libc::major(meta.dev()) as u64,
        libc::minor(meta.dev()) as u64,
    );
    Some(proc_locks_count(&locks, dev, meta.ino(), true) as u64)
}

/// Whether some process holds a flock on `file`. `/proc/locks` answers without touching the
/// lock; when it cannot (a holder in another PID namespace is not listed there, and some
/// filesystems report another device number), a shared lock is tried for an instant: a
/// `-n` acquirer at that very instant would find the lock busy.
fn is_locked(file: &File) -> io::Result<bool> {
    let meta = file.metadata()?;
    if let Ok(locks) = fs::read_to_string("/proc/locks") {
        let dev = (
            libc::major(meta.dev()) as u64,
            libc::minor(meta.dev()) as u64,
        );
        if proc_locks_count(&locks, dev, meta.ino(), false) > 0 {
            return Ok(true);
        }
    }
    match flock(file, libc::LOCK_SH | libc::LOCK_NB) {
        Ok(()) => {
            let _ = flock(file, libc::LOCK_UN);
            Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
        Err(e) => Err(e),
    }
}

/// How many granted FLOCKs (or, with `blocked`, blocked waiters for one) `/proc/locks` lists
/// on the inode (`MAJOR:MINOR:INODE`, the device numbers in hex).
fn proc_locks_count(locks: &str, (major, minor): (u64, u64), inode: u64, blocked: bool) -> usize {
    locks
        .lines()
        .filter(|line| {
            // "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF"; a waiter: "1: -> FLOCK  ADVISORY ...".
            let mut fields: Vec<&str> = line.split_whitespace().collect();
            let waiting = fields.get(1) == Some(&"->");
            if waiting {
                fields.remove(1);
            }
            if waiting != blocked || fields.get(1) != Some(&"FLOCK") {
                return false;
            }
            let mut id = fields.get(5).unwrap_or(&"").split(':');
            let (Some(ma), Some(mi), Some(ino)) = (id.next(), id.next(), id.next()) else {
                return false;
            };
            u64::from_str_radix(ma, 16).ok() == Some(major)
                && u64::from_str_radix(mi, 16).ok() == Some(minor)
                && ino.parse().ok() == Some(inode)
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_an_absolute_local_directory() {
        assert!(is_file_url("file:///var/lock/jobs"));
        assert!(is_file_url("FILE:///x"));
        assert!(!is_file_url("redis://h"));
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

    #[test]
    fn metadata_round_trips_and_cannot_be_forged() {
        let meta = Meta {
            holder: Holder {
                host: Some("web-3".into()),
                pid: Some(4242),
                command: Some("evil\nfence=1".into()),
                since_ms: Some(1_764_673_200_000),
                fence: Some(17),
            },
            token: Some("t".into()),
            not_before: Some(NotBefore {
                boot_id: "b".into(),
                boot_ms: 5,
                wall_ms: 6,
            }),
        };
        let parsed = Meta::parse(&meta.to_text());
        assert_eq!(parsed.holder.fence, Some(17));
        assert_eq!(parsed.holder.command.as_deref(), Some("evil?fence=1"));
        assert_eq!(parsed.not_before, meta.not_before);
        assert_eq!(Meta::parse(""), Meta::default());
        assert_eq!(Meta::parse("garbage\npid=x\n").holder.pid, None);
    }

    #[test]
    fn not_before_counts_on_this_boot_and_falls_back_to_the_wall_clock() {
        let ahead = NotBefore::after(Duration::from_secs(10));
        let left = ahead.left().unwrap();
        assert!(left > Duration::from_secs(9) && left <= Duration::from_secs(10));
        let past = NotBefore::after(Duration::ZERO);
        assert_eq!(past.left(), None);
        // Another boot: the boot clock's reading means nothing, the wall clock decides.
        let other_boot = NotBefore {
            boot_id: "another boot".into(),
            boot_ms: u64::MAX,
            wall_ms: wall_clock_ms() - 1,
        };
        assert_eq!(other_boot.left(), None);
    }

    #[test]
    fn proc_locks_lines_are_matched_on_device_and_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 77 08:01:99 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 fd:0a:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 4243 fd:0a:1234 0 EOF\n";
        assert_eq!(proc_locks_count(locks, (0xfd, 0x0a), 1234, false), 1);
        assert_eq!(proc_locks_count(locks, (0xfd, 0x0a), 1234, true), 1);
        assert_eq!(proc_locks_count(locks, (0xfd, 0x0b), 1234, false), 0);
        assert_eq!(
            proc_locks_count(locks, (0x08, 0x01), 99, false),
            0,
            "POSIX locks are not ours"
        );
    }

    #[tokio::test]
    async fn a_second_lock_waits_for_the_first_and_fences_grow() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let name = LockName::new("db.migrate-v2").unwrap();
        let a = FileLock::open(&url, name.clone(), "a").unwrap();
        let b = FileLock::open(&url, name.clone(), "b").unwrap();
        assert_eq!(
            a.try_acquire(false).await,
            Ok(Attempt::Acquired { fence: 1 })
        );
        let Ok(Attempt::Busy(busy)) = b.try_acquire(true).await else {
            panic!("b got it too")
        };
        assert_eq!(busy.holder.command.as_deref(), Some("a"));
        assert_eq!(busy.expiry, Expiry::WithHolder);
        let report = inspect(&url, &name).unwrap();
        assert_eq!(report.fence, Some(1));
        assert_eq!(report.held.unwrap().holder.pid, Some(std::process::id()));

        let (mut wakeups, covered) = b.subscribe().await.unwrap();
        assert!(covered);
        assert_eq!(a.release(None, Duration::ZERO).await, Ok(true));
        wakeups.next().await.unwrap();
        assert_eq!(
            b.try_acquire(false).await,
            Ok(Attempt::Acquired { fence: 2 })
        );
        assert_eq!(
            b.release(Some(Duration::from_secs(60)), Duration::ZERO)
                .await,
            Ok(true)
        );

        // --min-hold: free of any process, but not before its deadline.
        let Ok(Attempt::Busy(busy)) = a.try_acquire(false).await else {
            panic!("the min-hold deadline was ignored")
        };
        assert!(matches!(busy.expiry, Expiry::In(d) if d > Duration::from_secs(59)));
        assert!(inspect(&url, &name).unwrap().held.is_some());
        let (holder, fence) = clear_min_hold(&url, &name).unwrap();
        assert_eq!(holder.unwrap().command.as_deref(), Some("b"));
        assert_eq!(fence, Some(2));
        assert_eq!(
            a.try_acquire(false).await,
            Ok(Attempt::Acquired { fence: 3 })
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("db.migrate-v2.fence")).unwrap(),
            "3\n"
        );
    }
}
