//! A wait someone watches says so: on a terminal, or in CI (the `CI` variable set, as every CI
//! runner sets it), a run still waiting after about 2 s prints one line, who holds the lock and
//! since when (and the run's place in the queue where the backend tells it), then one line every
//! 30 s with the time waited; on a terminal, one line updated in place. Under cron and systemd
//! (no terminal, no `CI`) a wait stays silent, and `-q` silences it everywhere. A pure core told
//! the clock's readings; the driver (`acquire.rs`) prints what it is given.

use std::time::Duration;

use crate::backend::{Busy, Expiry};
use crate::name::LockName;
use crate::text::show;

/// When the first line comes, and then how often.
const FIRST: Duration = Duration::from_secs(2);
const EVERY: Duration = Duration::from_secs(30);

/// Where a watched wait's lines go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watched {
    /// A terminal: one line, updated in place.
    Terminal,
    /// A CI log: a line each time.
    Log,
}

impl Watched {
    /// How this run is watched, if it is: stderr a terminal, else `CI` set; never with `-q` or
    /// JSON logs.
    pub fn now() -> Option<Watched> {
        if !crate::plumbing::log::progress_allowed() {
            return None;
        }
        if nix::unistd::isatty(std::io::stderr()).unwrap_or(false) {
            return Some(Watched::Terminal);
        }
        std::env::var_os("CI")
            .filter(|v| !v.is_empty())
            .map(|_| Watched::Log)
    }
}

/// The lines of one wait.
#[derive(Debug)]
pub struct Progress {
    began: Duration,
    next: Duration,
    pub watched: Watched,
    /// Whether a line was printed (a terminal's must then be ended).
    pub said: bool,
}

impl Progress {
    /// A wait that began at `began` (the clock's reading).
    pub fn new(began: Duration, watched: Watched) -> Progress {
        Progress {
            began,
            next: began + FIRST,
            watched,
            said: false,
        }
    }

    /// When the next line is due.
    pub fn due(&self) -> Duration {
        self.next
    }

    /// The line due at `now`, the lock busy as `busy` last said; the one after is due 30 s on.
    pub fn line(&mut self, now: Duration, name: &LockName, busy: Option<&Busy>) -> String {
        let waited = now.saturating_sub(self.began);
        let first = !self.said;
        self.said = true;
        self.next = now + EVERY;
        let mut line = format!("waiting for lock {name}");
        match busy {
            Some(Busy {
                expiry: Expiry::Queued { ahead, .. },
                ..
            }) => line.push_str(&format!(", free but {ahead} waiter(s) go first")),
            Some(busy) => {
                let mut holder = busy.holder.clone();
                holder.fence = None;
                line.push_str(&format!(", held by {holder}"));
            }
            None => {}
        }
        if !first {
            line.push_str(&format!("; waited {}", show_whole(waited)));
        }
        line
    }
}

/// A wait's length to the second: `1m30s`, `45s`.
fn show_whole(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0..60 => show(Duration::from_secs(secs)),
        _ => format!("{}m{:02}s", secs / 60, secs % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Holder;

    #[test]
    fn the_first_line_after_two_seconds_says_who_holds_then_every_thirty_the_time_waited() {
        let name = LockName::new("deploy").unwrap();
        let busy = Busy {
            holder: Holder {
                host: Some("ci-7".into()),
                pid: Some(4242),
                command: Some("deploy.sh".into()),
                since_ms: Some(1_764_673_200_000),
                fence: Some(9),
            },
            expiry: Expiry::In(Duration::from_secs(20)),
        };
        let mut p = Progress::new(Duration::from_secs(10), Watched::Log);
        assert_eq!(p.due(), Duration::from_secs(12));
        assert_eq!(
            p.line(Duration::from_secs(12), &name, Some(&busy)),
            "waiting for lock deploy, held by ci-7 pid 4242 (deploy.sh) since 2025-12-02T11:00:00Z"
        );
        assert_eq!(p.due(), Duration::from_secs(42));
        assert_eq!(
            p.line(Duration::from_secs(102), &name, Some(&busy)),
            "waiting for lock deploy, held by ci-7 pid 4242 (deploy.sh) since 2025-12-02T11:00:00Z; waited 1m32s"
        );
        let queued = Busy {
            holder: Holder::default(),
            expiry: Expiry::Queued {
                ahead: 2,
                retry_in: Duration::from_secs(1),
            },
        };
        assert!(
            p.line(Duration::from_secs(140), &name, Some(&queued))
                .starts_with("waiting for lock deploy, free but 2 waiter(s) go first; waited")
        );
    }
}
