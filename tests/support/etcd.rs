//! Real etcd for the `etcd://` tests: one member, or a cluster of three, on free loopback ports,
//! each with its data in a temporary directory, killed (SIGKILL) when dropped and also should
//! the test's thread die first (PDEATHSIG); `etcdctl` against them, under the hard timeout;
//! what a member counts of the requests it served (its metrics).
//!
//! Which etcd: the binary `LOCKED_RUN_TEST_ETCD` names (a path, or a name on PATH), `etcd` on
//! PATH by default (Debian's 3.4). CI runs the etcd tests again on 3.7, the binary the crate
//! `etcd-bin-vendored` carries. `etcdctl` is always the one on PATH.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::certs::Certs;
use super::process::{Output, run};
use super::server::free_port;

/// The etcd binary the tests start (see above).
pub fn etcd_binary() -> String {
    std::env::var("LOCKED_RUN_TEST_ETCD")
        .ok()
        .filter(|b| !b.is_empty())
        .unwrap_or_else(|| "etcd".into())
}

/// The version of the etcd binary the tests start: (major, minor, patch).
pub fn etcd_version() -> (u64, u64, u64) {
    static VERSION: std::sync::OnceLock<(u64, u64, u64)> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        let mut cmd = Command::new(etcd_binary());
        cmd.arg("--version");
        let out = run(cmd);
        let line = out.stdout.lines().next().unwrap_or_default().to_owned();
        let version = line.rsplit(' ').next().unwrap_or_default();
        let mut parts = version.split('.').map(|p| p.parse().unwrap_or(0));
        let mut next = || parts.next().unwrap_or(0);
        (next(), next(), next())
    })
}

/// Whether this etcd may revoke a live lease once a leader that stalled longer than the lease
/// resumes (etcd issue 12528; fixed in 3.4.31, 3.5.13 and 3.6.0).
pub fn revokes_after_a_stalled_leader() -> bool {
    match etcd_version() {
        (3, 4, patch) => patch < 31,
        (3, 5, patch) => patch < 13,
        (3, minor, _) => minor < 4,
        _ => false,
    }
}

/// One etcd member.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    child: Option<Child>,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    #[allow(dead_code)] // the fault harness's alone (it stops and resumes a member)
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An etcd cluster of one or three members.
pub struct Etcd {
    pub members: Vec<Member>,
    pub dir: tempfile::TempDir,
    /// Over TLS, with these certificates (clients must show one).
    tls: Option<TlsFiles>,
}

/// The certificates of a TLS member: its own, and the CA it trusts for clients.
#[derive(Clone)]
struct TlsFiles {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for member in &mut self.members {
            member.kill();
        }
    }
}

impl Etcd {
    /// One member, answering.
    pub fn start() -> Etcd {
        Etcd::start_members(1, None)
    }

    /// Three members, with a leader elected.
    pub fn start_cluster() -> Etcd {
        Etcd::start_members(3, None)
    }

    /// One member serving its clients over TLS only, with the test's certificates, and asking
    /// clients for theirs.
    pub fn start_tls(certs: &Certs) -> Etcd {
        let tls = TlsFiles {
            ca: certs.ca.clone(),
            cert: certs.server_cert.clone(),
            key: certs.server_key.clone(),
            client_cert: certs.client_cert.clone(),
            client_key: certs.client_key.clone(),
        };
        Etcd::start_members(1, Some(tls))
    }

    fn start_members(n: usize, tls: Option<TlsFiles>) -> Etcd {
        for _ in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let members: Vec<Member> = (0..n)
                .map(|i| Member {
                    name: format!("m{i}"),
                    client_port: free_port(),
                    peer_port: free_port(),
                    child: None,
                })
                .collect();
            let mut etcd = Etcd {
                members,
                dir,
                tls: tls.clone(),
            };
            let cluster: Vec<String> = etcd
                .members
                .iter()
                .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
                .collect();
            let cluster = cluster.join(",");
            let token = format!("locked-run-test-{}", etcd.members[0].peer_port);
            for i in 0..n {
                let child = etcd.spawn(i, &cluster, &token);
                etcd.members[i].child = Some(child);
            }
            if etcd.healthy(Duration::from_secs(20)) {
                return etcd;
            }
            // A port taken meanwhile: start again on others.
        }
        panic!("could not start etcd on free ports");
    }

    fn spawn(&self, i: usize, cluster: &str, token: &str) -> Child {
        let m = &self.members[i];
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", m.name))).unwrap();
        let mut cmd = Command::new(etcd_binary());
        cmd.args(["--name", &m.name])
            .arg("--data-dir")
            .arg(self.dir.path().join(&m.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", token])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(tls) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        // SAFETY: prctl is async-signal-safe; the member dies with the thread that started it,
        // should the test die before it drops the fixture.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        cmd.spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (see .ci/run)", etcd_binary()))
    }

    /// Member `i` SIGKILLed and started again on its ports, with its data directory as it was
    /// or, with `wipe`, emptied first (an empty restart; for a one-member cluster, where the
    /// member then starts a new one). Waits until it is healthy, retrying while its port is
    /// not yet free. The member dies with the calling thread (PDEATHSIG): call this from a
    /// thread that outlives the member's use.
    #[allow(dead_code)] // the fault harness's alone
    pub fn restart(&mut self, i: usize, wipe: bool) {
        let cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let cluster = cluster.join(",");
        let token = format!("locked-run-test-{}", self.members[0].peer_port);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            self.members[i].kill();
            if wipe {
                let _ = std::fs::remove_dir_all(self.dir.path().join(&self.members[i].name));
            }
            let child = self.spawn(i, &cluster, &token);
            self.members[i].child = Some(child);
            if self.healthy(deadline.saturating_duration_since(Instant::now())) {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every running member says it is healthy (a leader is elected); false if a
    /// member exited (its port was taken).
    fn healthy(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        for i in 0..self.members.len() {
            loop {
                let child = self.members[i].child.as_mut().unwrap();
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
                if self.answers(i) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd {} did not become healthy within {timeout:?}: {}",
                    self.members[i].name,
                    self.log(i)
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
        true
    }

    /// Whether member `i` says it is healthy.
    fn answers(&self, i: usize) -> bool {
        if self.tls.is_none() {
            return http_get(self.members[i].client_port, "/health")
                .contains("\"health\":\"true\"");
        }
        let mut cmd = self.ctl_command(&["endpoint", "health"]);
        cmd.args(["--endpoints", &self.members[i].endpoint()]);
        run(cmd).code() == Some(0)
    }

    /// A member's log, for failure messages.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(
            self.dir
                .path()
                .join(format!("{}.log", self.members[i].name)),
        )
        .unwrap_or_default()
    }

    /// `etcd://` (`etcds://` over TLS) and every member's client address.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "etcds" } else { "etcd" };
        format!("{scheme}://{}", self.endpoints())
    }

    /// `etcd://` with every member's client address, member `first`'s first (a client asks
    /// the first that answers).
    pub fn url_from(&self, first: usize) -> String {
        let mut endpoints = vec![self.members[first].endpoint()];
        endpoints.extend(
            (0..self.members.len())
                .filter(|&i| i != first)
                .map(|i| self.members[i].endpoint()),
        );
        format!("etcd://{}", endpoints.join(","))
    }

    /// The running members' client addresses, comma-separated (for etcdctl).
    pub fn endpoints(&self) -> String {
        let running: Vec<String> = self
            .members
            .iter()
            .filter(|m| m.running())
            .map(Member::endpoint)
            .collect();
        running.join(",")
    }

    /// `etcdctl ARGS...` against the running members, run to completion.
    pub fn ctl(&self, args: &[&str]) -> Output {
        run(self.ctl_command(args))
    }

    /// `etcdctl ARGS...` run to completion with `input` on its standard input (`etcdctl txn`
    /// reads its operations there).
    pub fn ctl_with_input(&self, args: &[&str], input: &str) -> Output {
        let mut cmd = self.ctl_command(args);
        cmd.stdin(Stdio::piped());
        let mut running = super::process::spawn(cmd);
        let mut stdin = running.child.stdin.take().unwrap();
        stdin.write_all(input.as_bytes()).unwrap();
        drop(stdin);
        running.wait()
    }

    /// `etcdctl ARGS...`, for a test to spawn.
    pub fn ctl_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoints(), "--command-timeout=5s"])
            .stdin(Stdio::null());
        if let Some(tls) = &self.tls {
            cmd.arg("--cacert")
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client_cert)
                .arg("--key")
                .arg(&tls.client_key);
        }
        cmd.args(args);
        cmd
    }

    /// The keys under `prefix`, each with its create revision and lease, lowest revision first.
    pub fn keys(&self, prefix: &str) -> Vec<(String, i64, i64)> {
        let out = self.ctl(&["get", "--prefix", prefix, "-w", "json"]);
        assert_eq!(out.code(), Some(0), "{out:?}");
        let reply: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        let mut keys: Vec<(String, i64, i64)> = reply["kvs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|kv| {
                let key = base64_decode(kv["key"].as_str().unwrap());
                let num = |f: &str| kv[f].as_i64().unwrap_or(0);
                (key, num("create_revision"), num("lease"))
            })
            .collect();
        keys.sort_by_key(|k| k.1);
        keys
    }

    /// How many leases etcd has.
    pub fn leases(&self) -> usize {
        let out = self.ctl(&["lease", "list", "-w", "json"]);
        assert_eq!(out.code(), Some(0), "{out:?}");
        let reply: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        reply["leases"].as_array().map_or(0, Vec::len)
    }

    /// How many leases have a key on them: a released run's lease holds none, and lapses
    /// by itself.
    pub fn leases_holding_keys(&self) -> usize {
        let out = self.ctl(&["lease", "list", "-w", "json"]);
        assert_eq!(out.code(), Some(0), "{out:?}");
        let reply: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        let ids: Vec<u64> = reply["leases"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["id"].as_u64())
            .collect();
        ids.iter()
            .filter(|id| {
                let hex = format!("{id:x}");
                let out = self.ctl(&["lease", "timetolive", &hex, "--keys", "-w", "json"]);
                assert_eq!(out.code(), Some(0), "{out:?}");
                let reply: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
                reply["keys"]
                    .as_array()
                    .is_some_and(|keys| !keys.is_empty())
            })
            .count()
    }

    /// A lease's remaining TTL in seconds (etcd truncates it), from its id in hex.
    pub fn time_to_live(&self, lease_hex: &str) -> i64 {
        let out = self.ctl(&["lease", "timetolive", lease_hex, "-w", "json"]);
        assert_eq!(out.code(), Some(0), "{out:?}");
        let reply: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        reply["ttl"].as_i64().unwrap()
    }

    /// The leader's member id, when every running member names the same one.
    pub fn leader_id(&self) -> Option<u64> {
        let out = self.ctl(&["endpoint", "status", "-w", "json"]);
        let reply: serde_json::Value = serde_json::from_str(out.stdout.trim()).ok()?;
        let statuses = reply.as_array()?;
        let ids: Vec<u64> = statuses
            .iter()
            .filter_map(|s| s["Status"]["leader"].as_u64())
            .collect();
        let agreed = ids.len() == self.members.iter().filter(|m| m.running()).count()
            && ids.windows(2).all(|w| w[0] == w[1]);
        ids.first().copied().filter(|&id| agreed && id != 0)
    }

    /// The index of the member that leads, when every running member names the same one.
    #[allow(dead_code)] // the fault harness's alone
    pub fn leader_index(&self) -> Option<usize> {
        let id = self.leader_id()?;
        let out = self.ctl(&["endpoint", "status", "-w", "json"]);
        let reply: serde_json::Value = serde_json::from_str(out.stdout.trim()).ok()?;
        let endpoint = reply.as_array()?.iter().find_map(|status| {
            let s = &status["Status"];
            (s["header"]["member_id"].as_u64() == Some(id)).then(|| status["Endpoint"].as_str())?
        })?;
        self.members
            .iter()
            .position(|m| endpoint.ends_with(&m.endpoint()))
    }

    /// The index of the leader, as the running members say.
    pub fn leader(&self) -> usize {
        let out = self.ctl(&["endpoint", "status", "-w", "json"]);
        assert_eq!(out.code(), Some(0), "{out:?}");
        let reply: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        for status in reply.as_array().unwrap() {
            let s = &status["Status"];
            if s["header"]["member_id"] == s["leader"] {
                let endpoint = status["Endpoint"].as_str().unwrap();
                return self
                    .members
                    .iter()
                    .position(|m| endpoint.ends_with(&m.endpoint()))
                    .unwrap();
            }
        }
        panic!("no leader among {reply}");
    }
}

/// What member `i`'s metrics count, by gRPC method: calls started (`grpc_server_started_total`,
/// a stream counted once) and messages received (`grpc_server_msg_received_total`, each
/// keep-alive of a stream counted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub started: std::collections::BTreeMap<String, u64>,
    pub received: std::collections::BTreeMap<String, u64>,
}

impl Served {
    pub fn started(&self, method: &str) -> u64 {
        self.started.get(method).copied().unwrap_or(0)
    }

    pub fn received(&self, method: &str) -> u64 {
        self.received.get(method).copied().unwrap_or(0)
    }

    /// What was served since `before`.
    pub fn since(&self, before: &Served) -> Served {
        let less = |now: &std::collections::BTreeMap<String, u64>,
                    then: &std::collections::BTreeMap<String, u64>| {
            now.iter()
                .map(|(m, n)| (m.clone(), n - then.get(m).copied().unwrap_or(0)))
                .filter(|(_, n)| *n > 0)
                .collect()
        };
        Served {
            started: less(&self.started, &before.started),
            received: less(&self.received, &before.received),
        }
    }
}

impl Etcd {
    /// What member `i` has served so far (see [`Served`]).
    pub fn served(&self, i: usize) -> Served {
        let text = http_get(self.members[i].client_port, "/metrics");
        let mut served = Served::default();
        for line in text.lines() {
            let (counter, rest) = if let Some(r) = line.strip_prefix("grpc_server_started_total{") {
                (&mut served.started, r)
            } else if let Some(r) = line.strip_prefix("grpc_server_msg_received_total{") {
                (&mut served.received, r)
            } else {
                continue;
            };
            let Some((_, after)) = rest.split_once("grpc_method=\"") else {
                continue;
            };
            let (method, _) = after.split_once('"').unwrap();
            let count: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            *counter.entry(method.to_owned()).or_insert(0) += count;
        }
        served
    }
}

/// `GET path` on a loopback port; the whole reply, or nothing.
fn http_get(port: u16, path: &str) -> String {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply
}

pub fn base64_decode(text: &str) -> String {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}
