//! etcd as the registry knows it: its one declaration (its URL schemes and their forms, what
//! it can hold, its NAME rule, how it is opened), kept apart from the lock itself.

use super::{EtcdLock, check_name, client};
use crate::backend::{Can, Declaration, Modes, Queue, Several, says};
use crate::endpoints::Scheme;

/// An etcd cluster (`etcd://`, `etcds://`), as the registry knows it: its one declaration.
pub const BACKEND: Declaration = {
    Declaration {
        called: "etcd://",
        schemes: &[
            Scheme::plain("etcd", "etcd://host:port[,...]"),
            Scheme {
                tls: true,
                ..Scheme::plain("etcds", "etcds:// (TLS)")
            },
        ],
        help: "etcd://[user@]host:port[,host:port...] for an etcd cluster (etcds:// for TLS)",
        doctor: "an etcd cluster",
        modes: Modes {
            holders: Can::Yes,
            shared: Can::Yes,
            wait_replicas: Can::No(
                "etcd commits every write through Raft on a quorum of its members",
            ),
            queue: Queue::Always,
        },
        several: Several::Refused(says!(
            "an etcd:// URL names a whole cluster: give one, listing its endpoints \
             (etcd://HOST:PORT,HOST:PORT), and no other URL"
        )),
        no_tls: Some(says!(
            "--tls-ca-cert, --tls-cert and --tls-key are for etcds:// URLs (etcd over TLS), and \
             an etcd:// URL is given"
        )),
        name_rule: check_name,
        open: |store, spec| {
            let client = client(store.endpoints, store.url().url())
                .map_err(crate::plumbing::exit::Failure::usage)?;
            Ok(Box::new(
                EtcdLock::on(client, spec.name.clone(), store.how.command).with_mode(spec.mode),
            ))
        },
    }
};
