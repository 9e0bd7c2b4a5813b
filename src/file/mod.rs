//! The host-local backend, `file:///DIR`: locks on one machine and no server, for teams that
//! start on one host (where they would reach for `flock -n` or `flock -w`). Moving to a fleet
//! later changes only the URL.
//!
//! - Exclusion: `flock(2)` on `DIR/STEM.lock` (the stem is [`LockName::file_stem`]). The kernel
//!   frees it the moment the holding process dies. The descriptor is close-on-exec, so the
//!   command never holds the lock on its own. The file is never unlinked: a waiter that had
//!   opened it would then lock a file that nobody else sees.
//! - Fencing: `DIR/STEM.fence` holds, in decimal, the top of a block of tokens reserved
//!   durably (a temporary file, fsync, rename, fsync of the directory) before any of them is
//!   issued; the tokens are issued under the lock and counted in an extended attribute of that
//!   file, in memory, which counts only in the boot and mount it was written in (see
//!   `reserve`). So most runs write nothing to disk before the command starts, and no token is
//!   issued twice, even when a holder is SIGKILLed or the host loses power.
//! - Holder metadata, for `status` and a waiter's messages: `key=value` lines in the lock file,
//!   written under the lock, emptied on release.
//! - `--shared`: `flock(LOCK_SH)` on the same lock file, as `flock -s` takes it; each shared
//!   holder's metadata is a file of its own (see `shared`).
//! - `--min-hold`: a not-before deadline left in the lock file on release; the next holder
//!   honours it by waiting (or by 75 with `-n`). A shared holder's deadline is left in its own
//!   file, and keeps the lock from exclusive runs only.
//! - Order: a run that must wait takes a place in a queue of files (see `queue`), so waiters
//!   of both modes go in arrival order and a shared newcomer never passes an exclusive waiter.
//! - Waiting: a thread blocks in `flock` on a descriptor of its own, on the place of the waiter
//!   before it (`LOCK_SH`) and then on the lock file, or on the lock file alone once no place
//!   is left before (`LOCK_EX`, or `LOCK_SH` for a shared run), so the kernel wakes it the
//!   moment the lock is let go; it lets go at once and tells the waiter, which then tries as
//!   usual. No polling, except while a `--min-hold`
//!   deadline (which no process holds) is slept out: then the lock file is re-read every
//!   `MIN_HOLD_RECHECK`, so that a `release --force` is seen.
//! - Symbolic links in DIR are never followed (`O_NOFOLLOW`, `O_EXCL`): in a directory that
//!   several users share, a planted link must not make a run write someone else's file. In a
//!   sticky directory that other users can write, a file of the lock that another user owns is
//!   refused (see `trust`): its owner could swap it. A lock file replaced under a waiter
//!   (deleted and created again) is noticed after `flock`, by comparing the descriptor's inode
//!   with the path's, and the new file is locked instead.
//!
//! There is no lease: nothing to renew, and the lease clock never fires.

mod doctor;
mod fence;
mod files;
mod history;
mod inspect;
mod lockfile;
mod meta;
mod proc_locks;
mod queue;
mod reserve;
mod shared;
mod slots;
mod stem;
mod trust;
mod wakeups;

use std::cell::RefCell;
use std::fs::File;
use std::time::Duration;

use crate::backend::{Attempt, Backend, BackendError, Busy, Check, Expiry, Holder, hostname};
use crate::backend::{Can, Declaration, Modes, Queue, Several, any_name, says};
use crate::backend::{Freed, History, Mode, Report, Run, Tenure, View, Wakeups, wall_clock_ms};
use crate::endpoints::Scheme;
use crate::lease::Timings;
use crate::name::LockName;
use crate::plumbing::exit::Failure;

use files::{Paths, prepare_dir, refused};
pub use files::{dir_of, flock as flock_file, remove_stale};
pub use inspect::{check_files, only_its_process_frees, writable_by_all};
use meta::{Meta, NotBefore};
use queue::Place;
pub use stem::of as stem;
pub use trust::check as check_owner;
pub use wakeups::FileWakeups;

/// A directory of this host (`file:///DIR`), as the registry knows it.
pub const BACKEND: Declaration = Declaration {
    called: "file://",
    schemes: &[Scheme {
        bare: true,
        ..Scheme::plain("file", "file:///DIR (this host only)")
    }],
    help: "file:///DIR for locks on this host only, with no server",
    doctor: "a file:// directory",
    modes: Modes {
        holders: Can::Yes,
        shared: Can::Yes,
        wait_replicas: Can::No("file:// has no server, and so no replicas"),
        queue: Queue::Fair,
    },
    several: Several::Refused(says!(
        "file:// keeps locks on this host only: it cannot be combined with other URLs (give \
         one file:// URL, or only Redis URLs)"
    )),
    no_tls: Some(says!(
        "--tls-ca-cert, --tls-cert and --tls-key are for servers that speak TLS, and file:// \
         has no server"
    )),
    name_rule: any_name,
    open: |store, spec| {
        Ok(Box::new(
            FileLock::at(store.url().url(), spec.name.clone(), store.how.command)?
                .with_holders(spec.mode.holders())
                .with_shared(spec.mode == Mode::Shared),
        ))
    },
};

/// A lock on one NAME in one directory of this host.
pub struct FileLock {
    /// The `file://` URL it was opened from, as `doctor` names it.
    url: String,
    name: LockName,
    paths: Paths,
    key: String,
    token: String,
    holder: Holder,
    /// The lock file: the flock belongs to this open file description. Replaced when the file
    /// at the path turns out to be another one; `None` until the first attempt of a lock
    /// made by [`FileLock::at`].
    file: RefCell<Option<File>>,
    /// What was written into the lock file when it was taken; `None` when not held.
    held: RefCell<Option<Meta>>,
    /// `--holders N`: 1 is one lock file, more a semaphore of N slot files.
    holders: u32,
    /// `--shared`: the lock file is locked shared (`LOCK_SH`), as `flock -s` does.
    shared: bool,
    /// A shared holder's own file (`STEM.shared.TOKEN`), locked while the lock is held.
    member: RefCell<Option<File>>,
    /// This run's place in the queue while it waits (see `queue`); left when it takes the
    /// lock, gives up, or is dropped.
    place: RefCell<Option<Place>>,
}

impl FileLock {
    /// [`FileLock::at`], prepared: what a run opens, for the tests.
    #[cfg(test)]
    pub fn open(url: &str, name: LockName, command: &str) -> Result<FileLock, Failure> {
        let lock = FileLock::at(url, name, command)?;
        lock.prepare()?;
        Ok(lock)
    }

    /// Creates the directory if its parent exists (else a usage error, 2), and opens the lock
    /// file, creating it (a directory or file that cannot be written is 69).
    pub fn prepare(&self) -> Result<(), Failure> {
        prepare_dir(&self.paths.dir)?;
        self.file()
            .map(drop)
            .map_err(|e| Failure::unavailable(e.to_string()))
    }

    /// The lock of `name` in the directory `url` names, with nothing opened or created yet:
    /// what `status` and `release` look at.
    pub fn at(url: &str, name: LockName, command: &str) -> Result<FileLock, Failure> {
        let dir = dir_of(url).map_err(Failure::usage)?;
        let paths = Paths::new(&dir, &name);
        Ok(FileLock {
            url: url.to_owned(),
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
            file: RefCell::new(None),
            held: RefCell::new(None),
            holders: 1,
            shared: false,
            member: RefCell::new(None),
            place: RefCell::new(None),
        })
    }

    /// Up to `holders` runs may hold the lock at once (N slot files; 1 is one lock file).
    pub fn with_holders(mut self, holders: u32) -> FileLock {
        self.holders = holders;
        self
    }

    /// Held in shared mode (`--shared`): with the other shared holders, never beside an
    /// exclusive one.
    pub fn with_shared(mut self, shared: bool) -> FileLock {
        self.shared = shared;
        self
    }

    /// How this run locks the lock file: `LOCK_SH` when shared, else `LOCK_EX`.
    fn operation(&self) -> libc::c_int {
        match self.shared {
            true => libc::LOCK_SH,
            false => libc::LOCK_EX,
        }
    }

    fn mode(&self) -> Mode {
        match self.shared {
            true => Mode::Shared,
            false => Mode::of_holders(self.holders),
        }
    }

    /// What a lock file says once this run holds it with `fence` (`limit`: a semaphore slot's N).
    fn granted(&self, fence: u64, limit: Option<u32>) -> Meta {
        Meta {
            holder: Holder {
                since_ms: Some(wall_clock_ms()),
                fence: Some(fence),
                ..self.holder.clone()
            },
            token: Some(self.token.clone()),
            not_before: None,
            limit,
        }
    }

    /// One attempt at the lock file (`--holders 1`, exclusive or shared).
    async fn acquire_one(&self) -> Result<Attempt, BackendError> {
        // A queued run lets the runs before it go first, whatever the lock file says.
        if self.waits_for()?.is_some() {
            return Ok(Attempt::Busy(self.in_line()?));
        }
        if let Some(busy) = self.lock_at_path()? {
            return Ok(Attempt::Busy(busy));
        }
        // Ours now (with the other shared holders, if shared); a --min-hold deadline left by
        // the last exclusive holder still keeps it.
        let last = Meta::read(&*self.file()?);
        if let Some(left) = last.not_before.as_ref().and_then(NotBefore::left) {
            self.unlock();
            return Ok(Attempt::Busy(Busy {
                holder: last.holder,
                expiry: Expiry::In(left),
            }));
        }
        // Decided under a brief flock on DIR, as a semaphore's runs decide (see `slots`): the
        // fence is raised and the metadata written before DIR is let go.
        let dir = self.paths.lock_dir().await.map_err(|e| self.refused(e))?;
        if let Some(theirs) = slots::other_holders(&self.paths, self.mode()) {
            self.unlock();
            return Ok(Attempt::Mismatch { theirs });
        }
        if self.shared {
            // Free or held shared, but an exclusive run waits: a newcomer goes after it.
            if self.must_let_pass().map_err(|e| self.refused(e))? {
                drop(dir);
                self.unlock();
                return Ok(Attempt::Busy(self.in_line()?));
            }
            return self.join_shared(&dir).await.map_err(|e| self.refused(e));
        }
        // The shared holders are gone; a --min-hold deadline of theirs still keeps it.
        if let Some((holder, left)) = shared::sweep(&self.paths).map_err(|e| self.refused(e))? {
            self.unlock();
            return Ok(Attempt::Busy(Busy {
                holder,
                expiry: Expiry::In(left),
            }));
        }
        let fence = self
            .paths
            .raise_fence_locked(&dir)
            .map_err(|e| self.refused(e))?;
        let meta = self.granted(fence, None);
        let written = meta.write(&*self.file()?);
        written.map_err(|e| self.refused(refused(&self.paths.lock, "write", &e)))?;
        drop(dir);
        *self.held.borrow_mut() = Some(meta);
        Ok(Attempt::Acquired { fence })
    }
}

#[async_trait::async_trait(?Send)]
impl Backend for FileLock {
    fn tenure(&self) -> Tenure {
        Tenure::Kernel
    }

    fn prepare(&self) -> Result<(), Failure> {
        FileLock::prepare(self)
    }

    fn key(&self) -> String {
        self.key.clone()
    }

    fn token(&self) -> String {
        self.token.clone()
    }

    /// Nothing can be on its way to a kernel lock: what may be held is released.
    async fn give_back(&self, timeout: Duration) -> Result<bool, BackendError> {
        self.release(None, timeout, None).await
    }

    /// One attempt; with `listen` (a run that will wait), a busy answer first takes this run's
    /// place in the queue, and a grant leaves it.
    async fn try_acquire(&self, _timings: &Timings, listen: bool) -> Result<Attempt, BackendError> {
        if let Some(meta) = &*self.held.borrow() {
            return Ok(Attempt::Acquired {
                fence: meta.holder.fence.unwrap_or(0),
            });
        }
        if self.holders > 1 {
            return self.acquire_slot().await;
        }
        let attempt = self.acquire_one().await?;
        match &attempt {
            Attempt::Acquired { .. } => self.leave_queue(),
            Attempt::Busy(_) if listen => self.queue_up().await?,
            _ => {}
        }
        Ok(attempt)
    }

    async fn renew(&self, _timings: &Timings, _timeout: Duration) -> Result<bool, BackendError> {
        Ok(self.held.borrow().is_some())
    }

    async fn release(
        &self,
        keep_for: Option<Duration>,
        _timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError> {
        // A run that gives up its wait leaves the queue.
        self.leave_queue();
        let Some(meta) = self.held.borrow_mut().take() else {
            return Ok(false);
        };
        // Under the lock, so that the runs of one NAME are written in the order they held it.
        // Holders that share it (--shared, --holders N) append beside each other, each under
        // the brief flock on DIR, so that the one that finds the history long may cut it: a
        // file renamed over the history while another appends to the one it replaces would
        // lose that record. (A history appended only by such holders used to grow for ever.)
        let alone = !self.shared && self.holders == 1;
        let dir = match (alone, run) {
            (false, Some(_)) => self.paths.lock_dir().await.ok(),
            _ => None,
        };
        let may_trim = alone || dir.is_some();
        let remembered = run.map_or(Ok(()), |run| history::append(&self.paths, run, may_trim));
        drop(dir);
        let released = self.let_go(meta, keep_for);
        crate::backend::unrecorded(&self.name, &released, remembered);
        released
    }

    async fn subscribe(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError> {
        // A blocked flock cannot miss a release: it waits for a state, not a message.
        let wakeups = FileWakeups {
            lock: self,
            pending: Vec::new(),
            passed: Vec::new(),
        };
        Ok((Box::new(wakeups), true))
    }
}

impl FileLock {
    /// Lets go of the lock this run holds (`meta`, what its file said), keeping a
    /// `--min-hold` deadline in the file when there is one.
    fn let_go(&self, mut meta: Meta, keep_for: Option<Duration>) -> Result<bool, BackendError> {
        if self.shared {
            return self.leave_shared(meta, keep_for);
        }
        let file = self.file()?;
        let written = match keep_for {
            Some(hold) => {
                meta.not_before = Some(NotBefore::after(hold));
                meta.write(&file).and_then(|()| self.sync(&file))
            }
            None => file.set_len(0),
        };
        drop(file);
        self.unlock();
        written.map_err(|e| refused(&self.paths.lock, "write", &e))?;
        Ok(true)
    }
}

#[async_trait::async_trait(?Send)]
impl View for FileLock {
    fn tenure(&self) -> Tenure {
        Tenure::Kernel
    }

    async fn inspect(&self) -> Result<Report, BackendError> {
        inspect::report(&self.paths)
    }

    async fn force_release(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        inspect::force_release(&self.paths, &self.name, token)
    }

    async fn history(&self, limit: usize) -> Result<History, BackendError> {
        history::read(&self.paths, limit)
    }

    async fn checks(&self) -> Vec<Check> {
        doctor::check_dir(&self.url, &self.paths.dir, &self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fence of a grant. A new directory's first is the clock's reading in microseconds
    /// (see `fence`): the tests compare the ones after it with it.
    fn granted(attempt: Result<Attempt, BackendError>) -> u64 {
        match attempt {
            Ok(Attempt::Acquired { fence }) => fence,
            other => panic!("not granted: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_second_lock_waits_for_the_first_and_fences_grow() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().display());
        let name = LockName::new("db.migrate-v2").unwrap();
        let t = Timings::new(Duration::from_secs(30), None, None).unwrap();
        let a = FileLock::open(&url, name.clone(), "a").unwrap();
        let b = FileLock::open(&url, name.clone(), "b").unwrap();
        let first = granted(a.try_acquire(&t, false).await);
        let Ok(Attempt::Busy(busy)) = b.try_acquire(&t, true).await else {
            panic!("b got it too")
        };
        assert_eq!(busy.holder.command.as_deref(), Some("a"));
        assert_eq!(busy.expiry, Expiry::WithHolder);
        let report = a.inspect().await.unwrap();
        assert_eq!(report.fence, Some(first));
        assert_eq!(report.held.unwrap().holder.pid, Some(std::process::id()));

        let (mut wakeups, covered) = b.subscribe().await.unwrap();
        assert!(covered);
        assert_eq!(a.release(None, Duration::ZERO, None).await, Ok(true));
        wakeups.next().await.unwrap();
        assert_eq!(granted(b.try_acquire(&t, false).await), first + 1);
        assert_eq!(
            b.release(Some(Duration::from_secs(60)), Duration::ZERO, None)
                .await,
            Ok(true)
        );

        // --min-hold: free of any process, but not before its deadline.
        let Ok(Attempt::Busy(busy)) = a.try_acquire(&t, false).await else {
            panic!("the min-hold deadline was ignored")
        };
        assert!(matches!(busy.expiry, Expiry::In(d) if d > Duration::from_secs(59)));
        let looker = FileLock::at(&url, name.clone(), "status").unwrap();
        assert!(looker.inspect().await.unwrap().held.is_some());
        let Ok(Freed::Released { holders, fence }) = looker.force_release(None).await else {
            panic!("a lock kept by --min-hold only is released by force")
        };
        assert_eq!(holders[0].command.as_deref(), Some("b"));
        assert_eq!(fence, Some(first + 1));
        assert_eq!(granted(a.try_acquire(&t, false).await), first + 2);
        // The counter file holds the top of the block the three came from.
        assert_eq!(
            std::fs::read_to_string(dir.path().join("db.migrate-v2.fence")).unwrap(),
            format!("{}\n", first - 1 + reserve::BLOCK)
        );
        assert_eq!(looker.inspect().await.unwrap().fence, Some(first + 2));
    }
}
