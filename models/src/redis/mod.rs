//! Model 1, one Redis server: the scripts of `src/redis/scripts.rs`, `shared.rs`, `semaphore.rs`
//! and `lua.rs` as steps on the server's keys. `acquire` grants (SET NX, INCR fence) only when
//! `may_take` lets it past the queue, else the waiter joins the queue (`enqueue`); a shared
//! attempt goes only when no exclusive waiter is queued before it; `-n` (`peek`) never queues
//! and takes only when nobody waits; `release` is compare-and-DEL; `give_back` leaves the
//! queue, lets go what the token holds and buries it; a buried token's attempt is refused.
//!
//! Time is abstract here: a lease lapses on the server only after its holder's command was
//! stopped (model 6 shows the lease clock stops it first), and a queue place lapses only when
//! its waiter is gone or paused (a live waiter refreshes it every KEEP_ALIVE/3; the keep-alive
//! model bounds when). The environment delays, reorders, loses and duplicates (an unanswered
//! attempt retried with the same token) the attempts; waiters give up, crash, or are paused.
//!
//! Liveness (a configuration of its own, `Asks::Tick`), under the fairness the protocol needs:
//! every holder's command ends (holders keep releasing, or lose their lease), every message is
//! delivered or lost and only finitely many are lost, the server lets go what nobody keeps
//! alive, and a live waiter asks again after every change it could see: its keep-alive tick
//! (every KEEP_ALIVE/3, whatever woke it or not) and the timeout of an attempt that went
//! unanswered. There a waiter asks once, then once more after each release, give-back, lapse
//! or lost answer; the model has no cycle, so every path ends, and the property is checked
//! where it ends. The safety configurations bound a waiter's attempts instead (`Asks::Budget`).

mod configs;
mod scripts;

use stateright::{Model, Property};

pub use configs::{Mutation, check};
use scripts::Change;

const CLIENTS: usize = 3;
/// Attempts each client may send (first, retries, keep-alives).
const ATTEMPTS: u8 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    Exclusive,
    Shared,
}

/// How an attempt asks (`scripts::ACQUIRE`'s mode argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum How {
    /// A fair waiter: joins the queue.
    Queue,
    /// `-n`: never queues; takes only when nobody waits.
    Peek,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Acquire { c: u8, token: u8 },
    GiveBack { token: u8 },
    Release { token: u8, bury: bool },
    Granted { c: u8, token: u8 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Waiting,
    Holding,
    /// Its command was stopped (lease lost, or it ended): its key lapses or is released.
    Stopped,
    /// Gave up waiting (`-w`, a signal): its token given back.
    GaveUp,
    /// SIGKILLed while waiting.
    Gone,
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub mode: Mode,
    pub how: How,
    pub phase: Phase,
    pub token: u8,
    pub attempts: u8,
    /// An attempt of this token went unanswered (lost, or sent twice): its release buries the
    /// token (`stray`).
    pub stray: bool,
    /// Something changed that this waiter's next ask could see (it was woken, its keep-alive
    /// tick came, or its attempt timed out): it may ask again.
    pub news: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// `lock:{NAME}` / `holders:{NAME}`: who holds, by token (with the holder's mode).
    pub holders: Vec<(u8, Mode)>,
    /// `queue:{NAME}`: tokens in arrival order (with their mode).
    pub queue: Vec<(u8, Mode)>,
    /// `gone:{NAME}`.
    pub buried: Vec<u8>,
    pub net: crate::net::Net<Msg>,
    pub c: Vec<Client>,
    pub faults: u8,
    /// Ghosts: a grant to a token its run had given back; a fair waiter passed by one that
    /// came later. (The fence is `INCR` in the grant's own script: strictly increasing as long
    /// as the server keeps its data; the fence's proofs are the other models'.)
    pub granted_given_back: bool,
    pub passed: bool,
    /// Ghost: tokens whose give-back (or stray release) the server has run.
    pub returned: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Attempt(usize),
    Deliver(Msg),
    Net(crate::net::Fault),
    /// The command ends and the run releases.
    Release(usize),
    /// The lease is lost (renewals failed): the lease clock stopped the command first.
    LoseLease(usize),
    /// The server drops an expired key, or the place of a waiter that stopped asking.
    Lapse(u8),
    GiveUp(usize),
    Crash(usize),
}

/// What makes a waiter ask again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Asks {
    /// A few attempts (first, retries, keep-alives) at any moment, nothing more: the safety
    /// configurations.
    #[default]
    Budget,
    /// Its keep-alive tick (every KEEP_ALIVE/3) after any change, besides the release's wake-up.
    Tick,
    /// No tick, no timer for the head's keep-alive: the release (or give-back) wakes the head
    /// of the queue, and a holder's key that lapses wakes the waiters (each sleeps its PTTL).
    WokenAtHead,
    /// No tick, no timer at all: a waiter sleeps until woken, and the release wakes no one.
    Never,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// `--holders N`.
    pub limit: u8,
    pub no_bury: bool,
    pub shared_passes_writer: bool,
    pub peek_ignores_queue: bool,
    pub release_without_compare: bool,
    pub ignore_queue: bool,
    pub asks: Asks,
}

pub struct RedisModel {
    pub rules: Rules,
    pub clients: Vec<(Mode, How)>,
    /// Attempts a waiter may make at any moment; messages the network may lose, duplicate;
    /// waiters that may give up or be SIGKILLed.
    pub attempts: u8,
    pub losses: u8,
    pub dups: u8,
    pub faults: u8,
}

impl Model for RedisModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let c: Vec<Client> = self
            .clients
            .iter()
            .enumerate()
            .map(|(i, &(mode, how))| Client {
                mode,
                how,
                phase: Phase::Waiting,
                token: i as u8,
                attempts: self.attempts,
                stray: false,
                news: false,
            })
            .collect();
        // The first run holds already: the others come while it does.
        let mut c: Vec<Client> = c;
        c[0].phase = Phase::Holding;
        vec![State {
            holders: vec![(0, self.clients[0].0)],
            queue: Vec::new(),
            buried: Vec::new(),
            net: crate::net::Net::new(self.losses, self.dups),
            c,
            faults: self.faults,
            granted_given_back: false,
            passed: false,
            returned: Vec::new(),
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for (i, c) in s.c.iter().enumerate() {
            match c.phase {
                Phase::Waiting => {
                    let out_there = s
                        .net
                        .count(|m| matches!(m, Msg::Acquire { c: x, .. } if *x as usize == i));
                    if (c.attempts > 0 || c.news) && out_there == 0 {
                        out.push(Action::Attempt(i));
                    }
                    if s.faults > 0 {
                        out.push(Action::GiveUp(i));
                        out.push(Action::Crash(i));
                    }
                }
                Phase::Holding => {
                    out.push(Action::Release(i));
                    out.push(Action::LoseLease(i));
                }
                _ => {}
            }
        }
        // The server drops what nobody keeps alive: a stopped holder's key, a place whose
        // waiter stopped asking.
        for &(t, _) in &s.holders {
            let kept =
                s.c.iter()
                    .any(|c| c.token == t && matches!(c.phase, Phase::Holding));
            if !kept {
                out.push(Action::Lapse(t));
            }
        }
        for &(t, _) in &s.queue {
            let kept =
                s.c.iter()
                    .any(|c| c.token == t && c.phase == Phase::Waiting);
            if !kept {
                out.push(Action::Lapse(t));
            }
        }
        for i in s.net.distinct() {
            out.push(Action::Deliver(s.net.bag[i]));
        }
        // Any message may be lost; an attempt may be sent twice (a retry with the same token).
        let mut f = Vec::new();
        crate::net::faults(&s.net, &mut f);
        out.extend(
            f.into_iter()
                .filter(|f| match f {
                    crate::net::Fault::Duplicate(i) => matches!(s.net.bag[*i], Msg::Acquire { .. }),
                    _ => true,
                })
                .map(Action::Net),
        );
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Attempt(i) => {
                match s.c[i].news {
                    true => s.c[i].news = false,
                    false => s.c[i].attempts -= 1,
                }
                let token = s.c[i].token;
                s.net.send(Msg::Acquire { c: i as u8, token });
            }
            Action::Deliver(m) => {
                let i = s.net.bag.iter().position(|x| *x == m)?;
                s.net.take(i);
                match m {
                    Msg::Acquire { c, token } => self.acquire(&mut s, c, token),
                    Msg::GiveBack { token } => {
                        if !s.returned.contains(&token) {
                            s.returned.push(token);
                        }
                        if !self.rules.no_bury && !s.buried.contains(&token) {
                            s.buried.push(token);
                        }
                        s.queue.retain(|&(t, _)| t != token);
                        s.holders.retain(|&(t, _)| t != token);
                        self.changed(&mut s, Change::Released);
                    }
                    Msg::Release { token, bury } => {
                        if bury && !s.returned.contains(&token) {
                            s.returned.push(token);
                        }
                        if bury && !self.rules.no_bury && !s.buried.contains(&token) {
                            s.buried.push(token);
                        }
                        if self.rules.release_without_compare {
                            s.holders.clear();
                        } else {
                            s.holders.retain(|&(t, _)| t != token);
                        }
                        self.changed(&mut s, Change::Released);
                    }
                    Msg::Granted { c, token } => {
                        let client = &mut s.c[c as usize];
                        if client.phase == Phase::Waiting && client.token == token {
                            client.phase = Phase::Holding;
                        }
                    }
                }
            }
            Action::Net(f) => {
                let (crate::net::Fault::Duplicate(j) | crate::net::Fault::Lose(j)) = f;
                if let Msg::Acquire { c, .. } | Msg::Granted { c, .. } = s.net.bag[j] {
                    // An attempt (or its answer) gone astray: the attempt goes unanswered, it
                    // times out and asks again, and its run's release buries the token.
                    let client = &mut s.c[c as usize];
                    client.stray = true;
                    client.news |= matches!(f, crate::net::Fault::Lose(_))
                        && client.phase == Phase::Waiting
                        && self.rules.asks != Asks::Budget;
                }
                crate::net::apply(&mut s.net, f)
            }
            Action::Release(i) => {
                s.c[i].phase = Phase::Done;
                let (token, bury) = (s.c[i].token, s.c[i].stray);
                s.net.send(Msg::Release { token, bury });
            }
            Action::LoseLease(i) => s.c[i].phase = Phase::Stopped,
            Action::Lapse(t) => {
                // A grant still on its way when its key lapses comes too late to be used
                // (model 6: the wrapper gives it back rather than start, and asks again).
                let late = |m: &Msg| matches!(m, Msg::Granted { token, .. } if *token == t);
                if self.rules.asks != Asks::Budget
                    && let Some(&Msg::Granted { c, .. }) = s.net.bag.iter().find(|m| late(m))
                {
                    s.c[c as usize].news = true;
                }
                s.net.bag.retain(|m| !late(m));
                let what = match s.holders.iter().any(|&(x, _)| x == t) {
                    true => Change::HolderLapsed,
                    false => Change::PlaceLapsed,
                };
                s.holders.retain(|&(x, _)| x != t);
                s.queue.retain(|&(x, _)| x != t);
                self.changed(&mut s, what);
            }
            Action::GiveUp(i) => {
                s.faults -= 1;
                s.c[i].phase = Phase::GaveUp;
                let token = s.c[i].token;
                s.net.send(Msg::GiveBack { token });
            }
            Action::Crash(i) => {
                s.faults -= 1;
                s.c[i].phase = Phase::Gone;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "never more holders than the mode allows",
                |m: &RedisModel, s: &State| {
                    let inside: Vec<Mode> =
                        s.c.iter()
                            .filter(|c| matches!(c.phase, Phase::Holding))
                            .map(|c| c.mode)
                            .collect();
                    let exclusive = inside.iter().filter(|&&x| x == Mode::Exclusive).count();
                    exclusive <= m.rules.limit as usize
                        && (exclusive == 0 || inside.len() == exclusive)
                },
            ),
            Property::always("a token given back never holds", |_, s: &State| {
                !s.granted_given_back
            }),
            Property::always(
                "a fair waiter is never passed by a later one",
                |_, s: &State| !s.passed,
            ),
            // Monotone (a waiter never waits again), so that the checker's paths that join
            // carry the same verdict; checked where a path ends (the model has no cycles).
            Property::eventually(
                "a waiter eventually runs when holders keep releasing",
                |m: &RedisModel, s: &State| {
                    m.rules.asks == Asks::Budget
                        || s.c
                            .iter()
                            .all(|c| c.how == How::Peek || c.phase != Phase::Waiting)
                },
            ),
            Property::sometimes("every run held it", |_, s: &State| {
                s.c.iter().all(|c| c.phase == Phase::Done)
            }),
        ]
    }
}
