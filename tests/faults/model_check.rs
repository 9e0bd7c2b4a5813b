//! The recorded history checked against the protocol models' transitions (`models/`): a step
//! the models forbid is a violation, even where no other run happened to be hurt by it.
//!
//! What each run's wrapper says in its JSON log (`--log-format json`: every milestone with
//! its wall-clock instant, renewals included) gives, per run, the instants by which its grant
//! and each renewal were answered, and when it sent a kill signal; the send instant the lease
//! clock counts from came before each (so every bound below is one the correct lease clock
//! keeps, never one it may miss). Against the lease clock's model (model 6):
//!
//! - no command starts past its kill point: a start later than V - D of the grant;
//! - no command outlives its lease on the store: a job alive when the key it ran under may
//!   have lapsed (T after its last answered grant or renewal);
//! - no kill signal comes past the kill point (V - D of the last answered renewal before it),
//!   but for a busy machine's timer lateness, which stays within D.
//!
//! And against every backend model's fence: fences strictly increase in the real-time order
//! of their grants, in every mode (`--holders N` and `--shared` too, where the start-order
//! check says only that no fence repeats): a command that started before another run's
//! wrapper was spawned was granted before that run was, so its fence is smaller.
//!
//! Beyond the models' bounds, as elsewhere: a wrapper SIGSTOPped past its kill point (the
//! pause the lease cannot see, where only fences order the writes), a run that lived through
//! an empty restart, a step of the wall clock.

use std::collections::BTreeMap;

use crate::history::{History, Section, Violation};
use crate::monitor::Observation;
use crate::plan::{KILL_AFTER_MS, TTL_MS};

const MS: u64 = 1_000_000;
const T_NS: u64 = TTL_MS * MS;
/// D = T/100 + 2 ms, as the lease clock counts it.
const D_NS: u64 = (TTL_MS / 100 + 2) * MS;
const K_NS: u64 = KILL_AFTER_MS * MS;
/// The log's instants are whole milliseconds (cut, not rounded), and read against the
/// monotonic clock through an offset sampled within microseconds.
const SLACK_NS: u64 = 2 * MS;
/// How late a timer may fire on this machine when it is busy (two cores, six client loops, the
/// servers and the harness): a SIGKILL due at V - D was said 16 ms past it in a pass on
/// PostgreSQL (seed 1796675215875719554, the command ended and its leftovers being swept when
/// the renewals failed). Less than D (22 ms at T = 2 s), so a kill within it still comes
/// before V; a kill signal sent at the wrong point (at V - D instead of V - D - K, or a whole
/// renewal late) is later by far more.
const TIMER_NS: u64 = 20 * MS;

/// What one run's wrapper said of its lease, on the history's clock (CLOCK_MONOTONIC).
#[derive(Debug, Default)]
struct Lease {
    /// The instants its grant and each renewal were answered (said), in order.
    answered: Vec<u64>,
    /// The instants it said it sent a kill signal, and which.
    kills: Vec<(u64, String)>,
}

impl Lease {
    /// The last grant or renewal answered by `t`.
    fn answered_by(&self, t: u64) -> Option<u64> {
        self.answered.iter().copied().filter(|&a| a <= t).max()
    }
}

/// Checks `h`; `lease`: the backend keeps a lease (every one but `file://`, which the kernel
/// holds); `seen`: the monitor's samples of the wall clock against the monotonic one.
pub fn check(h: &History, seen: &[Observation], lease: bool, out: &mut Vec<Violation>) {
    let leases = match lease {
        true => leases(h, seen),
        false => BTreeMap::new(),
    };
    let before = out.len();
    for s in h.sections.values() {
        if let Some(l) = leases.get(&s.run) {
            lease_clock(h, s, l, out);
        }
    }
    let mut ordered = 0;
    for (name, _) in &h.names {
        ordered += fences(h, name, out);
    }
    println!(
        "model check: {} runs' lease clocks ({} grants and renewals, {} kill signals), {ordered} \
         fences in grant order; {} steps the models forbid",
        leases.len(),
        leases.values().map(|l| l.answered.len()).sum::<usize>(),
        leases.values().map(|l| l.kills.len()).sum::<usize>(),
        out.len() - before
    );
}

fn ms(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

/// The lease clock's steps of one run whose command started.
fn lease_clock(h: &History, s: &Section, l: &Lease, out: &mut Vec<Violation>) {
    let Some(&granted) = l.answered.first() else {
        return;
    };
    let who = format!("run {} (fence {}, pid {})", s.run, s.fence, s.pid);
    let paused = |from: u64, to: u64| paused(h, s.run, from, to);
    // V - D of the grant: V = s + T - D, and the grant was sent before it was answered.
    let kill_point = granted + T_NS - 2 * D_NS + SLACK_NS;
    if s.start > kill_point {
        out.push(Violation {
            invariant: "model: a command started past its kill point",
            name: s.name.clone(),
            detail: format!(
                "{who} started at {}, its grant answered at {}: V - D was by {}\n{}",
                ms(s.start),
                ms(granted),
                ms(kill_point),
                h.evidence(&[s.run], granted, s.start)
            ),
            excused: paused(granted, s.start).or_else(|| stepped(h, granted, s.start)),
        });
    }
    if let Some(end) = s.job_end_for_overlap() {
        let last = l.answered_by(end).unwrap_or(granted);
        let lapse = last + T_NS + SLACK_NS;
        if end > lapse {
            out.push(Violation {
                invariant: "model: a command outlived its lease on the store",
                name: s.name.clone(),
                detail: format!(
                    "{who}'s job alive until {}; its last grant or renewal answered at {}, so \
                     its key could lapse from {}\n{}",
                    ms(end),
                    ms(last),
                    ms(lapse),
                    h.evidence(&[s.run], last, end)
                ),
                excused: paused(last, end).or_else(|| stepped(h, last, end)),
            });
        }
    }
    for (at, signal) in &l.kills {
        let last = l.answered_by(*at).unwrap_or(granted);
        let kill_point = last + T_NS - 2 * D_NS + SLACK_NS;
        if *at > kill_point + TIMER_NS {
            out.push(Violation {
                invariant: "model: a kill signal past the kill point",
                name: s.name.clone(),
                detail: format!(
                    "{who}: {signal} said at {}; its last grant or renewal before it answered \
                     at {}: V - D was by {} (the kill signal is due at V - D - K, {} ms before)\n{}",
                    ms(*at),
                    ms(last),
                    ms(kill_point),
                    K_NS / MS,
                    h.evidence(&[s.run], last, *at)
                ),
                excused: paused(last, *at).or_else(|| stepped(h, last, *at)),
            });
        }
    }
}

/// The wrapper of `run` was SIGSTOPped at some instant of `from..=to`: what its lease clock
/// did meanwhile, it could not see (the Kleppmann case).
fn paused(h: &History, run: u64, from: u64, to: u64) -> Option<String> {
    let w = h.wrapper_of(run)?;
    match w.sent {
        Some((libc::SIGSTOP, t)) if t <= to && t + w.stopped_ms * MS >= from => Some(format!(
            "its wrapper was SIGSTOPped at {} for {} ms: a pause the lease cannot see",
            ms(t),
            w.stopped_ms
        )),
        _ => None,
    }
}

/// A step of the wall clock within a lease of `from..=to`: the log's instants (and the
/// servers' leases) moved with it.
fn stepped(h: &History, from: u64, to: u64) -> Option<String> {
    h.clock_steps
        .iter()
        .find(|(t, step)| {
            step.unsigned_abs() > D_NS as u128 && *t + T_NS >= from && *t <= to + T_NS
        })
        .map(|(t, step)| {
            format!(
                "the wall clock stepped {:+.1} ms at {}",
                *step as f64 / 1e6,
                ms(*t)
            )
        })
}

/// Fences in the real-time order of their grants: a command that started (so was granted)
/// before another run's wrapper was spawned (so before that run asked) has the smaller fence.
/// Per epoch, leaving out the runs that lived through an empty restart, as the start-order
/// check does. Returns how many runs were ordered so.
fn fences(h: &History, name: &str, out: &mut Vec<Violation>) -> usize {
    let mut by_epoch: BTreeMap<usize, Vec<&Section>> = BTreeMap::new();
    for s in h
        .sections
        .values()
        .filter(|s| s.name == name && s.fence > 0)
    {
        if h.straddles(s.run).is_none() {
            by_epoch.entry(h.epoch(s.run)).or_default().push(s);
        }
    }
    let mut ordered = 0;
    for (_, mut list) in by_epoch {
        list.sort_by_key(|s| s.start);
        // The largest fence among the first i starts, and whose.
        let mut largest: Vec<&Section> = Vec::with_capacity(list.len());
        for s in &list {
            let best = match largest.last() {
                Some(b) if b.fence >= s.fence => *b,
                _ => *s,
            };
            largest.push(best);
        }
        for b in &list {
            let Some(asked) = asked_after(h, b) else {
                continue;
            };
            let before = list.partition_point(|a| a.start < asked);
            let Some(a) = before.checked_sub(1).map(|i| largest[i]) else {
                continue;
            };
            ordered += 1;
            if a.fence >= b.fence {
                out.push(Violation {
                    invariant: "model: fences not increasing in grant order",
                    name: name.to_owned(),
                    detail: format!(
                        "run {} (fence {}) started at {}, before run {} asked (its wrapper \
                         spawned at {}), yet run {} got fence {}",
                        a.run,
                        a.fence,
                        ms(a.start),
                        b.run,
                        ms(asked),
                        b.run,
                        b.fence
                    ),
                    excused: None,
                });
            }
        }
    }
    ordered
}

/// An instant before any request of `s`'s run was sent: its wrapper's spawn (a nested run's:
/// when the outer command spawned it).
fn asked_after(h: &History, s: &Section) -> Option<u64> {
    match History::is_inner(s.run) {
        false => h.wrapper_of(s.run).map(|w| w.spawned),
        true => h
            .sections
            .get(&(s.run - s.run % 10))?
            .inner_spawned
            .map(|(t, _)| t),
    }
}

/// Each run's lease as its wrapper's log says it, by run (a nested run's from the lines of
/// its own pid in its outer run's stderr, where it writes).
fn leases(h: &History, seen: &[Observation]) -> BTreeMap<u64, Lease> {
    let mut leases = BTreeMap::new();
    for w in h.wrappers.values() {
        let text = std::fs::read_to_string(&w.stderr).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let inner = w.plan.nested.as_ref().and_then(|n| {
            let pid = h.sections.get(&w.plan.run)?.inner_spawned?.1;
            Some((n.run, n.name, pid))
        });
        // The outer run's lines name its lock (a nested run's is always another NAME).
        let outer = lease_of(lines.iter().filter(|l| l["lock"] == w.plan.name), seen);
        leases.insert(w.plan.run, outer);
        if let Some((run, name, pid)) = inner {
            let lines = lines
                .iter()
                .filter(|l| l["lock"] == name && l["pid"].as_i64() == Some(pid as i64));
            leases.insert(run, lease_of(lines, seen));
        }
    }
    leases.retain(|_, l| !l.answered.is_empty());
    leases
}

fn lease_of<'a>(lines: impl Iterator<Item = &'a serde_json::Value>, seen: &[Observation]) -> Lease {
    let mut lease = Lease::default();
    for line in lines {
        let Some(at) = line["ts"].as_str().and_then(|ts| monotonic(ts, seen)) else {
            continue;
        };
        match line["event"].as_str() {
            Some("acquired" | "renewed") => lease.answered.push(at),
            Some("lost") => lease
                .kills
                .push((at, line["signal"].as_str().unwrap_or("?").to_owned())),
            _ => {}
        }
    }
    lease
}

/// A wall-clock instant (RFC 3339) on CLOCK_MONOTONIC, by the offset the monitor sampled
/// nearest to it (now's, should it have sampled none).
fn monotonic(ts: &str, seen: &[Observation]) -> Option<u64> {
    let wall = humantime::parse_rfc3339(ts)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_nanos() as i128;
    let offset = seen
        .iter()
        .min_by_key(|o| (o.sent as i128 + o.wall_offset - wall).unsigned_abs())
        .map(|o| o.wall_offset)
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i128);
            now - crate::child::mono_ns() as i128
        });
    u64::try_from(wall - offset).ok()
}
