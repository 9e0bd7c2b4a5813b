//! The safety checks over a history: per NAME never more than N commands inside at once (on the
//! NAME that mixes `--shared` and exclusive runs: never an exclusive command beside another);
//! fences strictly increasing in start order (N = 1; and across every exclusive run of the
//! mixed NAME) or unique (N > 1); every fenced SQLite write accepted (N = 1) or accepted in
//! increasing fence order (N > 1, shared); every command gone once its
//! wrapper ended; every command's end recorded. A process the command started that moved to
//! another group of its session (`shapes.rs`) counts as part of the command in all of this;
//! one that left the session (a daemon) must end by itself. Runs that lived through an empty restart are
//! beyond the guarantee: what they break is counted as excused, and fences restart from a new
//! epoch there. So are overlaps that follow a jump of the wall clock (the servers' lease
//! clock) ahead of the monotonic one by more than D: the lease clock assumes drift below D.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Grand, History, Section, Violation};
use crate::plan::{SHARED_MIX, TTL_MS};

/// A SIGKILLed wrapper's command is the watcher's to kill: it has this long.
const WATCHER_NS: u64 = 1_000_000_000;
/// How late a `dead` record may be, for a command whose wrapper waited for it.
const OBSERVER_LAG_NS: u64 = 500_000_000;

fn ms(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

fn describe(s: &Section) -> String {
    format!(
        "run {} (fence {}, pid {}, holders env {})",
        s.run, s.fence, s.pid, s.holders_env
    )
}

fn excuse(h: &History, runs: &[u64]) -> Option<String> {
    runs.iter().find_map(|&r| {
        h.straddles(r)
            .map(|f| format!("run {r} lived through an empty restart at {}", ms(f.began)))
    })
}

/// An overlap from `from` to `to` is beyond the guarantee when the wall clock, which the
/// server's leases run on, jumped ahead of the wrappers' monotonic one by more than the drift
/// allowance D within a lease before it: every lease on the server ended that much early.
fn clock_excuse(h: &History, from: u64, to: u64) -> Option<String> {
    let drift_ns = (TTL_MS / 100 + 2) as i128 * 1_000_000;
    let ttl_ns = TTL_MS * 1_000_000;
    h.clock_steps
        .iter()
        .find(|(t, step)| *step > drift_ns && *t + ttl_ns >= from && *t <= to)
        .map(|(t, step)| {
            format!(
                "the wall clock jumped {:.1} ms ahead at {}, more than D",
                *step as f64 / 1e6,
                ms(*t)
            )
        })
}

pub fn check(h: &History, out: &mut Vec<Violation>) {
    for (name, limit) in &h.names {
        let sections: Vec<&Section> = h.sections.values().filter(|s| s.name == *name).collect();
        exclusion(h, name, *limit, &sections, out);
        fences(h, name, *limit, &sections, out);
        writes(h, name, *limit, out);
    }
    processes(h, out);
}

/// Never more than `limit` commands inside at once. At equal instants an end counts first.
fn exclusion(h: &History, name: &str, limit: u32, sections: &[&Section], out: &mut Vec<Violation>) {
    let mut events: Vec<(u64, bool, u64)> = Vec::new();
    for s in sections {
        let end = s
            .job_end_for_overlap()
            .or_else(|| h.wrapper_of(s.run).map(|w| w.ended));
        let Some(end) = end else { continue };
        events.push((s.start, true, s.run));
        // A command that died right after its start (its observer's lag taken off) still
        // ends after it starts.
        events.push((end.max(s.start + 1), false, s.run));
    }
    events.sort();
    let mut inside: BTreeSet<u64> = BTreeSet::new();
    for (t, is_start, run) in events {
        if !is_start {
            inside.remove(&run);
            continue;
        }
        inside.insert(run);
        let over = match limit {
            // Shared commands together, an exclusive one alone.
            SHARED_MIX => inside.len() > 1 && inside.iter().any(|r| !h.sections[r].shared()),
            _ => inside.len() as u32 > limit,
        };
        if over {
            let runs: Vec<u64> = inside.iter().copied().collect();
            let who: Vec<String> = runs.iter().map(|r| describe(&h.sections[r])).collect();
            let until = runs
                .iter()
                .filter_map(|r| h.sections[r].job_end_for_overlap().map(|e| e.max(t + 1)))
                .min()
                .unwrap_or(t);
            out.push(Violation {
                invariant: "more than N inside at once",
                name: name.to_owned(),
                detail: format!(
                    "{} inside ({}) from {} to {} ({} ms): {}\n{}",
                    runs.len(),
                    match limit {
                        SHARED_MIX => "shared and exclusive runs".to_owned(),
                        n => format!("N = {n}"),
                    },
                    ms(t),
                    ms(until),
                    until.saturating_sub(t) / 1_000_000,
                    who.join("; "),
                    h.evidence(&runs, t, until)
                ),
                excused: excuse(h, &runs).or_else(|| clock_excuse(h, t, until)),
            });
        }
    }
}

/// N = 1: fences strictly increase in start order; N > 1: no fence twice. Per epoch, leaving
/// out the runs that lived through an empty restart (their fences are from the epoch before).
fn fences(h: &History, name: &str, limit: u32, sections: &[&Section], out: &mut Vec<Violation>) {
    let mut by_epoch: BTreeMap<usize, Vec<&Section>> = BTreeMap::new();
    for s in sections {
        if s.fence == 0 {
            out.push(Violation {
                invariant: "no fence in the environment",
                name: name.to_owned(),
                detail: describe(s),
                excused: None,
            });
        }
        // No store issues one past it; a history record that said so once lifted a file://
        // fence to 2^64 - 1.
        if s.fence > i64::MAX as u64 {
            out.push(Violation {
                invariant: "fence past i64::MAX",
                name: name.to_owned(),
                detail: describe(s),
                excused: None,
            });
        }
        if h.straddles(s.run).is_none() {
            by_epoch.entry(h.epoch(s.run)).or_default().push(s);
        }
    }
    for (_, mut list) in by_epoch {
        list.sort_by_key(|s| s.start);
        if limit == SHARED_MIX {
            mixed_fences(name, &list, out);
        } else if limit == 1 {
            let mut last: Option<&Section> = None;
            for s in list {
                if let Some(prev) = last {
                    if s.fence <= prev.fence {
                        out.push(Violation {
                            invariant: "fence not increasing in start order",
                            name: name.to_owned(),
                            detail: format!(
                                "{} started at {} after {} started at {}",
                                describe(s),
                                ms(s.start),
                                describe(prev),
                                ms(prev.start)
                            ),
                            excused: None,
                        });
                    }
                }
                last = Some(s);
            }
        } else {
            let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
            for s in list {
                if let Some(other) = seen.insert(s.fence, s.run) {
                    out.push(Violation {
                        invariant: "fence issued twice",
                        name: name.to_owned(),
                        detail: format!("fence {} to runs {other} and {}", s.fence, s.run),
                        excused: None,
                    });
                }
            }
        }
    }
}

/// The NAME whose runs mix `--shared` and exclusive ones, in start order: no fence twice, and
/// an exclusive run's fence above every fence started before it and below every one started
/// after it (shared runs between two exclusive ones may start in any order of their fences).
fn mixed_fences(name: &str, list: &[&Section], out: &mut Vec<Violation>) {
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    for s in list {
        if let Some(other) = seen.insert(s.fence, s.run) {
            out.push(Violation {
                invariant: "fence issued twice",
                name: name.to_owned(),
                detail: format!("fence {} to runs {other} and {}", s.fence, s.run),
                excused: None,
            });
        }
    }
    for (i, e) in list.iter().enumerate().filter(|(_, s)| !s.shared()) {
        let before = list[..i].iter().find(|s| s.fence >= e.fence);
        let after = list[i + 1..].iter().find(|s| s.fence <= e.fence);
        for (first, second) in [before.map(|s| (*s, *e)), after.map(|s| (*e, *s))]
            .into_iter()
            .flatten()
        {
            out.push(Violation {
                invariant: "fence not increasing in start order",
                name: name.to_owned(),
                detail: format!(
                    "{} started at {} after {} started at {}",
                    describe(second),
                    ms(second.start),
                    describe(first),
                    ms(first.start)
                ),
                excused: None,
            });
        }
    }
}

/// With no empty restart, SQLite's own verdict: N = 1, every write accepted; N > 1, accepted
/// writes in increasing fence order. With empty restarts, the same replayed per epoch.
fn writes(h: &History, name: &str, limit: u32, out: &mut Vec<Violation>) {
    let mut high: BTreeMap<usize, (u64, u64)> = BTreeMap::new();
    for w in h.writes.iter().filter(|w| w.name == name) {
        let epoch = h.epoch(w.run);
        let entry = high.entry(epoch).or_insert((0, 0));
        let accepted_here = w.fence > entry.0;
        let rejected = if h.empty_restarts().next().is_none() {
            w.changed != 1 && (limit == 1 || accepted_here)
        } else {
            !accepted_here && limit == 1
        };
        if rejected {
            out.push(Violation {
                invariant: "fenced write rejected (a stale holder wrote)",
                name: name.to_owned(),
                detail: format!(
                    "run {} wrote with fence {} after run {} had written fence {}",
                    w.run, w.fence, entry.1, entry.0
                ),
                excused: excuse(h, &[w.run, entry.1]),
            });
        }
        if accepted_here && h.straddles(w.run).is_none() {
            *entry = (w.fence, w.run);
        }
    }
}

/// Every command, and every process it started that stayed in its session, is gone once its
/// wrapper ended (a SIGKILLed wrapper's within 1 s: the watcher's job), and every end is on
/// record; a daemon (it left the session) ended by itself.
fn processes(h: &History, out: &mut Vec<Violation>) {
    for s in h.sections.values() {
        let Some(w) = h.wrapper_of(s.run) else {
            continue;
        };
        for g in s.grand.values() {
            job_process(s, g, w, out);
        }
        let Some(gone) = s.gone() else {
            out.push(Violation {
                invariant: "command's end never recorded",
                name: s.name.clone(),
                detail: format!("{} of wrapper pid {}", describe(s), w.pid),
                excused: None,
            });
            continue;
        };
        let killed = matches!(w.sent, Some((libc::SIGKILL, _))) || w.hung;
        let allowed = if killed || History::is_inner(s.run) {
            WATCHER_NS
        } else if s.end.is_none() {
            OBSERVER_LAG_NS
        } else {
            0
        };
        if gone > w.ended + allowed {
            out.push(Violation {
                invariant: "command alive after its wrapper ended",
                name: s.name.clone(),
                detail: format!(
                    "{} gone at {}, {} ms after wrapper pid {} ended (status {}{})",
                    describe(s),
                    ms(gone),
                    (gone - w.ended) / 1_000_000,
                    w.pid,
                    w.status,
                    if killed { ", SIGKILLed" } else { "" }
                ),
                excused: None,
            });
        }
    }
}

/// A process the command started: a daemon must have ended by itself; any other must be gone
/// by the time its wrapper ended, as the command itself (see [`processes`]).
fn job_process(s: &Section, g: &Grand, w: &crate::client::Wrapper, out: &mut Vec<Violation>) {
    let what = format!("{} process {} of {}", g.mode, g.pid, describe(s));
    if g.daemon() {
        if g.end.is_none() || g.termed {
            out.push(Violation {
                invariant: "a setsid daemon of a job was stopped",
                name: s.name.clone(),
                detail: format!(
                    "{what}: {} (wrapper pid {}, status {})",
                    if g.termed { "signalled" } else { "killed" },
                    w.pid,
                    w.status
                ),
                excused: None,
            });
        }
        return;
    }
    let Some(gone) = g.gone() else {
        out.push(Violation {
            invariant: "command's end never recorded",
            name: s.name.clone(),
            detail: format!("{what} of wrapper pid {}", w.pid),
            excused: None,
        });
        return;
    };
    let killed = matches!(w.sent, Some((libc::SIGKILL, _))) || w.hung;
    let allowed = if killed || History::is_inner(s.run) {
        WATCHER_NS
    } else if g.end.is_none() {
        OBSERVER_LAG_NS
    } else {
        0
    };
    if gone > w.ended + allowed {
        out.push(Violation {
            invariant: "a process of a job alive after its wrapper ended",
            name: s.name.clone(),
            detail: format!(
                "{what} gone at {}, {} ms after wrapper pid {} ended (status {}{})",
                ms(gone),
                (gone - w.ended) / 1_000_000,
                w.pid,
                w.status,
                if killed { ", SIGKILLed" } else { "" }
            ),
            excused: None,
        });
    }
}
