//! Model 1's configurations (shared and exclusive; the same for liveness; `--holders 2` with
//! `-n`) and the mutations each must refute.

use super::{ATTEMPTS, Asks, CLIENTS, How, Mode, RedisModel, Rules};
use crate::check::{Report, verify};

#[derive(Clone, Copy)]
pub enum Mutation {
    NoBury,
    SharedPassesWriter,
    PeekIgnoresQueue,
    ReleaseWithoutCompare,
    IgnoreQueue,
    WokenAtHead,
    WakesNoOne,
}

fn make(limit: u8, clients: Vec<(Mode, How)>, m: Option<Mutation>) -> RedisModel {
    let mut rules = Rules {
        limit,
        ..Rules::default()
    };
    match m {
        None => {}
        Some(Mutation::NoBury) => rules.no_bury = true,
        Some(Mutation::SharedPassesWriter) => rules.shared_passes_writer = true,
        Some(Mutation::PeekIgnoresQueue) => rules.peek_ignores_queue = true,
        Some(Mutation::ReleaseWithoutCompare) => rules.release_without_compare = true,
        Some(Mutation::IgnoreQueue) => rules.ignore_queue = true,
        Some(Mutation::WokenAtHead) => rules.asks = Asks::WokenAtHead,
        Some(Mutation::WakesNoOne) => rules.asks = Asks::Never,
    }
    RedisModel {
        rules,
        clients,
        attempts: ATTEMPTS,
        losses: 1,
        dups: 1,
        faults: 2,
    }
}

/// The liveness configuration: a waiter asks once, then after each change it could see; one
/// message lost, one waiter SIGKILLed or giving up.
fn live(clients: Vec<(Mode, How)>, m: Option<Mutation>) -> RedisModel {
    let mut model = make(1, clients, m);
    if model.rules.asks == Asks::Budget {
        model.rules.asks = Asks::Tick;
    }
    model.attempts = 1;
    model.dups = 0;
    model.faults = 1;
    model
}

pub fn check() -> Vec<Report> {
    use How::*;
    use Mode::*;
    let first = verify(
        "redis: shared + exclusive",
        format!(
            "{CLIENTS} runs (shared, exclusive, shared; fair), {ATTEMPTS} attempts each, 1 loss, 1 duplicate, 2 faults: waiters SIGKILLed or giving up"
        ),
        |m| {
            make(
                1,
                vec![(Shared, Queue), (Exclusive, Queue), (Shared, Queue)],
                m,
            )
        },
        &[
            (Mutation::NoBury, "a give-back that does not bury its token"),
            (
                Mutation::SharedPassesWriter,
                "a shared newcomer passing a queued writer",
            ),
            (
                Mutation::ReleaseWithoutCompare,
                "release without compare (plain DEL)",
            ),
            (Mutation::IgnoreQueue, "a grant that ignores the queue"),
        ],
    );
    vec![
        first,
        verify(
            "redis: waiters run",
            format!(
                "{CLIENTS} runs (shared, exclusive, shared; fair), each asking once, then after each release, give-back, lapse or lost answer; 1 loss, 1 fault: a waiter SIGKILLed or giving up"
            ),
            |m| {
                live(
                    vec![(Shared, Queue), (Exclusive, Queue), (Shared, Queue)],
                    m,
                )
            },
            &[
                (
                    Mutation::WokenAtHead,
                    "no tick or keep-alive timer: the release wakes the head",
                ),
                (
                    Mutation::WakesNoOne,
                    "a release that wakes no one (waiters sleep until woken)",
                ),
            ],
        ),
        verify(
            "redis: --holders 2, -n",
            format!(
                "{CLIENTS} runs (two fair, one -n), --holders 2, {ATTEMPTS} attempts each, 1 loss, 1 duplicate, 2 faults: waiters SIGKILLed or giving up"
            ),
            |m| {
                make(
                    2,
                    vec![(Exclusive, Queue), (Exclusive, Queue), (Exclusive, Peek)],
                    m,
                )
            },
            &[
                (
                    Mutation::PeekIgnoresQueue,
                    "-n taking a place while waiters queue",
                ),
                (Mutation::NoBury, "a give-back that does not bury its token"),
            ],
        ),
    ]
}
