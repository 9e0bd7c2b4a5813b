//! A 0.1.0 holder, its recorded state loaded into a fresh store, excludes this build on every
//! backend and in every mode, and this build's `status` shows it: the host, pid and command
//! 0.1.0 wrote, its fence, its N, its mode, its waiter. A 0.1.0 fence counter goes on counting.

use serde_json::Value;

use super::{Backend, fixture, load};
use crate::support::*;

/// One scenario's recorded state.
struct State<'a>(&'a Value);

impl<'a> State<'a> {
    fn of(fixture: &'a Value, key: &str) -> State<'a> {
        State(&fixture["scenarios"][key])
    }

    fn entries(&self) -> &'a [Value] {
        self.0["entries"].as_array().unwrap()
    }

    fn server_ms(&self) -> i64 {
        self.0["server_ms"].as_i64().unwrap()
    }

    /// The recorded entry whose key or file name is `id`.
    fn entry(&self, id: &str) -> &'a Value {
        self.entries()
            .iter()
            .find(|e| e["key"] == id || e["file"] == id)
            .unwrap_or_else(|| panic!("no {id} in {:?}", self.0))
    }
}

/// `-n` on `name` with `extra` options, by this build: its exit status.
fn try_now(url: &str, name: &str, extra: &[&str]) -> Output {
    lr().url(url)
        .arg("-n")
        .args(extra)
        .name(name)
        .sh("true")
        .run()
}

/// This build's fence on `name`, taken and released at once.
fn next_fence(url: &str, name: &str) -> i64 {
    let out = lr()
        .url(url)
        .name(name)
        .sh("echo $LOCKED_RUN_FENCE")
        .run()
        .expect(0);
    out.stdout.trim().parse().unwrap()
}

/// `status --json`'s holder is the one the record describes.
fn assert_holder(status: &Value, host: &Value, pid: i64, command: &Value) {
    let holder = &status["holder"];
    assert_eq!(&holder["host"], host, "{status}");
    assert_eq!(holder["pid"].as_i64(), Some(pid), "{status}");
    assert_eq!(&holder["command"], command, "{status}");
}

fn number(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("{v} is no number"))
}

#[test]
fn a_0_1_0_holder_in_redis_excludes_this_build_and_status_shows_it() {
    let fixture = fixture(Backend::Redis);
    let redis = Redis::start();
    let url = redis.url();
    let load = |key: &str, keep: fn(&str) -> bool| {
        let state = State::of(&fixture, key);
        load::into_redis(&redis, state.entries(), state.server_ms(), keep);
        state
    };

    let held = load("held", |_| true);
    try_now(&url, "layout-held", &[]).expect(75);
    let record = &held.entry("holder:{layout-held}")["value"];
    let status = status_json(&url, "layout-held");
    assert_eq!(status["held"], true, "{status}");
    assert_eq!(status["fence"].as_i64(), Some(number(&record["fence"])));
    assert_holder(
        &status,
        &record["host"],
        number(&record["pid"]),
        &record["command"],
    );

    load("holders", |_| true);
    try_now(&url, "layout-holders", &["--holders", "2"]).expect(75);
    try_now(&url, "layout-holders", &["--holders", "3"]).expect_one_line(2, "--holders 2");
    let status = status_json(&url, "layout-holders");
    assert_eq!(status["limit"], 2, "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");

    load("shared", |_| true);
    try_now(&url, "layout-shared", &[]).expect(75);
    let status = status_json(&url, "layout-shared");
    assert_eq!(status["mode"], "shared", "{status}");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");
    try_now(&url, "layout-shared", &["--shared"]).expect(0);

    // The waiter's place alone (its holder left): free, but a 0.1.0 waiter comes first.
    load("queue", |key| key.starts_with("queue"));
    try_now(&url, "layout-queue", &[]).expect(75);
    assert_eq!(status_json(&url, "layout-queue")["waiters"], 1);

    let released = load("released", |_| true);
    let fence = number(&released.entry("fence:{layout-released}")["value"]);
    assert_eq!(next_fence(&url, "layout-released"), fence + 1);
}

#[test]
fn a_0_1_0_holder_in_etcd_excludes_this_build_and_status_shows_it() {
    let fixture = fixture(Backend::Etcd);
    let etcd = Etcd::start();
    let url = etcd.url();
    let load = |key: &str| {
        let state = State::of(&fixture, key);
        load::into_etcd(&etcd, state.entries());
        state
    };

    let held = load("held");
    try_now(&url, "layout-held", &[]).expect(75);
    let record: Value = serde_json::from_str(held.entries()[0]["value"].as_str().unwrap()).unwrap();
    let status = status_json(&url, "layout-held");
    assert_eq!(status["held"], true, "{status}");
    assert_holder(
        &status,
        &record["host"],
        number(&record["pid"]),
        &record["command"],
    );

    load("holders");
    try_now(&url, "layout-holders", &["--holders", "2"]).expect(75);
    try_now(&url, "layout-holders", &["--holders", "3"]).expect_one_line(2, "--holders 2");
    let status = status_json(&url, "layout-holders");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");

    load("shared");
    try_now(&url, "layout-shared", &[]).expect(75);
    assert_eq!(status_json(&url, "layout-shared")["mode"], "shared");
    try_now(&url, "layout-shared", &["--shared"]).expect(0);

    // A holder and a waiter behind it.
    load("queue");
    try_now(&url, "layout-queue", &[]).expect(75);
    assert_eq!(status_json(&url, "layout-queue")["waiters"], 1);
}

#[test]
fn a_0_1_0_holder_in_a_directory_excludes_this_build_and_status_shows_it() {
    let fixture = fixture(Backend::Dir);
    let dir = scratch();
    let url = file_url(dir.path());
    let mut flocks = Vec::new();
    let mut load = |key: &str| {
        let state = State::of(&fixture, key);
        flocks.extend(load::into_dir(dir.path(), state.entries()));
        state
    };

    let held = load("held");
    try_now(&url, "layout-held", &[]).expect(75);
    let status = status_json(&url, "layout-held");
    assert_eq!(status["held"], true, "{status}");
    let meta = held.entry("layout-held.lock")["content"].as_str().unwrap();
    let field = |f: &str| {
        meta.lines()
            .find_map(|l| l.strip_prefix(&format!("{f}=")))
            .unwrap()
            .to_owned()
    };
    assert_eq!(status["holder"]["host"], field("host").as_str(), "{status}");
    assert!(status["holder"]["since"].is_string(), "{status}");
    assert_eq!(
        status["holder"]["command"],
        field("command").as_str(),
        "{status}"
    );
    assert_eq!(
        status["fence"].as_i64(),
        Some(number(&field("fence").into()))
    );

    load("holders");
    try_now(&url, "layout-holders", &["--holders", "2"]).expect(75);
    try_now(&url, "layout-holders", &["--holders", "3"]).expect_one_line(2, "--holders 2");
    let status = status_json(&url, "layout-holders");
    assert_eq!(status["holders"].as_array().unwrap().len(), 2, "{status}");

    load("shared");
    try_now(&url, "layout-shared", &[]).expect(75);
    assert_eq!(status_json(&url, "layout-shared")["mode"], "shared");
    try_now(&url, "layout-shared", &["--shared"]).expect(0);

    let released = load("released");
    let fence = number(
        &released.entry("layout-released.fence")["content"]
            .as_str()
            .unwrap()
            .trim()
            .into(),
    );
    // Past the old counter, from the clock on (a new block starts at least at the clock's
    // reading in microseconds): the upgrade's jump forward.
    let since = clock_us() as i64;
    let next = next_fence(&url, "layout-released");
    assert!(next > fence && next > since, "{next} after {fence}");
    drop(flocks);
}
