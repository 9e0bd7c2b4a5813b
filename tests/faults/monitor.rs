//! The monitor: while a pass runs, it asks `locked-run status --json` who holds each NAME, every
//! few hundred ms, and the checker then looks for a holder that is a wrapper which had already
//! ended, neither SIGKILLed nor saying its release failed: a lock taken for a process that is
//! gone (a waiter's late acquire landing after it gave up, say), which blocks the NAME for T.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::mono_ns;
use crate::history::{History, Violation};

#[derive(Clone, Debug)]
pub struct Observation {
    /// Before the query was sent: whatever it shows was so at some instant after this one.
    pub sent: u64,
    pub name: String,
    pub pids: Vec<i32>,
    /// The wall clock less CLOCK_MONOTONIC at `sent`, in ns: the servers' leases run on the
    /// wall clock, the wrappers' on a monotonic one, so a step of the wall clock (an NTP
    /// correction on a CI machine) moves every lease's end on the server.
    pub wall_offset: i128,
}

/// Polls until `deadline` (each query bounded by `--connect-timeout 1s` and a hard timeout).
pub fn monitor(
    bin: &str,
    url_args: &[String],
    names: &[(&'static str, u32)],
    deadline: Instant,
) -> Vec<Observation> {
    let mut seen = Vec::new();
    let mut round = 0usize;
    while Instant::now() < deadline && round < 100_000 {
        let name = names[round % names.len()].0;
        round += 1;
        let sent = mono_ns();
        let wall_offset = wall_ns() - sent as i128;
        if let Some(pids) = holders(bin, url_args, name) {
            seen.push(Observation {
                sent,
                name: name.to_owned(),
                pids,
                wall_offset,
            });
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    seen
}

fn wall_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// Steps of the wall clock against the monotonic one larger than 5 ms between two
/// observations: (the later observation's instant, the step in ns).
pub fn clock_steps(seen: &[Observation]) -> Vec<(u64, i128)> {
    seen.windows(2)
        .map(|w| (w[1].sent, w[1].wall_offset - w[0].wall_offset))
        .filter(|(_, step)| step.abs() > 5_000_000)
        .collect()
}

fn holders(bin: &str, url_args: &[String], name: &str) -> Option<Vec<i32>> {
    let mut cmd = Command::new(bin);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKED_RUN") {
            cmd.env_remove(key);
        }
    }
    let mut child = cmd
        .args(["status", "--json", "--connect-timeout", "1s"])
        .args(url_args)
        .arg(name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let pid = child.id() as i32;
    if !crate::support::wait_pid_exit(pid, Duration::from_secs(10)) {
        let _ = child.kill();
    }
    let out = child.wait_with_output().ok()?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let mut pids: Vec<i32> = json["holders"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(std::iter::once(&json["holder"]))
        .filter_map(|h| h["pid"].as_i64())
        .map(|p| p as i32)
        .collect();
    pids.sort();
    pids.dedup();
    Some(pids)
}

/// Grace for the instants of two processes' clocks reads around one exit.
const GRACE_NS: u64 = 50_000_000;

/// T (the harness's `--ttl 2s`) plus the longest delay a request meets here (1.5 s) and a
/// margin, in ns: a lock still held by a wrapper's pid later than this after the wrapper ended
/// belongs to another process that got the same pid.
const PID_REUSE_NS: u64 = 6_000_000_000;

pub fn check(h: &History, seen: &[Observation], out: &mut Vec<Violation>) {
    let mut reported = std::collections::BTreeSet::new();
    for o in seen {
        for &pid in &o.pids {
            // The wrapper with this pid that was alive last before the query.
            let Some(w) = h
                .wrappers
                .values()
                .filter(|w| w.pid == pid && w.spawned < o.sent)
                .max_by_key(|w| w.spawned)
            else {
                continue;
            };
            let killed = matches!(w.sent, Some((libc::SIGKILL, _))) || w.hung;
            // Long after its end the pid is another process's: 4 000 runs in ten minutes
            // (each with its command, observer and nested runs) wrap the pids. A lock nobody
            // renews lasts T from its last grant, and a request held up (1.5 s at most here)
            // lands no later than that after the wrapper's end.
            let reused = o.sent > w.ended + PID_REUSE_NS;
            if w.ended + GRACE_NS >= o.sent || killed || reused || !reported.insert(w.plan.run) {
                continue;
            }
            let said = std::fs::read_to_string(&w.stderr).unwrap_or_default();
            // A run that lost its lease (76) could not reach the server to renew, and mostly
            // not to release either (said at info level only, after the loss's own line): its
            // key lapses by itself within T of its last renewal, inside the guarantee.
            // Likewise a run that ended 69 because the server did not answer: its give-back
            // went the same way, and an attempt of it that lands later holds the lock until
            // its lease ends (the documented limit of a give-back that is never confirmed).
            let unreleased = said.contains("could not release")
                || said.contains("by itself")
                || ((w.status == 76 || w.status == 69) && o.sent < w.ended + PID_REUSE_NS);
            out.push(Violation {
                invariant: "held by a wrapper that had ended",
                name: o.name.clone(),
                detail: format!(
                    "run {} (pid {}, status {}, {:?}) ended at {:.3}s; status said it held {} at \
                     {:.3}s; stderr: {}",
                    w.plan.run,
                    w.pid,
                    w.status,
                    w.plan.wait,
                    w.ended as f64 / 1e9,
                    o.name,
                    o.sent as f64 / 1e9,
                    w.stderr_tail()
                ),
                excused: unreleased.then(|| "its release failed; the lease lapses".to_owned()),
            });
        }
    }
}
