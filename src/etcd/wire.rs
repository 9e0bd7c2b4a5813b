//! The requests this backend sends etcd, as protobuf messages, and the key-values it reads
//! back; the paths of the gRPC methods it calls.

use bytes::Bytes;

use super::proto::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use super::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use super::proto::etcdserverpb::request_op::Request;
use super::proto::etcdserverpb::response_op::Response;
use super::proto::etcdserverpb::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RangeResponse, RequestOp, TxnRequest,
    TxnResponse,
};
use super::proto::mvccpb::KeyValue;

pub const RANGE: &str = "/etcdserverpb.KV/Range";
pub const TXN: &str = "/etcdserverpb.KV/Txn";
pub const LEASE_GRANT: &str = "/etcdserverpb.Lease/LeaseGrant";
pub const LEASE_REVOKE: &str = "/etcdserverpb.Lease/LeaseRevoke";
pub const LEASE_TIME_TO_LIVE: &str = "/etcdserverpb.Lease/LeaseTimeToLive";
pub const WATCH: &str = "/etcdserverpb.Watch/Watch";
pub const STATUS: &str = "/etcdserverpb.Maintenance/Status";
pub const MEMBER_LIST: &str = "/etcdserverpb.Cluster/MemberList";

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

fn bytes(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
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
    pub fn of(kv: &KeyValue) -> Kv {
        Kv {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            create_revision: kv.create_revision,
            lease: kv.lease,
            value: kv.value.to_vec(),
        }
    }
}

/// The key-values of a range response.
pub fn kvs(range: Option<&RangeResponse>) -> Vec<Kv> {
    range.map_or_else(Vec::new, |r| r.kvs.iter().map(Kv::of).collect())
}

/// The `i`th response of a transaction, if it is a range's.
pub fn txn_range(reply: &TxnResponse, i: usize) -> Option<&RangeResponse> {
    match reply.responses.get(i)?.response.as_ref()? {
        Response::ResponseRange(range) => Some(range),
        _ => None,
    }
}

/// The revision a transaction was read or committed at.
pub fn revision(reply: &TxnResponse) -> i64 {
    reply.header.as_ref().map_or(0, |h| h.revision)
}

fn compare(key: &str, target: CompareTarget, result: CompareResult, with: TargetUnion) -> Compare {
    Compare {
        result: result as i32,
        target: target as i32,
        key: bytes(key),
        range_end: Bytes::new(),
        target_union: Some(with),
    }
}

/// Compare: the key does not exist (its create revision is 0).
pub fn absent(key: &str) -> Compare {
    created_at(key, 0)
}

/// Compare: the key is the one created at `revision`.
pub fn created_at(key: &str, revision: i64) -> Compare {
    let with = TargetUnion::CreateRevision(revision);
    compare(key, CompareTarget::Create, CompareResult::Equal, with)
}

/// Compare: every key under `prefix` was created at `revision` or later (no key is before
/// the one created then). etcd compares each key of the range; the range is never empty
/// where this is used (the key created at `revision` is in it).
pub fn none_before(prefix: &str, revision: i64) -> Compare {
    let with = TargetUnion::CreateRevision(revision - 1);
    let mut c = compare(prefix, CompareTarget::Create, CompareResult::Greater, with);
    c.range_end = Bytes::from(prefix_end(prefix.as_bytes()));
    c
}

/// Compare: no key under `prefix` (an empty range compares as one key of revision 0).
pub fn empty(prefix: &str) -> Compare {
    let mut c = absent(prefix);
    c.range_end = Bytes::from(prefix_end(prefix.as_bytes()));
    c
}

pub fn put(key: &str, value: &[u8], lease: i64) -> RequestOp {
    op(Request::RequestPut(PutRequest {
        key: bytes(key),
        value: Bytes::copy_from_slice(value),
        lease,
        ..PutRequest::default()
    }))
}

/// Moves the key to another lease, its value and create revision unchanged.
pub fn move_to(key: &str, lease: i64) -> RequestOp {
    op(Request::RequestPut(PutRequest {
        key: bytes(key),
        lease,
        ignore_value: true,
        ..PutRequest::default()
    }))
}

/// The one key `key`.
pub fn one(key: &str) -> RangeRequest {
    RangeRequest {
        key: bytes(key),
        ..RangeRequest::default()
    }
}

pub fn get(key: &str) -> RequestOp {
    read(one(key))
}

pub fn delete(key: &str) -> RequestOp {
    op(Request::RequestDeleteRange(DeleteRangeRequest {
        key: bytes(key),
        ..DeleteRangeRequest::default()
    }))
}

pub fn read(range: RangeRequest) -> RequestOp {
    op(Request::RequestRange(range))
}

fn op(request: Request) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

/// Every key under `prefix`, in arrival order (the whole line).
pub fn range_line(prefix: &str) -> RangeRequest {
    RangeRequest {
        key: bytes(prefix),
        range_end: Bytes::from(prefix_end(prefix.as_bytes())),
        sort_order: SortOrder::Ascend as i32,
        sort_target: SortTarget::Create as i32,
        ..RangeRequest::default()
    }
}

/// The key under `prefix` with the lowest create revision (the holder).
pub fn range_first(prefix: &str) -> RangeRequest {
    RangeRequest {
        limit: 1,
        ..range_line(prefix)
    }
}

/// The `limit` keys under `prefix` with the highest create revisions, created at `max` or
/// before (0: any), the last first, their keys only: the key just before a waiter's own is
/// the first of them.
pub fn last_created(prefix: &str, limit: i64, max: i64) -> RangeRequest {
    RangeRequest {
        limit,
        sort_order: SortOrder::Descend as i32,
        keys_only: true,
        max_create_revision: max,
        ..range_line(prefix)
    }
}

/// Every key under `prefix` created at revision `max` or before, in arrival order.
pub fn created_up_to(prefix: &str, max: i64) -> RangeRequest {
    RangeRequest {
        max_create_revision: max,
        ..range_line(prefix)
    }
}

pub fn txn(compare: Vec<Compare>, success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
    TxnRequest {
        compare,
        success,
        failure,
    }
}

/// A transaction of reads that the member asked answers from what it has applied, without
/// confirming first with the leader that nothing newer was committed (etcd's serializable
/// read): no wait for a write in flight, such as its fsync. What it may miss is recent: a key
/// created after the revision it answers at, or deleted since.
pub fn serializable(reads: Vec<RangeRequest>) -> TxnRequest {
    let reads = reads
        .into_iter()
        .map(|range| {
            read(RangeRequest {
                serializable: true,
                ..range
            })
        })
        .collect();
    txn(Vec::new(), reads, Vec::new())
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
    fn none_before_compares_the_whole_prefix_with_the_revision_before() {
        let c = none_before("job/", 10);
        assert_eq!(&c.key[..], b"job/");
        assert_eq!(&c.range_end[..], b"job0");
        assert_eq!(c.result, CompareResult::Greater as i32);
        assert_eq!(c.target_union, Some(TargetUnion::CreateRevision(9)));
    }
}
