//! Test support: real `redis-server` processes on free ports (killed on drop), the binary under
//! test with a hard timeout on every run (command lines built with [`cmd::lr`]), and helpers
//! that wait on evidence (a process's exit through a pidfd, a file's content, Redis state)
//! instead of sleeping.
//!
//! One file per concern: `server` (one server, and what it can be asked), `sentinel`,
//! `cluster` and `redlock` (topologies of several), `tls` and `certs` (what the secured ones
//! are made of), `etcd`, `proxy` (a TCP fault proxy), `hostile` (fake servers whose replies
//! are endless, huge or malformed), `process` (processes under a hard timeout, and waits on
//! evidence), `cmd` (the `lr()` command builder), `holder` (a run that says it is up and
//! waits for go), `sections` (critical sections logged and checked), `blocked_exec` (a
//! command whose exec blocks). What most test files use is re-exported here, so that
//! `use crate::support::*;` brings it; what one topic's tests use (the proxy, the hostile
//! servers, the secured topologies) is imported from its module.

use std::path::{Path, PathBuf};

pub mod blocked_exec;
pub mod certs;
pub mod cluster;
pub mod cmd;
pub mod etcd;
pub mod grpc_fake;
pub mod holder;
pub mod hostile;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod redlock;
pub mod sections;
pub mod sentinel;
pub mod server;
pub mod tls;

pub use blocked_exec::{
    children_by_exit_signal, leased_program, stop_across_the_start, wait_until_gone, watcher_child,
};
pub use certs::Certs;
pub use cluster::Cluster;
pub use cmd::{
    LockedRun, fences_in, history_fences, lr, lr_closed_stdio, lr_of, lr_stderr_to, status_json,
};
pub use etcd::Etcd;
pub use holder::{Holder, go, log_of, logged};
pub use process::{
    Output, Running, alive, asleep, has_open, holding_flock, locked_run, run, run_args, signal,
    spawn, start_job, wait_for_file, wait_pid_exit, wait_timeout, wait_until, without_our_settings,
};
pub use redlock::{Five, locked_run_on};
pub use sections::{CRITICAL_SECTION, check_concurrency, check_log};
pub use sentinel::{Watched, sentinel_cli};
pub use server::{
    Redis, command_stats, expiry_lower_bound, free_port, queued, release_channels, server_kind,
    skip_unless, subscribers,
};

pub const BIN: &str = env!("CARGO_BIN_EXE_locked-run");

/// The wall clock in microseconds since the Unix epoch: a `file://` lock's fences start at
/// least there in a new directory (a new block of fences starts at least at the clock).
pub fn clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Sets `path`'s times two minutes back (`touch -d`): what a file a run left long ago looks like.
pub fn two_minutes_old(path: &Path) {
    let touched = std::process::Command::new("touch")
        .args(["-d", "2 minutes ago"])
        .arg(path)
        .status()
        .unwrap();
    assert!(touched.success(), "touch -d {}", path.display());
}

/// A scratch directory for the children's logs.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

/// The absolute path of `program` on PATH.
pub fn on_path(program: &str) -> std::path::PathBuf {
    std::env::var("PATH")
        .unwrap()
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not on PATH"))
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn file(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// The `file://` URL of a lock directory.
pub fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// The fence counter of the lock whose files in `dir` are named `stem`.
pub fn fence_file(dir: &Path, stem: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{stem}.fence"))).unwrap()
}

pub fn sh(script: &str) -> [&str; 3] {
    ["sh", "-c", script]
}
