//! One run's session with its lock, on the lease clock's own pattern: pure cores that are told
//! what happened at which clock reading and answer with the next step, and small drivers that
//! do the sending, sleeping and signalling. Nothing here names a backend.
//!
//! - [`run`]: the run, from taking the lock to its exit;
//! - [`waiter`]: waiting, as a pure state machine, and [`acquire`], its driver;
//! - [`job`]: the command under the lock, and its one finish (disarm, release, dismiss);
//! - [`stop`]: the one record of why the command is being stopped;
//! - [`sweep`]: what the command leaves behind, and the signals passed on to it;
//! - [`supervised`]: what the supervisor does to the job and hears from it, as traits, so
//!   that paused-time tests run it against a fake job;
//! - [`ending`]: how the run ends, as a pure function of the stop, the status and the lock.

pub mod acquire;
pub mod config;
#[cfg(feature = "cli")]
pub mod ending;
#[cfg(feature = "cli")]
pub mod job;
mod progress;
#[cfg(feature = "cli")]
mod record;
#[cfg(feature = "cli")]
pub mod run;
#[cfg(feature = "cli")]
pub mod stop;
#[cfg(feature = "cli")]
pub mod supervised;
#[cfg(feature = "cli")]
pub mod sweep;
pub mod waiter;

pub use acquire::{Interrupts, acquire};
#[cfg(feature = "cli")]
pub use run::run;

use crate::backend::Backend;
use crate::lease::{Renew, Timings};

/// Renews through the backend with the run's timings, the ones the lease clock counts with.
pub struct Renewer<'a>(pub &'a dyn Backend, pub Timings);

impl Renew for Renewer<'_> {
    async fn renew(&self, timeout: std::time::Duration) -> Result<bool, String> {
        self.0
            .renew(&self.1, timeout)
            .await
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
pub(crate) mod fake;
#[cfg(all(test, feature = "cli"))]
mod fake_job;
#[cfg(all(test, feature = "cli"))]
mod supervisor_tests;
#[cfg(test)]
mod tests;
