//! A NAME's history on etcd: one key per run, `locked-run/history/NAME/<when>-<token>`, its
//! value the run's record. Outside the lock's prefix (`NAME/`), where `etcdctl lock` would count
//! a history key as a holder. A release sends the record in the transaction that deletes the
//! run's key while it is still ours, the release itself (see `Backend::release`); a
//! `--min-hold` release writes it once the key was moved. Trimmed to the newest runs there,
//! as `file://` trims its history: once it is twice as long (a record and a count in one
//! transaction at every run, the trim's read and delete once in a hundred runs); never a
//! reason for a release to fail. Newest is by the store's own order, the keys' create
//! revisions: the time in a key's name only keeps names apart.

use bytes::Bytes;
use tokio::time::Instant;

use super::EtcdLock;
use super::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use super::proto::etcdserverpb::{RangeRequest, RangeResponse, TxnResponse};
use super::wire::{self, created_at, delete, kvs, prefix_end, put, read, txn, txn_range};
use crate::backend::{BackendError, History, KEPT, Reader, Run, SCANNED};

/// Where every NAME's history lives.
pub const ROOT: &str = "locked-run";

/// The prefix of NAME's history keys.
fn prefix(lock: &EtcdLock) -> String {
    format!("{ROOT}/history/{}/", lock.name)
}

/// Every key of NAME's history.
fn all(prefix: &str) -> RangeRequest {
    RangeRequest {
        key: Bytes::copy_from_slice(prefix.as_bytes()),
        range_end: Bytes::from(prefix_end(prefix.as_bytes())),
        ..RangeRequest::default()
    }
}

/// The newest `limit` keys of NAME's history, newest first in the store's own order (their
/// create revisions: never the time in a key's name, which any user of the lock may set to
/// anything), created before revision `before` + 1 when it is not 0.
fn newest(prefix: &str, limit: usize, keys_only: bool, before: i64) -> RangeRequest {
    RangeRequest {
        sort_target: SortTarget::Create as i32,
        sort_order: SortOrder::Descend as i32,
        limit: limit as i64,
        keys_only,
        max_create_revision: before,
        ..all(prefix)
    }
}

impl EtcdLock {
    /// Adds `run` to the NAME's history; once it holds twice [`KEPT`] runs, drops what is past
    /// the newest [`KEPT`] (by create revision). With `releasing` (our key and its create
    /// revision), the record goes in one transaction with the key's delete, the release itself,
    /// as Redis's release script appends it: the key goes only if it is still ours, the record
    /// in any case. True when that transaction deleted our key. A trim that fails is said
    /// with `-v` only: the record is in, and the next run trims.
    pub(super) async fn remember(
        &self,
        run: &Run,
        releasing: Option<(&str, i64)>,
        deadline: Instant,
    ) -> Result<bool, BackendError> {
        let prefix = prefix(self);
        // A holder's token is its key (`NAME/<lease>`): its last part names the run here.
        let run_id = run.token.rsplit('/').next().unwrap_or(&run.token);
        let key = format!("{prefix}{:016}-{run_id}", run.ended_ms);
        // The record and how many there are now, in one transaction: one round trip.
        let count = RangeRequest {
            count_only: true,
            ..all(&prefix)
        };
        let record = vec![put(&key, run.to_line().as_bytes(), 0), read(count)];
        let add = match releasing {
            Some((ours, created)) => {
                let mut release = vec![delete(ours)];
                release.extend(record.iter().cloned());
                txn(vec![created_at(ours, created)], release, record)
            }
            None => txn(Vec::new(), record, Vec::new()),
        };
        let reply: TxnResponse = self.client.must(wire::TXN, &add, deadline).await?;
        let deleted = releasing.is_some() && reply.succeeded;
        let counted = match deleted {
            true => 2,
            false => 1,
        };
        let count = txn_range(&reply, counted).map_or(0, |r| r.count);
        if count > 2 * KEPT as i64 {
            if let Err(e) = self.trim(&prefix, deadline).await {
                tracing::info!("could not trim lock {}'s history: {e}", self.name);
            }
        }
        Ok(deleted)
    }

    /// The newest KEPT in the store's order stay; what is older goes, in one transaction of at
    /// most 128 deletes (etcd's default limit of operations in one), any rest at the next run:
    /// one read of the newest KEPT + 128 keys says both.
    async fn trim(&self, prefix: &str, deadline: Instant) -> Result<(), BackendError> {
        let line: RangeResponse = self
            .client
            .must(wire::RANGE, &newest(prefix, KEPT + 128, true, 0), deadline)
            .await?;
        let keys = kvs(Some(&line));
        let drop: Vec<_> = keys.iter().skip(KEPT).map(|kv| delete(&kv.key)).collect();
        if !drop.is_empty() {
            self.client
                .must::<_, TxnResponse>(wire::TXN, &txn(Vec::new(), drop, Vec::new()), deadline)
                .await?;
        }
        Ok(())
    }

    /// The NAME's last `limit` runs, newest first, read a few keys at a time (a value may be
    /// as large as the cluster takes, 1.5 MiB by default, and any user of the lock can write
    /// one: a reply of `limit` of them would pass the client's limit), through the one
    /// [`Reader`], which skips and counts what is not a record.
    pub(super) async fn history_here(&self, limit: usize) -> Result<History, BackendError> {
        let prefix = prefix(self);
        let deadline = Instant::now() + self.client.connect_timeout();
        let mut reader = Reader::new();
        let mut before = 0;
        let mut scanned = 0;
        while reader.runs() < limit && scanned < SCANNED {
            let page = newest(&prefix, PAGE, false, before);
            let reply: RangeResponse = self.client.must(wire::RANGE, &page, deadline).await?;
            let kvs = kvs(Some(&reply));
            for kv in &kvs {
                reader.take(&kv.value);
            }
            scanned += kvs.len();
            match kvs.last() {
                Some(oldest) if reply.more => before = oldest.create_revision - 1,
                _ => break,
            }
        }
        Ok(reader.finish(limit))
    }
}

/// How many history keys one request reads: a page of values of etcd's largest (1.5 MiB by
/// default) stays far below the client's 16 MiB a message.
const PAGE: usize = 4;
