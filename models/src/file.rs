//! Model 5, `file://`'s fence (`src/file/fence.rs`, `reserve.rs`): runs one after another (the
//! flock serialises them), each raising the fence in steps: read the counter file and its
//! count (the extended attribute: boot, mount, file, block top, last token); if the count
//! holds, count one more (no sync) and issue it; else reserve a block from the `floor` (the
//! largest of the counter, the history's largest fence and the wall clock, `clock_us`: write a
//! temporary file, fsync, rename over the counter, fsync the directory), then set the count,
//! then issue floor + 1. A token is issued only once the clock has reached it
//! (`when_the_clock_reaches`), unless it is more than two blocks ahead (`WAIT_FOR_CLOCK_US`:
//! then at once). The clock is a bounded-rate clock, a token a tick, ticking at any moment, so
//! that a run that waits for it issues no token ahead of it. A block whose run was SIGKILLed
//! after its rename and before its count is reserved and never used: the next block starts
//! past it, a block further ahead of the clock; one such run is waited out, two in a row
//! within two blocks' ticks are not (the limit).
//! A run may be SIGKILLed between any two steps (the next run starts from what is on the
//! file); the host may lose power (a new boot; what was not synced is lost; the clock goes on);
//! the directory may be copied (`cp -a`: content and attributes, a new file) and restored from
//! the copy at any later time, within the same boot and mount, whatever was reserved since.
//! The history (`NAME.history`, in the same directory) keeps the largest fence issued, and is
//! copied and restored with the rest. A clock set back (the limit) may undo all of this.

use stateright::{Model, Property};

use crate::check::{Report, limit, verify};

/// Tokens a block reserves (1024 in the code).
const BLOCK: u8 = 3;
/// Tokens issued in all (a bound of the model).
const RUNS: u8 = 7;
/// Runs SIGKILLed mid-way (at any step).
const KILLS: u8 = 2;
/// The wall clock's last reading in the model (in tokens: the clock never issues faster).
const CLOCK_MAX: u8 = 14;
/// How far ahead of the clock a token is still waited for (`WAIT_FOR_CLOCK_US`).
const WAIT_FOR_CLOCK: u8 = 2 * BLOCK;

/// The count in the counter's extended attribute (`reserve::Record`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    pub boot: u8,
    /// The file it was set on (inode and device).
    pub file: u8,
    pub top: u8,
    pub last: u8,
}

/// The counter file as a reader sees it, and what a crash leaves of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Counter {
    pub file: u8,
    pub top: u8,
    pub record: Option<Record>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// Between runs.
    Idle,
    /// Read the counter and the count; the next token decided.
    Counting { next: u8, record: Record },
    /// The temporary file written and synced, not yet renamed.
    Written { top: u8 },
    /// Renamed over the counter, the directory not yet synced.
    Renamed { top: u8 },
    /// Reserved and synced, the count not yet set.
    Reserved { top: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub boot: u8,
    /// What a reader sees now (the page cache) and what the disk holds.
    pub seen: Counter,
    pub disk: Counter,
    pub history_max: u8,
    pub step: Step,
    /// `cp -a` of the directory: the counter (as seen) and the history.
    pub copy: Option<(Counter, u8)>,
    pub next_file: u8,
    pub issued: u8,
    pub max_issued: u8,
    pub repeated: bool,
    pub faults: u8,
    pub kills: u8,
    /// The wall clock (`clock_us`), in tokens.
    pub clock: u8,
    /// Runs that may still be SIGKILLed between their reservation's rename and their count.
    pub wasted: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A run (under the lock) reads the counter and its count.
    Read,
    /// The count set (no sync) and the token issued: the command starts with it.
    CountAndIssue,
    Rename,
    SyncDirectory,
    /// The count set on the new counter, and top + 1 issued.
    SetCountAndIssue,
    /// The run is SIGKILLed between steps.
    Kill,
    PowerCut,
    Copy,
    Restore,
    /// The wall clock ticks.
    Tick,
    /// The wall clock set back to 0 (the limit).
    StepBack,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// The count believed whenever boot (and mount) match, on any file (before the mend).
    pub any_file: bool,
    /// The history's largest fence ignored.
    pub no_history: bool,
    /// A new block's floor without the clock (before the mend).
    pub no_clock_floor: bool,
    /// A token issued before the clock has reached it.
    pub no_wait: bool,
    /// The clock may be set back once (a machine booted in 1970, a hand or NTP step).
    pub step_back: bool,
    /// Two runs (not one) may be SIGKILLed between their reservation's rename and their
    /// count: two blocks reserved and never used, faster than the clock.
    pub wasted_twice: bool,
}

pub struct FileModel {
    pub rules: Rules,
}

impl FileModel {
    /// `Record::holds`: this boot, this file, the top the file holds; a block not used up.
    fn counted(&self, s: &State) -> Option<Record> {
        let r = s.seen.record?;
        let same_file = self.rules.any_file || r.file == s.seen.file;
        (r.boot == s.boot && same_file && r.top == s.seen.top && r.last < r.top).then_some(r)
    }

    fn issue(&self, s: &mut State, token: u8) {
        s.repeated |= token <= s.max_issued;
        s.max_issued = s.max_issued.max(token);
        if !self.rules.no_history {
            s.history_max = s.history_max.max(token);
        }
        s.issued += 1;
        s.step = Step::Idle;
    }

    /// The floor the history gives: the next token is past the largest it shows.
    fn floor(&self, s: &State) -> u8 {
        if self.rules.no_history {
            0
        } else {
            s.history_max
        }
    }

    /// A new block's floor: the counter, the history, the clock (`raise_fence_locked`).
    fn block_floor(&self, s: &State) -> u8 {
        let floor = s.seen.top.max(self.floor(s));
        match self.rules.no_clock_floor {
            true => floor,
            false => floor.max(s.clock),
        }
    }

    /// Whether the next run's read reserves a block (its count is not believed, or used up).
    fn reserves(&self, s: &State) -> bool {
        self.counted(s)
            .is_none_or(|r| (r.last + 1).max(self.floor(s) + 1) > r.top)
    }

    /// `when_the_clock_reaches`: whether `token` may be issued now.
    fn clock_reached(&self, s: &State, token: u8) -> bool {
        self.rules.no_wait || token <= s.clock || token - s.clock > WAIT_FOR_CLOCK
    }
}

impl Model for FileModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let none = Counter {
            file: 0,
            top: 0,
            record: None,
        };
        vec![State {
            boot: 0,
            seen: none,
            disk: none,
            history_max: 0,
            step: Step::Idle,
            copy: None,
            next_file: 1,
            issued: 0,
            max_issued: 0,
            repeated: false,
            faults: match self.rules.step_back {
                true => 3,
                false => 2,
            },
            kills: KILLS,
            clock: 1,
            wasted: match self.rules.wasted_twice {
                true => 2,
                false => 1,
            },
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        match s.step {
            Step::Idle if s.issued < RUNS => out.push(Action::Read),
            Step::Idle => {}
            Step::Counting { next, .. } if self.clock_reached(s, next) => {
                out.push(Action::CountAndIssue)
            }
            Step::Counting { .. } => {}
            Step::Written { .. } => out.push(Action::Rename),
            Step::Renamed { .. } => out.push(Action::SyncDirectory),
            Step::Reserved { top } if self.clock_reached(s, top + 1 - BLOCK) => {
                out.push(Action::SetCountAndIssue)
            }
            Step::Reserved { .. } => {}
        }
        if s.clock < CLOCK_MAX {
            out.push(Action::Tick);
        }
        if self.rules.step_back && s.faults > 0 && s.clock > 0 {
            out.push(Action::StepBack);
        }
        let wastes = matches!(s.step, Step::Renamed { .. } | Step::Reserved { .. });
        if s.step != Step::Idle && s.kills > 0 && (!wastes || s.wasted > 0) {
            out.push(Action::Kill);
        }
        if s.faults > 0 {
            out.push(Action::PowerCut);
            // A backup (of the counter as it stands: mid-run it is one of the states a
            // run leaves).
            if s.copy.is_none() {
                out.push(Action::Copy);
            }
        }
        if s.copy.is_some() && s.faults > 0 {
            out.push(Action::Restore);
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            // The count not believed, used up, or the history past it: a new block.
            Action::Read if self.reserves(&s) => {
                let top = self.block_floor(&s) + BLOCK;
                s.step = Step::Written { top };
            }
            Action::Read => {
                let record = self.counted(&s)?;
                let next = (record.last + 1).max(self.floor(&s) + 1);
                s.step = Step::Counting { next, record };
            }
            Action::CountAndIssue => {
                let Step::Counting { next, record } = s.step else {
                    return None;
                };
                s.seen.record = Some(Record {
                    last: next,
                    ..record
                });
                self.issue(&mut s, next);
            }
            Action::Rename => {
                let Step::Written { top } = s.step else {
                    return None;
                };
                s.seen = Counter {
                    file: s.next_file,
                    top,
                    record: None,
                };
                s.next_file += 1;
                s.step = Step::Renamed { top };
            }
            Action::SyncDirectory => {
                let Step::Renamed { top } = s.step else {
                    return None;
                };
                s.disk = s.seen;
                s.step = Step::Reserved { top };
            }
            Action::SetCountAndIssue => {
                let Step::Reserved { top } = s.step else {
                    return None;
                };
                let next = top + 1 - BLOCK;
                s.seen.record = Some(Record {
                    boot: s.boot,
                    file: s.seen.file,
                    top,
                    last: next,
                });
                self.issue(&mut s, next);
            }
            Action::Kill => {
                if matches!(s.step, Step::Renamed { .. } | Step::Reserved { .. }) {
                    s.wasted -= 1;
                }
                s.kills -= 1;
                s.step = Step::Idle;
            }
            Action::PowerCut => {
                s.faults -= 1;
                s.boot += 1;
                // What was not synced is lost: the counter as the disk has it; its count (an
                // attribute set without sync) may have reached the disk or not: a new boot's
                // runs never believe it anyway.
                s.seen = s.disk;
                s.step = Step::Idle;
            }
            Action::Copy => {
                s.faults -= 1;
                s.copy = Some((s.seen, s.history_max));
            }
            Action::Restore => {
                s.faults -= 1;
                let (counter, history) = s.copy.take()?;
                // cp -a: the same content and attributes in a new file.
                s.seen = Counter {
                    file: s.next_file,
                    ..counter
                };
                s.next_file += 1;
                s.disk = s.seen;
                s.history_max = history;
                s.step = Step::Idle;
            }
            Action::Tick => s.clock += 1,
            Action::StepBack => {
                s.faults -= 1;
                s.clock = 0;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("fences strictly increase", |_, s: &State| !s.repeated),
            Property::sometimes("every run got a fence", |_, s: &State| s.issued == RUNS),
        ]
    }
}

#[derive(Clone, Copy)]
pub enum Mutation {
    AnyFile,
    NoClockFloor,
    NoWait,
}

pub fn check() -> Report {
    let mut report = verify(
        "file://",
        format!(
            "{RUNS} runs, blocks of {BLOCK}, the clock up to {CLOCK_MAX} (a token waits for it up to {WAIT_FOR_CLOCK} ahead), {KILLS} runs SIGKILLed between any two steps (1 of them between a reservation's rename and its count), 2 of: power cut, a copy of DIR, its restore (at any later time)"
        ),
        |m| {
            let mut rules = Rules::default();
            match m {
                None => {}
                Some(Mutation::AnyFile) => {
                    rules.any_file = true;
                    rules.no_history = true;
                }
                Some(Mutation::NoClockFloor) => rules.no_clock_floor = true,
                Some(Mutation::NoWait) => rules.no_wait = true,
            }
            FileModel { rules }
        },
        &[
            (Mutation::AnyFile, "a fence count believed after a restore"),
            (
                Mutation::NoClockFloor,
                "a block without the wall-clock floor",
            ),
            (
                Mutation::NoWait,
                "a token issued before the clock reaches it",
            ),
        ],
    );
    limit(
        &mut report,
        "two blocks reserved and never used, in two blocks' ticks",
        FileModel {
            rules: Rules {
                wasted_twice: true,
                ..Rules::default()
            },
        },
    );
    limit(
        &mut report,
        "the wall clock set back past the copy's time",
        FileModel {
            rules: Rules {
                step_back: true,
                ..Rules::default()
            },
        },
    );
    report
}
