//! `locked-run` runs a command under a distributed lease, so that across a fleet at most one
//! copy of a job runs at a time; the lease lives in Redis (one server, Sentinel, Cluster, or
//! Redlock over several), an etcd cluster, a PostgreSQL database, or a directory of one host. This crate is its
//! library: the same lock, the same protocol and the same lease clock, for Rust programs that
//! want them without the wrapper.
//!
//! - [`Lock`]: a lease on one NAME, opened from [`Endpoints`] (the URLs, passwords, TLS) and
//!   [`Options`] (the lease's timings, `--holders`, `--shared`, how long to wait), exactly as
//!   the command line opens it. [`Lock::acquire`] returns the fence token, a number that grows
//!   with every acquisition: hand it to the storage you write to, so that it can refuse a holder
//!   whose lease ran out while it was paused.
//! - [`Guard`] ([`Lock::hold`]): the lock waited for, then kept in the background on the lease
//!   clock; [`Guard::stop_now`] resolves before the lease can be lost (the lease clock's kill
//!   point), so a task stops before anyone else can hold the lock.
//! - [`Error`]: what went wrong: its kind, in the terms of the command line's exit statuses,
//!   and its cause as [`std::error::Error::source`].
//!
//! `Lock`, `Guard` and `Error` are `Send + Sync`: a lock moves into `tokio::spawn` on any
//! runtime. Without default features (`default-features = false`) the crate is the library
//! alone, with none of the command line's dependencies; the `cli` feature builds the binary.
//!
//! A lease alone cannot guarantee exclusivity when processes pause: the fence is what lets the
//! protected resource reject a stale holder. See `docs/how-it-works.md` in the repository.
//!
//! The binary (`src/main.rs`) is thin: it parses the command line and hands it to the code
//! behind [`internals`], which is this crate's own and not an interface to build on.
//! `docs/architecture.md` describes the layers.

// Without the command line (`--no-default-features`), what only it reaches is left out where
// it is a module of its own (the subcommands, the child's supervision, the watcher, a run's
// life after its grant); the operator's half of each backend (status, doctor, history) and the
// run's metrics and pings are built but unused. The default build checks them all.
#![cfg_attr(not(feature = "cli"), allow(dead_code, unused_imports, unused_macros))]

mod backend;
#[cfg(feature = "cli")]
mod child;
#[cfg(feature = "cli")]
mod cli;
mod endpoints;
mod etcd;
#[cfg(feature = "fake-backend")]
mod fake;
mod file;
mod lease;
mod library;
mod name;
mod observe;
mod open;
mod plumbing;
mod postgres;
mod redis;
mod registry;
mod session;
#[cfg(feature = "cli")]
mod subcommands;
mod text;
#[cfg(feature = "cli")]
mod watcher;

pub use crate::endpoints::{Endpoints, TlsOptions};
pub use crate::library::{Cause, Error, Guard, Lock, Options, Stop};

/// What the `locked-run` binary and the project's own tools need from the inside: the command
/// line and its outcome (the binary; xtask's man pages and completions), and the Redis client
/// and scripts (the benchmark's client-cost example, the tests of the scripts). Not an
/// interface: it changes with the code.
#[doc(hidden)]
pub mod internals {
    pub use crate::backend::{hostname, wall_clock_ms};
    #[cfg(feature = "cli")]
    pub use crate::cli::app::{Outcome, execute};
    #[cfg(feature = "cli")]
    pub use crate::cli::{Cli, one_line, shared_options_after_subcommand};
    pub use crate::name::LockName;
    pub use crate::plumbing::exit::USAGE;
    pub use crate::plumbing::log::write_last;

    /// The Redis client, keys and scripts.
    pub mod redis {
        pub use crate::redis::SCRIPTS;
        pub use crate::redis::keys::Keys;
        pub use crate::redis::node::Node;
        pub use crate::redis::resp;
        pub use crate::redis::scripts;
    }
}
