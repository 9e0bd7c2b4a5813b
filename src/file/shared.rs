//! `--shared` on `file://`: the lock file is locked with `flock(LOCK_SH)`, as `flock -s` locks
//! it, so any number of shared holders (of either program) hold it at once and an exclusive
//! one (either program without its option) never beside them.
//!
//! The lock file's `key=value` lines are the exclusive holder's: shared holders cannot all
//! write one file. Each shared holder has a file of its own instead, `STEM.shared.TOKEN`,
//! created (`O_EXCL`, never through a link) under the brief flock on DIR when its fence is
//! raised, and holding its metadata. The holder keeps an exclusive flock on it while it holds
//! the lock, so a file whose holder is gone (SIGKILLed: the kernel frees both flocks with it) is
//! told from a live one by the kernel alone, whatever PID namespace the holder or the reader
//! is in. On release the file is removed; with `--min-hold`, it keeps the rest of the deadline
//! instead, unlocked.
//!
//! A shared holder's `--min-hold` keeps the lock from exclusive runs only: shared runs would
//! have run beside it anyway. An exclusive run that gets the lock file honours the deadlines
//! of the shared holders' files, and removes those whose holder is gone and whose deadline (if
//! any) has passed; a shared run removes the same ones before it joins. Both do so under the
//! flock on DIR, under which every shared holder's file is created and locked, so a file is
//! never removed between its creation and its holder's flock.

use std::fs::{self, File};
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::FileLock;
use super::fence::lock_briefly;
use super::files::{Paths, create_afresh, flock, open_existing, refused};
use super::meta::{Meta, NotBefore};
use super::proc_locks::{ProcLocks, locked_in};
use crate::backend::{Attempt, BackendError, Expiry, Holder};

/// A shared holder's file as it stands: what it says, and whether its holder still holds the
/// lock, or only its `--min-hold` deadline keeps it.
pub(super) struct Member {
    pub path: PathBuf,
    pub file: File,
    pub meta: Meta,
    /// `WithHolder` while its holder holds; `In` while only its deadline keeps it; `None` when
    /// its holder is gone (it is left over, for the next run to remove).
    pub expiry: Option<Expiry>,
}

/// The shared holders' files of NAME, each as it stands, in the order of their fences. A file
/// that cannot be opened as ours (a link, a FIFO, one removed meanwhile) is passed over.
pub(super) fn members(paths: &Paths) -> io::Result<Vec<Member>> {
    // Read once a file is found: reading `/proc/locks` can wait for an RCU grace period (ms).
    let mut locks: Option<Option<ProcLocks>> = None;
    let mut members = Vec::new();
    for entry in fs::read_dir(&paths.dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(path) = name
            .to_str()
            .and_then(|name| paths.member_token(name))
            .map(|token| paths.member(token))
        else {
            continue;
        };
        let Ok(file) = open_existing(&path, false) else {
            continue;
        };
        let meta = Meta::read(&file);
        let locks = locks.get_or_insert_with(ProcLocks::read);
        let expiry = if locked_in(locks.as_ref(), &file)? {
            Some(Expiry::WithHolder)
        } else {
            meta.not_before
                .as_ref()
                .and_then(NotBefore::left)
                .map(Expiry::In)
        };
        members.push(Member {
            path,
            file,
            meta,
            expiry,
        });
    }
    members.sort_by_key(|m| m.meta.holder.fence);
    Ok(members)
}

/// Whether a shared holder holds NAME (what a semaphore's run is refused for).
pub(super) fn any_live(paths: &Paths) -> bool {
    members(paths).is_ok_and(|all| all.iter().any(|m| m.expiry == Some(Expiry::WithHolder)))
}

/// Called under the flock on DIR: removes the files of shared holders that are gone and whose
/// deadline, if any, has passed; returns the holder whose `--min-hold` deadline keeps NAME
/// from exclusive runs longest, and for how long.
pub(super) fn sweep(paths: &Paths) -> Result<Option<(Holder, Duration)>, BackendError> {
    let all = members(paths).map_err(|e| refused(&paths.dir, "read", &e))?;
    let mut kept: Option<(Holder, Duration)> = None;
    for member in all {
        match member.expiry {
            // A live holder. (For an exclusive run, which holds the lock file: one killed an
            // instant ago, whose flock on the lock file was freed before the one on its own
            // file; the next run removes its file.)
            Some(Expiry::WithHolder) => {}
            Some(expiry) => {
                if kept.as_ref().is_none_or(|(_, left)| *left < expiry.left()) {
                    kept = Some((member.meta.holder, expiry.left()));
                }
            }
            // Not ours to remove in a sticky directory: it stays, harmless.
            None => drop(fs::remove_file(&member.path)),
        }
    }
    Ok(kept)
}

/// How long the shared holders' `--min-hold` deadlines keep NAME from an exclusive run, if at
/// all (no process holds it for them, so no flock wakes its waiter).
pub(super) fn kept_for(paths: &Paths) -> Option<Duration> {
    members(paths)
        .ok()?
        .into_iter()
        .filter_map(|m| match m.expiry {
            Some(Expiry::In(left)) => Some(left),
            _ => None,
        })
        .max()
}

/// The shared holder to name to a run that finds NAME held: the first live one by its fence.
pub(super) fn first_live(paths: &Paths) -> Option<Holder> {
    members(paths)
        .ok()?
        .into_iter()
        .find(|m| m.expiry == Some(Expiry::WithHolder))
        .map(|m| m.meta.holder)
}

impl FileLock {
    /// Joins the shared holders: called holding the lock file shared, under the flock on DIR
    /// (`dir`). The fence is raised, then this holder's file created, locked and written.
    pub(super) async fn join_shared(&self, dir: &File) -> Result<Attempt, BackendError> {
        sweep(&self.paths)?;
        let fence = self.paths.raise_fence_locked(dir)?;
        let path = self.paths.member(&self.token);
        let file = create_member(&path).map_err(|e| refused(&path, "create", &e))?;
        // Only a reader's instant of LOCK_SH (`status`, in a container) can be in the way.
        let meta = self.granted(fence, None);
        let made = match lock_briefly(&file).await {
            Ok(()) => meta.write(&file).map_err(|e| refused(&path, "write", &e)),
            Err(e) => Err(refused(&path, "lock", &e)),
        };
        if let Err(e) = made {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        *self.member.borrow_mut() = Some(file);
        *self.held.borrow_mut() = Some(meta);
        Ok(Attempt::Acquired { fence })
    }

    /// Leaves the shared holders: this holder's file is removed, or, with `keep_for`, keeps
    /// the deadline for exclusive runs to honour; then both flocks are let go.
    pub(super) fn leave_shared(
        &self,
        mut meta: Meta,
        keep_for: Option<Duration>,
    ) -> Result<bool, BackendError> {
        let path = self.paths.member(&self.token);
        let member = self.member.borrow_mut().take();
        let written = match (keep_for, &member) {
            (Some(hold), Some(file)) => {
                meta.not_before = Some(NotBefore::after(hold));
                meta.write(file).and_then(|()| self.sync(file))
            }
            _ => match fs::remove_file(&path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            },
        };
        // Unlocked, not only closed: the watcher keeps a copy of both descriptors until the
        // job is gone, and this holder's file must not look live meanwhile.
        if let Some(file) = &member {
            let _ = flock(file, libc::LOCK_UN);
        }
        self.unlock();
        written.map_err(|e| refused(&path, "write", &e))?;
        Ok(true)
    }
}

/// Creates a shared holder's file (see [`create_afresh`]). Named after this run's token: only
/// an attempt of this run that failed can have left one under the same name.
fn create_member(path: &std::path::Path) -> io::Result<File> {
    create_afresh(path)
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
    use crate::backend::{Backend, Freed, Mode, View};
    use crate::lease::Timings;
    use crate::name::LockName;

    fn timings() -> Timings {
        Timings::new(Duration::from_secs(30), None, None).unwrap()
    }

    fn lock(dir: &tempfile::TempDir, command: &str, shared: bool) -> FileLock {
        let url = format!("file://{}", dir.path().display());
        FileLock::open(&url, LockName::new("job").unwrap(), command)
            .unwrap()
            .with_shared(shared)
    }

    fn member_files(dir: &tempfile::TempDir) -> usize {
        fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with("job.shared.")
            })
            .count()
    }

    #[tokio::test]
    async fn shared_holders_hold_together_and_keep_an_exclusive_run_out() {
        let dir = tempfile::tempdir().unwrap();
        let t = timings();
        let (a, b) = (lock(&dir, "a", true), lock(&dir, "b", true));
        let writer = lock(&dir, "w", false);
        let first = granted(a.try_acquire(&t, false).await);
        assert_eq!(granted(b.try_acquire(&t, false).await), first + 1);
        let Ok(Attempt::Busy(busy)) = writer.try_acquire(&t, false).await else {
            panic!("an exclusive run got in beside shared holders")
        };
        assert_eq!(
            busy.holder.command.as_deref(),
            Some("a"),
            "the first by fence"
        );
        assert_eq!(busy.expiry, Expiry::WithHolder);

        let report = writer.inspect().await.unwrap();
        assert!(report.shared);
        assert_eq!(report.limit, Some(1));
        let fences: Vec<_> = report.holders.iter().map(|s| s.busy.holder.fence).collect();
        assert_eq!(fences, [Some(first), Some(first + 1)]);
        assert_eq!(report.holders[1].token, Some(b.token()));
        assert_eq!(report.held.unwrap().holder.command.as_deref(), Some("a"));
        let Ok(Freed::Kept(why)) = writer.force_release(None).await else {
            panic!("a live shared holder was released by force")
        };
        assert!(why.contains("(a)"), "{why}");

        let (mut wakeups, _) = writer.subscribe().await.unwrap();
        assert_eq!(a.release(None, Duration::ZERO, None).await, Ok(true));
        assert!(matches!(
            writer.try_acquire(&t, false).await,
            Ok(Attempt::Busy(_))
        ));
        assert_eq!(b.release(None, Duration::ZERO, None).await, Ok(true));
        wakeups.next().await.unwrap();
        assert_eq!(member_files(&dir), 0, "a holder's file goes with it");
        assert_eq!(granted(writer.try_acquire(&t, false).await), first + 2);
        let report = writer.inspect().await.unwrap();
        assert!(!report.shared);
        assert_eq!(report.holders.len(), 1);
    }

    #[tokio::test]
    async fn a_shared_run_waits_for_the_exclusive_holder() {
        let dir = tempfile::tempdir().unwrap();
        let t = timings();
        let writer = lock(&dir, "w", false);
        let reader = lock(&dir, "r", true);
        let first = granted(writer.try_acquire(&t, false).await);
        let Ok(Attempt::Busy(busy)) = reader.try_acquire(&t, false).await else {
            panic!("a shared run got in beside an exclusive holder")
        };
        assert_eq!(busy.holder.command.as_deref(), Some("w"));
        let (mut wakeups, _) = reader.subscribe().await.unwrap();
        assert_eq!(writer.release(None, Duration::ZERO, None).await, Ok(true));
        wakeups.next().await.unwrap();
        assert_eq!(granted(reader.try_acquire(&t, false).await), first + 1);
        // A semaphore's run is of another mode; a shared run beside slots likewise.
        let semaphore = lock(&dir, "s", false).with_holders(2);
        assert_eq!(
            semaphore.try_acquire(&t, false).await,
            Ok(Attempt::Mismatch {
                theirs: Mode::Shared
            })
        );
        assert_eq!(reader.release(None, Duration::ZERO, None).await, Ok(true));
        assert_eq!(granted(semaphore.try_acquire(&t, false).await), first + 2);
        assert_eq!(
            lock(&dir, "r2", true).try_acquire(&t, false).await,
            Ok(Attempt::Mismatch {
                theirs: Mode::Holders(2)
            })
        );
    }

    #[tokio::test]
    async fn a_shared_min_hold_keeps_exclusive_runs_out_until_released_by_force() {
        let dir = tempfile::tempdir().unwrap();
        let t = timings();
        let a = lock(&dir, "a", true);
        let writer = lock(&dir, "w", false);
        let first = granted(a.try_acquire(&t, false).await);
        let keep = Some(Duration::from_secs(60));
        assert_eq!(a.release(keep, Duration::ZERO, None).await, Ok(true));
        // Shared runs would have run beside it: they still may.
        let b = lock(&dir, "b", true);
        assert_eq!(granted(b.try_acquire(&t, false).await), first + 1);
        assert_eq!(b.release(None, Duration::ZERO, None).await, Ok(true));
        let Ok(Attempt::Busy(busy)) = writer.try_acquire(&t, false).await else {
            panic!("the shared holder's min-hold deadline was ignored")
        };
        assert_eq!(busy.holder.command.as_deref(), Some("a"));
        assert!(matches!(busy.expiry, Expiry::In(d) if d > Duration::from_secs(59)));

        let report = writer.inspect().await.unwrap();
        assert!(report.shared);
        assert_eq!(report.holders.len(), 1);
        assert!(matches!(report.held.unwrap().expiry, Expiry::In(_)));
        assert_eq!(
            writer.force_release(Some("no such token")).await,
            Ok(Freed::Released {
                holders: vec![],
                fence: Some(first + 1)
            })
        );
        let Ok(Freed::Released { holders, .. }) = writer.force_release(Some(&a.token())).await
        else {
            panic!("a shared holder's deadline is released by force")
        };
        assert_eq!(holders[0].command.as_deref(), Some("a"));
        assert_eq!(granted(writer.try_acquire(&t, false).await), first + 2);
    }

    #[tokio::test]
    async fn the_file_of_a_shared_holder_that_died_is_ignored_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let t = timings();
        let paths = Paths::new(dir.path(), &LockName::new("job").unwrap());
        // What a SIGKILLed holder leaves: its file, which nobody holds.
        let dead = paths.member(&uuid::Uuid::new_v4().to_string());
        fs::write(&dead, "host=h\npid=1\ncommand=dead\nfence=7\n").unwrap();
        // Not a holder's file: another NAME's, or not named after a token.
        let other = dir.path().join("job.shared.x.lock");
        fs::write(&other, "").unwrap();
        let writer = lock(&dir, "w", false);
        let report = writer.inspect().await.unwrap();
        assert_eq!(report.held, None);
        assert!(!report.shared);
        granted(writer.try_acquire(&t, false).await);
        assert!(!dead.exists(), "swept under the flock on DIR");
        assert!(other.exists());
    }
}
