//! The liveness checks over a history: no wrapper hung; every run ended with a status it may
//! have (its command's, 75, 69, 76, 124, or 128 + the signal the client sent it; a nested run
//! likewise), within its bound and within [`MAX_RSS_KB`] of memory, whatever a hostile server
//! answered; and no waiter still waiting while a later arrival on the same NAME is served (fair
//! waiting).

use crate::client::Wrapper;
use crate::history::{History, Violation};
use crate::plan::{KILL_AFTER_MS, Waiting};

/// The most memory a wrapper may take: what a hostile server sends is refused past a limit of
/// at most 64 MiB, and a wrapper that read it all would take gigabytes.
const MAX_RSS_KB: u64 = 128 * 1024;

/// Slack on a bound: starting a process, connecting (`--connect-timeout 1s`), retrying.
const BOUND_SLACK_MS: u64 = 4000;

/// Fair waiting, made sound on two loaded cores. Arrival is the instant the client spawned the
/// wrapper, but the wrapper joins the queue only once it has started, connected and subscribed;
/// a waiter whose place lapsed (its keep-alive is about 2 s) is served after later arrivals;
/// and "served" is seen at the child's `start` record, some scheduling after the grant. So a
/// waiter X is only said to be passed by Y when Y arrived more than ARRIVAL_SLACK after X, and
/// Y's command started more than SERVED_SLACK before X's did (or before X gave up); and never
/// when either was signalled by a client (its place may lapse while it is stopped), nor when a
/// nemesis fault acted between X's arrival and Y's start (a waiter that lost its connection
/// may lose its place): those pairs are counted as excused.
const ARRIVAL_SLACK_NS: u64 = 3_000_000_000;
const SERVED_SLACK_NS: u64 = 1_000_000_000;

fn secs(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

pub fn check(h: &History, out: &mut Vec<Violation>) {
    for w in h.wrappers.values() {
        let name = w.plan.name.to_owned();
        if w.hung {
            out.push(Violation {
                invariant: "hung",
                name,
                detail: format!(
                    "run {} (pid {}) still running {} s after its bound; killed. {:?}; stderr: {}",
                    w.plan.run,
                    w.pid,
                    w.plan.bound_ms() / 1000,
                    w.plan,
                    w.stderr_tail()
                ),
                excused: None,
            });
            continue;
        }
        status(h, w, out);
        bounds(h, w, out);
        memory(h, w, out);
    }
    inner_statuses(h, out);
    if h.fair_order {
        fairness(h, out);
    }
}

fn status(h: &History, w: &Wrapper, out: &mut Vec<Violation>) {
    let ran = h.sections.contains_key(&w.plan.run);
    let sent = w.sent.map(|(sig, _)| sig);
    let ok = match w.status {
        0 => ran,
        75 => matches!(w.plan.wait, Waiting::NoWait | Waiting::For(_)),
        69 | 76 => true,
        124 => w.plan.max_run.is_some(),
        143 | -15 => sent == Some(libc::SIGTERM),
        -9 => sent == Some(libc::SIGKILL),
        _ => false,
    };
    if !ok {
        out.push(Violation {
            invariant: "unexpected exit status",
            name: w.plan.name.to_owned(),
            detail: format!(
                "run {} (pid {}) ended {}{}, signal sent {:?}; {:?}; stderr: {}",
                w.plan.run,
                w.pid,
                w.status,
                if ran {
                    ""
                } else {
                    " without running its command"
                },
                sent,
                w.plan,
                w.stderr_tail()
            ),
            excused: None,
        });
    }
}

/// A nested run takes its own lock on its own terms: it ends 0, 75 (its `-w`), 69, 76, or by
/// the signals its outer run's stop sends (TERM, then KILL). Anything else (2: a refused
/// `--holders` it never asked for) is a violation.
fn inner_statuses(h: &History, out: &mut Vec<Violation>) {
    for s in h.sections.values() {
        let Some((_, status)) = s.inner_exit else {
            continue;
        };
        if !matches!(status, 0 | 75 | 69 | 76 | 143 | -15 | -9) {
            out.push(Violation {
                invariant: "unexpected exit status of a nested run",
                name: s.name.clone(),
                detail: format!(
                    "the nested run {} of run {} (fence {}, holders env {}) ended {status}",
                    s.run + 1,
                    s.run,
                    s.fence,
                    s.holders_env
                ),
                excused: None,
            });
        }
    }
}

/// `-n` and `-w DUR` stop waiting by their bound; `--max-run` stops the command by its.
fn bounds(h: &History, w: &Wrapper, out: &mut Vec<Violation>) {
    let served = h.sections.get(&w.plan.run).map(|s| s.start);
    let waited_until = served.unwrap_or(w.ended);
    let slack = (BOUND_SLACK_MS + w.stopped_ms) * 1_000_000;
    let wait_bound = match w.plan.wait {
        Waiting::NoWait => Some(0),
        Waiting::For(ms) => Some(ms),
        _ => None,
    };
    let mut broken = Vec::new();
    if let Some(bound) = wait_bound {
        let waited = waited_until.saturating_sub(w.spawned);
        if waited > bound * 1_000_000 + slack && w.sent.is_none() {
            broken.push(format!("waited {} for a wait of {bound} ms", secs(waited)));
        }
    }
    if let (Some(max), Some(start)) = (w.plan.max_run, served) {
        let ran = w.ended.saturating_sub(start);
        if ran > (max + KILL_AFTER_MS) * 1_000_000 + slack && w.sent.is_none() {
            broken.push(format!("ran {} for --max-run {max}ms", secs(ran)));
        }
    }
    for what in broken {
        let faults = h.faults_during(w.spawned, w.ended);
        out.push(Violation {
            invariant: "past its bound",
            name: w.plan.name.to_owned(),
            detail: format!(
                "run {} (pid {}, status {}): {what}",
                w.plan.run, w.pid, w.status
            ),
            excused: faults
                .first()
                .map(|f| format!("during a fault: {}", f.describe())),
        });
    }
}

/// A wrapper's peak memory stays bounded, hostile replies or not.
fn memory(h: &History, w: &Wrapper, out: &mut Vec<Violation>) {
    if w.max_rss_kb <= MAX_RSS_KB {
        return;
    }
    let faults = h.faults_during(w.spawned, w.ended);
    out.push(Violation {
        invariant: "a wrapper's memory grew past its bound",
        name: w.plan.name.to_owned(),
        detail: format!(
            "run {} (pid {}, status {}) peaked at {} MiB; faults meanwhile: {}; stderr: {}",
            w.plan.run,
            w.pid,
            w.status,
            w.max_rss_kb / 1024,
            faults
                .iter()
                .map(|f| f.describe())
                .collect::<Vec<_>>()
                .join("; "),
            w.stderr_tail()
        ),
        excused: None,
    });
}

/// When a waiter stopped waiting: its command's start, or its wrapper's end.
fn wait_ended(h: &History, w: &Wrapper) -> u64 {
    h.sections.get(&w.plan.run).map_or(w.ended, |s| s.start)
}

/// Two `--no-fair` runs race while nobody queues; a `-n` run may take a lock that a racing
/// `--no-fair` waiter also wants: neither is an order to keep.
fn racing(x: &Wrapper, y: &Wrapper) -> bool {
    x.plan.wait == Waiting::NoFair && matches!(y.plan.wait, Waiting::NoFair | Waiting::NoWait)
}

fn fairness(h: &History, out: &mut Vec<Violation>) {
    let waiters: Vec<&Wrapper> = h
        .wrappers
        .values()
        .filter(|w| w.plan.wait != Waiting::NoWait)
        .collect();
    for x in &waiters {
        let x_until = wait_ended(h, x);
        let passed_by = h.wrappers.values().find_map(|y| {
            let s_y = h.sections.get(&y.plan.run)?.start;
            let comparable = y.plan.name == x.plan.name
                && y.spawned > x.spawned + ARRIVAL_SLACK_NS
                && s_y + SERVED_SLACK_NS < x_until
                && !racing(x, y);
            comparable.then_some((y, s_y))
        });
        let Some((y, s_y)) = passed_by else { continue };
        let faults = h.faults_during(x.spawned, s_y);
        let excused = if x.faulted() || y.faulted() {
            Some("a client signalled one of them".to_owned())
        } else {
            faults
                .first()
                .map(|f| format!("during a fault: {}", f.describe()))
        };
        out.push(Violation {
            invariant: "a waiter passed by a later arrival",
            name: x.plan.name.to_owned(),
            detail: format!(
                "run {} ({:?}, pid {}) arrived at {} and waited until {}; run {} ({:?}, pid {}) \
                 arrived at {} and was served at {}",
                x.plan.run,
                x.plan.wait,
                x.pid,
                secs(x.spawned),
                secs(x_until),
                y.plan.run,
                y.plan.wait,
                y.pid,
                secs(y.spawned),
                secs(s_y)
            ),
            excused,
        });
    }
}
