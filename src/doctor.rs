//! `locked-run doctor`: checks the Redis setup against what the lease and the fence need, and
//! says why, server by server: OK, WARN or FAIL lines (or JSON), exit 1 when anything FAILs.
//!
//! Per server: reachability and round trip, version, role (a replica is FAIL), cluster mode,
//! `maxmemory-policy`, persistence (for fence tokens that survive a restart), permissions (ACL
//! DRYRUN of every command the scripts run), and the server's clock against this host's. With
//! several servers (Redlock): whether they are truly independent, and their clocks against
//! each other. For `file://`: the directory, and the filesystem it is on.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cli::DoctorArgs;
use crate::exit::{Exit, Failure};
use crate::file;
use crate::lease::{Timings, show};
use crate::name::LockName;
use crate::node::Node;
use crate::resp::Reply;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    fn word(self) -> &'static str {
        match self {
            Level::Ok => "OK",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        }
    }
}

struct Check {
    server: String,
    check: &'static str,
    level: Level,
    detail: String,
}

/// What one server told about itself, for the checks across servers.
#[derive(Default)]
struct Facts {
    run_id: Option<String>,
    /// host:port of the server this one replicates, if a replica.
    primary: Option<String>,
    /// host:port of its replicas.
    replicas: Vec<String>,
    /// The server's clock minus this host's, in ms.
    skew_ms: Option<i64>,
}

/// Runs the checks and prints them; exit 1 when any FAILed.
pub fn doctor(args: &DoctorArgs) -> Result<Exit, Failure> {
    let name = LockName::new(&args.name).map_err(Failure::usage)?;
    let nodes = match crate::open_servers(&args.conn)? {
        crate::Servers::Dir(url) => {
            let dir = file::dir_of(&url).map_err(Failure::usage)?;
            return Ok(report(&check_dir(&url, &dir, &name), args.json));
        }
        crate::Servers::Redis(nodes) => nodes,
    };
    for node in &nodes {
        node.set_hash_tag(name.as_str());
    }
    let runtime = crate::runtime()?;
    let checks = runtime.block_on(async {
        let mut checks = Vec::new();
        let mut facts = Vec::new();
        for node in &nodes {
            let (mut server_checks, server_facts) = check_server(node, &name).await;
            checks.append(&mut server_checks);
            facts.push((node.address().to_owned(), node.endpoint(), server_facts));
        }
        if nodes.len() > 1 {
            checks.extend(across_servers(&facts));
        }
        checks
    });
    Ok(report(&checks, args.json))
}

/// Prints the checks; exit 1 when any FAILed.
fn report(checks: &[Check], as_json: bool) -> Exit {
    let failed = checks.iter().any(|c| c.level == Level::Fail);
    if as_json {
        let list: Vec<_> = checks
            .iter()
            .map(|c| json!({"server": c.server, "check": c.check, "status": c.level.word(), "detail": c.detail}))
            .collect();
        println!("{}", json!({"ok": !failed, "checks": list}));
    } else {
        let width = checks.iter().map(|c| c.server.len()).max().unwrap_or(0);
        for c in checks {
            println!(
                "{:<4} {:<width$}  {}: {}",
                c.level.word(),
                c.server,
                c.check,
                c.detail
            );
        }
        let count = |l: Level| checks.iter().filter(|c| c.level == l).count();
        println!(
            "doctor: {} OK, {} WARN, {} FAIL",
            count(Level::Ok),
            count(Level::Warn),
            count(Level::Fail)
        );
    }
    Exit::Checked { failed }
}

/// The host-local backend: the directory can be used, and its filesystem suits locks.
fn check_dir(url: &str, dir: &Path, name: &LockName) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut add = |check: &'static str, level: Level, detail: String| {
        checks.push(Check {
            server: url.to_owned(),
            check,
            level,
            detail,
        })
    };
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let existing = if dir.is_dir() {
        add("directory", Level::Ok, format!("{} exists", dir.display()));
        dir
    } else if dir.exists() {
        add(
            "directory",
            Level::Fail,
            format!("{} is not a directory", dir.display()),
        );
        return checks;
    } else if parent.is_dir() {
        add(
            "directory",
            Level::Ok,
            format!(
                "{} does not exist yet: the first run creates it (0755)",
                dir.display()
            ),
        );
        parent
    } else {
        add(
            "directory",
            Level::Fail,
            format!(
                "neither {} nor its parent exist: create it, or fix the URL",
                dir.display()
            ),
        );
        return checks;
    };
    match nix::unistd::access(
        existing,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    ) {
        Ok(()) => add(
            "writable",
            Level::Ok,
            format!("{} is writable by this user", existing.display()),
        ),
        Err(e) => add(
            "writable",
            Level::Fail,
            format!(
                "{} is not writable by this user ({e}): every user of a lock needs to create and write its files there",
                existing.display()
            ),
        ),
    }
    match nix::sys::statfs::statfs(existing) {
        Ok(fs) => {
            // The magic number's C type differs between targets.
            #[allow(clippy::unnecessary_cast)]
            let (level, detail) = filesystem(fs.filesystem_type().0 as i64);
            add("filesystem", level, detail);
        }
        Err(e) => add(
            "filesystem",
            Level::Warn,
            format!("cannot tell the filesystem: {e}"),
        ),
    }
    // Who else may write there.
    let shared = existing
        .metadata()
        .is_ok_and(|m| m.permissions().mode() & 0o002 != 0);
    let temporary = ["/tmp", "/var/tmp"].iter().any(|t| dir.starts_with(t));
    if temporary {
        add(
            "location",
            Level::Warn,
            format!(
                "{} is under a temporary directory: systemd-tmpfiles deletes files there that were not \
                 used for days (a fence counter deleted starts again at 1), and another user can create \
                 the directory first; use a directory of its own on disk (/var/lib/locked-run)",
                dir.display()
            ),
        );
    } else if shared {
        add(
            "location",
            Level::Warn,
            format!(
                "{} is writable by every user: anyone can delete or replace its lock files; \
                 give it to the users of the locks (a group, mode 2775)",
                existing.display()
            ),
        );
    } else {
        add(
            "location",
            Level::Ok,
            format!("{} is not writable by every user", existing.display()),
        );
    }
    match file::check_files(dir, name) {
        Ok(detail) => add("files", Level::Ok, detail),
        Err(detail) => add("files", Level::Fail, detail),
    }
    checks
}

const NFS: i64 = 0x6969;

/// What a filesystem (by `statfs` magic number) means for flock and fence counters.
fn filesystem(magic: i64) -> (Level, String) {
    const VOLATILE: &[(i64, &str)] = &[(0x0102_1994, "tmpfs"), (0x8584_58f6, "ramfs")];
    const NETWORK: &[(i64, &str)] = &[
        (0x517b, "SMB"),
        (0xff53_4d42, "CIFS"),
        (0xfe53_4d42, "SMB2"),
        (0x6573_5546, "FUSE"),
        (0x00c3_6400, "Ceph"),
        (0x0102_1997, "9p"),
    ];
    if let Some((_, fs)) = VOLATILE.iter().find(|(m, _)| *m == magic) {
        return (
            Level::Warn,
            format!(
                "{fs}: the fence counters are lost at reboot, and fence tokens start again at 1; use a directory on disk (/var/lib/...)"
            ),
        );
    }
    if magic == NFS {
        return (
            Level::Fail,
            "NFS: flock there is emulated with byte-range locks, which lock exclusively only \
             files open for writing, and raising a fence locks the directory: every run would \
             fail (69); keep file:// locks on a local filesystem, and use Redis across hosts"
                .into(),
        );
    }
    if let Some((_, fs)) = NETWORK.iter().find(|(m, _)| *m == magic) {
        return (
            Level::Warn,
            format!(
                "{fs}, a network filesystem: flock there may be local to this host or emulated with leases the server can drop; \
                 for locks across hosts use Redis"
            ),
        );
    }
    (Level::Ok, format!("a local filesystem (type {magic:#x})"))
}

async fn check_server(node: &Node, name: &LockName) -> (Vec<Check>, Facts) {
    let server = node.address().to_owned();
    let mut checks = Vec::new();
    let mut facts = Facts::default();
    let mut add = |check: &'static str, level: Level, detail: String| {
        checks.push(Check {
            server: server.clone(),
            check,
            level,
            detail,
        })
    };
    let timeout = node.connect_timeout();

    // Reachability: the first PING connects, the second measures the round trip.
    if let Err(e) = node.exchange(&[&[b"PING"]], timeout, None).await {
        add("reachable", Level::Fail, e.to_string());
        return (checks, facts);
    }
    let started = Instant::now();
    let _ = node.exchange(&[&[b"PING"]], timeout, None).await;
    add(
        "reachable",
        Level::Ok,
        format!(
            "round trip {:.2} ms",
            started.elapsed().as_secs_f64() * 1000.0
        ),
    );

    // INFO: version, role, cluster mode, identity.
    let info = match node
        .exchange(&[&[b"INFO"]], timeout, None)
        .await
        .map(|mut r| r.remove(0))
    {
        Ok(Reply::Error(e)) => {
            add(
                "info",
                Level::Warn,
                format!("cannot read INFO ({e}): version and role not checked"),
            );
            HashMap::new()
        }
        Ok(reply) => parse_info(&reply.as_text().unwrap_or_default()),
        Err(e) => {
            add("info", Level::Warn, format!("{e}"));
            HashMap::new()
        }
    };
    if let Some(version) = info.get("redis_version") {
        let major: u32 = version
            .split('.')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        match major {
            0..=2 => add(
                "version",
                Level::Fail,
                format!("Redis {version}: too old for the lock's scripts; use Redis 6 or newer"),
            ),
            3..=5 => add(
                "version",
                Level::Warn,
                format!(
                    "Redis {version}: no RESP3, so waiters need a second connection; Redis 6 or newer is better"
                ),
            ),
            _ => add("version", Level::Ok, format!("Redis {version}")),
        }
    }
    facts.run_id = info.get("run_id").cloned();
    match info.get("role").map(String::as_str) {
        Some("slave") => {
            let primary = format!(
                "{}:{}",
                info.get("master_host").map_or("?", String::as_str),
                info.get("master_port").map_or("?", String::as_str)
            );
            add(
                "role",
                Level::Fail,
                format!(
                    "a replica of {primary}: it refuses writes (READONLY), and a lock held on a replica is lost on failover; \
                     point --url at the primary (or use redis+sentinel://)"
                ),
            );
            facts.primary = Some(primary);
        }
        Some(role) => add("role", Level::Ok, role.replace("master", "primary")),
        None => {}
    }
    for (key, value) in &info {
        if key.starts_with("slave") && key[5..].chars().all(|c| c.is_ascii_digit()) {
            let field = |f: &str| {
                value
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{f}=")).map(str::to_owned))
            };
            if let (Some(ip), Some(port)) = (field("ip"), field("port")) {
                facts.replicas.push(format!("{ip}:{port}"));
            }
        }
    }
    if info.get("cluster_enabled").map(String::as_str) == Some("1") {
        if node.is_cluster() {
            add(
                "cluster",
                Level::Ok,
                "Redis Cluster, reached through redis+cluster://".into(),
            );
        } else {
            add(
                "cluster",
                Level::Fail,
                "this server is part of a Redis Cluster: use redis+cluster:// so the lock's slot is found".into(),
            );
        }
    }

    // Configuration: eviction and persistence.
    let config = node
        .exchange(
            &[
                &[b"CONFIG", b"GET", b"maxmemory"],
                &[b"CONFIG", b"GET", b"maxmemory-policy"],
                &[b"CONFIG", b"GET", b"appendonly"],
                &[b"CONFIG", b"GET", b"appendfsync"],
            ],
            timeout,
            None,
        )
        .await;
    match config {
        Ok(replies) if replies.iter().all(|r| !matches!(r, Reply::Error(_))) => {
            let value = |i: usize| {
                replies
                    .get(i)
                    .and_then(|r| r.items().get(1))
                    .and_then(Reply::as_text)
                    .unwrap_or_default()
            };
            let (maxmemory, policy, aof, fsync) = (value(0), value(1), value(2), value(3));
            if maxmemory == "0" {
                add(
                    "maxmemory-policy",
                    Level::Ok,
                    "no memory limit: nothing is evicted".into(),
                );
            } else if policy == "noeviction" {
                add(
                    "maxmemory-policy",
                    Level::Ok,
                    "noeviction: nothing of the lock's is evicted; writes fail (OOM) when full"
                        .into(),
                );
            } else if policy.starts_with("allkeys") {
                add(
                    "maxmemory-policy",
                    Level::Warn,
                    format!(
                        "{policy}: can evict fence:{{NAME}} counters (fence tokens repeat) and held locks (two holders); use noeviction"
                    ),
                );
            } else {
                add(
                    "maxmemory-policy",
                    Level::Warn,
                    format!(
                        "{policy}: can evict keys with an expiry, a held lock among them; use noeviction"
                    ),
                );
            }
            match (aof.as_str(), fsync.as_str()) {
                ("yes", "always") => add("persistence", Level::Ok, "AOF with appendfsync always: fence counters survive a restart".into()),
                ("yes", _) => add(
                    "persistence",
                    Level::Warn,
                    format!("AOF with appendfsync {fsync}: a crash can lose the last second of writes, fence counters included; appendfsync always keeps fence tokens monotonic across restarts"),
                ),
                _ => add(
                    "persistence",
                    Level::Warn,
                    "no AOF: a restart loses or rewinds the fence counters (to the last snapshot), and fence tokens repeat; \
                     appendonly yes with appendfsync always keeps them monotonic"
                        .into(),
                ),
            }
        }
        Ok(replies) => {
            let why = replies.iter().find_map(|r| {
                if let Reply::Error(e) = r {
                    Some(e.clone())
                } else {
                    None
                }
            });
            add(
                "config",
                Level::Warn,
                format!(
                    "cannot read the configuration ({}): check maxmemory-policy (noeviction) and persistence (appendfsync always) yourself",
                    why.unwrap_or_default()
                ),
            );
        }
        Err(e) => add("config", Level::Warn, e.to_string()),
    }

    // Permissions: every command the lock's scripts and waiters use, on its keys.
    let (lock, fence, holder, channel) = (
        name.lock_key(),
        name.fence_key(),
        name.holder_key(),
        name.channel(),
    );
    let (publish, subscribe): (&str, &str) = if node.is_cluster() {
        ("SPUBLISH", "SSUBSCRIBE")
    } else {
        ("PUBLISH", "SUBSCRIBE")
    };
    let needed: Vec<Vec<&str>> = vec![
        vec!["EVALSHA", "0", "0"],
        vec!["EVAL", "return 1", "0"],
        vec!["SET", &lock, "x"],
        vec!["GET", &lock],
        vec!["DEL", &lock],
        vec!["PEXPIRE", &lock, "1"],
        vec!["PTTL", &lock],
        vec!["INCR", &fence],
        vec!["TYPE", &fence],
        vec!["HSET", &holder, "f", "v"],
        vec!["HMGET", &holder, "f"],
        vec![publish, &channel, "x"],
        vec![subscribe, &channel],
    ];
    let whoami = node
        .exchange(&[&[b"ACL", b"WHOAMI"]], timeout, None)
        .await
        .map(|mut r| r.remove(0));
    match whoami {
        Ok(Reply::Error(e)) if e.contains("unknown") => add(
            "permissions",
            Level::Ok,
            "no ACLs on this server (before Redis 6): everything is permitted".into(),
        ),
        Ok(Reply::Error(_)) | Err(_) => add(
            "permissions",
            Level::Warn,
            "cannot run ACL WHOAMI: permissions not checked (see the README's ACL section)".into(),
        ),
        Ok(user) => {
            let user = user.as_text().unwrap_or_else(|| "default".into());
            let dry: Vec<Vec<&[u8]>> = needed
                .iter()
                .map(|cmd| {
                    let mut args: Vec<&[u8]> = vec![b"ACL", b"DRYRUN", user.as_bytes()];
                    args.extend(cmd.iter().map(|a| a.as_bytes()));
                    args
                })
                .collect();
            let batch: Vec<&[&[u8]]> = dry.iter().map(Vec::as_slice).collect();
            match node.exchange(&batch, timeout, None).await {
                Ok(replies) => {
                    let denied: Vec<String> = needed
                        .iter()
                        .zip(&replies)
                        .filter(|(_, r)| !matches!(r, Reply::Status(s) if s == "OK"))
                        .map(|(cmd, r)| match r {
                            Reply::Error(e) if e.starts_with("NOPERM") && cmd[0] == "EVALSHA" => {
                                "ACL DRYRUN itself".to_owned()
                            }
                            _ => cmd[0].to_owned(),
                        })
                        .collect();
                    if denied.iter().any(|d| d == "ACL DRYRUN itself") {
                        add(
                            "permissions",
                            Level::Warn,
                            format!(
                                "user {user} may not run ACL DRYRUN: permissions not checked (see the README's ACL section)"
                            ),
                        );
                    } else if denied.is_empty() {
                        add(
                            "permissions",
                            Level::Ok,
                            format!("user {user} may run every command the lock uses, on its keys"),
                        );
                    } else {
                        add(
                            "permissions",
                            Level::Fail,
                            format!(
                                "user {user} may not run {} on the lock's keys or channel; see the README's ACL section",
                                denied.join(", ")
                            ),
                        );
                    }
                }
                Err(e) => add("permissions", Level::Warn, e.to_string()),
            }
        }
    }

    // The server's clock against this host's.
    let before = crate::backend::wall_clock_ms() as i64;
    let started = Instant::now();
    let time = node.exchange(&[&[b"TIME"]], timeout, None).await;
    let rtt = started.elapsed();
    let reply = match time {
        Ok(mut replies) if !replies.is_empty() => replies.remove(0),
        Ok(_) => Reply::Bulk(None),
        Err(e) => Reply::Error(e.to_string()),
    };
    let items = reply.items();
    match (
        items.first().and_then(Reply::as_int),
        items.get(1).and_then(Reply::as_int),
    ) {
        (Some(secs), Some(micros)) => {
            let server = secs * 1000 + micros / 1000;
            let local = before + rtt.as_millis() as i64 / 2;
            let skew = server - local;
            facts.skew_ms = Some(skew);
            let allowance = Timings::drift_for(Duration::from_secs(30));
            let level = if skew.unsigned_abs() > allowance.as_millis() as u64 {
                Level::Warn
            } else {
                Level::Ok
            };
            add(
                "clock",
                level,
                format!(
                    "{skew:+} ms against this host (drift allowance of the default lease: {}){}",
                    show(allowance),
                    if level == Level::Warn {
                        "; leases hold only while clocks drift apart by less than that: check NTP"
                    } else {
                        ""
                    }
                ),
            );
        }
        _ => {
            let why = match reply {
                Reply::Error(e) => e,
                _ => "an unexpected reply".into(),
            };
            add(
                "clock",
                Level::Warn,
                format!("cannot read the server's TIME ({why}): its clock not checked"),
            );
        }
    }
    (checks, facts)
}

/// Redlock: the servers must be distinct and independent, with clocks that agree.
fn across_servers(facts: &[(String, String, Facts)]) -> Vec<Check> {
    let mut checks = Vec::new();
    let mut add = |server: &str, check: &'static str, level: Level, detail: String| {
        checks.push(Check {
            server: server.to_owned(),
            check,
            level,
            detail,
        })
    };
    let mut independent = true;
    for (i, (url, endpoint, f)) in facts.iter().enumerate() {
        for (other_url, other_endpoint, g) in &facts[i + 1..] {
            if f.run_id.is_some() && f.run_id == g.run_id {
                independent = false;
                add(
                    url,
                    "independence",
                    Level::Fail,
                    format!(
                        "the same server as {other_url} (same run_id): it would be counted twice in a quorum"
                    ),
                );
            }
            if f.replicas.contains(other_endpoint) || g.primary.as_ref() == Some(endpoint) {
                independent = false;
                add(
                    url,
                    "independence",
                    Level::Fail,
                    format!("{other_url} replicates it: Redlock needs independent primaries"),
                );
            }
            if g.replicas.contains(endpoint) || f.primary.as_ref() == Some(other_endpoint) {
                independent = false;
                add(
                    url,
                    "independence",
                    Level::Fail,
                    format!("it replicates {other_url}: Redlock needs independent primaries"),
                );
            }
            if let (Some(a), Some(b)) = (f.skew_ms, g.skew_ms) {
                let allowance = Timings::drift_for(Duration::from_secs(30)).as_millis() as i64;
                if (a - b).abs() > allowance {
                    add(
                        url,
                        "clocks",
                        Level::Warn,
                        format!("{:+} ms against {other_url}", a - b),
                    );
                }
            }
        }
    }
    if independent {
        add(
            "all servers",
            "independence",
            Level::Ok,
            format!(
                "{} distinct servers, no replication between them",
                facts.len()
            ),
        );
    }
    checks
}

fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where file:// cannot work at all, doctor fails; where it works with limits, it warns.
    #[test]
    fn filesystems_are_judged_by_what_flock_does_there() {
        assert_eq!(filesystem(NFS).0, Level::Fail);
        assert_eq!(filesystem(0x0102_1994).0, Level::Warn, "tmpfs");
        assert_eq!(filesystem(0xff53_4d42).0, Level::Warn, "CIFS");
        assert_eq!(filesystem(0xef53).0, Level::Ok, "ext4");
    }
}
