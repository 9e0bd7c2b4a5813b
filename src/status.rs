//! `locked-run status NAME [--json]`: held or free, by whom, since when, the fence, time left.
//! Exit 0 when held, 1 when free, 69 when the backend cannot be reached.

use serde_json::{Value, json};

use std::time::Duration;

use crate::backend::{Busy, Expiry, Holder};
use crate::exit::{Exit, Failure};
use crate::file;
use crate::lease::show;
use crate::name::LockName;
use crate::redis::lock::{Report, ServerLock};
use crate::redis::redlock::Redlock;

/// Prints the lock's state on stdout and returns the status to exit with.
pub async fn status(lock: &ServerLock, as_json: bool) -> Result<Exit, Failure> {
    let report = lock
        .inspect()
        .await
        .map_err(|e| Failure::unavailable(e.to_string()))?;
    // How many wait: a permission the ACL may deny (PUBSUB), so a missing count is no error.
    let waiters = lock.waiters().await.ok();
    Ok(print(lock.name().as_str(), &report, waiters, as_json))
}

/// `status` of a host-local lock: the lock file and the fence counter in the directory; the
/// waiters blocked on the lock, as `/proc/locks` lists them.
pub fn status_file(url: &str, name: &LockName, as_json: bool) -> Result<Exit, Failure> {
    let report = file::inspect(url, name).map_err(|e| Failure::unavailable(e.to_string()))?;
    let waiters = file::waiters(url, name);
    Ok(print(name.as_str(), &report, waiters, as_json))
}

/// Prints one lock's report (and how many wait for it, if known); exit 0 held, 1 free.
fn print(name: &str, report: &Report, waiters: Option<u64>, as_json: bool) -> Exit {
    if as_json {
        let mut object = to_json(name, report);
        object["waiters"] = json!(waiters);
        println!("{object}");
    } else {
        println!("{}{}", to_text(name, report), waiting(waiters));
    }
    if report.held.is_some() {
        Exit::Held
    } else {
        Exit::Free
    }
}

/// `status` over Redlock's servers: held when a quorum holds one owner's value; each server's
/// own state below. 69 when fewer than a quorum answer.
pub async fn status_redlock(redlock: &Redlock, as_json: bool) -> Result<Exit, Failure> {
    let reports = redlock.inspect().await;
    let quorum = redlock.quorum();
    let n = reports.len();
    let answered: Vec<&Report> = reports
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect();
    if answered.len() < quorum {
        let first = reports.iter().find_map(|(_, r)| r.as_ref().err());
        return Err(Failure::unavailable(format!(
            "only {} of {n} Redis servers answered, a quorum is {quorum}{}",
            answered.len(),
            first.map_or_else(String::new, |e| format!(": {e}"))
        )));
    }
    // The owner whose value a quorum of servers holds, if any.
    let owner = answered
        .iter()
        .filter_map(|r| r.value.as_deref())
        .find(|v| {
            answered
                .iter()
                .filter(|r| r.value.as_deref() == Some(*v))
                .count()
                >= quorum
        });
    let holding: Vec<&Report> = answered
        .iter()
        .copied()
        .filter(|r| owner.is_some() && r.value.as_deref() == owner)
        .collect();
    // The lock lasts while a quorum holds it: until the quorum-th longest of their leases ends.
    let mut expiries: Vec<Expiry> = holding
        .iter()
        .filter_map(|r| r.held.as_ref().map(|b| b.expiry))
        .collect();
    expiries.sort_by_key(|e| std::cmp::Reverse(e.left()));
    let summary = Report {
        fence: answered.iter().filter_map(|r| r.fence).max(),
        held: owner.map(|_| Busy {
            holder: holding
                .iter()
                .filter_map(|r| r.held.as_ref().map(|b| b.holder.clone()))
                .find(Holder::is_known)
                .unwrap_or_default(),
            expiry: expiries
                .get(quorum - 1)
                .copied()
                .unwrap_or(Expiry::In(Duration::ZERO)),
        }),
        value: owner.map(str::to_owned),
    };
    let name = redlock.name();
    let waiters = redlock.waiters().await;
    if as_json {
        let mut object = to_json(name, &summary);
        object["waiters"] = json!(waiters);
        object["quorum"] = json!(quorum);
        object["servers"] = Value::Array(
            reports
                .iter()
                .map(|(url, report)| match report {
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
        println!("{object}");
    } else {
        println!(
            "{}{}; {} of {n} servers hold it, a quorum is {quorum}",
            to_text(name, &summary),
            waiting(waiters),
            holding.len()
        );
        for (url, report) in &reports {
            match report {
                Ok(r) => println!(
                    "  {url}: {}",
                    to_text(name, r)
                        .split_once(": ")
                        .map_or("", |(_, rest)| rest)
                ),
                Err(e) => println!("  {url}: no answer: {e}"),
            }
        }
    }
    Ok(if summary.held.is_some() {
        Exit::Held
    } else {
        Exit::Free
    })
}

/// "; 2 waiting", or nothing.
fn waiting(waiters: Option<u64>) -> String {
    match waiters {
        Some(n) if n > 0 => format!("; {n} waiting"),
        _ => String::new(),
    }
}

/// One JSON object: `name`, `held`, `fence` (last issued, or null), `ttl_ms` (null when free,
/// -1 for a key without expiry), `holder` (null when free).
pub fn to_json(name: &str, report: &Report) -> Value {
    let (ttl_ms, holder) = match &report.held {
        None => (Value::Null, Value::Null),
        Some(busy) => {
            let ttl = match busy.expiry {
                Expiry::In(d) => json!(d.as_millis() as u64),
                Expiry::Never | Expiry::WithHolder => json!(-1),
            };
            (ttl, holder_json(&busy.holder))
        }
    };
    json!({
        "name": name,
        "held": report.held.is_some(),
        "fence": report.fence,
        "ttl_ms": ttl_ms,
        "holder": holder,
    })
}

fn holder_json(h: &Holder) -> Value {
    json!({
        "host": h.host,
        "pid": h.pid,
        "command": h.command,
        "since": h.since(),
    })
}

pub fn to_text(name: &str, report: &Report) -> String {
    let fence = report
        .fence
        .map_or_else(|| "none issued yet".to_owned(), |f| f.to_string());
    match &report.held {
        None => format!("{name}: free (last fence {fence})"),
        Some(busy) => {
            let left = match busy.expiry {
                Expiry::In(d) => format!("{} left", show(d)),
                Expiry::Never => "no expiry: only a delete frees it".to_owned(),
                Expiry::WithHolder => "until its holder exits".to_owned(),
            };
            let mut holder = busy.holder.clone();
            holder.fence = None;
            format!("{name}: held by {holder}; fence {fence}; {left}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_and_held_in_json() {
        let free = Report {
            fence: Some(3),
            held: None,
            value: None,
        };
        assert_eq!(
            to_json("job", &free),
            json!({"name": "job", "held": false, "fence": 3, "ttl_ms": null, "holder": null})
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
        };
        let j = to_json("job", &held);
        assert_eq!(j["held"], json!(true));
        assert_eq!(j["ttl_ms"], json!(1200));
        assert_eq!(j["holder"]["pid"], json!(9));
        assert_eq!(j["holder"]["since"], json!("1970-01-01T00:00:00Z"));
        assert_eq!(
            to_text("job", &held),
            "job: held by h pid 9 (sh) since 1970-01-01T00:00:00Z; fence 4; 1.2s left"
        );
    }
}
