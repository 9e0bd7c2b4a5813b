//! `doctor` for Redis: each server (reachability and round trip, version, role (a replica is
//! FAIL), cluster mode, `maxmemory-policy`, persistence (for fence tokens that survive a
//! restart), permissions (ACL DRYRUN of every command the scripts run), and the server's clock
//! against this host's); with several servers (Redlock), whether they are truly independent,
//! and their clocks against each other.

mod across;
mod permissions;
mod server;
mod version;

use std::collections::HashMap;

use crate::backend::{Check, Level};
use crate::name::LockName;
use crate::redis::node::Node;

use across::across_servers;
use server::check_server;

/// The checks of `nodes` (one server, or Redlock's), for lock `name`.
pub async fn check_servers(nodes: &[&Node], name: &LockName) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut facts = Vec::new();
    for node in nodes {
        node.set_hash_tag(name.as_str());
        let (mut server_checks, server_facts) = check_server(node, name).await;
        checks.append(&mut server_checks);
        facts.push((node.address().to_owned(), node.endpoint(), server_facts));
    }
    if nodes.len() > 1 {
        checks.extend(across_servers(&facts));
    }
    checks
}

/// What one server told about itself, for the checks across servers.
#[derive(Default)]
struct Facts {
    run_id: Option<String>,
    /// host:port of the server this one replicates, if a replica.
    primary: Option<String>,
    /// host:port of its replicas.
    replicas: Vec<String>,
    /// The server's clock minus this host's, in ms.
    skew_ms: Option<i64>,
}

fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}
