//! Topologies of several servers: a primary with a replica and three sentinels, a
//! three-primary Redis Cluster, and five independent servers for Redlock.

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
    ];
    if server_kind().version >= (7, 0) {
        let bus = free_port().to_string();
        let mut args = cluster.to_vec();
        args.extend(["--cluster-port", &bus]);
        return Redis::start_with(&args);
    }
    loop {
        let port = free_port();
        let bus_free =
            port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok();
        if bus_free {
            return Redis::start_on(port, &cluster);
        }
    }
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
