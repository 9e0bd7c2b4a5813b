//! Test support: real `redis-server` processes on free ports (killed on drop), the binary under
//! test with a hard timeout on every run (command lines built with [`cmd::lr`]), and helpers
//! that wait on evidence (a process's exit through a pidfd, a file's content, Redis state)
//! instead of sleeping.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Read;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

pub mod blocked_exec;
pub mod certs;
pub mod cmd;
pub mod etcd;
pub mod holder;
pub mod hostile;
pub mod postgres;
pub mod process;
pub mod proxy;
pub mod sections;
pub mod server;
pub mod topology;

#[allow(unused_imports)]
pub use blocked_exec::*;
pub use certs::*;
#[allow(unused_imports)]
pub use cmd::{LockedRun, lr, lr_of, status_json};
#[allow(unused_imports)]
pub use etcd::Etcd;
#[allow(unused_imports)]
pub use holder::{Holder, go, log_of, logged};
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use sections::*;
#[allow(unused_imports)]
pub use server::*;
#[allow(unused_imports)]
pub use topology::{Cluster, Five, Watched, locked_run_on, sentinel_cli};

pub const BIN: &str = env!("CARGO_BIN_EXE_locked-run");

/// A scratch directory for the children's logs.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
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

pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(cmd: &mut Command, items: I) {
    cmd.args(items);
}
