//! The lease clock as every lease model runs it, in ticks: `LeaseClock::step` mirrors
//! `src/lease.rs` (V = s + T - D from the send instant s; the kill signal at V - D - K; SIGKILL
//! at V - D; "not the owner" stops at once), and `Job` is the command's session as the wrapper
//! and the watcher stop it. The rules' known-bad variants are `Rules`' flags.
//!
//! Time: one global tick is the store's clock. A wrapper reads its own clock, the store's less
//! a lag of 0 or 1 tick that may change at any moment: any interval it measures is off by at
//! most 1 tick, less than D = 2 (the drift the lease clock allows). A wrapper's due step may
//! come up to 1 tick late (a late timer, less than D) unless the wrapper is paused, when it
//! may come any time later or never (the pause the lease cannot see).

/// The lease's timings in ticks: T = 9, R = 2, K = 2, D = 2 (R + K < T - 2D, as `Timings::new`
/// demands).
pub const T: u8 = 9;
pub const R: u8 = 2;
pub const K: u8 = 2;
pub const D: u8 = 2;

pub fn bounds() -> String {
    format!("T={T} R={R} K={K} D={D} ticks, a clock falls 1 behind once, timers late <= 1")
}

/// The known-bad variants of the lease clock itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rules {
    /// V counted from the renewal's reply instead of its send.
    pub from_reply: bool,
    /// The kill signal at V - D (so SIGKILL only at V - D + K).
    pub term_at_kill_point: bool,
    /// SIGKILL at V, leaving no D for late timers.
    pub kill_at_v: bool,
    /// No watcher: a SIGKILLed wrapper's job runs on.
    pub no_watcher: bool,
    /// Nobody stops a command whose exec comes past the start's point (V - D - K).
    pub no_start_guard: bool,
}

/// A time, in ticks from now on its owner's clock (the store's, or a wrapper's): what is due
/// at 0 or less is due now; -1 is a tick late; `PAST` stands for anything longer ago.
pub type At = i8;
pub const PAST: At = -2;

/// A tick passes: `at` comes one nearer.
pub fn tick(at: At) -> At {
    (at - 1).max(PAST)
}

/// The clock reading `at` falls a tick behind: what is still to come is a tick further.
pub fn behind(at: At) -> At {
    if at > PAST { at + 1 } else { at }
}

/// Where the stop of the job stands (`lease::Stop`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stop {
    Running,
    Terminating { kill_at: At },
    Killed,
}

/// What the keeper must do now (`lease::Step`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    Terminate,
    Kill,
    Renew,
    /// Nothing until then (`None`: ever).
    Sleep(Option<At>),
}

/// `lease::LeaseClock`, in ticks from now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseClock {
    pub valid_until: At,
    pub next_renewal: At,
    pub lost: bool,
    pub stop: Stop,
}

/// A renewal in flight: what it proves if it succeeds (V and the next renewal, counted from
/// its send), and when it times out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Renewal {
    pub seq: u8,
    pub valid_until: At,
    pub next_renewal: At,
    pub deadline: At,
}

impl Renewal {
    /// A renewal sent now: it times out after min(R/2, V - now), at least a tick.
    pub fn sent(seq: u8, lease: &LeaseClock) -> Renewal {
        Renewal {
            seq,
            valid_until: valid_from_send(),
            next_renewal: R as At,
            deadline: (R as At / 2).min(lease.valid_until).max(1),
        }
    }

    pub fn tick(&mut self) {
        self.valid_until = tick(self.valid_until);
        self.next_renewal = tick(self.next_renewal);
        self.deadline = tick(self.deadline);
    }

    pub fn behind(&mut self) {
        self.valid_until = behind(self.valid_until);
        self.next_renewal = behind(self.next_renewal);
        self.deadline = behind(self.deadline);
    }
}

/// V = s + T - D for a request sent now: the only place V is computed.
pub fn valid_from_send() -> At {
    (T - D) as At
}

impl LeaseClock {
    /// A lease granted by a request sent when `valid_until` was T - D ahead.
    pub fn new(valid_until: At) -> LeaseClock {
        LeaseClock {
            valid_until,
            next_renewal: valid_until - (T - D) as At + R as At,
            lost: false,
            stop: Stop::Running,
        }
    }

    pub fn tick(&mut self) {
        self.valid_until = tick(self.valid_until);
        self.next_renewal = tick(self.next_renewal);
        if let Stop::Terminating { kill_at } = &mut self.stop {
            *kill_at = tick(*kill_at);
        }
    }

    pub fn behind(&mut self) {
        self.valid_until = behind(self.valid_until);
        self.next_renewal = behind(self.next_renewal);
        if let Stop::Terminating { kill_at } = &mut self.stop {
            *kill_at = behind(*kill_at);
        }
    }

    /// The renewal `r` succeeded, answered now.
    pub fn renewed(&mut self, rules: Rules, r: Renewal) {
        let from = match rules.from_reply {
            true => valid_from_send(),
            false => r.valid_until,
        };
        self.valid_until = self.valid_until.max(from);
        self.next_renewal = r.next_renewal;
    }

    /// A renewal attempt failed now: retried at once (the back-off is under a tick).
    pub fn renew_failed(&mut self) {
        self.next_renewal = 0;
    }

    pub fn kill_point(&self, rules: Rules) -> At {
        match rules.kill_at_v {
            true => self.valid_until,
            false => (self.valid_until - D as At).max(PAST),
        }
    }

    /// V - D - K: the kill signal, and the point a command must not start past.
    pub fn term_point(&self, rules: Rules) -> At {
        match rules.term_at_kill_point {
            true => self.kill_point(rules),
            false => (self.kill_point(rules) - K as At).max(PAST),
        }
    }

    /// What to do now (`LeaseClock::step`); `renewing`: a renewal is in flight.
    pub fn step(&mut self, rules: Rules, renewing: bool) -> Step {
        let kill_point = self.kill_point(rules);
        match self.stop {
            Stop::Running => {
                // Past V - D with no kill signal sent: SIGKILL at once. (The mutation that
                // sends the kill signal at V - D moves SIGKILL K later.)
                if kill_point <= 0 && !rules.term_at_kill_point {
                    self.stop = Stop::Killed;
                    return Step::Kill;
                }
                if self.lost {
                    self.stop = Stop::Terminating {
                        kill_at: (K as At).min(kill_point),
                    };
                    return Step::Terminate;
                }
                if self.term_point(rules) <= 0 {
                    let kill_at = match rules.term_at_kill_point {
                        true => K as At,
                        false => kill_point,
                    };
                    self.stop = Stop::Terminating { kill_at };
                    return Step::Terminate;
                }
            }
            Stop::Terminating { kill_at } => {
                if kill_at <= 0 {
                    self.stop = Stop::Killed;
                    return Step::Kill;
                }
            }
            Stop::Killed => {}
        }
        let due = !renewing && !self.lost;
        if due && self.next_renewal <= 0 {
            return Step::Renew;
        }
        let mut wake: Option<At> = None;
        let mut at = |t: At| wake = Some(wake.map_or(t, |w| w.min(t)));
        if due {
            at(self.next_renewal);
        }
        match self.stop {
            Stop::Running => {
                at(self.term_point(rules));
                at(kill_point);
            }
            Stop::Terminating { kill_at } => at(kill_at),
            Stop::Killed => {}
        }
        Step::Sleep(wake)
    }

    /// When its next step is (or was) due: 0 or less is now, -1 a tick late.
    pub fn due(&self, rules: Rules, renewing: bool) -> Option<At> {
        let mut due: Option<At> = None;
        let mut at = |t: At| due = Some(due.map_or(t, |d| d.min(t)));
        if !renewing && !self.lost {
            at(self.next_renewal);
        }
        match self.stop {
            Stop::Running => {
                at(self.term_point(rules));
                at(self.kill_point(rules));
            }
            Stop::Terminating { kill_at } => at(kill_at),
            Stop::Killed => {}
        }
        due
    }
}

/// Whether a grant whose V is `valid_until` from now leaves enough to run: R + K + D of the
/// lease (`Waiter::answered`); else it is given back.
pub fn enough_left(valid_until: At) -> bool {
    valid_until >= (R + K + D) as At
}

/// The job: the command's session, from its clone to its last process's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Job {
    None,
    /// Cloned, not yet exec'd: it must not exec past `until` (the term point at the grant)
    /// nor at all past `kill` (V - D).
    Starting {
        until: At,
        kill: At,
    },
    /// Running: `termed` once it got the kill signal (it may ignore it: only SIGKILL is sure).
    Running {
        termed: bool,
    },
    /// Exec'd past V - D.
    LateStart,
    Dead,
}

impl Job {
    /// A command inside the lock: exec'd and not yet dead.
    pub fn inside(self) -> bool {
        matches!(self, Job::Running { .. } | Job::LateStart)
    }

    /// SIGKILL to every process of the session (a child still starting dies too).
    pub fn kill(&mut self) {
        if !matches!(self, Job::None) {
            *self = Job::Dead;
        }
    }

    pub fn terminate(&mut self) {
        if let Job::Running { termed } = self {
            *termed = true;
        }
    }

    pub fn tick(&mut self) {
        if let Job::Starting { until, kill } = self {
            *until = tick(*until);
            *kill = tick(*kill);
        }
    }

    pub fn behind(&mut self) {
        if let Job::Starting { until, kill } = self {
            *until = behind(*until);
            *kill = behind(*kill);
        }
    }

    /// The kernel commits the exec now.
    pub fn exec(&mut self) {
        if let Job::Starting { kill, .. } = *self {
            *self = match kill <= 0 {
                true => Job::LateStart,
                false => Job::Running { termed: false },
            };
        }
    }
}
