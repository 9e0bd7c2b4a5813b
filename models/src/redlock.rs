//! Model 2, Redlock's quorum and its fence (`src/redis/redlock/mod.rs`): two runs against
//! three independent servers. An attempt asks every server (`SET NX`, and that server's
//! `INCR fence`); with a quorum of grants, f = max of their counters, and each granting server
//! raises its counter to f only while it still holds the run's token (`RAISE_FENCE`); f is
//! the fence once a quorum confirmed. Without a quorum, what was granted is given back. Keys
//! lapse on a server only after their run stopped keeping them (model 6). Requests to each
//! server are delivered in any order, and any may be lost; a server may crash and restart
//! with its data (AOF, `appendfsync always`).

use stateright::{Model, Property};

use crate::check::{Report, limit, verify};

const SERVERS: usize = 3;
const RUNS: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Acquire { run: u8, server: u8 },
    Raise { run: u8, server: u8, fence: u8 },
    GiveBack { run: u8, server: u8 },
    Granted { run: u8, server: u8, counter: u8 },
    Refused { run: u8, server: u8 },
    Raised { run: u8, server: u8, ok: bool },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Asking,
    Raising { fence: u8 },
    Running { fence: u8 },
    Stopped,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    pub phase: Phase,
    /// Per server: its answer to the acquire (granted counter), or to the raise.
    pub granted: [Option<u8>; SERVERS],
    pub refused: u8,
    pub raised: u8,
    pub raise_refused: u8,
    /// Attempts left after a failed one.
    pub retries: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// Per server: who holds its key, and its fence counter.
    pub lock: [Option<u8>; SERVERS],
    pub counter: [u8; SERVERS],
    pub net: crate::net::Net<Msg>,
    pub runs: Vec<Run>,
    pub max_fence: u8,
    pub fence_back: bool,
    pub faults: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Deliver(Msg),
    Net(crate::net::Fault),
    Stop(usize),
    /// A run that failed asks again, on every server.
    Retry(usize),
    /// A stopped run's key lapses on a server.
    Lapse(usize),
    /// A server restarts empty (a limit, beyond DESIGN's bound).
    RestartEmpty(usize),
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    pub no_raise: bool,
    pub half_is_quorum: bool,
    pub restart_empty: bool,
}

pub struct RedlockModel {
    pub rules: Rules,
}

impl RedlockModel {
    fn quorum(&self) -> u8 {
        match self.rules.half_is_quorum {
            true => (SERVERS / 2) as u8,
            false => (SERVERS / 2 + 1) as u8,
        }
    }

    fn decide(&self, s: &mut State, r: usize) {
        let q = self.quorum();
        let run = &s.runs[r];
        let grants = run.granted.iter().flatten().count() as u8;
        match run.phase {
            Phase::Asking if grants >= q => {
                let fence = run.granted.iter().flatten().copied().max().unwrap_or(0);
                if self.rules.no_raise {
                    self.start(s, r, fence);
                    return;
                }
                s.runs[r].phase = Phase::Raising { fence };
                for server in 0..SERVERS {
                    if s.runs[r].granted[server].is_some() {
                        s.net.send(Msg::Raise {
                            run: r as u8,
                            server: server as u8,
                            fence,
                        });
                    }
                }
            }
            Phase::Asking if run.refused > SERVERS as u8 - q => self.give_back(s, r),
            Phase::Raising { fence } if run.raised >= q => self.start(s, r, fence),
            Phase::Raising { .. } if run.raise_refused > SERVERS as u8 - q => self.give_back(s, r),
            _ => {}
        }
    }

    fn start(&self, s: &mut State, r: usize, fence: u8) {
        s.fence_back |= fence <= s.max_fence;
        s.max_fence = s.max_fence.max(fence);
        s.runs[r].phase = Phase::Running { fence };
    }

    fn give_back(&self, s: &mut State, r: usize) {
        s.runs[r].phase = Phase::Failed;
        for server in 0..SERVERS {
            s.net.send(Msg::GiveBack {
                run: r as u8,
                server: server as u8,
            });
        }
    }
}

impl Model for RedlockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let mut net = crate::net::Net::new(0, 0);
        for run in 0..RUNS as u8 {
            for server in 0..SERVERS as u8 {
                net.send(Msg::Acquire { run, server });
            }
        }
        let run = Run {
            phase: Phase::Asking,
            granted: [None; SERVERS],
            refused: 0,
            raised: 0,
            raise_refused: 0,
            retries: 1,
        };
        vec![State {
            lock: [None; SERVERS],
            counter: [0; SERVERS],
            net,
            runs: vec![run; RUNS],
            max_fence: 0,
            fence_back: false,
            faults: 1,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        for i in s.net.distinct() {
            out.push(Action::Deliver(s.net.bag[i]));
        }
        let mut f = Vec::new();
        crate::net::faults(&s.net, &mut f);
        out.extend(f.into_iter().map(Action::Net));
        for (r, run) in s.runs.iter().enumerate() {
            if matches!(run.phase, Phase::Running { .. }) {
                out.push(Action::Stop(r));
            }
            // Once its give-backs are out of the way (a fresh token: the model's run index
            // stands for both).
            let pending = s
                .net
                .count(|m| matches!(m, Msg::GiveBack { run: x, .. } if *x as usize == r));
            if run.phase == Phase::Failed && run.retries > 0 && pending == 0 {
                out.push(Action::Retry(r));
            }
        }
        for server in 0..SERVERS {
            // A failed run's key, its give-back lost, lapses.
            let kept = s.lock[server].is_some_and(|r| s.runs[r as usize].phase != Phase::Failed);
            if s.lock[server].is_some() && !kept {
                out.push(Action::Lapse(server));
            }
            if self.rules.restart_empty && s.faults > 0 {
                out.push(Action::RestartEmpty(server));
            }
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Deliver(m) => {
                let i = s.net.bag.iter().position(|x| *x == m)?;
                s.net.take(i);
                match m {
                    Msg::Acquire { run, server } => {
                        let sv = server as usize;
                        let reply = match s.lock[sv] {
                            None => {
                                s.lock[sv] = Some(run);
                                s.counter[sv] += 1;
                                Msg::Granted {
                                    run,
                                    server,
                                    counter: s.counter[sv],
                                }
                            }
                            Some(_) => Msg::Refused { run, server },
                        };
                        s.net.send(reply);
                    }
                    Msg::Raise { run, server, fence } => {
                        let sv = server as usize;
                        let ok = s.lock[sv] == Some(run);
                        if ok {
                            s.counter[sv] = s.counter[sv].max(fence);
                        }
                        s.net.send(Msg::Raised { run, server, ok });
                    }
                    Msg::GiveBack { run, server } => {
                        if s.lock[server as usize] == Some(run) {
                            s.lock[server as usize] = None;
                        }
                    }
                    Msg::Granted {
                        run,
                        server,
                        counter,
                    } => {
                        s.runs[run as usize].granted[server as usize] = Some(counter);
                        self.decide(&mut s, run as usize);
                    }
                    Msg::Refused { run, .. } => {
                        s.runs[run as usize].refused += 1;
                        self.decide(&mut s, run as usize);
                    }
                    Msg::Raised { run, ok, .. } => {
                        match ok {
                            true => s.runs[run as usize].raised += 1,
                            false => s.runs[run as usize].raise_refused += 1,
                        }
                        self.decide(&mut s, run as usize);
                    }
                }
            }
            Action::Net(f) => crate::net::apply(&mut s.net, f),
            Action::Stop(r) => {
                // Its keys lapse (or are released) on every server; requests still on their
                // way land before or after, in any order.
                s.runs[r].phase = Phase::Stopped;
                for lock in s.lock.iter_mut() {
                    if *lock == Some(r as u8) {
                        *lock = None;
                    }
                }
            }
            Action::Retry(r) => {
                let run = &mut s.runs[r];
                run.retries -= 1;
                run.phase = Phase::Asking;
                run.granted = [None; SERVERS];
                run.refused = 0;
                run.raised = 0;
                run.raise_refused = 0;
                // Answers to the old attempt are dropped with its connections.
                s.net.bag.retain(|m| !matches!(m, Msg::Granted { run: x, .. } | Msg::Refused { run: x, .. } | Msg::Raised { run: x, .. } if *x as usize == r));
                for server in 0..SERVERS as u8 {
                    s.net.send(Msg::Acquire {
                        run: r as u8,
                        server,
                    });
                }
            }
            Action::Lapse(server) => s.lock[server] = None,
            Action::RestartEmpty(server) => {
                s.faults -= 1;
                s.lock[server] = None;
                s.counter[server] = 0;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one command at a time", |_, s: &State| {
                s.runs
                    .iter()
                    .filter(|r| matches!(r.phase, Phase::Running { .. }))
                    .count()
                    <= 1
            }),
            Property::always("fences strictly increase", |_, s: &State| !s.fence_back),
            Property::sometimes("both ran", |_, s: &State| {
                s.runs.iter().all(|r| r.phase == Phase::Stopped)
            }),
        ]
    }
}

#[derive(Clone, Copy)]
pub enum Mutation {
    NoRaise,
    HalfIsQuorum,
}

pub fn check() -> Report {
    let mut report = verify(
        "redlock",
        format!(
            "{RUNS} runs, {SERVERS} servers, 1 retry each, every request and answer in any order; servers keep their data"
        ),
        |m| {
            let mut rules = Rules::default();
            match m {
                None => {}
                Some(Mutation::NoRaise) => rules.no_raise = true,
                Some(Mutation::HalfIsQuorum) => rules.half_is_quorum = true,
            }
            RedlockModel { rules }
        },
        &[
            (
                Mutation::NoRaise,
                "the fence without the raise (max of the grants)",
            ),
            (Mutation::HalfIsQuorum, "a quorum of N/2"),
        ],
    );
    limit(
        &mut report,
        "a server of an exact quorum restarted empty",
        RedlockModel {
            rules: Rules {
                restart_empty: true,
                ..Rules::default()
            },
        },
    );
    report
}
