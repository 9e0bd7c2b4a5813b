//! What the operators' commands read of a lock in etcd, and `release --force`: the keys under
//! `NAME/` by create revision (the holders first, as the first key's mode says; the others
//! wait), the holders' leases' time to live, and the forced delete of holders' keys and
//! leases.

use std::time::Duration;

use tokio::time::Instant;

use super::proto::etcdserverpb::{
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse, RangeResponse, TxnResponse,
};
use super::wire::{self, Kv, kvs};
use super::{EtcdLock, line};
use crate::backend::{BackendError, Busy, Expiry, Freed, Holder, Mode, Report, Slot};

impl EtcdLock {
    pub(super) async fn report(&self) -> Result<Report, BackendError> {
        let deadline = Instant::now() + self.client.connect_timeout();
        let reply: RangeResponse = self
            .client
            .must(wire::RANGE, &wire::range_line(&self.prefix), deadline)
            .await?;
        let line = kvs(Some(&reply));
        let (mode, holding) = line::holders(&line);
        if holding.is_empty() {
            let revision = reply.header.as_ref().map_or(0, |h| h.revision);
            return Ok(Report {
                waiters: Some(0),
                revision: Some(revision as u64),
                ..Report::default()
            });
        }
        let mut holders = Vec::with_capacity(holding.len());
        for kv in holding {
            let busy = Busy {
                holder: holder_of(kv),
                expiry: self.expiry(kv.lease, deadline).await?,
            };
            holders.push(Slot {
                token: Some(kv.key.clone()),
                busy,
            });
        }
        // The soonest to end first, as for Redis.
        holders.sort_by_key(|slot| slot.busy.expiry.left());
        let first = &holding[0];
        Ok(Report {
            fence: holding.iter().map(|kv| kv.create_revision as u64).max(),
            held: Some(holders[0].busy.clone()),
            value: Some(first.key.clone()),
            // Every key but the holders' is a waiter's (etcdctl's too).
            waiters: Some((line.len() - holding.len()) as u64),
            holders,
            limit: Some(mode.holders()),
            shared: mode == Mode::Shared,
            ..Report::default()
        })
    }

    /// When a holder's lease ends: a key on no lease (put by hand) has no expiry.
    async fn expiry(&self, lease: i64, deadline: Instant) -> Result<Expiry, BackendError> {
        if lease == 0 {
            return Ok(Expiry::Never);
        }
        let request = LeaseTimeToLiveRequest {
            id: lease,
            keys: false,
        };
        let reply: LeaseTimeToLiveResponse = self
            .client
            .must(wire::LEASE_TIME_TO_LIVE, &request, deadline)
            .await?;
        // -1: expired this instant, and its keys about to go.
        let ttl = reply.ttl.max(0) as u64;
        Ok(Expiry::In(Duration::from_secs(ttl)))
    }

    /// Deletes every holder's key (`token`: that key alone, which must be under `NAME/`) and
    /// revokes its lease; says whom the lock was taken from.
    pub(super) async fn force(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        let deadline = Instant::now() + self.client.connect_timeout();
        let found = match token {
            None => {
                let reply: RangeResponse = self
                    .client
                    .must(wire::RANGE, &wire::range_line(&self.prefix), deadline)
                    .await?;
                line::holders(&kvs(Some(&reply))).1.to_vec()
            }
            Some(key) if key.starts_with(&self.prefix) => {
                let reply: RangeResponse = self
                    .client
                    .must(wire::RANGE, &wire::one(key), deadline)
                    .await?;
                kvs(Some(&reply))
            }
            Some(key) => {
                return Err(BackendError::Refused(format!(
                    "{key} is not a key of lock {} (they start with {})",
                    self.name, self.prefix
                )));
            }
        };
        let mut holders = Vec::with_capacity(found.len());
        for kv in &found {
            let delete = wire::txn(
                vec![wire::created_at(&kv.key, kv.create_revision)],
                vec![wire::delete(&kv.key)],
                Vec::new(),
            );
            self.client
                .must::<_, TxnResponse>(wire::TXN, &delete, deadline)
                .await?;
            // Its holder's next keep-alive then finds the lease gone.
            if kv.lease != 0 {
                self.revoke(kv.lease, deadline).await?;
            }
            holders.push(holder_of(kv));
        }
        Ok(Freed::Released {
            holders,
            fence: found.iter().map(|kv| kv.create_revision as u64).max(),
        })
    }
}

/// Who holds a key, from its value (`locked-run`'s JSON); a key of another program (etcdctl
/// leaves its value empty) names nobody, but has its fence.
pub fn holder_of(kv: &Kv) -> Holder {
    let value: serde_json::Value = serde_json::from_slice(&kv.value).unwrap_or_default();
    let text = |field: &str| value[field].as_str().map(str::to_owned);
    Holder {
        host: text("host"),
        pid: value["pid"].as_u64().and_then(|p| u32::try_from(p).ok()),
        command: text("command"),
        since_ms: value["since"].as_u64(),
        fence: Some(kv.create_revision as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_read_from_its_keys_value_and_etcdctls_names_nobody() {
        let ours = Kv {
            key: "job/2040a2418ec67f0a".into(),
            create_revision: 17,
            lease: 1,
            value: br#"{"host":"web-3","pid":4242,"command":"backup.sh","since":1764673200000}"#
                .to_vec(),
        };
        assert_eq!(
            holder_of(&ours).to_string(),
            "web-3 pid 4242 (backup.sh) since 2025-12-02T11:00:00Z, fence 17"
        );
        let etcdctl = Kv {
            value: Vec::new(),
            ..ours
        };
        assert_eq!(
            holder_of(&etcdctl),
            Holder {
                fence: Some(17),
                ..Holder::default()
            }
        );
    }
}
