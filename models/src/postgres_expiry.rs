//! Model 4's clock, PostgreSQL's expiry against the lease clock (`src/postgres/sql.rs`,
//! `grant.rs`, `conn.rs`): a holder's grant transaction writes its row's `expires_at` as
//! `clock_timestamp() + T` (the insert's own instant) or, the known-bad variant, `now() + T`
//! (the transaction's start); the lease clock counts V = s + T - D from the send instant s of
//! the request that carried the grant, and stops the command (SIGKILL) at V - D. The code sends
//! the whole transaction, BEGIN to COMMIT, as one string in one round trip: the transaction
//! starts when the server reads it, after s. The variant that splits it sends BEGIN (and the
//! fence row's lock) on a round trip of its own and the grant's statements when that returns,
//! the lease counted from the second send. A contender's grant, under the fence row's lock
//! (held across ticks: the holder's transaction may wait on it), deletes the rows expired by
//! `clock_timestamp()` and runs its command at once. Every message may take any number of
//! ticks; the database's clock is the wrappers' (model 6 covers drift).

use stateright::{Model, Property};

use crate::check::{Report, holds, verify};
use crate::lease::{At, D, PAST, T, tick};

/// How the grant's transaction travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trips {
    /// BEGIN to COMMIT in one string (the code).
    OneString,
    /// BEGIN and the fence row's lock first, the grant's statements on the next round trip.
    BeginApart,
}

/// What `expires_at` is written from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    ClockTimestamp,
    Now,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// BEGIN (and the fence row's lock) on its way; at the server, begun, waiting for the
    /// lock; locked, its answer on its way.
    BeginSent,
    BeginLocking,
    BeginAnswered,
    /// The grant's statements on their way; V counted from their send.
    GrantSent,
    /// At the server: the transaction waits for the fence row's lock.
    Locking,
    /// Committed: the reply on its way.
    Replied,
    /// Its command runs until its kill point (`kill`, ticks from now).
    Running {
        kill: At,
    },
    Stopped,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub h: Holder,
    /// V - D for the grant's send, ticking (set at the send).
    pub kill_point: At,
    /// Ticks since the holder's transaction began (`now()`), up to T + 1.
    pub tx_age: u8,
    /// The holder's row: its `expires_at`, ticks from now.
    pub row: Option<At>,
    /// The contender: holds the fence row's lock; runs its command.
    pub c_locked: bool,
    pub c_runs: bool,
    /// The fence row's lock is the holder's.
    pub h_locked: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// BEGIN lands: the transaction starts (`now()` is this instant) ...
    BeginLands,
    /// ... and takes the fence row's lock once it is free.
    BeginLocks,
    /// Its answer lands: the grant's statements are sent (the lease counts from here).
    SendGrant,
    /// The grant's statements land (one string: the transaction starts here).
    GrantLands,
    /// The holder's transaction takes the lock, inserts its row, commits.
    Insert,
    ReplyLands,
    HolderStops,
    /// The contender's grant: the lock, then the expired rows deleted and the decision.
    ContenderLocks,
    ContenderDecides,
}

pub struct ExpiryModel {
    pub trips: Trips,
    pub expiry: Expiry,
}

impl Model for ExpiryModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let h = match self.trips {
            Trips::OneString => Holder::GrantSent,
            Trips::BeginApart => Holder::BeginSent,
        };
        vec![State {
            h,
            kill_point: (T - 2 * D) as At,
            tx_age: 0,
            row: None,
            c_locked: false,
            c_runs: false,
            h_locked: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        // The holder's command is SIGKILLed at its kill point (model 6: never later).
        if !matches!(s.h, Holder::Running { kill } if kill <= 0) {
            out.push(Action::Tick);
        }
        match s.h {
            Holder::BeginSent => out.push(Action::BeginLands),
            Holder::BeginLocking if !s.c_locked => out.push(Action::BeginLocks),
            Holder::BeginAnswered => out.push(Action::SendGrant),
            Holder::GrantSent => out.push(Action::GrantLands),
            Holder::Locking if !s.c_locked => out.push(Action::Insert),
            Holder::Replied => out.push(Action::ReplyLands),
            Holder::Running { kill } if kill <= 0 => out.push(Action::HolderStops),
            _ => {}
        }
        if !s.c_runs && !s.c_locked && !s.h_locked {
            out.push(Action::ContenderLocks);
        }
        if s.c_locked {
            out.push(Action::ContenderDecides);
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Tick => {
                s.kill_point = tick(s.kill_point);
                s.tx_age = (s.tx_age + 1).min(T + 1);
                s.row = s.row.map(tick);
                if let Holder::Running { kill } = &mut s.h {
                    *kill = tick(*kill);
                }
            }
            Action::BeginLands => {
                s.tx_age = 0;
                s.h = Holder::BeginLocking;
            }
            Action::BeginLocks => {
                s.h_locked = true;
                s.h = Holder::BeginAnswered;
            }
            Action::SendGrant => {
                s.kill_point = (T - 2 * D) as At;
                s.h = Holder::GrantSent;
            }
            Action::GrantLands => {
                if self.trips == Trips::OneString {
                    s.tx_age = 0;
                }
                s.h = Holder::Locking;
            }
            Action::Insert => {
                // Under the fence row's lock (taken now, or on the earlier round trip), then
                // let go at the commit. A contender's row found live: busy.
                s.h_locked = false;
                if s.c_runs {
                    s.h = Holder::Stopped;
                    return Some(s);
                }
                let expires = match self.expiry {
                    Expiry::ClockTimestamp => T as At,
                    Expiry::Now => (T as At - s.tx_age as At).max(PAST),
                };
                s.row = Some(expires);
                s.h = Holder::Replied;
            }
            Action::ReplyLands => {
                s.h = match s.kill_point > 0 {
                    true => Holder::Running { kill: s.kill_point },
                    false => Holder::Stopped,
                };
            }
            Action::HolderStops => s.h = Holder::Stopped,
            Action::ContenderLocks => s.c_locked = true,
            Action::ContenderDecides => {
                s.c_locked = false;
                // DELETE ... WHERE expires_at <= clock_timestamp(), then whether anyone holds.
                if s.row.is_some_and(|e| e <= 0) {
                    s.row = None;
                }
                if s.row.is_none() {
                    s.c_runs = true;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one command at a time", |_, s: &State| {
                !(s.c_runs && matches!(s.h, Holder::Running { .. }))
            }),
            Property::always("a running command's row is live", |_, s: &State| {
                !matches!(s.h, Holder::Running { .. }) || s.row.is_some_and(|e| e > 0)
            }),
            Property::sometimes("the contender runs after the holder", |_, s: &State| {
                s.c_runs && s.h == Holder::Stopped && s.row.is_none()
            }),
        ]
    }
}

pub fn check() -> Report {
    let model = |trips, expiry| ExpiryModel { trips, expiry };
    let mut report = verify(
        "postgres: expiry",
        format!(
            "1 holder + 1 contender, T={T} D={D} ticks, every message and the fence row's lock held any number of ticks"
        ),
        |m: Option<()>| match m {
            None => model(Trips::OneString, Expiry::ClockTimestamp),
            Some(()) => model(Trips::BeginApart, Expiry::Now),
        },
        &[((), "now() in a transaction begun on an earlier round trip")],
    );
    holds(
        &mut report,
        "now() in one string (the transaction starts after the send)",
        model(Trips::OneString, Expiry::Now),
    );
    holds(
        &mut report,
        "clock_timestamp() with BEGIN on an earlier round trip",
        model(Trips::BeginApart, Expiry::ClockTimestamp),
    );
    report
}
