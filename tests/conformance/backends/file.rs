//! `file://` as the conformance suite runs it: a directory of the test's own.

use super::{Backend, HostileStore, Queue, Servers, Store, Supports, Tenure, url_args};
use crate::support::*;

/// `file://` on a directory of the test's own.
pub struct File;

struct Directory(tempfile::TempDir);

impl Servers for Directory {
    fn add_history_record(&self, record: &str) {
        use std::io::Write;
        let mut history = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.0.path().join("job.history"))
            .unwrap();
        writeln!(history, "{record}").unwrap();
    }

    /// A line of the held lock file (its holder's `key=value` lines: the last one counts).
    fn plant_far_since(&self) {
        use std::io::Write;
        let mut lock = std::fs::OpenOptions::new()
            .append(true)
            .open(self.0.path().join("job.lock"))
            .unwrap();
        writeln!(lock, "since_ms={}", super::FAR_SINCE_MS).unwrap();
    }
}

impl Backend for File {
    fn supports(&self) -> Supports {
        Supports {
            holders: true,
            shared: true,
            queue: Queue::Waiters,
            tenure: Tenure::Kernel,
            status_keys: &[],
            history_order: true,
        }
    }

    fn start(&self) -> Store {
        let dir = scratch();
        Store {
            urls: url_args(file_url(dir.path())),
            run_args: Vec::new(),
            servers: Box::new(Directory(dir)),
        }
    }

    /// A directory below a device file: it cannot be reached.
    fn unreachable(&self) -> Vec<String> {
        url_args("file:///dev/null/locks".into())
    }

    /// A FIFO where the lock file should be: opening it must neither block nor be believed.
    fn hostile(&self) -> Option<HostileStore> {
        let dir = scratch();
        let made = std::process::Command::new("mkfifo")
            .arg(dir.path().join("job.lock"))
            .status()
            .unwrap();
        assert!(made.success());
        Some(HostileStore {
            urls: url_args(file_url(dir.path())),
            says: "job.lock: not a regular file",
            _keep: Box::new(dir),
        })
    }
}
