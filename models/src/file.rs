//! Model 5, `file://`'s fence (`src/file/fence.rs`, `reserve.rs`): runs one after another (the
//! flock serialises them), each raising the fence in steps: read the counter file and its
//! count (the extended attribute: boot, mount, file, block top, last token); if the count
//! holds, count one more (no sync) and issue it; else reserve a block (write a temporary file,
//! fsync, rename over the counter, fsync the directory), then set the count, then issue top + 1.
//! A run may be SIGKILLed between any two steps (the next run starts from what is on the
//! file); the host may lose power (a new boot; what was not synced is lost); the directory may
//! be copied (`cp -a`: content and attributes, a new file) and later restored from the copy,
//! within the same boot and mount. The history (`NAME.history`, in the same directory) keeps
//! the largest fence issued, and is copied and restored with the rest.

use stateright::{Model, Property};

use crate::check::{Report, limit, verify};

/// Tokens a block reserves (1024 in the code).
const BLOCK: u8 = 3;
/// Tokens issued in all (a bound of the model).
const RUNS: u8 = 7;
/// Runs SIGKILLed mid-way (at any step).
const KILLS: u8 = 2;

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
    /// A block was reserved (synced) since the copy was taken.
    pub reserved_since_copy: bool,
    pub next_file: u8,
    pub issued: u8,
    pub max_issued: u8,
    pub repeated: bool,
    pub faults: u8,
    pub kills: u8,
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
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// The count believed whenever boot (and mount) match, on any file (before the mend).
    pub any_file: bool,
    /// The history's largest fence ignored.
    pub no_history: bool,
    /// Copies may be taken at any time, also before a block reservation that runs use later.
    pub old_copies: bool,
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
            reserved_since_copy: false,
            next_file: 1,
            issued: 0,
            max_issued: 0,
            repeated: false,
            faults: 2,
            kills: KILLS,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        match s.step {
            Step::Idle if s.issued < RUNS => out.push(Action::Read),
            Step::Idle => {}
            Step::Counting { .. } => out.push(Action::CountAndIssue),
            Step::Written { .. } => out.push(Action::Rename),
            Step::Renamed { .. } => out.push(Action::SyncDirectory),
            Step::Reserved { .. } => out.push(Action::SetCountAndIssue),
        }
        if s.step != Step::Idle && s.kills > 0 {
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
        if s.copy.is_some() && s.faults > 0 && (self.rules.old_copies || !s.reserved_since_copy) {
            out.push(Action::Restore);
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut s = s.clone();
        match a {
            Action::Read => match self.counted(&s) {
                Some(record) => {
                    let next = (record.last + 1).max(self.floor(&s) + 1);
                    if next > record.top {
                        // The history is past this block: reserve from beyond it.
                        let top = next - 1 + BLOCK;
                        s.step = Step::Written { top };
                    } else {
                        s.step = Step::Counting { next, record };
                    }
                }
                None => {
                    let from = s.seen.top.max(self.floor(&s));
                    s.step = Step::Written { top: from + BLOCK };
                }
            },
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
                s.reserved_since_copy = true;
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
                s.reserved_since_copy = false;
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
}

pub fn check() -> Report {
    let mut report = verify(
        "file://",
        format!(
            "{RUNS} runs, blocks of {BLOCK}, {KILLS} runs SIGKILLed between any two steps, 2 of: power cut, a copy of DIR, its restore (no block reserved in between)"
        ),
        |m| {
            let mut rules = Rules::default();
            if let Some(Mutation::AnyFile) = m {
                rules.any_file = true;
                rules.no_history = true;
            }
            FileModel { rules }
        },
        &[(Mutation::AnyFile, "a fence count believed after a restore")],
    );
    limit(
        &mut report,
        "a copy older than a reservation restored",
        FileModel {
            rules: Rules {
                old_copies: true,
                ..Rules::default()
            },
        },
    );
    report
}
