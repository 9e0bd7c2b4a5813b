//! The command's environment: `LOCKED_RUN_FENCE` (the fence `status` shows), `LOCKED_RUN_NAME`,
//! `LOCKED_RUN_KEY`, `LOCKED_RUN_TOKEN` (the holder's token `status` shows) and
//! `LOCKED_RUN_TTL_MS` (T, also where there is no lease), `LOCKED_RUN_HOLDERS` and
//! `LOCKED_RUN_SHARED`.

use std::time::Duration;

use super::backends::Backend;
use crate::support::*;

const VARIABLES: &[&str] = &[
    "LOCKED_RUN_FENCE",
    "LOCKED_RUN_NAME",
    "LOCKED_RUN_KEY",
    "LOCKED_RUN_TOKEN",
    "LOCKED_RUN_TTL_MS",
    "LOCKED_RUN_HOLDERS",
    "LOCKED_RUN_SHARED",
];

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    let dir = scratch();
    let (env, go) = (dir.path().join("env"), dir.path().join("go"));
    let lines: Vec<String> = VARIABLES
        .iter()
        .map(|v| format!("echo \"{v}=${{{v}-unset}}\""))
        .collect();
    let running = store
        .lr()
        .args(["--ttl", "10s"])
        .name("job")
        .sh(&format!(
            "{{ {}; }} > {e}.tmp; mv {e}.tmp {e}; while [ ! -e {g} ]; do sleep 0.01; done",
            lines.join("; "),
            e = path_str(&env),
            g = path_str(&go)
        ))
        .spawn();
    let text = wait_for_file(&env, Duration::from_secs(15), |t| !t.is_empty());
    let get = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .to_owned()
    };
    let status = store.status();
    assert_eq!(
        get("LOCKED_RUN_FENCE"),
        status["fence"].to_string(),
        "{status}"
    );
    assert_eq!(get("LOCKED_RUN_NAME"), "job");
    assert!(get("LOCKED_RUN_KEY").contains("job"), "{text}");
    assert_eq!(
        get("LOCKED_RUN_TOKEN"),
        status["holders"][0]["token"].as_str().unwrap(),
        "{status}"
    );
    assert_eq!(get("LOCKED_RUN_TTL_MS"), "10000");
    assert_eq!(get("LOCKED_RUN_HOLDERS"), "1");
    assert_eq!(get("LOCKED_RUN_SHARED"), "0");
    std::fs::write(&go, "").unwrap();
    running.wait().expect(0);
}
