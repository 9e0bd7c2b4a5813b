//! How a run reads its place in NAME's line: the view its standing is decided from, and what a
//! woken or idle waiter may skip. Reads here go to the member asked as it has applied them
//! (`wire::serializable`) wherever a lagging answer is safe: keys before ours only go, never
//! come, so a view that has our key and no key before it is the line as it stands now. And
//! what a run does about its place besides waiting: a `-n` run refused before it queues, a
//! place given up, the waiter behind told.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::line::{Standing, standing};
use super::wire::{self, Kv, kvs, txn_range};
use super::{EtcdLock, FRESH, Place, busy};
use crate::backend::{Attempt, BackendError, Mode};
use crate::lease::Timings;

impl EtcdLock {
    /// The line as this run's standing reads it, with our key: our key, then the keys before
    /// it (an exclusive run: the last one and the first one; other modes: all of them), in
    /// one view; `serializable`, as the member asked has applied it.
    pub(super) async fn view(
        &self,
        key: &str,
        created: i64,
        serializable: bool,
        deadline: Instant,
    ) -> Result<Value, BackendError> {
        let mut reads = vec![wire::get(key)];
        match self.mode {
            Mode::Exclusive => reads.extend([
                wire::last_created_up_to(&self.prefix, created - 1),
                wire::first_created(&self.prefix),
            ]),
            _ => reads.push(wire::created_up_to(&self.prefix, created - 1)),
        }
        let txn = match serializable {
            true => wire::serializable(&reads),
            false => wire::txn(&[], &reads, &[]),
        };
        self.client.must("/v3/kv/txn", &txn, deadline).await
    }

    /// Our standing's evidence in `view` (read by [`EtcdLock::view`], serializable): the keys
    /// before ours, and the revision it was read at. A member may answer from a revision
    /// before what woke this waiter, or before its own key: such a view is read again,
    /// confirmed by the leader. `None` when our key is gone (a `release --force`, a hand
    /// delete): our place is given up, for the next round to queue again.
    pub(super) async fn standing_in(
        &self,
        key: &str,
        created: i64,
        mut view: Value,
        deadline: Instant,
    ) -> Result<Option<(i64, Vec<Kv>, i64)>, BackendError> {
        let woken = self.woken_at.take();
        if !ours(&view, created) || wire::revision(&view) < woken {
            view = self.view(key, created, false, deadline).await?;
        }
        if !ours(&view, created) {
            tracing::info!(
                "the key {key} of this run's place was deleted (release --force?): queueing again"
            );
            let _ = self.leave(deadline).await;
            return Ok(None);
        }
        let before: Vec<Kv> = match self.mode {
            Mode::Exclusive => {
                let last = kvs(txn_range(&view, 1)).into_iter().next();
                let first = kvs(txn_range(&view, 2))
                    .into_iter()
                    .next()
                    .filter(|kv| kv.create_revision < created);
                first.into_iter().chain(last).collect()
            }
            _ => kvs(txn_range(&view, 1)),
        };
        Ok(Some((created, before, wire::revision(&view))))
    }

    /// How long a kept-alive lease stands without asking again: [`FRESH`], or a third of the
    /// lease when that is shorter. The heartbeat that asks next comes up to
    /// `KEEP_ALIVE / 3` later: within two thirds of the lease, even at etcd's shortest (2 s).
    fn fresh(&self) -> Duration {
        FRESH.min(Duration::from_secs(self.granted.get()) / 3)
    }

    /// Whether our key, the one created at `created`, is the first under `NAME/`, read as
    /// the member asked has applied it (see `wire::serializable`): a member's answer from a
    /// revision at or after `woken` (the event that woke us, whose view has every delete
    /// before it) that shows ours first is the line as it stands now, since keys before ours
    /// only go. An older answer is `false`, for the whole view to be read.
    pub(super) async fn first_is(
        &self,
        key: &str,
        created: i64,
        woken: i64,
        deadline: Instant,
    ) -> Result<bool, BackendError> {
        let mut read = wire::range_first(&self.prefix);
        read["serializable"] = json!(true);
        // Its key and create revision say it all: not the holder's metadata.
        read["keys_only"] = json!(true);
        let reply = self.client.must("/v3/kv/range", &read, deadline).await?;
        let first = kvs(&reply).into_iter().next();
        Ok(wire::revision(&reply) >= woken
            && first.is_some_and(|kv| kv.key == key && kv.create_revision == created))
    }

    /// This run's lease lapsed while it waited: a new one, and a new place, at the end.
    pub(super) async fn lapsed(
        &self,
        timings: &Timings,
        deadline: Instant,
    ) -> Result<i64, BackendError> {
        tracing::info!(
            "this run's lease on lock {} lapsed while it waited: it queues again, at the end",
            self.name
        );
        self.place.set(None);
        self.grant(timings, deadline).await
    }

    /// A waiter's heartbeat between wake-ups, answered without asking etcd: its watch stands
    /// confirmed on what its last attempt awaited and has not fired, so nothing it waits for
    /// has happened, and its lease was kept alive within [`EtcdLock::fresh`]. `None` when it must
    /// ask.
    pub(super) fn unchanged(&self) -> Option<Attempt> {
        let place = self.place.get()?;
        place.created?;
        let on = self.waits_on()?;
        let watching = self.watching.borrow();
        if watching.as_ref().map(|(_, awaited)| awaited) != Some(&on.awaited) {
            return None;
        }
        if self.kept_alive.get()?.elapsed() >= self.fresh() {
            return None;
        }
        self.last_busy.borrow().clone()
    }
}

impl EtcdLock {
    /// For a run that will not wait (`-n`): the attempt that ends it before it queues, when
    /// the line as it stands already leaves it no place; `None` when it may try.
    pub(super) async fn refused_at_once(
        &self,
        deadline: Instant,
    ) -> Result<Option<Attempt>, BackendError> {
        let line = match self.mode {
            Mode::Exclusive => self.holder_key(deadline).await?.into_iter().collect(),
            _ => {
                let reply = self
                    .client
                    .must("/v3/kv/range", &wire::range_line(&self.prefix), deadline)
                    .await?;
                kvs(&reply)
            }
        };
        Ok(match standing(self.mode, &line) {
            Standing::Holds => None,
            Standing::Waits(_) => Some(busy(&line[0])),
            Standing::Mismatch(theirs) => Some(Attempt::Mismatch { theirs }),
        })
    }

    /// Gives up the place of a run that will not wait; should etcd not answer, it is kept as
    /// a place, for the give-back on the way out to try again.
    pub(super) async fn step_aside(&self, lease: i64, created: i64, deadline: Instant) {
        if let Err(e) = self.leave(deadline).await {
            self.place.set(Some(Place {
                lease,
                created: Some(created),
            }));
            tracing::info!("could not give up the place of lock {}: {e}", self.name);
        }
    }

    /// A semaphore's waiter that took a place writes its key again: the waiter behind it,
    /// watching it, is the first waiter now. Unanswered, that waiter learns it at its next
    /// heartbeat instead.
    pub(super) async fn tell_the_next(
        &self,
        key: &str,
        lease: i64,
        created: i64,
        deadline: Instant,
    ) {
        let touch = wire::txn(
            &[wire::created_at(key, created)],
            &[wire::put(key, &self.value(), lease)],
            &[],
        );
        if let Err(e) = self.client.must("/v3/kv/txn", &touch, deadline).await {
            tracing::info!(
                "could not tell the next waiter of lock {} that it comes next: {e}",
                self.name
            );
        }
    }
}

/// Whether `view` (see [`EtcdLock::view`]) has our key, the one created at `created`.
fn ours(view: &Value, created: i64) -> bool {
    kvs(txn_range(view, 0))
        .first()
        .is_some_and(|kv| kv.create_revision == created)
}
