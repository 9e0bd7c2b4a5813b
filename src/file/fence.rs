//! The fence counter of a `file://` lock: `DIR/STEM.fence`, the top of the block of tokens last
//! reserved, written durably before any token of it is issued; the tokens are issued under the
//! lock (and a brief flock on DIR), counted in the block as `reserve` says, and always past
//! the largest fence the NAME's history shows: a counter restored from a copy, deleted or set
//! back by hand does not give a token of a run the history remembers again.
//!
//! The counter and the history are restored with the directory, so neither can say what was
//! issued after the copy was made (one block reserved since, at a reboot, a remount or an
//! earlier restore of the same copy, and its tokens came again). What a restore cannot take
//! back is the wall clock: a new block starts at least at the clock's reading in microseconds
//! since the Unix epoch, and no token is issued before the clock has reached it. Fences are
//! issued once per run, far below one per microsecond, so every token is at most the clock's
//! reading when it was issued, and the first token after any restore is above every token
//! issued before it, unless the clock was set back past the time of that token. A machine
//! without a real-time clock that boots in 1970 must have its clock set before its runs.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use super::files::{Paths, flock, open_existing, refused};
use super::reserve::{BLOCK, Epoch, Record};
use crate::backend::{BackendError, MAX_FENCE};

/// The wall clock in microseconds since the Unix epoch: the least a new block starts at.
fn clock_us() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_micros() as u64)
}

/// How far ahead of the clock a token may be and still be waited for: a block reserved when
/// the one before it was left within microseconds of its reservation (its count not believed)
/// starts past that block's top, at most a block ahead. Further ahead (the clock was set back,
/// a counter or a history record set forward by hand), the token is issued at once: what it is
/// past rests on the counter and the history alone.
const WAIT_FOR_CLOCK_US: u64 = 2 * BLOCK;

/// Returns `token` once the clock has reached it (see the module's notes), which it has
/// unless a block was reserved ahead of the clock moments ago: then after at most
/// [`WAIT_FOR_CLOCK_US`], under the lock.
fn when_the_clock_reaches(token: u64) -> u64 {
    let ahead = token.saturating_sub(clock_us());
    if ahead > 0 && ahead <= WAIT_FOR_CLOCK_US {
        std::thread::sleep(Duration::from_micros(ahead));
    }
    token
}

/// What the counter file tells of the tokens issued.
pub enum Reading {
    /// The last token issued.
    Last(u64),
    /// No token issued is above this: the top of the last block reserved.
    AtMost(u64),
}

impl Paths {
    /// The counter file, open for reading, if it exists.
    fn open_counter(&self) -> Result<Option<File>, BackendError> {
        match open_existing(&self.fence, false) {
            Ok(file) => Ok(Some(file)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(refused(&self.fence, "read", &e)),
        }
    }

    /// What the counter file says: the top of the last block reserved (the last token issued,
    /// when the previous release wrote it).
    fn counter_value(&self, file: &File) -> Result<u64, BackendError> {
        let mut text = String::new();
        // A counter is a number and a newline: what is beyond 64 bytes is not one.
        file.take(64)
            .read_to_string(&mut text)
            .map_err(|e| refused(&self.fence, "read", &e))?;
        text.trim().parse().map_err(|_| {
            BackendError::Refused(format!(
                "{} holds {:?}, not a fence counter: it was changed by hand? Write the \
                 largest token ever issued into it (or remove it to restart at 1)",
                self.fence.display(),
                text.chars().take(40).collect::<String>()
            ))
        })
    }

    /// The last fence token issued, if any: the count of the block, while it holds (see
    /// `reserve`); else the counter file's value, above which the next token goes.
    pub fn read_fence(&self) -> Result<Option<u64>, BackendError> {
        Ok(self.read_counter()?.map(|reading| match reading {
            Reading::Last(fence) | Reading::AtMost(fence) => fence,
        }))
    }

    /// The counter, read as what it can tell: the last token issued while the block's count
    /// holds (this boot and mount wrote it); else only the block's top, which no token issued
    /// exceeds (after a reboot, through another mount of DIR, on a file system without user
    /// extended attributes).
    pub fn read_counter(&self) -> Result<Option<Reading>, BackendError> {
        let Some(file) = self.open_counter()? else {
            return Ok(None);
        };
        let top = self.counter_value(&file)?;
        let meta = file
            .metadata()
            .map_err(|e| refused(&self.fence, "read", &e))?;
        let counted = Epoch::of(&file)
            .zip(Record::read(&file))
            .filter(|(now, record)| record.holds(top, now, &meta));
        Ok(Some(counted.map_or(Reading::AtMost(top), |(_, record)| {
            Reading::Last(record.last)
        })))
    }

    /// A brief exclusive flock on DIR itself, held until the returned file is dropped: what
    /// the fence is raised under, and what a semaphore's runs decide their slots under.
    pub async fn lock_dir(&self) -> Result<File, BackendError> {
        let dir = File::open(&self.dir).map_err(|e| refused(&self.dir, "open", &e))?;
        lock_briefly(&dir)
            .await
            .map_err(|e| refused(&self.dir, "lock", &e))?;
        Ok(dir)
    }

    /// Issues the next fence token. Called under the lock, and under the flock on the
    /// directory itself ([`Paths::lock_dir`]): should two processes ever both hold NAME (its
    /// lock file deleted while held), they still never get the same token. From the block the
    /// counter file reserves, without a write to disk, while its record holds (see `reserve`);
    /// else from a new block, reserved durably first. Either way past the largest fence of
    /// the history's newest records, a new block past the largest of its whole tail and the
    /// clock (see the module's notes), and never past [`MAX_FENCE`].
    pub fn raise_fence_locked(&self, dir: &File) -> Result<u64, BackendError> {
        let counter = self.open_counter()?;
        let top = match &counter {
            Some(file) => self.counter_value(file)?,
            None => 0,
        };
        let shown = super::history::newest_fence(self).unwrap_or(0);
        if let Some(file) = &counter {
            let meta = file
                .metadata()
                .map_err(|e| refused(&self.fence, "read", &e))?;
            if let (Some(now), Some(record)) = (Epoch::of(file), Record::read(file)) {
                let next = record
                    .next(top, &now, &meta)
                    .map(|next| next.max(shown.saturating_add(1)))
                    .filter(|&next| next <= top && next <= MAX_FENCE);
                if let Some(next) = next {
                    // Counted before the token is used; a count that cannot be set is a block
                    // reserved instead.
                    let counted = Record {
                        last: next,
                        ..record
                    };
                    if counted.write(file).is_ok() {
                        return Ok(when_the_clock_reaches(next));
                    }
                }
            }
        }
        let largest = super::history::largest_fence(self).ok().flatten();
        let floor = top.max(shown).max(largest.unwrap_or(0)).max(clock_us());
        let next = self.reserve_block(dir, floor)?;
        Ok(when_the_clock_reaches(next))
    }

    /// Issues `floor + 1`, the first token of a new block, once the block's top is on disk: a
    /// temporary file, fsync, rename over the counter, fsync of the directory; then the count
    /// is set, for the runs after to count from. `floor`: the largest of the counter's value,
    /// the largest fence the history shows, and the clock. The block ends at [`MAX_FENCE`] at
    /// the latest, and none is reserved past it.
    fn reserve_block(&self, dir: &File, floor: u64) -> Result<u64, BackendError> {
        let next = floor
            .checked_add(1)
            .filter(|&next| next <= MAX_FENCE)
            .ok_or_else(|| {
                BackendError::Refused(format!(
                    "{} is at its maximum ({MAX_FENCE})",
                    self.fence.display()
                ))
            })?;
        let new_top = floor.saturating_add(BLOCK).min(MAX_FENCE);
        // What a reservation killed mid-way (SIGKILL) left a minute or more ago.
        super::files::remove_stale(&self.dir, &format!(".{}.fence.", self.stem), ".tmp");
        let tmp_path = self.temporary("fence");
        let write = || -> io::Result<()> {
            // A fresh file (O_EXCL) of a name no other run uses: never one that a link planted
            // under it points at, nor one another user left where only they may remove it.
            let mut tmp = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(super::files::FILE_MODE)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp_path)?;
            tmp.write_all(format!("{new_top}\n").as_bytes())?;
            tmp.sync_all()?;
            fs::rename(&tmp_path, &self.fence)?;
            dir.sync_all()?;
            // Counted only once the block is on disk: a run killed before this line leaves a
            // counter without a count, and the run after it reserves (and syncs) again.
            // Without a count (no user extended attributes here), the next run reserves too.
            if let Some(epoch) = Epoch::of(&tmp) {
                let record = Record {
                    epoch,
                    top: new_top,
                    last: next,
                    stamp: Default::default(),
                };
                let _ = record.write(&tmp);
            }
            Ok(())
        };
        write().map_err(|e| {
            // Not left behind for the next user to trip over (in a sticky directory, it
            // could not remove another user's).
            let _ = fs::remove_file(&tmp_path);
            refused(&self.fence, "write", &e)
        })?;
        Ok(next)
    }
}

/// Takes an exclusive flock held by others only for moments (a fence being raised, a shared
/// holder's file being looked at): tries, then retries after 1 ms, 2 ms, 4 ms ... 64 ms, for at
/// most 5 s in all. A blocking flock would hang, deaf to signals, on a directory someone else
/// keeps locked.
pub(super) async fn lock_briefly(file: &File) -> io::Result<()> {
    lock_briefly_as(file, libc::LOCK_EX).await
}

/// [`lock_briefly`], shared (`LOCK_SH`) or exclusive as `operation` says.
pub(super) async fn lock_briefly_as(file: &File, operation: libc::c_int) -> io::Result<()> {
    let started = std::time::Instant::now();
    let mut pause = Duration::from_millis(1);
    loop {
        match flock(file, operation | libc::LOCK_NB) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::name::LockName;

    /// A token no further ahead of the clock than a block or two is issued once the clock has
    /// reached it; one far ahead (the clock set back) at once.
    #[test]
    fn a_token_waits_for_the_clock_only_when_it_is_just_ahead() {
        let token = clock_us() + 1500;
        assert_eq!(when_the_clock_reaches(token), token);
        assert!(clock_us() >= token);
        let far = clock_us() + 10_000_000;
        let started = std::time::Instant::now();
        assert_eq!(when_the_clock_reaches(far), far);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// Issue 43's review: a counter and a history restored from a copy (both low) cannot hold
    /// the fence back: a new block starts at the clock; and none is reserved past `i64::MAX`.
    #[tokio::test]
    async fn a_new_block_starts_at_the_clock_and_never_past_the_largest_fence() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::new(dir.path(), &LockName::new("job").unwrap());
        let locked = paths.lock_dir().await.unwrap();
        std::fs::write(&paths.fence, "3\n").unwrap();
        let before = clock_us();
        let fence = paths.raise_fence_locked(&locked).unwrap();
        assert!(fence > before && fence <= clock_us(), "{fence}");
        let top: u64 = std::fs::read_to_string(&paths.fence)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(top, fence - 1 + BLOCK);
        std::fs::write(&paths.fence, format!("{}\n", MAX_FENCE - 1)).unwrap();
        assert_eq!(paths.raise_fence_locked(&locked), Ok(MAX_FENCE));
        let err = paths.raise_fence_locked(&locked).unwrap_err();
        assert!(err.to_string().contains("is at its maximum"), "{err}");
    }
}
