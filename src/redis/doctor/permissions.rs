//! `doctor`'s permissions check: whether this user may run every command the lock's runs, waiters,
//! scripts and `status` use, on NAME's keys and channel, asked of the server with `ACL DRYRUN`.

use std::time::Duration;

use super::Level;
use super::version::{Feature, Server};
use crate::name::LockName;
use crate::redis::keys::Keys;
use crate::redis::node::Node;
use crate::redis::resp::Reply;

/// The permissions check's level and detail.
pub(super) async fn check(
    node: &Node,
    name: &LockName,
    kind: Option<&Server>,
    timeout: Duration,
) -> (Level, String) {
    let needed = needed_commands(name, node.sharded_pubsub());
    let whoami = node
        .exchange(&[&[b"ACL", b"WHOAMI"]], timeout, None)
        .await
        .map(|mut r| r.remove(0));
    match whoami {
        Ok(Reply::Error(e)) if e.contains("unknown") => (
            Level::Ok,
            "no ACLs on this server (before Redis 6): everything is permitted".into(),
        ),
        Ok(Reply::Error(_)) | Err(_) => (
            Level::Warn,
            "cannot run ACL WHOAMI: permissions not checked (see the README's ACL section)".into(),
        ),
        Ok(user) if kind.is_some_and(|k| !k.has(Feature::AclDryRun)) => (
            Level::Warn,
            format!(
                "user {}: permissions not checked ({} has no ACL DRYRUN); see the README's ACL section",
                user.as_text().unwrap_or_else(|| "default".into()),
                kind.map_or_else(String::new, Server::to_string)
            ),
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
                            _ if cmd[0].starts_with("EVAL") || cmd.len() < 2 => cmd[0].clone(),
                            _ => format!("{} {}", cmd[0], cmd[1]),
                        })
                        .collect();
                    if denied.iter().any(|d| d == "ACL DRYRUN itself") {
                        (
                            Level::Warn,
                            format!(
                                "user {user} may not run ACL DRYRUN: permissions not checked (see the README's ACL section)"
                            ),
                        )
                    } else if denied.is_empty() {
                        (
                            Level::Ok,
                            format!("user {user} may run every command the lock uses, on its keys"),
                        )
                    } else {
                        (
                            Level::Fail,
                            format!(
                                "user {user} may not run {} on the lock's keys or channel; see the README's ACL section",
                                denied.join(", ")
                            ),
                        )
                    }
                }
                Err(e) => (Level::Warn, e.to_string()),
            }
        }
    }
}

/// Every command a run, a waiter, `status` or one of the scripts may send, each with the key
/// (or channel) of NAME it names and arguments of the right shape, for `ACL DRYRUN`: the
/// scripts' inner commands are checked as they would be inside the script.
fn needed_commands(name: &LockName, sharded: bool) -> Vec<Vec<String>> {
    let (publish, subscribe) = match sharded {
        true => ("SPUBLISH", "SSUBSCRIBE"),
        false => ("PUBLISH", "SUBSCRIBE"),
    };
    let sorted_set: &[&str] = &[
        "ZADD 1 x",
        "ZREM x",
        "ZRANGE 0 -1",
        "ZRANGEBYSCORE 0 1",
        "ZREMRANGEBYSCORE 0 1",
        "ZSCORE x",
        "ZRANK x",
        "ZCARD",
        "ZCOUNT 0 1",
        "PTTL",
        "PEXPIRE 1",
        "DEL",
    ];
    let hash: &[&str] = &[
        "HSET f v",
        "HGET f",
        "HMGET f",
        "HDEL f",
        "HGETALL",
        "PTTL",
        "PEXPIRE 1",
        "DEL",
    ];
    let keys = Keys::of(name);
    let by_key: [(String, &[&str]); 9] = [
        (
            keys.lock.clone(),
            &["SET x", "GET", "EXISTS", "TYPE", "PTTL", "PEXPIRE 1", "DEL"],
        ),
        (keys.fence.clone(), &["INCR", "GET", "TYPE"]),
        (keys.holder.clone(), hash),
        (keys.holders.clone(), sorted_set),
        (keys.holders_meta.clone(), hash),
        (keys.queue.clone(), sorted_set),
        (keys.queue_alive.clone(), sorted_set),
        (keys.gone.clone(), sorted_set),
        (
            keys.history.clone(),
            &["LPUSH x", "LTRIM 0 1", "LRANGE 0 1", "PEXPIRE 1"],
        ),
    ];
    let words = |line: &str| line.split(' ').map(str::to_owned).collect::<Vec<_>>();
    let mut needed = vec![
        words("EVALSHA 0 0"),
        vec!["EVAL".into(), "return 1".into(), "0".into()],
        words("TIME"),
    ];
    for (key, commands) in by_key {
        for command in commands {
            let mut args = words(command);
            args.insert(1, key.clone());
            needed.push(args);
        }
    }
    // The NAME's channel (racers, Redlock) and a fair waiter's own, `released:{NAME}:TOKEN`.
    let own = format!("{}:{}", keys.channel, crate::backend::new_token());
    for channel in [keys.channel.clone(), own] {
        needed.push(vec![publish.into(), channel.clone(), "x".into()]);
        needed.push(vec![subscribe.into(), channel]);
    }
    needed
}
