//! The block of fence tokens that one durable write of `STEM.fence` reserves, and the count of
//! the tokens issued from it, kept where no run waits for a disk.
//!
//! `STEM.fence` holds the top of the block, in decimal (what the previous release reads as the
//! last token issued, so that its runs, mixed with these, still go above every token). It is
//! written durably (a temporary file, fsync, rename, fsync of the directory) before any token
//! of its block is issued; no token is ever above the value on disk. The tokens of the block are
//! counted in an extended attribute of that same file (a [`Record`]), set without fsync: it
//! lives in the kernel's memory, where every later run reads it, and may be lost or left stale
//! on disk by a crash. So it counts only while it says it was written in this boot (its
//! `boot_id`) and through this mount (the mount's unique id): after a crash of the host, or a
//! file system mounted again, the record is passed over and the next token is the top of the
//! block plus one, above every token issued before the crash. A run of the previous release
//! replaces the file (its record goes with it), and a hand edit changes the top, which the
//! record no longer matches: either way the next token comes after the file's value, as it did.
//!
//! A copy carries the attribute with it (`cp -a`, a backup, a snapshot), so a record is also
//! believed only on the very file it was set on, unchanged since ([`Stamp`]): the same device
//! and inode, and a change time (which no program can set, and every write of the file, its
//! attributes or its mode moves) within moments of the record's own. A directory restored from
//! a copy (in place or anew), or an attribute edited by hand, has a record that names another
//! file or an earlier change: passed over, as after a crash.
//!
//! A file system without user extended attributes, or a counter file this user may not write
//! (another member of a group directory made it, 0644), only makes every run reserve a block
//! of its own: one durable write a run, as before.

use std::ffi::CStr;
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;

use super::meta::boot_id;

/// How many tokens one durable write of the counter reserves.
pub const BLOCK: u64 = 1024;

/// The extended attribute of `STEM.fence` that counts the tokens issued from its block.
const ATTRIBUTE: &CStr = c"user.locked-run";

/// The boot and the mount a record was written in: where the kernel's copy of the counter
/// file (and so its record) is the one every run has read and written since.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    /// The first 16 hex digits of `/proc/sys/kernel/random/boot_id` (new at every boot).
    boot: String,
    /// The unique id of the mount (`STATX_MNT_ID_UNIQUE`, Linux 6.8; 0 before it, where the
    /// boot alone is told apart).
    mount: u64,
}

impl Epoch {
    /// Now, for `file`'s mount; `None` when the boot cannot be told.
    pub fn of(file: &File) -> Option<Epoch> {
        let boot: String = boot_id().chars().filter(|c| *c != '-').take(16).collect();
        (boot.len() == 16).then(|| Epoch {
            boot,
            mount: unique_mount_id(file),
        })
    }
}

/// The counter file a record was set on, and when: see [`Stamp::matches`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    /// `CLOCK_REALTIME` in ns, read just before the attribute was set.
    written_ns: i64,
}

/// How far a file's change time may lag the clock read before a write that set it: the
/// coarse clock's tick, which file times are taken from (Linux: 1 to 10 ms), and a margin.
fn tick_ns() -> i64 {
    let mut res = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `res` is live and of the type clock_getres fills.
    let rc = unsafe { libc::clock_getres(libc::CLOCK_REALTIME_COARSE, &mut res) };
    let tick = match rc {
        0 => res.tv_sec * 1_000_000_000 + res.tv_nsec,
        _ => 10_000_000,
    };
    tick.min(100_000_000) + 1_000_000
}

/// How long after the clock read a write's change time may come: the system call itself,
/// preempted a little. (A record whose write took longer is not believed: the next run
/// reserves a block, which costs a sync, never a token.) A copy restored over the file sets
/// its change time at the restore, after at least one whole run since the copy's record was
/// set: never within this.
const AFTER_NS: i64 = 2_000_000;

fn realtime_ns() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map_or(0, |d| d.as_nanos() as i64)
}

impl Stamp {
    /// Whether `meta` is of the very file the record was set on (its device and inode), not
    /// changed since: its change time is that of the record's own write.
    pub fn matches(&self, meta: &Metadata) -> bool {
        let changed = meta.ctime() * 1_000_000_000 + meta.ctime_nsec();
        meta.dev() == self.dev
            && meta.ino() == self.ino
            && changed >= self.written_ns - tick_ns()
            && changed <= self.written_ns + AFTER_NS
    }
}

/// What the extended attribute says: where tokens stand in the block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub epoch: Epoch,
    /// The counter file's value when the record was written: the top of the block.
    pub top: u64,
    /// The last token issued from the block.
    pub last: u64,
    /// The file it was set on, and when ([`Record::write`] sets it).
    pub stamp: Stamp,
}

impl Record {
    /// The record of `file`, if it has one that reads as one.
    pub fn read(file: &File) -> Option<Record> {
        let mut buf = [0u8; 128];
        // SAFETY: the name is NUL-terminated; the buffer is live and as long as said.
        let n = unsafe {
            libc::fgetxattr(
                file.as_raw_fd(),
                ATTRIBUTE.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let n = usize::try_from(n).ok()?;
        Record::parse(std::str::from_utf8(&buf[..n]).ok()?)
    }

    /// Sets it on `file` (not durably: see the module's notes), stamped with the file and the
    /// instant ([`Stamp`]). A write whose change time came later than the stamp allows (the
    /// thread preempted between the clock and the system call) is made once more; should that
    /// one miss too, the record is not believed and the next run reserves a block.
    pub fn write(&self, file: &File) -> io::Result<()> {
        let meta = file.metadata()?;
        for _ in 0..2 {
            let stamped = Record {
                stamp: Stamp {
                    dev: meta.dev(),
                    ino: meta.ino(),
                    written_ns: realtime_ns(),
                },
                ..self.clone()
            };
            let text = stamped.to_text();
            // SAFETY: the name is NUL-terminated; the value is live and as long as said.
            let rc = unsafe {
                libc::fsetxattr(
                    file.as_raw_fd(),
                    ATTRIBUTE.as_ptr(),
                    text.as_ptr().cast(),
                    text.len(),
                    0,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            if stamped.stamp.matches(&file.metadata()?) {
                break;
            }
        }
        Ok(())
    }

    /// Whether the record tells the truth about a counter file whose value is `top` and whose
    /// metadata is `meta`: written in this boot and mount (`now`), for this very value, on this
    /// very file, unchanged since.
    pub fn holds(&self, top: u64, now: &Epoch, meta: &Metadata) -> bool {
        self.counts(top, now) && self.stamp.matches(meta)
    }

    /// [`Record::holds`] but for the file: this boot and mount, this value.
    fn counts(&self, top: u64, now: &Epoch) -> bool {
        self.epoch == *now && self.top == top && self.last <= top
    }

    /// The next token of the block, if the record holds (see [`Record::holds`]) and the block
    /// is not used up.
    pub fn next(&self, top: u64, now: &Epoch, meta: &Metadata) -> Option<u64> {
        (self.holds(top, now, meta) && self.last < top).then(|| self.last + 1)
    }

    /// `BOOT MOUNT TOP LAST DEV INO WRITTEN`: the first four as the previous release writes
    /// and reads them (it reads no further), the stamp after.
    fn to_text(&self) -> String {
        let Record {
            epoch,
            top,
            last,
            stamp,
        } = self;
        format!(
            "{} {} {top} {last} {} {} {}",
            epoch.boot, epoch.mount, stamp.dev, stamp.ino, stamp.written_ns
        )
    }

    /// A record as [`Record::to_text`] writes it; one of the previous release (no stamp) is
    /// none: it cannot say which file it was set on.
    fn parse(text: &str) -> Option<Record> {
        let mut words = text.split(' ');
        let boot = words.next().filter(|b| b.len() == 16)?.to_owned();
        let mut number = || words.next()?.parse::<u64>().ok();
        let (mount, top, last, dev, ino) = (number()?, number()?, number()?, number()?, number()?);
        let written_ns = words.next()?.parse().ok()?;
        Some(Record {
            epoch: Epoch { boot, mount },
            top,
            last,
            stamp: Stamp {
                dev,
                ino,
                written_ns,
            },
        })
    }
}

/// The unique id of the mount `file` is on (never reused within a boot); 0 when the kernel
/// does not give one.
fn unique_mount_id(file: &File) -> u64 {
    // SAFETY: an all-zero statx is a valid value; it is only read after statx filled it.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: the path is an empty NUL-terminated string (AT_EMPTY_PATH: the descriptor
    // itself); `stx` is live and of the type statx fills.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_MNT_ID_UNIQUE,
            &mut stx,
        )
    };
    match rc == 0 && stx.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0 {
        true => stx.stx_mnt_id,
        false => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(boot: &str, mount: u64) -> Epoch {
        Epoch {
            boot: boot.into(),
            mount,
        }
    }

    #[test]
    fn a_record_counts_only_in_its_boot_and_mount_and_for_its_top() {
        let now = epoch("0123456789abcdef", 7);
        let record = Record {
            epoch: now.clone(),
            top: 1024,
            last: 5,
            stamp: Stamp {
                dev: 2049,
                ino: 12,
                written_ns: 1_764_673_200_123_456_789,
            },
        };
        assert_eq!(Record::parse(&record.to_text()), Some(record.clone()));
        assert!(record.counts(1024, &now));
        // Another boot (a crash), another mount, a top changed by another release or by hand.
        assert!(!record.counts(1024, &epoch("fedcba9876543210", 7)));
        assert!(!record.counts(1024, &epoch("0123456789abcdef", 8)));
        assert!(!record.counts(1025, &now));
        // The previous release's record names no file: it is not believed.
        assert_eq!(Record::parse("0123456789abcdef 7 1024 5"), None);
        assert_eq!(Record::parse("0123456789abcdef 7 1024"), None);
        assert_eq!(Record::parse("short 7 1024 5 1 2 3"), None);
    }

    fn attribute(path: &std::path::Path) -> Vec<u8> {
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let mut buf = [0u8; 128];
        // SAFETY: NUL-terminated path and name; the buffer is live and as long as said.
        let n = unsafe {
            libc::getxattr(
                path.as_ptr(),
                ATTRIBUTE.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        buf[..usize::try_from(n).unwrap()].to_vec()
    }

    fn set_attribute(path: &std::path::Path, value: &[u8]) {
        let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated path and name; the value is live and as long as said.
        let rc = unsafe {
            libc::setxattr(
                path.as_ptr(),
                ATTRIBUTE.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
    }

    /// Issue 43: a copy carries the attribute (`cp -a`): restored over the file, or as a new
    /// file, or edited by hand, the record is not believed, as after a crash; on the very
    /// file, untouched since, it is.
    #[test]
    fn a_record_is_believed_only_on_the_very_file_unchanged_since() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.fence");
        std::fs::write(&path, "1024\n").unwrap();
        let file = File::open(&path).unwrap();
        let Some(now) = Epoch::of(&file) else { return };
        assert_eq!(Record::read(&file), None);
        let record = Record {
            epoch: now.clone(),
            top: 1024,
            last: 1,
            stamp: Stamp::default(),
        };
        // Read-only descriptor: the attribute needs write permission on the file, not the fd.
        if record.write(&file).is_err() {
            return; // no user extended attributes here
        }
        let believed = |path: &std::path::Path| {
            let file = File::open(path).unwrap();
            Record::read(&file).is_some_and(|r| r.holds(1024, &now, &file.metadata().unwrap()))
        };
        assert!(believed(&path));
        assert_eq!(
            Record::read(&file)
                .unwrap()
                .next(1024, &now, &file.metadata().unwrap()),
            Some(2)
        );
        let saved = attribute(&path);
        // A copy of the file, attribute and all (`cp -a`): another inode.
        let copy = dir.path().join("copy.fence");
        std::fs::write(&copy, "1024\n").unwrap();
        set_attribute(&copy, &saved);
        assert!(!believed(&copy));
        // A run counts on; then the saved attribute is written back over the file (a restore
        // in place, or a hand edit): the file changed after the record it holds.
        Record {
            last: 2,
            ..record.clone()
        }
        .write(&file)
        .unwrap();
        assert!(believed(&path));
        std::thread::sleep(std::time::Duration::from_millis(20));
        set_attribute(&path, &saved);
        assert!(!believed(&path));
        // Written by a run again: believed again.
        record.write(&file).unwrap();
        assert!(believed(&path));
        // Its mode changed: the change time moved.
        std::thread::sleep(std::time::Duration::from_millis(20));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(!believed(&path));
        // Replaced by rename, as the previous release writes the counter: no record.
        std::fs::write(dir.path().join("tmp"), "1025\n").unwrap();
        std::fs::rename(dir.path().join("tmp"), &path).unwrap();
        assert_eq!(Record::read(&File::open(&path).unwrap()), None);
    }
}
