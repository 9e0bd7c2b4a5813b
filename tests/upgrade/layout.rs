//! What a release leaves in its stores while it holds a lock: every Redis key of a NAME (type,
//! expiry, value), every etcd key (value, lease), every file of a `file://` directory (content,
//! and the flock on it), read out as JSON; and the shape of each, which two releases must share
//! for their runs to honour each other's.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::{Value, json};

use crate::support::etcd::base64_decode;
use crate::support::*;

/// The server's clock, in ms since the epoch: the scale of the sorted sets' time scores.
pub fn redis_time_ms(redis: &Redis) -> i64 {
    let time: Vec<String> = redis.cmd(&["TIME"]);
    time[0].parse::<i64>().unwrap() * 1000 + time[1].parse::<i64>().unwrap() / 1000
}

/// Every key of `name` (its `{name}` hash tag) on `redis`, by name: type, PTTL and value.
pub fn redis_keys(redis: &Redis, name: &str) -> Vec<Value> {
    let mut keys: Vec<String> = redis.cmd(&["KEYS", &format!("*{{{name}}}*")]);
    keys.sort();
    keys.into_iter()
        .map(|key| {
            let kind: String = redis.cmd(&["TYPE", &key]);
            let pttl: i64 = redis.cmd(&["PTTL", &key]);
            let value = match kind.as_str() {
                "string" => json!(redis.cmd::<String>(&["GET", &key])),
                "hash" => {
                    let pairs: BTreeMap<String, String> = redis.cmd(&["HGETALL", &key]);
                    json!(pairs)
                }
                "zset" => {
                    let pairs: Vec<(String, f64)> =
                        redis.cmd(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]);
                    json!(pairs)
                }
                "list" => json!(redis.cmd::<Vec<String>>(&["LRANGE", &key, "0", "-1"])),
                "set" => {
                    let mut members: Vec<String> = redis.cmd(&["SMEMBERS", &key]);
                    members.sort();
                    json!(members)
                }
                other => panic!("{key} is a {other}, which the layout files do not describe"),
            };
            json!({"key": key, "type": kind, "pttl": pttl, "value": value})
        })
        .collect()
}

/// Every key in `etcd`, in the order they were created: value, and the lease it is attached to
/// (in hex, as the lock's keys name it), if any.
pub fn etcd_keys(etcd: &Etcd) -> Vec<Value> {
    let out = etcd.ctl(&["get", "", "--prefix", "-w", "json"]);
    assert_eq!(out.code(), Some(0), "{out:?}");
    let reply: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let mut kvs: Vec<&Value> = reply["kvs"].as_array().into_iter().flatten().collect();
    kvs.sort_by_key(|kv| kv["create_revision"].as_i64());
    kvs.into_iter()
        .map(|kv| {
            let lease = kv["lease"].as_i64().filter(|&l| l != 0);
            json!({
                "key": base64_decode(kv["key"].as_str().unwrap()),
                "value": kv["value"].as_str().map_or(String::new(), base64_decode),
                "lease": lease.map(|l| format!("{l:x}")),
            })
        })
        .collect()
}

/// Every file of `dir`, by name: its content, and the flock on it (`exclusive` or `shared`,
/// as /proc/locks lists it), if any.
pub fn dir_files(dir: &Path) -> Vec<Value> {
    let locks = std::fs::read_to_string("/proc/locks").unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let path = dir.join(&name);
            let inode = std::fs::metadata(&path).unwrap().ino();
            let flock = locks
                .lines()
                .filter(|l| !l.contains("->"))
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|f| {
                    f.get(1) == Some(&"FLOCK")
                        && f.get(5).and_then(|d| d.rsplit(':').next()) == Some(&inode.to_string())
                })
                .map(|f| {
                    if f[3] == "WRITE" {
                        "exclusive"
                    } else {
                        "shared"
                    }
                });
            let bytes = std::fs::read(&path).unwrap();
            json!({
                "file": name,
                "content": String::from_utf8_lossy(&bytes),
                "flock": flock,
            })
        })
        .collect()
}

/// This host's name, as the runs write it into their records.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// What a recording says of one scenario, reduced to what two releases must share: each key's
/// (or file's) name and the shape of its type, expiry, value and lock, with what differs from
/// run to run (the NAME, tokens, leases, the recording host's name, numbers, times near
/// `server_ms`, the server's clock then) written as words.
pub fn shapes(
    entries: &[Value],
    name: &str,
    host: &str,
    server_ms: i64,
) -> BTreeMap<String, String> {
    let leases: Vec<String> = entries
        .iter()
        .filter_map(|e| e["lease"].as_str().map(str::to_owned))
        .collect();
    let words = |text: &str| {
        let mut text = text.replace(name, "NAME");
        for lease in &leases {
            text = text.replace(lease.as_str(), "LEASE");
        }
        words_of(&whole_words_replaced(&text, host, "HOST"))
    };
    entries
        .iter()
        .map(|e| {
            let id = e["key"].as_str().or(e["file"].as_str()).unwrap();
            let shape = match e.get("type").and_then(Value::as_str) {
                Some("zset") => {
                    let mut members: Vec<String> = e["value"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|pair| {
                            let score = pair[1].as_f64().unwrap() as i64;
                            let score = if (score - server_ms).abs() < 86_400_000 {
                                "TIME".to_owned()
                            } else {
                                words(&score.to_string())
                            };
                            format!("{} @{score}", words(pair[0].as_str().unwrap()))
                        })
                        .collect();
                    members.sort();
                    format!("zset [{}]", members.join(", "))
                }
                Some(kind) => format!("{kind} {}", words(&e["value"].to_string())),
                None if e.get("file").is_some() => {
                    format!("flock {} {}", e["flock"], words(&e["content"].to_string()))
                }
                None => format!(
                    "lease {} {}",
                    e["lease"].is_string(),
                    words(&e["value"].to_string())
                ),
            };
            let expiry = match e["pttl"].as_i64() {
                Some(-1) => " persistent",
                Some(_) => " expires",
                None => "",
            };
            (
                words(&named_after_a_lease(id, name)),
                format!("{shape}{expiry}"),
            )
        })
        .collect()
}

/// An etcd key `NAME/<hex>` as `NAME/LEASE`: a key is named after its run's holding lease,
/// and a waiter's sits on a lease of its own (its queue lease) until it holds, so the name
/// need not be the id of the lease it is found on; every version reads only its own key by
/// its name.
fn named_after_a_lease(id: &str, name: &str) -> String {
    match id
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix('/'))
    {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            format!("{name}/LEASE")
        }
        _ => id.to_owned(),
    }
}

/// `text` with `word` replaced where it stands as a whole word (a host name may be a piece of
/// other words: `vm` of `vmstat`).
fn whole_words_replaced(text: &str, word: &str, by: &str) -> String {
    let part = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_');
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = if at > 0 {
            rest[..at].chars().last()
        } else {
            out.chars().last()
        };
        let after = rest[at + word.len()..].chars().next();
        out.push_str(&rest[..at]);
        out.push_str(if part(before) || part(after) {
            word
        } else {
            by
        });
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}

/// `text` with each UUID written `UUID` and each run of digits `9`.
fn words_of(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        if i + 36 <= bytes.len() && is_uuid(&bytes[i..i + 36]) {
            out.push_str("UUID");
            i += 36;
        } else if bytes[i].is_ascii_digit() {
            out.push('9');
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn is_uuid(b: &[u8]) -> bool {
    b.iter().enumerate().all(|(i, c)| match i {
        8 | 13 | 18 | 23 => *c == b'-',
        _ => c.is_ascii_hexdigit() && !c.is_ascii_uppercase(),
    })
}

#[test]
fn shapes_keep_structure_and_drop_what_varies() {
    assert_eq!(
        whole_words_replaced("host=vm\tvmstat \"vm\"", "vm", "HOST"),
        "host=HOST\tvmstat \"HOST\""
    );
    assert_eq!(
        words_of("token=5863c135-81ad-4670-95b0-728386a711fa pid=4242 since=1765000000123"),
        "token=UUID pid=9 since=9"
    );
}
