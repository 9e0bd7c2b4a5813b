//! The history's bounds: anyone who can use a lock can write its history, so a reader takes a
//! record of at most 4 KiB, skips larger and malformed ones (and says how many it skipped)
//! instead of failing, and lists the rest.

use super::backends::Backend;

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    store.lr().job(["true"]).run().expect(0);
    let genuine = store.history();
    assert_eq!(genuine.len(), 1, "{genuine:?}");
    let mut huge = genuine[0].clone();
    huge["host"] = "x".repeat(5000).into();
    huge["token"] = "forged-huge".into();
    huge["ended_at"] = "2999-01-01T00:00:00.000Z".into();
    store.servers.add_history_record(&huge.to_string());
    store
        .servers
        .add_history_record("{\"host\": \"not a record");
    let out = store.op("history").args(["--json", "job"]).run().expect(0);
    let listed: Vec<String> = out
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["token"].to_string())
        .collect();
    assert_eq!(
        listed,
        [genuine[0]["token"].to_string()],
        "only the genuine run"
    );
    assert_eq!(out.json().as_array().unwrap(), &genuine);
    // Two records skipped on each server they were written to (Redlock: on every one of its
    // servers, whose counts add up).
    let skipped: usize = out
        .stderr
        .split_once("skipped ")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("says how many it skipped: {}", out.stderr));
    assert!(
        skipped >= 2 && skipped % 2 == 0,
        "says how many it skipped: {}",
        out.stderr
    );
    let status = store.op("status").arg("job").run().expect(1);
    assert!(!status.stdout.contains("xxxx"), "{}", status.stdout);
}
