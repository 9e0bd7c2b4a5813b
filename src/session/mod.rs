//! One run's session with its lock, on the lease clock's own pattern: pure cores that are told
//! what happened at which clock reading and answer with the next step, and small drivers that
//! do the sending, sleeping and signalling. Nothing here names a backend.
//!
//! - [`waiter`]: waiting, as a pure state machine;
//! - [`acquire`]: its driver, which takes the lock.

pub mod acquire;
pub mod waiter;

pub use acquire::{Interrupts, acquire};
pub use waiter::Acquired;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
