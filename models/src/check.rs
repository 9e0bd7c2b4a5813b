//! Running a model: the checker explores it breadth-first to its bounds, the correct protocol
//! must keep every property, and each mutation (a known-bad variant) must be refuted by a
//! counterexample trace, which is written to `target/models/` (and printed with `--traces`).

use std::fmt::Debug;
use std::hash::Hash;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use stateright::{Checker, HasDiscoveries, Model};

/// What one model's run found, for the table.
pub struct Report {
    pub model: &'static str,
    pub bounds: String,
    pub states: usize,
    pub took: Duration,
    /// Properties the correct protocol broke: (property, where its trace was written).
    pub broken: Vec<(&'static str, String)>,
    pub mutations: Vec<Refutation>,
    /// Where the protocol as built stops keeping a promise, shown by a trace (what the model
    /// found beyond the bounds the docs state): each must still be shown.
    pub limits: Vec<Refutation>,
    /// Other variants that must keep every property too (what a finding rests on: a variant
    /// that looks wrong and is not, or a mend that covers more than the code needs).
    pub holds: Vec<Refutation>,
}

/// One mutation's (or limit's) outcome.
pub struct Refutation {
    pub mutation: &'static str,
    /// The property the checker found broken, and the trace's length in steps; `None`: the
    /// checker found nothing wrong with a protocol known to be broken.
    pub refuted: Option<(&'static str, usize)>,
    pub states: usize,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.broken.is_empty()
            && self.mutations.iter().all(|m| m.refuted.is_some())
            && self.limits.iter().all(|m| m.refuted.is_some())
            && self.holds.iter().all(|m| m.refuted.is_none())
    }
}

/// Whether traces are printed as well as written.
pub fn print_traces() -> bool {
    std::env::args().any(|a| a == "--traces")
}

fn trace_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")));
    target.join("models")
}

/// Explores `model` exhaustively; the properties it broke, each with the trace that breaks
/// it (written to `target/models/FILE-PROPERTY.trace`), and the unique states explored; and,
/// in a whole run, each `sometimes` property never reached. A mutation's run stops at its
/// first counterexample (`first`).
pub fn explore<M>(model: M, file: &str, first: bool) -> (usize, Vec<(&'static str, String, usize)>)
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Debug + Clone + PartialEq,
{
    let properties: Vec<_> = model
        .properties()
        .into_iter()
        .map(|p| (p.name, p.expectation))
        .collect();
    let mut builder = model.checker().threads(threads());
    if first {
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    if let Some(limit) = std::env::var("LOCKED_RUN_MODELS_LIMIT")
        .ok()
        .and_then(|l| l.parse().ok())
    {
        builder = builder.target_state_count(limit);
    }
    let checker = builder.spawn_bfs().join();
    if std::env::var_os("LOCKED_RUN_MODELS_LIMIT").is_some() {
        eprintln!(
            "{file}: depth {} states {}",
            checker.max_depth(),
            checker.unique_state_count()
        );
    }
    let mut found = Vec::new();
    for (name, expectation) in properties {
        if !expectation.discovery_is_failure() {
            // A `sometimes` property the whole run never reached: the model cannot get where
            // its other properties would matter (a model too narrow to mean anything).
            if !first && checker.discovery(name).is_none() {
                found.push((name, "never reached".to_owned(), 0));
            }
            continue;
        }
        if let Some(path) = checker.discovery(name) {
            let steps = path.clone().into_actions();
            let mut text = format!(
                "{file}: property {name:?} broken in {} steps\n",
                steps.len()
            );
            let states = path.into_states();
            for (i, action) in steps.iter().enumerate() {
                text.push_str(&format!("{:>3}. {action:?}\n", i + 1));
                if i + 1 == steps.len() {
                    text.push_str(&format!("     => {:?}\n", states[i + 1]));
                }
            }
            let dir = trace_dir();
            let _ = std::fs::create_dir_all(&dir);
            let path = dir.join(format!("{file}-{}.trace", name.replace(' ', "-")));
            let _ = std::fs::write(&path, &text);
            if print_traces() {
                println!("{text}");
            }
            found.push((name, path.display().to_string(), steps.len()));
        }
    }
    (checker.unique_state_count(), found)
}

/// Threads for the checker: two (this machine has two cores), or `LOCKED_RUN_MODELS_THREADS`.
fn threads() -> usize {
    std::env::var("LOCKED_RUN_MODELS_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2)
}

/// Checks the correct protocol (`make(None)`) and each mutation (`make(Some(m))`), which must
/// break at least one property.
pub fn verify<M, X>(
    model: &'static str,
    bounds: String,
    make: impl Fn(Option<X>) -> M,
    mutations: &[(X, &'static str)],
) -> Report
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Debug + Clone + PartialEq,
    X: Copy,
{
    let started = Instant::now();
    let file = model.replace([' ', ':', '/'], "-");
    let (states, broken) = explore(make(None), &file, false);
    let broken = broken.into_iter().map(|(p, path, _)| (p, path)).collect();
    let mut refutations = Vec::new();
    for &(mutation, label) in mutations {
        let (states, found) = explore(make(Some(mutation)), &slug(model, "mutation", label), true);
        refutations.push(Refutation {
            mutation: label,
            refuted: found.first().map(|(p, _, len)| (*p, *len)),
            states,
        });
    }
    Report {
        model,
        bounds,
        states,
        took: started.elapsed(),
        broken,
        mutations: refutations,
        limits: Vec::new(),
        holds: Vec::new(),
    }
}

/// Shows a limit: `model` (the protocol as built, in an environment beyond its stated
/// bounds) must break a property; the trace goes beside the mutations'.
pub fn limit<M>(report: &mut Report, label: &'static str, model: M)
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Debug + Clone + PartialEq,
{
    let (states, found) = explore(model, &slug(report.model, "limit", label), true);
    report.limits.push(Refutation {
        mutation: label,
        refuted: found.first().map(|(p, _, len)| (*p, *len)),
        states,
    });
}

/// Checks that `model`, a variant beside the protocol as built, keeps every property too
/// (explored whole, as the protocol is).
pub fn holds<M>(report: &mut Report, label: &'static str, model: M)
where
    M: Model + Send + Sync + 'static,
    M::State: Debug + Hash + Send + Sync + Clone + PartialEq + 'static,
    M::Action: Debug + Clone + PartialEq,
{
    let (states, broken) = explore(model, &slug(report.model, "holds", label), false);
    report.holds.push(Refutation {
        mutation: label,
        refuted: broken.first().map(|(p, _, len)| (*p, *len)),
        states,
    });
}

/// A trace file's name: the model's, what kind of check, and its label.
fn slug(model: &str, kind: &str, label: &str) -> String {
    format!(
        "{}.{kind}.{}",
        model.replace([' ', ':', '/'], "-"),
        label.replace([' ', '(', ')', ',', '/', '\'', '.'], "-")
    )
}
