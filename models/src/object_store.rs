//! A candidate protocol for object stores (no backend): a lease on create-if-absent and
//! read-after-write alone. Each grant is a new object `NAME/g<n>` (created only if absent:
//! one winner per n); a renewal is a new object `NAME/g<n>/r<k>`. Each write counts only once
//! its writer has read the other side's writes after it: the holder's renewal counts (moves V)
//! only if, after writing it, no `g<n+1>` exists (else the lease is lost: kill signal at
//! once); a taker that watched the last renewal it saw for a whole lease (on its own clock)
//! creates `g<n+1>`, and runs only if, after that, it lists no renewal of `g<n>` newer than
//! the one it watched (else it withdraws). Time is abstract as in the other models: a taker's
//! wait of a lease after it saw renewal k means the holder's command has stopped by then (its
//! lease clock, model 6) unless a renewal after k counted.

use stateright::{Model, Property};

use crate::check::{Report, limit, verify};

const RENEWALS: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    Running,
    /// Renewal k written, not yet checked.
    Renewing(u8),
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Taker {
    Watching,
    /// Saw renewal k as the last.
    Saw(u8),
    /// Created g2 after watching renewal k for a lease.
    Created(u8),
    Running,
    Withdrew,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The renewals of g1 in the store (0: none yet), and whether g2 exists.
    pub renewals: u8,
    pub g2: bool,
    pub holder: Holder,
    /// The last renewal that counted for the holder.
    pub counted: u8,
    pub taker: Taker,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    WriteRenewal,
    CheckRenewal,
    /// The holder's lease clock stops its command (no renewal counted in time).
    HolderStops,
    TakerReads,
    /// A lease after it saw renewal k, the taker creates g2.
    TakerCreates,
    TakerChecks,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    pub taker_no_check: bool,
    /// The store's list may miss the latest write (eventual consistency).
    pub stale_list: bool,
}

pub struct ObjectStoreModel {
    pub rules: Rules,
}

impl Model for ObjectStoreModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            renewals: 0,
            g2: false,
            holder: Holder::Running,
            counted: 0,
            taker: Taker::Watching,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        match s.holder {
            Holder::Running if s.renewals < RENEWALS => out.push(Action::WriteRenewal),
            Holder::Renewing(_) => out.push(Action::CheckRenewal),
            _ => {}
        }
        if s.holder != Holder::Stopped {
            out.push(Action::HolderStops);
        }
        match s.taker {
            Taker::Watching => out.push(Action::TakerReads),
            Taker::Saw(_) => out.push(Action::TakerCreates),
            Taker::Created(_) => out.push(Action::TakerChecks),
            _ => {}
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::WriteRenewal => {
                s.renewals += 1;
                s.holder = Holder::Renewing(s.renewals);
            }
            Action::CheckRenewal => {
                let Holder::Renewing(k) = s.holder else {
                    return None;
                };
                // (Whether this read is needed for exclusion: the model says not, the taker's
                // own read suffices; it stops a taken-over holder at once, not at V - D.)
                if s.g2 {
                    // Taken over: lost now (kill signal at once; modelled as stopped).
                    s.holder = Holder::Stopped;
                } else {
                    s.counted = k;
                    s.holder = Holder::Running;
                }
            }
            Action::HolderStops => s.holder = Holder::Stopped,
            Action::TakerReads => {
                // A stale list may show one renewal less.
                let seen = match self.rules.stale_list {
                    true => s.renewals.saturating_sub(1),
                    false => s.renewals,
                };
                s.taker = Taker::Saw(seen);
            }
            Action::TakerCreates => {
                let Taker::Saw(k) = s.taker else {
                    return None;
                };
                // A lease has passed since the taker saw renewal k: the holder's command
                // stopped by then, unless a later renewal counted.
                if s.counted <= k {
                    s.holder = Holder::Stopped;
                }
                if s.g2 {
                    return None;
                }
                s.g2 = true;
                s.taker = Taker::Created(k);
            }
            Action::TakerChecks => {
                let Taker::Created(k) = s.taker else {
                    return None;
                };
                let listed = match self.rules.stale_list {
                    true => s.renewals.saturating_sub(1),
                    false => s.renewals,
                };
                s.taker = match listed > k && !self.rules.taker_no_check {
                    true => Taker::Withdrew,
                    false => Taker::Running,
                };
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one command at a time", |_, s: &State| {
                !(s.taker == Taker::Running
                    && matches!(s.holder, Holder::Running | Holder::Renewing(_)))
            }),
            Property::sometimes("a takeover runs", |_, s: &State| s.taker == Taker::Running),
            Property::sometimes("a renewal wins a race", |_, s: &State| {
                s.taker == Taker::Withdrew && s.holder == Holder::Running
            }),
        ]
    }
}

#[derive(Clone, Copy)]
pub enum Mutation {
    TakerNoCheck,
}

pub fn check() -> Report {
    let mut report = verify(
        "object store (candidate)",
        format!("1 holder ({RENEWALS} renewals), 1 taker; creates and lists linearizable"),
        |m| {
            let mut rules = Rules::default();
            match m {
                None => {}
                Some(Mutation::TakerNoCheck) => rules.taker_no_check = true,
            }
            ObjectStoreModel { rules }
        },
        &[(
            Mutation::TakerNoCheck,
            "a takeover run without listing the renewals after it",
        )],
    );
    limit(
        &mut report,
        "a list that may miss the latest write",
        ObjectStoreModel {
            rules: Rules {
                stale_list: true,
                ..Rules::default()
            },
        },
    );
    report
}
