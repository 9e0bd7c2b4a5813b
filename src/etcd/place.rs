//! How a run reads its place in NAME's line: the view its standing is decided from, and what an
//! idle waiter may skip. Reads here go to the member asked as it has applied them
//! (`wire::serializable`) wherever a lagging answer is safe: keys before ours only go, never
//! come, so a view that has our key and no key before it is the line as it stands now. And
//! what a run does about its place besides waiting: a `-n` run refused before it queues, a
//! place given up.

use tokio::time::Instant;

use super::line::{Standing, standing};
use super::proto::etcdserverpb::{RangeResponse, TxnResponse};
use super::wire::{self, Kv, kvs, txn_range};
use super::{EtcdLock, Place, busy};
use crate::backend::{Attempt, BackendError, Mode};

impl EtcdLock {
    /// The line as this run's standing reads it, with our key: our key, then the keys before
    /// it (an exclusive run: the last one and the first one; other modes: all of them), in
    /// one view; `serializable`, as the member asked has applied it.
    async fn view(
        &self,
        place: &Place,
        serializable: bool,
        deadline: Instant,
    ) -> Result<TxnResponse, BackendError> {
        let mut reads = vec![wire::one(&place.key)];
        match self.mode {
            Mode::Exclusive => reads.extend([
                wire::last_created(&self.prefix, 1, place.created - 1),
                wire::range_first(&self.prefix),
            ]),
            _ => reads.push(wire::created_up_to(&self.prefix, place.created - 1)),
        }
        let txn = match serializable {
            true => wire::serializable(reads),
            false => wire::txn(
                Vec::new(),
                reads.into_iter().map(wire::read).collect(),
                Vec::new(),
            ),
        };
        self.client.must(wire::TXN, &txn, deadline).await
    }

    /// The keys before our `place`, and the revision they were read at: read as the member
    /// asked has applied them, and again, confirmed by the leader, when that member answers
    /// from before what woke this waiter, or before its own key. `None` when our key is gone
    /// (its lease lapsed, a `release --force`): the place is given up, for the next round to
    /// queue again.
    pub(super) async fn standing_read(
        &self,
        place: &Place,
        deadline: Instant,
    ) -> Result<Option<(Vec<Kv>, i64)>, BackendError> {
        let woken = std::mem::take(&mut self.st().woken_at);
        let mut view = self.view(place, true, deadline).await?;
        if !ours(&view, place.created) || wire::revision(&view) < woken {
            view = self.view(place, false, deadline).await?;
        }
        if !ours(&view, place.created) {
            let _ = self.place_gone(&place.key);
            return Ok(None);
        }
        let before: Vec<Kv> = match self.mode {
            Mode::Exclusive => {
                let last = kvs(txn_range(&view, 1)).into_iter().next();
                let first = kvs(txn_range(&view, 2))
                    .into_iter()
                    .next()
                    .filter(|kv| kv.create_revision < place.created);
                first.into_iter().chain(last).collect()
            }
            _ => kvs(txn_range(&view, 1)),
        };
        Ok(Some((before, wire::revision(&view))))
    }

    /// A waiter's heartbeat between wake-ups, answered without reading the line: its watch
    /// stands confirmed on what its last attempt awaited, on the connection requests go on,
    /// and has not fired, so nothing it waits for has happened; and the line was read within
    /// [`RESETTLE`](super::RESETTLE). `None` when it must read.
    pub(super) fn unchanged(&self) -> Option<Attempt> {
        let st = self.st();
        let on = st.wait_on.as_ref()?;
        let (_, awaited, conn) = st.watching.as_ref()?;
        if awaited != &on.awaited || !self.client.is_current(*conn) {
            return None;
        }
        if st.settled.is_none_or(|t| t.elapsed() >= super::RESETTLE) {
            return None;
        }
        st.last_busy.clone()
    }

    /// For a run that will not wait (`-n`): the attempt that ends it before it queues, when
    /// the line as it stands already leaves it no place; `None` when it may try.
    pub(super) async fn refused_at_once(
        &self,
        deadline: Instant,
    ) -> Result<Option<Attempt>, BackendError> {
        let range = match self.mode {
            Mode::Exclusive => wire::range_first(&self.prefix),
            _ => wire::range_line(&self.prefix),
        };
        let reply: RangeResponse = self.client.must(wire::RANGE, &range, deadline).await?;
        let line = kvs(Some(&reply));
        Ok(match standing(self.mode, &line) {
            Standing::Holds => None,
            Standing::Waits(_) => Some(busy(&line[0])),
            Standing::Mismatch(theirs) => Some(Attempt::Mismatch { theirs }),
        })
    }

    /// Gives up the place of a run that will not wait; should etcd not answer, its leases
    /// are kept, for the give-back on the way out to try again.
    pub(super) async fn step_aside(&self, deadline: Instant) {
        let kept = {
            let st = self.st();
            (st.hold, st.queue, st.place.clone())
        };
        if let Err(e) = self.leave(deadline).await {
            let mut st = self.st();
            (st.hold, st.queue, st.place) = kept;
            tracing::info!("could not give up the place of lock {}: {e}", self.name);
        }
    }
}

/// Whether `view` (see [`EtcdLock::view`]) has our key, the one created at `created`.
fn ours(view: &TxnResponse, created: i64) -> bool {
    kvs(txn_range(view, 0))
        .first()
        .is_some_and(|kv| kv.create_revision == created)
}
