//! The operators' subcommands, each against the operator's view of a lock (`dyn View`),
//! whichever backend holds it: `status`, `release`, `history` and `doctor`.

pub mod doctor;
pub mod history;
pub mod release;
pub mod status;
