//! Opening what the URLs name (nothing is connected yet): one Redis server, Redlock over
//! several, or a directory of this host; and the runtime everything runs on.

use std::time::Duration;

use crate::cli::ConnArgs;
use crate::exit::Failure;
use crate::file::{self, FileLock};
use crate::name::LockName;
use crate::redis::lock::ServerLock;
use crate::redis::node::Node;
use crate::redis::redlock::Redlock;
use crate::redis::tls;

/// The backend the URLs name: one server, Redlock over several, or a directory of this host
/// (where nothing is created yet: a run prepares it, `status` only looks).
pub enum Opened {
    One(Box<ServerLock>),
    Many(Redlock),
    File(Box<FileLock>),
}

pub fn open_backend(
    conn: &ConnArgs,
    name: &str,
    command: &str,
    node_timeout: Duration,
) -> Result<Opened, Failure> {
    let name = LockName::new(name).map_err(Failure::usage)?;
    let nodes = match open_servers(conn)? {
        Servers::Dir(url) => return Ok(Opened::File(Box::new(FileLock::at(&url, name, command)?))),
        Servers::Redis(nodes) => nodes,
    };
    if nodes.len() == 1 {
        let node = nodes.into_iter().next().expect("one node");
        return Ok(Opened::One(Box::new(ServerLock::on(node, name, command))));
    }
    for (i, node) in nodes.iter().enumerate() {
        if let Some(same) = nodes[..i].iter().find(|other| other.same_server(node)) {
            return Err(Failure::usage(format!(
                "{} is given twice (as {}): the same server counted twice would fake a Redlock quorum",
                node.address(),
                same.address()
            )));
        }
    }
    if nodes.len() < 3 {
        return Err(Failure::usage(format!(
            "{} Redis URLs given: Redlock needs at least 3 independent servers (a quorum of 2 out of 2 \
             survives no failure); give one URL for a single server, or 3 or more",
            nodes.len()
        )));
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
    let locks = nodes
        .into_iter()
        .map(|node| ServerLock::on(node, name.clone(), command))
        .collect();
    Ok(Opened::Many(Redlock::new(locks, node_timeout)))
}

/// What the URLs name: a directory of this host (its `file://` URL), or Redis servers.
pub enum Servers {
    Dir(String),
    Redis(Vec<Node>),
}

/// Checks the URLs and the connection options together, and opens what they name (nothing is
/// connected yet): for a run, `status`, `release` and `doctor` alike.
pub fn open_servers(conn: &ConnArgs) -> Result<Servers, Failure> {
    let urls = conn.urls();
    let options = conn.tls();
    let rediss = urls.iter().any(|url| url.starts_with("rediss://"));
    if !rediss && (options.ca_cert.is_some() || options.cert.is_some() || options.key.is_some()) {
        // Ignoring them would leave a connection believed encrypted in plain text.
        return Err(Failure::usage(
            "--tls-ca-cert, --tls-cert and --tls-key are for rediss:// URLs, and none is given \
             (redis+sentinel:// and redis+cluster:// connect without TLS)",
        ));
    }
    if urls.iter().any(|url| file::is_file_url(url)) {
        if urls.len() > 1 {
            return Err(Failure::usage(
                "file:// keeps locks on this host only: it cannot be combined with other URLs \
                 (give one file:// URL, or only Redis URLs)",
            ));
        }
        file::dir_of(&urls[0]).map_err(Failure::usage)?;
        return Ok(Servers::Dir(urls[0].clone()));
    }
    let password = conn.default_password()?;
    conn.warn_about_visible_passwords();
    // Certificates are read (and the system's CAs loaded) once, not once per server.
    let tls = match rediss {
        true => Some(tls::connector(&options).map_err(Failure::usage)?),
        false => None,
    };
    let nodes = urls
        .iter()
        .map(|url| {
            Node::open_with(url, conn.connect_timeout, password.as_deref(), tls.as_ref())
                .map_err(Failure::usage)
        })
        .collect::<Result<Vec<Node>, Failure>>()?;
    Ok(Servers::Redis(nodes))
}

/// A single-threaded runtime: the child is forked from the main thread, which PDEATHSIG needs.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::unavailable(format!("cannot start the runtime: {e}")))
}

/// Evaluates `$body` with `$backend` bound to whichever backend `$opened` holds: each kind is
/// its own type, and the code that uses them (`run`, `status`, `release`) is generic.
macro_rules! with_backend {
    ($opened:expr, |$backend:ident| $body:expr) => {
        match $opened {
            $crate::open::Opened::One(boxed) => {
                let $backend = *boxed;
                $body
            }
            $crate::open::Opened::Many($backend) => $body,
            $crate::open::Opened::File(boxed) => {
                let $backend = *boxed;
                $body
            }
        }
    };
}
pub(crate) use with_backend;
