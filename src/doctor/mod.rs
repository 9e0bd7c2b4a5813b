//! `locked-run doctor`: checks the Redis setup against what the lease and the fence need, and
//! says why, server by server: OK, WARN or FAIL lines (or JSON), exit 1 when anything FAILs.
//!
//! Per server: reachability and round trip, version, role (a replica is FAIL), cluster mode,
//! `maxmemory-policy`, persistence (for fence tokens that survive a restart), permissions (ACL
//! DRYRUN of every command the scripts run), and the server's clock against this host's. With
//! several servers (Redlock): whether they are truly independent, and their clocks against
//! each other. For `file://`: the directory, and the filesystem it is on. For `etcd://`: each
//! endpoint, the leader and the members, the user, and etcd's shortest lease (see `etcd.rs`).

mod across;
mod cron_path;
mod dir;
mod etcd;
mod permissions;
mod server;
mod version;

use std::collections::HashMap;

use serde_json::json;

use crate::cli::DoctorArgs;
use crate::exit::{Exit, Failure};
use crate::file;
use crate::name::LockName;

use across::across_servers;
use dir::check_dir;
use server::check_server;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        }
    }
}

#[derive(Clone)]
pub(crate) struct Check {
    pub(crate) server: String,
    pub(crate) check: &'static str,
    pub(crate) level: Level,
    pub(crate) detail: String,
}

/// What one server told about itself, for the checks across servers.
#[derive(Default)]
pub(crate) struct Facts {
    pub(crate) run_id: Option<String>,
    /// host:port of the server this one replicates, if a replica.
    pub(crate) primary: Option<String>,
    /// host:port of its replicas.
    pub(crate) replicas: Vec<String>,
    /// The server's clock minus this host's, in ms.
    pub(crate) skew_ms: Option<i64>,
}

/// `println!` that does not panic when stdout is closed (`locked-run ... | head`): what could
/// not be written is dropped, and the status stands.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Runs the checks and prints them; exit 1 when any FAILed.
pub fn doctor(args: &DoctorArgs) -> Result<Exit, Failure> {
    let name = LockName::new(&args.name).map_err(Failure::usage)?;
    if let Some(client) = crate::open::open_etcd(&args.conn)? {
        if name.as_str().contains('/') {
            return Err(Failure::usage(format!(
                "lock names on etcd:// hold no '/' ({name:?}): etcd's lock keeps a NAME's keys \
                 under NAME/"
            )));
        }
        let runtime = crate::open::runtime()?;
        let checks = runtime.block_on(etcd::check_etcd(&client, &name));
        return Ok(report(&checks, args.json));
    }
    let nodes = match crate::open::open_servers(&args.conn)? {
        crate::open::Servers::Dir(url) => {
            let dir = file::dir_of(&url).map_err(Failure::usage)?;
            return Ok(report(&check_dir(&url, &dir, &name), args.json));
        }
        crate::open::Servers::Redis(nodes) => nodes,
    };
    for node in &nodes {
        node.set_hash_tag(name.as_str());
    }
    let runtime = crate::open::runtime()?;
    let checks = runtime.block_on(async {
        let mut checks = Vec::new();
        let mut facts = Vec::new();
        for node in &nodes {
            let (mut server_checks, server_facts) = check_server(node, &name).await;
            checks.append(&mut server_checks);
            facts.push((node.address().to_owned(), node.endpoint(), server_facts));
        }
        if nodes.len() > 1 {
            checks.extend(across_servers(&facts));
        }
        checks
    });
    Ok(report(&checks, args.json))
}

/// Prints the checks; exit 1 when any FAILed.
fn report(checks: &[Check], as_json: bool) -> Exit {
    let checks = &[checks, &[cron_path::check()]].concat();
    let failed = checks.iter().any(|c| c.level == Level::Fail);
    if as_json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| json!({"server": c.server, "check": c.check, "status": c.level.word(), "detail": c.detail}))
            .collect();
        out!("{}", json!({"ok": !failed, "checks": list}));
    } else {
        let width = checks.iter().map(|c| c.server.len()).max().unwrap_or(0);
        for c in checks {
            out!(
                "{:<4} {:<width$}  {}: {}",
                c.level.word(),
                c.server,
                c.check,
                c.detail
            );
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

pub(crate) fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}
