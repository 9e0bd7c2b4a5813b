//! The protocol models: each backend's protocol as a Stateright model, explored exhaustively
//! to stated bounds, with the known-bad variants (mutations) each must refute with a trace.
//! `cargo test --test models [NAME] [--traces]` prints, per model, the states explored, the
//! bounds, each limit shown, each variant that must hold, and each mutation with the property
//! that refuted it; traces are written to `target/models/` (and printed with `--traces`).
//! docs/how-it-works.md describes each model.

use std::process::ExitCode;

use locked_run_models::check::Report;
use locked_run_models::{
    etcd, file, keep_alive, lease_clock, object_store, postgres, postgres_expiry, redis, redlock,
};

/// A model's check: its reports (some models run in more than one configuration).
type Check = fn() -> Vec<Report>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let filter = args.iter().find(|a| !a.starts_with('-'));
    let models: Vec<(&str, Check)> = vec![
        ("lease clock", || vec![lease_clock::check()]),
        ("redis", redis::check),
        ("keep-alive", || vec![keep_alive::check()]),
        ("redlock", || vec![redlock::check()]),
        ("etcd", || vec![etcd::check()]),
        ("postgres", || {
            vec![postgres::check(), postgres_expiry::check()]
        }),
        ("object store", || vec![object_store::check()]),
        ("file", || vec![file::check()]),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, check) in models {
        if filter.is_some_and(|f| {
            !name.replace(' ', "_").contains(f.as_str()) && !"models".contains(f.as_str())
        }) {
            continue;
        }
        for report in check() {
            print(&report);
            match report.passed() {
                true => passed += 1,
                false => failed += 1,
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    match failed {
        0 => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}

fn print(r: &Report) {
    let verdict = match r.broken.is_empty() {
        true => "holds".to_owned(),
        false => format!(
            "BROKEN: {}",
            r.broken
                .iter()
                .map(|(p, t)| format!("{p:?} ({t})"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    println!(
        "model {:<16} {:>9} states  {:>6.1}s  {verdict}\n  bounds: {}",
        r.model,
        r.states,
        r.took.as_secs_f64(),
        r.bounds
    );
    for m in &r.limits {
        match m.refuted {
            Some((property, steps)) => println!(
                "  limit    {:<60} shown: {property:?} broken ({steps} steps, {} states)",
                m.mutation, m.states
            ),
            None => println!(
                "  limit    {:<60} NOT SHOWN ({} states)",
                m.mutation, m.states
            ),
        }
    }
    for m in &r.holds {
        match m.refuted {
            None => println!("  holds    {:<60} holds ({} states)", m.mutation, m.states),
            Some((property, steps)) => println!(
                "  holds    {:<60} BROKEN: {property:?} ({steps} steps, {} states)",
                m.mutation, m.states
            ),
        }
    }
    for m in &r.mutations {
        match m.refuted {
            Some((property, steps)) => println!(
                "  mutation {:<60} refuted: {property:?} ({steps} steps, {} states)",
                m.mutation, m.states
            ),
            None => println!(
                "  mutation {:<60} NOT REFUTED ({} states): the model cannot tell it from the protocol",
                m.mutation, m.states
            ),
        }
    }
}
