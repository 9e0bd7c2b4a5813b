//! What a backend declares of itself, for the registry to read: the URL schemes that name it
//! and the forms messages show them in, the modes it can hold, its NAME rule, and how it is
//! opened (both halves: the run's lock and the operator's view). Each backend's declaration
//! lives in its own folder; `registry.rs` lists them, and the door, the line that refuses an
//! unknown scheme, `doctor`, the command line's help and the library read them there.

use std::time::Duration;

use super::{Backend, LockSpec, View};
use crate::endpoints::{Endpoint, Endpoints, Scheme};
use crate::name::LockName;
use crate::plumbing::exit::Failure;

/// A line a declaration says whole, when the door refuses what it was given: written through
/// this marker so that the FAQ's test finds it among the lines `locked-run` prints.
macro_rules! says {
    ($line:literal) => {
        $line
    };
}
pub(crate) use says;

/// A backend, as it declares itself.
pub struct Declaration {
    /// How a list of the backends that can do something calls it: `file://`, `one Redis
    /// server (plain, Sentinel, Cluster)`.
    pub called: &'static str,
    /// The schemes of its URLs, in the order the line that refuses an unknown scheme lists them.
    pub schemes: &'static [Scheme],
    /// Its part of `--url`'s help: the forms of its URLs, and what each names.
    pub help: &'static str,
    /// What `doctor` checks of it, for `doctor`'s help.
    pub doctor: &'static str,
    /// What it holds, opened from one URL.
    pub modes: Modes,
    /// What several URLs of it are.
    pub several: Several,
    /// The line when `--tls-*` files are given and none of its URLs speaks TLS (ignoring them
    /// would leave a connection believed encrypted in plain text); `None`: its URLs say
    /// themselves whether they use the files (`sslmode`).
    pub no_tls: Option<&'static str>,
    /// The NAMEs it cannot take, beyond what every NAME must be: why, in one line.
    pub name_rule: fn(&LockName) -> Result<(), String>,
    /// Opens what `store` names for `spec` (nothing is connected yet): the run's lock and the
    /// operator's view in one.
    pub open: Open,
}

/// How a backend is opened: what a store names, for a lock specification, as both halves.
pub type Open = fn(&Store, &LockSpec) -> Result<Box<dyn Opened>, Failure>;

/// Names the backend, as lists of them call it.
impl std::fmt::Debug for Declaration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.called)
    }
}

/// A NAME rule that takes every NAME.
pub fn any_name(_: &LockName) -> Result<(), String> {
    Ok(())
}

/// What a backend can hold, each mode a run may ask for.
#[derive(Clone, Copy, Debug)]
pub struct Modes {
    /// `--holders N` with N > 1.
    pub holders: Can,
    /// `--shared`.
    pub shared: Can,
    /// `--wait-replicas N` with N > 0.
    pub wait_replicas: Can,
    /// How its waiters are served.
    pub queue: Queue,
}

/// Whether a backend can hold a mode; where it cannot, the run is refused with one line that
/// names the backends that can and says why this one cannot (status 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Can {
    Yes,
    /// Why not, to end the line.
    No(&'static str),
}

/// How a backend serves its waiters (DESIGN, "Fair waiting").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queue {
    /// In arrival order; `--no-fair` waiters race, but never past a fair one.
    Fair,
    /// In arrival order whatever `--no-fair` says (said with `-v`).
    Always,
    /// No queue: every waiter races on each release.
    Racing,
}

/// What several URLs of a backend are.
#[derive(Clone, Copy, Debug)]
pub enum Several {
    /// One URL names a whole store: the line said when others are given with it.
    Refused(&'static str),
    /// Independent stores held together (Redlock over several Redis servers), how lists call
    /// them, and what they can hold.
    Together { called: &'static str, modes: Modes },
}

/// A backend as the door opens it: both halves, the run's lock and the operator's view.
pub trait Opened: Backend + View {}

impl<T: Backend + View> Opened for T {}

/// What opening needs besides the endpoints and the lock: the program's name (shown to
/// `status`), Redlock's per-server timeout, and `--wait-replicas`.
pub struct Opening<'a> {
    pub command: &'a str,
    pub node_timeout: Duration,
    /// `--wait-replicas N` (N > 0) and its timeout.
    pub wait_replicas: Option<(u32, Duration)>,
    /// `doctor`: a set of Redis servers a run would refuse as Redlock's (fewer than 3, one
    /// given twice) is opened all the same, for the checks to say what is wrong with it.
    pub lenient: bool,
}

impl Opening<'_> {
    /// For `status`, `release` and `doctor`.
    pub fn to_look<'a>(endpoints: &Endpoints, command: &'a str) -> Opening<'a> {
        Opening {
            command,
            node_timeout: endpoints.connect_timeout,
            wait_replicas: None,
            lenient: command == "doctor",
        }
    }
}

/// What the endpoints name, classified once at the door: the backend, its URLs (each with the
/// scheme it is written with), every other connection setting, and what opening needs besides.
pub struct Store<'a> {
    pub backend: &'static Declaration,
    pub urls: Vec<Endpoint>,
    pub endpoints: &'a Endpoints,
    pub how: &'a Opening<'a>,
}

impl Store<'_> {
    /// The one URL of a backend that takes one.
    pub fn url(&self) -> &Endpoint {
        &self.urls[0]
    }

    /// What it holds: several URLs of a backend that holds them together hold what they can.
    pub fn modes(&self) -> Modes {
        match (self.urls.len(), self.backend.several) {
            (2.., Several::Together { modes, .. }) => modes,
            _ => self.backend.modes,
        }
    }
}
