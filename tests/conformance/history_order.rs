//! A history is in its store's order, and only records count toward the runs it keeps: any
//! user of a lock can write its history, but junk between two runs pushes neither out, and
//! records that say they are newer than every run (a date in year 9999, a huge fence, a key
//! that sorts last) are not taken for the newest: the run that comes after them is, in
//! `history` and in `status`'s last run, and its own release never trims it away (issue 43's
//! review: on etcd and PostgreSQL, 100 such records hid every run from then on).

use serde_json::Value;

use super::backends::Backend;

/// The tokens `history --json` lists, newest first.
fn tokens(history: &[Value]) -> Vec<String> {
    history
        .iter()
        .map(|run| run["token"].as_str().unwrap().to_owned())
        .collect()
}

pub fn check(backend: &dyn Backend) {
    let store = backend.start();
    store.lr().job(["true"]).run().expect(0);
    let first = store.history();
    assert_eq!(first.len(), 1, "{first:?}");
    let a = first[0]["token"].as_str().unwrap().to_owned();

    // A hundred lines that are no record, between two runs: neither run goes for them.
    for i in 0..100 {
        store.servers.add_history_record(&format!("junk {i}"));
    }
    store.lr().job(["true"]).run().expect(0);
    let history = store.history();
    let b = history[0]["token"].as_str().unwrap().to_owned();
    assert_ne!(a, b);
    assert_eq!(tokens(&history), [b.clone(), a.clone()], "{history:?}");

    // A hundred records that claim to be the newest, by what their writer chose.
    let mut forged = history[0].clone();
    forged["ended_at"] = "9999-12-31T23:59:59.999Z".into();
    forged["started_at"] = "9999-12-31T23:59:59.000Z".into();
    forged["fence"] = (1u64 << 40).into();
    for i in 0..100 {
        forged["token"] = format!("forged-{i}").into();
        store.servers.add_history_record_ahead(&forged.to_string());
    }
    store.lr().job(["true"]).run().expect(0);
    let history = store.history();
    let c = history[0]["token"].as_str().unwrap().to_owned();
    if !backend.supports().history_order {
        println!("SKIPPED (declared: its history is in an order its writers choose)");
        return;
    }
    assert!(
        !c.starts_with("forged-") && c != a && c != b,
        "the run after the forged records is the newest: {history:?}"
    );
    let status = store.status();
    assert_eq!(status["last_run"]["token"], c.as_str(), "{status}");
    // Its own release kept it: read again, after everything settled.
    assert_eq!(tokens(&store.history())[0], c);
}
