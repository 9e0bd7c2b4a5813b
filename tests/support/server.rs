//! The server under test: which binary (`LOCKED_RUN_TEST_SERVER`), what it supports, and a
//! real one on a free loopback port, killed when dropped; what it can be asked about a run.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::certs::Certs;
use super::path_str;
use super::process::{alive, signal};

/// The server binary the tests start: `LOCKED_RUN_TEST_SERVER` (a path, or a name on PATH:
/// `redis-server`, `valkey-server`), else `redis-server` on PATH.
pub fn server_bin() -> String {
    std::env::var("LOCKED_RUN_TEST_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// The command-line client that goes with it: `redis-cli` or `valkey-cli` beside the server
/// binary when there is one, else `redis-cli` on PATH (which speaks to Valkey as well).
pub fn cli_bin() -> String {
    let server = server_bin();
    let server = Path::new(&server);
    if let Some(dir) = server.parent().filter(|d| !d.as_os_str().is_empty()) {
        for cli in ["valkey-cli", "redis-cli"] {
            if dir.join(cli).exists() {
                return dir.join(cli).display().to_string();
            }
        }
    }
    "redis-cli".into()
}

/// `INFO server` of the server binary the tests use, once: its name and version, and whether
/// it was built with TLS (the PyPI builds of Redis 6.2 and Valkey 8.1 were not).
pub struct ServerKind {
    pub valkey: bool,
    /// (major, minor)
    pub version: (u32, u32),
    pub tls: bool,
}

pub fn server_kind() -> &'static ServerKind {
    static KIND: std::sync::OnceLock<ServerKind> = std::sync::OnceLock::new();
    KIND.get_or_init(|| {
        let out = Command::new(server_bin())
            .arg("--version")
            .output()
            .expect("the test server runs (see .ci/run)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // "Redis server v=7.0.15 sha=..." or "Valkey server v=8.1.8 sha=..."
        let version = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("v="))
            .unwrap_or("0.0");
        let mut parts = version.split('.').map(|p| p.parse().unwrap_or(0));
        let version = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        let tls = tls_supported();
        ServerKind {
            valkey: text.starts_with("Valkey"),
            version,
            tls,
        }
    })
}

/// Whether the test server was built with TLS. Asked for a TLS port with a certificate that
/// does not exist, a server with TLS fails to load it; one without says it has no TLS (Redis:
/// "Bad directive", Valkey: no "connection type tls").
fn tls_supported() -> bool {
    let out = Command::new(server_bin())
        .args(["--port", "0", "--tls-port", &free_port().to_string()])
        .args([
            "--tls-cert-file",
            "/nonexistent.crt",
            "--tls-key-file",
            "/nonexistent.key",
        ])
        .args(["--save", "", "--appendonly", "no"])
        .output()
        .expect("the test server runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    !(said.contains("Bad directive")
        || said.contains("connection type tls")
        || said.contains("TLS support"))
}

/// Says why a test is left out on this server, and returns true, when `needs` is false.
pub fn skip_unless(needs: bool, why: &str) -> bool {
    if !needs {
        eprintln!("SKIPPED on {}: {why}", server_bin());
    }
    !needs
}

/// A real redis-server on a free loopback port, killed (SIGKILL) when dropped.
pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    pub dir: tempfile::TempDir,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (`--maxmemory 1`, ...).
    pub fn start_with(extra: &[&str]) -> Redis {
        let dir = tempfile::tempdir().expect("temp dir");
        Redis::start_in(dir, None, extra)
    }

    /// A server whose port and extra arguments `draw` picks afresh on each try, for arguments
    /// that name ports of their own (a cluster bus): a try whose port was taken meanwhile is
    /// followed by one with new ports.
    pub fn start_drawing(draw: impl FnMut() -> (u16, Vec<String>)) -> Redis {
        Redis::start_in_drawing(tempfile::tempdir().expect("temp dir"), draw)
    }

    /// A TLS-only server (port 0, --tls-port), with the test's certificates; clients must
    /// show a certificate when `client_auth`.
    pub fn start_tls(certs: &Certs, client_auth: bool) -> Redis {
        for _ in 0..10 {
            let port = free_port();
            let child = Command::new(server_bin())
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--tls-cert-file", path_str(&certs.server_cert)])
                .args(["--tls-key-file", path_str(&certs.server_key)])
                .args(["--tls-ca-cert-file", path_str(&certs.ca)])
                .args(["--tls-auth-clients", if client_auth { "yes" } else { "no" }])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let mut redis = Redis {
                port,
                child: Some(child),
                dir: tempfile::tempdir().unwrap(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = redis.child.as_mut().unwrap().try_wait() {
                    break; // the port was taken meanwhile: try another
                }
                let ping = Command::new(cli_bin())
                    .args(["--tls", "--cacert", path_str(&certs.ca)])
                    .args([
                        "--cert",
                        path_str(&certs.client_cert),
                        "--key",
                        path_str(&certs.client_key),
                    ])
                    .args(["-p", &port.to_string(), "PING"])
                    .output()
                    .expect("redis-cli is installed");
                if String::from_utf8_lossy(&ping.stdout).trim() == "PONG" {
                    return redis;
                }
                assert!(
                    Instant::now() < deadline,
                    "TLS redis-server on {port} did not answer"
                );
                thread::sleep(Duration::from_millis(20));
            }
            redis.kill();
        }
        panic!("could not start a TLS redis-server");
    }

    fn start_in(dir: tempfile::TempDir, port: Option<u16>, extra: &[&str]) -> Redis {
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        Redis::start_in_drawing(dir, || (port.unwrap_or_else(free_port), extra.clone()))
    }

    fn start_in_drawing(
        dir: tempfile::TempDir,
        mut draw: impl FnMut() -> (u16, Vec<String>),
    ) -> Redis {
        let mut dir = Some(dir);
        for _ in 0..10 {
            let (port, extra) = draw();
            let child = Command::new(server_bin())
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .arg("--dir")
                .arg(dir.as_ref().unwrap().path())
                .args(&extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server is installed (see .ci/run)");
            // Owned from here on: a failed start below kills the server on the way out.
            let mut redis = Redis {
                port,
                child: Some(child),
                dir: dir.take().unwrap(),
            };
            if redis.answers() {
                return redis;
            }
            redis.kill();
            dir = Some(std::mem::replace(
                &mut redis.dir,
                tempfile::tempdir().unwrap(),
            ));
        }
        panic!("could not start redis-server on a free port");
    }

    /// Waits until the server answers PING (false if it exited: the port was taken).
    fn answers(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(_)) = self.child.as_mut().unwrap().try_wait() {
                return false;
            }
            if let Ok(client) = redis::Client::open(self.url()) {
                if let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200))
                {
                    let answer = redis::cmd("PING").query::<String>(&mut conn);
                    // With --requirepass the server answers NOAUTH: up all the same.
                    if answer.is_ok() || answer.is_err_and(|e| e.code() == Some("NOAUTH")) {
                        return true;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer within 10s",
                self.port
            );
            thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// The server's pid, unless it was killed.
    pub fn pid_if_running(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Whether this server is still running (killed ones are skipped by the checks).
    pub fn child_alive(&self) -> bool {
        alive(self.pid_if_running().unwrap_or(-1))
    }

    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect to the test server")
    }

    /// Runs one command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query(&mut self.conn())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    pub fn exists(&self, key: &str) -> bool {
        self.cmd::<i64>(&["EXISTS", key]) == 1
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.cmd(&["GET", key])
    }

    /// Freezes the server (it accepts connections but answers nothing): a blackhole.
    pub fn pause(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    pub fn resume(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    /// Kills the server now (connections are refused from here on).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills the server and starts an empty one on the same port.
    pub fn restart_empty(&mut self) {
        self.kill();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let mut fresh = Redis::start_in(dir, Some(self.port), &[]);
        self.child = fresh.child.take();
        std::mem::swap(&mut self.dir, &mut fresh.dir);
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_ref() {
            signal(child.id() as i32, libc::SIGCONT);
        }
        self.kill();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `127.0.0.1:P1,127.0.0.1:P2,...`: the hosts of a URL that names several servers.
pub fn loopback_hosts(ports: impl IntoIterator<Item = u16>) -> String {
    let hosts: Vec<String> = ports
        .into_iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    hosts.join(",")
}

/// A figure of `INFO commandstats` on `redis`: `field` (`calls`, `rejected_calls`, ...) of each of
/// `commands` (lower case), summed. Commands clients sent; not those scripts ran.
pub fn command_stats(redis: &Redis, commands: &[&str], field: &str) -> u64 {
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(command, _)| commands.contains(command))
        .filter_map(|(_, fields)| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(field)?.strip_prefix('='))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// How many clients are subscribed to NAME's release channels on `redis`: the NAME's own
/// (racers, Redlock's waiters) and each fair waiter's (`released:{NAME}:TOKEN`).
pub fn subscribers(redis: &Redis, name: &str) -> i64 {
    release_channels(redis, name).iter().map(|(_, n)| n).sum()
}

/// How many places the queue of `job` holds on `redis`.
pub fn queued(redis: &Redis) -> i64 {
    redis.cmd(&["ZCARD", "queue:{job}"])
}

/// NAME's release channels with subscribers on `redis`, with how many each has.
pub fn release_channels(redis: &Redis, name: &str) -> Vec<(String, i64)> {
    let channels: Vec<String> =
        redis.cmd(&["PUBSUB", "CHANNELS", &format!("released:{{{name}}}*")]);
    channels
        .into_iter()
        .map(|channel| {
            let reply: Vec<redis::Value> = redis.cmd(&["PUBSUB", "NUMSUB", &channel]);
            match reply.get(1) {
                Some(redis::Value::Int(n)) => (channel, *n),
                other => panic!("{other:?}"),
            }
        })
        .collect()
}

/// The earliest instant the server can expire `lock:{job}`, read just before a fault: no
/// renewal after the read can make it earlier.
pub fn expiry_lower_bound(redis: &Redis) -> Instant {
    let before = Instant::now();
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
    assert!(pttl > 0, "the lock is held with a lease: {pttl}");
    before + Duration::from_millis(pttl as u64)
}
