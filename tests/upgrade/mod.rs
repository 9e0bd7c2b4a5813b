//! A rolling upgrade: 0.1.0 and this build on the same NAMEs, on every backend.
//!
//! `tests/fixtures/layout-0.1.0/` holds what 0.1.0 (commit 45561ab) left in Redis, in etcd and
//! in a `file://` directory in each state of `scenarios.rs`, recorded by the tests below run
//! against its binary (the fixtures' README says how). Both directions are checked:
//! - a 0.1.0 holder, its recorded state loaded into a fresh server or directory, excludes this
//!   build, whose `status` shows it (`excluded.rs`);
//! - this build, in the same states, writes the same keys or files, of the same types, expiry
//!   and value shapes, so that a 0.1.0 run reads them as it reads its own (below).
//!
//! What this does not cover is in docs/upgrading.md.

mod excluded;
mod layout;
mod load;
mod scenarios;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::support::*;
use layout::{dir_files, etcd_keys, hostname, redis_keys, redis_time_ms, shapes};
use scenarios::{SCENARIOS, Scenario, stage};

/// The release the fixtures were recorded from.
const RELEASE: &str = "0.1.0";

/// Keys or files (by shape: `NAME` for the lock's name; a trailing `*`: any key so starting)
/// that this build writes and 0.1.0 did not. Each needs its line in docs/upgrading.md: what a
/// 0.1.0 run makes of it.
const NEW_SINCE_RELEASE: &[&str] = &[
    "history:{NAME}",
    "NAME.history",
    "locked-run/history/NAME/*",
];

/// Whether `key` is one of [`NEW_SINCE_RELEASE`].
fn new_since_release(key: &str) -> bool {
    NEW_SINCE_RELEASE
        .iter()
        .any(|new| match new.strip_suffix('*') {
            Some(prefix) => key.starts_with(prefix),
            None => key == *new,
        })
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Backend {
    Redis,
    Etcd,
    Dir,
}

impl Backend {
    fn fixture(self) -> PathBuf {
        let file = match self {
            Backend::Redis => "redis.json",
            Backend::Etcd => "etcd.json",
            Backend::Dir => "file.json",
        };
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/layout-{RELEASE}"))
            .join(file)
    }

    /// The scenarios whose state this backend keeps where it can be read: a `file://` waiter
    /// is a process blocked in flock(2), with nothing on disk.
    fn scenarios(self) -> impl Iterator<Item = &'static Scenario> {
        SCENARIOS
            .iter()
            .filter(move |s| !(self == Backend::Dir && s.waiter))
    }
}

/// The recorded layout of `backend`: `{release, host, scenarios: {KEY: {name, server_ms,
/// entries}}}`.
fn fixture(backend: Backend) -> Value {
    let path = backend.fixture();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Every scenario of `backend`, made by the binary `bin`, read out as the fixtures have it.
fn record(backend: Backend, bin: &str) -> Value {
    let mut scenarios = serde_json::Map::new();
    let mut put = |s: &Scenario, server_ms: i64, entries: Vec<Value>| {
        let state = json!({"name": s.name(), "server_ms": server_ms, "entries": entries});
        scenarios.insert(s.key.to_owned(), state);
    };
    match backend {
        Backend::Redis => {
            let redis = Redis::start();
            for s in backend.scenarios() {
                let name = s.name();
                let staged = stage(bin, &redis.url(), s, || {
                    redis.exists(&format!("queue:{{{name}}}"))
                });
                put(s, redis_time_ms(&redis), redis_keys(&redis, &name));
                staged.end();
            }
        }
        Backend::Etcd => {
            let etcd = Etcd::start();
            let of = |name: &str| -> Vec<Value> {
                etcd_keys(&etcd)
                    .into_iter()
                    .filter(|k| k["key"].as_str().unwrap().contains(name))
                    .collect()
            };
            for s in backend.scenarios() {
                let name = s.name();
                let staged = stage(bin, &etcd.url(), s, || of(&name).len() > s.holders.len());
                put(s, 0, of(&name));
                staged.end();
            }
        }
        Backend::Dir => {
            let dir = scratch();
            let url = file_url(dir.path());
            for s in backend.scenarios() {
                let name = s.name();
                let staged = stage(bin, &url, s, || false);
                let files = dir_files(dir.path())
                    .into_iter()
                    .filter(|f| f["file"].as_str().unwrap().contains(&name))
                    .collect();
                put(s, 0, files);
                staged.end();
            }
        }
    }
    json!({
        "release": run_version(bin),
        "host": hostname(),
        "scenarios": scenarios,
    })
}

/// `bin --version`'s line.
fn run_version(bin: &str) -> String {
    let mut cmd = without_our_settings(bin);
    cmd.arg("--version");
    run(cmd).stdout.trim().to_owned()
}

/// Where this build's layout differs from the recording's, scenario by scenario: a key the
/// release wrote that this build does not write, or writes in another shape, and a key this
/// build adds that [`NEW_SINCE_RELEASE`] does not list.
fn differences(then: &Value, now: &Value, backend: Backend) -> Vec<String> {
    let mut found = Vec::new();
    for s in backend.scenarios() {
        let shape_of = |recording: &Value, host: &str| -> BTreeMap<String, String> {
            let state = &recording["scenarios"][s.key];
            let entries = state["entries"].as_array().unwrap();
            shapes(
                entries,
                &s.name(),
                host,
                state["server_ms"].as_i64().unwrap(),
            )
        };
        let old = shape_of(then, then["host"].as_str().unwrap());
        let new = shape_of(now, &hostname());
        for (key, shape) in &old {
            match new.get(key) {
                Some(same) if same == shape => {}
                Some(other) => found.push(format!(
                    "{}: {key}\n  {RELEASE}: {shape}\n  now:   {other}",
                    s.key
                )),
                None => found.push(format!("{}: {key} is no longer written ({shape})", s.key)),
            }
        }
        for key in new.keys().filter(|k| !old.contains_key(*k)) {
            if !new_since_release(key) {
                found.push(format!("{}: {key} is new ({})", s.key, new[key]));
            }
        }
    }
    found
}

/// With `LOCKED_RUN_LAYOUT_BIN=PATH` (a build of the release), the scenarios are recorded with
/// that binary into the fixtures instead of being checked: how the fixtures were made.
fn check_or_record(backend: Backend) {
    if let Ok(bin) = std::env::var("LOCKED_RUN_LAYOUT_BIN") {
        let recording = record(backend, &bin);
        let text = serde_json::to_string_pretty(&recording).unwrap() + "\n";
        std::fs::create_dir_all(backend.fixture().parent().unwrap()).unwrap();
        std::fs::write(backend.fixture(), text).unwrap();
        eprintln!("recorded {} with {bin}", backend.fixture().display());
        return;
    }
    let then = fixture(backend);
    let now = record(backend, BIN);
    let found = differences(&then, &now, backend);
    assert!(
        found.is_empty(),
        "this build's {backend:?} layout differs from {RELEASE}'s (a {RELEASE} run would not \
         read it as its own; if that is meant, say so in docs/upgrading.md and list what is new \
         in NEW_SINCE_RELEASE):\n{}",
        found.join("\n")
    );
}

#[test]
fn this_build_writes_the_0_1_0_layout_in_redis() {
    check_or_record(Backend::Redis);
}

#[test]
fn this_build_writes_the_0_1_0_layout_in_etcd() {
    check_or_record(Backend::Etcd);
}

#[test]
fn this_build_writes_the_0_1_0_layout_in_a_directory() {
    check_or_record(Backend::Dir);
}
