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
//! - Waiting: a thread blocks in `flock(LOCK_EX)` on a descriptor of its own, so the kernel
//!   wakes it the moment the holder lets go; it lets go at once and tells the waiter, which
//!   then tries as usual. No polling, except while a `--min-hold` deadline (which no process
//!   holds) is slept out: then the lock file is re-read every [`MIN_HOLD_RECHECK`], so that a
//!   `release --force` is seen.
//! - Symbolic links in DIR are never followed (`O_NOFOLLOW`, `O_EXCL`): in a directory that
//!   several users share, a planted link must not make a run write someone else's file. A lock
//!   file replaced under a waiter (deleted and created again) is noticed after `flock`, by
//!   comparing the descriptor's inode with the path's, and the new file is locked instead.
//!
//! There is no lease: nothing to renew, and the lease clock never fires.

use std::cell::RefCell;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::backend::{
    Attempt, Backend, BackendError, Busy, Expiry, Holder, Wakeups, hostname, wall_clock_ms,
};
use crate::exit::Failure;
use crate::lease::{BootClock, Clock, Timings};
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
        let read = || -> io::Result<String> {
            let mut text = String::new();
            // A counter is a number and a newline: what is beyond 64 bytes is not one.
            open_existing(&self.fence, false)?
                .take(64)
                .read_to_string(&mut text)?;
            Ok(text)
        };
        match read() {
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
    /// counter, fsync of the directory. Called under the lock, and also under a flock on the
    /// directory itself: should two processes ever both hold NAME (its lock file deleted
    /// while held), they still never get the same token.
    async fn raise_fence(&self) -> Result<u64, BackendError> {
        let dir = File::open(&self.dir).map_err(|e| refused(&self.dir, "open", &e))?;
        lock_briefly(&dir)
            .await
            .map_err(|e| refused(&self.dir, "lock", &e))?;
        // Closing `dir` unlocks it, however this returns.
        let next = self
            .read_fence()?
            .unwrap_or(0)
            .checked_add(1)
            .ok_or_else(|| {
                BackendError::Refused(format!("{} is at its maximum", self.fence.display()))
            })?;
        let write = || -> io::Result<()> {
            // A fresh file (O_EXCL): never one that a link planted under this name points at.
            match fs::remove_file(&self.fence_tmp) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let mut tmp = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o666)
                .open(&self.fence_tmp)?;
            tmp.write_all(format!("{next}\n").as_bytes())?;
            tmp.sync_all()?;
            fs::rename(&self.fence_tmp, &self.fence)?;
            dir.sync_all()
        };
        write().map_err(|e| {
            // Not left behind for the next user to trip over (in a sticky directory, it
            // could not remove another user's).
            let _ = fs::remove_file(&self.fence_tmp);
            refused(&self.fence, "write", &e)
        })?;
        Ok(next)
    }
}

/// Opens (creating it) the lock file, refusing links and anything but a regular file.
fn open_lock_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    plain_file(file)
}

/// Opens a file of ours that exists, refusing links and anything but a regular file, without
/// blocking (a FIFO planted under its name would otherwise hang the open, the lock held).
fn open_existing(path: &Path, write: bool) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    plain_file(file)
}

/// `file`, if it is a regular file with no other name: a hard link planted under a lock
/// file's name would have the holder's metadata written into (and truncated from) the file
/// it links to.
fn plain_file(file: File) -> io::Result<File> {
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::other("not a regular file"));
    }
    if meta.nlink() > 1 {
        return Err(io::Error::other(
            "it has other names (hard links), planted by someone else? remove it",
        ));
    }
    Ok(file)
}

fn refused(path: &Path, what: &str, e: &io::Error) -> BackendError {
    let hint = match e.raw_os_error() {
        Some(libc::ELOOP) => {
            "; it is a symbolic link, which locked-run never follows there (planted by someone else?): remove it"
        }
        Some(libc::EACCES | libc::EPERM) if in_sticky_dir(path) => {
            "; the directory is sticky (as /tmp is): only the user who created a file there may \
             replace it (or, with fs.protected_regular, open it), so its locks serve one user: \
             give the lock's users a directory of their group instead (mode 2775)"
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

fn in_sticky_dir(path: &Path) -> bool {
    path.parent()
        .and_then(|dir| dir.metadata().ok())
        .is_some_and(|m| m.mode() & 0o1000 != 0)
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

/// Takes an exclusive flock held by others only for moments (a fence being raised): tries,
/// then retries after 1 ms, 2 ms, 4 ms ... 64 ms, for at most 5 s in all. A blocking flock
/// would hang, deaf to signals, on a directory someone else keeps locked.
async fn lock_briefly(file: &File) -> io::Result<()> {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match flock(file, libc::LOCK_EX | libc::LOCK_NB) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if started.elapsed() > Duration::from_secs(5) {
                    return Err(io::Error::other(
                        "another process has held it for 5 s (a fence is raised under it in milliseconds)",
                    ));
                }
                // Asleep on the runtime, not the thread: a signal still ends a wait.
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(64));
            }
            result => return result,
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
    /// The lock file: the flock belongs to this open file description. Replaced when the file
    /// at the path turns out to be another one.
    file: RefCell<File>,
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
        let file = open_lock_file(&paths.lock)
            .map_err(|e| Failure::unavailable(refused(&paths.lock, "open", &e).to_string()))?;
        Ok(FileLock {
            key: paths.lock.display().to_string(),
            name,
            paths,
            token: uuid::Uuid::new_v4().to_string(),
            holder: Holder {
                host: Some(hostname()),
                pid: Some(std::process::id()),
                command: Some(command.to_owned()),
                since_ms: None,
                fence: None,
            },
            file: RefCell::new(file),
            held: RefCell::new(None),
        })
    }

    pub fn name(&self) -> &LockName {
        &self.name
    }

    fn unlock(&self) {
        // Closing the descriptor at exit would unlock too; an error here changes nothing.
        let _ = flock(&self.file.borrow(), libc::LOCK_UN);
    }

    /// Whether `file` is still the file at the lock's path (not deleted, not replaced).
    fn still_at_path(&self, file: &File) -> io::Result<bool> {
        let open = file.metadata()?;
        match fs::symlink_metadata(&self.paths.lock) {
            Ok(now) => Ok(now.dev() == open.dev() && now.ino() == open.ino()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// How long a `--min-hold` deadline left in the lock file still keeps the lock.
    fn min_hold_left(&self) -> Option<Duration> {
        Meta::read(&self.file.borrow())
            .not_before
            .as_ref()
            .and_then(NotBefore::left)
    }

    /// Makes the lock file's content durable, and its directory entry (this run may have
    /// created it): a `--min-hold` deadline must survive a crash, as the fence counter does.
    fn sync(&self, file: &File) -> io::Result<()> {
        file.sync_data()?;
        File::open(&self.paths.dir)?.sync_all()
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

    async fn try_acquire(
        &self,
        _timings: &Timings,
        _listen: bool,
    ) -> Result<Attempt, BackendError> {
        if let Some(meta) = &*self.held.borrow() {
            return Ok(Attempt::Acquired {
                fence: meta.holder.fence.unwrap_or(0),
            });
        }
        // A file deleted and created again under the same name is another lock: lock the one
        // at the path (a few times at most, against someone who keeps replacing it).
        let mut replaced = 0;
        loop {
            let file = self.file.borrow();
            let locked = match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                Err(e) => return Err(refused(&self.paths.lock, "lock", &e)),
            };
            let here = self
                .still_at_path(&file)
                .map_err(|e| self.refused(refused(&self.paths.lock, "check", &e)))?;
            if !locked && here {
                return Ok(Attempt::Busy(Busy {
                    holder: holder_of(&file, Meta::read(&file).holder),
                    expiry: Expiry::WithHolder,
                }));
            }
            drop(file);
            if here {
                break;
            }
            // Replaced: busy or not, the file we have is no longer the lock.
            if locked {
                self.unlock();
            }
            replaced += 1;
            if replaced > 3 {
                return Err(BackendError::Transient(format!(
                    "{} keeps being replaced (deleted and created again) by someone else",
                    self.paths.lock.display()
                )));
            }
            let file = open_lock_file(&self.paths.lock)
                .map_err(|e| refused(&self.paths.lock, "open", &e))?;
            *self.file.borrow_mut() = file;
        }
        // Ours now; a --min-hold deadline left by the last holder still keeps it.
        let last = Meta::read(&self.file.borrow());
        if let Some(left) = last.not_before.as_ref().and_then(NotBefore::left) {
            self.unlock();
            return Ok(Attempt::Busy(Busy {
                holder: last.holder,
                expiry: Expiry::In(left),
            }));
        }
        let fence = self
            .paths
            .raise_fence()
            .await
            .map_err(|e| self.refused(e))?;
        let meta = Meta {
            holder: Holder {
                since_ms: Some(wall_clock_ms()),
                fence: Some(fence),
                ..self.holder.clone()
            },
            token: Some(self.token.clone()),
            not_before: None,
        };
        let written = meta.write(&self.file.borrow());
        written.map_err(|e| self.refused(refused(&self.paths.lock, "write", &e)))?;
        *self.held.borrow_mut() = Some(meta);
        Ok(Attempt::Acquired { fence })
    }

    async fn renew(&self, _timings: &Timings, _timeout: Duration) -> Result<bool, BackendError> {
        Ok(self.held.borrow().is_some())
    }

    async fn release(
        &self,
        keep_for: Option<Duration>,
        _timeout: Duration,
    ) -> Result<bool, BackendError> {
        let Some(mut meta) = self.held.borrow_mut().take() else {
            return Ok(false);
        };
        let written = match keep_for {
            Some(hold) => {
                meta.not_before = Some(NotBefore::after(hold));
                let file = self.file.borrow();
                meta.write(&file).and_then(|()| self.sync(&file))
            }
            None => self.file.borrow().set_len(0),
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

/// How often a waiter sleeping out a `--min-hold` deadline re-reads the lock file (no process
/// holds the lock then, so nothing wakes it when `release --force` clears the deadline).
pub const MIN_HOLD_RECHECK: Duration = Duration::from_secs(2);

/// A thread blocked in `flock(LOCK_EX)` on a descriptor of its own: when it returns, the
/// holder has let go, and the waiter tries again.
pub struct FileWakeups<'a> {
    lock: &'a FileLock,
    pending: Option<oneshot::Receiver<io::Result<()>>>,
}

impl Wakeups for FileWakeups<'_> {
    async fn next(&mut self) -> Result<(), BackendError> {
        let lock = self.lock;
        if let Some(left) = lock.min_hold_left() {
            tokio::time::sleep(left.min(MIN_HOLD_RECHECK)).await;
            return Ok(());
        }
        let pending = self
            .pending
            .get_or_insert_with(|| block_until_free(lock.paths.lock.clone()));
        let result = pending.await;
        self.pending = None;
        match result {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(BackendError::Transient(format!(
                "cannot wait for {}: {e}",
                lock.paths.lock.display()
            ))),
            Err(_) => Err(BackendError::Transient(
                "the thread waiting for the lock could not be started".into(),
            )),
        }
    }
}

/// Starts a thread that opens the lock file, blocks until it can lock it, and closes it at
/// once: it never keeps the lock, so a wait that ends another way (a deadline, a signal)
/// leaves nothing held even while the thread is still blocked.
fn block_until_free(path: PathBuf) -> oneshot::Receiver<io::Result<()>> {
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("flock-wait".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // Signals are the main thread's business.
            let _ = nix::sys::signal::SigSet::all().thread_block();
            // Open for writing: NFS locks only such files exclusively.
            let waited = open_existing(&path, true).and_then(|file| flock(&file, libc::LOCK_EX));
            let _ = tx.send(waited);
        });
    if let Err(e) = spawned {
        tracing::info!("cannot start a thread to wait for the lock: {e}");
    }
    rx
}

/// `status` of a NAME in a directory, without creating anything, and without touching the
/// lock whenever `/proc/locks` can tell.
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
    let file = match open_existing(&paths.lock, false) {
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
    let held = is_locked(&file).map_err(|e| refused(&paths.lock, "check", &e))?;
    let (holder, expiry) = if held {
        (holder_of(&file, meta.holder), Some(Expiry::WithHolder))
    } else {
        let left = meta.not_before.as_ref().and_then(NotBefore::left);
        (meta.holder, left.map(Expiry::In))
    };
    Ok(Report {
        fence,
        held: expiry.map(|expiry| Busy { holder, expiry }),
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
    let file = match open_existing(&paths.lock, true) {
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

/// `doctor`: NAME's files in DIR can be used by this user: the lock file opens for writing
/// (not a link), the fence counter reads as one.
pub fn check_files(dir: &Path, name: &LockName) -> Result<String, String> {
    let paths = Paths::new(dir, name);
    let lock = match fs::symlink_metadata(&paths.lock) {
        Err(_) => return Ok(format!("no files for lock {name} yet")),
        Ok(_) => {
            open_lock_file(&paths.lock).map_err(|e| refused(&paths.lock, "open", &e).to_string())?
        }
    };
    drop(lock);
    let fence = paths.read_fence().map_err(|e| e.to_string())?;
    Ok(format!(
        "{} opens for writing; last fence of lock {name}: {}",
        paths.lock.display(),
        fence.map_or_else(|| "none issued yet".into(), |f| f.to_string())
    ))
}

/// How many processes are blocked waiting for the lock, from `/proc/locks` (waiters in this
/// PID namespace only); `None` when that cannot be told.
pub fn waiters(url: &str, name: &LockName) -> Option<u64> {
    let dir = dir_of(url).ok()?;
    let meta = fs::symlink_metadata(Paths::new(&dir, name).lock).ok()?;
    let locks = ProcLocks::read()?;
    let (on_file, _) = locks.on(&meta);
    Some(on_file.iter().filter(|l| l.blocked).count() as u64)
}

/// Whether some process holds the lock on `file`. `/proc/locks` answers without touching the
/// lock, when it can: an exclusive flock listed on the file's device and inode is a holder,
/// and no flock listed at all is a free lock, as long as this process sees every process's
/// locks (the initial PID namespace). Otherwise (a container, a filesystem whose device
/// numbers differ from the ones `/proc/locks` prints, a shared lock) a shared lock is tried
/// for an instant: a `-n` run at that very instant would find the lock busy.
fn is_locked(file: &File) -> io::Result<bool> {
    let meta = file.metadata()?;
    if let Some(locks) = ProcLocks::read() {
        let (on_file, exact) = locks.on(&meta);
        let granted: Vec<&LockLine> = on_file.iter().filter(|l| !l.blocked).collect();
        if exact && granted.iter().any(|l| l.write) {
            return Ok(true);
        }
        if on_file.is_empty() && sees_every_process() {
            return Ok(false);
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

/// The holder the lock file names, checked against the process `/proc/locks` says holds the
/// lock: a `locked-run` that was SIGKILLed leaves its metadata behind, and the lock may now be
/// held by another program (`flock(1)`); then that process is named, not the dead one.
fn holder_of(file: &File, named: Holder) -> Holder {
    let Ok(meta) = file.metadata() else {
        return named;
    };
    let Some(locks) = ProcLocks::read() else {
        return named;
    };
    let (on_file, _) = locks.on(&meta);
    let Some(pid) = on_file
        .iter()
        .find(|l| !l.blocked && l.write && l.pid > 0)
        .map(|l| l.pid as u32)
    else {
        return named;
    };
    if named.pid == Some(pid) {
        return named;
    }
    Holder {
        host: Some(hostname()),
        pid: Some(pid),
        command: fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|c| c.trim().to_owned()),
        since_ms: None,
        fence: None,
    }
}

/// Whether this process is in the initial PID namespace, where `/proc/locks` lists the locks
/// of every process (elsewhere only those of the processes this namespace sees).
fn sees_every_process() -> bool {
    // PROC_PID_INIT_INO: the initial PID namespace's inode number, fixed by the kernel.
    fs::read_link("/proc/self/ns/pid").is_ok_and(|l| l.as_os_str() == "pid:[4026531836]")
}

/// One line of `/proc/locks` about a flock: "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF",
/// a blocked waiter "1: -> FLOCK  ADVISORY  WRITE 4243 08:01:1234 0 EOF" (the device numbers
/// in hex, the inode in decimal).
#[derive(Clone, Debug, PartialEq, Eq)]
struct LockLine {
    blocked: bool,
    write: bool,
    pid: i64,
    dev: (u64, u64),
    inode: u64,
}

struct ProcLocks(Vec<LockLine>);

impl ProcLocks {
    fn read() -> Option<ProcLocks> {
        fs::read_to_string("/proc/locks")
            .ok()
            .map(|text| ProcLocks::parse(&text))
    }

    fn parse(text: &str) -> ProcLocks {
        let lines = text
            .lines()
            .filter_map(|line| {
                let mut fields: Vec<&str> = line.split_whitespace().collect();
                let blocked = fields.get(1) == Some(&"->");
                if blocked {
                    fields.remove(1);
                }
                if fields.get(1) != Some(&"FLOCK") {
                    return None;
                }
                let mut id = fields.get(5)?.split(':');
                Some(LockLine {
                    blocked,
                    write: fields.get(3) == Some(&"WRITE"),
                    pid: fields.get(4)?.parse().ok()?,
                    dev: (
                        u64::from_str_radix(id.next()?, 16).ok()?,
                        u64::from_str_radix(id.next()?, 16).ok()?,
                    ),
                    inode: id.next()?.parse().ok()?,
                })
            })
            .collect();
        ProcLocks(lines)
    }

    /// The flocks on the file `meta` describes, and whether they were matched on its device
    /// as well as its inode. Some filesystems (btrfs, overlayfs) report a device number in
    /// `stat` other than the one `/proc/locks` prints: then the inode alone is matched, which
    /// another filesystem's file may share, so the match is not exact.
    fn on(&self, meta: &fs::Metadata) -> (Vec<LockLine>, bool) {
        let dev = (
            libc::major(meta.dev()) as u64,
            libc::minor(meta.dev()) as u64,
        );
        let same_inode = self.0.iter().filter(|l| l.inode == meta.ino());
        let exact: Vec<LockLine> = same_inode
            .clone()
            .filter(|l| l.dev == dev)
            .cloned()
            .collect();
        if !exact.is_empty() {
            return (exact, true);
        }
        (same_inode.cloned().collect(), false)
    }
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
    fn proc_locks_lines_are_read_and_matched_on_device_and_inode() {
        let locks = ProcLocks::parse(
            "1: POSIX  ADVISORY  WRITE 77 08:01:99 0 EOF\n\
             2: FLOCK  ADVISORY  WRITE 4242 fd:0a:1234 0 EOF\n\
             2: -> FLOCK  ADVISORY  WRITE 4243 fd:0a:1234 0 EOF\n\
             3: FLOCK  ADVISORY  READ 11 fd:0b:1234 0 EOF\n",
        );
        assert_eq!(locks.0.len(), 3, "POSIX locks are not ours");
        assert_eq!(
            locks.0[1],
            LockLine {
                blocked: true,
                write: true,
                pid: 4243,
                dev: (0xfd, 0x0a),
                inode: 1234
            }
        );
        assert!(!locks.0[2].write);
    }
    #[tokio::test]
    async fn a_second_lock_waits_for_the_first_and_fences_grow() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let name = LockName::new("db.migrate-v2").unwrap();
        let t = Timings::new(Duration::from_secs(30), None, None).unwrap();
        let a = FileLock::open(&url, name.clone(), "a").unwrap();
        let b = FileLock::open(&url, name.clone(), "b").unwrap();
        assert_eq!(
            a.try_acquire(&t, false).await,
            Ok(Attempt::Acquired { fence: 1 })
        );
        let Ok(Attempt::Busy(busy)) = b.try_acquire(&t, true).await else {
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
            b.try_acquire(&t, false).await,
            Ok(Attempt::Acquired { fence: 2 })
        );
        assert_eq!(
            b.release(Some(Duration::from_secs(60)), Duration::ZERO)
                .await,
            Ok(true)
        );

        // --min-hold: free of any process, but not before its deadline.
        let Ok(Attempt::Busy(busy)) = a.try_acquire(&t, false).await else {
            panic!("the min-hold deadline was ignored")
        };
        assert!(matches!(busy.expiry, Expiry::In(d) if d > Duration::from_secs(59)));
        assert!(inspect(&url, &name).unwrap().held.is_some());
        let (holder, fence) = clear_min_hold(&url, &name).unwrap();
        assert_eq!(holder.unwrap().command.as_deref(), Some("b"));
        assert_eq!(fence, Some(2));
        assert_eq!(
            a.try_acquire(&t, false).await,
            Ok(Attempt::Acquired { fence: 3 })
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("db.migrate-v2.fence")).unwrap(),
            "3\n"
        );
    }
}
