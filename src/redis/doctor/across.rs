//! `doctor` across Redlock's servers: distinct, independent, with clocks that agree.

use std::time::Duration;

use super::{Check, Facts, Level};
use crate::lease::Timings;

/// Redlock: the servers must be distinct and independent, with clocks that agree.
pub(super) fn across_servers(facts: &[(String, String, Facts)]) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut add = |server: &str, check: &'static str, level: Level, detail: String| {
        checks.push(Check {
            server: server.to_owned(),
            check,
            level,
            detail,
        })
    };
    let mut independent = true;
    for (i, (url, endpoint, f)) in facts.iter().enumerate() {
        for (other_url, other_endpoint, g) in &facts[i + 1..] {
            if f.run_id.is_some() && f.run_id == g.run_id {
                independent = false;
                add(
                    url,
                    "independence",
                    Level::Fail,
                    format!(
                        "the same server as {other_url} (same run_id): it would be counted twice in a quorum"
                    ),
                );
            }
            if f.replicas.contains(other_endpoint) || g.primary.as_ref() == Some(endpoint) {
                independent = false;
                add(
                    url,
                    "independence",
                    Level::Fail,
                    format!("{other_url} replicates it: Redlock needs independent primaries"),
                );
            }
            if g.replicas.contains(endpoint) || f.primary.as_ref() == Some(other_endpoint) {
                independent = false;
                add(
                    url,
                    "independence",
                    Level::Fail,
                    format!("it replicates {other_url}: Redlock needs independent primaries"),
                );
            }
            if let (Some(a), Some(b)) = (f.skew_ms, g.skew_ms) {
                let allowance = Timings::drift_for(Duration::from_secs(30)).as_millis() as i64;
                if (a - b).abs() > allowance {
                    add(
                        url,
                        "clocks",
                        Level::Warn,
                        format!("{:+} ms against {other_url}", a - b),
                    );
                }
            }
        }
    }
    if independent {
        add(
            "all servers",
            "independence",
            Level::Ok,
            format!(
                "{} distinct servers, no replication between them",
                facts.len()
            ),
        );
    }
    checks
}
