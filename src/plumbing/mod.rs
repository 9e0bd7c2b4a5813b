//! What every part stands on: the clocks deadlines are kept on, exit statuses, logging on
//! stderr, and the signals `locked-run` itself receives.

pub mod clock;
pub mod exit;
pub mod log;
pub mod signals;
