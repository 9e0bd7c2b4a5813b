//! A recorded layout put back into a fresh store, as the release that wrote it left it: Redis
//! keys with their values, etcd keys on leases of their own, a directory's files with a process
//! holding each flock the recording saw. What the recording's holders kept alive (expiries,
//! lease ends, queue keep-alives) is moved to the present and a minute beyond, so that the
//! state lasts the test through.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::support::*;

/// How far ahead of now the loaded state's lease ends and keep-alives are put.
const AHEAD_MS: i64 = 60_000;

/// Writes `entries` (one scenario's recorded keys) into `redis`, but those `keep` refuses.
/// `recorded_ms` is the server's clock when they were read: sorted-set scores near it are
/// times, moved by as much as the clock has moved since, plus [`AHEAD_MS`].
pub fn into_redis(redis: &Redis, entries: &[Value], recorded_ms: i64, keep: impl Fn(&str) -> bool) {
    let shift = super::layout::redis_time_ms(redis) - recorded_ms + AHEAD_MS;
    for entry in entries {
        let key = entry["key"].as_str().unwrap();
        if !keep(key) {
            continue;
        }
        let value = &entry["value"];
        let mut args: Vec<String> = Vec::new();
        match entry["type"].as_str().unwrap() {
            "string" => args.extend(["SET".into(), key.into(), value.as_str().unwrap().into()]),
            "hash" => {
                args.extend(["HSET".into(), key.into()]);
                for (field, v) in value.as_object().unwrap() {
                    args.extend([field.clone(), v.as_str().unwrap().into()]);
                }
            }
            "zset" => {
                args.extend(["ZADD".into(), key.into()]);
                for pair in value.as_array().unwrap() {
                    let score = pair[1].as_f64().unwrap() as i64;
                    let score = if (score - recorded_ms).abs() < 86_400_000 {
                        score + shift
                    } else {
                        score
                    };
                    args.extend([score.to_string(), pair[0].as_str().unwrap().into()]);
                }
            }
            "list" | "set" => {
                let verb = if entry["type"] == "list" {
                    "RPUSH"
                } else {
                    "SADD"
                };
                args.extend([verb.into(), key.into()]);
                for v in value.as_array().unwrap() {
                    args.push(v.as_str().unwrap().into());
                }
            }
            other => panic!("{key}: a {other}"),
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let _: redis::Value = redis.cmd(&args);
        if entry["pttl"].as_i64().unwrap() > 0 {
            let _: i64 = redis.cmd(&["PEXPIRE", key, &AHEAD_MS.to_string()]);
        }
    }
}

/// Writes `entries` (one scenario's recorded keys, in the order they were created) into
/// `etcd`, each key that had a lease on a new one of a minute, its name following the lease
/// (the lock's keys are `NAME/<lease id, hex>`).
pub fn into_etcd(etcd: &Etcd, entries: &[Value]) {
    for entry in entries {
        let mut key = entry["key"].as_str().unwrap().to_owned();
        let value = entry["value"].as_str().unwrap();
        let mut put = vec!["put".to_owned()];
        if let Some(old) = entry["lease"].as_str() {
            let out = etcd.ctl(&["lease", "grant", &(AHEAD_MS / 1000).to_string()]);
            assert_eq!(out.code(), Some(0), "{out:?}");
            // "lease 694d7c3a1b2f0e0a granted with TTL(60s)"
            let new = out.stdout.split_whitespace().nth(1).unwrap().to_owned();
            key = key.replace(old, &new);
            put.push(format!("--lease={new}"));
        }
        put.extend(["--".to_owned(), key, value.to_owned()]);
        let put: Vec<&str> = put.iter().map(String::as_str).collect();
        let out = etcd.ctl(&put);
        assert_eq!(out.code(), Some(0), "{out:?}");
    }
}

/// Writes `entries` (one scenario's recorded files) into `dir`, and takes each flock the
/// recording saw with flock(1), in a process that holds it until dropped. A file's `pid=` line
/// then names that process, as the 0.1.0 run's named itself: a record whose pid is not the
/// flock's holder is one `status` rightly takes for stale.
pub fn into_dir(dir: &std::path::Path, entries: &[Value]) -> Vec<Running> {
    let mut holders = Vec::new();
    let signals = scratch();
    for entry in entries {
        let path = dir.join(entry["file"].as_str().unwrap());
        std::fs::write(&path, entry["content"].as_str().unwrap()).unwrap();
        let Some(mode) = entry["flock"].as_str() else {
            continue;
        };
        let ready = signals.path().join(format!("{}.ready", holders.len()));
        let mut cmd = std::process::Command::new("timeout");
        cmd.args(["-s", "KILL", "60", "flock", "-o"])
            .arg(if mode == "shared" { "-s" } else { "-x" })
            .arg(&path)
            .args([
                "sh",
                "-c",
                "echo $PPID > \"$0\".tmp; mv \"$0\".tmp \"$0\"; exec cat",
            ])
            .arg(&ready)
            .stdin(Stdio::piped());
        holders.push(spawn(cmd));
        let pid = wait_for_file(&ready, Duration::from_secs(10), |t| t.ends_with('\n'));
        let content: String = entry["content"]
            .as_str()
            .unwrap()
            .split_inclusive('\n')
            .map(|line| match line.strip_prefix("pid=") {
                Some(_) => format!("pid={}\n", pid.trim()),
                None => line.to_owned(),
            })
            .collect();
        std::fs::write(&path, content).unwrap();
    }
    holders
}
