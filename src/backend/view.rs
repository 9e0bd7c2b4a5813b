//! The operator's view of a lock: what `status` shows, what `release --force` does, and the
//! checks `doctor` runs, each backend in its own terms.

use super::{BackendError, Busy, History, Holder, Tenure};

/// What `status` shows of a lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The last fence token issued (the current holder's while held), if any.
    pub fence: Option<u64>,
    /// `None` when free.
    pub held: Option<Busy>,
    /// The lock's value (the owner's token) while held; compared across Redlock's servers.
    pub value: Option<String>,
    /// How many wait for it, when that can be told.
    pub waiters: Option<u64>,
    /// A backend over several servers (Redlock): what each says; `None` for one.
    pub servers: Option<Servers>,
    /// Every holder (one, or up to `limit` with `--holders`), the soonest to end first.
    pub holders: Vec<Slot>,
    /// The N of the current holders (`--holders N`; 1 for one holder), when held.
    pub limit: Option<u32>,
    /// Held in shared mode (`--shared`): `holders` lists every shared holder.
    pub shared: bool,
    /// A store that keeps no last fence once its holder is gone (etcd: a fence is a key's create
    /// revision, and the key goes with its holder): its revision now, below every next fence.
    pub revision: Option<u64>,
}

/// "last fence N", or "no fence issued yet" for a lock never taken (or taken only by a program
/// that keeps no counter): "last fence none issued yet" read as a riddle. As `status`,
/// `release` and `doctor` say it.
pub fn last_fence(fence: Option<u64>) -> String {
    fence.map_or_else(
        || "no fence issued yet".to_owned(),
        |f| format!("last fence {f}"),
    )
}

/// The backend's own part of a report over several servers (Redlock): the quorum, and each
/// server's report, or why it did not answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Servers {
    pub quorum: usize,
    pub each: Vec<(String, Result<Report, BackendError>)>,
}

/// One holder of a lock, and its token (an operator frees one holder of several by it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub token: Option<String>,
    pub busy: Busy,
}

/// What `release --force` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Freed {
    /// Released: whom it was taken from (none: it was free), and the last fence issued.
    Released {
        holders: Vec<Holder>,
        fence: Option<u64>,
    },
    /// Not released, and why: a host-local lock cannot be taken from a live process.
    Kept(String),
}

/// The operator's view of a lock: what `status` shows and `release --force` does, and the checks
/// `doctor` runs. Changes nothing but for `force_release`.
#[async_trait::async_trait(?Send)]
pub trait View {
    /// How holders keep the lock (a lease, or a lock the kernel holds), for the line that says
    /// what freeing it would do.
    fn tenure(&self) -> Tenure;

    /// The lock's state, for `status` (and `release`, which shows the holder it refuses to
    /// take the lock from without `--force`).
    async fn inspect(&self) -> Result<Report, BackendError>;

    /// `release --force`: frees the lock whoever holds it (of several holders, the one whose
    /// token is `token`, or every one), never its fence counter, and wakes the waiters.
    async fn force_release(&self, token: Option<&str>) -> Result<Freed, BackendError>;

    /// The NAME's last `limit` runs that took the lock, newest first (none: never taken, or
    /// its history expired), read through the one [`Reader`](super::Reader), and how many
    /// records it skipped.
    async fn history(&self, limit: usize) -> Result<History, BackendError>;

    /// `doctor`'s checks of what holds the lock: each server, hop or directory, and what
    /// the lease and the fence need of it.
    async fn checks(&self) -> Vec<Check>;
}

/// How a `doctor` check came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    pub fn word(self) -> &'static str {
        match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        }
    }
}

/// One line of `doctor`: what was checked, where, and how it came out, and why.
#[derive(Clone, Debug)]
pub struct Check {
    /// The server, hop or directory it is about.
    pub server: String,
    pub check: &'static str,
    pub level: Level,
    pub detail: String,
}
