//! The randomized fault harness (Jepsen-style): K clients run real `locked-run` processes in
//! loops on a few NAMEs, each run's options drawn from a seeded generator, while a nemesis
//! injects faults (a per-connection TCP fault proxy, a server frozen, slept, killed and
//! restarted with or without its data) and the clients SIGKILL, SIGTERM and SIGSTOP their own
//! wrappers, or hold one up under strace between its grant and its start; every command records its start and end, its fence and a fenced SQLite write; a
//! checker then reads the whole history: exclusion, fences, writes, processes left, statuses,
//! bounds, fair waiting, and what the servers still hold once everything stopped. Other users
//! act too: one in the metrics directory every run writes to (neighbour.rs: its counters must
//! add up), one of the lock who writes junk into its history and its holder's metadata, and
//! runs on hosts with hostile names (hostile.rs: `status`, `history` and the wrappers' own
//! stderr are checked for raw control characters, and the history for runs it lost); on
//! `file://`, a copy of the directory's counters restored again and again (files.rs).
//!
//! ```text
//! cargo test --test faults                                   # a short pass per backend
//! LOCKED_RUN_FAULTS_SEED=123 cargo test --test faults        # replay seed 123
//! LOCKED_RUN_FAULTS_SECS=600 LOCKED_RUN_FAULTS_BACKENDS=redis cargo test --test faults  # soak
//! ```
//!
//! Knobs: `LOCKED_RUN_FAULTS_SEED` (replay), `LOCKED_RUN_FAULTS_SECS` (per backend, default 45),
//! `LOCKED_RUN_FAULTS_BACKENDS` (`redis,file,redlock,etcd,etcd3,postgres`; `etcd3` is a
//! cluster of three whose leader is killed and stopped among the faults; etcd and postgres are
//! skipped, with a line saying so, when the etcd binary (`LOCKED_RUN_TEST_ETCD`, else `etcd`)
//! or `etcdctl` is not found), `LOCKED_RUN_FAULTS_CLIENTS` (default 6),
//! `LOCKED_RUN_FAULTS_BIN` (another `locked-run` binary), `LOCKED_RUN_FAULTS_NESTED=0` (no
//! nested runs), `LOCKED_RUN_FAULTS_KEEP=1` (keep each pass's history, SQLite file and the
//! wrappers' stderr), `LOCKED_RUN_FAULTS_VERBOSE=1` (print the excused violations too). The same seed replays the same schedule of choices: each client's plans and
//! the nemesis's faults come from streams of their own (rng.rs), so the n-th run of client k
//! is the same run; the timing of real processes of course varies, and with it how many runs
//! a pass makes and which run a fault hits. T = 2 s (R = T/6, K = T/3), `--connect-timeout 1s`.
//!
//! Everything listens on and talks to 127.0.0.1 only. Exit status 1 on any violation.

// The integration suite's fixtures: the harness uses a few (servers, signals, waits on a pid).
#[allow(dead_code, unused_imports)]
#[path = "../support/mod.rs"]
mod support;

mod backend;
mod child;
mod client;
mod etcd;
mod files;
mod history;
mod hostile;
mod liveness;
mod model_check;
mod monitor;
mod neighbour;
mod nemesis;
mod pg;
mod plan;
mod proxy;
mod report;
mod rng;
mod safety;
mod servers;
mod shapes;

use std::process::ExitCode;
use std::time::Duration;

/// Seeds that once failed, replayed first by a default run (no `LOCKED_RUN_FAULTS_SEED`):
/// (seed, backend, seconds). Add each failing seed here with the bug it pins.
const REGRESSIONS: &[(u64, &str, u64)] = &[];

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--fault-child") {
        return child::main(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("--fault-grandchild") {
        return shapes::main(&args[2..]);
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!(
            "{}",
            include_str!("main.rs")
                .lines()
                .take_while(|l| l.starts_with("//!"))
                .map(|l| l.trim_start_matches("//!").trim_start())
                .collect::<Vec<_>>()
                .join("\n")
        );
        return ExitCode::SUCCESS;
    }
    // `cargo test NAME` passes its filter to every target: here it picks backends by name, so
    // `cargo test some_test` does not spend minutes on this target. Flags are libtest's.
    let filter: Option<&String> = args[1..].iter().find(|a| !a.starts_with('-'));
    let given_seed = env("LOCKED_RUN_FAULTS_SEED").map(|s| {
        s.parse::<u64>()
            .unwrap_or_else(|_| panic!("LOCKED_RUN_FAULTS_SEED={s}: not a number"))
    });
    let seed = given_seed.unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        now.as_nanos() as u64 ^ (std::process::id() as u64) << 32
    });
    let secs: u64 = env("LOCKED_RUN_FAULTS_SECS").map_or(45, |s| s.parse().expect("SECS"));
    let clients: u64 = env("LOCKED_RUN_FAULTS_CLIENTS").map_or(6, |s| s.parse().expect("CLIENTS"));
    let backends: Vec<String> = env("LOCKED_RUN_FAULTS_BACKENDS")
        .map_or_else(
            || {
                backend::ALL
                    .iter()
                    .map(|b| b.to_string())
                    .collect::<Vec<_>>()
            },
            |s| s.split(',').map(|b| b.trim().to_owned()).collect(),
        )
        .into_iter()
        .filter(|b| filter.is_none_or(|f| b.contains(f.as_str()) || "faults".contains(f.as_str())))
        .collect();
    if backends.is_empty() {
        println!("faults: no backend's name matches the filter; nothing to run");
        println!("0 passed, 0 failed");
        return ExitCode::SUCCESS;
    }
    let bin =
        env("LOCKED_RUN_FAULTS_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_locked-run").to_owned());
    let nested = env("LOCKED_RUN_FAULTS_NESTED").is_none_or(|v| v != "0");
    for b in &backends {
        assert!(
            backend::ALL.contains(&b.as_str()),
            "unknown backend {b:?}: one of {:?}",
            backend::ALL
        );
    }
    // A backend whose server is not installed is skipped, not failed: etcd is optional.
    let backends: Vec<String> = backends
        .into_iter()
        .filter(|b| match backend::missing(b) {
            Some(why) => {
                println!("faults: {b} skipped: {why}");
                false
            }
            None => true,
        })
        .collect();
    if backends.is_empty() {
        println!("0 passed, 0 failed");
        return ExitCode::SUCCESS;
    }

    println!(
        "faults: seed {seed} (replay: LOCKED_RUN_FAULTS_SEED={seed} cargo test --test faults)"
    );
    println!(
        "faults: {secs} s per backend, {clients} clients, backends {}, nested {}, binary {bin}",
        backends.join(","),
        if nested { "on" } else { "off" }
    );
    let mut passes: Vec<(u64, String, u64)> = Vec::new();
    if given_seed.is_none() {
        passes.extend(
            REGRESSIONS
                .iter()
                .filter(|(_, b, _)| backends.iter().any(|x| x == b))
                .map(|&(s, b, t)| (s, b.to_owned(), t)),
        );
    }
    passes.extend(backends.iter().map(|b| (seed, b.clone(), secs)));
    let (mut passed, mut failed) = (0, 0);
    for (seed, label, secs) in passes {
        let config = report::Config {
            seed,
            secs: Duration::from_secs(secs),
            clients,
            bin: bin.clone(),
            nested,
        };
        let backend = backend::open(&label).expect("a known backend");
        if report::pass(backend.as_ref(), &config) {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
