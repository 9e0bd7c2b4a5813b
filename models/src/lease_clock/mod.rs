//! Model 6, the lease clock every lease backend shares (`src/lease.rs`, the grant check of
//! `src/session/waiter.rs`, `src/watcher/`): a holder's wrapper against one store that keeps a
//! key with an expiry on its own clock (compare-and-extend, compare-and-delete, as the Redis
//! scripts do), and a contender that asks for the lock and runs its command as soon as it has
//! it. The holder takes its send instants, renews every R, sends the kill signal at V - D - K
//! and SIGKILL at V - D, gives back a grant that leaves too little; its watcher kills the job
//! of a SIGKILLed wrapper and a command whose exec comes past the start's point. The
//! environment delays, loses and reorders messages, pauses or SIGKILLs the wrapper, and lets
//! its clock fall a tick behind.

mod holder;
mod store;

use stateright::{Model, Property};

use crate::check::{Report, verify};
use crate::lease::{self, At, Job, LeaseClock, Renewal, Rules, Step, tick};
use crate::net::{self, Fault, Net};
use store::Msg;

const HOLDER: u8 = 0;
const CONTENDER: u8 = 1;
/// Requests the holder may have in flight; sending more loses the oldest.
const IN_FLIGHT: usize = 2;
/// Acquisition attempts of the contender (one out at a time).
const ATTEMPTS: u8 = 1;
/// Requests are told apart by a number modulo this (older ones are long lost or answered).
const SEQ: u8 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// The attempt `seq` is out; a grant proves V at `valid_until`.
    Acquiring {
        seq: u8,
        valid_until: At,
    },
    Holding,
    /// The job is gone and the release sent.
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    pub phase: Phase,
    pub token: u8,
    pub seq: u8,
    pub lease: Option<LeaseClock>,
    pub renewal: Option<Renewal>,
    pub job: Job,
    pub fence: u8,
    /// Its clock fell a tick behind (once).
    pub behind: bool,
    pub paused: bool,
    pub dead: bool,
    /// Paused while its kill point passed: what its job does now, the lease cannot see.
    pub blind: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The store: the key (token, expiry), the fence counter, the tokens buried.
    pub lock: Option<(u8, At)>,
    pub fence: u8,
    pub buried: Vec<u8>,
    pub net: Net<Msg>,
    pub h: Holder,
    /// The contender: attempts left; the V its attempt out would prove; its command's fence
    /// and kill point (V - D) while it runs (a contender that keeps no lease: it stops there).
    pub attempts: u8,
    pub asked: Option<At>,
    pub runs: Option<(u8, At)>,
    /// Pauses and wrapper SIGKILLs the environment may still make.
    pub faults: u8,
    /// Ghost: the largest fence granted, and whether a grant ever went below it.
    pub max_fence: u8,
    pub fence_back: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Tick,
    /// The holder's clock falls a tick behind the store's.
    FallBehind,
    ContenderAttempt,
    /// The contender's command is SIGKILLed at its kill point.
    ContenderStops,
    /// The holder's lease step (`LeaseClock::step`): renew, kill signal or SIGKILL.
    Keep(Step),
    RenewTimedOut,
    /// The kernel commits the command's exec.
    Exec,
    /// The watcher (or the wrapper) SIGKILLs a command still not exec'd at its start's point.
    StartGuard,
    JobEnds,
    Release,
    Deliver(Msg),
    Net(Fault),
    Pause,
    Resume,
    /// SIGKILL of the wrapper; its watcher, woken by the end of its pipe, kills the job.
    Crash,
}

pub struct LeaseModel {
    pub rules: Rules,
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // The holder's first attempt is on its way.
        let mut net = Net::new(1, 0);
        net.send(Msg::Acquire {
            c: HOLDER,
            token: 0,
            seq: 0,
        });
        vec![State {
            lock: None,
            fence: 0,
            buried: Vec::new(),
            net,
            h: Holder {
                phase: Phase::Acquiring {
                    seq: 0,
                    valid_until: lease::valid_from_send(),
                },
                token: 0,
                seq: 0,
                lease: None,
                renewal: None,
                job: Job::None,
                fence: 0,
                behind: false,
                paused: false,
                dead: false,
                blind: false,
            },
            attempts: ATTEMPTS,
            asked: None,
            runs: None,
            faults: 1,
            max_fence: 0,
            fence_back: false,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let h = &s.h;
        // Time passes only while no due step would be two ticks late.
        if self.due(h).is_none_or(|d| d >= 0)
            && self.watcher_due(h).is_none_or(|d| d >= 0)
            && s.runs.is_none_or(|(_, kill)| kill >= 0)
        {
            out.push(Action::Tick);
        }
        if s.runs.is_some_and(|(_, kill)| kill <= 0) {
            out.push(Action::ContenderStops);
        }
        // The contender asks (and is answered) with no delay: the worst case for the
        // holder, a grant the instant the store lets the key go, and a command started at once.
        let free = s.lock.is_none_or(|(_, exp)| exp <= 0);
        if s.runs.is_none() && s.attempts > 0 && free {
            out.push(Action::ContenderAttempt);
        }
        if !h.behind {
            out.push(Action::FallBehind);
        }
        if self.watcher_due(h).is_some_and(|d| d <= 0) {
            out.push(Action::StartGuard);
        }
        match h.job {
            Job::Starting { .. } => out.push(Action::Exec),
            Job::Running { .. } | Job::LateStart => out.push(Action::JobEnds),
            _ => {}
        }
        if !h.dead {
            if s.faults > 0 && h.phase != Phase::Done {
                out.push(Action::Pause);
                out.push(Action::Crash);
            }
            if h.paused {
                out.push(Action::Resume);
            } else if self.due(h).is_some_and(|d| d <= 0) {
                if h.renewal.is_some_and(|r| r.deadline <= 0) {
                    out.push(Action::RenewTimedOut);
                }
                if h.job == Job::Dead {
                    out.push(Action::Release);
                } else if let Some(l) = h.lease {
                    let step = l.clone().step(self.rules, h.renewal.is_some());
                    if !matches!(step, Step::Sleep(_)) {
                        out.push(Action::Keep(step));
                    }
                }
            }
        }
        for i in s.net.distinct() {
            let m = s.net.bag[i];
            if m.is_request() || m.client() == CONTENDER || !(h.paused || h.dead) {
                out.push(Action::Deliver(m));
            }
        }
        let mut faults = Vec::new();
        net::faults(&s.net, &mut faults);
        out.extend(faults.into_iter().map(Action::Net));
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        let h = &mut s.h;
        match a {
            Action::Tick => {
                s.lock = s.lock.map(|(t, exp)| (t, tick(exp)));
                s.asked = s.asked.map(tick);
                s.runs = s.runs.map(|(f, kill)| (f, tick(kill)));
                if let Some(l) = h.lease.as_mut() {
                    l.tick();
                }
                if let Some(r) = h.renewal.as_mut() {
                    r.tick();
                }
                if let Phase::Acquiring { valid_until, .. } = &mut h.phase {
                    *valid_until = tick(*valid_until);
                }
                h.job.tick();
                if h.paused
                    && h.job.inside()
                    && h.lease.is_some_and(|l| l.kill_point(self.rules) <= 0)
                {
                    h.blind = true;
                }
            }
            Action::FallBehind => {
                h.behind = true;
                if let Some(l) = h.lease.as_mut() {
                    l.behind();
                }
                if let Some(r) = h.renewal.as_mut() {
                    r.behind();
                }
                if let Phase::Acquiring { valid_until, .. } = &mut h.phase {
                    *valid_until = lease::behind(*valid_until);
                }
                h.job.behind();
            }
            Action::ContenderStops => s.runs = None,
            Action::ContenderAttempt => {
                s.attempts -= 1;
                s.asked = Some(lease::valid_from_send());
                Self::store(
                    &mut s,
                    Msg::Acquire {
                        c: CONTENDER,
                        token: 1,
                        seq: 0,
                    },
                );
                let i = s.net.bag.iter().position(|m| m.client() == CONTENDER)?;
                let reply = s.net.take(i);
                self.answer(&mut s, reply);
            }
            Action::Keep(_) => {
                let rules = self.rules;
                let renewing = h.renewal.is_some();
                let step = h.lease.as_mut().map(|l| l.step(rules, renewing));
                match step {
                    Some(Step::Terminate) => h.job.terminate(),
                    Some(Step::Kill) => h.job.kill(),
                    Some(Step::Renew) => {
                        h.seq = (h.seq + 1) % SEQ;
                        let r = Renewal::sent(h.seq, h.lease.as_ref().expect("held"));
                        h.renewal = Some(r);
                        let (token, seq) = (h.token, h.seq);
                        Self::send(&mut s, Msg::Renew { token, seq });
                    }
                    _ => return None,
                }
            }
            Action::RenewTimedOut => {
                // Its connection is dropped: an answer on it is never read, and the request,
                // should it still land, could only keep the key longer (taken as lost).
                s.h.renewal = None;
                s.net
                    .bag
                    .retain(|m| !matches!(m, Msg::Renew { .. } | Msg::Renewed { .. }));
                if let Some(l) = s.h.lease.as_mut() {
                    l.renew_failed();
                }
            }
            Action::Exec => h.job.exec(),
            Action::StartGuard => h.job.kill(),
            Action::JobEnds => h.job = Job::Dead,
            Action::Release => {
                h.phase = Phase::Done;
                h.renewal = None;
                let token = h.token;
                Self::send(&mut s, Msg::Release { token });
            }
            Action::Deliver(m) => {
                let i = s.net.bag.iter().position(|x| *x == m)?;
                s.net.take(i);
                match m.is_request() {
                    true => Self::store(&mut s, m),
                    false => self.answer(&mut s, m),
                }
            }
            Action::Net(f) => net::apply(&mut s.net, f),
            Action::Pause => {
                s.faults -= 1;
                h.paused = true;
            }
            Action::Resume => h.paused = false,
            Action::Crash => {
                s.faults -= 1;
                h.dead = true;
                if h.job == Job::None || !self.rules.no_watcher {
                    h.job.kill();
                    h.job = Job::Dead;
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one command at a time, but in a pause", |_, s: &State| {
                !(s.h.job.inside() && s.runs.is_some()) || s.h.blind
            }),
            Property::always("fences strictly increase", |_, s: &State| !s.fence_back),
            Property::always("overlapping commands ordered by fence", |_, s: &State| {
                !(s.h.job.inside() && s.runs.is_some())
                    || s.runs.is_some_and(|(f, _)| f > s.h.fence)
            }),
            Property::always("no command starts past its kill point", |_, s: &State| {
                s.h.job != Job::LateStart
            }),
            Property::sometimes("the contender runs after the holder", |_, s: &State| {
                s.runs.is_some() && s.h.fence > 0 && s.h.phase == Phase::Done
            }),
        ]
    }
}

#[derive(Clone, Copy)]
pub enum Mutation {
    FromReply,
    TermAtKillPoint,
    KillAtV,
    NoWatcher,
    NoStartGuard,
}

pub fn check() -> Report {
    verify(
        "lease clock",
        format!(
            "1 holder + 1 contender (attempts: {ATTEMPTS}), {}, 1 pause or wrapper SIGKILL, 1 message lost, {IN_FLIGHT} requests in flight",
            lease::bounds()
        ),
        |m| {
            let mut rules = Rules::default();
            match m {
                None => {}
                Some(Mutation::FromReply) => rules.from_reply = true,
                Some(Mutation::TermAtKillPoint) => rules.term_at_kill_point = true,
                Some(Mutation::KillAtV) => rules.kill_at_v = true,
                Some(Mutation::NoWatcher) => rules.no_watcher = true,
                Some(Mutation::NoStartGuard) => rules.no_start_guard = true,
            }
            LeaseModel { rules }
        },
        &[
            (Mutation::FromReply, "renewal timed from the reply"),
            (
                Mutation::TermAtKillPoint,
                "kill signal at V - D (SIGKILL K later)",
            ),
            (Mutation::KillAtV, "SIGKILL at V (no D for late timers)"),
            (Mutation::NoWatcher, "no watcher for a SIGKILLed wrapper"),
            (Mutation::NoStartGuard, "no guard on a late exec"),
        ],
    )
}
