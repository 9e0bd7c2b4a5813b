//! `locked-run status NAME [--json]`: held or free, by whom, since when, the fence, time left.
//! Exit 0 when held, 1 when free, 69 when the backend cannot be reached.

use serde_json::{Value, json};

use crate::backend::{Expiry, Holder};
use crate::exit::{Exit, Failure};
use crate::lease::show;
use crate::lock::{Lock, Report};

/// Prints the lock's state on stdout and returns the status to exit with.
pub async fn status(lock: &Lock, as_json: bool) -> Result<Exit, Failure> {
    let report = lock
        .inspect()
        .await
        .map_err(|e| Failure::unavailable(e.to_string()))?;
    let name = lock.name().as_str();
    if as_json {
        println!("{}", to_json(name, &report));
    } else {
        println!("{}", to_text(name, &report));
    }
    Ok(if report.held.is_some() {
        Exit::Held
    } else {
        Exit::Free
    })
}

/// One JSON object: `name`, `held`, `fence` (last issued, or null), `ttl_ms` (null when free,
/// -1 for a key without expiry), `holder` (null when free).
pub fn to_json(name: &str, report: &Report) -> Value {
    let (ttl_ms, holder) = match &report.held {
        None => (Value::Null, Value::Null),
        Some(busy) => {
            let ttl = match busy.expiry {
                Expiry::In(d) => json!(d.as_millis() as u64),
                Expiry::Never => json!(-1),
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
    use crate::backend::Busy;
    use std::time::Duration;

    #[test]
    fn free_and_held_in_json() {
        let free = Report {
            fence: Some(3),
            held: None,
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
