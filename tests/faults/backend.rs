//! The backends the harness checks, behind one trait: what a run's `-u` arguments are, what the
//! backend can do (`--holders N`, a fair queue), which faults the nemesis may inject into it,
//! and what it still holds once everything stopped. Adding one is one more impl and one more
//! line in [`open`] (and in [`missing`], if it needs a server that may not be installed).

use std::sync::Mutex;
use std::sync::mpsc;
use std::time::Duration;

use crate::files::Files;
use crate::hostile::Junk;
use crate::proxy::{FaultProxy, Hostile};
use crate::rng::Rng;
use crate::servers::Server;

/// A fault the nemesis injects into a backend's servers or network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// The next connections' requests held 1.5 s on their way to the server.
    DelayConn,
    /// One open connection's bytes held both ways for a while.
    Stall,
    /// One open connection's bytes dropped from now on.
    BlackholeConn,
    /// Every connection's bytes dropped for a while.
    BlackholeAll,
    /// One open connection reset.
    ResetConn,
    /// Every open connection reset.
    ResetAll,
    /// The server SIGSTOPped for a while.
    Pause,
    /// `DEBUG SLEEP` (Redis only).
    DebugSleep,
    /// The server SIGKILLed and restarted with its data (Redis: AOF, fsync always; etcd: its
    /// data directory, whose WAL is fsynced before a write is acknowledged).
    KillRestart,
    /// The server SIGKILLed and restarted empty (beyond the single-server guarantee).
    RestartEmpty,
    /// One open connection turns hostile: a huge, endless or malformed reply in place of the
    /// server's (see [`Hostile`]).
    Hostile,
    /// `file://`: another user of the sticky directory swaps the lock files it owns for fresh
    /// ones (see `files.rs`).
    ForeignSwap,
    /// A cluster's leader (whichever member leads then) SIGKILLed and restarted with its data.
    KillLeader,
    /// A cluster's leader SIGSTOPped for a while: the others elect another, and the old one
    /// finds itself a follower when it resumes.
    PauseLeader,
    /// Every backend: a hostile user of the metrics directory holds a NAME's metrics lock, or
    /// swaps its files for a FIFO, a link or a huge file (see `hostile.rs`).
    Neighbour,
    /// Every backend: another user of a lock writes junk into its history (`hostile.rs`).
    HistoryJunk,
    /// Every backend: another user of a lock writes a `since` no date can show into its
    /// holder's metadata (`hostile.rs`).
    FarSince,
    /// `file://`: the counters and histories copied (`cp -a`) at one time, the copy restored
    /// over them later, the same copy again and again (see `files.rs`).
    Restore,
}

impl Fault {
    pub fn label(self) -> &'static str {
        match self {
            Fault::DelayConn => "connection delayed 1.5s",
            Fault::Stall => "connection stalled",
            Fault::BlackholeConn => "connection blackholed",
            Fault::BlackholeAll => "all traffic blackholed",
            Fault::ResetConn => "connection reset",
            Fault::ResetAll => "all connections reset",
            Fault::Pause => "server SIGSTOPped",
            Fault::DebugSleep => "server DEBUG SLEEP",
            Fault::KillRestart => "server killed, restarted with data",
            Fault::RestartEmpty => "server restarted EMPTY",
            Fault::Hostile => "a hostile reply on one connection",
            Fault::ForeignSwap => "another user swapped its lock files",
            Fault::KillLeader => "the leader killed, restarted with data",
            Fault::PauseLeader => "the leader SIGSTOPped",
            Fault::Neighbour => "another user in the metrics directory",
            Fault::HistoryJunk => "another user wrote junk into a history",
            Fault::FarSince => "another user set a holder's since past year 9999",
            Fault::Restore => "the directory's counters and histories restored from a copy",
        }
    }
}

pub trait Backend: Send + Sync {
    fn label(&self) -> &'static str;
    /// `-u URL...`.
    fn url_args(&self) -> Vec<String>;
    /// Whatever else every run on this backend takes.
    fn run_args(&self) -> Vec<String> {
        Vec::new()
    }
    /// Whether `--holders N` (N > 1) is supported.
    fn holders_ok(&self) -> bool;
    /// Whether waiters are served in arrival order (a queue), so the fairness check applies.
    fn fair_order(&self) -> bool;
    /// The faults the nemesis may inject, with their weights (empty: process faults only).
    fn faults(&self) -> Vec<(Fault, u64)>;
    /// How many servers a fault may be aimed at.
    fn servers(&self) -> usize;
    /// Injects `fault` into server `server`, for a duration drawn from `rng`; returns once the
    /// fault is over (a connection-level fault: once it is set up). Says what it did.
    fn inject(&self, fault: Fault, server: usize, rng: &mut Rng) -> String;
    /// Undoes whatever may still be in effect (a paused server resumed).
    fn heal(&self);
    /// What is still held, queued or locked once everything stopped: one line each (keys whose
    /// name starts with `fence:`, `gone:` or `history:`, and etcd's histories, are allowed to
    /// stay).
    fn leftovers(&self) -> Vec<String>;
    /// Writes `junk` into NAME's history beside the runs' own records, as another user of the
    /// lock may (straight to the store, not through the fault proxy).
    fn plant_history(&self, name: &str, junk: &Junk, token: &str) -> Result<(), String>;
    /// Writes [`crate::hostile::FAR_SINCE_MS`] as the `since` of NAME's holder (held by one
    /// run; nothing when none holds it), where the backend keeps its metadata, as another user
    /// of the lock may.
    fn plant_far_since(&self, name: &str) -> Result<(), String>;
}

/// Opens the backend named `label` (`redis`, `file`, `redlock`, `etcd`).
pub fn open(label: &str) -> Option<Box<dyn Backend>> {
    match label {
        "etcd" => Some(Box::new(crate::etcd::Etcds::start(1))),
        "etcd3" => Some(Box::new(crate::etcd::Etcds::start(3))),
        "redis" => Some(Box::new(Servers::start("redis", 1))),
        "redlock" => Some(Box::new(Servers::start("redlock", 3))),
        "file" => Some(Box::new(Files::start())),
        "postgres" => Some(Box::new(crate::pg::PgServer::start())),
        _ => None,
    }
}

pub const ALL: &[&str] = &["redis", "file", "redlock", "etcd", "etcd3", "postgres"];

/// Why backend `label` cannot run here (its server is not installed), if it cannot: such a
/// backend is skipped with a printed line, not failed.
pub fn missing(label: &str) -> Option<String> {
    let on_path = |bin: &str| {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(bin).is_file()))
    };
    match label {
        "etcd" | "etcd3" => {
            let etcd = crate::support::etcd::etcd_binary();
            let found = |bin: &str| match bin.contains('/') {
                true => std::path::Path::new(bin).is_file(),
                false => on_path(bin),
            };
            [etcd.as_str(), "etcdctl"]
                .into_iter()
                .find(|bin| !found(bin))
                .map(|bin| format!("{bin} is not found"))
        }
        "postgres" => std::fs::read_dir("/usr/lib/postgresql")
            .is_err()
            .then(|| "PostgreSQL is not installed (/usr/lib/postgresql)".to_owned()),
        _ => None,
    }
}

/// Sets the holder hash's `since`, only if the hash is there (a hash made here would outlive
/// every run: no release deletes a hash it did not write).
const FAR_SINCE: &str = "if redis.call('EXISTS', KEYS[1]) == 1 then \
                         redis.call('HSET', KEYS[1], 'since', ARGV[1]) end return 0";

/// One Redis server, or Redlock over several, each behind a fault proxy of its own.
pub struct Servers {
    label: &'static str,
    servers: Vec<Mutex<Server>>,
    proxies: Vec<FaultProxy>,
}

impl Servers {
    fn start(label: &'static str, n: usize) -> Servers {
        let servers: Vec<Server> = (0..n).map(|_| Server::start()).collect();
        let proxies = servers.iter().map(|s| FaultProxy::start(s.port)).collect();
        Servers {
            label,
            servers: servers.into_iter().map(Mutex::new).collect(),
            proxies,
        }
    }
}

/// What a hostile Redis server answers: a bulk string and an array that announce more than any
/// client may keep and never end, a line that never ends, a negative length, and HTTP.
fn redis_hostile() -> Vec<Hostile> {
    let h = |what, prefix: &[u8], filler: &[u8]| Hostile {
        what,
        prefix: prefix.to_vec(),
        filler: filler.to_vec(),
    };
    vec![
        h("a bulk string of 100 GB", b"$99999999999\r\n", b"x"),
        h("an array of 2^31 elements", b"*2147483647\r\n", b":1\r\n"),
        h("a line that never ends", b"+", b"o"),
        h("a negative bulk length", b"$-5\r\n", b""),
        h(
            "an HTTP reply",
            b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            b"",
        ),
    ]
}

/// One of `menu`, drawn from `rng`, sent on connection `pick` of `proxy`.
pub fn hostile(proxy: &FaultProxy, menu: Vec<Hostile>, pick: u64, rng: &mut Rng) -> String {
    let i = rng.range(0, menu.len() as u64 - 1) as usize;
    let what = menu[i].what;
    format!("{what}: {}", proxy.hostile_one(pick, menu[i].clone()))
}

pub fn ms(rng: &mut Rng, lo: u64, hi: u64) -> Duration {
    Duration::from_millis(rng.range(lo, hi))
}

/// A connection-level fault, through `proxy` (`pick` chooses the open connection it hits).
pub fn proxy_fault(proxy: &FaultProxy, fault: Fault, pick: u64, rng: &mut Rng) -> String {
    match fault {
        Fault::DelayConn => {
            let count = rng.range(1, 3) as usize;
            let window = ms(rng, 1000, 3000);
            proxy.delay_next(count, Duration::from_millis(1500), window);
            let also = proxy.delay_one(pick, Duration::from_millis(1500), window);
            format!("next {count} connections (and one open: {also}) +1.5s for {window:?}")
        }
        Fault::Stall => {
            let d = ms(rng, 200, 1500);
            format!("{d:?}: {}", proxy.stall_one(pick, d))
        }
        Fault::BlackholeConn => format!("{}", proxy.blackhole_one(pick)),
        Fault::BlackholeAll => {
            let d = ms(rng, 200, 1200);
            proxy.blackhole_all(d);
            std::thread::sleep(d);
            format!("{d:?}")
        }
        Fault::ResetConn => format!("{}", proxy.reset_one(pick)),
        Fault::ResetAll => {
            proxy.reset_all();
            String::new()
        }
        _ => unreachable!("{fault:?} is not a connection fault"),
    }
}

impl Backend for Servers {
    fn label(&self) -> &'static str {
        self.label
    }

    fn url_args(&self) -> Vec<String> {
        self.proxies
            .iter()
            .flat_map(|p| ["-u".to_owned(), p.url()])
            .collect()
    }

    fn run_args(&self) -> Vec<String> {
        if self.proxies.len() == 1 {
            return Vec::new();
        }
        // The default, T/100 = 20 ms, is missed on two loaded cores; these runs are not about
        // that timeout.
        vec!["--node-timeout".to_owned(), "300ms".to_owned()]
    }

    fn holders_ok(&self) -> bool {
        self.servers.len() == 1
    }

    fn fair_order(&self) -> bool {
        // Redlock keeps no queue: it always waits as --no-fair (docs/guide.md, Waiting).
        self.servers.len() == 1
    }

    fn faults(&self) -> Vec<(Fault, u64)> {
        vec![
            (Fault::DelayConn, 14),
            (Fault::Stall, 8),
            (Fault::BlackholeConn, 6),
            (Fault::BlackholeAll, 5),
            (Fault::ResetConn, 8),
            (Fault::ResetAll, 5),
            (Fault::Pause, 6),
            (Fault::DebugSleep, 5),
            (Fault::KillRestart, 6),
            (Fault::RestartEmpty, 2),
            (Fault::Hostile, 6),
        ]
    }

    fn servers(&self) -> usize {
        self.servers.len()
    }

    fn inject(&self, fault: Fault, i: usize, rng: &mut Rng) -> String {
        let proxy = &self.proxies[i];
        let pick = rng.next_u64();
        match fault {
            Fault::Pause => {
                let d = ms(rng, 200, 2500);
                let server = self.servers[i].lock().unwrap();
                server.pause();
                std::thread::sleep(d);
                server.resume();
                format!("{d:?}")
            }
            Fault::DebugSleep => {
                let d = ms(rng, 200, 2000);
                self.servers[i].lock().unwrap().debug_sleep(d);
                format!("{d:?}")
            }
            Fault::KillRestart => {
                let down = ms(rng, 0, 1500);
                let mut server = self.servers[i].lock().unwrap();
                server.kill();
                proxy.reset_all();
                std::thread::sleep(down);
                server.restart();
                format!("down {down:?}")
            }
            Fault::RestartEmpty => {
                let mut server = self.servers[i].lock().unwrap();
                server.restart_empty();
                proxy.reset_all();
                String::new()
            }
            Fault::Hostile => hostile(proxy, redis_hostile(), pick, rng),
            _ => proxy_fault(proxy, fault, pick, rng),
        }
    }

    fn heal(&self) {
        for server in &self.servers {
            server.lock().unwrap().resume();
        }
    }

    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for (i, server) in self.servers.iter().enumerate() {
            match server.lock().unwrap().keys() {
                Ok(keys) => left.extend(
                    keys.into_iter()
                        .filter(|(k, _)| {
                            !["fence:", "gone:", "history:"]
                                .iter()
                                .any(|p| k.starts_with(p))
                        })
                        .map(|(k, pttl)| format!("server {i}: key {k} left (PTTL {pttl} ms)")),
                ),
                Err(e) => left.push(format!("server {i}: not readable: {e}")),
            }
        }
        left
    }

    /// On every server (each keeps its own history: Redlock's `history` merges them).
    fn plant_history(&self, name: &str, junk: &Junk, token: &str) -> Result<(), String> {
        let record = junk.record(token);
        for server in &self.servers {
            let mut conn = server.lock().unwrap().conn().map_err(|e| e.to_string())?;
            redis::cmd("LPUSH")
                .arg(format!("history:{{{name}}}"))
                .arg(&record)
                .query::<i64>(&mut conn)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// In `holder:{NAME}`, on every server that has it.
    fn plant_far_since(&self, name: &str) -> Result<(), String> {
        for server in &self.servers {
            let mut conn = server.lock().unwrap().conn().map_err(|e| e.to_string())?;
            redis::cmd("EVAL")
                .arg(FAR_SINCE)
                .arg(1)
                .arg(format!("holder:{{{name}}}"))
                .arg(crate::hostile::FAR_SINCE_MS.to_string())
                .query::<i64>(&mut conn)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// A thread that lives as long as the backend and starts its etcd members: the fixture gives a
/// member PDEATHSIG, which fires when the *thread* that spawned it exits, and the nemesis's
/// thread, which restarts it, ends with each pass, before the leftovers are read.
pub struct Keeper {
    jobs: Mutex<mpsc::Sender<Box<dyn FnOnce() + Send>>>,
}

impl Keeper {
    pub fn start() -> Keeper {
        let (jobs, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::spawn(move || {
            for job in rx {
                job();
            }
        });
        Keeper {
            jobs: Mutex::new(jobs),
        }
    }

    /// Runs `job` on the keeper's thread and returns its result (a panic there is one here).
    pub fn run<R: Send + 'static>(&self, job: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .lock()
            .unwrap()
            .send(Box::new(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                let _ = tx.send(result);
            }))
            .expect("the keeper thread");
        match rx.recv().expect("the keeper thread") {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}
