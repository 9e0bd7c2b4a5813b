//! The history's fields: runs that end 0, 3, by a signal and by `--max-run` are listed newest
//! first, each with how it ended and the status `locked-run` returned, fences in order, the
//! host, pid, user, mode and times; `--limit`; one line each in text; `status`'s last run.

use std::os::unix::process::ExitStatusExt;

use serde_json::Value;

use super::backends::Backend;
use super::store::hostname;

fn field(runs: &[Value], key: &str) -> Vec<Value> {
    runs.iter().map(|r| r[key].clone()).collect()
}

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    assert!(store.history().is_empty(), "never taken: no history");
    store
        .op("history")
        .arg("job")
        .run()
        .expect_with(1, "no history");
    let first = store.lr().job(["true"]).spawn();
    let pid = first.pid();
    first.wait().expect(0);
    store.lr().name("job").sh("exit 3").run().expect(3);
    let killed = store.lr().name("job").sh("kill -TERM $$").run();
    assert_eq!(killed.status.signal(), Some(15), "{killed:?}");
    store
        .lr()
        .args(["--max-run", "300ms", "-k", "300ms"])
        .job(["sleep", "5"])
        .run()
        .expect(124);

    let runs = store.history();
    assert_eq!(
        field(&runs, "status"),
        [124, 143, 3, 0].map(Value::from),
        "{runs:?}"
    );
    assert_eq!(
        field(&runs, "ended"),
        ["max-run", "signal", "exit", "exit"].map(Value::from)
    );
    assert_eq!(runs[1]["signal"], 15);
    let fences: Vec<u64> = runs.iter().map(|r| r["fence"].as_u64().unwrap()).collect();
    assert!(fences.windows(2).all(|w| w[0] > w[1]), "{fences:?}");
    let oldest = &runs[3];
    assert_eq!(oldest["pid"], pid);
    assert_eq!(oldest["host"], hostname());
    assert_eq!(oldest["mode"], "exclusive");
    assert_eq!(oldest["user"], "root");
    assert!(oldest["waited_ms"].as_u64().is_some());
    let (started, ended) = (
        oldest["started_at"].as_str().unwrap(),
        oldest["ended_at"].as_str().unwrap(),
    );
    assert!(started.ends_with('Z') && ended >= started, "{oldest}");
    let newest: Vec<Value> = store
        .op("history")
        .args(["--json", "--limit", "2", "job"])
        .run()
        .expect(0)
        .json()
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(newest, runs[..2], "--limit");

    let text = store.op("history").arg("job").run().expect(0);
    assert_eq!(text.stdout.lines().count(), 4, "{}", text.stdout);
    assert!(
        text.stdout
            .lines()
            .next()
            .unwrap()
            .contains("--max-run ran out (124)"),
        "{}",
        text.stdout
    );
    let status = store.op("status").arg("job").run().expect(1);
    assert!(
        status.stdout.contains("  last run: ") && status.stdout.contains("(124)"),
        "{}",
        status.stdout
    );
}
