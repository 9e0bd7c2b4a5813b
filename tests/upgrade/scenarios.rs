//! The states whose layout is recorded: each is made by real `locked-run` processes of one build
//! (the release being recorded, or this one), on a NAME of its own, and kept until the layout
//! has been read: a held lock, a `--holders 2` lock with both slots taken, two `--shared`
//! holders, a holder with a waiter queued behind it, and a lock taken and released.

use std::time::Duration;

use crate::support::*;

pub struct Scenario {
    /// Its key in the fixtures; its NAME is `layout-KEY`.
    pub key: &'static str,
    /// The options of each holder, started one after the other, each kept running.
    pub holders: &'static [&'static [&'static str]],
    /// A run that waits behind them (in the queue, where the backend has one).
    pub waiter: bool,
    /// A run that takes the lock and releases it, before anything else.
    pub released: bool,
}

pub const SCENARIOS: [Scenario; 5] = [
    Scenario {
        key: "held",
        holders: &[&[]],
        waiter: false,
        released: false,
    },
    Scenario {
        key: "holders",
        holders: &[&["--holders", "2"], &["--holders", "2"]],
        waiter: false,
        released: false,
    },
    Scenario {
        key: "shared",
        holders: &[&["--shared"], &["--shared"]],
        waiter: false,
        released: false,
    },
    Scenario {
        key: "queue",
        holders: &[&[]],
        waiter: true,
        released: false,
    },
    Scenario {
        key: "released",
        holders: &[],
        waiter: false,
        released: true,
    },
];

impl Scenario {
    pub fn name(&self) -> String {
        format!("layout-{}", self.key)
    }
}

/// A scenario's processes, in the state it describes until [`Staged::end`].
pub struct Staged {
    holders: Vec<Holder>,
    waiter: Option<Running>,
}

/// Puts `scenario` in place with the binary `bin` on `url`; `queued` says when the waiter has
/// its place (evidence read from the store, not a sleep).
pub fn stage(bin: &str, url: &str, scenario: &Scenario, queued: impl Fn() -> bool) -> Staged {
    let name = scenario.name();
    if scenario.released {
        lr_of(bin).url(url).name(&name).sh("true").run().expect(0);
    }
    let holders = scenario
        .holders
        .iter()
        .map(|extra| Holder::with(lr_of(bin).url(url).args(*extra), &name))
        .collect();
    let waiter = scenario.waiter.then(|| {
        let waiter = lr_of(bin).url(url).name(&name).sh("true").spawn();
        wait_until("the waiter queued", Duration::from_secs(10), queued);
        waiter
    });
    Staged { holders, waiter }
}

impl Staged {
    /// Lets the holders end, then the waiter (which then takes the lock and ends): all 0.
    pub fn end(self) {
        for holder in self.holders {
            holder.finish().expect(0);
        }
        if let Some(waiter) = self.waiter {
            waiter.wait().expect(0);
        }
    }
}
