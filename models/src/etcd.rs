//! Model 3, etcd's recipe (`src/etcd/mod.rs`, DESIGN "A consensus backend"): each run's key
//! `NAME/<lease>` is created on its lease with the next revision; the key with the lowest
//! create revision holds, and its create revision is the fence. A run whose key is first
//! confirms it and leaves the holder's mark in the same transaction (a compare on the whole
//! range, then a rewrite of its key that keeps its create revision) before its command starts.
//! The waiter behind a first key that has no mark and whose lease was not kept alive for a
//! heartbeat deletes it (a transaction that compares the mark's absence): a dead waiter holds
//! the line up for a heartbeat, not a lease. A lease ends only once its run stopped keeping
//! it alive, and the lease clock stopped that run's command first (model 6); keep-alives may
//! stall for a heartbeat at any time (a slow network, a paused wrapper) without the lease
//! ending. etcd itself is linearizable (Raft): each transaction is one step.

use stateright::{Model, Property};

use crate::check::{Report, verify};

const RUNS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub run: u8,
    pub created: u8,
    pub marked: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// No key yet.
    New,
    Waiting,
    Running {
        fence: u8,
    },
    /// Its command stopped (ended, or lost its lease): it lets its key go.
    Stopped,
    /// SIGKILLed while waiting: its lease lapses after T.
    Gone,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub revision: u8,
    pub keys: Vec<Key>,
    pub runs: Vec<Phase>,
    /// Runs whose keep-alives stalled for a heartbeat (their lease still live).
    pub stale: Vec<bool>,
    /// A waiter's read: the key before it, unmarked and stale, as it saw it.
    pub seen_dead: Vec<Option<u8>>,
    pub max_fence: u8,
    pub fence_back: bool,
    pub faults: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Grant a lease and create the key, only if absent: the next revision.
    Create(usize),
    /// The transaction that compares "no key before mine" and rewrites the key with the mark.
    Confirm(usize),
    /// Keep-alives stall for a heartbeat (the lease still live).
    Stall(usize),
    KeepAlive(usize),
    /// A waiter reads the key before its own, its mark and its lease's keep-alive.
    LookBefore(usize),
    /// It deletes that key in a transaction that compares the mark's absence.
    DeleteDead(usize),
    Stop(usize),
    /// A stopped run's key goes (revoke, or its lease ends).
    LetGo(usize),
    Crash(usize),
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// The dead waiter's key deleted on a stale lease alone, without the mark's compare.
    pub delete_without_mark: bool,
    /// The mark's absence read, then the key deleted unconditionally.
    pub delete_unconditionally: bool,
}

pub struct EtcdModel {
    pub rules: Rules,
}

fn first(keys: &[Key]) -> Option<Key> {
    keys.iter().min_by_key(|k| k.created).copied()
}

fn before(keys: &[Key], run: u8) -> Option<Key> {
    let mine = keys.iter().find(|k| k.run == run)?.created;
    keys.iter()
        .filter(|k| k.created < mine)
        .max_by_key(|k| k.created)
        .copied()
}

impl Model for EtcdModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            revision: 1,
            keys: Vec::new(),
            runs: vec![Phase::New; RUNS],
            stale: vec![false; RUNS],
            seen_dead: vec![None; RUNS],
            max_fence: 0,
            fence_back: false,
            faults: 1,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for i in 0..RUNS {
            let has_key = s.keys.iter().any(|k| k.run == i as u8);
            match s.runs[i] {
                Phase::New => out.push(Action::Create(i)),
                Phase::Waiting => {
                    if first(&s.keys).is_some_and(|k| k.run == i as u8) {
                        out.push(Action::Confirm(i));
                    }
                    if before(&s.keys, i as u8).is_some() {
                        out.push(Action::LookBefore(i));
                    }
                    if s.seen_dead[i].is_some() {
                        out.push(Action::DeleteDead(i));
                    }
                    if s.faults > 0 {
                        out.push(Action::Crash(i));
                    }
                }
                Phase::Running { .. } => out.push(Action::Stop(i)),
                Phase::Stopped | Phase::Gone if has_key => out.push(Action::LetGo(i)),
                _ => {}
            }
            let alive = matches!(s.runs[i], Phase::Waiting | Phase::Running { .. });
            if alive && has_key {
                out.push(match s.stale[i] {
                    false => Action::Stall(i),
                    true => Action::KeepAlive(i),
                });
            }
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Create(i) => {
                s.keys.push(Key {
                    run: i as u8,
                    created: s.revision,
                    marked: false,
                });
                s.revision += 1;
                s.runs[i] = Phase::Waiting;
            }
            Action::Confirm(i) => {
                let k = first(&s.keys)?;
                if k.run != i as u8 {
                    return None;
                }
                let key = s.keys.iter_mut().find(|k| k.run == i as u8)?;
                key.marked = true;
                let fence = key.created;
                s.revision += 1;
                s.fence_back |= fence <= s.max_fence;
                s.max_fence = s.max_fence.max(fence);
                s.runs[i] = Phase::Running { fence };
            }
            Action::Stall(i) => s.stale[i] = true,
            Action::KeepAlive(i) => s.stale[i] = false,
            Action::LookBefore(i) => {
                let k = before(&s.keys, i as u8)?;
                let dead = (!k.marked || self.rules.delete_without_mark)
                    && (s.stale[k.run as usize] || matches!(s.runs[k.run as usize], Phase::Gone));
                s.seen_dead[i] = dead.then_some(k.run);
            }
            Action::DeleteDead(i) => {
                let run = s.seen_dead[i].take()?;
                let unconditional =
                    self.rules.delete_without_mark || self.rules.delete_unconditionally;
                s.keys
                    .retain(|k| !(k.run == run && (unconditional || !k.marked)));
                s.revision += 1;
            }
            Action::Stop(i) => s.runs[i] = Phase::Stopped,
            Action::LetGo(i) => {
                s.keys.retain(|k| k.run != i as u8);
                s.revision += 1;
            }
            Action::Crash(i) => {
                s.faults -= 1;
                s.runs[i] = Phase::Gone;
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
            Property::always("fences strictly increase", |_, s: &State| !s.fence_back),
            Property::always(
                "a running command's key is never deleted early",
                |_, s: &State| {
                    s.runs.iter().enumerate().all(|(i, p)| {
                        !matches!(p, Phase::Running { .. })
                            || s.keys.iter().any(|k| k.run == i as u8)
                    })
                },
            ),
            Property::sometimes("a dead waiter's key deleted", |_, s: &State| {
                s.runs
                    .iter()
                    .enumerate()
                    .any(|(i, p)| *p == Phase::Gone && !s.keys.iter().any(|k| k.run == i as u8))
                    && s.runs.iter().any(|p| matches!(p, Phase::Running { .. }))
            }),
        ]
    }
}

#[derive(Clone, Copy)]
pub enum Mutation {
    WithoutMark,
    Unconditional,
}

pub fn check() -> Report {
    verify(
        "etcd",
        format!(
            "{RUNS} runs, keep-alives stalling for a heartbeat at any time, 1 waiter SIGKILLed"
        ),
        |m| {
            let mut rules = Rules::default();
            match m {
                None => {}
                Some(Mutation::WithoutMark) => rules.delete_without_mark = true,
                Some(Mutation::Unconditional) => rules.delete_unconditionally = true,
            }
            EtcdModel { rules }
        },
        &[
            (
                Mutation::WithoutMark,
                "a dead-waiter delete without the mark",
            ),
            (
                Mutation::Unconditional,
                "the mark read, the delete not compared",
            ),
        ],
    )
}
