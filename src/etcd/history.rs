//! A NAME's history on etcd: one key per run, `locked-run/history/NAME/<when>-<token>`, its
//! value the run's record. Outside the lock's prefix (`NAME/`), where `etcdctl lock` would count
//! a history key as a holder. A release sends the record with its revoke, in a transaction
//! that also deletes the run's key while it is still ours (see `Backend::release`); a
//! `--min-hold` release writes it once the key was moved. Trimmed to the newest runs there,
//! as `file://` trims its history: once it is twice as long (a record and a count in one
//! transaction at every run, the trim's read and delete once in a hundred runs); never a
//! reason for a release to fail.

use bytes::Bytes;
use tokio::time::Instant;

use super::EtcdLock;
use super::proto::etcdserverpb::range_request::{SortOrder, SortTarget};
use super::proto::etcdserverpb::{
    DeleteRangeRequest, DeleteRangeResponse, RangeRequest, RangeResponse, TxnResponse,
};
use super::wire::{self, created_at, delete, kvs, prefix_end, put, read, txn, txn_range};
use crate::backend::{BackendError, KEPT, Run};

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

/// The newest `limit` keys of NAME's history, newest first.
fn newest(prefix: &str, limit: usize, keys_only: bool) -> RangeRequest {
    RangeRequest {
        sort_target: SortTarget::Key as i32,
        sort_order: SortOrder::Descend as i32,
        limit: limit as i64,
        keys_only,
        ..all(prefix)
    }
}

impl EtcdLock {
    /// Adds `run` to the NAME's history; once it holds twice [`KEPT`] runs, drops what is past
    /// the newest [`KEPT`]. Keys sort by when the run let go of the lock (then its token), so
    /// the newest are last. With `releasing` (our key and its create revision), the record
    /// goes in one transaction with the key's delete, the release itself, as Redis's release
    /// script appends it: the key goes only if it is still ours, the record in any case.
    pub(super) async fn remember(
        &self,
        run: &Run,
        releasing: Option<(&str, i64)>,
        deadline: Instant,
    ) -> Result<(), BackendError> {
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
        let counted = match releasing.is_some() && reply.succeeded {
            true => 2,
            false => 1,
        };
        let count = txn_range(&reply, counted).map_or(0, |r| r.count);
        if count <= 2 * KEPT as i64 {
            return Ok(());
        }
        let reply: RangeResponse = self
            .client
            .must(wire::RANGE, &newest(&prefix, KEPT, true), deadline)
            .await?;
        if let Some(oldest_kept) = kvs(Some(&reply)).get(KEPT - 1) {
            let drop = DeleteRangeRequest {
                key: Bytes::copy_from_slice(prefix.as_bytes()),
                range_end: Bytes::copy_from_slice(oldest_kept.key.as_bytes()),
                ..DeleteRangeRequest::default()
            };
            self.client
                .must::<_, DeleteRangeResponse>(wire::DELETE_RANGE, &drop, deadline)
                .await?;
        }
        Ok(())
    }

    /// The NAME's last `limit` runs, newest first.
    pub(super) async fn history_here(&self, limit: usize) -> Result<Vec<Run>, BackendError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let prefix = prefix(self);
        let deadline = Instant::now() + self.client.connect_timeout();
        let reply: RangeResponse = self
            .client
            .must(wire::RANGE, &newest(&prefix, limit, false), deadline)
            .await?;
        Ok(kvs(Some(&reply))
            .iter()
            .filter_map(|kv| Run::from_line(&String::from_utf8_lossy(&kv.value)))
            .collect())
    }
}
