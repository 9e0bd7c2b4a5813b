//! Arrival order on `file://`, across both modes. The kernel gives a waiting `flock(LOCK_EX)` no
//! priority over a `LOCK_SH` asked for after it: shared runs whose holds overlap would keep an
//! exclusive waiter out for as long as they went on. So a run that must wait takes a place in a
//! queue first, and goes only once the places before its own that it must let pass are gone:
//! an exclusive run waits for every one, a shared run for the exclusive ones (the shared waiters
//! between two exclusive ones go together).
//!
//! - A place is a file, `STEM.wait.TICKET.MODE` (`exclusive` or `shared`), created (`O_EXCL`) and
//!   flocked by its waiter under the brief flock on DIR, its ticket one more than any before
//!   (counted in `STEM.queue`). Its flock is what keeps it: a waiter that dies (SIGKILL) lets go
//!   of it with its process, and a place that nobody holds counts for nothing (the next run to
//!   take a place removes it). A waiter leaves its place when it takes the lock, or gives up.
//! - A waiter sleeps in `flock(LOCK_SH)` on the place it waits for (woken when that waiter takes
//!   the lock, gives up or dies), or on the lock file once no place it must let pass is left.
//!   A waiter that is stopped (SIGSTOP, Ctrl-Z) keeps its place but is passed over while it is:
//!   nothing wakes the one behind it then, so a waiter on a place looks again every
//!   [`PLACE_RECHECK`].
//! - A shared newcomer that can lock the lock file (free, or held shared) must still not pass an
//!   exclusive waiter: each exclusive waiter holds `STEM.queue` shared while it waits, and a
//!   shared run tries `STEM.queue` exclusively for an instant, under the flock on DIR (so two
//!   shared runs never mistake each other's try for a waiter), before it joins the holders.
//!   Busy means an exclusive run waits: a `-n` run is refused (75), another takes a place.
//! - An exclusive newcomer that finds the lock file free takes it, with no look at the queue:
//!   the lock file is free while runs wait only in the instant between a release and the next
//!   waiter's wake-up (longer, up to [`PLACE_RECHECK`], when the head of the queue is stopped),
//!   and an exclusive run on a free lock costs one `flock`, as before.
//! - `flock(1)` knows nothing of the queue: a `flock -s` may pass an exclusive waiter, and
//!   waiters of `flock` are served in the kernel's order.
//! - `STEM.queue` is never removed: a run that had opened it would test a file nobody locks.

use std::cmp::Reverse;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use super::FileLock;
use super::fence::lock_briefly_as;
use super::files::{Paths, create_afresh, flock, open_existing, plain_file, refused};
use super::meta::Meta;
use super::proc_locks::{ProcLocks, held_by_stopped, locked_in};
use crate::backend::BackendError;

/// How often a waiter sleeping on another's place looks again, should that one be stopped.
pub const PLACE_RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// This run's place in the queue, held while it waits.
pub(super) struct Place {
    path: PathBuf,
    ticket: u64,
    file: File,
    /// An exclusive waiter's `STEM.queue`, locked shared while it waits: what a shared
    /// newcomer looks for.
    flag: Option<File>,
}

impl Drop for Place {
    /// Leaves the queue: the place is removed, then unlocked (a waiter that looks for it by
    /// name afterwards finds nothing; one that had opened it wakes when it is unlocked).
    /// Unlocked, not only closed: a process forked meanwhile would keep a copy of the
    /// descriptors, and with them the place.
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        let _ = flock(&self.file, libc::LOCK_UN);
        if let Some(flag) = &self.flag {
            let _ = flock(flag, libc::LOCK_UN);
        }
    }
}

/// A place found in DIR: its file, ticket and mode.
struct Seen {
    path: PathBuf,
    ticket: u64,
    shared: bool,
}

impl Paths {
    /// `STEM.queue`: the last ticket given, and what exclusive waiters lock shared.
    pub fn queue(&self) -> PathBuf {
        self.dir.join(format!("{}.queue", self.stem))
    }

    fn place(&self, ticket: u64, shared: bool) -> PathBuf {
        let mode = if shared { "shared" } else { "exclusive" };
        self.dir.join(format!("{}.wait.{ticket}.{mode}", self.stem))
    }

    /// The ticket and mode (shared or not) of a place of this NAME, from its file name:
    /// `STEM.wait.`, digits, `.exclusive` or `.shared`, nothing more. No other NAME's file has
    /// such a name: none of a NAME's files ends in `.exclusive` or `.shared` but its places,
    /// whose stem is what is left once the ticket and mode are taken off the end.
    fn place_of(&self, file_name: &str) -> Option<(u64, bool)> {
        let rest = file_name
            .strip_prefix(self.stem.as_str())?
            .strip_prefix(".wait.")?;
        let (ticket, mode) = rest.split_once('.')?;
        let shared = match mode {
            "shared" => true,
            "exclusive" => false,
            _ => return None,
        };
        if !ticket.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some((ticket.parse().ok()?, shared))
    }

    /// The places in DIR, in no order.
    fn places(&self) -> Result<Vec<Seen>, BackendError> {
        let mut seen = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| refused(&self.dir, "read", &e))?;
        for entry in entries {
            let entry = entry.map_err(|e| refused(&self.dir, "read", &e))?;
            let name = entry.file_name();
            if let Some((ticket, shared)) = name.to_str().and_then(|n| self.place_of(n)) {
                seen.push(Seen {
                    path: entry.path(),
                    ticket,
                    shared,
                });
            }
        }
        Ok(seen)
    }

    /// A new place at the end of the queue, locked, with `meta` in it (`status` counts its
    /// waiter); an exclusive one also holds `STEM.queue` shared. Called under the flock on DIR:
    /// tickets are given one at a time, and a place is never seen between its creation and its
    /// flock. Places whose waiter is gone are removed on the way.
    async fn take_place(&self, shared: bool, meta: &Meta) -> Result<Place, BackendError> {
        let queue = self.queue();
        let counter = open_queue(&queue).map_err(|e| refused(&queue, "open", &e))?;
        let mut last = read_ticket(&counter);
        for seen in self.places()? {
            // Only a place that opens as ours counts: another user's in a sticky directory
            // counts for nothing, also for the tickets (one planted with the largest ticket
            // would otherwise end them, and with them the order). Of ours, one that nobody
            // holds is removed.
            let Ok(file) = open_existing(&seen.path, false) else {
                continue;
            };
            last = last.max(seen.ticket);
            // Told by an instant's shared try, not by /proc/locks: this runs under the flock
            // on DIR, which the next holder's grant needs too, and a reading of /proc/locks
            // waits for an RCU grace period (10-20 ms), which a handoff would then wait out.
            if !locked_in(None, &file).unwrap_or(true) {
                let _ = fs::remove_file(&seen.path);
            }
        }
        let ticket = last.checked_add(1).ok_or_else(|| {
            BackendError::Refused(format!(
                "the queue's tickets in {} have run out (a place or {} says {last}); remove \
                 the NAME's .wait.* files and its .queue file while nothing waits",
                self.dir.display(),
                queue.display()
            ))
        })?;
        let text = format!("{ticket}\n");
        // No fsync: a queue does not outlive its waiters' processes, nor a reboot.
        let written = counter
            .write_all_at(text.as_bytes(), 0)
            .and_then(|()| counter.set_len(text.len() as u64));
        written.map_err(|e| refused(&queue, "write", &e))?;
        let path = self.place(ticket, shared);
        let file = create_place(&path).map_err(|e| refused(&path, "create", &e))?;
        // Locked before anything can fail, so that the place is removed (by its Drop) if
        // anything does.
        let mut place = Place {
            path,
            ticket,
            file,
            flag: None,
        };
        // Only an instant's try of another run (is this place live?) can be in the way.
        lock_briefly_as(&place.file, libc::LOCK_EX)
            .await
            .map_err(|e| refused(&place.path, "lock", &e))?;
        meta.write(&place.file)
            .map_err(|e| refused(&place.path, "write", &e))?;
        if !shared {
            // Shared runs try it exclusively only under the flock on DIR, which this run holds.
            lock_briefly_as(&counter, libc::LOCK_SH)
                .await
                .map_err(|e| refused(&queue, "lock", &e))?;
            place.flag = Some(counter);
        }
        Ok(place)
    }

    /// Whether an exclusive run waits in the queue (it holds `STEM.queue` shared). Called
    /// under the flock on DIR, so that the exclusive try is never another shared run's.
    fn exclusive_waits(&self) -> Result<bool, BackendError> {
        let queue = self.queue();
        let file = match open_existing(&queue, false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(refused(&queue, "open", &e)),
        };
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => {
                let _ = flock(&file, libc::LOCK_UN);
                Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(true),
            Err(e) => Err(refused(&queue, "lock", &e)),
        }
    }

    /// The pids of the live places' waiters, for `status`.
    pub(super) fn queued_pids(&self) -> Vec<u32> {
        let locks = ProcLocks::read();
        let Ok(places) = self.places() else {
            return Vec::new();
        };
        places
            .iter()
            .filter_map(|seen| {
                let file = open_existing(&seen.path, false).ok()?;
                let live = locked_in(locks.as_ref(), &file).unwrap_or(false);
                live.then(|| Meta::read(&file).holder.pid).flatten()
            })
            .collect()
    }
}

/// Whether a waiter holds `seen` (a place whose waiter is gone is unlocked) and can take its
/// turn. One that cannot be opened as ours (a link, another user's in a sticky directory)
/// counts for nothing; so does one whose waiter is stopped (SIGSTOP, Ctrl-Z), while it is: it
/// could not go, and those behind it go on, as they would past a Redis waiter whose place
/// lapsed (resumed, it goes when it finds nothing before it).
fn live(locks: Option<&ProcLocks>, seen: &Seen) -> bool {
    let Ok(file) = open_existing(&seen.path, false) else {
        return false;
    };
    locked_in(locks, &file).unwrap_or(false) && !locks.is_some_and(|l| held_by_stopped(l, &file))
}

/// Opens (creating it) `STEM.queue`, never through a link, refusing another user's where it
/// could be swapped (as a lock file is).
fn open_queue(path: &std::path::Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(super::files::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    plain_file(path, file)
}

/// The last ticket given; 0 for none, or for a counter that is not one (the places in DIR
/// still keep tickets growing).
fn read_ticket(mut counter: &File) -> u64 {
    let mut text = String::new();
    let _ = counter.by_ref().take(64).read_to_string(&mut text);
    text.trim().parse().unwrap_or(0)
}

/// Creates a place (see [`create_afresh`]). One left under the same name (its counter was
/// removed, and tickets began again) was no live waiter's: tickets only grow past every place
/// in DIR.
fn create_place(path: &std::path::Path) -> io::Result<File> {
    create_afresh(path)
}

impl FileLock {
    /// Takes a place in the queue for a run that will wait, unless it has one: called on every
    /// busy answer to a waiting run, so the place is taken at its first.
    pub(super) async fn queue_up(&self) -> Result<(), BackendError> {
        if self.place.borrow().is_some() {
            return Ok(());
        }
        let dir = self.paths.lock_dir().await?;
        let meta = Meta {
            holder: self.holder.clone(),
            ..Meta::default()
        };
        let place = self.paths.take_place(self.shared, &meta).await?;
        drop(dir);
        *self.place.borrow_mut() = Some(place);
        Ok(())
    }

    /// Leaves the queue (when the lock is taken, or the wait given up).
    pub(super) fn leave_queue(&self) {
        drop(self.place.borrow_mut().take());
    }

    /// The place this queued run waits for: the nearest live one before its own that it must
    /// let pass (any, for an exclusive run; an exclusive one, for a shared run). `None` when
    /// there is none, or this run has no place.
    pub(super) fn waits_for(&self) -> Result<Option<PathBuf>, BackendError> {
        let Some(ticket) = self.place.borrow().as_ref().map(|p| p.ticket) else {
            return Ok(None);
        };
        let mut before: Vec<Seen> = self
            .paths
            .places()?
            .into_iter()
            .filter(|seen| seen.ticket < ticket && !(self.shared && seen.shared))
            .collect();
        // The head of the queue, and every waiter whose turn has come, has none before it:
        // `/proc/locks` (a read of it waits for an RCU grace period) stays off the handoff.
        if before.is_empty() {
            return Ok(None);
        }
        before.sort_by_key(|seen| Reverse(seen.ticket));
        let locks = ProcLocks::read();
        Ok(before
            .into_iter()
            .find(|seen| live(locks.as_ref(), seen))
            .map(|seen| seen.path))
    }

    /// Whether an exclusive run waits that this shared newcomer must not pass. Called under
    /// the flock on DIR; a run with a place goes by the places alone (the exclusive waiters
    /// behind it hold the same flag).
    pub(super) fn must_let_pass(&self) -> Result<bool, BackendError> {
        match self.place.borrow().is_some() {
            true => Ok(false),
            false => self.paths.exclusive_waits(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Attempt, Backend};
    use crate::lease::Timings;
    use crate::name::LockName;
    use std::time::Duration;

    fn lock(dir: &tempfile::TempDir, command: &str, shared: bool) -> FileLock {
        let url = format!("file://{}", dir.path().display());
        FileLock::open(&url, LockName::new("job").unwrap(), command)
            .unwrap()
            .with_shared(shared)
    }

    fn acquired(attempt: Result<Attempt, BackendError>) -> bool {
        matches!(attempt, Ok(Attempt::Acquired { .. }))
    }

    /// Readers that come after a queued writer wait for it, though the lock is held shared;
    /// the writer goes once the reader that held when it came lets go; a place whose waiter is
    /// gone counts for nothing.
    #[tokio::test]
    async fn a_shared_newcomer_never_passes_a_queued_exclusive_waiter() {
        let dir = tempfile::tempdir().unwrap();
        let t = Timings::new(Duration::from_secs(30), None, None).unwrap();
        let (r0, w) = (lock(&dir, "r0", true), lock(&dir, "w", false));
        assert!(acquired(r0.try_acquire(&t, false).await));
        assert!(!acquired(w.try_acquire(&t, true).await), "queued");
        let (late, dropped) = (lock(&dir, "late", true), lock(&dir, "dropped", true));
        assert!(!acquired(late.try_acquire(&t, false).await), "-n --shared");
        assert!(
            !acquired(late.try_acquire(&t, true).await),
            "queued behind w"
        );
        assert!(!acquired(dropped.try_acquire(&t, true).await));
        assert_eq!(
            late.waits_for().unwrap(),
            w.place.borrow().as_ref().map(|p| p.path.clone())
        );
        // status counts each waiter (all three are this process: a pid is listed per place).
        assert_eq!(w.paths.queued_pids().len(), 3);
        drop(dropped);

        assert_eq!(r0.release(None, Duration::ZERO, None).await, Ok(true));
        assert!(acquired(w.try_acquire(&t, true).await));
        assert_eq!(late.waits_for().unwrap(), None, "w left the queue");
        assert!(!acquired(late.try_acquire(&t, true).await), "w holds");
        assert_eq!(w.release(None, Duration::ZERO, None).await, Ok(true));
        assert!(acquired(late.try_acquire(&t, true).await));
        // The queue is empty again: only its counter is left.
        let left: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with("job.wait."))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn places_are_told_from_every_other_file_of_every_name() {
        let dir = std::path::Path::new("/locks");
        let paths = Paths::new(dir, &LockName::new("job").unwrap());
        assert_eq!(paths.place_of("job.wait.7.shared"), Some((7, true)));
        assert_eq!(paths.place_of("job.wait.12.exclusive"), Some((12, false)));
        assert_eq!(
            paths.place(12, false),
            PathBuf::from("/locks/job.wait.12.exclusive")
        );
        for other in [
            "job.lock",
            "job.lock.3",
            "job.fence",
            "job.queue",
            "job.wait..shared",
            "job.wait.7.shared.lock",
            "job.wait.x.shared",
            "job.wait.+7.shared",
            "job.wait.7.wait.8.shared",
            "jobs.wait.7.shared",
            "job.shared.1b4e28ba-2fa1-11d2-883f-0016d3cca427",
        ] {
            assert_eq!(paths.place_of(other), None, "{other}");
        }
    }
}
