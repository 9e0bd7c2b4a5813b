//! This run's etcd lease: granted (whole seconds, at least `--ttl`), kept alive, revoked,
//! and, for `--min-hold`, a lease of its own for the key to outlive the run.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::client::NOT_FOUND;
use super::wire::{self, int};
use super::{EtcdLock, Place};
use crate::backend::BackendError;
use crate::lease::Timings;

impl EtcdLock {
    /// A lease of `--ttl` rounded up to whole seconds.
    pub(super) async fn grant(
        &self,
        timings: &Timings,
        deadline: Instant,
    ) -> Result<i64, BackendError> {
        let ttl = timings.ttl;
        let asked = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let sent = Instant::now();
        let reply = self
            .client
            .must(
                "/v3/lease/grant",
                &json!({"TTL": asked.to_string()}),
                deadline,
            )
            .await?;
        let (lease, granted) = (int(&reply["ID"]), int(&reply["TTL"]));
        if lease <= 0 || granted < asked as i64 {
            return Err(BackendError::Refused(format!(
                "etcd at {} granted lease {lease} of {granted}s for the {asked}s asked",
                self.client.url()
            )));
        }
        self.place.set(Some(Place {
            lease,
            created: None,
        }));
        self.kept_alive.set(Some(sent));
        self.granted.set(granted as u64);
        // The lease clock counts with --ttl from the instant the attempt was sent, before the
        // grant: etcd's lease, at least as long and started later, outlasts what it trusts.
        if !self.said.replace(true) && granted as u128 * 1000 != ttl.as_millis() {
            tracing::info!(
                "etcd leases last whole seconds: lock {} is on a lease of {granted}s for --ttl {} \
                 (etcd raises short ones to its minimum); the command is stopped by --ttl all the same",
                self.name,
                crate::text::show(ttl)
            );
        }
        Ok(lease)
    }

    /// Keeps `lease` alive: false when etcd no longer has it (expired, or revoked).
    pub(super) async fn keep_alive(
        &self,
        lease: i64,
        deadline: Instant,
    ) -> Result<bool, BackendError> {
        let request = json!({"ID": lease.to_string()});
        let sent = Instant::now();
        match self
            .client
            .call("/v3/lease/keepalive", &request, deadline)
            .await?
        {
            // An unknown or expired lease is answered without a TTL.
            Ok(reply) => {
                let alive = int(&reply["result"]["TTL"]) > 0;
                if alive {
                    self.kept_alive.set(Some(sent));
                }
                Ok(alive)
            }
            Err(status) if status.code == NOT_FOUND => Ok(false),
            Err(status) => Err(self.client.refused(&status)),
        }
    }

    /// Revokes `lease`, deleting its key: false when there was no such lease any more.
    pub(super) async fn revoke(&self, lease: i64, deadline: Instant) -> Result<bool, BackendError> {
        let request = json!({"ID": lease.to_string()});
        match self
            .client
            .call("/v3/lease/revoke", &request, deadline)
            .await?
        {
            Ok(_) => Ok(true),
            Err(status) if status.code == NOT_FOUND => Ok(false),
            Err(status) => Err(self.client.refused(&status)),
        }
    }

    /// Gives up this run's place: its lease is revoked (and its key with it); a later attempt
    /// starts afresh. Forgotten even when the revoke went unanswered: the lease then lapses.
    pub(super) async fn leave(&self, deadline: Instant) -> Result<bool, BackendError> {
        self.wait_on.replace(None);
        self.last_busy.replace(None);
        match self.place.take() {
            Some(place) => self.revoke(place.lease, deadline).await,
            None => Ok(false),
        }
    }

    /// Moves our key to a new lease of `hold` (rounded up to whole seconds), so that it
    /// outlives the revoke of ours: false when the key was no longer ours. A lease granted
    /// for nothing (the key gone) is revoked.
    pub(super) async fn keep_for(
        &self,
        place: Place,
        hold: Duration,
        deadline: Instant,
    ) -> Result<bool, BackendError> {
        let Some(created) = place.created else {
            return Ok(false);
        };
        let secs = hold.as_secs() + u64::from(hold.subsec_nanos() > 0);
        let reply = self
            .client
            .must(
                "/v3/lease/grant",
                &json!({"TTL": secs.to_string()}),
                deadline,
            )
            .await?;
        let (lease, granted) = (int(&reply["ID"]), int(&reply["TTL"]));
        if granted as u64 > secs {
            tracing::info!(
                "--min-hold: lock {} is kept for {granted}s, etcd's shortest lease",
                self.name
            );
        }
        let key = self.key_of(place.lease);
        let moved = wire::txn(
            &[wire::created_at(&key, created)],
            &[wire::move_to(&key, lease)],
            &[],
        );
        let reply = self.client.must("/v3/kv/txn", &moved, deadline).await;
        let ours = matches!(&reply, Ok(r) if r["succeeded"] == true);
        if !ours {
            let _ = self.revoke(lease, deadline).await;
        }
        reply.map(|_| ours)
    }
}

impl EtcdLock {
    /// Revokes our lease (deleting our key), or with `keep_for` moves the key to a lease of its
    /// own first (`--min-hold`).
    pub(super) async fn let_go(
        &self,
        keep_for: Option<Duration>,
        deadline: Instant,
    ) -> Result<bool, BackendError> {
        if let (Some(hold), Some(place)) = (keep_for, self.place.get()) {
            match self.keep_for(place, hold, deadline).await {
                Ok(moved) => {
                    self.leave(deadline).await?;
                    return Ok(moved);
                }
                Err(e) => tracing::warn!(
                    "could not keep lock {} for --min-hold ({e}): it is released now",
                    self.name
                ),
            }
        }
        self.leave(deadline).await
    }
}
