//! `locked-run`: run a command under a distributed lease held in Redis, so that across a fleet
//! at most one copy of a job runs at a time. The crate is a library with a thin binary
//! (`src/main.rs`); this is its front door.
//!
//! # Layout
//!
//! - [`app`]: what the command line asks for, carried out, and how it ends (the exit).
//! - [`cli`]: the command line (clap), value parsers, validation into a [`config::RunConfig`].
//! - [`config`]: what a run needs besides the backend ([`config::RunConfig`], how long to wait).
//! - [`open`]: opening the backend the URLs name for a lock specification, as one
//!   [`backend::AnyBackend`]; the one place a kind of backend refuses what it cannot give.
//! - [`session`]: one run's session with its lock: waiting, the job, its stop and its ending
//!   (pure cores and small drivers).
//! - [`lease`]: the lease clock (a pure state machine) and the loop that keeps the lease; the
//!   lease's timings, owned by [`lease::Timings`].
//! - [`backend`]: the interface every backend implements (acquire, renew, release, give back,
//!   wake-ups, inspect, force-release), the lock specification, and the one type for any backend.
//! - [`redis`]: the Redis backends: one server (plain, TLS, Sentinel, Cluster) and Redlock,
//!   with the URL, connection, protocol and script layers under them.
//! - [`etcd`]: the consensus backend (`etcd://`): etcd's own lock recipe over its JSON gateway,
//!   the fence a create revision.
//! - [`file`]: the host-local backend (`file:///DIR`): `flock(2)` and a durable fence counter.
//! - [`child`]: finding, spawning, signalling and reaping the command.
//! - [`watcher`]: kills the job's session should `locked-run` itself be SIGKILLed.
//! - [`signals`]: the signals forwarded to the command or ending a wait.
//! - [`status`], [`release`], [`doctor`]: the operators' subcommands.
//! - [`library`]: the lock as a Rust type ([`Lock`]), over any backend.
//! - [`name`]: lock names (the keys and file names derived from them live with their backend).
//! - [`exit`]: exit statuses, mapped to numbers in one place.
//! - [`log`], [`notify`]: stderr logging; `sd_notify` for systemd units.

pub mod app;
pub mod backend;
pub mod child;
pub mod cli;
pub mod clock;
pub mod config;
pub mod doctor;
pub mod endpoints;
pub mod etcd;
pub mod exit;
pub mod file;
pub mod lease;
pub mod library;
pub mod log;
pub mod name;
pub mod notify;
pub mod open;
pub mod redis;
pub mod release;
pub mod session;
pub mod signals;
pub mod status;
pub mod text;

pub mod watcher;

pub use crate::app::{Outcome, execute};
pub use crate::endpoints::Endpoints;
pub use crate::library::{Error, Guard, Lock, Options, Stop};
pub use crate::redis::redlock::Redlock;
