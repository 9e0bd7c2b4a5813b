//! Topologies of several servers: a primary with a replica and three sentinels, a
//! three-primary Redis Cluster, and five independent servers for Redlock; and the first two
//! secured at every hop (TLS only, ACL users).

use std::time::Duration;

use super::*;

/// A primary, a replica in sync, and three sentinels watching them as `mymaster`.
pub struct Watched {
    pub primary: Redis,
    pub replica: Redis,
    /// With [`Watched::start_through_proxy`]: the replica's link to the primary, which a test
    /// may blackhole so that the replica falls behind while it still answers the sentinels.
    pub link: Option<proxy::Proxy>,
    sentinels: Vec<std::process::Child>,
    pub ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl Drop for Watched {
    fn drop(&mut self) {
        for s in &mut self.sentinels {
            let _ = s.kill();
            let _ = s.wait();
        }
    }
}

impl Watched {
    pub fn start() -> Watched {
        Watched::start_with(false)
    }

    /// The replica replicates through a fault proxy ([`Watched::link`]). The sentinels would
    /// "fix" a replica whose primary has another address once the failover timeout has passed
    /// since they met it: it is 60 s here, far beyond a test.
    pub fn start_through_proxy() -> Watched {
        Watched::start_with(true)
    }

    fn start_with(through_proxy: bool) -> Watched {
        let primary = Redis::start();
        let link = through_proxy.then(|| proxy::Proxy::start(primary.port));
        let upstream = link.as_ref().map_or(primary.port, |l| l.port);
        let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &upstream.to_string()]);
        wait_until("the replica is in sync", Duration::from_secs(10), || {
            replica
                .cmd::<String>(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        let dir = scratch();
        let mut sentinels = Vec::new();
        let mut ports = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = file(&dir, &format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {d}\nsentinel monitor mymaster 127.0.0.1 {p} 2\n\
                     sentinel down-after-milliseconds mymaster 2000\nsentinel failover-timeout mymaster {t}\n",
                    d = path_str(dir.path()),
                    p = primary.port,
                    t = if through_proxy { 60_000 } else { 10_000 },
                ),
            )
            .unwrap();
            let child = std::process::Command::new(server_bin())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            sentinels.push(child);
            ports.push(port);
        }
        let watched = Watched {
            primary,
            replica,
            link,
            sentinels,
            ports,
            _dir: dir,
        };
        let replica_port = watched.replica.port.to_string();
        wait_until(
            "the sentinels know the primary and its replica",
            Duration::from_secs(20),
            || {
                watched.ports.iter().all(|p| {
                    let out = sentinel_cli(*p, &["SENTINEL", "replicas", "mymaster"]);
                    out.contains(&replica_port) && !out.contains("s_down")
                })
            },
        );
        watched
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/mymaster", hosts.join(","))
    }

    /// Forces a failover and waits until the replica is the primary the sentinels name.
    pub fn fail_over(&self) {
        // Until a sentinel has had the replica's own INFO, it calls no replica suitable
        // (NOGOODSLAVE): ask until it accepts.
        wait_until(
            "SENTINEL FAILOVER accepted",
            Duration::from_secs(30),
            || {
                let out = sentinel_cli(self.ports[0], &["SENTINEL", "FAILOVER", "mymaster"]);
                assert!(
                    out.contains("OK") || out.contains("NOGOODSLAVE"),
                    "SENTINEL FAILOVER: {out}"
                );
                out.contains("OK")
            },
        );
        let replica_port = self.replica.port.to_string();
        wait_until("the replica was promoted", Duration::from_secs(30), || {
            sentinel_cli(
                self.ports[0],
                &["SENTINEL", "get-master-addr-by-name", "mymaster"],
            )
            .contains(&replica_port)
                && self
                    .replica
                    .cmd::<String>(&["INFO", "replication"])
                    .contains("role:master")
        });
    }
}

pub fn sentinel_cli(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new(cli_bin())
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Three primaries of a Redis Cluster, created with `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let nodes: Vec<Redis> = (0..3).map(|_| cluster_node()).collect();
        let mut create = std::process::Command::new(cli_bin());
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        wait_until("the cluster is up", Duration::from_secs(20), || {
            cluster.nodes.iter().all(|n| {
                n.cmd::<String>(&["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            })
        });
        cluster
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Starts moving `key`'s slot, and the keys in it, to another node (returned); until
    /// `finish_moving`, its old owner answers ASK for keys no longer there.
    pub fn begin_moving(&self, key: &str) -> &Redis {
        let slot = self.slot(key).to_string();
        let source = self.owner(key);
        let target = self.nodes.iter().find(|n| n.port != source.port).unwrap();
        let (source_id, target_id): (String, String) = (
            source.cmd(&["CLUSTER", "MYID"]),
            target.cmd(&["CLUSTER", "MYID"]),
        );
        let _: String = target.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id]);
        let _: String = source.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id]);
        let keys: Vec<String> = source.cmd(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
        let mut migrate = vec![
            "MIGRATE".to_owned(),
            "127.0.0.1".into(),
            target.port.to_string(),
            "".into(),
            "0".into(),
            "5000".into(),
            "KEYS".into(),
        ];
        migrate.extend(keys);
        let migrate: Vec<&str> = migrate.iter().map(String::as_str).collect();
        let _: String = source.cmd(&migrate);
        target
    }

    /// Gives `key`'s slot to `target` on every node (after `begin_moving`).
    pub fn finish_moving(&self, key: &str, target: &Redis) {
        let slot = self.slot(key).to_string();
        let target_id: String = target.cmd(&["CLUSTER", "MYID"]);
        for n in &self.nodes {
            let _: String = n.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
        }
    }

    pub fn slot(&self, key: &str) -> i64 {
        self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key])
    }

    /// The node that owns `key`'s slot.
    pub fn owner(&self, key: &str) -> &Redis {
        let owner = self.owner_id(self.slot(key));
        self.nodes
            .iter()
            .find(|n| n.cmd::<String>(&["CLUSTER", "MYID"]) == owner)
            .unwrap()
    }

    pub fn owner_id(&self, slot: i64) -> String {
        let slots: Vec<redis::Value> = self.nodes[0].cmd(&["CLUSTER", "SLOTS"]);
        for range in slots {
            let redis::Value::Array(items) = range else {
                continue;
            };
            let (redis::Value::Int(start), redis::Value::Int(end)) = (&items[0], &items[1]) else {
                continue;
            };
            if (*start..=*end).contains(&slot) {
                if let redis::Value::Array(primary) = &items[2] {
                    if let Some(redis::Value::BulkString(id)) = primary.get(2) {
                        return String::from_utf8_lossy(id).into_owned();
                    }
                }
            }
        }
        panic!("nobody owns slot {slot}")
    }
}

/// A server in cluster mode. Its cluster bus port is `--cluster-port` (Redis 7, Valkey), or,
/// before Redis 7, always its port + 10000: then a port is chosen whose bus port is free too.
fn cluster_node() -> Redis {
    let cluster = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
    ]
    .map(String::from);
    // The bus port is drawn afresh with the data port on every try: another test's server may
    // take either between the draw and the start.
    Redis::start_drawing(|| {
        let mut args = cluster.to_vec();
        if server_kind().version >= (7, 0) {
            args.extend(["--cluster-port".to_string(), free_port().to_string()]);
            return (free_port(), args);
        }
        loop {
            let port = free_port();
            let bus_free =
                port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok();
            if bus_free {
                return (port, args);
            }
        }
    })
}

/// Five independent servers, for Redlock.
pub struct Five {
    pub servers: Vec<Redis>,
}

impl Five {
    pub fn start() -> Five {
        Five {
            servers: (0..5).map(|_| Redis::start()).collect(),
        }
    }

    pub fn url_args(&self) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|r| ["-u".to_owned(), r.url()])
            .collect()
    }

    /// How many servers hold `lock:{job}` with `value`.
    pub fn holding(&self, value: &str) -> usize {
        self.servers
            .iter()
            .filter(|r| r.child_alive() && r.get("lock:{job}").as_deref() == Some(value))
            .count()
    }
}

impl Redis {
    /// Whether this server is still running (killed ones are skipped by the checks).
    pub fn child_alive(&self) -> bool {
        alive(self.pid_if_running().unwrap_or(-1))
    }
}

/// `locked-run` on the five servers (as a builder: `lr().on(&five)`). Each may take up to
/// 500 ms to answer an attempt: the default, T/100, is 300 ms for T = 30 s and 20 ms for
/// T = 2 s, which five servers and their clients on two loaded cores can miss, and these tests
/// are not about that timeout (`a_slow_server_does_not_stall_the_acquisition` is).
pub fn locked_run_on(five: &Five) -> std::process::Command {
    lr().on(five).into_command()
}

/// The data nodes' ACL user of the secured fixtures ([`SecuredWatched`], [`SecuredCluster`]).
pub const DATA_USER: &str = "locker";
pub const DATA_PASS: &str = "data-node-secret";
/// The sentinels' own ACL user, apart from the data nodes'.
pub const SENTINEL_USER: &str = "watcher";
pub const SENTINEL_PASS: &str = "sentinel-secret";

/// A TLS-only server process of a secured fixture (its port is the TLS port), killed on drop.
pub struct TlsProcess {
    pub port: u16,
    child: std::process::Child,
}

impl Drop for TlsProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TlsProcess {
    /// Starts `redis-server ARGS` (a config file, or options) on a TLS port it is given, and
    /// waits until `ready` (asked with the port) says it answers.
    fn start(args: impl Fn(u16) -> Vec<String>, ready: impl Fn(u16) -> bool) -> TlsProcess {
        for _ in 0..10 {
            let port = free_port();
            let child = std::process::Command::new(server_bin())
                .args(args(port))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("redis-server is installed");
            let mut process = TlsProcess { port, child };
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if let Ok(Some(_)) = process.child.try_wait() {
                    break; // the port was taken meanwhile: try another
                }
                if ready(port) {
                    return process;
                }
                assert!(
                    Instant::now() < deadline,
                    "TLS server on {port} did not answer"
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("could not start a TLS redis-server");
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

/// `redis-cli` over TLS (trusting `ca`, with the tests' client certificate) as `user`, to
/// `port`.
pub fn tls_cli(certs: &Certs, ca: &Path, port: u16, user: (&str, &str), args: &[&str]) -> String {
    let out = std::process::Command::new(cli_bin())
        .args(["--tls", "--cacert", path_str(ca)])
        .args(["--cert", path_str(&certs.client_cert)])
        .args(["--key", path_str(&certs.client_key)])
        .args(["--user", user.0, "--pass", user.1, "--no-auth-warning"])
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The certificates of a secured fixture: the tests' [`Certs`], and what the servers trust and
/// show (the data nodes may show a certificate of the other CA, which every server trusts
/// and the client, given only the tests' CA, does not).
pub struct Trust {
    pub certs: Certs,
    /// What the servers trust: the tests' CA, and the other one too when the data nodes
    /// show its certificate.
    pub servers_ca: PathBuf,
    /// The data nodes' certificate and key.
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
}

impl Trust {
    /// With `other_ca`, the data nodes' certificate is signed by the other CA.
    pub fn make(other_ca: bool) -> Trust {
        let certs = Certs::make();
        if !other_ca {
            return Trust {
                servers_ca: certs.ca.clone(),
                node_cert: certs.server_cert.clone(),
                node_key: certs.server_key.clone(),
                certs,
            };
        }
        let d = certs.dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "node.key",
            "-out",
            "node.csr",
            "-subj",
            "/CN=node",
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "node.csr",
            "-CA",
            "other-ca.crt",
            "-CAkey",
            "other-ca.key",
            "-CAcreateserial",
            "-out",
            "node.crt",
            "-days",
            "2",
            "-extfile",
            "san.ext",
        ]);
        let bundle = format!(
            "{}{}",
            std::fs::read_to_string(&certs.ca).unwrap(),
            std::fs::read_to_string(&certs.other_ca).unwrap()
        );
        std::fs::write(d.join("both-cas.crt"), bundle).unwrap();
        Trust {
            servers_ca: d.join("both-cas.crt"),
            node_cert: d.join("node.crt"),
            node_key: d.join("node.key"),
            certs,
        }
    }

    /// `redis-cli` over TLS to `port` as `user`.
    pub fn cli(&self, port: u16, user: (&str, &str), args: &[&str]) -> String {
        tls_cli(&self.certs, &self.servers_ca, port, user, args)
    }

    /// `--tls-ca-cert` (the tests' CA only), `--tls-cert`, `--tls-key`.
    pub fn client_args(&self) -> Vec<String> {
        vec![
            "--tls-ca-cert".into(),
            path_str(&self.certs.ca).into(),
            "--tls-cert".into(),
            path_str(&self.certs.client_cert).into(),
            "--tls-key".into(),
            path_str(&self.certs.client_key).into(),
        ]
    }
}

/// TLS options every secured server takes: TLS only, client certificates required (so that
/// `--tls-cert`/`--tls-key` must reach every hop), TLS between the servers too.
fn tls_server_args(trust: &Trust, cert: &Path, key: &Path, port: u16) -> Vec<String> {
    [
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--tls-cert-file",
        path_str(cert),
        "--tls-key-file",
        path_str(key),
        "--tls-ca-cert-file",
        path_str(&trust.servers_ca),
        "--tls-auth-clients",
        "yes",
        "--tls-replication",
        "yes",
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A TLS-only data node with the ACL user [`DATA_USER`] and no default user.
fn secured_node(trust: &Trust, dir: &Path, extra: &[&str]) -> TlsProcess {
    TlsProcess::start(
        |port| {
            let mut args = tls_server_args(trust, &trust.node_cert, &trust.node_key, port);
            args.extend(
                [
                    "--dir",
                    path_str(dir),
                    // Each word apart: one argument would be a user name with spaces.
                    "--user",
                    "default",
                    "off",
                    "--user",
                    DATA_USER,
                    "on",
                    &format!(">{DATA_PASS}"),
                    "~*",
                    "&*",
                    "+@all",
                    "--masteruser",
                    DATA_USER,
                    "--masterauth",
                    DATA_PASS,
                ]
                .map(str::to_owned),
            );
            args.extend(extra.iter().map(|s| s.to_string()));
            args
        },
        |port| trust.cli(port, (DATA_USER, DATA_PASS), &["PING"]).trim() == "PONG",
    )
}

/// [`Watched`], secured at every hop: a primary, a replica and three sentinels, all TLS-only
/// with client certificates required; the data nodes with the ACL user [`DATA_USER`], the
/// sentinels with their own, [`SENTINEL_USER`]; no default user anywhere.
pub struct SecuredWatched {
    pub trust: Trust,
    pub primary: TlsProcess,
    pub replica: TlsProcess,
    pub sentinels: Vec<TlsProcess>,
    _dirs: Vec<tempfile::TempDir>,
}

impl SecuredWatched {
    pub fn start() -> SecuredWatched {
        SecuredWatched::start_with(false)
    }

    /// With `other_ca`, the data nodes show a certificate of the other CA (which the sentinels
    /// trust, and a client given only the tests' CA does not).
    pub fn start_with(other_ca: bool) -> SecuredWatched {
        let trust = Trust::make(other_ca);
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| scratch()).collect();
        let primary = secured_node(&trust, dirs[0].path(), &[]);
        let replica = secured_node(
            &trust,
            dirs[1].path(),
            &["--replicaof", "127.0.0.1", &primary.port.to_string()],
        );
        let data = (DATA_USER, DATA_PASS);
        wait_until("the replica is in sync", Duration::from_secs(10), || {
            trust
                .cli(replica.port, data, &["INFO", "replication"])
                .contains("master_link_status:up")
        });
        let sentinels = (0..3)
            .map(|i| {
                let conf = file(&dirs[2], &format!("sentinel-{i}.conf"));
                let dir = path_str(dirs[2].path()).to_owned();
                TlsProcess::start(
                    |port| {
                        std::fs::write(
                            &conf,
                            format!(
                                "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {dir}\n\
                                 tls-cert-file {cert}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n\
                                 tls-auth-clients yes\ntls-replication yes\n\
                                 user default off\nuser {SENTINEL_USER} on >{SENTINEL_PASS} allchannels +@all\n\
                                 sentinel sentinel-user {SENTINEL_USER}\nsentinel sentinel-pass {SENTINEL_PASS}\n\
                                 sentinel monitor mymaster 127.0.0.1 {p} 2\n\
                                 sentinel auth-user mymaster {DATA_USER}\nsentinel auth-pass mymaster {DATA_PASS}\n\
                                 sentinel down-after-milliseconds mymaster 2000\n\
                                 sentinel failover-timeout mymaster 10000\n",
                                cert = path_str(&trust.certs.server_cert),
                                key = path_str(&trust.certs.server_key),
                                ca = path_str(&trust.servers_ca),
                                p = primary.port,
                            ),
                        )
                        .unwrap();
                        vec![path_str(&conf).to_owned(), "--sentinel".to_owned()]
                    },
                    |port| {
                        trust.cli(port, (SENTINEL_USER, SENTINEL_PASS), &["PING"]).trim()
                            == "PONG"
                    },
                )
            })
            .collect();
        let watched = SecuredWatched {
            trust,
            primary,
            replica,
            sentinels,
            _dirs: dirs,
        };
        let replica_port = watched.replica.port.to_string();
        wait_until(
            "the sentinels know the primary, its replica and each other",
            Duration::from_secs(30),
            || {
                watched.sentinels.iter().all(|s| {
                    let replicas = watched.sentinel(s.port, &["SENTINEL", "replicas", "mymaster"]);
                    let master = watched.sentinel(s.port, &["SENTINEL", "master", "mymaster"]);
                    replicas.contains(&replica_port)
                        && !replicas.contains("s_down")
                        && master.contains("num-other-sentinels\n2")
                })
            },
        );
        watched
    }

    /// `redis-cli` to a sentinel, as [`SENTINEL_USER`].
    pub fn sentinel(&self, port: u16, args: &[&str]) -> String {
        self.trust.cli(port, (SENTINEL_USER, SENTINEL_PASS), args)
    }

    /// `redis-cli` to a data node, as [`DATA_USER`].
    pub fn data(&self, node: &TlsProcess, args: &[&str]) -> String {
        self.trust.cli(node.port, (DATA_USER, DATA_PASS), args)
    }

    /// The sentinels, `host:port,...`.
    pub fn hosts(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        hosts.join(",")
    }

    /// `rediss+sentinel://locker:PASSWORD@SENTINELS/mymaster`: for LOCKED_RUN_URL, not argv.
    pub fn url(&self) -> String {
        format!(
            "rediss+sentinel://{DATA_USER}:{DATA_PASS}@{}/mymaster",
            self.hosts()
        )
    }

    /// `--tls-ca-cert`, `--tls-cert`, `--tls-key` with the tests' CA and client certificate.
    pub fn tls_args(&self) -> Vec<String> {
        self.trust.client_args()
    }

    /// Forces a failover and waits until the replica is the primary the sentinels name.
    pub fn fail_over(&self) {
        let first = self.sentinels[0].port;
        wait_until(
            "SENTINEL FAILOVER accepted",
            Duration::from_secs(30),
            || {
                let out = self.sentinel(first, &["SENTINEL", "FAILOVER", "mymaster"]);
                assert!(
                    out.contains("OK") || out.contains("NOGOODSLAVE"),
                    "SENTINEL FAILOVER: {out}"
                );
                out.contains("OK")
            },
        );
        let replica_port = self.replica.port.to_string();
        wait_until("the replica was promoted", Duration::from_secs(30), || {
            self.sentinel(first, &["SENTINEL", "get-master-addr-by-name", "mymaster"])
                .contains(&replica_port)
                && self
                    .data(&self.replica, &["INFO", "replication"])
                    .contains("role:master")
        });
    }
}

/// [`Cluster`], secured: three primaries, TLS only (client certificates required, TLS on the
/// cluster bus), the ACL user [`DATA_USER`] and no default user.
pub struct SecuredCluster {
    pub trust: Trust,
    pub nodes: Vec<TlsProcess>,
    _dirs: Vec<tempfile::TempDir>,
}

impl SecuredCluster {
    pub fn start() -> SecuredCluster {
        let trust = Trust::make(false);
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| scratch()).collect();
        let nodes: Vec<TlsProcess> = dirs
            .iter()
            .map(|dir| {
                let bus = free_port().to_string();
                secured_node(
                    &trust,
                    dir.path(),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-port",
                        &bus,
                        "--tls-cluster",
                        "yes",
                    ],
                )
            })
            .collect();
        let mut create = std::process::Command::new(cli_bin());
        create
            .args(["--tls", "--cacert", path_str(&trust.servers_ca)])
            .args(["--cert", path_str(&trust.certs.client_cert)])
            .args(["--key", path_str(&trust.certs.client_key)])
            .args([
                "--user",
                DATA_USER,
                "--pass",
                DATA_PASS,
                "--no-auth-warning",
            ])
            .args(["--cluster", "create"]);
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = SecuredCluster {
            trust,
            nodes,
            _dirs: dirs,
        };
        wait_until("the cluster is up", Duration::from_secs(20), || {
            cluster.nodes.iter().all(|n| {
                cluster
                    .trust
                    .cli(n.port, (DATA_USER, DATA_PASS), &["CLUSTER", "INFO"])
                    .contains("cluster_state:ok")
            })
        });
        cluster
    }

    /// `rediss+cluster://locker:PASSWORD@NODES`: for LOCKED_RUN_URL, not argv.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!(
            "rediss+cluster://{DATA_USER}:{DATA_PASS}@{}",
            hosts.join(",")
        )
    }
}
