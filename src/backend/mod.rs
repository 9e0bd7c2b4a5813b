//! What every backend shares with the rest of the program, in two halves that can be written
//! and tested apart: the run's lock ([`Backend`], in `lock.rs`: acquire, renew, release, give
//! back, wake-ups), which is all a session needs, and the operator's view ([`View`], in
//! `view.rs`: what `status`, `release --force` and `doctor` read and do). Both are object-safe
//! (`dyn Backend`, `dyn View`), so the program holds whichever backend the URLs named without
//! knowing which; the lock specification a backend is opened for is in `spec.rs`, and what a
//! backend declares of itself for the registry (its schemes, modes, NAME rule, how it is
//! opened) in `declare.rs`.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod declare;
mod history;
mod lock;
mod spec;
mod view;

pub(crate) use declare::says;
pub use declare::{Can, Declaration, Modes, Opened, Opening, Queue, Several, Store, any_name};
pub use history::{
    Ended, History, KEPT, MAX_FENCE, MAX_RECORD, Reader, Run, SCANNED, merged, rfc3339, unrecorded,
};
pub use lock::{Attempt, Backend, KEEP_ALIVE, Tenure, Wakeup, Wakeups};
pub use spec::{LockSpec, Mode};
pub use view::{Check, Freed, Level, Report, Servers, Slot, View, last_fence};

/// Who holds a lock, as far as its metadata tells. Every field may be missing: another program
/// using the plain `SET lock:{NAME} token NX PX` protocol leaves none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub command: Option<String>,
    /// Wall-clock time of the acquisition, in milliseconds since the Unix epoch (for display).
    pub since_ms: Option<u64>,
    pub fence: Option<u64>,
}

impl Holder {
    pub fn is_known(&self) -> bool {
        self.host.is_some() || self.pid.is_some()
    }

    /// `since` as RFC 3339 UTC, for display and JSON; none when it is not known, or when
    /// whoever wrote it put it where no date can be shown (past year 9999).
    pub fn since(&self) -> Option<String> {
        let t = showable(self.since_ms?)?;
        Some(humantime::format_rfc3339_seconds(t).to_string())
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.is_known() {
            return f.write_str("another program (no locked-run holder metadata)");
        }
        // Another host's names: in the printable form wherever a holder is shown.
        f.write_str(&crate::text::printable(self.host.as_deref().unwrap_or("?")))?;
        if let Some(pid) = self.pid {
            write!(f, " pid {pid}")?;
        }
        if let Some(command) = &self.command {
            write!(f, " ({})", crate::text::printable(command))?;
        }
        // A time another party wrote that no date can show reads as unknown.
        match (self.since(), self.since_ms) {
            (Some(since), _) => write!(f, " since {since}")?,
            (None, Some(_)) => f.write_str(" since ?")?,
            (None, None) => {}
        }
        if let Some(fence) = self.fence {
            write!(f, ", fence {fence}")?;
        }
        Ok(())
    }
}

/// When a held lock expires on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    In(Duration),
    /// The key has no expiry (set by another tool): it is only freed by a delete.
    Never,
    /// A host-local `flock`: it lasts exactly as long as its holder's process holds it.
    WithHolder,
    /// Not held, but `ahead` fair waiters come first; the first of them keeps its place alive
    /// for `retry_in` more (after which, should it be gone, the next may go).
    Queued {
        ahead: u32,
        retry_in: Duration,
    },
}

impl Expiry {
    /// How long until it ends by itself; `Duration::MAX` for never (for ordering).
    pub fn left(self) -> Duration {
        match self {
            Expiry::In(d) | Expiry::Queued { retry_in: d, .. } => d,
            Expiry::Never | Expiry::WithHolder => Duration::MAX,
        }
    }
}

/// A lock found held by someone else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Busy {
    pub holder: Holder,
    pub expiry: Expiry,
}

impl fmt::Display for Busy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Expiry::Queued { ahead, .. } = self.expiry {
            return write!(
                f,
                "free, but {ahead} waiter(s) came first and go before this run"
            );
        }
        write!(f, "held by {}", self.holder)?;
        match self.expiry {
            Expiry::In(d) => write!(f, ", lease ends in {}", crate::text::show(d)),
            Expiry::Never => f.write_str(", with no expiry"),
            Expiry::WithHolder | Expiry::Queued { .. } => Ok(()),
        }
    }
}

/// The last millisecond RFC 3339 can write (9999-12-31T23:59:59.999Z), in ms since the epoch.
pub const LAST_SHOWABLE_MS: u64 = 253_402_300_799_999;

/// `ms` since the epoch as an instant that a date can show (RFC 3339 stops at year 9999), if
/// it is one: a time another party wrote may be anything.
pub fn showable(ms: u64) -> Option<SystemTime> {
    (ms <= LAST_SHOWABLE_MS).then(|| UNIX_EPOCH + Duration::from_millis(ms))
}

/// A backend operation that did not get an answer it could use.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BackendError {
    /// No usable answer: refused, reset, timed out, or a server that is loading, busy or
    /// failing over. Worth retrying on a fresh connection.
    #[error("{0}")]
    Transient(String),
    /// An answer, but a refusal (READONLY replica, NOPERM, OOM, WRONGTYPE, ...): a setup problem
    /// that retrying will not fix.
    #[error("{0}")]
    Refused(String),
    /// Either of the above, for a request that never reached the lock: no connection could be
    /// made, the server refused the connection's set-up (TLS, the password, the database)
    /// before any command of the lock ran, or it turned out to be no server of the lock's kind
    /// at all. Nothing it asked for can have been taken, so nothing needs giving back, and a
    /// first contact that failed so says that nothing was taken.
    #[error("{0}")]
    Unsent(Box<BackendError>),
}

impl BackendError {
    pub fn is_transient(&self) -> bool {
        match self {
            BackendError::Transient(_) => true,
            BackendError::Refused(_) => false,
            BackendError::Unsent(error) => error.is_transient(),
        }
    }

    /// Whether the request never reached the lock (see [`BackendError::Unsent`]).
    pub fn is_unsent(&self) -> bool {
        matches!(self, BackendError::Unsent(_))
    }

    /// This error, for a request that never reached the lock.
    pub fn unsent(self) -> BackendError {
        match self {
            BackendError::Unsent(_) => self,
            error => BackendError::Unsent(Box::new(error)),
        }
    }

    /// [`BackendError::unsent`] when `unsent`, else this error as it is.
    pub fn unsent_if(self, unsent: bool) -> BackendError {
        match unsent {
            true => self.unsent(),
            false => self,
        }
    }
}

/// A fresh owner's token: unique to one holding, never reused.
pub fn new_token() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// This host's name, as holders and history records keep it: raw (whatever a container's
/// owner set in its UTS namespace; only printing escapes it), at most a name's length.
pub fn hostname() -> String {
    let name = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into());
    crate::text::cut(&name, crate::text::MAX_NAME)
}

/// The user this run runs as: its name as `/etc/passwd` says it, else its uid. Read from the
/// file, not through NSS: this is on the way to the release, and the name service (an
/// LDAP or a slow `nsswitch.conf`) must not hold up the next holder for a line of history.
pub fn user_name() -> String {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let id = fields.nth(1)?.parse::<u32>().ok()?;
            (id == uid).then(|| name.to_owned())
        })
        .unwrap_or_else(|| uid.to_string())
}

/// Milliseconds since the Unix epoch, for holder metadata (display only, never for deadlines).
pub fn wall_clock_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_reads_like_a_sentence() {
        let h = Holder {
            host: Some("web-3".into()),
            pid: Some(4242),
            command: Some("backup.sh".into()),
            since_ms: Some(1_764_673_200_000),
            fence: Some(17),
        };
        assert_eq!(
            h.to_string(),
            "web-3 pid 4242 (backup.sh) since 2025-12-02T11:00:00Z, fence 17"
        );
        assert_eq!(
            Holder::default().to_string(),
            "another program (no locked-run holder metadata)"
        );
    }

    /// Issue 43's review: any user of a lock could write a `since` past year 9999, which
    /// RFC 3339 cannot show: `status`, `release`, `-n` and every waiter panicked formatting
    /// it. It reads as unknown.
    #[test]
    fn a_since_no_date_can_show_reads_as_unknown() {
        let mut h = Holder {
            host: Some("web-3".into()),
            since_ms: Some(99_999_999_999_999_999),
            ..Holder::default()
        };
        assert_eq!(h.since(), None);
        assert_eq!(h.to_string(), "web-3 since ?");
        h.since_ms = Some(LAST_SHOWABLE_MS);
        assert_eq!(h.since().as_deref(), Some("9999-12-31T23:59:59Z"));
        h.since_ms = Some(LAST_SHOWABLE_MS + 1);
        assert_eq!(h.since(), None);
        h.since_ms = Some(u64::MAX);
        assert_eq!(h.to_string(), "web-3 since ?");
    }
}
