//! Model 7, a waiter's place and its keep-alive on the store's clock, as every backend that
//! keeps a queue keeps it: Redis's `enqueue` (the place's end in `queue-alive:{NAME}`, now +
//! KEEP_ALIVE on the server's clock, at each attempt's landing) and `prune` (every script that
//! reads the queue first drops the places whose end has come), PostgreSQL's `alive_until`,
//! etcd's queue lease kept alive. A waiter W asks every KEEP_ALIVE/3 and may be SIGKILLed at any
//! moment; its attempts may travel any number of ticks (two at most on their way), and one
//! sent before its death may land after it. A waiter B behind W asks as often (each of its
//! attempts, read at once, refreshes the queue's key); the holder releases and takes the lock
//! again at any time (whatever the holders do). The bound: a gone waiter's place no longer
//! counts KEEP_ALIVE after the landing of its last attempt, not after its death (the limit).

use stateright::{Model, Property};

use crate::check::{Report, limit, verify};
use crate::lease::{At, PAST, tick};

/// A place's keep-alive (2 s in the code), and how often a waiter asks (KEEP_ALIVE/3).
const KEEP_ALIVE: At = 6;
const ASK_EVERY: At = KEEP_ALIVE / 3;
/// The lease a waiter's place would be on without a keep-alive of its own (T).
const LEASE: At = 9;
/// W's attempts on their way at once.
const IN_FLIGHT: u8 = 2;
/// Ticks counted since an event, up to this (enough to tell past KEEP_ALIVE and LEASE).
const FAR: u8 = LEASE as u8 + 1;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub w_alive: bool,
    /// Ticks to W's next ask, and B's (on their clocks: due at 0, a tick late at -1).
    pub w_next: At,
    pub b_next: At,
    /// W's attempts on their way to the store.
    pub in_flight: u8,
    /// W's place in the queue: when its keep-alive ends, on the store's clock (ticks from now).
    pub place: Option<At>,
    /// The queue's key itself (its PEXPIRE): it lives as long as the last place refreshed.
    pub queue_key: At,
    pub held: bool,
    /// Ghosts: ticks since W's last attempt landed, and since its death (up to FAR).
    pub since_landing: u8,
    pub since_death: u8,
    /// Ghosts: a script counted W's place, W dead, that long after its last landing, and
    /// after its death.
    pub counted_after_landing: bool,
    pub counted_after_death: bool,
    pub lapsed: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// W's keep-alive tick: an attempt sent.
    WAsks,
    /// One of W's attempts lands: `enqueue` (after `prune`).
    WLands,
    /// B asks: its script prunes, reads the queue (is W ahead?) and refreshes B's place.
    BAsks,
    /// The holder releases (its script prunes, to wake whose turn it is), or takes it again.
    Release,
    Take,
    /// W is SIGKILLed.
    Die,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// Places lapse only with the queue's key (no `prune`): every waiter's ask keeps them all.
    pub no_prune: bool,
    /// A waiter's place lives as long as its lease (T), not a keep-alive of its own.
    pub on_lease: bool,
    /// Scripts prune only when the lock is free (while it is held, nothing reads the queue).
    pub prune_when_free: bool,
    /// The bound measured from W's death (the limit).
    pub from_death: bool,
}

pub struct KeepAliveModel {
    pub rules: Rules,
}

impl KeepAliveModel {
    /// A script that reads the queue: drops the places whose keep-alive ended (`prune`), and
    /// notes whether W's place, counted now, should have lapsed.
    fn read_queue(&self, s: &mut State) {
        let prunes = !(self.rules.no_prune || self.rules.prune_when_free && s.held);
        if prunes && s.place.is_some_and(|end| end <= 0) {
            s.place = None;
        }
        if s.queue_key <= 0 {
            s.place = None;
        }
        let counted = s.place.is_some() && !s.w_alive;
        s.counted_after_landing |= counted && s.since_landing >= KEEP_ALIVE as u8;
        s.counted_after_death |= counted && s.since_death >= KEEP_ALIVE as u8;
        s.lapsed |= !s.w_alive && s.place.is_none() && s.since_death > 0;
    }

    fn keep(&self) -> At {
        match self.rules.on_lease {
            true => LEASE,
            false => KEEP_ALIVE,
        }
    }
}

impl Model for KeepAliveModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // W has a place, just refreshed; B asks between W's asks.
        vec![State {
            w_alive: true,
            w_next: ASK_EVERY,
            b_next: 1,
            in_flight: 0,
            place: Some(self.keep()),
            queue_key: self.keep(),
            held: true,
            since_landing: 0,
            since_death: 0,
            counted_after_landing: false,
            counted_after_death: false,
            lapsed: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        // Time passes while no ask would be two ticks late.
        if (!s.w_alive || s.w_next >= 0) && s.b_next >= 0 {
            out.push(Action::Tick);
        }
        if s.w_alive && s.w_next <= 0 {
            out.push(Action::WAsks);
            out.push(Action::Die);
        } else if s.w_alive {
            out.push(Action::Die);
        }
        if s.in_flight > 0 {
            out.push(Action::WLands);
        }
        if s.b_next <= 0 {
            out.push(Action::BAsks);
        }
        out.push(match s.held {
            true => Action::Release,
            false => Action::Take,
        });
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Tick => {
                s.w_next = tick(s.w_next);
                s.b_next = tick(s.b_next);
                s.place = s.place.map(tick);
                s.queue_key = tick(s.queue_key);
                s.since_landing = (s.since_landing + 1).min(FAR);
                if !s.w_alive {
                    s.since_death = (s.since_death + 1).min(FAR);
                }
            }
            Action::WAsks => {
                s.w_next = ASK_EVERY;
                // The previous ones still out: this one waits for them (no third on its way).
                s.in_flight = (s.in_flight + 1).min(IN_FLIGHT);
            }
            Action::WLands => {
                s.in_flight -= 1;
                self.read_queue(&mut s);
                s.place = Some(self.keep());
                s.queue_key = s.queue_key.max(self.keep());
                s.since_landing = 0;
            }
            Action::BAsks => {
                s.b_next = ASK_EVERY;
                self.read_queue(&mut s);
                // B's own place refreshed: the queue's key lives as long as it.
                s.queue_key = s.queue_key.max(self.keep());
            }
            Action::Release => {
                s.held = false;
                self.read_queue(&mut s);
            }
            Action::Take => s.held = true,
            Action::Die => {
                s.w_alive = false;
                s.w_next = PAST;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "a gone waiter lapses within KEEP_ALIVE of its last attempt's landing",
                |m: &KeepAliveModel, s: &State| m.rules.from_death || !s.counted_after_landing,
            ),
            Property::always(
                "a gone waiter lapses within KEEP_ALIVE of its death",
                |m: &KeepAliveModel, s: &State| !m.rules.from_death || !s.counted_after_death,
            ),
            Property::sometimes("a gone waiter's place lapsed", |_, s: &State| s.lapsed),
        ]
    }
}

#[derive(Clone, Copy)]
pub enum Mutation {
    NoPrune,
    OnLease,
    PruneWhenFree,
}

pub fn check() -> Report {
    let mut report = verify(
        "keep-alive",
        format!(
            "a waiter W ahead of B, KEEP_ALIVE={KEEP_ALIVE} ticks, each asking every {ASK_EVERY} (a tick late at most); W's attempts on their way any number of ticks ({IN_FLIGHT} at once), W SIGKILLed at any moment; the lock released and taken again at any time"
        ),
        |m| {
            let mut rules = Rules::default();
            match m {
                None => {}
                Some(Mutation::NoPrune) => rules.no_prune = true,
                Some(Mutation::OnLease) => rules.on_lease = true,
                Some(Mutation::PruneWhenFree) => rules.prune_when_free = true,
            }
            KeepAliveModel { rules }
        },
        &[
            (
                Mutation::NoPrune,
                "a place that never lapses (only with the queue's key)",
            ),
            (
                Mutation::OnLease,
                "a waiter's place on its lease (T), no keep-alive",
            ),
            (
                Mutation::PruneWhenFree,
                "places pruned only while the lock is free",
            ),
        ],
    );
    limit(
        &mut report,
        "a dead waiter's attempt landing after its death",
        KeepAliveModel {
            rules: Rules {
                from_death: true,
                ..Rules::default()
            },
        },
    );
    report
}
