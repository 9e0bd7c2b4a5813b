//! What a `file://` lock file says: its holder's `key=value` lines, and a `--min-hold`
//! deadline on this boot's `CLOCK_BOOTTIME` (the wall clock across a reboot).

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::time::Duration;

use crate::backend::{Holder, wall_clock_ms};
use crate::plumbing::clock::{BootClock, Clock};

/// A `--min-hold` deadline, on `CLOCK_BOOTTIME` of one boot, with the wall clock as the
/// fallback across a reboot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotBefore {
    boot_id: String,
    boot_ms: u64,
    wall_ms: u64,
}

impl NotBefore {
    pub fn after(hold: Duration) -> NotBefore {
        let hold_ms = hold.as_millis() as u64;
        NotBefore {
            boot_id: boot_id().to_owned(),
            boot_ms: BootClock.now().as_millis() as u64 + hold_ms,
            wall_ms: wall_clock_ms() + hold_ms,
        }
    }

    /// How long until the deadline, if it is still ahead.
    pub fn left(&self) -> Option<Duration> {
        let left = if !self.boot_id.is_empty() && self.boot_id == boot_id() {
            self.boot_ms.checked_sub(BootClock.now().as_millis() as u64)
        } else {
            self.wall_ms.checked_sub(wall_clock_ms())
        };
        left.filter(|&ms| ms > 0).map(Duration::from_millis)
    }
}

/// This boot's id (empty when it cannot be read): `CLOCK_BOOTTIME` readings, and the count of a
/// block of fence tokens, hold only within one boot.
pub(super) fn boot_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    })
}

/// A value as a line of the lock file keeps it: the backslash, the newline and the carriage
/// return written `\\`, `\n`, `\r`, so that a value is one line and reads back as it was.
fn escape(value: &str) -> String {
    let mut line = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => line.push_str("\\\\"),
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            c => line.push(c),
        }
    }
    line
}

/// A value as [`escape`] wrote it, read back; a backslash before anything else stays (a lock
/// file of the previous release, which kept the printable form).
fn unescape(line: &str) -> String {
    let mut value = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let escaped = match (c, chars.peek()) {
            ('\\', Some('\\')) => '\\',
            ('\\', Some('n')) => '\n',
            ('\\', Some('r')) => '\r',
            _ => {
                value.push(c);
                continue;
            }
        };
        chars.next();
        value.push(escaped);
    }
    value
}

/// What the lock file says: `key=value` lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    pub holder: Holder,
    pub token: Option<String>,
    pub not_before: Option<NotBefore>,
    /// A semaphore slot's N (`--holders`).
    pub limit: Option<u32>,
}

impl Meta {
    pub fn read(file: &File) -> Meta {
        let mut bytes = vec![0; 4096];
        let n = file.read_at(&mut bytes, 0).unwrap_or(0);
        Meta::parse(&String::from_utf8_lossy(&bytes[..n]))
    }

    pub fn parse(text: &str) -> Meta {
        let mut meta = Meta::default();
        for (key, value) in text.lines().filter_map(|l| l.split_once('=')) {
            match key {
                "host" => meta.holder.host = Some(unescape(value)),
                "pid" => meta.holder.pid = value.parse().ok(),
                "command" => meta.holder.command = Some(unescape(value)),
                "since_ms" => meta.holder.since_ms = value.parse().ok(),
                "fence" => meta.holder.fence = value.parse().ok(),
                "token" => meta.token = Some(unescape(value)),
                "limit" => meta.limit = value.parse().ok(),
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
        // One line per field, each value as it is (the printable form is for printing: `status
        // --json` shows every backend's holder the same), cut to a name's length, with only
        // what would end its line escaped (a newline inside a value would start a forged
        // field); each short enough that every field fits in what a reader reads of the file
        // (4 KiB).
        let clean = |s: &str| escape(&crate::text::cut(s, crate::text::MAX_NAME));
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
        line("limit", self.limit.map(|l| l.to_string()));
        line(
            "not_before",
            self.not_before
                .as_ref()
                .map(|n| format!("{} {} {}", n.boot_id, n.boot_ms, n.wall_ms)),
        );
        text
    }

    /// Replaces the lock file's content (under the lock).
    pub fn write(&self, file: &File) -> io::Result<()> {
        let text = self.to_text();
        file.write_all_at(text.as_bytes(), 0)?;
        file.set_len(text.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            limit: Some(3),
        };
        let parsed = Meta::parse(&meta.to_text());
        assert_eq!(parsed.holder.fence, Some(17));
        // Kept as it was written, the newline and all: one field, never a forged second.
        assert_eq!(parsed.holder.command.as_deref(), Some("evil\nfence=1"));
        assert_eq!(parsed.holder, meta.holder);
        let slashed = Meta {
            holder: Holder {
                host: Some("a\\u{1b}\\\\n\r\\".into()),
                ..Holder::default()
            },
            ..Meta::default()
        };
        assert_eq!(Meta::parse(&slashed.to_text()).holder, slashed.holder);
        // The previous release's printable form reads as it was written.
        assert_eq!(
            Meta::parse("host=w\\u{1b}x\n").holder.host.as_deref(),
            Some("w\\u{1b}x")
        );
        assert_eq!(parsed.not_before, meta.not_before);
        assert_eq!(Meta::parse(""), Meta::default());
        assert_eq!(Meta::parse("garbage\npid=x\n").holder.pid, None);
        // A host and a command of the longest characters, and of backslashes and newlines,
        // escaped two bytes each: every field is still within what a reader reads.
        let long = Meta {
            holder: Holder {
                host: Some("\u{10ffff}".repeat(1000)),
                command: Some("\\\n".repeat(1000)),
                ..meta.holder.clone()
            },
            ..meta
        };
        assert!(long.to_text().len() < 3072, "{}", long.to_text().len());
        let back = Meta::parse(&long.to_text());
        assert_eq!(back.token.as_deref(), Some("t"));
        assert_eq!(back.holder.host.unwrap().chars().count(), 255);
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
}
