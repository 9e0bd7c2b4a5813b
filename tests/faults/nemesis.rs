//! The nemesis: a thread that, until the pass's deadline, injects a seeded random fault into the
//! backend's servers or network every few hundred ms to few s, one at a time, and records each
//! with the instants it began and ended. An empty restart comes more than 2*T after the last
//! (Redlock's fence rule tolerates one server restarted empty at a time, so spaced). On every
//! backend it also plays the other users (`hostile.rs`): one in the metrics directory, and
//! one of the lock who writes junk into its history.

use std::time::{Duration, Instant};

use crate::backend::{Backend, Fault};
use crate::child::mono_ns;
use crate::hostile::{plant_far_since, plant_junk};
use crate::neighbour::Neighbour;
use crate::plan::TTL_MS;
use crate::rng::Rng;

#[derive(Clone, Debug)]
pub struct FaultEvent {
    pub fault: Fault,
    pub server: usize,
    pub began: u64,
    pub ended: u64,
    pub what: String,
}

impl FaultEvent {
    pub fn describe(&self) -> String {
        format!(
            "{} on server {} at {:.3}s ({})",
            self.fault.label(),
            self.server,
            self.began as f64 / 1e9,
            self.what
        )
    }
}

/// How long after a connection-level fault was set up it may still act (a delayed request
/// lands up to 1.5 s after a window of up to 3 s; a stalled one up to 1.5 s later).
const LINGER_MS: u64 = 5000;

/// How often the other users act, against the backend's own faults (a menu's weights sum to
/// some 70).
const NEIGHBOUR_WEIGHT: u64 = 10;
const JUNK_WEIGHT: u64 = 5;
const SINCE_WEIGHT: u64 = 5;

pub fn nemesis(
    backend: &dyn Backend,
    seed: u64,
    deadline: Instant,
    neighbour: &Neighbour,
    names: &[(&'static str, u32)],
) -> Vec<FaultEvent> {
    let mut rng = Rng::stream(seed, 0);
    let mut menu = backend.faults();
    menu.extend([
        (Fault::Neighbour, NEIGHBOUR_WEIGHT),
        (Fault::HistoryJunk, JUNK_WEIGHT),
        (Fault::FarSince, SINCE_WEIGHT),
    ]);
    let mut events = Vec::new();
    let weights: Vec<u64> = menu.iter().map(|(_, w)| *w).collect();
    let mut last_empty: Option<Instant> = None;
    loop {
        let pause = Duration::from_millis(rng.range(300, 3000));
        let fault = menu[rng.weighted(&weights)].0;
        let server = rng.range(0, backend.servers() as u64 - 1) as usize;
        // The fault's own draws come from a stream of their own, so a fault skipped below does
        // not shift the choices that follow.
        let mut fault_rng = Rng::new(rng.next_u64());
        if Instant::now() + pause >= deadline {
            break;
        }
        std::thread::sleep(pause);
        let spaced =
            last_empty.is_none_or(|t| t.elapsed() > Duration::from_millis(2 * TTL_MS + 1000));
        if fault == Fault::RestartEmpty && !spaced {
            continue;
        }
        let began = mono_ns();
        let what = match fault {
            Fault::Neighbour => neighbour.act(&mut fault_rng),
            Fault::HistoryJunk => plant_junk(backend, names, &mut fault_rng),
            Fault::FarSince => plant_far_since(backend, names, &mut fault_rng),
            _ => backend.inject(fault, server, &mut fault_rng),
        };
        if fault == Fault::RestartEmpty {
            last_empty = Some(Instant::now());
        }
        let connection_level = matches!(
            fault,
            Fault::DelayConn | Fault::Stall | Fault::BlackholeConn | Fault::Hostile
        );
        let ended = mono_ns()
            + if connection_level {
                LINGER_MS * 1_000_000
            } else {
                0
            };
        events.push(FaultEvent {
            fault,
            server,
            began,
            ended,
            what,
        });
    }
    backend.heal();
    events
}
