//! Waiting for a `file://` lock: threads blocked in `flock`, each on a descriptor of its own,
//! that tell the waiter when a holder has let go.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::oneshot;

use super::files::{flock, open_existing};
use super::{FileLock, shared, slots};
use crate::backend::{BackendError, Mode, Wakeup, Wakeups};

/// How often a waiter sleeping out a `--min-hold` deadline re-reads the lock file (no process
/// holds the lock then, so nothing wakes it when `release --force` clears the deadline).
pub const MIN_HOLD_RECHECK: Duration = Duration::from_secs(2);

/// Threads blocked in `flock(LOCK_EX)`, each on a descriptor of its own, on the lock file
/// (or each slot of a semaphore): when one returns, a holder has let go, and the waiter tries
/// again. A thread whose file was let go is started again at the next wait; the others keep
/// waiting, holding nothing, until the process exits (one woken meanwhile lets go at once).
///
/// A shared run's thread blocks in `flock(LOCK_SH)`: it returns once no exclusive holder is
/// left, whatever shared holders there are. The kernel gives an exclusive waiter no priority:
/// a shared lock is granted whenever no exclusive one is held, also while an exclusive waiter
/// is blocked, so shared runs whose holds overlap without a gap keep an exclusive run waiting
/// as long as they go on. `file://` keeps flock's order, as `flock -s` and `flock` have it.
pub struct FileWakeups<'a> {
    pub(super) lock: &'a FileLock,
    pub(super) pending: Vec<(PathBuf, oneshot::Receiver<io::Result<()>>)>,
}

impl Wakeups for FileWakeups<'_> {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        let lock = self.lock;
        let files: Vec<PathBuf> = match lock.holders {
            1 => vec![lock.paths.lock.clone()],
            _ => slots::existing_slots(&lock.paths).collect(),
        };
        let operation = lock.operation();
        // A file kept only by --min-hold has no holder to wait for: its deadline is slept
        // out instead, re-read every MIN_HOLD_RECHECK (a `release --force` clears it). For an
        // exclusive run, the shared holders' deadlines keep the lock file too.
        let mut nap: Option<Duration> = None;
        for path in files {
            let kept = open_existing(&path, false)
                .ok()
                .and_then(|file| slots::min_hold_of(&file))
                .or_else(|| match lock.mode() {
                    Mode::Exclusive => shared::kept_for(&lock.paths),
                    _ => None,
                });
            match kept {
                Some(left) => nap = Some(nap.map_or(left, |n| n.min(left))),
                None if self.pending.iter().all(|(p, _)| *p != path) => {
                    let waiting = block_until_free(path.clone(), operation);
                    self.pending.push((path, waiting));
                }
                None => {}
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

/// Starts a thread that opens the lock file, blocks until it can lock it (`operation`:
/// `LOCK_EX`, or `LOCK_SH` for a shared run), and unlocks it at once: it never keeps the lock,
/// so a wait that ends another way (a deadline, a signal) leaves nothing held even while the
/// thread is still blocked. Unlocked, not only closed: the watcher started after the grant
/// holds a copy of this descriptor, which would keep the lock (a slot this run never took)
/// until the run ends.
fn block_until_free(path: PathBuf, operation: libc::c_int) -> oneshot::Receiver<io::Result<()>> {
    let (tx, rx) = oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("flock-wait".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // Signals are the main thread's business.
            let _ = nix::sys::signal::SigSet::all().thread_block();
            // Open for writing: NFS locks only such files exclusively.
            let waited = open_existing(&path, true).and_then(|file| {
                flock(&file, operation)?;
                flock(&file, libc::LOCK_UN)
            });
            let _ = tx.send(waited);
        });
    if let Err(e) = spawned {
        tracing::info!("cannot start a thread to wait for the lock: {e}");
    }
    rx
}
