//! `status --json` and `history --json` have the same keys on every backend (a backend may add
//! its own, which it declares), of the same types, free, held, and free again; and the same
//! text: a host whose name another party chose (escape sequences, a tab, a backslash before a
//! `u`) is its raw name, JSON-escaped, in both, on every backend.

use std::collections::BTreeSet;

use serde_json::Value;

use super::backends::Backend;
use crate::support::hostile::{can_name_hosts, on_host_named};

/// The host a run of the held phase runs on, as root (in a UTS namespace of its own): what
/// `status --json` and `history --json` must give back as it is, whichever store kept it.
const HOST: &str = "w\\u{1b}\t\u{1b}]0;x\u{7}\u{9b}31m\u{202e}\\";

/// Every backend's `status --json` keys.
const STATUS: &[&str] = &[
    "name", "held", "fence", "ttl_ms", "holder", "holders", "limit", "mode", "waiters", "last_run",
];
/// The keys of `holder`.
const HOLDER: &[&str] = &["host", "pid", "command", "since"];
/// The keys of each of `holders`.
const EACH_HOLDER: &[&str] = &[
    "host", "pid", "command", "since", "fence", "ttl_ms", "token",
];
/// The keys of a run in `history --json` (and `last_run`); `signal` only for a run ended by
/// one.
const RUN: &[&str] = &[
    "host",
    "pid",
    "user",
    "fence",
    "mode",
    "started_at",
    "ended_at",
    "waited_ms",
    "status",
    "ended",
    "token",
];

#[track_caller]
fn keys(object: &Value, expected: &[&str], extra: &[&str], what: &str) {
    let found: BTreeSet<&str> = object
        .as_object()
        .unwrap_or_else(|| panic!("{what} is no object: {object}"))
        .keys()
        .map(String::as_str)
        .collect();
    let expected: BTreeSet<&str> = expected.iter().chain(extra).copied().collect();
    assert_eq!(found, expected, "{what}: {object}");
}

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let extra = backend.supports().status_keys;

    let free = store.status();
    keys(&free, STATUS, extra, "status, never taken");
    assert_eq!(free["name"], "job");
    assert_eq!(free["held"], false);
    for key in ["ttl_ms", "holder", "mode", "last_run", "limit"] {
        assert_eq!(free[key], Value::Null, "{key}: {free}");
    }
    assert_eq!(free["holders"], Value::Array(Vec::new()), "{free}");
    assert_eq!(free["waiters"], 0, "{free}");

    // Issue 43's review: `file://` and Redis kept the printable form of a holder's names, so
    // their JSON differed from etcd's and PostgreSQL's (`w\\u{1b}...` for `w\u001b...`).
    let named = can_name_hosts();
    let holder = match named {
        true => crate::support::Holder::with(store.lr().with(|c| on_host_named(c, HOST)), "job"),
        false => store.holder(&[]),
    };
    let held = store.status();
    keys(&held, STATUS, extra, "status, held");
    assert_eq!(held["held"], true);
    assert_eq!(held["fence"], holder.fence(), "{held}");
    assert!(held["ttl_ms"].is_i64(), "{held}");
    assert_eq!(held["mode"], "exclusive", "{held}");
    assert_eq!(held["limit"], 1, "{held}");
    keys(&held["holder"], HOLDER, &[], "holder");
    assert_eq!(held["holder"]["pid"], holder.pid(), "{held}");
    assert_eq!(held["holder"]["command"], "sh", "{held}");
    assert!(held["holder"]["host"].is_string() && held["holder"]["since"].is_string());
    if named {
        assert_eq!(held["holder"]["host"], HOST, "the host as it is: {held}");
        assert_eq!(held["holders"][0]["host"], HOST, "{held}");
    }
    let each = held["holders"].as_array().unwrap();
    assert_eq!(each.len(), 1, "{held}");
    keys(&each[0], EACH_HOLDER, &[], "each of holders");
    assert_eq!(each[0]["fence"], holder.fence(), "{held}");
    holder.finish().expect(0);

    let after = store.status();
    keys(&after, STATUS, extra, "status, free again");
    assert_eq!(after["held"], false);
    assert_eq!(
        after["fence"], held["fence"],
        "the last fence issued: {after}"
    );
    keys(&after["last_run"], RUN, &[], "last_run");

    let runs = store.history();
    assert_eq!(runs.len(), 1, "{runs:?}");
    keys(&runs[0], RUN, &[], "a run of history --json");
    assert_eq!(
        runs[0], after["last_run"],
        "last_run is the history's newest"
    );
    if named {
        assert_eq!(runs[0]["host"], HOST, "{runs:?}");
    }
}
