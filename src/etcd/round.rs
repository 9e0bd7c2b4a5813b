//! One acquisition attempt, in rounds (a round ends `Again` when our key vanished under it, a
//! lapse or a `release --force`, and the next round starts over):
//!
//! - A run with no place yet takes the holding lease and, in one transaction, creates its key
//!   on it if `NAME/` is empty (the lock is free and nobody waits): held, one round trip after
//!   the grant. Else it queues: a queue lease, its key created on it, and in the same
//!   transaction the keys that decide its standing.
//! - A waiter's heartbeat keeps its queue lease alive on the stream (and its holding lease,
//!   when a third of it has gone); while its watch stands and has not fired, that is all.
//! - Woken (or with no watch standing), an exclusive waiter sends the grant at once: one
//!   transaction that compares the whole line (no key before its own) and moves its key to
//!   the holding lease (the mark), or, when the comparison fails, reads what its standing now
//!   rests on. Other modes read the line first (their standing is no one comparison), then
//!   mark. A grant is only said once the holding lease was granted or kept alive within the
//!   attempt: the lease clock counts from the attempt's send instant.

use tokio::time::Instant;

use super::line::{Standing, standing};
use super::proto::etcdserverpb::TxnResponse;
use super::watch::Predecessor;
use super::wire::{self, Kv, kvs, txn_range};
use super::{EtcdLock, Lease, Place, busy};
use crate::backend::{Attempt, BackendError, Mode};
use crate::lease::Timings;

/// What one round of an attempt found.
pub enum Round {
    Done(Attempt),
    /// Our key vanished between two steps: once more.
    Again,
}

impl EtcdLock {
    pub(super) async fn round(
        &self,
        timings: &Timings,
        listen: bool,
        started: Instant,
        deadline: Instant,
    ) -> Result<Round, BackendError> {
        let place = self.st().place.clone();
        match place {
            Some(place) if place.marked => {
                // Ours already (a grant whose answer was lost, found again by a read).
                let hold = self.hold_kept_since(timings, started, deadline).await?;
                match hold {
                    Some(_) => Ok(Round::Done(self.acquired(&place))),
                    None => {
                        self.st().place = None;
                        Ok(Round::Again)
                    }
                }
            }
            Some(place) => self.heartbeat(timings, place, started, deadline).await,
            None => self.first(timings, listen, started, deadline).await,
        }
    }

    /// The holding lease, granted or kept alive since `started`; `None` when etcd no longer
    /// had it (a new one is granted at the next round).
    async fn hold_kept_since(
        &self,
        timings: &Timings,
        started: Instant,
        deadline: Instant,
    ) -> Result<Option<Lease>, BackendError> {
        let hold = self.st().hold;
        match hold {
            Some(hold) if hold.kept >= started => Ok(Some(hold)),
            Some(hold) => match self.keep_alive_hold(hold, deadline).await? {
                true => Ok(self.st().hold),
                false => Ok(None),
            },
            None => self.grant_hold(timings, deadline).await.map(Some),
        }
    }

    /// A run with no place: the lock taken if `NAME/` is empty, else a place in the line (not
    /// for `-n`, which leaves).
    async fn first(
        &self,
        timings: &Timings,
        listen: bool,
        started: Instant,
        deadline: Instant,
    ) -> Result<Round, BackendError> {
        // -n: a run that will not wait does not queue, even for an instant.
        if !listen {
            if let Some(attempt) = self.refused_at_once(deadline).await? {
                return Ok(Round::Done(attempt));
            }
        }
        let Some(hold) = self.hold_kept_since(timings, started, deadline).await? else {
            return Ok(Round::Again);
        };
        let key = self.key_of(hold.id);
        let take = wire::txn(
            vec![wire::empty(&self.prefix)],
            vec![wire::put(&key, &self.value(), hold.id)],
            vec![wire::read(wire::range_first(&self.prefix)), wire::get(&key)],
        );
        let Some(reply) = self.txn(&take, deadline).await? else {
            self.st().hold = None;
            return Ok(Round::Again);
        };
        let made = match reply.succeeded {
            true => Some(wire::revision(&reply)),
            // Our key was made by a take whose answer was lost: the lock is ours.
            false => kvs(txn_range(&reply, 1))
                .first()
                .filter(|kv| kv.lease == hold.id)
                .map(|kv| kv.create_revision),
        };
        if let Some(created) = made {
            let place = Place {
                key,
                created,
                marked: true,
            };
            self.st().place = Some(place.clone());
            return Ok(Round::Done(self.acquired(&place)));
        }
        let Some(first) = kvs(txn_range(&reply, 0)).into_iter().next() else {
            // Emptied meanwhile: once more.
            return Ok(Round::Again);
        };
        if !listen && self.mode == Mode::Exclusive {
            self.step_aside(deadline).await;
            return Ok(Round::Done(busy(&first)));
        }
        self.queue(timings, listen, started, deadline).await
    }

    /// A place in the line: our key `NAME/<holding lease hex>` made on the queue lease (or,
    /// for `-n` in a mode whose standing the line decides, on the holding lease, for the
    /// instant it decides), with the keys that decide our standing read in the same
    /// transaction.
    async fn queue(
        &self,
        timings: &Timings,
        listen: bool,
        started: Instant,
        deadline: Instant,
    ) -> Result<Round, BackendError> {
        let (queue, hold) = {
            let st = self.st();
            (st.queue, st.hold)
        };
        let Some(hold) = hold else {
            return Ok(Round::Again);
        };
        let lease = match (listen, queue) {
            (true, Some(queue)) => queue,
            (true, None) => self.grant_queue(deadline).await?,
            (false, _) => hold,
        };
        // Named after the holding lease in any case: a holder's key names the lease it is on,
        // as in etcd's recipe, whichever way it came to hold.
        let key = self.key_of(hold.id);
        // The keys before ours: an exclusive run's standing rests on the first and the one
        // just before it (the last two keys: ours was just made); a line's on all of them.
        let before = match self.mode {
            Mode::Exclusive => wire::last_created(&self.prefix, 2, 0),
            _ => wire::range_line(&self.prefix),
        };
        let create = wire::txn(
            vec![wire::absent(&key)],
            vec![
                wire::put(&key, &self.value(), lease.id),
                wire::read(wire::range_first(&self.prefix)),
                wire::read(before),
            ],
            vec![wire::get(&key), wire::read(wire::range_first(&self.prefix))],
        );
        let Some(reply) = self.txn(&create, deadline).await? else {
            let mut st = self.st();
            match listen {
                true => st.queue = None,
                false => st.hold = None,
            }
            return Ok(Round::Again);
        };
        let created = match reply.succeeded {
            true => wire::revision(&reply),
            false => match kvs(txn_range(&reply, 0)).first() {
                Some(kv) => kv.create_revision,
                None => return Ok(Round::Again),
            },
        };
        let place = Place {
            key: key.clone(),
            created,
            marked: !listen,
        };
        self.st().place = Some(place.clone());
        let Some(first) = kvs(txn_range(&reply, 1)).into_iter().next() else {
            return Ok(Round::Again);
        };
        let (before, read_at): (Vec<Kv>, i64) = match reply.succeeded {
            true => {
                let before = kvs(txn_range(&reply, 2))
                    .into_iter()
                    .filter(|kv| kv.create_revision < created);
                let before = match self.mode {
                    Mode::Exclusive if first.create_revision < created => {
                        std::iter::once(first).chain(before.take(1)).collect()
                    }
                    Mode::Exclusive => Vec::new(),
                    _ => before.collect(),
                };
                (before, created)
            }
            // Our key was there already (a create whose reply was lost): read.
            false => match self.standing_read(&place, deadline).await? {
                Some(before) => before,
                None => return Ok(Round::Again),
            },
        };
        self.decide(
            timings,
            &place,
            (&before, read_at),
            listen,
            started,
            deadline,
        )
        .await
    }

    /// A waiter's heartbeat, or its wake-up: its queue lease kept alive, and its standing
    /// asked again unless its watch stands and has not fired.
    async fn heartbeat(
        &self,
        timings: &Timings,
        place: Place,
        started: Instant,
        deadline: Instant,
    ) -> Result<Round, BackendError> {
        let (queue, hold, woken) = {
            let st = self.st();
            (st.queue, st.hold, st.woken_at)
        };
        let Some(queue) = queue else {
            self.st().place = None;
            return Ok(Round::Again);
        };
        // Woken, an exclusive waiter is most likely the first now: the grant at once, its
        // leases kept alive beside it.
        if woken > 0 && self.mode == Mode::Exclusive {
            // Woken by the delete of the key it waits on: when that key was the first, it is
            // first now, proven without reading.
            let first = {
                let mut st = self.st();
                st.woken_at = 0;
                st.behind_first
            };
            return self
                .mark(timings, &place, (Some(queue), first), started, deadline)
                .await;
        }
        // The holding lease too, when a third of it has gone.
        let hold_due = hold.is_some_and(|h| h.kept.elapsed() * 3 >= h.granted_for());
        let mut leases = vec![queue];
        leases.extend(hold.filter(|_| hold_due));
        let alive = self.keep_alive(&mut leases, deadline).await?;
        {
            let mut st = self.st();
            st.queue = alive[0].then_some(leases[0]);
            if hold_due {
                st.hold = alive[1].then_some(leases[1]);
            }
        }
        if !alive[0] {
            tracing::info!(
                "this run's place in the line of lock {} lapsed while it waited (its queue lease \
                 was not kept alive in time): it queues again, at the end",
                self.name
            );
            let mut st = self.st();
            st.place = None;
            st.wait_on = None;
            st.last_busy = None;
            return Ok(Round::Again);
        }
        if woken == 0 {
            if let Some(attempt) = self.unchanged() {
                return Ok(Round::Done(attempt));
            }
        }
        let Some((before, read_at)) = self.standing_read(&place, deadline).await? else {
            return Ok(Round::Again);
        };
        self.decide(timings, &place, (&before, read_at), true, started, deadline)
            .await
    }

    /// What our standing, read as the keys `before` ours at revision `read_at`, makes of
    /// this attempt.
    #[allow(clippy::too_many_arguments)]
    async fn decide(
        &self,
        timings: &Timings,
        place: &Place,
        (before, read_at): (&[Kv], i64),
        listen: bool,
        started: Instant,
        deadline: Instant,
    ) -> Result<Round, BackendError> {
        match standing(self.mode, before) {
            Standing::Holds if place.marked => {
                match self.hold_kept_since(timings, started, deadline).await? {
                    Some(_) => Ok(Round::Done(self.acquired(place))),
                    None => Ok(Round::Again),
                }
            }
            // Read with no key before ours: first, proven (keys before ours only go).
            Standing::Holds => {
                self.mark(timings, place, (None, true), started, deadline)
                    .await
            }
            Standing::Mismatch(theirs) => {
                self.step_aside(deadline).await;
                Ok(Round::Done(Attempt::Mismatch { theirs }))
            }
            Standing::Waits(awaited) => {
                if !listen {
                    self.step_aside(deadline).await;
                    return Ok(Round::Done(busy(&before[0])));
                }
                Ok(Round::Done(self.waits(before, awaited, read_at)))
            }
        }
    }

    /// A waiter's answer: busy, held by the first key `before` ours; what it awaits is
    /// watched from the revision after `read_at`, the read that found it.
    fn waits(&self, before: &[Kv], awaited: super::line::Awaited, read_at: i64) -> Attempt {
        let busy = busy(&before[0]);
        let first = before.first().map(|kv| (&kv.key, kv.create_revision));
        let mut st = self.st();
        st.behind_first = self.mode == Mode::Exclusive
            && first == before.last().map(|kv| (&kv.key, kv.create_revision));
        st.wait_on = Some(Predecessor {
            awaited,
            from: read_at + 1,
        });
        st.last_busy = Some(busy.clone());
        st.settled = Some(Instant::now());
        busy
    }

    /// The grant: our key moved to the holding lease (the mark), in one transaction that
    /// confirms we may hold. Where it is `proven` already that we may (the line read, and in
    /// it room for us; or the key we waited on, the first then, gone since: keys before ours
    /// only go, so it holds still), the transaction confirms our key is still there, created
    /// when we queued. Else (an exclusive waiter woken by the delete of a waiter's key) it
    /// also compares the whole line: no key under `NAME/` older than ours (etcd compares a
    /// key range, each of its keys, so no extra request), and where that fails, it reads
    /// what our standing rests on now. Beside it, on the stream, the `queue` lease kept alive
    /// (a woken waiter's, which may wait on) and the holding lease, unless it was granted or
    /// kept alive within this attempt: the lease clock counts from the attempt's send
    /// instant.
    async fn mark(
        &self,
        timings: &Timings,
        place: &Place,
        (queue, proven): (Option<Lease>, bool),
        started: Instant,
        deadline: Instant,
    ) -> Result<Round, BackendError> {
        let hold = self.st().hold;
        let hold = match hold {
            Some(hold) => hold,
            None => self.grant_hold(timings, deadline).await?,
        };
        let mut compare = vec![wire::created_at(&place.key, place.created)];
        let mut failure = vec![wire::get(&place.key)];
        if self.mode == Mode::Exclusive && !proven {
            compare.push(wire::none_before(&self.prefix, place.created));
            failure.extend([
                wire::read(wire::last_created(&self.prefix, 1, place.created - 1)),
                wire::read(wire::range_first(&self.prefix)),
            ]);
        }
        let grant = wire::txn(
            compare,
            vec![wire::put(&place.key, &self.value(), hold.id)],
            failure,
        );
        let keep_hold = hold.kept < started;
        let mut leases: Vec<Lease> = queue.into_iter().collect();
        if keep_hold {
            leases.push(hold);
        }
        let keep = async {
            match leases.is_empty() {
                true => Ok(Vec::new()),
                false => self.keep_alive(&mut leases, deadline).await,
            }
        };
        let (alive, reply) = tokio::join!(keep, self.txn(&grant, deadline));
        let (alive, reply) = (alive?, reply?);
        let hold_alive = {
            let mut st = self.st();
            if queue.is_some() {
                st.queue = alive[0].then_some(leases[0]);
            }
            let hold_alive = !keep_hold || alive[leases.len() - 1];
            if keep_hold && st.hold.is_some_and(|h| h.id == hold.id) {
                st.hold = hold_alive.then_some(leases[leases.len() - 1]);
            }
            hold_alive
        };
        let reply = match (hold_alive, reply) {
            (true, Some(reply)) => reply,
            // The holding lease lapsed (a run paused longer than it): a new one, once more.
            _ => {
                self.st().hold = None;
                return Ok(Round::Again);
            }
        };
        if reply.succeeded {
            let place = Place {
                marked: true,
                ..place.clone()
            };
            {
                let mut st = self.st();
                st.place = Some(place.clone());
                // The queue lease has no key now: it lapses by itself, off every path.
                st.queue = None;
            }
            return Ok(Round::Done(self.acquired(&place)));
        }
        let Some(now) = kvs(txn_range(&reply, 0)).into_iter().next() else {
            return Ok(self.place_gone(&place.key));
        };
        if now.lease == hold.id {
            return Ok(self.mark_found(place));
        }
        let last = kvs(txn_range(&reply, 1)).into_iter().next();
        let first = kvs(txn_range(&reply, 2))
            .into_iter()
            .next()
            .filter(|kv| kv.create_revision < place.created);
        let before: Vec<Kv> = first.into_iter().chain(last).collect();
        match standing(self.mode, &before) {
            Standing::Waits(awaited) => Ok(Round::Done(self.waits(
                &before,
                awaited,
                wire::revision(&reply),
            ))),
            Standing::Mismatch(theirs) => {
                self.step_aside(deadline).await;
                Ok(Round::Done(Attempt::Mismatch { theirs }))
            }
            // No key before ours after all (the comparison failed on a key gone since): once
            // more.
            Standing::Holds => Ok(Round::Again),
        }
    }

    /// Our key found on the holding lease, by a grant whose answer was lost: held.
    fn mark_found(&self, place: &Place) -> Round {
        let place = Place {
            marked: true,
            ..place.clone()
        };
        {
            let mut st = self.st();
            st.place = Some(place.clone());
            st.queue = None;
        }
        Round::Done(self.acquired(&place))
    }

    /// Our key is gone (its queue lease lapsed, a `release --force`, a hand delete): the
    /// place is given up, for the next round to queue again.
    pub(super) fn place_gone(&self, key: &str) -> Round {
        tracing::info!(
            "the key {key} of this run's place in lock {} was deleted (its lease lapsed, or \
             release --force?): queueing again",
            self.name
        );
        let mut st = self.st();
        st.place = None;
        st.wait_on = None;
        st.last_busy = None;
        Round::Again
    }

    /// A transaction; `None` when etcd answered that a lease it puts a key on is gone (the
    /// caller forgets that lease, for the next round to take another).
    async fn txn(
        &self,
        txn: &super::proto::etcdserverpb::TxnRequest,
        deadline: Instant,
    ) -> Result<Option<TxnResponse>, BackendError> {
        match self.client.call(wire::TXN, txn, deadline).await? {
            Ok(reply) => Ok(Some(reply)),
            Err(status) if status.code == super::grpc::NOT_FOUND => Ok(None),
            Err(status) => Err(self.client.refused(&status)),
        }
    }
}

impl Lease {
    /// Its TTL, as a duration.
    pub(super) fn granted_for(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.granted)
    }
}
