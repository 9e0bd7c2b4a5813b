//! This run's etcd leases: the holding lease (whole seconds, at least `--ttl`) and a waiter's
//! queue lease, granted, kept alive on the keep-alive stream, revoked; and, for `--min-hold`,
//! a lease of its own for the key to outlive the run.

use std::time::Duration;

use tokio::time::Instant;

use super::client::NOT_FOUND;
use super::proto::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseRevokeRequest, LeaseRevokeResponse, TxnResponse,
};
use super::wire;
use super::{EtcdLock, Lease, QUEUE_TTL};
use crate::backend::BackendError;
use crate::lease::Timings;

/// Whole seconds, rounded up.
fn seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl EtcdLock {
    /// A lease of `asked` seconds: its id and the TTL etcd granted, with the instant the
    /// request was sent.
    async fn grant_of(&self, asked: u64, deadline: Instant) -> Result<Lease, BackendError> {
        let kept = Instant::now();
        let request = LeaseGrantRequest {
            ttl: asked as i64,
            id: 0,
        };
        let reply: LeaseGrantResponse = self
            .client
            .must(wire::LEASE_GRANT, &request, deadline)
            .await?;
        if reply.id <= 0 || reply.ttl < asked as i64 {
            return Err(BackendError::Refused(format!(
                "etcd at {} granted lease {} of {}s for the {asked}s asked",
                self.client.url(),
                reply.id,
                reply.ttl
            )));
        }
        Ok(Lease {
            id: reply.id,
            granted: reply.ttl as u64,
            kept,
        })
    }

    /// The holding lease: `--ttl` rounded up to whole seconds.
    pub(super) async fn grant_hold(
        &self,
        timings: &Timings,
        deadline: Instant,
    ) -> Result<Lease, BackendError> {
        let ttl = timings.ttl;
        let lease = self.grant_of(seconds(ttl), deadline).await?;
        self.st().hold = Some(lease);
        // The lease clock counts with --ttl from the instant the attempt was sent, before the
        // grant: etcd's lease, at least as long and started later, outlasts what it trusts.
        let said = std::mem::replace(&mut self.st().said, true);
        if !said && lease.granted as u128 * 1000 != ttl.as_millis() {
            tracing::info!(
                "etcd leases last whole seconds: lock {} is on a lease of {}s for --ttl {} \
                 (etcd raises short ones to its minimum); the command is stopped by --ttl all the same",
                self.name,
                lease.granted,
                crate::text::show(ttl)
            );
        }
        Ok(lease)
    }

    /// A waiter's queue lease, of [`QUEUE_TTL`] (etcd may raise it to its shortest).
    pub(super) async fn grant_queue(&self, deadline: Instant) -> Result<Lease, BackendError> {
        let lease = self.grant_of(seconds(QUEUE_TTL), deadline).await?;
        if lease.granted > seconds(QUEUE_TTL) {
            tracing::info!(
                "etcd's shortest lease is {}s: a waiter of lock {} that is gone holds the line \
                 up that long (2s where etcd allows)",
                lease.granted,
                self.name
            );
        }
        self.st().queue = Some(lease);
        Ok(lease)
    }

    /// Keeps `leases` alive on the stream: for each, whether etcd still had it (its `kept`
    /// then the send instant).
    pub(super) async fn keep_alive(
        &self,
        leases: &mut [Lease],
        deadline: Instant,
    ) -> Result<Vec<bool>, BackendError> {
        let sent = Instant::now();
        let ids: Vec<i64> = leases.iter().map(|l| l.id).collect();
        let ttls = self.client.keep_alive(&ids, deadline).await?;
        Ok(leases
            .iter_mut()
            .zip(ttls)
            .map(|(lease, ttl)| {
                let alive = ttl > 0;
                if alive {
                    lease.kept = sent;
                }
                alive
            })
            .collect())
    }

    /// Keeps the holding lease `hold` alive: false when etcd no longer has it (expired, or
    /// revoked). Either way the state says so.
    pub(super) async fn keep_alive_hold(
        &self,
        hold: Lease,
        deadline: Instant,
    ) -> Result<bool, BackendError> {
        let mut leases = [hold];
        let alive = self.keep_alive(&mut leases, deadline).await?[0];
        let mut st = self.st();
        if st.hold.is_some_and(|h| h.id == hold.id) {
            st.hold = alive.then_some(leases[0]);
        }
        Ok(alive)
    }

    /// Revokes `lease`, deleting its key: false when there was no such lease any more.
    pub(super) async fn revoke(&self, lease: i64, deadline: Instant) -> Result<bool, BackendError> {
        let request = LeaseRevokeRequest { id: lease };
        match self
            .client
            .call::<_, LeaseRevokeResponse>(wire::LEASE_REVOKE, &request, deadline)
            .await?
        {
            Ok(_) => Ok(true),
            Err(status) if status.code == NOT_FOUND => Ok(false),
            Err(status) => Err(self.client.refused(&status)),
        }
    }

    /// Gives up this run's leases, and its key with them (whichever it is on); a later
    /// attempt starts afresh. Forgotten even when a revoke went unanswered: the lease then
    /// lapses. True when either lease was still there.
    pub(super) async fn leave(&self, deadline: Instant) -> Result<bool, BackendError> {
        let (hold, queue) = self.forget();
        let revoke = |lease: Option<Lease>| async move {
            match lease {
                Some(lease) => self.revoke(lease.id, deadline).await,
                None => Ok(false),
            }
        };
        let (hold, queue) = tokio::join!(revoke(hold), revoke(queue));
        Ok(hold? | queue?)
    }

    /// Forgets this run's place and leases without a word to etcd: for a key already deleted
    /// (a release's transaction), whose leases hold nothing and lapse by themselves. Returns
    /// the leases forgotten.
    pub(super) fn forget(&self) -> (Option<Lease>, Option<Lease>) {
        let mut st = self.st();
        st.wait_on = None;
        st.last_busy = None;
        st.place = None;
        (st.hold.take(), st.queue.take())
    }

    /// Moves our key to a new lease of `hold` (rounded up to whole seconds), so that it
    /// outlives the revoke of ours: false when the key was no longer ours. A lease granted
    /// for nothing (the key gone) is revoked.
    async fn keep_for(&self, hold: Duration, deadline: Instant) -> Result<bool, BackendError> {
        let Some(place) = self.st().place.clone() else {
            return Ok(false);
        };
        let secs = seconds(hold);
        let lease = self.grant_of(secs, deadline).await?;
        if lease.granted > secs {
            tracing::info!(
                "--min-hold: lock {} is kept for {}s, etcd's shortest lease",
                self.name,
                lease.granted
            );
        }
        let moved = wire::txn(
            vec![wire::created_at(&place.key, place.created)],
            vec![wire::move_to(&place.key, lease.id)],
            Vec::new(),
        );
        let reply = self
            .client
            .must::<_, TxnResponse>(wire::TXN, &moved, deadline)
            .await;
        let ours = matches!(&reply, Ok(r) if r.succeeded);
        if !ours {
            let _ = self.revoke(lease.id, deadline).await;
        }
        reply.map(|_| ours)
    }

    /// Revokes our leases (deleting our key), or with `keep_for` moves the key to a lease of
    /// its own first (`--min-hold`).
    pub(super) async fn let_go(
        &self,
        keep_for: Option<Duration>,
        deadline: Instant,
    ) -> Result<bool, BackendError> {
        if let Some(hold) = keep_for {
            match self.keep_for(hold, deadline).await {
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
