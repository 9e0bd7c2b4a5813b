//! What happened: one run of a NAME that took the lock, as every backend's history keeps it
//! (host, pid, user, fence, mode, when it took and let go of the lock, how long it waited, how
//! it ended), and the one record format the stores without columns keep it in: a JSON object.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};

/// How many runs of one NAME a history keeps.
pub const KEPT: usize = 100;

/// Says that a release went through but its run could not be added to the history (`failed`:
/// why). Only after the release was confirmed: one that failed says so itself, and a history
/// is never a reason for a release to fail.
pub fn unrecorded<T, E: std::fmt::Display>(
    name: &crate::name::LockName,
    released: &Result<bool, super::BackendError>,
    failed: Result<T, E>,
) {
    if let (Ok(_), Err(e)) = (released, failed) {
        tracing::warn!(
            "could not add this run to lock {name}'s history ({e}); the lock is released"
        );
    }
}

/// How a run that took the lock ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The command exited with the run's status.
    Exit,
    /// The command was ended by this signal (the run's status is 128 + N).
    Signal(i32),
    /// The lease was lost and `locked-run` stopped the command (76).
    Lost,
    /// `--max-run` ran out and `locked-run` stopped the command (124).
    MaxRun,
}

impl Ended {
    /// The word `history --json` says: `exit`, `signal`, `lost`, `max-run`.
    pub fn word(self) -> &'static str {
        match self {
            Ended::Exit => "exit",
            Ended::Signal(_) => "signal",
            Ended::Lost => "lost",
            Ended::MaxRun => "max-run",
        }
    }
}

/// One run that took the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The run's token: the same run seen by several stores (Redlock's servers) is one run.
    pub token: String,
    pub host: String,
    pub pid: u32,
    pub user: String,
    pub fence: u64,
    /// `exclusive`, `shared`, or `holders N`.
    pub mode: String,
    /// When the lock was taken and let go, ms since the Unix epoch (this host's wall clock:
    /// for people to read, never for a deadline).
    pub started_ms: u64,
    pub ended_ms: u64,
    pub waited_ms: u64,
    /// The exit status `locked-run` returned.
    pub status: i32,
    pub ended: Ended,
}

/// `ms` since the epoch as RFC 3339, UTC, to the millisecond.
pub fn rfc3339(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

fn parse_rfc3339(text: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339(text).ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64)
}

impl Run {
    /// The record as `history --json` prints it, and as Redis, etcd and `file://` keep it (with
    /// the token, which pairs one run's records across Redlock's servers).
    pub fn to_json(&self) -> Value {
        let mut object = json!({
            "host": self.host,
            "pid": self.pid,
            "user": self.user,
            "fence": self.fence,
            "mode": self.mode,
            "started_at": rfc3339(self.started_ms),
            "ended_at": rfc3339(self.ended_ms),
            "waited_ms": self.waited_ms,
            "status": self.status,
            "ended": self.ended.word(),
            "token": self.token,
        });
        if let Ended::Signal(n) = self.ended {
            object["signal"] = json!(n);
        }
        object
    }

    /// A record back from a store; `None` when it is not one (another program's, or damaged).
    pub fn from_json(value: &Value) -> Option<Run> {
        let text = |key: &str| value.get(key)?.as_str().map(str::to_owned);
        let number = |key: &str| value.get(key)?.as_u64();
        let ended = match value.get("ended")?.as_str()? {
            "exit" => Ended::Exit,
            "signal" => Ended::Signal(number("signal")? as i32),
            "lost" => Ended::Lost,
            "max-run" => Ended::MaxRun,
            _ => return None,
        };
        Some(Run {
            token: text("token")?,
            host: text("host")?,
            pid: number("pid")? as u32,
            user: text("user")?,
            fence: number("fence")?,
            mode: text("mode")?,
            started_ms: parse_rfc3339(&text("started_at")?)?,
            ended_ms: parse_rfc3339(&text("ended_at")?)?,
            waited_ms: number("waited_ms")?,
            status: value.get("status")?.as_i64()? as i32,
            ended,
        })
    }

    /// The record as one line of JSON.
    pub fn to_line(&self) -> String {
        self.to_json().to_string()
    }

    /// A record from one line of JSON.
    pub fn from_line(line: &str) -> Option<Run> {
        Run::from_json(&serde_json::from_str(line).ok()?)
    }
}

/// Runs from several stores (Redlock's servers) as one history: each run once (by its token),
/// newest first, at most `limit`.
pub fn merged(lists: impl IntoIterator<Item = Vec<Run>>, limit: usize) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for run in lists.into_iter().flatten() {
        if !runs.iter().any(|r| r.token == run.token) {
            runs.push(run);
        }
    }
    newest_first(runs, limit)
}

/// `runs` newest first (by when they let go of the lock), at most `limit`.
pub fn newest_first(mut runs: Vec<Run>, limit: usize) -> Vec<Run> {
    runs.sort_by_key(|r| std::cmp::Reverse((r.ended_ms, r.fence)));
    runs.truncate(limit);
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(token: &str, ended_ms: u64) -> Run {
        Run {
            token: token.into(),
            host: "web-1".into(),
            pid: 4242,
            user: "backup".into(),
            fence: ended_ms / 1000,
            mode: "exclusive".into(),
            started_ms: ended_ms.saturating_sub(1500),
            ended_ms,
            waited_ms: 12,
            status: 143,
            ended: Ended::Signal(15),
        }
    }

    #[test]
    fn a_record_reads_back_as_it_was_written() {
        let r = run("t1", 1_764_673_200_123);
        let line = r.to_line();
        assert!(
            line.contains("\"ended_at\":\"2025-12-02T11:00:00.123Z\""),
            "{line}"
        );
        assert_eq!(Run::from_line(&line), Some(r));
        assert_eq!(Run::from_line("not json"), None);
        assert_eq!(Run::from_line("{\"host\":\"x\"}"), None);
    }

    #[test]
    fn histories_of_several_stores_count_each_run_once_newest_first() {
        let a = vec![run("t1", 1_000_000), run("t2", 3_000_000)];
        let b = vec![run("t2", 3_000_000), run("t3", 2_000_000)];
        let tokens: Vec<String> = merged([a, b], 10).into_iter().map(|r| r.token).collect();
        assert_eq!(tokens, ["t2", "t3", "t1"]);
        assert_eq!(merged([vec![run("t1", 1), run("t2", 2)]], 1)[0].token, "t2");
    }
}
