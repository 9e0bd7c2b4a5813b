//! The recorded history of one pass, as the checker reads it: the children's records (one
//! section per run, from `start` to `end`/`term`/`dead`), the SQLite `writes` table, the
//! wrappers the clients waited on, and the nemesis's faults; and the violations found in it.

use std::collections::BTreeMap;
use std::process::Command;

use crate::backend::Fault;
use crate::client::Wrapper;
use crate::nemesis::FaultEvent;

/// How late an observer's `dead` record may come after the death it reports: its wake-up on
/// end of file waits for a core, which two loaded cores may take this long to give. An overlap
/// that a `dead` record alone makes, and shorter than this, cannot be told from that lag.
pub const DEAD_LAG_NS: u64 = 150_000_000;

/// One run's command, from its records.
#[derive(Clone, Debug, Default)]
pub struct Section {
    pub run: u64,
    pub name: String,
    pub fence: u64,
    pub pid: i32,
    pub start: u64,
    /// `end` or `term`: written by the command itself just before it exits.
    pub end: Option<u64>,
    /// `dead`: written by its observer once it was gone.
    pub dead: Option<u64>,
    /// The last record the command wrote itself (it was alive then).
    pub last: u64,
    /// `LOCKED_RUN_HOLDERS` as the command saw it, and `s` after it when `LOCKED_RUN_SHARED`
    /// was 1.
    pub holders_env: String,
    pub inner_spawned: Option<(u64, i32)>,
    pub inner_exit: Option<(u64, i64)>,
    /// The processes of a shape of their own the command started (`shapes.rs`), by pid.
    pub grand: BTreeMap<i32, Grand>,
}

/// A process the command started that left its group (or, a daemon, its session).
#[derive(Clone, Debug, Default)]
pub struct Grand {
    pub pid: i32,
    /// `plain` (under `timeout` or `set -m`), `setpgid` or `daemon`.
    pub mode: String,
    pub start: u64,
    /// `gend` or `gterm`: written by the process itself just before it exits.
    pub end: Option<u64>,
    /// `gterm`: it was stopped by a signal.
    pub termed: bool,
    /// `gdead`: written by its observer once it was gone.
    pub dead: Option<u64>,
    pub last: u64,
}

impl Grand {
    pub fn daemon(&self) -> bool {
        self.mode == "daemon"
    }

    /// When it was certainly gone (None: no record says).
    pub fn gone(&self) -> Option<u64> {
        match (self.end, self.dead) {
            (Some(e), Some(d)) => Some(e.min(d)),
            (e, d) => e.or(d),
        }
    }

    /// As [`Section::end_for_overlap`].
    pub fn end_for_overlap(&self) -> Option<u64> {
        match (self.end, self.dead) {
            (Some(e), _) => Some(e),
            (None, Some(d)) => Some(d.saturating_sub(DEAD_LAG_NS).max(self.last)),
            (None, None) => None,
        }
    }
}

impl Section {
    /// Whether the command ran `--shared`.
    pub fn shared(&self) -> bool {
        self.holders_env.ends_with('s')
    }

    /// When the command was certainly gone (None: no record says).
    pub fn gone(&self) -> Option<u64> {
        match (self.end, self.dead) {
            (Some(e), Some(d)) => Some(e.min(d)),
            (e, d) => e.or(d),
        }
    }

    /// The end of the interval the exclusion checks use: the command's own last word, or its
    /// observer's less the observer's possible lag (never before its own last record).
    pub fn end_for_overlap(&self) -> Option<u64> {
        match (self.end, self.dead) {
            (Some(e), _) => Some(e),
            (None, Some(d)) => Some(d.saturating_sub(DEAD_LAG_NS).max(self.last)),
            (None, None) => None,
        }
    }

    /// The end of the whole job's interval: the command's, or that of the last process it
    /// started that stayed in its session (a daemon is not the job's), if later. None when an
    /// end of any of them is not on record.
    pub fn job_end_for_overlap(&self) -> Option<u64> {
        self.grand
            .values()
            .filter(|g| !g.daemon())
            .map(Grand::end_for_overlap)
            .chain([self.end_for_overlap()])
            .try_fold(0, |latest, end| end.map(|e| e.max(latest)))
    }
}

/// One row of the `writes` table, in commit order.
#[derive(Clone, Debug)]
pub struct Write {
    pub run: u64,
    pub name: String,
    pub fence: u64,
    pub changed: i64,
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub invariant: &'static str,
    pub name: String,
    pub detail: String,
    /// Why it is beyond the guarantee (an empty restart, a fault), when it is.
    pub excused: Option<String>,
}

/// Everything the checker reads.
pub struct History {
    pub sections: BTreeMap<u64, Section>,
    pub writes: Vec<Write>,
    pub wrappers: BTreeMap<u64, Wrapper>,
    pub faults: Vec<FaultEvent>,
    /// Steps of the wall clock (the servers' clock) against the monotonic one: (instant, ns).
    pub clock_steps: Vec<(u64, i128)>,
    pub names: Vec<(&'static str, u32)>,
    pub fair_order: bool,
    pub malformed: Vec<String>,
}

impl History {
    pub fn read(
        history: &str,
        db: &str,
        wrappers: Vec<Wrapper>,
        faults: Vec<FaultEvent>,
        names: Vec<(&'static str, u32)>,
        fair_order: bool,
    ) -> History {
        let mut sections: BTreeMap<u64, Section> = BTreeMap::new();
        let mut malformed = Vec::new();
        let text = std::fs::read_to_string(history).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            let parsed = (f.len() == 7)
                .then(|| {
                    Some((
                        f[1].parse::<u64>().ok()?,
                        f[3].parse::<u64>().ok()?,
                        f[4].parse::<u64>().ok()?,
                        f[5].parse::<i32>().ok()?,
                    ))
                })
                .flatten();
            let Some((run, fence, t, pid)) = parsed else {
                malformed.push(line.to_owned());
                continue;
            };
            let s = sections.entry(run).or_default();
            if let Some(kind) = f[0].strip_prefix('g') {
                let g = s.grand.entry(pid).or_insert_with(|| Grand {
                    pid,
                    ..Grand::default()
                });
                match kind {
                    "start" => {
                        g.start = t;
                        g.mode = f[6].to_owned();
                    }
                    "end" => g.end = Some(g.end.map_or(t, |e| e.min(t))),
                    "term" => {
                        g.end = Some(g.end.map_or(t, |e| e.min(t)));
                        g.termed = true;
                    }
                    "dead" => g.dead = Some(t),
                    _ => {}
                }
                if kind != "dead" {
                    g.last = g.last.max(t);
                }
                continue;
            }
            match f[0] {
                "start" => {
                    *s = Section {
                        run,
                        name: f[2].to_owned(),
                        fence,
                        pid,
                        start: t,
                        last: t,
                        holders_env: f[6].to_owned(),
                        ..std::mem::take(s)
                    }
                }
                "end" | "term" => s.end = Some(s.end.map_or(t, |e| e.min(t))),
                "dead" => s.dead = Some(t),
                "inner-spawn" => s.inner_spawned = Some((t, f[6].parse().unwrap_or(-1))),
                "inner-exit" => s.inner_exit = Some((t, f[6].parse().unwrap_or(-1000))),
                _ => {}
            }
            if f[0] != "dead" {
                s.last = s.last.max(t);
            }
        }
        // A command killed between forking its observer and its start record (a group kill
        // that came first) leaves a death and nothing else: it never ran under the lock.
        sections.retain(|_, s| s.start != 0);
        // Likewise a process of the job's that died before it recorded its start.
        for s in sections.values_mut() {
            s.grand.retain(|_, g| g.start != 0);
        }
        History {
            sections,
            writes: read_writes(db),
            wrappers: wrappers.into_iter().map(|w| (w.plan.run, w)).collect(),
            faults,
            clock_steps: Vec::new(),
            names,
            fair_order,
            malformed,
        }
    }

    /// The wrapper the harness spawned for `run` (an inner run's is its outer run's).
    pub fn wrapper_of(&self, run: u64) -> Option<&Wrapper> {
        self.wrappers.get(&(run - run % 10))
    }

    pub fn is_inner(run: u64) -> bool {
        run % 10 != 0
    }

    pub fn empty_restarts(&self) -> impl Iterator<Item = &FaultEvent> {
        self.faults
            .iter()
            .filter(|f| f.fault == Fault::RestartEmpty)
    }

    /// The empty restart that `run`'s wrapper lived through, if any: its view of the lock and
    /// of the fences may be from before it.
    pub fn straddles(&self, run: u64) -> Option<&FaultEvent> {
        let w = self.wrapper_of(run)?;
        self.empty_restarts()
            .find(|f| w.spawned <= f.ended && w.ended >= f.began)
    }

    /// Fences restart from a new epoch at each empty restart: the number of them before `run`'s
    /// wrapper was spawned.
    pub fn epoch(&self, run: u64) -> usize {
        let spawned = self.wrapper_of(run).map_or(0, |w| w.spawned);
        self.empty_restarts().filter(|f| f.ended < spawned).count()
    }

    /// What a violation's reader needs to tell its cause: each run's wrapper (its end, the
    /// signal its client sent it, its last words on stderr) and the nemesis faults from a TTL
    /// before `from` to `to`.
    pub fn evidence(&self, runs: &[u64], from: u64, to: u64) -> String {
        let at = |ns: u64| format!("{:.3}s", ns as f64 / 1e9);
        let mut lines = Vec::new();
        for &run in runs {
            let Some(w) = self.wrapper_of(run) else {
                continue;
            };
            let signal = match w.sent {
                Some((libc::SIGSTOP, t)) => {
                    format!(", SIGSTOP at {} for {} ms", at(t), w.stopped_ms)
                }
                Some((sig, t)) => format!(", signal {sig} at {}", at(t)),
                None => String::new(),
            };
            let signal = match w.plan.held_ms {
                Some(ms) => format!("{signal}, held up {ms} ms between its grant and its start"),
                None => signal,
            };
            lines.push(format!(
                "      run {run}: wrapper spawned {}, ended {} with {}{signal}; stderr: {}",
                at(w.spawned),
                at(w.ended),
                w.status,
                // Its log: from what it acquired, with which fence, to how it ended.
                w.stderr_last(8)
            ));
        }
        let ttl_ns = crate::plan::TTL_MS * 1_000_000;
        for f in self.faults_during(from.saturating_sub(ttl_ns), to) {
            lines.push(format!("      fault: {}", f.describe()));
        }
        for (t, step) in &self.clock_steps {
            if *t + ttl_ns >= from && *t <= to + ttl_ns {
                lines.push(format!(
                    "      the wall clock stepped {:+.1} ms against the monotonic one by {}",
                    *step as f64 / 1e6,
                    at(*t)
                ));
            }
        }
        lines.join("\n")
    }

    /// The nemesis faults acting at some instant of `from..=to`.
    pub fn faults_during(&self, from: u64, to: u64) -> Vec<&FaultEvent> {
        self.faults
            .iter()
            .filter(|f| f.began <= to && f.ended >= from)
            .collect()
    }
}

fn read_writes(db: &str) -> Vec<Write> {
    let out = Command::new("sqlite3")
        .args(["-separator", " ", db])
        .arg("SELECT run, name, fence, changed FROM writes ORDER BY id;")
        .output()
        .expect("sqlite3 is installed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some(Write {
                run: f.first()?.parse().ok()?,
                name: f.get(1)?.to_string(),
                fence: f.get(2)?.parse().ok()?,
                changed: f.get(3)?.parse().ok()?,
            })
        })
        .collect()
}

/// Creates the SQLite database the children write to: one row per NAME, fence 0.
pub fn create_db(db: &str, names: &[(&str, u32)]) {
    let mut sql = String::from(
        "PRAGMA journal_mode=WAL;\n\
         CREATE TABLE fenced(name TEXT PRIMARY KEY, fence INTEGER NOT NULL, writer INTEGER);\n\
         CREATE TABLE writes(id INTEGER PRIMARY KEY AUTOINCREMENT, run INTEGER, name TEXT, \
         fence INTEGER, changed INTEGER);\n",
    );
    for (name, _) in names {
        sql.push_str(&format!("INSERT INTO fenced VALUES ('{name}', 0, NULL);\n"));
    }
    let out = Command::new("sqlite3")
        .arg(db)
        .arg(sql)
        .output()
        .expect("sqlite3 is installed");
    assert!(out.status.success(), "{out:?}");
}
