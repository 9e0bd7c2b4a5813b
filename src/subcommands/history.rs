//! `locked-run history NAME [--limit N] [--json]`: the lock's past runs, newest first, one a
//! line (or a JSON array): when each let go of the lock, how it ended, its fence, where it ran,
//! how long it held and waited. Exit 0 when NAME has a history, 1 when it has none.

use std::time::Duration;

use serde_json::Value;

use crate::backend::{Ended, History, Run, View, rfc3339};
use crate::name::LockName;
use crate::plumbing::exit::{Exit, Failure};
use crate::text::{out, printable, show};

/// Prints the last `limit` runs of NAME; says on stderr how many records it skipped.
pub async fn history(
    view: &dyn View,
    name: &LockName,
    limit: usize,
    as_json: bool,
) -> Result<Exit, Failure> {
    let History { runs, skipped } = view
        .history(limit)
        .await
        .map_err(|e| Failure::unavailable(e.to_string()))?;
    if skipped > 0 {
        tracing::warn!("{}", skipped_line(name, skipped));
    }
    if as_json {
        out!(
            "{}",
            crate::text::json(&Value::Array(runs.iter().map(Run::to_json).collect()))
        );
    } else if runs.is_empty() {
        out!("{name}: no run in its history (never taken, or untouched for 30 days)");
    } else {
        for run in &runs {
            out!("{}", line(run));
        }
    }
    Ok(match runs.is_empty() {
        true => Exit::Free,
        false => Exit::Child(0),
    })
}

/// What a read of NAME's history skipped (see [`Reader`](crate::backend::Reader)).
pub fn skipped_line(name: &LockName, skipped: usize) -> String {
    let records = match skipped {
        1 => "record",
        _ => "records",
    };
    crate::text::message!(
        "skipped {skipped} unreadable {records} in lock {name}'s history: larger than {} bytes \
         or not a run's record (another program's, or damaged); the runs beside them are shown",
        crate::backend::MAX_RECORD
    )
}

/// One run: "2026-12-05T23:01:02.123Z  exit 0  fence 17  web-1 pid 4242 (backup)  held 1.5s,
/// waited 12ms".
pub fn line(run: &Run) -> String {
    let how = match run.ended {
        Ended::Exit => format!("exit {}", run.status),
        Ended::Signal(n) => format!("{} ({})", signal_name(n), run.status),
        Ended::Lost => format!("lost the lock ({})", run.status),
        Ended::MaxRun => format!("--max-run ran out ({})", run.status),
    };
    let held = Duration::from_millis(run.ended_ms.saturating_sub(run.started_ms));
    let mode = match run.mode.as_str() {
        "exclusive" => String::new(),
        mode => format!(", {}", printable(mode)),
    };
    format!(
        "{}  {how}  fence {}  {} pid {} ({})  held {}, waited {}{mode}",
        rfc3339(run.ended_ms),
        run.fence,
        printable(&run.host),
        run.pid,
        printable(&run.user),
        show(held),
        show(Duration::from_millis(run.waited_ms)),
    )
}

fn signal_name(n: i32) -> String {
    nix::sys::signal::Signal::try_from(n).map_or_else(|_| format!("signal {n}"), |s| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_reads_as_one_line() {
        let run = Run {
            token: "t".into(),
            host: "web-1".into(),
            pid: 4242,
            user: "backup".into(),
            fence: 17,
            mode: "shared".into(),
            started_ms: 1_764_673_198_623,
            ended_ms: 1_764_673_200_123,
            waited_ms: 12,
            status: 143,
            ended: Ended::Signal(15),
        };
        assert_eq!(
            line(&run),
            "2025-12-02T11:00:00.123Z  SIGTERM (143)  fence 17  web-1 pid 4242 (backup)  held \
             1.5s, waited 12ms, shared"
        );
    }
}
