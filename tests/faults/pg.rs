//! `postgres://`: one PostgreSQL server behind a fault proxy of its own. Its server faults are
//! the ones its processes can suffer (every process of it SIGSTOPped for a while; SIGKILLed and
//! restarted with its data), and the proxy's connection faults as on Redis and etcd. What is
//! left once everything stopped is read from its tables: a live holder row or queue place.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::backend::{Backend, Fault, Keeper, proxy_fault};
use crate::hostile::Junk;
use crate::proxy::FaultProxy;
use crate::rng::Rng;
use crate::support::postgres::Postgres;
use crate::support::signal;

pub struct PgServer {
    pg: Arc<Mutex<Postgres>>,
    proxy: FaultProxy,
    keeper: Keeper,
}

impl PgServer {
    pub fn start() -> PgServer {
        let keeper = Keeper::start();
        let pg = Arc::new(Mutex::new(keeper.run(Postgres::start)));
        let port = pg.lock().unwrap().port;
        PgServer {
            pg,
            proxy: FaultProxy::start(port),
            keeper,
        }
    }

    /// The server's processes: its postmaster and the backends it forked.
    fn processes(&self) -> Vec<i32> {
        let postmaster = self.pg.lock().unwrap().pid();
        let mut pids = vec![postmaster];
        let children = format!("/proc/{postmaster}/task/{postmaster}/children");
        let listed = std::fs::read_to_string(children).unwrap_or_default();
        pids.extend(
            listed
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
        pids
    }
}

impl Backend for PgServer {
    fn label(&self) -> &'static str {
        "postgres"
    }

    fn url_args(&self) -> Vec<String> {
        vec![
            "-u".to_owned(),
            format!(
                "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
                self.proxy.port
            ),
        ]
    }

    fn holders_ok(&self) -> bool {
        true
    }

    fn fair_order(&self) -> bool {
        // A queue place per waiter, served in arrival order.
        true
    }

    fn faults(&self) -> Vec<(Fault, u64)> {
        vec![
            (Fault::DelayConn, 14),
            (Fault::Stall, 8),
            (Fault::BlackholeConn, 6),
            (Fault::BlackholeAll, 5),
            (Fault::ResetConn, 8),
            (Fault::ResetAll, 5),
            (Fault::Pause, 8),
            (Fault::KillRestart, 8),
        ]
    }

    fn servers(&self) -> usize {
        1
    }

    fn inject(&self, fault: Fault, _: usize, rng: &mut Rng) -> String {
        let pick = rng.next_u64();
        match fault {
            Fault::Pause => {
                let d = Duration::from_millis(rng.range(200, 2500));
                let pids = self.processes();
                for &pid in &pids {
                    signal(pid, libc::SIGSTOP);
                }
                std::thread::sleep(d);
                for &pid in &pids {
                    signal(pid, libc::SIGCONT);
                }
                format!("{d:?}, {} processes", pids.len())
            }
            Fault::KillRestart => {
                let down = Duration::from_millis(rng.range(0, 1500));
                self.pg.lock().unwrap().kill();
                self.proxy.reset_all();
                std::thread::sleep(down);
                let pg = self.pg.clone();
                self.keeper.run(move || pg.lock().unwrap().launch());
                format!("down {down:?}")
            }
            _ => proxy_fault(&self.proxy, fault, pick, rng),
        }
    }

    fn heal(&self) {
        for pid in self.processes() {
            signal(pid, libc::SIGCONT);
        }
    }

    fn leftovers(&self) -> Vec<String> {
        let sql = "SELECT 'holder ' || name || ' ' || token FROM locked_run.holder \
                   WHERE expires_at > clock_timestamp() \
                   UNION ALL SELECT 'queued ' || name || ' ' || token FROM locked_run.queue \
                   WHERE alive_until > clock_timestamp()";
        let out = self.pg.lock().unwrap().psql_output(sql);
        match out.code() {
            Some(0) => out.stdout.lines().map(|l| format!("{l} left")).collect(),
            _ if out.stderr.contains("does not exist") => Vec::new(),
            _ => vec![format!("tables not readable: {}", out.stderr.trim())],
        }
    }

    /// A row of NAME's history, written with plain SQL, its end the instant it is written.
    fn plant_history(&self, name: &str, junk: &Junk, token: &str) -> Result<(), String> {
        let record = match junk {
            // Built by the server: a literal of a megabyte would pass one argument's limit.
            Junk::Huge(n) => {
                format!("'{{\"host\":\"' || repeat('x', {n}) || '\",\"token\":\"{token}\"}}'")
            }
            _ => format!("'{}'", junk.record(token).replace('\'', "''")),
        };
        let sql = format!(
            "INSERT INTO locked_run.history (name, token, ended_at, run) VALUES ('{name}', \
             '{token}', clock_timestamp(), {record})"
        );
        let out = self.pg.lock().unwrap().psql_output(&sql);
        match out.code() {
            Some(0) => Ok(()),
            _ => Err(out.stderr.trim().to_owned()),
        }
    }

    /// `since` of the holder rows of NAME, as far ahead as PostgreSQL's dates go.
    fn plant_far_since(&self, name: &str) -> Result<(), String> {
        let sql = format!("UPDATE locked_run.holder SET since = 'infinity' WHERE name = '{name}'");
        let out = self.pg.lock().unwrap().psql_output(&sql);
        match out.code() {
            Some(0) => Ok(()),
            _ => Err(out.stderr.trim().to_owned()),
        }
    }
}
