//! `locked-run status NAME [--json]`: held or free, by whom, since when, the fence, time left.
//! Exit 0 when held, 1 when free, 69 when the backend cannot be reached.

use serde_json::{Value, json};

use crate::backend::{Expiry, Holder, KEPT, Report, Run, Slot, Tenure, View};
use crate::name::LockName;
use crate::plumbing::exit::{Exit, Failure};
use crate::text::{out, printable, show};

/// Prints the lock's state on stdout and returns the status to exit with: 0 held, 1 free.
pub async fn status(backend: &dyn View, name: &LockName, as_json: bool) -> Result<Exit, Failure> {
    let report = backend
        .inspect()
        .await
        .map_err(|e| Failure::unavailable(e.to_string()))?;
    // The last run, and what the history tells of the holders; a history that cannot be read
    // (the ACL) leaves the line out, not the status.
    let runs = history_for(backend, &report).await.map(|history| {
        if history.skipped > 0 {
            tracing::info!(
                "{}",
                crate::subcommands::history::skipped_line(name, history.skipped)
            );
        }
        history.runs
    });
    let last = runs
        .as_ref()
        .map(|runs| runs.first().cloned())
        .map_err(Clone::clone);
    let runs = runs.unwrap_or_default();
    let kept: Vec<bool> = report
        .holders
        .iter()
        .map(|slot| kept(backend.tenure(), slot, &runs))
        .collect();
    let name = name.as_str();
    if as_json {
        let mut object = to_json(name, &report);
        if report.fence.is_none() && report.revision.is_some() {
            // A store that keeps no last fence (etcd; its text says what bounds the next): the
            // last one issued is the largest its runs were given.
            object["fence"] = json!(runs.iter().map(|run| run.fence).max());
        }
        object["waiters"] = json!(report.waiters);
        object["last_run"] = match &last {
            Ok(Some(run)) => run.to_json(),
            _ => Value::Null,
        };
        if let Some(servers) = &report.servers {
            object["quorum"] = json!(servers.quorum);
            object["servers"] = Value::Array(
                servers
                    .each
                    .iter()
                    .map(|(url, server)| match server {
                        Ok(r) => {
                            let mut o = json!({"url": url});
                            let fields = to_json(name, r);
                            for (k, v) in fields
                                .as_object()
                                .into_iter()
                                .flatten()
                                .filter(|(k, _)| *k != "name")
                            {
                                o[k] = v.clone();
                            }
                            o
                        }
                        Err(e) => json!({"url": url, "error": e.to_string()}),
                    })
                    .collect(),
            );
        }
        out!("{}", crate::text::json(&object));
    } else if let Some(servers) = &report.servers {
        let quorum = servers.quorum;
        let holding = servers
            .each
            .iter()
            .filter(|(_, r)| {
                report.value.is_some()
                    && r.as_ref()
                        .is_ok_and(|r| r.value.as_ref() == report.value.as_ref())
            })
            .count();
        out!(
            "{}{}; {holding} of {} servers hold it, a quorum is {quorum}",
            to_text(name, &report, &kept),
            waiting(report.waiters),
            servers.each.len()
        );
        for (url, server) in &servers.each {
            match server {
                Ok(r) => out!(
                    "  {url}: {}",
                    to_text(name, r, &[])
                        .split_once(": ")
                        .map_or("", |(_, rest)| rest)
                ),
                Err(e) => out!(
                    "  {url}: no answer: {}",
                    crate::text::line_form(&e.to_string())
                ),
            }
        }
    } else {
        out!(
            "{}{}",
            to_text(name, &report, &kept),
            waiting(report.waiters)
        );
    }
    if !as_json {
        match &last {
            Ok(Some(run)) => out!("  last run: {}", crate::subcommands::history::line(run)),
            Ok(None) if report.held.is_none() && report.fence.is_none() => {
                out!("  never taken (no run in its history: is the NAME right?)")
            }
            Ok(None) => out!("  last run: none in its history"),
            Err(e) => tracing::info!("cannot read lock {name}'s history: {e}"),
        }
    }
    Ok(if report.held.is_some() {
        Exit::Held
    } else {
        Exit::Free
    })
}

/// What `status` and `release` read of the history: every run it keeps while the lock is held
/// or its store keeps no last fence (which holders' runs are over, the fence), else the last.
pub async fn history_for(
    backend: &dyn View,
    report: &Report,
) -> Result<crate::backend::History, crate::backend::BackendError> {
    let all = report.held.is_some() || report.fence.is_none();
    backend.history(if all { KEPT } else { 1 }).await
}

/// Whether `slot`'s run is over and only its `--min-hold` keeps the lock: a host-local lock
/// no process holds (its deadline keeps it), or a lease whose run's end is in the history
/// (`runs`).
pub fn kept(tenure: Tenure, slot: &Slot, runs: &[Run]) -> bool {
    match (tenure, slot.busy.expiry) {
        (Tenure::Kernel, Expiry::In(_)) => true,
        (Tenure::Lease, Expiry::In(_)) => slot
            .token
            .as_deref()
            .is_some_and(|token| runs.iter().any(|run| run.token == token)),
        _ => false,
    }
}

/// "; 2 waiting", or nothing.
fn waiting(waiters: Option<u64>) -> String {
    match waiters {
        Some(n) if n > 0 => format!("; {n} waiting"),
        _ => String::new(),
    }
}

/// One JSON object: `name`, `held`, `fence` (last issued, or null), `ttl_ms` (null when free,
/// -1 for a key without expiry), `holder` (null when free), `holders` (every one), `limit`
/// (the N of `--holders N`), `mode` (`shared` or `exclusive`; null when free).
pub fn to_json(name: &str, report: &Report) -> Value {
    let (ttl_ms, holder) = match &report.held {
        None => (Value::Null, Value::Null),
        Some(busy) => (ttl_json(busy.expiry), holder_json(&busy.holder)),
    };
    let holders: Vec<Value> = report
        .holders
        .iter()
        .map(|slot| {
            let mut o = holder_json(&slot.busy.holder);
            o["fence"] = json!(slot.busy.holder.fence);
            o["ttl_ms"] = ttl_json(slot.busy.expiry);
            o["token"] = json!(slot.token);
            o
        })
        .collect();
    json!({
        "name": name,
        "held": report.held.is_some(),
        "fence": report.fence,
        "ttl_ms": ttl_ms,
        "holder": holder,
        "holders": holders,
        "limit": report.limit,
        "mode": match (&report.held, report.shared) {
            (None, _) => Value::Null,
            (Some(_), true) => json!("shared"),
            (Some(_), false) => json!("exclusive"),
        },
    })
}

/// Time left in ms: -1 for a lock that ends only with its holder (or a delete).
fn ttl_json(expiry: Expiry) -> Value {
    match expiry {
        Expiry::In(d) | Expiry::Queued { retry_in: d, .. } => json!(d.as_millis() as u64),
        Expiry::Never | Expiry::WithHolder => json!(-1),
    }
}

fn holder_json(h: &Holder) -> Value {
    json!({
        "host": h.host,
        "pid": h.pid,
        "command": h.command,
        "since": h.since(),
    })
}

/// The lock's state in one line; `kept[i]`: holder i's run is over, and only its `--min-hold`
/// keeps the lock (see [`kept`]).
pub fn to_text(name: &str, report: &Report, kept: &[bool]) -> String {
    let fence = match (report.fence, report.revision) {
        (None, Some(revision)) => {
            format!("no last fence kept; the next is above revision {revision}")
        }
        (fence, _) => crate::backend::last_fence(fence),
    };
    let left = |expiry: Expiry| match expiry {
        Expiry::In(d) | Expiry::Queued { retry_in: d, .. } => format!("{} left", show(d)),
        Expiry::Never => "no expiry: only a delete frees it".to_owned(),
        Expiry::WithHolder => "until its holder exits".to_owned(),
    };
    let each = || {
        let each: Vec<String> = report
            .holders
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let mut holder = slot.busy.holder.clone();
                let own = holder.fence.take();
                let own = own.map_or_else(String::new, |f| format!(", fence {f}"));
                let token = printable(slot.token.as_deref().unwrap_or("?"));
                let kept = match kept.get(i) {
                    Some(true) => "kept by --min-hold, ",
                    _ => "",
                };
                format!(
                    "{holder}{own}, {kept}{} (token {token})",
                    left(slot.busy.expiry)
                )
            })
            .collect();
        each.join("; ")
    };
    match (&report.held, report.limit) {
        (None, _) => format!("{name}: free ({fence})"),
        (Some(_), _) if report.shared => format!(
            "{name}: held shared by {} ({fence}): {}",
            report.holders.len(),
            each()
        ),
        (Some(_), Some(limit)) if limit > 1 => format!(
            "{name}: held by {} of {limit} holders ({fence}): {}",
            report.holders.len(),
            each()
        ),
        (Some(busy), _) => {
            let mut holder = busy.holder.clone();
            holder.fence = None;
            let fence = report
                .fence
                .map_or_else(|| "no fence".to_owned(), |f| format!("fence {f}"));
            let by = match kept.first() {
                Some(true) => "kept by --min-hold of its last holder,",
                _ => "held by",
            };
            format!("{name}: {by} {holder}; {fence}; {}", left(busy.expiry))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::Busy;

    #[test]
    fn free_and_held_in_json() {
        let free = Report {
            fence: Some(3),
            ..Report::default()
        };
        assert_eq!(
            to_json("job", &free),
            json!({"name": "job", "held": false, "fence": 3, "ttl_ms": null, "holder": null,
                   "holders": [], "limit": null, "mode": null})
        );
        let held = Report {
            fence: Some(4),
            held: Some(Busy {
                holder: Holder {
                    host: Some("h".into()),
                    pid: Some(9),
                    command: Some("sh".into()),
                    since_ms: Some(0),
                    fence: Some(4),
                },
                expiry: Expiry::In(Duration::from_millis(1200)),
            }),
            value: Some("t".into()),
            ..Report::default()
        };
        let j = to_json("job", &held);
        assert_eq!(j["held"], json!(true));
        assert_eq!(j["ttl_ms"], json!(1200));
        assert_eq!(j["holder"]["pid"], json!(9));
        assert_eq!(j["holder"]["since"], json!("1970-01-01T00:00:00Z"));
        assert_eq!(
            to_text("job", &held, &[]),
            "job: held by h pid 9 (sh) since 1970-01-01T00:00:00Z; fence 4; 1.2s left"
        );
        assert_eq!(
            to_text("job", &held, &[true]),
            "job: kept by --min-hold of its last holder, h pid 9 (sh) since \
             1970-01-01T00:00:00Z; fence 4; 1.2s left"
        );
    }

    fn run(token: &str) -> Run {
        Run {
            token: token.into(),
            host: "h".into(),
            pid: 9,
            user: "u".into(),
            fence: 4,
            mode: "exclusive".into(),
            started_ms: 0,
            ended_ms: 1,
            waited_ms: 0,
            status: 0,
            ended: crate::backend::Ended::Exit,
        }
    }

    #[test]
    fn a_holder_is_kept_by_min_hold_once_its_run_is_over() {
        let slot = |token: &str, expiry| Slot {
            token: Some(token.into()),
            busy: Busy {
                holder: Holder::default(),
                expiry,
            },
        };
        let lease = Expiry::In(Duration::from_secs(60));
        let ended = [run("other"), run("t")];
        // A lease: once the history has its run's end.
        assert!(kept(Tenure::Lease, &slot("t", lease), &ended));
        assert!(!kept(Tenure::Lease, &slot("t", lease), &ended[..1]));
        assert!(!kept(Tenure::Lease, &slot("t", Expiry::Never), &ended));
        // A host-local lock: once no process holds it, whatever the history says.
        assert!(kept(Tenure::Kernel, &slot("t", lease), &[]));
        assert!(!kept(
            Tenure::Kernel,
            &slot("t", Expiry::WithHolder),
            &ended
        ));
    }
}
