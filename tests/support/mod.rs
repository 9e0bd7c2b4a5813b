//! Test support: real `redis-server` processes on free ports (killed on drop), the binary under
//! test with a hard timeout on every run (command lines built with [`cmd::lr`]), and helpers
//! that wait on evidence (a process's exit through a pidfd, a file's content, Redis state)
//! instead of sleeping.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Read;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

pub mod cmd;
pub mod proxy;
pub mod topology;

#[allow(unused_imports)]
pub use cmd::{LockedRun, lr, status_json};
#[allow(unused_imports)]
pub use topology::{Cluster, Five, Watched, locked_run_on, sentinel_cli};

pub const BIN: &str = env!("CARGO_BIN_EXE_locked-run");

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

/// A hard limit for any single process a test starts.
pub const HARD_TIMEOUT: Duration = Duration::from_secs(60);

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

    /// A server on `port` (which the caller found free), with extra arguments.
    pub fn start_on(port: u16, extra: &[&str]) -> Redis {
        Redis::start_in(tempfile::tempdir().expect("temp dir"), Some(port), extra)
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
        let mut dir = Some(dir);
        for _ in 0..10 {
            let port = port.unwrap_or_else(free_port);
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
                .args(extra)
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

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid this test started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// A `locked-run` command with no inherited LOCKED_RUN_* settings.
pub fn locked_run() -> Command {
    let mut cmd = Command::new(BIN);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKED_RUN") || key == "REDISCLI_AUTH" {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// What a finished process left.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Output {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// A started process whose output is collected in the background.
pub struct Running {
    pub child: Child,
    pub started: Instant,
    out: mpsc::Receiver<(bool, String)>,
}

pub fn spawn(mut cmd: Command) -> Running {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let (tx, rx) = mpsc::channel();
    for (is_err, mut pipe) in [
        (
            false,
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        ),
        (true, Box::new(child.stderr.take().unwrap())),
    ] {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            let _ = tx.send((is_err, text));
        });
    }
    Running {
        child,
        started: Instant::now(),
        out: rx,
    }
}

impl Running {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the exit (at most `timeout`, else the process is killed and the test fails).
    pub fn wait_for(mut self, timeout: Duration) -> Output {
        let status = wait_timeout(&mut self.child, timeout).unwrap_or_else(|| {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!(
                "process {} still running after {timeout:?}",
                self.child.id()
            );
        });
        let elapsed = self.started.elapsed();
        let (mut stdout, mut stderr) = (String::new(), String::new());
        for _ in 0..2 {
            match self.out.recv_timeout(Duration::from_secs(10)) {
                Ok((true, text)) => stderr = text,
                Ok((false, text)) => stdout = text,
                Err(_) => panic!(
                    "output pipes of {} still open 10s after its exit",
                    self.child.id()
                ),
            }
        }
        Output {
            status,
            stdout,
            stderr,
            elapsed,
        }
    }

    pub fn wait(self) -> Output {
        self.wait_for(HARD_TIMEOUT)
    }
}

/// Runs to completion under the hard timeout.
pub fn run(cmd: Command) -> Output {
    spawn(cmd).wait()
}

/// Runs `locked-run ARGS...` to completion (`lr().args(ARGS).run()`).
pub fn run_args(args: &[&str]) -> Output {
    lr().args(args).run()
}

/// Waits for `child` to exit, up to `timeout`, without polling: a pidfd becomes readable when
/// the process exits.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    if !wait_pid_exit(child.id() as i32, timeout) {
        return None;
    }
    Some(child.wait().expect("wait"))
}

/// Blocks until process `pid` (not necessarily our child) has exited, up to `timeout`; true if
/// it did. The instant this returns is the exit's evidence.
pub fn wait_pid_exit(pid: i32, timeout: Duration) -> bool {
    // SAFETY: pidfd_open(2) returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return true; // already gone (and reaped)
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n > 0 {
            return true;
        }
        if n == 0 {
            return false;
        }
    }
}

/// Waits until `path` holds content for which `ready` is true, re-reading it every few ms, up
/// to `timeout`: the file is the child's own evidence of where it is.
pub fn wait_for_file(path: &Path, timeout: Duration, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if ready(&text) {
                return text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} not ready after {timeout:?}",
            path.display()
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until a condition on Redis (or anything else) holds, re-checking every few ms.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what}: not true after {timeout:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// A scratch directory for the children's logs.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

pub fn file(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// The `file://` URL of a lock directory.
pub fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// The fence counter of the lock whose files in `dir` are named `stem`.
pub fn fence_file(dir: &Path, stem: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{stem}.fence"))).unwrap()
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

/// How many clients are subscribed to NAME's release channel on `redis`.
pub fn subscribers(redis: &Redis, name: &str) -> i64 {
    let reply: Vec<redis::Value> =
        redis.cmd(&["PUBSUB", "NUMSUB", &format!("released:{{{name}}}")]);
    match reply.get(1) {
        Some(redis::Value::Int(n)) => *n,
        other => panic!("{other:?}"),
    }
}

pub fn sh(script: &str) -> [&str; 3] {
    ["sh", "-c", script]
}

pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(cmd: &mut Command, items: I) {
    cmd.args(items);
}

/// Whether a process exists (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some(Some('Z')) | Some(Some('X')))
        }
        Err(_) => false,
    }
}

/// Starts `locked-run -u URL EXTRA job sh -c '<record pid> ; CHILD'` and returns it with the
/// pid of its child (the shell, which `exec`s into whatever CHILD runs last).
pub fn start_job(url: &str, dir: &Path, extra: &[&str], child: &str) -> (Running, i32) {
    let pid_file = dir.join("pid");
    let running = lr()
        .url(url)
        .args(extra)
        .name("job")
        .sh(&format!(
            "echo $$ > {p}.tmp; mv {p}.tmp {p}; {child}",
            p = path_str(&pid_file)
        ))
        .spawn();
    let pid = wait_for_file(&pid_file, Duration::from_secs(10), |t| t.ends_with('\n'))
        .trim()
        .parse()
        .unwrap();
    (running, pid)
}

/// The earliest instant the server can expire `lock:{job}`, read just before a fault: no
/// renewal after the read can make it earlier.
pub fn expiry_lower_bound(redis: &Redis) -> Instant {
    let before = Instant::now();
    let pttl: i64 = redis.cmd(&["PTTL", "lock:{job}"]);
    assert!(pttl > 0, "the lock is held with a lease: {pttl}");
    before + Duration::from_millis(pttl as u64)
}

/// A child that appends `start FENCE T` and `end FENCE T` (T: CLOCK_MONOTONIC, ns) to the shared
/// log, holding the lock 5-25 ms; on SIGTERM it logs its end and exits.
pub const CRITICAL_SECTION: &str = r#"
use Time::HiRes qw(clock_gettime CLOCK_MONOTONIC sleep);
my ($log) = @ARGV; my $f = $ENV{LOCKED_RUN_FENCE};
sub note { open(my $h, ">>", $log) or die; printf $h "%s %d %d %d\n", $_[0], $f, int(clock_gettime(CLOCK_MONOTONIC) * 1e9), $$; close $h; }
$SIG{TERM} = sub { note("end"); exit 143 };
note("start"); sleep(0.005 + rand(0.02)); note("end");
"#;

pub struct Section {
    fence: u64,
    start: u64,
    end: Option<u64>,
}

/// At no instant do more than `limit` critical sections of `log` run at once, and no fence is
/// issued twice; returns the number of sections and the most that ran at once. (Of several
/// holders, two that acquire one after the other may start their commands in either order, so
/// start order says nothing of fence order.)
pub fn check_concurrency(log: &Path, limit: usize) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut events: Vec<(u64, i32)> = Vec::new();
    let mut fences = std::collections::BTreeSet::new();
    let mut starts = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let t: u64 = f[2].parse().unwrap();
        if f[0] == "start" {
            starts += 1;
            assert!(
                fences.insert(f[1].to_owned()),
                "fence {} issued twice",
                f[1]
            );
            events.push((t, 1));
        } else {
            events.push((t, -1));
        }
    }
    // At equal instants an end counts before a start.
    events.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        most = most.max(now);
    }
    assert!(
        most as usize <= limit,
        "{most} sections ran at once; the limit is {limit}"
    );
    (starts, most as usize)
}

/// No two critical sections overlap, and fences grow strictly in start order.
pub fn check_log(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut by_pid: BTreeMap<u64, Section> = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (kind, fence, t, pid): (&str, u64, u64, u64) = (
            f[0],
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        );
        match kind {
            "start" => {
                by_pid.insert(
                    pid,
                    Section {
                        fence,
                        start: t,
                        end: None,
                    },
                );
            }
            _ => by_pid.get_mut(&pid).expect("end after start").end = Some(t),
        }
    }
    let mut sections: Vec<Section> = by_pid.into_values().collect();
    sections.sort_by_key(|s| s.start);
    for pair in sections.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let end = a
            .end
            .unwrap_or_else(|| panic!("fence {}: a section that never ended", a.fence));
        assert!(
            end < b.start,
            "fences {} and {} overlap by {} us",
            a.fence,
            b.fence,
            (end - b.start) / 1000
        );
        assert!(
            b.fence > a.fence,
            "fence {} started after fence {}",
            b.fence,
            a.fence
        );
    }
    sections.len()
}

/// A test CA, a server certificate for localhost and 127.0.0.1, a client certificate, and a
/// second CA that signed none of them; made with openssl.
pub struct Certs {
    pub dir: tempfile::TempDir,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Certs {
    pub fn make() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_path_buf();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&d)
                .output()
                .expect("openssl is installed (see .ci/run)");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (key, crt, subject) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=locked-run test {ca}"),
            );
            let mut args = vec!["req", "-x509"];
            args.extend(ec);
            args.extend([
                "-keyout", &key, "-out", &crt, "-days", "2", "-subj", &subject,
            ]);
            openssl(&args);
        }
        std::fs::write(
            d.join("san.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
        )
        .unwrap();
        for who in ["server", "client"] {
            let (key, csr, crt, subject) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.crt"),
                format!("/CN={who}"),
            );
            let mut args = vec!["req"];
            args.extend(ec);
            args.extend(["-keyout", &key, "-out", &csr, "-subj", &subject]);
            openssl(&args);
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ]);
        }
        Certs {
            ca: d.join("ca.crt"),
            other_ca: d.join("other-ca.crt"),
            server_cert: d.join("server.crt"),
            server_key: d.join("server.key"),
            client_cert: d.join("client.crt"),
            client_key: d.join("client.key"),
            dir,
        }
    }
}
