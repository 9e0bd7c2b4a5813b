//! Model 4, PostgreSQL (`src/postgres/sql.rs`, `grant.rs`): each grant is one transaction at
//! READ COMMITTED in steps: lock the NAME's fence row (`SELECT ... FOR UPDATE`), delete the
//! expired rows (a delete that meets a row a renewal is updating waits for it and re-checks
//! it), decide on the rows left in a snapshot taken after the lock (buried tokens first, then
//! whether anyone holds), raise the fence and insert the row, commit. A renewal is one UPDATE
//! that extends a row only while it has not expired. A give-back deletes by token and buries
//! it. A row expires (on the database's clock) only once its run stopped renewing and its
//! command was stopped (model 6); a renewal may still be on its way then. Every statement of a
//! transaction may be delayed; attempts may land after their run gave up.

use stateright::{Model, Property};

use crate::check::{Report, verify};

const RUNS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    pub run: u8,
    pub fence: u8,
    pub expired: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tx {
    Idle,
    /// Holding the fence row's lock (or, in the mutation, not).
    Locked,
    /// Expired rows deleted; deciding in a fresh snapshot.
    Deleted,
    /// Decided to grant on a snapshot in which nobody held (`holders_seen` = 0).
    Granting,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Waiting,
    Running {
        fence: u8,
    },
    /// Stopped renewing (lease lost, or ended): its row may expire.
    Stopped,
    GaveUp,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub fence: u8,
    pub rows: Vec<Row>,
    pub buried: Vec<u8>,
    /// Who holds the fence row's lock.
    pub fence_lock: Option<u8>,
    pub tx: Vec<Tx>,
    pub runs: Vec<Phase>,
    /// A renewal of this run's row that started while the row had not expired, not yet done.
    pub renewing: Vec<bool>,
    /// The grant's transaction sent, not yet begun at the server (it may land after its run
    /// gave up).
    pub sent: Vec<bool>,
    pub max_fence: u8,
    pub fence_back: bool,
    pub granted_given_back: bool,
    pub faults: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Send(usize),
    Lock(usize),
    DeleteExpired(usize),
    Decide(usize),
    InsertAndCommit(usize),
    /// The renewal's UPDATE starts (it sees the row unexpired) ...
    RenewStart(usize),
    /// ... and writes.
    RenewWrite(usize),
    Stop(usize),
    Expire(usize),
    /// The run gives up waiting: its give-back runs now; its grant transaction may still.
    GiveUp(usize),
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    pub no_fence_lock: bool,
    pub no_bury: bool,
}

pub struct PostgresModel {
    pub rules: Rules,
}

impl Model for PostgresModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            fence: 0,
            rows: Vec::new(),
            buried: Vec::new(),
            fence_lock: None,
            tx: vec![Tx::Idle; RUNS],
            runs: vec![Phase::Waiting; RUNS],
            renewing: vec![false; RUNS],
            sent: vec![false; RUNS],
            max_fence: 0,
            fence_back: false,
            granted_given_back: false,
            faults: 1,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for i in 0..RUNS {
            let waiting = matches!(s.runs[i], Phase::Waiting | Phase::GaveUp);
            match s.tx[i] {
                Tx::Idle if s.runs[i] == Phase::Waiting && !s.sent[i] => out.push(Action::Send(i)),
                Tx::Idle if s.sent[i] && (s.fence_lock.is_none() || self.rules.no_fence_lock) => {
                    out.push(Action::Lock(i))
                }
                Tx::Locked if waiting => out.push(Action::DeleteExpired(i)),
                Tx::Deleted if waiting => out.push(Action::Decide(i)),
                Tx::Granting if waiting => out.push(Action::InsertAndCommit(i)),
                _ => {}
            }
            if s.runs[i] == Phase::Waiting && s.faults > 0 {
                out.push(Action::GiveUp(i));
            }
            let row = s.rows.iter().find(|r| r.run == i as u8);
            match s.runs[i] {
                Phase::Running { .. } => {
                    out.push(Action::Stop(i));
                    if row.is_some_and(|r| !r.expired) && !s.renewing[i] {
                        out.push(Action::RenewStart(i));
                    }
                }
                Phase::Stopped if row.is_some_and(|r| !r.expired) => out.push(Action::Expire(i)),
                _ => {}
            }
            if s.renewing[i] {
                out.push(Action::RenewWrite(i));
            }
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Send(i) => s.sent[i] = true,
            Action::Lock(i) => {
                s.sent[i] = false;
                if !self.rules.no_fence_lock {
                    s.fence_lock = Some(i as u8);
                }
                s.tx[i] = Tx::Locked;
            }
            Action::DeleteExpired(i) => {
                // A row a renewal is updating is waited for: the DELETE re-checks it after;
                // modelled as the renewal going first (its write is a step of its own).
                if s.rows
                    .iter()
                    .any(|r| r.expired && s.renewing[r.run as usize])
                {
                    return None;
                }
                s.rows.retain(|r| !r.expired);
                s.tx[i] = Tx::Deleted;
            }
            Action::Decide(i) => {
                let buried = !self.rules.no_bury && s.buried.contains(&(i as u8));
                let held = !s.rows.is_empty();
                if buried || held || s.rows.iter().any(|r| r.run == i as u8) {
                    s.tx[i] = Tx::Idle;
                    s.fence_lock = s.fence_lock.filter(|&x| x != i as u8);
                } else {
                    s.tx[i] = Tx::Granting;
                }
            }
            Action::InsertAndCommit(i) => {
                s.fence += 1;
                let fence = s.fence;
                s.fence_back |= fence <= s.max_fence;
                s.max_fence = s.max_fence.max(fence);
                s.rows.push(Row {
                    run: i as u8,
                    fence,
                    expired: false,
                });
                s.tx[i] = Tx::Idle;
                s.fence_lock = s.fence_lock.filter(|&x| x != i as u8);
                match s.runs[i] {
                    Phase::Waiting => s.runs[i] = Phase::Running { fence },
                    _ => s.granted_given_back = true,
                }
            }
            Action::RenewStart(i) => s.renewing[i] = true,
            Action::RenewWrite(i) => {
                s.renewing[i] = false;
                if let Some(r) = s.rows.iter_mut().find(|r| r.run == i as u8) {
                    // The WHERE re-checked after any wait: an expired row stays expired.
                    if !r.expired {
                        r.expired = false;
                    }
                }
            }
            Action::Stop(i) => s.runs[i] = Phase::Stopped,
            Action::Expire(i) => {
                if let Some(r) = s.rows.iter_mut().find(|r| r.run == i as u8) {
                    r.expired = true;
                }
            }
            Action::GiveUp(i) => {
                // In its own transaction, serialised on the fence row: it waits for the
                // lock; modelled at a moment nobody holds it.
                // (Its own attempt's transaction, on another connection, holds it too.)
                if s.fence_lock.is_some() {
                    return None;
                }
                s.faults -= 1;
                s.runs[i] = Phase::GaveUp;
                s.rows.retain(|r| r.run != i as u8);
                if !self.rules.no_bury {
                    s.buried.push(i as u8);
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one command at a time", |_, s: &State| {
                s.runs
                    .iter()
                    .filter(|p| matches!(p, Phase::Running { .. }))
                    .count()
                    <= 1
            }),
            Property::always("a running command's row is live", |_, s: &State| {
                s.runs.iter().enumerate().all(|(i, p)| {
                    !matches!(p, Phase::Running { .. })
                        || s.rows.iter().any(|r| r.run == i as u8 && !r.expired)
                })
            }),
            Property::always("fences strictly increase", |_, s: &State| !s.fence_back),
            Property::always("a token given back never holds", |_, s: &State| {
                !s.granted_given_back
            }),
            Property::sometimes("both ran", |_, s: &State| {
                s.runs.iter().all(|p| *p == Phase::Stopped)
            }),
        ]
    }
}

#[derive(Clone, Copy)]
pub enum Mutation {
    NoFenceLock,
    NoBury,
}

pub fn check() -> Report {
    verify(
        "postgres",
        format!(
            "{RUNS} runs, every statement of a grant a step of its own, renewals racing expiry, 1 give-up"
        ),
        |m| {
            let mut rules = Rules::default();
            match m {
                None => {}
                Some(Mutation::NoFenceLock) => rules.no_fence_lock = true,
                Some(Mutation::NoBury) => rules.no_bury = true,
            }
            PostgresModel { rules }
        },
        &[
            (
                Mutation::NoFenceLock,
                "a grant without the fence row's lock",
            ),
            (Mutation::NoBury, "a give-back that does not bury its token"),
        ],
    )
}
