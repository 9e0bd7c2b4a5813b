//! Model 3, etcd's recipe as `src/etcd/round.rs` builds it: each run's key `NAME/<lease>`
//! has the next revision; the key with the lowest create revision holds, and its create
//! revision is the fence. A run that finds `NAME/` empty creates its key on its holding lease
//! (the lease the lease clock runs on) in one transaction that compares the prefix empty:
//! it holds. Else it waits: its key is created on a queue lease of its own (KEEP_ALIVE, kept
//! alive every heartbeat), and when woken it sends the grant: one transaction that compares
//! its key (at its create revision) and no key before it, and moves the key to its holding
//! lease (the mark: the put keeps the create revision). The queue lease, no longer kept
//! alive once its run holds (or is gone), lapses, and etcd deletes what is still on it: a
//! dead waiter's key goes KEEP_ALIVE after its last keep-alive, and a live waiter whose
//! keep-alives stalled that long loses its key and queues again at the end. A holding lease
//! ends only once its run stopped keeping it alive, and the lease clock stopped that run's
//! command first (model 6). etcd itself is linearizable (Raft): each transaction is one step.
//! Wake-ups are hints: a waiter may send its grant at any moment; the comparison decides.
//! A waiter that read the line and found no key before its own is proven first (keys are only
//! ever created at the end, and the ones before it only go): its grant confirms only that its
//! own key is still there, at its create revision (`round.rs`'s shortcut); a waiter whose key
//! lapsed and was made again has a new key and must prove itself again.
//! The first run is `etcdctl lock`: its key on its session's lease (which outlives any stall
//! here), holding when first, with no mark; nobody but etcd ever deletes another's key.

use stateright::{Model, Property};

use crate::check::{Report, verify};

const RUNS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub run: u8,
    pub created: u8,
    /// On its run's holding lease (the mark), else on its queue lease (or, `etcdctl lock`'s,
    /// on its session's lease: never marked).
    pub holding: bool,
}

/// The run that is `etcdctl lock`.
const ETCDCTL: usize = 0;

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
    /// SIGKILLed while waiting: its queue lease is kept alive no more.
    Gone,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub revision: u8,
    pub keys: Vec<Key>,
    pub runs: Vec<Phase>,
    /// Runs whose queue lease's keep-alives stalled past KEEP_ALIVE (a slow network, a
    /// paused wrapper): etcd may let it lapse.
    pub stalled: Vec<bool>,
    pub max_fence: u8,
    pub fence_back: bool,
    pub faults: u8,
    /// Places taken again after a lapse, in all (a bound).
    pub requeues: u8,
    /// Waiters whose last read of the line found no key before their own key of now.
    pub proven: Vec<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// The first transaction: the key on the holding lease if `NAME/` is empty, else on a
    /// queue lease (`first`, `queue`).
    Create(usize),
    /// The grant: compare (our key at its revision, none before it), move it to the holding
    /// lease (`mark`).
    Mark(usize),
    /// A waiter reads the line (at a wake-up, or its safety-net read): no key before its own
    /// proves it first.
    Read(usize),
    /// A waiter's keep-alives stall past KEEP_ALIVE, or get through again.
    Stall(usize),
    KeepAlive(usize),
    /// etcd lets a queue lease lapse: every key on it goes.
    QueueLapses(usize),
    /// A waiter whose key lapsed queues again, at the end (`place_gone`).
    Requeue(usize),
    /// (DESIGN's example) the waiter behind deletes a stalled first key without the mark.
    DeleteStalled(usize),
    Stop(usize),
    /// A stopped run's key goes (the release's transaction, which deletes it only at its
    /// create revision; a revoke; or its holding lease ends).
    LetGo(usize),
    Crash(usize),
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// The grant leaves the key on its queue lease (no mark): what takes a dead waiter's key
    /// away takes a holder's too.
    pub no_mark: bool,
    /// The grant moves the key without comparing that none is before it.
    pub no_compare: bool,
    /// DESIGN's example encoding: the waiter behind deletes a first key that has no mark and
    /// whose keep-alives stalled (no queue leases).
    pub delete_behind: bool,
    /// A waiter keeps its proof of being first when its key lapsed and was made again.
    pub proof_kept: bool,
}

pub struct EtcdModel {
    pub rules: Rules,
}

fn first(keys: &[Key]) -> Option<Key> {
    keys.iter().min_by_key(|k| k.created).copied()
}

impl EtcdModel {
    /// Whether run `i`'s queue lease is kept alive: while it waits and its keep-alives get
    /// through (a holder's queue lease is dropped; a gone waiter's is not kept).
    fn queue_kept(s: &State, i: usize) -> bool {
        i == ETCDCTL || s.runs[i] == Phase::Waiting && !s.stalled[i]
    }

    fn grant(s: &mut State, i: usize, fence: u8) {
        s.fence_back |= fence <= s.max_fence;
        s.max_fence = s.max_fence.max(fence);
        s.runs[i] = Phase::Running { fence };
    }
}

impl Model for EtcdModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            revision: 1,
            keys: Vec::new(),
            runs: vec![Phase::New; RUNS],
            stalled: vec![false; RUNS],
            max_fence: 0,
            fence_back: false,
            faults: 1,
            requeues: 1,
            proven: vec![false; RUNS],
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for i in 0..RUNS {
            let key = s.keys.iter().find(|k| k.run == i as u8);
            match s.runs[i] {
                Phase::New => out.push(Action::Create(i)),
                Phase::Waiting => {
                    if self.rules.delete_behind
                        && first(&s.keys).is_some_and(|k| {
                            k.run != i as u8 && !k.holding && s.stalled[k.run as usize]
                        })
                    {
                        out.push(Action::DeleteStalled(i));
                    }
                    match key {
                        Some(_) => {
                            out.push(Action::Mark(i));
                            if !s.proven[i] {
                                out.push(Action::Read(i));
                            }
                        }
                        None if s.requeues > 0 => out.push(Action::Requeue(i)),
                        None => {}
                    }
                    out.push(match s.stalled[i] {
                        false => Action::Stall(i),
                        true => Action::KeepAlive(i),
                    });
                    if s.faults > 0 {
                        out.push(Action::Crash(i));
                    }
                }
                Phase::Running { .. } => {
                    out.push(Action::Stop(i));
                    // etcdctl's session keep-alives may stall too (its lease outlives them).
                    if i == ETCDCTL {
                        out.push(match s.stalled[i] {
                            false => Action::Stall(i),
                            true => Action::KeepAlive(i),
                        });
                    }
                }
                Phase::Stopped | Phase::Gone if key.is_some_and(|k| k.holding || i == ETCDCTL) => {
                    out.push(Action::LetGo(i))
                }
                _ => {}
            }
            if key.is_some_and(|k| !k.holding) && !Self::queue_kept(s, i) {
                out.push(Action::QueueLapses(i));
            }
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Create(i) => {
                let created = s.revision;
                s.revision += 1;
                let free = s.keys.is_empty();
                s.keys.push(Key {
                    run: i as u8,
                    created,
                    holding: free && i != ETCDCTL,
                });
                match free {
                    true => Self::grant(&mut s, i, created),
                    false => s.runs[i] = Phase::Waiting,
                }
            }
            Action::Mark(i) => {
                let mine = *s.keys.iter().find(|k| k.run == i as u8)?;
                let first_now = first(&s.keys).is_some_and(|k| k.run == i as u8);
                if !first_now && !self.rules.no_compare && !s.proven[i] {
                    // The comparison fails: nothing written (its reads say who is before it).
                    return None;
                }
                let key = s.keys.iter_mut().find(|k| k.run == i as u8)?;
                key.holding = !self.rules.no_mark && i != ETCDCTL;
                s.revision += 1;
                Self::grant(&mut s, i, mine.created);
            }
            Action::Read(i) => {
                s.proven[i] = first(&s.keys).is_some_and(|k| k.run == i as u8);
                if !s.proven[i] {
                    return None;
                }
            }
            Action::Stall(i) => s.stalled[i] = true,
            Action::KeepAlive(i) => s.stalled[i] = false,
            Action::QueueLapses(i) => {
                s.keys.retain(|k| k.run != i as u8 || k.holding);
                s.revision += 1;
            }
            Action::Requeue(i) => {
                s.requeues -= 1;
                s.proven[i] &= self.rules.proof_kept;
                s.stalled[i] = false;
                s.keys.push(Key {
                    run: i as u8,
                    created: s.revision,
                    holding: false,
                });
                s.revision += 1;
            }
            Action::DeleteStalled(_) => {
                let k = first(&s.keys)?;
                s.keys.retain(|x| x.run != k.run);
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
            Property::sometimes(
                "a dead waiter's key lapsed while another runs",
                |_, s: &State| {
                    s.runs
                        .iter()
                        .enumerate()
                        .any(|(i, p)| *p == Phase::Gone && !s.keys.iter().any(|k| k.run == i as u8))
                        && s.runs.iter().any(|p| matches!(p, Phase::Running { .. }))
                },
            ),
        ]
    }
}

#[derive(Clone, Copy)]
pub enum Mutation {
    NoMark,
    NoCompare,
    DeleteBehind,
    ProofKept,
}

pub fn check() -> Report {
    verify(
        "etcd",
        format!(
            "{RUNS} runs (the first `etcdctl lock`), keep-alives stalling past KEEP_ALIVE at any time, 1 waiter SIGKILLed, 1 place taken again after a lapse; grants sent at any moment (a wake-up is a hint)"
        ),
        |m| {
            let mut rules = Rules::default();
            match m {
                None => {}
                Some(Mutation::NoMark) => rules.no_mark = true,
                Some(Mutation::NoCompare) => rules.no_compare = true,
                Some(Mutation::DeleteBehind) => rules.delete_behind = true,
                Some(Mutation::ProofKept) => rules.proof_kept = true,
            }
            EtcdModel { rules }
        },
        &[
            (
                Mutation::NoMark,
                "a dead-waiter delete without the mark (the key left on its queue lease)",
            ),
            (
                Mutation::NoCompare,
                "the mark without the comparison (a woken waiter moves its key unchecked)",
            ),
            (
                Mutation::DeleteBehind,
                "DESIGN's example: the one behind deletes a stalled unmarked first key",
            ),
            (
                Mutation::ProofKept,
                "a proof of being first kept for a key made again after a lapse",
            ),
        ],
    )
}
