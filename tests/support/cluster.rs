//! Redis Cluster: three primaries made one with `redis-cli --cluster create` ([`Cluster`],
//! whose slots a test may move), and the same secured ([`SecuredCluster`]: TLS only, ACL users).

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use super::process::wait_until;
use super::server::{Redis, cli_bin, free_port, loopback_hosts, server_kind};
use super::tls::{DATA_PASS, DATA_USER, TlsProcess, Trust, secured_node};
use super::{path_str, scratch};

/// Three primaries of a Redis Cluster, created with `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let nodes: Vec<Redis> = (0..3).map(|_| cluster_node()).collect();
        let mut create = Command::new(cli_bin());
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
        format!(
            "redis+cluster://{}",
            loopback_hosts(self.nodes.iter().map(|n| n.port))
        )
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
            let bus_free = port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok();
            if bus_free {
                return (port, args);
            }
        }
    })
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
        let mut create = Command::new(cli_bin());
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
        format!(
            "rediss+cluster://{DATA_USER}:{DATA_PASS}@{}",
            loopback_hosts(self.nodes.iter().map(|n| n.port))
        )
    }
}
