//! A NAME's history on etcd: one key per run, `locked-run/history/NAME/<when>-<token>`, its
//! value the run's record. Outside the lock's prefix (`NAME/`), where `etcdctl lock` would count
//! a history key as a holder; written right after the release is confirmed, and trimmed to the
//! newest runs there; never a reason for a release to fail.

use serde_json::json;
use tokio::time::Instant;

use super::EtcdLock;
use super::wire::{b64, kvs, prefix_end, put, txn, txn_range};
use crate::backend::{BackendError, KEPT, Run};

/// Where every NAME's history lives.
pub const ROOT: &str = "locked-run";

/// The prefix of NAME's history keys.
fn prefix(lock: &EtcdLock) -> String {
    format!("{ROOT}/history/{}/", lock.name)
}

impl EtcdLock {
    /// Adds `run` to the NAME's history, then drops what is past the newest [`KEPT`] runs.
    /// Keys sort by when the run let go of the lock (then its token), so the newest are last.
    pub(super) async fn remember(&self, run: &Run, deadline: Instant) -> Result<(), BackendError> {
        let prefix = prefix(self);
        // A holder's token is its key (`NAME/<lease>`): its last part names the run here.
        let run_id = run.token.rsplit('/').next().unwrap_or(&run.token);
        let key = format!("{prefix}{:016}-{run_id}", run.ended_ms);
        // The record and the newest keys after it, in one transaction: one round trip.
        let newest = json!({"request_range": {
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix.as_bytes())),
            "sort_target": "KEY",
            "sort_order": "DESCEND",
            "limit": (KEPT + 1).to_string(),
            "keys_only": true,
        }});
        let add = txn(&[], &[put(&key, run.to_line().as_bytes(), 0), newest], &[]);
        let reply = self.client.must("/v3/kv/txn", &add, deadline).await?;
        let keys = kvs(txn_range(&reply, 1));
        if let Some(oldest_kept) = keys.get(KEPT - 1).filter(|_| keys.len() > KEPT) {
            let drop = json!({
                "key": b64(prefix.as_bytes()),
                "range_end": b64(oldest_kept.key.as_bytes()),
            });
            self.client
                .must("/v3/kv/deleterange", &drop, deadline)
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
        let newest = json!({
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix.as_bytes())),
            "sort_target": "KEY",
            "sort_order": "DESCEND",
            "limit": limit.to_string(),
        });
        let deadline = Instant::now() + self.client.connect_timeout();
        let reply = self.client.must("/v3/kv/range", &newest, deadline).await?;
        Ok(kvs(&reply)
            .iter()
            .filter_map(|kv| Run::from_line(&String::from_utf8_lossy(&kv.value)))
            .collect())
    }
}
