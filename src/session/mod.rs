//! One run's session with its lock, on the lease clock's own pattern: pure cores that are told
//! what happened at which clock reading and answer with the next step, and small drivers that
//! do the sending, sleeping and signalling. Nothing here names a backend.
//!
//! - [`run`]: the run, from taking the lock to its exit;
//! - [`waiter`]: waiting, as a pure state machine, and [`acquire`], its driver;
//! - [`job`]: the command under the lock, and its one finish (disarm, release, dismiss);
//! - [`stop`]: the one record of why the command is being stopped;
//! - [`sweep`]: what the command leaves behind, and the signals passed on to it;
//! - [`ending`]: how the run ends, as a pure function of the stop, the status and the lock.

pub mod acquire;
pub mod ending;
pub mod job;
pub mod run;
pub mod stop;
pub mod sweep;
pub mod waiter;

pub use acquire::{Interrupts, acquire};
pub use run::run;
pub use waiter::Acquired;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod tests;
