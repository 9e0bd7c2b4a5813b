//! Redis servers as the endpoints name them, ready to connect (nothing is connected yet): each
//! URL a [`Node`], with the password the URL lacks, the TLS set-up for `rediss://` and the
//! sentinels' own credentials; and the refusals of a Redlock that could not keep its promise.

use crate::endpoints::{Endpoints, PASSWORD_VARIABLE, Scheme, connector};
use crate::redis::node::Node;

/// A [`Node`] for each URL. Certificates are read (and the system's CAs loaded) once, not once
/// per server.
pub fn nodes(endpoints: &Endpoints, urls: &[String]) -> Result<Vec<Node>, String> {
    let (password, from) = endpoints.default_password(PASSWORD_VARIABLE)?.unzip();
    endpoints.warn_about_visible_passwords();
    let schemes: Vec<Scheme> = urls.iter().map(|u| Scheme::of(u)).collect();
    let tls = match schemes.iter().any(|s| s.tls()) {
        true => Some(connector(&endpoints.tls)?),
        false => None,
    };
    let sentinels = schemes
        .iter()
        .any(|s| matches!(s, Scheme::Redis { sentinel: true, .. }));
    let sentinel_auth = match sentinels {
        true => endpoints.sentinel_auth()?,
        false => None,
    };
    urls.iter()
        .map(|url| {
            Node::open_with(
                url,
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
