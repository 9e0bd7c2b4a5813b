//! Opening what the URLs name for a lock specification (nothing is connected yet): one Redis
//! server, Redlock over several, an etcd cluster, or a directory of this host, as one
//! [`AnyBackend`]; the one place where a backend's kind refuses what it cannot give; and the
//! runtime everything runs on. Adding a backend is a directory of its own and a line here.

use std::time::Duration;

use crate::backend::{AnyBackend, LockSpec, Mode};
use crate::cli::ConnArgs;
use crate::etcd::{self, EtcdLock};
use crate::exit::Failure;
use crate::file::{self, FileLock};
use crate::name::LockName;
use crate::redis::lock::ServerLock;
use crate::redis::node::Node;
use crate::redis::redlock::Redlock;
use crate::redis::tls;

/// What opening needs besides the lock: the program's name (shown to `status`), Redlock's
/// per-server timeout, and `--wait-replicas`.
pub struct Opening<'a> {
    pub command: &'a str,
    pub node_timeout: Duration,
    /// `--wait-replicas N` (N > 0) and its timeout.
    pub wait_replicas: Option<(u32, Duration)>,
}

impl Opening<'_> {
    /// For `status` and `release`.
    pub fn to_look<'a>(conn: &ConnArgs, command: &'a str) -> Opening<'a> {
        Opening {
            command,
            node_timeout: conn.connect_timeout,
            wait_replicas: None,
        }
    }
}

/// The kinds of backend, and what each refuses of a lock specification: the one place where a
/// mode or option a backend cannot give is a usage error (2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// One Redis server (plain, TLS, a Unix socket, Sentinel, Cluster).
    Server,
    /// Redlock over several independent primaries.
    Redlock,
    /// A directory of this host (`file://`).
    Dir,
    /// An etcd cluster (`etcd://`).
    Etcd,
}

impl Kind {
    fn refuses(self, spec: &LockSpec, how: &Opening) -> Option<&'static str> {
        match (self, spec.mode) {
            (Kind::Redlock, Mode::Holders(_)) => {
                return Some(
                    "--holders is for one Redis server (plain, Sentinel, Cluster), file:// or etcd://: \
                     Redlock over several servers holds one lock at a time",
                );
            }
            (Kind::Redlock, Mode::Shared) => {
                return Some(
                    "--shared is for one Redis server (plain, Sentinel, Cluster), file:// or etcd://: \
                     Redlock over several servers holds one lock at a time",
                );
            }
            (Kind::Server | Kind::Redlock | Kind::Dir | Kind::Etcd, _) => {}
        }
        match (self, how.wait_replicas.is_some()) {
            (Kind::Redlock, true) => Some(
                "--wait-replicas is for one primary with replicas; Redlock's servers are \
                 independent primaries",
            ),
            (Kind::Dir, true) => {
                Some("--wait-replicas is for a Redis primary with replicas, not for file://")
            }
            (Kind::Etcd, true) => Some(
                "--wait-replicas is for a Redis primary with replicas; etcd commits every write \
                 through Raft on a quorum of its members",
            ),
            _ => None,
        }
    }
}

/// Opens the backend the URLs name for the lock `spec` describes (nothing is connected yet).
pub fn open_backend(
    conn: &ConnArgs,
    spec: &LockSpec,
    how: &Opening,
) -> Result<AnyBackend, Failure> {
    let name = spec.name.clone();
    if let Some(client) = open_etcd(conn)? {
        refuse(Kind::Etcd, spec, how)?;
        crate::etcd::check_name(&name).map_err(Failure::usage)?;
        if !spec.fair {
            tracing::info!(
                "--no-fair changes nothing on etcd://: its waiters are always served in arrival order"
            );
        }
        let lock = EtcdLock::on(client, name, how.command).with_mode(spec.mode);
        return Ok(AnyBackend::new(lock));
    }
    let nodes = match open_servers(conn)? {
        Servers::Dir(url) => {
            refuse(Kind::Dir, spec, how)?;
            let lock = FileLock::at(&url, name, how.command)?
                .with_holders(spec.mode.holders())
                .with_shared(spec.mode == Mode::Shared);
            return Ok(AnyBackend::new(lock));
        }
        Servers::Redis(nodes) => nodes,
    };
    if nodes.len() == 1 {
        refuse(Kind::Server, spec, how)?;
        let node = nodes.into_iter().next().expect("one node");
        let lock = ServerLock::on(node, name, how.command)
            .with_holders(spec.mode.holders())
            .with_shared(spec.mode == Mode::Shared)
            .with_fair(spec.fair);
        let lock = match how.wait_replicas {
            Some((n, wait)) => lock.with_wait_replicas(n, wait),
            None => lock,
        };
        return Ok(AnyBackend::new(lock));
    }
    let redlock = open_redlock(nodes, &name, how)?;
    refuse(Kind::Redlock, spec, how)?;
    Ok(AnyBackend::new(redlock))
}

fn refuse(kind: Kind, spec: &LockSpec, how: &Opening) -> Result<(), Failure> {
    match kind.refuses(spec, how) {
        Some(why) => Err(Failure::usage(why)),
        None => Ok(()),
    }
}

/// Redlock over `nodes`: distinct servers, at least 3.
fn open_redlock(nodes: Vec<Node>, name: &LockName, how: &Opening) -> Result<Redlock, Failure> {
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
        .map(|node| ServerLock::on(node, name.clone(), how.command))
        .collect();
    Ok(Redlock::new(locks, how.node_timeout))
}

/// The etcd cluster the URLs name, if they name one (nothing is connected yet): one `etcd://`
/// or `etcds://` URL listing its endpoints, with the TLS options for `etcds://`, and the
/// user's password from the URL, `--password-file` or `REDISCLI_AUTH`.
pub fn open_etcd(conn: &ConnArgs) -> Result<Option<etcd::Client>, Failure> {
    let urls = conn.urls().map_err(Failure::usage)?;
    let Some(url) = urls.iter().find(|url| etcd::is_etcd_url(url)) else {
        return Ok(None);
    };
    if urls.len() > 1 {
        return Err(Failure::usage(
            "an etcd:// URL names a whole cluster: give one, listing its endpoints \
             (etcd://HOST:PORT,HOST:PORT), and no other URL",
        ));
    }
    let mut parsed = etcd::parse_url(url).map_err(Failure::usage)?;
    if conn.sentinel_password_file.is_some() {
        return Err(Failure::usage(
            "--sentinel-password-file is for redis+sentinel:// and rediss+sentinel:// URLs, and \
             an etcd:// URL is given",
        ));
    }
    let options = conn.tls();
    let tls = match (parsed.tls, &options) {
        (true, _) => Some(tls::connector(&options).map_err(Failure::usage)?),
        (false, o) if o.ca_cert.is_some() || o.cert.is_some() || o.key.is_some() => {
            // Ignoring them would leave a connection believed encrypted in plain text.
            return Err(Failure::usage(
                "--tls-ca-cert, --tls-cert and --tls-key are for etcds:// URLs (etcd over TLS), \
                 and an etcd:// URL is given",
            ));
        }
        (false, _) => None,
    };
    if parsed.user.is_some() && parsed.password.is_none() {
        (parsed.password, parsed.password_from) = conn.default_password_from()?.unzip();
    }
    conn.warn_about_visible_passwords();
    Ok(Some(etcd::Client::new(parsed, tls, conn.connect_timeout)))
}

/// What the URLs name: a directory of this host (its `file://` URL), or Redis servers.
pub enum Servers {
    Dir(String),
    Redis(Vec<Node>),
}

/// Checks the URLs and the connection options together, and opens what they name (nothing is
/// connected yet): for a run, `status`, `release` and `doctor` alike.
pub fn open_servers(conn: &ConnArgs) -> Result<Servers, Failure> {
    let urls = conn.urls().map_err(Failure::usage)?;
    if urls.iter().any(|url| etcd::is_etcd_url(url)) {
        // Checked by `open_etcd` before this is called, for a run and every subcommand.
        return Err(Failure::usage(
            "an etcd:// URL is opened as a cluster, not as Redis servers",
        ));
    }
    let options = conn.tls();
    let rediss = urls.iter().any(|url| crate::redis::url::is_tls(url));
    if !rediss && (options.ca_cert.is_some() || options.cert.is_some() || options.key.is_some()) {
        // Ignoring them would leave a connection believed encrypted in plain text.
        return Err(Failure::usage(
            "--tls-ca-cert, --tls-cert and --tls-key are for rediss:// URLs (and \
             rediss+sentinel://, rediss+cluster://), and none is given (redis+sentinel:// and \
             redis+cluster:// connect without TLS)",
        ));
    }
    let sentinels = urls.iter().any(|url| url.contains("+sentinel://"));
    if !sentinels && conn.sentinel_password_file.is_some() {
        return Err(Failure::usage(
            "--sentinel-password-file is for redis+sentinel:// and rediss+sentinel:// URLs, and \
             none is given",
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
    let (password, from) = conn.default_password_from()?.unzip();
    conn.warn_about_visible_passwords();
    // Certificates are read (and the system's CAs loaded) once, not once per server.
    let tls = match rediss {
        true => Some(tls::connector(&options).map_err(Failure::usage)?),
        false => None,
    };
    let sentinel_auth = match sentinels {
        true => conn.sentinel_auth()?,
        false => None,
    };
    let nodes = urls
        .iter()
        .map(|url| {
            Node::open_with(url, conn.connect_timeout, password.as_deref(), tls.as_ref())
                .map(|node| {
                    node.with_sentinel_auth(sentinel_auth.clone())
                        .with_default_password_from(from.clone())
                })
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
