//! Sentinel: a primary, a replica in sync and three sentinels watching them as `mymaster`
//! ([`Watched`]), and the same secured at every hop ([`SecuredWatched`]: TLS only, ACL users).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::process::wait_until;
use super::proxy::Proxy;
use super::server::{Redis, cli_bin, free_port, loopback_hosts, server_bin};
use super::tls::{
    DATA_PASS, DATA_USER, SENTINEL_PASS, SENTINEL_USER, TlsProcess, Trust, secured_node,
};
use super::{file, path_str, scratch};

/// A primary's own setting: it starts a replica's first (diskless) sync at once, where it
/// would wait 5 s for more replicas to share it (the default): most of a topology's start.
const NO_SYNC_DELAY: [&str; 2] = ["--repl-diskless-sync-delay", "0"];

/// A primary, a replica in sync, and three sentinels watching them as `mymaster`.
pub struct Watched {
    pub primary: Redis,
    pub replica: Redis,
    /// With [`Watched::start_through_proxy`]: the replica's link to the primary, which a test
    /// may blackhole so that the replica falls behind while it still answers the sentinels.
    #[allow(dead_code)] // the chaos suite's alone
    pub link: Option<Proxy>,
    sentinels: Vec<Child>,
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
    #[allow(dead_code)] // the chaos suite's alone
    pub fn start_through_proxy() -> Watched {
        Watched::start_with(true)
    }

    fn start_with(through_proxy: bool) -> Watched {
        let primary = Redis::start_with(&NO_SYNC_DELAY);
        let link = through_proxy.then(|| Proxy::start(primary.port));
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
            let child = Command::new(server_bin())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
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
        format!(
            "redis+sentinel://{}/mymaster",
            loopback_hosts(self.ports.iter().copied())
        )
    }

    /// Forces a failover and waits until the replica is the primary the sentinels name.
    pub fn fail_over(&self) {
        fail_over(
            |args| sentinel_cli(self.ports[0], args),
            self.replica.port,
            || self.replica.cmd(&["INFO", "replication"]),
        );
    }
}

/// Forces a failover of `mymaster` through one sentinel (`ask`) and waits until the replica on
/// `replica_port` is the primary the sentinels name, and says so itself (`replication`: its
/// `INFO replication`).
fn fail_over(ask: impl Fn(&[&str]) -> String, replica_port: u16, replication: impl Fn() -> String) {
    // Until a sentinel has had the replica's own INFO, it calls no replica suitable
    // (NOGOODSLAVE): ask until it accepts.
    wait_until(
        "SENTINEL FAILOVER accepted",
        Duration::from_secs(30),
        || {
            let out = ask(&["SENTINEL", "FAILOVER", "mymaster"]);
            assert!(
                out.contains("OK") || out.contains("NOGOODSLAVE"),
                "SENTINEL FAILOVER: {out}"
            );
            out.contains("OK")
        },
    );
    let replica_port = replica_port.to_string();
    wait_until("the replica was promoted", Duration::from_secs(30), || {
        ask(&["SENTINEL", "get-master-addr-by-name", "mymaster"]).contains(&replica_port)
            && replication().contains("role:master")
    });
}

/// `redis-cli -p PORT ARGS...` to a sentinel: what it printed.
pub fn sentinel_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new(cli_bin())
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
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
        let primary = secured_node(&trust, dirs[0].path(), &NO_SYNC_DELAY);
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
        loopback_hosts(self.sentinels.iter().map(|s| s.port))
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
        fail_over(
            |args| self.sentinel(self.sentinels[0].port, args),
            self.replica.port,
            || self.data(&self.replica, &["INFO", "replication"]),
        );
    }
}
