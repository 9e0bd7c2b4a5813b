//! What the promises ask of a started store, whatever its backend: runs and the operators'
//! subcommands pointed at it, its `status --json`, its history, and waits on its evidence
//! (the waiters `status` counts).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use super::backends::Store;
use crate::support::*;

impl Store {
    /// `locked-run` with the store's `-u` arguments and a run's options, nothing else yet.
    pub fn lr(&self) -> LockedRun {
        lr().args(&self.urls).args(&self.run_args)
    }

    /// `locked-run SUBCOMMAND` with the store's `-u` arguments, nothing else yet.
    pub fn op(&self, subcommand: &str) -> LockedRun {
        lr().arg(subcommand).args(&self.urls)
    }

    /// `status --json job`, parsed.
    #[track_caller]
    pub fn status(&self) -> Value {
        let out = self.op("status").args(["--json", "job"]).run();
        assert!(matches!(out.code(), Some(0 | 1)), "status: {out:?}");
        out.json()
    }

    /// How many wait for `job`, as `status` counts them.
    #[track_caller]
    pub fn waiters(&self) -> u64 {
        let status = self.status();
        status["waiters"]
            .as_u64()
            .unwrap_or_else(|| panic!("no count of waiters: {status}"))
    }

    /// Waits until `status` counts `n` waiters of `job`.
    #[track_caller]
    pub fn wait_for_waiters(&self, n: u64) {
        wait_until(
            &format!("{n} waiter(s) counted"),
            Duration::from_secs(15),
            || self.waiters() == n,
        );
    }

    /// A run of `job` (with `extra` options) whose command says it is up and runs until told.
    pub fn holder(&self, extra: &[&str]) -> Holder {
        Holder::with(self.lr().args(extra), "job")
    }

    /// `history --json job`, as an array (empty when there is none: status 1).
    #[track_caller]
    pub fn history(&self) -> Vec<Value> {
        let out = self
            .op("history")
            .args(["--json", "--limit", "20", "job"])
            .run();
        assert!(matches!(out.code(), Some(0 | 1)), "history: {out:?}");
        out.json().as_array().expect("an array").clone()
    }
}

/// This host's name, as holders' lines show it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_owned()
}

/// Now on the wall clock, in ns since the epoch: what `date +%s%N` in a command prints.
pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A run of `job` named `who` whose command appends `start WHO NS` to `log`, sleeps 50 ms, and
/// appends `end WHO NS` (NS: `date +%s%N`).
pub fn timed(store: &Store, log: &std::path::Path, who: &str, extra: &[&str]) -> Running {
    store
        .lr()
        .args(extra)
        .name("job")
        .sh(&format!(
            "echo start {who} $(date +%s%N) >> {l}; sleep 0.05; echo end {who} $(date +%s%N) >> {l}",
            l = path_str(log)
        ))
        .spawn()
}

/// The events of a [`timed`] log, in order: (kind, who, ns).
pub fn events(log: &std::path::Path) -> Vec<(String, String, u64)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f[0].to_owned(), f[1].to_owned(), f[2].parse().unwrap())
        })
        .collect()
}

/// When `who`'s `kind` (`start`, `end`) was logged.
#[track_caller]
pub fn at(events: &[(String, String, u64)], kind: &str, who: &str) -> u64 {
    events
        .iter()
        .find(|(k, w, _)| k == kind && w == who)
        .unwrap_or_else(|| panic!("no {kind} of {who} in {events:?}"))
        .2
}

/// The one line of `stderr`, which must be `locked-run:`'s.
#[track_caller]
pub fn one_line(stderr: &str) -> &str {
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("locked-run: "), "{stderr}");
    stderr.trim_end()
}

/// A run of `job` named `who` whose command appends `start WHO FENCE` to `DIR/log`, runs until
/// `DIR/WHO.go` exists ([`go`]), then appends `end WHO`.
pub fn gated(store: &Store, dir: &std::path::Path, who: &str, extra: &[&str]) -> Running {
    let (log, go) = (dir.join("log"), dir.join(format!("{who}.go")));
    store
        .lr()
        .args(extra)
        .name("job")
        .sh(&format!(
            "echo start {who} $LOCKED_RUN_FENCE >> {l}; while [ ! -e {g} ]; do sleep 0.01; done; \
             echo end {who} >> {l}",
            l = path_str(&log),
            g = path_str(&go)
        ))
        .spawn()
}

/// Lets the [`gated`] run `who` end.
pub fn go(dir: &std::path::Path, who: &str) {
    std::fs::write(dir.join(format!("{who}.go")), "").unwrap();
}

/// The lines the [`gated`] runs logged so far.
pub fn gated_log(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Waits until the [`gated`] run `who` logged its start; returns its fence.
#[track_caller]
pub fn started(dir: &std::path::Path, who: &str) -> u64 {
    let opening = format!("start {who} ");
    let mut fence = None;
    wait_until(&format!("{who} started"), Duration::from_secs(15), || {
        fence = gated_log(dir)
            .iter()
            .find_map(|l| l.strip_prefix(&opening)?.trim().parse().ok());
        fence.is_some()
    });
    fence.unwrap()
}

/// Whether the [`gated`] run `who` has logged `kind` (`start`, `end`).
pub fn logged(dir: &std::path::Path, kind: &str, who: &str) -> bool {
    let opening = format!("{kind} {who}");
    gated_log(dir)
        .iter()
        .any(|l| l == &opening || l.starts_with(&format!("{opening} ")))
}

/// The position of `kind who` in the [`gated`] log.
#[track_caller]
pub fn position(dir: &std::path::Path, kind: &str, who: &str) -> usize {
    let opening = format!("{kind} {who}");
    let log = gated_log(dir);
    log.iter()
        .position(|l| l == &opening || l.starts_with(&format!("{opening} ")))
        .unwrap_or_else(|| panic!("no {opening} in {log:?}"))
}

/// A mode this backend declares it cannot keep is refused when the lock is opened: status 2,
/// one line naming the option, nothing run and nothing held.
#[track_caller]
pub fn refused(store: &Store, option: &[&str], named: &str) {
    let dir = scratch();
    let ran = dir.path().join("ran");
    let out = store
        .lr()
        .args(option)
        .job(["touch", path_str(&ran)])
        .run()
        .expect_one_line(2, named);
    assert!(!ran.exists(), "nothing run: {out:?}");
    assert_eq!(store.status()["held"], false, "nothing held");
}
