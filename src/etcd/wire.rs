//! The JSON of etcd's gateway: keys and values in base64, int64 fields as strings, fields at
//! their zero value left out (a `false` `succeeded`, a `PUT` event's type); the requests this
//! backend sends and the key-values it reads back.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

pub fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// A base64 field's bytes (empty when missing or not base64).
pub fn bytes_of(v: &Value) -> Vec<u8> {
    v.as_str()
        .and_then(|s| STANDARD.decode(s).ok())
        .unwrap_or_default()
}

/// An int64 field (a JSON string; 0 when left out, as the gateway does for zero).
pub fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// The revision a reply was read at (its header's).
pub fn revision(reply: &Value) -> i64 {
    int(&reply["header"]["revision"])
}

/// The first key after every key that starts with `prefix` (the `range_end` of a prefix).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the keyspace.
    vec![0]
}

/// A key-value as a range or a watch event gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub create_revision: i64,
    pub lease: i64,
    pub value: Vec<u8>,
}

impl Kv {
    fn of(v: &Value) -> Kv {
        Kv {
            key: String::from_utf8_lossy(&bytes_of(&v["key"])).into_owned(),
            create_revision: int(&v["create_revision"]),
            lease: int(&v["lease"]),
            value: bytes_of(&v["value"]),
        }
    }
}

/// The key-values of a range response.
pub fn kvs(range: &Value) -> Vec<Kv> {
    range["kvs"]
        .as_array()
        .map(|kvs| kvs.iter().map(Kv::of).collect())
        .unwrap_or_default()
}

/// The `i`th response of a transaction, as a range response.
pub fn txn_range(reply: &Value, i: usize) -> &Value {
    &reply["responses"][i]["response_range"]
}

/// Compare: the key does not exist (its create revision is 0).
pub fn absent(key: &str) -> Value {
    json!({"target": "CREATE", "result": "EQUAL", "key": b64(key.as_bytes()), "create_revision": "0"})
}

/// Compare: the key is the one created at `revision`.
pub fn created_at(key: &str, revision: i64) -> Value {
    json!({"target": "CREATE", "result": "EQUAL", "key": b64(key.as_bytes()), "create_revision": revision.to_string()})
}

pub fn put(key: &str, value: &[u8], lease: i64) -> Value {
    json!({"request_put": {"key": b64(key.as_bytes()), "value": b64(value), "lease": lease.to_string()}})
}

/// Moves the key to another lease, its value and create revision unchanged.
pub fn move_to(key: &str, lease: i64) -> Value {
    json!({"request_put": {"key": b64(key.as_bytes()), "lease": lease.to_string(), "ignore_value": true}})
}

pub fn get(key: &str) -> Value {
    json!({"request_range": {"key": b64(key.as_bytes())}})
}

pub fn delete(key: &str) -> Value {
    json!({"request_delete_range": {"key": b64(key.as_bytes())}})
}

/// The key under `prefix` with the lowest create revision (the holder), and how many there are.
pub fn first_created(prefix: &str) -> Value {
    json!({"request_range": range_first(prefix)})
}

/// A range request for [`first_created`], on its own.
pub fn range_first(prefix: &str) -> Value {
    json!({
        "key": b64(prefix.as_bytes()),
        "range_end": b64(&prefix_end(prefix.as_bytes())),
        "sort_target": "CREATE",
        "sort_order": "ASCEND",
        "limit": "1",
    })
}

/// The `limit` keys under `prefix` with the highest create revisions (the last to queue), the
/// last first, their keys only.
pub fn last_created(prefix: &str, limit: u32) -> Value {
    json!({"request_range": {
        "key": b64(prefix.as_bytes()),
        "range_end": b64(&prefix_end(prefix.as_bytes())),
        "sort_target": "CREATE",
        "sort_order": "DESCEND",
        "limit": limit.to_string(),
        "keys_only": true,
    }})
}

/// The key under `prefix` with the highest create revision at most `max` (the one a waiter
/// waits on: the key just before its own).
pub fn last_created_up_to(prefix: &str, max: i64) -> Value {
    json!({"request_range": {
        "key": b64(prefix.as_bytes()),
        "range_end": b64(&prefix_end(prefix.as_bytes())),
        "sort_target": "CREATE",
        "sort_order": "DESCEND",
        "limit": "1",
        "keys_only": true,
        "max_create_revision": max.to_string(),
    }})
}

/// Every key under `prefix` created at revision `max` or before, in arrival order.
pub fn created_up_to(prefix: &str, max: i64) -> Value {
    let mut range = range_line(prefix);
    range["max_create_revision"] = json!(max.to_string());
    json!({ "request_range": range })
}

/// A range request for every key under `prefix`, in arrival order (the whole line).
pub fn range_line(prefix: &str) -> Value {
    json!({
        "key": b64(prefix.as_bytes()),
        "range_end": b64(&prefix_end(prefix.as_bytes())),
        "sort_target": "CREATE",
        "sort_order": "ASCEND",
    })
}

pub fn txn(compare: &[Value], success: &[Value], failure: &[Value]) -> Value {
    json!({"compare": compare, "success": success, "failure": failure})
}

/// A transaction of reads `reads` that the member asked answers from what it has applied,
/// without confirming first with the leader that nothing newer was committed (etcd's
/// serializable read): no wait for a write in flight, such as its fsync. What it may miss is
/// recent: a key created after the revision it answers at, or deleted since.
pub fn serializable(reads: &[Value]) -> Value {
    let reads: Vec<Value> = reads
        .iter()
        .map(|read| {
            let mut read = read.clone();
            read["request_range"]["serializable"] = json!(true);
            read
        })
        .collect();
    txn(&[], &reads, &[])
}

/// gRPC status codes etcd answers with.
pub const INVALID_ARGUMENT: i64 = 3;
pub const NOT_FOUND: i64 = 5;
pub const FAILED_PRECONDITION: i64 = 9;
pub const UNAUTHENTICATED: i64 = 16;

/// An error etcd answered with that retrying will not mend (transient ones are
/// `BackendError::Transient`): its gRPC code and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: i64,
    pub message: String,
}

impl Status {
    /// An error as the gateway writes it: `{"code":5,"message":...}` for a call, or
    /// `{"error":{"grpc_code":5,"message":...}}` inside a stream (a watch, a keep-alive).
    pub fn of(reply: &Value) -> Option<Status> {
        let (error, code) = match &reply["error"] {
            Value::Object(_) => (&reply["error"], &reply["error"]["grpc_code"]),
            _ => (reply, &reply["code"]),
        };
        let code = code.as_i64().filter(|&c| c != 0)?;
        let message = error["message"]
            .as_str()
            .or_else(|| reply["error"].as_str())
            .unwrap_or("")
            .to_owned();
        Some(Status { code, message })
    }

    /// Unavailable (no leader, leader changed, timed out), Aborted, DeadlineExceeded,
    /// Canceled, Unknown, and too many requests: worth trying again, on another member.
    pub fn transient(&self) -> bool {
        match self.code {
            1 | 2 | 4 | 10 | 14 => true,
            8 => !self.message.contains("space"),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"job/"), b"job0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }

    #[test]
    fn key_values_as_the_gateway_writes_them() {
        let range: Value = serde_json::from_str(
            r#"{"kvs":[{"key":"am9iLzIwNDBhMjQxOGVjNjdmMGE=","create_revision":"2","mod_revision":"2","version":"1","value":"e30=","lease":"2324035810175123210"}],"count":"1"}"#,
        )
        .unwrap();
        assert_eq!(
            kvs(&range),
            [Kv {
                key: "job/2040a2418ec67f0a".into(),
                create_revision: 2,
                lease: 2324035810175123210,
                value: b"{}".to_vec(),
            }]
        );
        assert_eq!(int(&range["count"]), 1);
        assert_eq!(int(&range["missing"]), 0);
    }

    #[test]
    fn errors_as_the_gateway_writes_them() {
        let call: Value = serde_json::from_str(
            r#"{"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5}"#,
        )
        .unwrap();
        let status = Status::of(&call).unwrap();
        assert_eq!(status.code, NOT_FOUND);
        assert_eq!(status.message, "etcdserver: requested lease not found");
        let stream: Value = serde_json::from_str(
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#,
        )
        .unwrap();
        let status = Status::of(&stream).unwrap();
        assert!(status.transient(), "{status:?}");
        assert_eq!(Status::of(&json!({"result": {"TTL": "2"}})), None);
    }
}
