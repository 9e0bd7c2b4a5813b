//! Waiting for a `file://` lock: threads blocked in `flock`, each on a descriptor of its own,
//! that tell the waiter when a holder, or the waiter before it in the queue, has let go.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::oneshot;

use super::files::{flock, open_existing};
use super::queue::PLACE_RECHECK;
use super::{FileLock, shared, slots};
use crate::backend::{BackendError, Mode, Wakeup, Wakeups};

/// How often a waiter sleeping out a `--min-hold` deadline re-reads the lock file (no process
/// holds the lock then, so nothing wakes it when `release --force` clears the deadline).
pub const MIN_HOLD_RECHECK: Duration = Duration::from_secs(2);

/// Threads blocked in `flock`, each on a descriptor of its own: on the place of the waiter this
/// run lets go first (`LOCK_SH`, granted once that waiter has taken the lock, given up or
/// died; see `queue`), or, with none left, on the lock file (or each slot of a semaphore;
/// `LOCK_EX`, `LOCK_SH` for a shared run). When one returns, or a waiter on a place has slept
/// [`PLACE_RECHECK`] (the one before it may be stopped), the waiter tries again. A thread
/// whose file was let go is started again at the next wait; the others keep waiting, holding
/// nothing, until the process exits (one woken meanwhile lets go at once).
///
/// A thread on a place goes on, once the place is let go, to wait on the lock file, and only
/// that wakes the waiter: the waiter before it leaves its place as it takes the lock, so the
/// lock is busy then all but always, and a waiter that woke to find it so, then started a thread
/// to wait on the lock file, did so on the path of the handoff (a thread started on a busy
/// machine may first run milliseconds later, after the release it was started to see). Should
/// the place have been let go otherwise (its waiter gave up, died, or another before it is
/// still waiting), the waiter tries when the lock file is free, or at its [`PLACE_RECHECK`],
/// and finds the order as it is.
pub struct FileWakeups<'a> {
    pub(super) lock: &'a FileLock,
    pub(super) pending: Vec<(PathBuf, oneshot::Receiver<io::Result<()>>)>,
    /// The places a thread waits on on its way to the lock file (see above): never waited on
    /// by another thread of this run.
    pub(super) passed: Vec<PathBuf>,
}

#[async_trait::async_trait(?Send)]
impl Wakeups for FileWakeups<'_> {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        let lock = self.lock;
        // Should the queue not be readable, the next attempt says why; meanwhile the lock file
        // is waited on.
        let before = lock.waits_for().ok().flatten();
        let files: Vec<PathBuf> = match (lock.holders, &before) {
            (1, None) => vec![lock.paths.lock.clone()],
            (1, Some(place)) => vec![place.clone()],
            _ => slots::existing_slots(&lock.paths).collect(),
        };
        // A waiter's place is held exclusively: a shared flock is granted once it lets go.
        let operation = match before {
            Some(_) => libc::LOCK_SH,
            None => lock.operation(),
        };
        // A waiter on a place looks again every PLACE_RECHECK: should the one before it be
        // stopped, nothing would wake it (see `queue`). A file kept only by --min-hold has no
        // holder to wait for: its deadline is slept out instead, re-read every
        // MIN_HOLD_RECHECK (a `release --force` clears it). For an exclusive run, the shared
        // holders' deadlines keep the lock file too.
        let mut nap: Option<Duration> = before.as_ref().map(|_| PLACE_RECHECK);
        for path in files {
            let kept = match before {
                Some(_) => None,
                None => open_existing(&path, false)
                    .ok()
                    .and_then(|file| slots::min_hold_of(&file))
                    .or_else(|| match lock.mode() {
                        Mode::Exclusive => shared::kept_for(&lock.paths),
                        _ => None,
                    }),
            };
            let waited = |p: &PathBuf| self.pending.iter().any(|(q, _)| q == p);
            match (kept, &before) {
                (Some(left), _) => nap = Some(nap.map_or(left, |n| n.min(left))),
                // A place, then the lock file: one thread, which wakes the waiter at the end
                // (none, should a thread of this run wait on the lock file already).
                (None, Some(_)) if !self.passed.contains(&path) => {
                    let then = (lock.paths.lock.clone(), lock.operation());
                    if !waited(&then.0) {
                        let waiting = block_until_free(path.clone(), operation, Some(then.clone()));
                        self.pending.push((then.0, waiting));
                    }
                    self.passed.push(path);
                }
                (None, None) if !waited(&path) => {
                    let waiting = block_until_free(path.clone(), operation, None);
                    self.pending.push((path, waiting));
                }
                _ => {}
            }
        }
        let nap = async {
            match nap {
                Some(left) => tokio::time::sleep(left.min(MIN_HOLD_RECHECK)).await,
                None => std::future::pending().await,
            }
        };
        if self.pending.is_empty() {
            nap.await;
            return Ok(Wakeup::Anyone);
        }
        let waits = self.pending.iter_mut().map(|(_, rx)| rx);
        let (result, done) = tokio::select! {
            () = nap => return Ok(Wakeup::Anyone),
            (result, done, _) = futures_util::future::select_all(waits) => (result, done),
        };
        let (path, _) = self.pending.remove(done);
        match result {
            Ok(Ok(())) => Ok(Wakeup::Anyone),
            Ok(Err(e)) => Err(BackendError::Transient(format!(
                "cannot wait for {}: {e}",
                path.display()
            ))),
            Err(_) => Err(BackendError::Transient(
                "the thread waiting for the lock could not be started".into(),
            )),
        }
    }
}

/// Starts a thread that opens the file (the lock file, a slot, or a waiter's place), blocks
/// until it can lock it (`operation`: `LOCK_EX`, or `LOCK_SH`), and unlocks it at once: it
/// never keeps the lock, so a wait that ends another way (a deadline, a signal) leaves nothing
/// held even while the thread is still blocked. Unlocked, not only closed: the watcher started
/// after the grant holds a copy of this descriptor, which would keep the lock (a slot this run
/// never took) until the run ends. A file gone (a place its waiter left) is a wake-up at once.
/// With `then` (a place's thread), it waits on that file next, the same way, and tells only
/// once that one is free (or either wait failed).
fn block_until_free(
    path: PathBuf,
    operation: libc::c_int,
    then: Option<(PathBuf, libc::c_int)>,
) -> oneshot::Receiver<io::Result<()>> {
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("flock-wait".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // Signals are the main thread's business.
            let _ = nix::sys::signal::SigSet::all().thread_block();
            let waited = wait_until_free(&path, operation).and_then(|()| match &then {
                Some((next, operation)) => wait_until_free(next, *operation),
                None => Ok(()),
            });
            let _ = tx.send(waited);
        });
    if let Err(e) = spawned {
        tracing::info!("cannot start a thread to wait for the lock: {e}");
    }
    rx
}

/// Blocks until `path` can be locked with `operation`, then lets it go (see
/// [`block_until_free`]).
fn wait_until_free(path: &std::path::Path, operation: libc::c_int) -> io::Result<()> {
    // Open for writing to lock it exclusively: NFS locks only such files so.
    match open_existing(path, operation == libc::LOCK_EX) {
        Ok(file) => flock(&file, operation).and_then(|()| flock(&file, libc::LOCK_UN)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
