//! A NAME's history on etcd: one key per run, `locked-run/history/NAME/<when>-<token>`, its
//! value the run's record. Outside the lock's prefix (`NAME/`), where `etcdctl lock` would count
//! a history key as a holder. A release sends the record with its revoke, in a transaction
//! that also deletes the run's key while it is still ours (see `Backend::release`); a
//! `--min-hold` release writes it once the key was moved. Trimmed to the newest runs there,
//! as `file://` trims its history: once it is twice as long (a record and a count in one
//! transaction at every run, the trim's read and delete once in a hundred runs); never a
//! reason for a release to fail.

use serde_json::json;
use tokio::time::Instant;

use super::EtcdLock;
use super::wire::{b64, created_at, delete, int, kvs, prefix_end, put, txn, txn_range};
use crate::backend::{BackendError, History, KEPT, Reader, Run, SCANNED};

/// Where every NAME's history lives.
pub const ROOT: &str = "locked-run";

/// The prefix of NAME's history keys.
fn prefix(lock: &EtcdLock) -> String {
    format!("{ROOT}/history/{}/", lock.name)
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
        let all = json!({
            "key": b64(prefix.as_bytes()),
            "range_end": b64(&prefix_end(prefix.as_bytes())),
        });
        // The record and how many there are now, in one transaction: one round trip.
        let mut count = all.clone();
        count["count_only"] = json!(true);
        let record = [
            put(&key, run.to_line().as_bytes(), 0),
            json!({ "request_range": count }),
        ];
        let add = match releasing {
            Some((ours, created)) => {
                let mut release = vec![delete(ours)];
                release.extend(record.iter().cloned());
                txn(&[created_at(ours, created)], &release, &record)
            }
            None => txn(&[], &record, &[]),
        };
        let reply = self.client.must("/v3/kv/txn", &add, deadline).await?;
        let counted = match releasing.is_some() && reply["succeeded"] == true {
            true => 2,
            false => 1,
        };
        if int(&txn_range(&reply, counted)["count"]) <= 2 * KEPT as i64 {
            return Ok(());
        }
        let mut newest = all;
        newest["sort_target"] = json!("KEY");
        newest["sort_order"] = json!("DESCEND");
        newest["limit"] = json!(KEPT.to_string());
        newest["keys_only"] = json!(true);
        let reply = self.client.must("/v3/kv/range", &newest, deadline).await?;
        if let Some(oldest_kept) = kvs(&reply).get(KEPT - 1) {
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

    /// The NAME's last `limit` runs, newest first, read a few keys at a time (a value may be
    /// as large as the cluster takes, 1.5 MiB by default, and any user of the lock can write
    /// one: a reply of `limit` of them would pass the client's limit), through the one
    /// [`Reader`], which skips and counts what is not a record.
    pub(super) async fn history_here(&self, limit: usize) -> Result<History, BackendError> {
        let prefix = prefix(self);
        let deadline = Instant::now() + self.client.connect_timeout();
        let mut reader = Reader::new();
        let mut end = prefix_end(prefix.as_bytes());
        let mut scanned = 0;
        while reader.runs() < limit && scanned < SCANNED {
            let page = json!({
                "key": b64(prefix.as_bytes()),
                "range_end": b64(&end),
                "sort_target": "KEY",
                "sort_order": "DESCEND",
                "limit": PAGE.to_string(),
            });
            let reply = self.client.must("/v3/kv/range", &page, deadline).await?;
            let kvs = kvs(&reply);
            for kv in &kvs {
                reader.take(&kv.value);
            }
            scanned += kvs.len();
            match kvs.last() {
                Some(oldest) if reply["more"] == true => end = oldest.key.clone().into_bytes(),
                _ => break,
            }
        }
        Ok(reader.finish(limit))
    }
}

/// How many history keys one request reads: a page of values of etcd's largest (1.5 MiB,
/// 2 MiB once the gateway encodes them) stays far below the client's 16 MiB.
const PAGE: usize = 4;
