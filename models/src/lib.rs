//! The protocol models of `locked-run`: each backend's protocol as a Stateright model, small
//! enough to read beside the code it mirrors, explored exhaustively to stated bounds, each with
//! known-bad variants (mutations) that the checker must refute with a counterexample trace.
//! A crate of its own so that it is compiled optimised also in a debug `cargo test` (the
//! workspace's profile says so): the checker's time goes into these steps.
//!
//! # Layout
//! - `check`: running a model and its mutations; the report.
//! - `net`: the bag of messages every model's network is.
//! - `lease`: the lease clock in ticks (`src/lease.rs`), the job, the clock's rules.
//! - `lease_clock`: model 6, the lease clock against one store (its wire and store, its holder).
//! - `etcd`: model 3, etcd's recipe: the queue leases, the grant's mark.
//! - `keep_alive`: model 7, a waiter's place and its keep-alive (every backend's queue).
//! - `file`: model 5, `file://`'s fence blocks, crashes and restores.
//! - `object_store`: a candidate protocol for object stores (no backend).
//! - `postgres`: model 4, grants serialised on the fence row, buried tokens.
//! - `postgres_expiry`: model 4's clock: `expires_at` against the lease clock (`now()`).
//! - `redlock`: model 2, Redlock's quorum and its fence.
//! - `redis`: model 1, one Redis server's scripts: grants, the queue, `--shared`, `--holders`
//!   (its scripts, its configurations and mutations).

pub mod check;
pub mod etcd;
pub mod file;
pub mod keep_alive;
pub mod lease;
pub mod lease_clock;
pub mod net;
pub mod object_store;
pub mod postgres;
pub mod postgres_expiry;
pub mod redis;
pub mod redlock;
