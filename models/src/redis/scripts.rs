//! Model 1's scripts on the server, each one step: `may_take` and the shared newcomer's check
//! (`admits`), `acquire` (a grant, or a place in the queue, with its ghosts), and which waiters
//! see what the server let go (`changed`: the keep-alive tick, or a release's wake-up and the
//! holder's PTTL, as `Rules::asks` says).

use super::{Asks, How, Mode, Msg, Phase, RedisModel, State};

/// What the server let go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Change {
    /// A release or a give-back (which wake whose turn it is).
    Released,
    /// A holder's key lapsed.
    HolderLapsed,
    /// A waiter's place lapsed.
    PlaceLapsed,
}

impl RedisModel {
    /// `may_take` and the shared script's check: whether `token` may take a place now.
    pub(super) fn admits(&self, s: &State, token: u8, mode: Mode, how: How) -> bool {
        let excl_held = s.holders.iter().any(|&(_, m)| m == Mode::Exclusive);
        let free = match mode {
            Mode::Shared => !excl_held,
            Mode::Exclusive => {
                s.holders.len() < self.rules.limit as usize
                    && !s.holders.iter().any(|&(_, m)| m == Mode::Shared)
            }
        };
        if !free {
            return false;
        }
        let ahead: Vec<(u8, Mode)> = match s.queue.iter().position(|&(t, _)| t == token) {
            Some(i) => s.queue[..i].to_vec(),
            None => s.queue.clone(),
        };
        match (mode, how) {
            (_, How::Peek) if self.rules.peek_ignores_queue => true,
            (_, How::Peek) => match mode {
                // -n --shared: only when no exclusive run holds or waits.
                Mode::Shared => !s.queue.iter().any(|&(_, m)| m == Mode::Exclusive),
                Mode::Exclusive => s.queue.is_empty(),
            },
            _ if self.rules.ignore_queue => true,
            (Mode::Shared, How::Queue) => {
                self.rules.shared_passes_writer || !ahead.iter().any(|&(_, m)| m == Mode::Exclusive)
            }
            (Mode::Exclusive, How::Queue) => {
                let free_places = self.rules.limit as usize - s.holders.len();
                ahead.len() < free_places
            }
        }
    }

    pub(super) fn acquire(&self, s: &mut State, c: u8, token: u8) {
        let (mode, how) = (s.c[c as usize].mode, s.c[c as usize].how);
        if !self.rules.no_bury && s.buried.contains(&token) {
            return;
        }
        if s.holders.iter().any(|&(t, _)| t == token) {
            // Ours already: an earlier attempt whose answer was lost.
            s.net.send(Msg::Granted { c, token });
            return;
        }
        if self.admits(s, token, mode, how) {
            let free_places = self.rules.limit as usize - s.holders.len();
            s.holders.push((token, mode));
            let my_place = s.queue.iter().position(|&(t, _)| t == token);
            // Ghost: a live fair waiter queued before this grant's place (or any, when it has
            // none) was passed.
            let before = my_place.unwrap_or(s.queue.len());
            let live_ahead: Vec<Mode> = s.queue[..before]
                .iter()
                .filter(|&&(t, _)| {
                    s.c.iter()
                        .any(|x| x.token == t && x.phase == Phase::Waiting)
                })
                .map(|&(_, m)| m)
                .collect();
            s.passed |= match mode {
                // A shared run may go beside shared ones, never past a writer.
                Mode::Shared => live_ahead.contains(&Mode::Exclusive),
                // Of the free places, each waiter ahead should have had one first.
                Mode::Exclusive => live_ahead.len() >= free_places,
            };
            if let Some(i) = my_place {
                s.queue.remove(i);
            }
            if s.returned.contains(&token) {
                s.granted_given_back = true;
            }
            // An answer to a run that went on without it is never read.
            if s.c[c as usize].phase == Phase::Waiting {
                s.net.send(Msg::Granted { c, token });
            }
        } else if how == How::Queue && !s.queue.iter().any(|&(t, _)| t == token) {
            s.queue.push((token, mode));
        }
    }

    /// The server let something go: the waiters that will see it. With the keep-alive tick,
    /// every live waiter, at its next tick; else those a wake-up or a timer of theirs reaches.
    pub(super) fn changed(&self, s: &mut State, what: Change) {
        let all = match (self.rules.asks, what) {
            (Asks::Budget | Asks::Never, _) => false,
            (Asks::Tick, _) => true,
            (Asks::WokenAtHead, Change::HolderLapsed) => true,
            (Asks::WokenAtHead, Change::PlaceLapsed) => false,
            (Asks::WokenAtHead, Change::Released) => {
                if let Some(&(head, _)) = s.queue.first()
                    && let Some(c) = s.c.iter_mut().find(|c| c.token == head)
                {
                    c.news = true;
                }
                false
            }
        };
        if all {
            for c in s.c.iter_mut().filter(|c| c.phase == Phase::Waiting) {
                c.news = true;
            }
        }
    }
}
