//! Model 6's holder: when its wrapper's next step is due, how it sends (at most IN_FLIGHT
//! requests out: sending more loses the oldest), and what it makes of each answer (a grant that
//! leaves too little is given back, a renewal's answer moves V from its send, "not the owner"
//! sends the kill signal at once).

use super::store::Msg;
use super::{CONTENDER, HOLDER, Holder, IN_FLIGHT, LeaseModel, Phase, SEQ, State};
use crate::lease::{self, At, Job, LeaseClock, Step};

impl LeaseModel {
    /// When the holder's wrapper must act next (it may be a tick late, unless paused).
    pub(super) fn due(&self, h: &Holder) -> Option<At> {
        if h.dead || h.paused || h.phase != Phase::Holding {
            return None;
        }
        let mut due = h.lease.and_then(|l| l.due(self.rules, h.renewal.is_some()));
        if let Some(r) = h.renewal {
            due = Some(due.map_or(r.deadline, |d| d.min(r.deadline)));
        }
        if h.job == Job::Dead {
            due = Some(0);
        }
        due
    }

    /// The start guard, due whether or not the wrapper is paused (the watcher keeps it).
    pub(super) fn watcher_due(&self, h: &Holder) -> Option<At> {
        match h.job {
            Job::Starting { until, .. } if !self.rules.no_start_guard => Some(until),
            _ => None,
        }
    }

    pub(super) fn send(s: &mut State, m: Msg) {
        let mine = s.net.count(|x| x.is_request() && x.client() == HOLDER);
        if m.client() == HOLDER
            && mine >= IN_FLIGHT
            && let Some(i) = s
                .net
                .bag
                .iter()
                .position(|x| x.is_request() && x.client() == HOLDER)
        {
            s.net.take(i);
        }
        s.net.send(m);
    }

    pub(super) fn answer(&self, s: &mut State, m: Msg) {
        match m {
            Msg::Granted {
                c: CONTENDER,
                fence,
                ..
            } => {
                if let Some(v) = s.asked.take().filter(|&v| lease::enough_left(v)) {
                    s.runs = Some((fence, v - lease::D as At));
                }
            }
            Msg::Busy { .. } => {}
            Msg::Granted {
                token, seq, fence, ..
            } => {
                let h = &mut s.h;
                // Only the answer to the attempt in flight counts (a timed-out one's
                // connection was dropped).
                let Phase::Acquiring {
                    seq: asked,
                    valid_until,
                } = h.phase
                else {
                    return;
                };
                if token != h.token || seq != asked {
                    return;
                }
                if lease::enough_left(valid_until) {
                    let l = LeaseClock::new(valid_until);
                    h.phase = Phase::Holding;
                    h.fence = fence;
                    h.lease = Some(l);
                    h.job = Job::Starting {
                        until: l.term_point(self.rules),
                        kill: l.kill_point(self.rules),
                    };
                } else {
                    // Too late to run anything: given back; the next attempt has a fresh
                    // token (the give-back may land late). The model gives up after one.
                    let old = h.token;
                    if old >= 2 {
                        h.phase = Phase::Done;
                        Self::send(s, Msg::GiveBack { token: old });
                        return;
                    }
                    h.token += 2;
                    h.seq = (h.seq + 1) % SEQ;
                    h.phase = Phase::Acquiring {
                        seq: h.seq,
                        valid_until: lease::valid_from_send(),
                    };
                    let (token, seq) = (h.token, h.seq);
                    Self::send(s, Msg::GiveBack { token: old });
                    Self::send(
                        s,
                        Msg::Acquire {
                            c: HOLDER,
                            token,
                            seq,
                        },
                    );
                }
            }
            Msg::Renewed { seq, ours } => {
                let rules = self.rules;
                let h = &mut s.h;
                let Some(r) = h.renewal.filter(|r| r.seq == seq) else {
                    return;
                };
                h.renewal = None;
                if let Some(lease) = h.lease.as_mut() {
                    match ours {
                        true => lease.renewed(rules, r),
                        // Lost now: the kill signal at once, in the same wake-up.
                        false => {
                            lease.lost = true;
                            if lease.step(rules, false) == Step::Terminate {
                                h.job.terminate();
                            }
                        }
                    }
                }
            }
            _ => unreachable!(),
        }
    }
}
