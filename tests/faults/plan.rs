//! What one run does, drawn from the client's seeded stream: its NAME (with the NAME's fixed
//! `--holders`, or `--shared` or not on the NAME whose runs mix both), how it waits (fair, `--no-fair`, `-n`, `-w DUR`), `--max-run`, how long its
//! command sleeps, whether the command runs a nested `locked-run` on another NAME, which
//! process fault (SIGKILL, SIGTERM, SIGSTOP) the client sends its wrapper, and when, whether
//! the wrapper is held up between its grant and its command's start, and which process of a
//! shape of its own the command starts beside itself (see [`Shape`]).

use crate::rng::Rng;

pub const TTL_MS: u64 = 2000;
/// K = T/3 (the default kill grace).
pub const KILL_AFTER_MS: u64 = TTL_MS / 3;
/// The nested run's own wait, so an outer holder never waits on it for long.
pub const INNER_WAIT_MS: u64 = 3000;

/// The `--holders` of a NAME whose runs mix `--shared` and exclusive ones.
pub const SHARED_MIX: u32 = 0;

/// The NAMEs and their `--holders` (fixed per NAME, as the contract requires; `d`'s runs are
/// `--shared` or exclusive, [`SHARED_MIX`]). `a` is only ever an inner NAME of nested runs
/// besides its own runs, and never an outer one of them: no cycle, so no deadlock between an
/// outer holder and an inner waiter. Redlock takes neither `--holders` nor `--shared`.
pub fn names(holders_ok: bool) -> Vec<(&'static str, u32)> {
    match holders_ok {
        true => vec![("a", 1), ("b", 1), ("c", 3), ("d", SHARED_MIX)],
        false => vec![("a", 1), ("b", 1), ("c", 1)],
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting {
    Fair,
    NoFair,
    NoWait,
    For(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcFault {
    None,
    Kill {
        after: u64,
    },
    Term {
        after: u64,
    },
    /// SIGSTOP `after` ms after the spawn, SIGCONT `for_` ms later: shorter than T/3, so even a
    /// wrapper that holds by then stays within its lease.
    Stop {
        after: u64,
        for_: u64,
    },
}

/// A process the command starts that leaves its process group, as real jobs' processes do: the
/// kills of a lost lease, of the sweep, of `--max-run` and of the watcher must reach it all the
/// same, unless it left the job's session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Under coreutils `timeout`, which puts itself in a group of its own.
    Timeout,
    /// Started by a `set -m` shell, in a group of its own.
    SetM,
    /// Calls `setpgid(0, 0)` itself.
    SetPgid,
    /// In a group of its own, its main thread ended while another runs on (`/proc` shows its
    /// first thread a zombie).
    Leaderless,
    /// In a group of its own, named as a nested run's watcher is (`locked-run-watc`).
    Named,
    /// Calls `setsid`: a daemon meant to outlive the job, which nothing may kill.
    Daemon,
}

#[derive(Clone, Debug)]
pub struct Nested {
    pub run: u64,
    pub name: &'static str,
    pub sleep_ms: u64,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub run: u64,
    pub name: &'static str,
    pub holders: u32,
    /// `--holders 1` said out loud (it is the default).
    pub explicit_holders: bool,
    /// `--shared` (on a [`SHARED_MIX`] NAME).
    pub shared: bool,
    pub wait: Waiting,
    pub max_run: Option<u64>,
    pub sleep_ms: u64,
    pub nested: Option<Nested>,
    pub fault: ProcFault,
    /// Run under strace, which holds up the wrapper's one prctl(2) (made as it readies the job,
    /// after the grant and before the command's clone) this many ms: past the lease's
    /// kill-signal point (about 1.3 s at T = 2 s) the command must never start. Only on runs
    /// with no process fault and no nested run (the nested wrapper's prctl is not traced).
    pub held_ms: Option<u64>,
    /// How long the client pauses after this run if it found the backend unreachable (69), so
    /// a server that is down is not hammered by runs that fail at once.
    pub backoff_ms: u64,
    /// A process of a shape of its own that the command starts, and how long it sleeps: often
    /// past the command's own end (what the sweep must then stop); a daemon's at most
    /// [`DAEMON_MAX_MS`].
    pub shape: Option<(Shape, u64)>,
    /// The run is on a host of its own whose name is `hostile::HOSTS[i]` (a UTS namespace, as
    /// root): what it writes of its host must reach no terminal raw.
    pub hostile_host: Option<usize>,
}

/// The longest a daemon (see [`Shape::Daemon`]) sleeps: the pass waits this long for the last
/// ones before it reads the history.
pub const DAEMON_MAX_MS: u64 = 2000;

impl Plan {
    pub fn draw(rng: &mut Rng, run: u64, names: &[(&'static str, u32)], nested_mix: bool) -> Plan {
        let weights: &[u64] = match names.len() {
            4 => &[35, 20, 25, 20],
            _ => &[40, 25, 35],
        };
        let (name, holders) = names[rng.weighted(weights)];
        let shared = holders == SHARED_MIX && rng.chance(60);
        let wait = match rng.weighted(&[50, 15, 15, 20]) {
            0 => Waiting::Fair,
            // Shared runs wait in arrival order only (--no-fair is refused with --shared).
            1 if shared => Waiting::Fair,
            1 => Waiting::NoFair,
            2 => Waiting::NoWait,
            _ => Waiting::For(rng.range(200, 4000)),
        };
        let holders = holders.max(1);
        let max_run = rng.chance(10).then(|| rng.range(300, 1500));
        let sleep_ms = match rng.weighted(&[60, 30, 10]) {
            0 => rng.range(5, 50),
            1 => rng.range(100, 500),
            _ => rng.range(800, 2500),
        };
        let nested = (nested_mix && name != "a" && rng.chance(if holders > 1 { 30 } else { 12 }))
            .then(|| Nested {
                run: run + 1,
                name: "a",
                sleep_ms: rng.range(5, 200),
            });
        let fault = match rng.weighted(&[76, 8, 8, 8]) {
            0 => ProcFault::None,
            1 => ProcFault::Kill {
                after: rng.range(0, 2000),
            },
            2 => ProcFault::Term {
                after: rng.range(0, 2000),
            },
            _ => ProcFault::Stop {
                after: rng.range(0, 1500),
                for_: rng.range(50, TTL_MS / 3 - 100),
            },
        };
        let held_ms = (fault == ProcFault::None && nested.is_none() && rng.chance(5))
            .then(|| rng.range(600, 3200));
        let explicit_holders = holders == 1 && rng.chance(20);
        let backoff_ms = rng.range(100, 400);
        let shape = rng.chance(30).then(|| {
            let shape = match rng.weighted(&[20, 15, 15, 15, 15, 20]) {
                0 => Shape::Timeout,
                1 => Shape::SetM,
                2 => Shape::SetPgid,
                3 => Shape::Leaderless,
                4 => Shape::Named,
                _ => Shape::Daemon,
            };
            let ms = match shape {
                Shape::Daemon => rng.range(50, DAEMON_MAX_MS),
                _ => rng.range(sleep_ms / 2, sleep_ms + 1500),
            };
            (shape, ms)
        });
        let hostile_host = rng
            .chance(10)
            .then(|| rng.range(0, crate::hostile::HOSTS.len() as u64 - 1) as usize);
        Plan {
            run,
            name,
            holders,
            explicit_holders,
            shared,
            wait,
            max_run,
            sleep_ms,
            nested,
            fault,
            held_ms,
            backoff_ms,
            shape,
            hostile_host,
        }
    }

    /// The options every run takes.
    pub fn lease_args() -> Vec<String> {
        // JSON lines: the wrapper's stderr (kept for a violation's evidence) says what it
        // acquired, each renewal and how its command ended, each with its instant, which
        // the model check reads (`model_check.rs`).
        [
            "--log-format",
            "json",
            "--ttl",
            "2s",
            "--connect-timeout",
            "1s",
        ]
        .map(String::from)
        .to_vec()
    }

    /// `locked-run`'s arguments (after the backend's `-u ...`), up to and including `--`.
    pub fn wrapper_args(&self) -> Vec<String> {
        let mut args = Plan::lease_args();
        match self.wait {
            Waiting::Fair => {}
            Waiting::NoFair => args.push("--no-fair".into()),
            Waiting::NoWait => args.push("-n".into()),
            Waiting::For(ms) => args.extend(["-w".into(), format!("{ms}ms")]),
        }
        if let Some(ms) = self.max_run {
            args.extend(["--max-run".into(), format!("{ms}ms")]);
        }
        if self.holders > 1 || self.explicit_holders {
            args.extend(["--holders".into(), self.holders.to_string()]);
        }
        if self.shared {
            args.push("--shared".into());
        }
        args.extend([self.name.to_owned(), "--".into()]);
        args
    }

    /// The recording child's arguments (after the test binary's path).
    pub fn child_args(
        &self,
        history: &str,
        db: &str,
        bin: &str,
        url_args: &[String],
    ) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--fault-child".into(),
            history.into(),
            db.into(),
            self.run.to_string(),
            self.name.into(),
            self.sleep_ms.to_string(),
        ];
        if let Some((shape, ms)) = self.shape {
            args.extend(["--shape".into(), format!("{shape:?}"), ms.to_string()]);
        }
        if let Some(inner) = &self.nested {
            args.extend([
                "--nest".into(),
                inner.run.to_string(),
                inner.name.into(),
                inner.sleep_ms.to_string(),
                bin.into(),
            ]);
            // No --holders: the inner NAME's own default of 1 must hold, whatever the outer
            // run put in the environment.
            args.extend(url_args.iter().cloned());
            args.extend(Plan::lease_args());
            args.extend(["-w".into(), format!("{INNER_WAIT_MS}ms"), inner.name.into()]);
        }
        args
    }

    /// How long the run may take in the worst case without faults: its wait, its command (and
    /// nested run), and `--max-run` with the kill grace.
    pub fn bound_ms(&self) -> u64 {
        let wait = match self.wait {
            Waiting::Fair | Waiting::NoFair => 40_000,
            Waiting::NoWait => 0,
            Waiting::For(ms) => ms,
        };
        let inner = self
            .nested
            .as_ref()
            .map_or(0, |n| INNER_WAIT_MS + n.sleep_ms + TTL_MS);
        // What the command leaves behind is swept: the kill signal, then SIGKILL K later.
        let left = self.shape.map_or(0, |_| 100 + KILL_AFTER_MS);
        let command = self.sleep_ms + inner + left + 1000;
        let command = match self.max_run {
            Some(m) => command.min(m + KILL_AFTER_MS + 1000),
            None => command,
        };
        wait + command
    }
}
