//! The holder most tests need: a `locked-run` whose command says it is up (its fence in
//! `started`) and runs until the test says go, then writes its end time (ns since the epoch) to
//! `ended`.

use std::path::PathBuf;
use std::time::Duration;

use super::cmd::{LockedRun, lr};
use super::process::{Output, Running, wait_for_file};
use super::server::Redis;
use super::{path_str, scratch};

pub struct Holder {
    pub running: Running,
    dir: tempfile::TempDir,
}

impl Holder {
    /// Holds `name` on `redis`, with `extra` options; returns once the command runs.
    pub fn start(redis: &Redis, name: &str, extra: &[&str]) -> Holder {
        Holder::start_on(&redis.url(), name, extra)
    }

    /// The same on whatever `url` names.
    pub fn start_on(url: &str, name: &str, extra: &[&str]) -> Holder {
        Holder::with(lr().url(url).args(extra), name)
    }

    /// The same with a command line of the test's own (`lr().on(&five)`, options), ending
    /// before the NAME.
    pub fn with(locked_run: LockedRun, name: &str) -> Holder {
        let dir = scratch();
        let script = format!(
            "echo $LOCKED_RUN_FENCE > {d}/started.tmp; mv {d}/started.tmp {d}/started; \
             while [ ! -e {d}/go ]; do sleep 0.01; done; date +%s%N > {d}/ended",
            d = path_str(dir.path())
        );
        let running = locked_run.name(name).sh(&script).spawn();
        wait_for_file(&dir.path().join("started"), Duration::from_secs(10), |t| {
            !t.is_empty()
        });
        Holder { running, dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn pid(&self) -> i32 {
        self.running.pid()
    }

    /// The fence its command was given (`LOCKED_RUN_FENCE`, as it wrote it to `started`).
    pub fn fence(&self) -> u64 {
        std::fs::read_to_string(self.path("started"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Tells the command to end, and waits for `locked-run`.
    pub fn finish(self) -> Output {
        self.finish_keeping_logs().0
    }

    /// [`Holder::finish`], keeping the directory of `started` and `ended`.
    pub fn finish_keeping_logs(self) -> (Output, tempfile::TempDir) {
        std::fs::write(self.path("go"), "").unwrap();
        (self.running.wait(), self.dir)
    }
}

/// A run of `job` whose command appends `start WHO $LOCKED_RUN_SHARED` to `DIR/log`, waits for
/// `DIR/WHO.go` ([`go`]), then appends `end WHO`: the log ([`log_of`]) orders the runs.
pub fn logged(url: &str, dir: &std::path::Path, who: &str, extra: &[&str]) -> Running {
    let (log, go) = (dir.join("log"), dir.join(format!("{who}.go")));
    lr().url(url)
        .args(extra)
        .name("job")
        .sh(&format!(
            "echo start {who} $LOCKED_RUN_SHARED >> {l}; while [ ! -e {g} ]; do sleep 0.01; done; \
             echo end {who} >> {l}",
            l = path_str(&log),
            g = path_str(&go)
        ))
        .spawn()
}

/// What the [`logged`] runs wrote so far.
pub fn log_of(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("log")).unwrap_or_default()
}

/// Lets the [`logged`] run `who` end.
pub fn go(dir: &std::path::Path, who: &str) {
    std::fs::write(dir.join(format!("{who}.go")), "").unwrap();
}
