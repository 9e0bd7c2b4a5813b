//! `locked-run doctor`: checks what holds lock NAME against what the lease and the fence need,
//! and says why, server by server: OK, WARN or FAIL lines (or JSON), exit 1 when anything FAILs.
//! The checks are each backend's own (`View::checks`: `redis/doctor/`, `etcd/doctor.rs`,
//! `file/doctor.rs`), and whether cron finds this binary (`cron_path.rs`); this prints them.

mod cron_path;

use serde_json::json;

use crate::backend::Opening;
use crate::backend::{Check, Level};
use crate::endpoints::Endpoints;
use crate::name::LockName;
use crate::open::{look, runtime};
use crate::plumbing::exit::{Exit, Failure};
use crate::text::out;

/// Runs the checks of what `endpoints` name, for lock `name`, and prints them (`json`: as one
/// object); exit 1 when any FAILed.
pub fn doctor(endpoints: &Endpoints, name: &str, json: bool) -> Result<Exit, Failure> {
    let name = LockName::new(name).map_err(Failure::usage)?;
    let view = look(endpoints, &name, &Opening::to_look(endpoints, "doctor"))?;
    let mut checks = runtime()?.block_on(view.checks());
    checks.push(cron_path::check());
    Ok(report(&checks, json))
}

/// Prints the checks; exit 1 when any FAILed.
fn report(checks: &[Check], as_json: bool) -> Exit {
    let failed = checks.iter().any(|c| c.level == Level::Fail);
    if as_json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| json!({"server": c.server, "check": c.check, "status": c.level.word(), "detail": c.detail}))
            .collect();
        out!(
            "{}",
            crate::text::json(&json!({"ok": !failed, "checks": list}))
        );
    } else {
        let width = checks.iter().map(|c| c.server.len()).max().unwrap_or(0);
        for c in checks {
            // A detail may quote a server's own words: each of its lines printed as a line of
            // its own in the printable form (what a server sent is made one line where it is
            // quoted; the lines here are doctor's own, such as the SQL it prints for an
            // administrator), each cut.
            let mut lines = c.detail.lines().map(crate::text::printable);
            out!(
                "{:<4} {:<width$}  {}: {}",
                c.level.word(),
                c.server,
                c.check,
                lines.next().unwrap_or_default()
            );
            for line in lines {
                out!("{line}");
            }
        }
        let count = |l: Level| checks.iter().filter(|c| c.level == l).count();
        out!(
            "doctor: {} OK, {} WARN, {} FAIL",
            count(Level::Ok),
            count(Level::Warn),
            count(Level::Fail)
        );
    }
    Exit::Checked { failed }
}
