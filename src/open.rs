//! The one door: what the [`Endpoints`] name, opened for a lock specification (nothing is
//! connected yet) as a run's lock ([`Backend`]) or an operator's view ([`View`]): one Redis
//! server, Redlock over several, an etcd cluster, a PostgreSQL database, or a directory of this
//! host. Every refusal of a combination (a mode a backend cannot hold, an option it has no use
//! for, a Redlock that could not keep its promise, a NAME a store cannot take) is made here,
//! before anything is built. The command line, the library and `doctor` all come through here; adding a backend is
//! a directory of its own and a line in [`open_store`]. Also the runtime everything runs on.

use std::time::Duration;

use crate::backend::{Backend, LockSpec, Mode, View};
use crate::endpoints::{Endpoints, Store};
use crate::etcd::{self, EtcdLock};
use crate::file::FileLock;
use crate::name::LockName;
use crate::plumbing::exit::Failure;
use crate::postgres::{self, PgLock};
use crate::redis::lock::ServerLock;
use crate::redis::open::{nodes, refuse_redlock};
use crate::redis::redlock::Redlock;

/// What opening needs besides the endpoints and the lock: the program's name (shown to
/// `status`), Redlock's per-server timeout, and `--wait-replicas`.
pub struct Opening<'a> {
    pub command: &'a str,
    pub node_timeout: Duration,
    /// `--wait-replicas N` (N > 0) and its timeout.
    pub wait_replicas: Option<(u32, Duration)>,
    /// `doctor`: a set of Redis servers a run would refuse as Redlock's (fewer than 3, one
    /// given twice) is opened all the same, for the checks to say what is wrong with it.
    pub lenient: bool,
}

impl Opening<'_> {
    /// For `status`, `release` and `doctor`.
    pub fn to_look<'a>(endpoints: &Endpoints, command: &'a str) -> Opening<'a> {
        Opening {
            command,
            node_timeout: endpoints.connect_timeout,
            wait_replicas: None,
            lenient: command == "doctor",
        }
    }
}

/// A backend as the door opens it: both halves, the run's lock and the operator's view.
trait Opened: Backend + View {}

impl<T: Backend + View> Opened for T {}

/// The lock the endpoints name, for a run of `spec`.
pub fn open(
    endpoints: &Endpoints,
    spec: &LockSpec,
    how: &Opening,
) -> Result<Box<dyn Backend>, Failure> {
    Ok(open_store(endpoints, spec, how)?)
}

/// The lock `name` as an operator sees it (`status`, `release --force`, `doctor`), in every
/// mode its holders may use.
pub fn look(
    endpoints: &Endpoints,
    name: &LockName,
    how: &Opening,
) -> Result<Box<dyn View>, Failure> {
    Ok(open_store(
        endpoints,
        &LockSpec::exclusive(name.clone()),
        how,
    )?)
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
    /// A PostgreSQL database (`postgres://`).
    Postgres,
}

impl Kind {
    fn of(store: &Store) -> Kind {
        match store {
            Store::Redis(urls) if urls.len() == 1 => Kind::Server,
            Store::Redis(_) => Kind::Redlock,
            Store::Dir(_) => Kind::Dir,
            Store::Etcd(_) => Kind::Etcd,
            Store::Postgres(_) => Kind::Postgres,
        }
    }

    fn refuses(self, spec: &LockSpec, how: &Opening) -> Option<String> {
        match (self, spec.mode) {
            (Kind::Redlock, Mode::Holders(_)) => {
                return Some(
                    "--holders is for one Redis server (plain, Sentinel, Cluster), file://, etcd:// or \
                     postgres://: Redlock over several servers holds one lock at a time".into(),
                );
            }
            (Kind::Redlock, Mode::Shared) => {
                return Some(
                    "--shared is for one Redis server (plain, Sentinel, Cluster), file://, etcd:// or \
                     postgres://: Redlock over several servers holds one lock at a time".into(),
                );
            }
            (Kind::Server | Kind::Redlock | Kind::Dir | Kind::Etcd | Kind::Postgres, _) => {}
        }
        let refused = match (self, how.wait_replicas.is_some()) {
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
            (Kind::Postgres, true) => Some(
                "--wait-replicas is for a Redis primary with replicas; on PostgreSQL a grant \
                 commits with synchronous_commit = on, and so waits for the synchronous standbys \
                 that synchronous_standby_names lists",
            ),
            _ => None,
        };
        if let Some(why) = refused {
            return Some(why.into());
        }
        match self {
            Kind::Etcd => etcd::check_name(&spec.name).err(),
            _ => None,
        }
    }
}

/// Opens what the endpoints name for `spec`, once every refusal is made.
fn open_store(
    endpoints: &Endpoints,
    spec: &LockSpec,
    how: &Opening,
) -> Result<Box<dyn Opened>, Failure> {
    let store = endpoints.store().map_err(Failure::usage)?;
    if let Some(why) = Kind::of(&store).refuses(spec, how) {
        return Err(Failure::usage(why));
    }
    let (name, command) = (spec.name.clone(), how.command);
    Ok(match store {
        Store::Postgres(url) => {
            let client = postgres::client(endpoints, &url).map_err(Failure::usage)?;
            Box::new(PgLock::on(client, name, command).with(spec.mode, spec.fair))
        }
        Store::Etcd(url) => {
            if !spec.fair {
                tracing::info!(
                    "--no-fair changes nothing on etcd://: its waiters are always served in arrival order"
                );
            }
            let client = etcd::client(endpoints, &url).map_err(Failure::usage)?;
            Box::new(EtcdLock::on(client, name, command).with_mode(spec.mode))
        }
        Store::Dir(url) => Box::new(
            FileLock::at(&url, name, command)?
                .with_holders(spec.mode.holders())
                .with_shared(spec.mode == Mode::Shared),
        ),
        Store::Redis(urls) => {
            let mut nodes = nodes(endpoints, &urls).map_err(Failure::usage)?;
            if nodes.len() == 1 {
                let node = nodes.pop().expect("one node");
                let lock = ServerLock::on(node, name, command)
                    .with_holders(spec.mode.holders())
                    .with_shared(spec.mode == Mode::Shared)
                    .with_fair(spec.fair);
                Box::new(match how.wait_replicas {
                    Some((n, wait)) => lock.with_wait_replicas(n, wait),
                    None => lock,
                })
            } else {
                if !how.lenient {
                    refuse_redlock(&nodes).map_err(Failure::usage)?;
                }
                let locks = nodes
                    .into_iter()
                    .map(|node| ServerLock::on(node, name.clone(), command))
                    .collect();
                Box::new(Redlock::new(locks, how.node_timeout))
            }
        }
    })
}

/// A single-threaded runtime: the child is forked from the main thread, which PDEATHSIG needs.
pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::unavailable(format!("cannot start the runtime: {e}")))
}
