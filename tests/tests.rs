//! Integration tests: the real binary against real redis-server processes started on free
//! ports, real children, real signals. One target, so the suite links once.

mod support;

mod durability;
mod errors;
mod fair;
mod fencing;
mod holders;
mod lease_loss;
mod library;
mod local;
mod max_run;
mod operators;
mod ops;
mod production;
mod redlock;
mod running;
mod signals;
mod status;
mod terminal;
mod waiting;
