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
//! A file system without user extended attributes, or a counter file this user may not write
//! (another member of a group directory made it, 0644), only makes every run reserve a block
//! of its own: one durable write a run, as before.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

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

/// What the extended attribute says: where tokens stand in the block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub epoch: Epoch,
    /// The counter file's value when the record was written: the top of the block.
    pub top: u64,
    /// The last token issued from the block.
    pub last: u64,
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

    /// Sets it on `file` (not durably: see the module's notes).
    pub fn write(&self, file: &File) -> io::Result<()> {
        let text = self.to_text();
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
        match rc {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Whether the record tells the truth about a counter file whose value is `top`: written
    /// in this boot and mount (`now`), for this very value.
    pub fn holds(&self, top: u64, now: &Epoch) -> bool {
        self.epoch == *now && self.top == top && self.last <= top
    }

    /// The next token of the block, if the record holds (see [`Record::holds`]) and the block
    /// is not used up.
    pub fn next(&self, top: u64, now: &Epoch) -> Option<u64> {
        (self.holds(top, now) && self.last < top).then(|| self.last + 1)
    }

    fn to_text(&self) -> String {
        let Record { epoch, top, last } = self;
        format!("{} {} {top} {last}", epoch.boot, epoch.mount)
    }

    fn parse(text: &str) -> Option<Record> {
        let mut words = text.split(' ');
        let boot = words.next().filter(|b| b.len() == 16)?.to_owned();
        let mut number = || words.next()?.parse::<u64>().ok();
        let (mount, top, last) = (number()?, number()?, number()?);
        Some(Record {
            epoch: Epoch { boot, mount },
            top,
            last,
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
        };
        assert_eq!(Record::parse(&record.to_text()), Some(record.clone()));
        assert_eq!(record.next(1024, &now), Some(6));
        // Another boot (a crash), another mount, a top changed by another release or by hand.
        assert_eq!(record.next(1024, &epoch("fedcba9876543210", 7)), None);
        assert_eq!(record.next(1024, &epoch("0123456789abcdef", 8)), None);
        assert_eq!(record.next(1025, &now), None);
        let used_up = Record {
            last: 1024,
            ..record
        };
        assert!(used_up.holds(1024, &now));
        assert_eq!(used_up.next(1024, &now), None);
        assert_eq!(Record::parse("0123456789abcdef 7 1024"), None);
        assert_eq!(Record::parse("short 7 1024 5"), None);
    }

    #[test]
    fn a_record_is_kept_on_the_file_and_a_new_file_has_none() {
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
        };
        // Read-only descriptor: the attribute needs write permission on the file, not the fd.
        if record.write(&file).is_err() {
            return; // no user extended attributes here
        }
        assert_eq!(Record::read(&File::open(&path).unwrap()), Some(record));
        // Replaced by rename, as the previous release writes the counter: no record.
        std::fs::write(dir.path().join("tmp"), "1025\n").unwrap();
        std::fs::rename(dir.path().join("tmp"), &path).unwrap();
        assert_eq!(Record::read(&File::open(&path).unwrap()), None);
    }
}
