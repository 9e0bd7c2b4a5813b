//! Model 6's wire and store: the messages between the wrappers and the store, and the store's
//! scripts as one step each (acquire: SET NX PX and INCR; renew: compare-and-PEXPIRE; release:
//! compare-and-DEL; give-back: compare-and-DEL with the token buried).

use super::{HOLDER, LeaseModel, State};
use crate::lease::{At, T};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Acquire {
        c: u8,
        token: u8,
        seq: u8,
    },
    Renew {
        token: u8,
        seq: u8,
    },
    Release {
        token: u8,
    },
    GiveBack {
        token: u8,
    },
    Granted {
        c: u8,
        token: u8,
        seq: u8,
        fence: u8,
    },
    Busy {
        c: u8,
    },
    Renewed {
        seq: u8,
        ours: bool,
    },
}

impl Msg {
    pub(super) fn client(&self) -> u8 {
        match *self {
            Msg::Acquire { c, .. } | Msg::Granted { c, .. } | Msg::Busy { c } => c,
            _ => HOLDER,
        }
    }

    pub(super) fn is_request(&self) -> bool {
        matches!(
            self,
            Msg::Acquire { .. } | Msg::Renew { .. } | Msg::Release { .. } | Msg::GiveBack { .. }
        )
    }
}

impl LeaseModel {
    /// The store's scripts: acquire (SET NX PX, INCR), renew (compare-and-PEXPIRE), release
    /// (compare-and-DEL), give-back (compare-and-DEL, and the token buried).
    pub(super) fn store(s: &mut State, m: Msg) {
        let live = s.lock.filter(|&(_, exp)| exp > 0);
        match m {
            Msg::Acquire { c, token, seq } => {
                let reply = match live {
                    _ if s.buried.contains(&token) => Msg::Busy { c },
                    Some((t, _)) if t == token => {
                        s.lock = Some((token, T as At));
                        Msg::Granted {
                            c,
                            token,
                            seq,
                            fence: s.fence,
                        }
                    }
                    Some(_) => Msg::Busy { c },
                    None => {
                        s.fence += 1;
                        s.fence_back |= s.fence <= s.max_fence;
                        s.max_fence = s.max_fence.max(s.fence);
                        s.lock = Some((token, T as At));
                        Msg::Granted {
                            c,
                            token,
                            seq,
                            fence: s.fence,
                        }
                    }
                };
                s.net.send(reply);
            }
            Msg::Renew { token, seq } => {
                let ours = matches!(live, Some((t, _)) if t == token);
                if ours {
                    s.lock = Some((token, T as At));
                }
                // An answer nobody waits for any more (its renewal timed out: the connection
                // was dropped) is never read: not sent.
                if s.h.renewal.is_some_and(|r| r.seq == seq) {
                    s.net.send(Msg::Renewed { seq, ours });
                }
            }
            Msg::Release { token } | Msg::GiveBack { token } => {
                if matches!(m, Msg::GiveBack { .. }) && !s.buried.contains(&token) {
                    s.buried.push(token);
                }
                if matches!(s.lock, Some((t, _)) if t == token) {
                    s.lock = None;
                }
            }
            _ => unreachable!(),
        }
    }
}
