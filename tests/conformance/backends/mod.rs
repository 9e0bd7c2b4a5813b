//! The backends the conformance suite runs against, each a fixture (a file of its own here): what
//! it declares it supports, a store of its own started for a test (its servers killed when the
//! store is dropped) and the `-u` arguments that name it, where nothing of its kind answers, and
//! a hostile store of its kind. A new backend plugs in with its file here, one `mod` line below,
//! and one line in `conformance/mod.rs`.

use crate::support::hostile::Hostile;

mod etcd;
#[cfg(feature = "fake-backend")]
mod fake;
mod file;
mod postgres;
mod redis;

pub use etcd::OneEtcd;
#[cfg(feature = "fake-backend")]
pub use fake::Fake;
pub use file::File;
pub use postgres::OnePostgres;
pub use redis::{OneRedis, RedisCluster, Redlock, Sentinel};

/// What a backend declares it can do. Where it cannot, it must refuse the mode when it is
/// opened (one line, status 2), and the suite checks that refusal instead.
#[derive(Clone, Copy, Debug)]
pub struct Supports {
    /// `--holders N` with N > 1.
    pub holders: bool,
    /// `--shared`.
    pub shared: bool,
    /// How waiters are served.
    pub queue: Queue,
    /// How a holder keeps the lock.
    pub tenure: Tenure,
    /// The keys its `status --json` adds to every backend's.
    pub status_keys: &'static [&'static str],
    /// Its history is in the store's own order, never in one a record's writer chose (a
    /// record that says it is the newest is not, unless the store has it last).
    pub history_order: bool,
}

impl Supports {
    /// Every mode, waiters served strictly in arrival order, holders on a lease: what a
    /// backend with a server and a queue on it gives.
    pub const EVERYTHING: Supports = Supports {
        holders: true,
        shared: true,
        queue: Queue::Strict,
        tenure: Tenure::Lease,
        status_keys: &[],
        history_order: true,
    };
}

/// How waiters are served (DESIGN, "Fair waiting").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// In arrival order, and a newcomer (a `-n` run) never passes a waiter.
    Strict,
    /// In arrival order, but a newcomer that finds the lock free in the instant between a
    /// release and the next waiter's wake-up takes it (`file://`: an uncontended run stays
    /// one `flock`, without a look at the queue; the guide says so).
    Waiters,
    /// No queue: waiters race, as `--no-fair` ones do (Redlock: independent servers would
    /// order a queue differently; the guide says so).
    Racing,
}

/// How a holder keeps the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tenure {
    /// A lease that the store ends on its own once it is not renewed: a holder that dies is
    /// followed after its lease, and `release --force` takes the lock from a live holder (its
    /// command is stopped, 76).
    Lease,
    /// A lock the kernel frees when the holder's process ends (`file://`): a holder that dies
    /// is followed at once, and nobody can take the lock from a live holder.
    Kernel,
}

/// A backend under test.
pub trait Backend {
    /// What it declares it supports.
    fn supports(&self) -> Supports;

    /// A store of its own, answering, with nothing held yet.
    fn start(&self) -> Store;

    /// `-u` arguments naming a store of this kind where nothing answers (a closed port): a
    /// run must end 69 at once.
    fn unreachable(&self) -> Vec<String>;

    /// A hostile store of this kind: fake servers whose every reply is endless or announced
    /// as huge (a backend without a server: what stands in the place of its store, as a FIFO
    /// for `file://`'s lock file). `None` only for a backend with neither (an in-process fake).
    fn hostile(&self) -> Option<HostileStore>;
}

/// A store that answers as no honest one does, and the words a run's one line says of it.
pub struct HostileStore {
    pub urls: Vec<String>,
    pub says: &'static str,
    /// The fake servers (or files), kept until the store is dropped.
    _keep: Box<dyn std::any::Any>,
}

/// What a test may do to a started store behind `locked-run`'s back.
pub trait Servers {
    /// Adds `record`, as it is, to the history of NAME `job`, where the backend keeps it, as
    /// its newest run (what a user with access to the store could write).
    fn add_history_record(&self, record: &str);

    /// Adds `record` where a writer would put it to look newer than every run by what it
    /// chooses itself (a row's date, a key's name), as PostgreSQL's and etcd's fixtures do;
    /// where the store alone orders its history (a list, a file's lines), as
    /// [`Servers::add_history_record`].
    fn add_history_record_ahead(&self, record: &str) {
        self.add_history_record(record);
    }

    /// Writes [`FAR_SINCE_MS`] (past year 9999) as the `since` of the run that holds `job`
    /// alone, where the backend keeps its holder's metadata (what any user of the store could
    /// write).
    fn plant_far_since(&self);
}

/// A holder's `since`, in ms since the epoch, that no date can show (year 3170843).
pub const FAR_SINCE_MS: u64 = 99_999_999_999_999_999;

/// A started store: the `-u` arguments that name it (what `status`, `release` and `history`
/// take), the options a run takes with them, and its servers, running until it is dropped.
pub struct Store {
    pub urls: Vec<String>,
    pub run_args: Vec<String>,
    pub servers: Box<dyn Servers>,
}

impl Store {
    /// The store that `url` names, of `servers`, whose runs need no options of their own.
    pub fn at(url: String, servers: impl Servers + 'static) -> Store {
        Store {
            urls: url_args(url),
            run_args: Vec::new(),
            servers: Box::new(servers),
        }
    }
}

/// `-u URL`.
pub(super) fn url_args(url: String) -> Vec<String> {
    vec!["-u".into(), url]
}

/// One hostile fake serving every connection with `script`, named by `url` of its port.
pub(super) fn one_hostile(
    script: fn(std::net::TcpStream),
    url: impl Fn(u16) -> String,
    says: &'static str,
) -> Option<HostileStore> {
    let server = Hostile::start(script);
    Some(HostileStore {
        urls: url_args(url(server.port())),
        says,
        _keep: Box::new(server),
    })
}

/// What a reply announced as huge is said to be.
pub(super) const TOO_LARGE: &str = "sent a reply too large";
