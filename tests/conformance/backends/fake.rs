//! The fake backend (`fake:///PATH`, built with the `fake-backend` feature) as the conformance
//! suite runs it: a state file in a directory of the test's own, shared by the test's
//! processes as a server would be.

use std::os::fd::AsRawFd;

use serde_json::{Value, json};

use super::{Backend, HostileStore, Queue, Servers, Store, Supports, Tenure, url_args};
use crate::support::*;

/// The fake backend, on a store of the test's own.
pub struct Fake;

struct Directory(tempfile::TempDir);

impl Directory {
    fn url(&self) -> String {
        format!("fake://{}/store", path_str(self.0.path()))
    }
}

impl Directory {
    /// Changes the state under the store's lock, as the backend does.
    fn change(&self, change: impl FnOnce(&mut Value)) {
        let (path, lock) = (
            self.0.path().join("store"),
            self.0.path().join("store.lock"),
        );
        let lock = std::fs::File::create(lock).unwrap();
        // SAFETY: flock on a descriptor `lock` keeps open.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        let mut state: Value = std::fs::read_to_string(&path)
            .map(|text| serde_json::from_str(&text).unwrap())
            .unwrap_or_else(|_| json!({}));
        change(&mut state);
        std::fs::write(&path, state.to_string()).unwrap();
    }
}

impl Servers for Directory {
    /// The record as the newest of `job`'s.
    fn add_history_record(&self, record: &str) {
        self.change(|state| {
            let mut history = state["history"]["job"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            history.push(record.into());
            state["history"]["job"] = history.into();
        });
    }

    /// In the key of `job`'s holder.
    fn plant_far_since(&self) {
        self.change(|state| {
            assert!(state["locks"]["job"].is_object(), "{state}");
            state["locks"]["job"]["since_ms"] = super::FAR_SINCE_MS.into();
        });
    }
}

impl Backend for Fake {
    fn supports(&self) -> Supports {
        Supports {
            holders: false,
            shared: false,
            queue: Queue::Racing,
            tenure: Tenure::Lease,
            status_keys: &[],
            history_order: true,
        }
    }

    fn start(&self) -> Store {
        let dir = Directory(scratch());
        Store::at(dir.url(), dir)
    }

    /// A store below a device file: it cannot be reached.
    fn unreachable(&self) -> Vec<String> {
        url_args("fake:///dev/null/store".into())
    }

    /// A FIFO where the state file should be: opening it must neither block nor be believed.
    fn hostile(&self) -> Option<HostileStore> {
        let dir = Directory(scratch());
        let made = std::process::Command::new("mkfifo")
            .arg(dir.0.path().join("store"))
            .status()
            .unwrap();
        assert!(made.success());
        Some(HostileStore {
            urls: url_args(dir.url()),
            says: "store: not a regular file",
            _keep: Box::new(dir.0),
        })
    }
}
