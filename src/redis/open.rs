//! Redis servers as the door hands them over, opened (nothing is connected yet): each URL a
//! [`Node`], with the password the URL lacks, the TLS set-up for the schemes that speak it and
//! the sentinels' own credentials; one node a [`ServerLock`], several a [`Redlock`], once the
//! refusals of a Redlock that could not keep its promise are made.

use super::lock::ServerLock;
use super::node::Node;
use super::redlock::Redlock;
use crate::backend::{LockSpec, Mode, Opened, Store};
use crate::endpoints::{PASSWORD_VARIABLE, connector};
use crate::plumbing::exit::Failure;

/// The lock (and view) the store's URLs name for `spec`.
pub fn open(store: &Store, spec: &LockSpec) -> Result<Box<dyn Opened>, Failure> {
    let (name, command, how) = (spec.name.clone(), store.how.command, store.how);
    let mut nodes = nodes(store).map_err(Failure::usage)?;
    if nodes.len() == 1 {
        let node = nodes.pop().expect("one node");
        let lock = ServerLock::on(node, name, command)
            .with_holders(spec.mode.holders())
            .with_shared(spec.mode == Mode::Shared)
            .with_fair(spec.fair);
        return Ok(Box::new(match how.wait_replicas {
            Some((n, wait)) => lock.with_wait_replicas(n, wait),
            None => lock,
        }));
    }
    if !how.lenient {
        refuse_redlock(&nodes).map_err(Failure::usage)?;
    }
    let locks = nodes
        .into_iter()
        .map(|node| ServerLock::on(node, name.clone(), command))
        .collect();
    Ok(Box::new(Redlock::new(locks, how.node_timeout)))
}

/// A [`Node`] for each URL. Certificates are read (and the system's CAs loaded) once, not once
/// per server.
fn nodes(store: &Store) -> Result<Vec<Node>, String> {
    let endpoints = store.endpoints;
    let (password, from) = endpoints.default_password(PASSWORD_VARIABLE)?.unzip();
    endpoints.warn_about_visible_passwords();
    let tls = match store.urls.iter().any(|u| u.scheme().tls) {
        true => Some(connector(&endpoints.tls)?),
        false => None,
    };
    let sentinel_auth = match store.urls.iter().any(|u| u.scheme().sentinels) {
        true => endpoints.sentinel_auth()?,
        false => None,
    };
    store
        .urls
        .iter()
        .map(|url| {
            Node::open_with(
                url.url(),
                endpoints.connect_timeout,
                password.as_deref(),
                tls.as_ref(),
            )
            .map(|node| {
                node.with_sentinel_auth(sentinel_auth.clone())
                    .with_default_password_from(from.clone())
            })
        })
        .collect()
}

/// Redlock needs at least 3 servers, each a different one: a quorum of 2 out of 2 survives no
/// failure, and one server counted twice would fake a quorum. Said before any is connected.
pub fn refuse_redlock(nodes: &[Node]) -> Result<(), String> {
    for (i, node) in nodes.iter().enumerate() {
        if let Some(same) = nodes[..i].iter().find(|other| other.same_server(node)) {
            return Err(crate::text::message!(
                "{} is given twice (as {}): the same server counted twice would fake a Redlock quorum",
                node.address(),
                same.address()
            ));
        }
    }
    if nodes.len() < 3 {
        return Err(crate::text::message!(
            "{} Redis URLs given: Redlock needs at least 3 independent servers (a quorum of 2 out of 2 \
             survives no failure); give one URL for a single server, or 3 or more",
            nodes.len()
        ));
    }
    if nodes.len() % 2 == 0 {
        tracing::info!(
            "{} servers: a quorum is {}, so only {} may fail, no more than with {}",
            nodes.len(),
            nodes.len() / 2 + 1,
            nodes.len() / 2 - 1,
            nodes.len() - 1
        );
    }
    Ok(())
}
