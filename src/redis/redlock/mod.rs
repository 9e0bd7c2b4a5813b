//! Redlock over N independent Redis primaries, with fencing tokens that stay monotonic.
//!
//! The lock is held when a quorum (N/2 + 1) of servers granted it, within the lease: every
//! server is asked in parallel, each with a timeout far below T, and the lease clock measures
//! validity from before the first request, as for one server. Renewals need a quorum too, and
//! take a server again where the key is gone (see `scripts::RENEW_OR_RETAKE`).
//!
//! The fence, in two phases (docs/how-it-works.md's Redlock section gives the proof in full):
//! 1. each server's acquire script returns its own `INCR fence:{NAME}` (c_i);
//! 2. f = max(c_i) over the servers that granted, and each of them raises its counter to f,
//!    only while it still holds our token; f is the fence only once a quorum confirmed.
//!
//! Any two confirmed quorums share a server. There the later holder's INCR runs after our key
//! was gone, hence after our raise, so its token is larger than f, as long as the servers of a
//! confirmed quorum keep their counters.

use std::cell::Cell;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::{join_all, select_all};
use futures_util::stream::FuturesUnordered;

use crate::backend::new_token;
use crate::backend::{
    Attempt, Backend, BackendError, Busy, Check, Expiry, Freed, History, Report, Run, Servers,
    Tenure, View, Wakeup, Wakeups, merged,
};
use crate::lease::Timings;
use crate::redis::lock::ServerLock;
use crate::redis::node::Node;

mod quorum;
mod report;
mod server;

use quorum::{Outcome, Tally, gather};
use report::{most_common_holder, same_owner, summarize};
pub use server::Here;

/// A lock on N servers, all with one token.
pub struct Redlock {
    locks: Vec<ServerLock>,
    node_timeout: Duration,
    /// The fence of the lock held (0 before): renewals raise a re-taken server's counter to it.
    fence: Cell<u64>,
}

impl Redlock {
    /// `locks` on distinct servers (at least 3), each with the same token.
    pub fn new(locks: Vec<ServerLock>, node_timeout: Duration) -> Redlock {
        let token = new_token();
        let locks: Vec<ServerLock> = locks.into_iter().map(|l| l.with_token(&token)).collect();
        Redlock {
            locks,
            node_timeout,
            fence: Cell::new(0),
        }
    }

    pub fn quorum(&self) -> usize {
        self.locks.len() / 2 + 1
    }

    fn servers(&self) -> usize {
        self.locks.len()
    }

    /// Gives back, on the servers named by `on` (where a request with the current token may
    /// have taken the lock, or may still land), whatever it may hold there, with the release
    /// message when `wake` (none for a grant that made no quorum: waiters, this one too, would
    /// all try again at once against a quorum still held), and goes on with a fresh token on
    /// every server: a give-back that lands late must not delete a lock taken again since.
    async fn retire_token(&self, on: &[usize], wake: bool) -> usize {
        let given = join_all(on.iter().map(|&i| {
            let lock = &self.locks[i];
            let publish = if wake { lock.publish_command() } else { "" };
            lock.give_back_within(publish, self.node_timeout)
        }))
        .await;
        let token = new_token();
        for lock in &self.locks {
            lock.set_token(&token);
        }
        given.iter().filter(|g| matches!(g, Ok(true))).count()
    }
}

#[async_trait::async_trait(?Send)]
impl Backend for Redlock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    fn key(&self) -> String {
        self.locks[0].key()
    }

    fn token(&self) -> String {
        self.locks[0].token()
    }

    async fn try_acquire(&self, timings: &Timings, listen: bool) -> Result<Attempt, BackendError> {
        let (n, quorum) = (self.servers(), self.quorum());
        let answers = join_all(
            self.locks
                .iter()
                .map(|l| l.attempt_within(timings, listen, self.node_timeout)),
        )
        .await;
        let mut granted: Vec<(usize, u64)> = Vec::new();
        let mut busy: Vec<Busy> = Vec::new();
        let mut errors: Vec<BackendError> = Vec::new();
        // Servers that granted, or did not answer (and may have granted).
        let mut maybe_ours: Vec<usize> = Vec::new();
        let mut mismatch = None;
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(Attempt::Acquired { fence }) => granted.push((i, fence)),
                Ok(Attempt::Busy(b)) => busy.push(b),
                Ok(Attempt::Mismatch { theirs }) => mismatch = Some(theirs),
                Err(e) => {
                    errors.push(e);
                    maybe_ours.push(i);
                }
            }
        }
        maybe_ours.extend(granted.iter().map(|&(i, _)| i));
        if granted.len() >= quorum {
            let fence = granted.iter().map(|&(_, f)| f).max().unwrap_or(0);
            let raised = join_all(
                granted
                    .iter()
                    .map(|&(i, _)| self.locks[i].raise_fence(fence, self.node_timeout)),
            )
            .await;
            let confirmed = raised.iter().filter(|r| matches!(r, Ok(true))).count();
            if confirmed >= quorum {
                if listen {
                    join_all(self.locks.iter().map(|l| l.node().stop_listening())).await;
                }
                self.fence.set(fence);
                return Ok(Attempt::Acquired { fence });
            }
            // A quorum's grant that cannot be used: given back where it was granted or no
            // answer came, with the wake-up (others may be waiting on it).
            self.retire_token(&maybe_ours, true).await;
            return Err(BackendError::Transient(format!(
                "the fence {fence} was confirmed by {confirmed} of {n} servers, not a quorum of {quorum}"
            )));
        }
        // No quorum: what we got is given back without a wake-up (see `retire_token`),
        // where we got it or may have, and the next attempt carries a fresh token.
        if !maybe_ours.is_empty() {
            self.retire_token(&maybe_ours, false).await;
        }
        if let Some(holders) = mismatch {
            return Ok(Attempt::Mismatch { theirs: holders });
        }
        if errors.len() > n - quorum {
            let answered = n - errors.len();
            let transient = errors.iter().any(BackendError::is_transient);
            let first = &errors[0];
            let message = crate::text::message!(
                "only {answered} of {n} Redis servers answered, a quorum is {quorum}: {first}"
            );
            return Err(if transient {
                BackendError::Transient(message)
            } else {
                BackendError::Refused(message)
            });
        }
        let holder = most_common_holder(&busy);
        let holders_servers: Vec<&Busy> = busy
            .iter()
            .filter(|b| same_owner(&b.holder, &holder))
            .collect();
        if holders_servers.len() >= quorum {
            // Someone holds a quorum: wait for its release message, or for its keys to expire.
            let expiry = holders_servers
                .iter()
                .map(|b| b.expiry)
                .max_by_key(|e| e.left())
                .unwrap_or(Expiry::In(Duration::ZERO));
            return Ok(Attempt::Busy(Busy { holder, expiry }));
        }
        // A split vote: nobody holds a quorum (other waiters' grants, given back at once
        // without a wake-up, are among the busy servers). Try again soon, after a random
        // delay, so that competing clients do not keep splitting it.
        let again = Duration::from_millis(fastrand::u64(5..=50));
        Ok(Attempt::Busy(Busy {
            holder,
            expiry: Expiry::In(again),
        }))
    }

    async fn renew(&self, timings: &Timings, timeout: Duration) -> Result<bool, BackendError> {
        let (n, quorum) = (self.servers(), self.quorum());
        let started = tokio::time::Instant::now();
        // A little under the round's own timeout, so that the round can say which servers
        // failed. The round ends soon after its outcome is known: a lost lease at once; a
        // renewed one once the servers still on their way have had --node-timeout more (as
        // long as an acquisition gives them), so that a server a little slower than the
        // others is renewed too, rather than have its request dropped (and its connection
        // with it) round after round until its key lapses.
        let per_server = timeout * 9 / 10;
        let fence = self.fence.get();
        let answers = gather(
            self.locks
                .iter()
                .map(|l| l.renew_here(timings, fence, false, per_server)),
            |answers| {
                let tally = Tally::of(answers);
                if tally.against() > n - quorum {
                    Outcome::Known
                } else if tally.ours >= quorum {
                    Outcome::KnownAfter(self.node_timeout)
                } else {
                    Outcome::Pending
                }
            },
        )
        .await;
        let tally = Tally::of(&answers);
        if tally.ours >= quorum {
            // A quorum is ours, so nobody else can hold the lock: take again the servers
            // that lost the key (restarted empty), within what is left of the attempt.
            let left = per_server.saturating_sub(started.elapsed());
            let absent = answers
                .iter()
                .enumerate()
                .filter(|(_, a)| matches!(a, Some(Ok(Here::Absent))))
                .map(|(i, _)| &self.locks[i]);
            join_all(
                absent.map(|l| l.renew_here(timings, fence, true, left.min(self.node_timeout))),
            )
            .await;
            return Ok(true);
        }
        if tally.not_ours > n - quorum {
            return Ok(false);
        }
        let why = answers
            .iter()
            .find_map(|a| a.as_ref()?.as_ref().err())
            .map_or_else(String::new, |e| format!(": {e}"));
        Err(BackendError::Transient(format!(
            "the renewal was confirmed by {} of {n} servers, not a quorum of {quorum}{why}",
            tally.ours
        )))
    }

    async fn release(
        &self,
        keep_for: Option<Duration>,
        timeout: Duration,
        run: Option<&Run>,
    ) -> Result<bool, BackendError> {
        let quorum = self.quorum();
        // Every server is asked; once a quorum has released, the others get one more
        // per-server timeout, not the whole release timeout: a slow server's key expires by
        // itself, and waiters hear the releases of the others.
        let mut pending: FuturesUnordered<_> = self
            .locks
            .iter()
            .map(|l| l.release_within(keep_for, timeout, run))
            .collect();
        let (mut ours, mut first_error) = (0, None);
        let mut grace_until: Option<tokio::time::Instant> = None;
        loop {
            let next = match grace_until {
                None => pending.next().await,
                Some(until) => match tokio::time::timeout_at(until, pending.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            match next {
                None => break,
                Some(Ok(true)) => ours += 1,
                Some(Ok(false)) => {}
                Some(Err(e)) => {
                    first_error.get_or_insert(e);
                }
            }
            if ours >= quorum && grace_until.is_none() {
                grace_until = Some(tokio::time::Instant::now() + self.node_timeout);
            }
        }
        match first_error {
            Some(e) if ours == 0 => Err(e),
            _ => Ok(ours >= quorum),
        }
    }

    async fn give_back(&self, _timeout: Duration) -> Result<bool, BackendError> {
        // A waiter that ends does not know where its attempts landed: everywhere.
        let every: Vec<usize> = (0..self.locks.len()).collect();
        Ok(self.retire_token(&every, true).await > 0)
    }

    async fn subscribe(&self) -> Result<(Box<dyn Wakeups + '_>, bool), BackendError> {
        let answers = join_all(self.locks.iter().map(|l| l.node().subscribe(l.channel()))).await;
        let mut subscriptions = Vec::new();
        let mut covered = true;
        let mut first_error = None;
        for answer in answers {
            match answer {
                Ok((subscription, before_attempt)) => {
                    covered &= before_attempt;
                    subscriptions.push(subscription);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        // Every release publishes on every server it reaches: one subscription would do, more
        // survive servers going down.
        match first_error {
            Some(e) if subscriptions.is_empty() => Err(e),
            _ => Ok((Box::new(AnyOf(subscriptions)), covered)),
        }
    }
}

#[async_trait::async_trait(?Send)]
impl View for Redlock {
    fn tenure(&self) -> Tenure {
        Tenure::Lease
    }

    /// Held when a quorum holds one owner's token; each server's own state in `servers`.
    /// An error when fewer than a quorum answered.
    async fn inspect(&self) -> Result<Report, BackendError> {
        let reports = join_all(self.locks.iter().map(|l| l.inspect())).await;
        let (n, quorum) = (self.servers(), self.quorum());
        let answered: Vec<&Report> = reports.iter().filter_map(|r| r.as_ref().ok()).collect();
        if answered.len() < quorum {
            let first = reports.iter().find_map(|r| r.as_ref().err());
            return Err(BackendError::Transient(format!(
                "only {} of {n} Redis servers answered, a quorum is {quorum}{}",
                answered.len(),
                first.map_or_else(String::new, |e| format!(": {e}"))
            )));
        }
        let mut summary = summarize(&answered, quorum);
        summary.servers = Some(Servers {
            quorum,
            each: self
                .locks
                .iter()
                .map(|l| l.address().to_owned())
                .zip(reports)
                .collect(),
        });
        Ok(summary)
    }

    /// Released on every server that answers; it was held if any server held it.
    async fn force_release(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        let answers = join_all(self.locks.iter().map(|l| l.force_release_here(token))).await;
        let mut holders = Vec::new();
        let mut fence = None;
        let (mut answered, mut first_error) = (false, None);
        for answer in answers {
            match answer {
                Ok(Freed::Released {
                    holders: theirs,
                    fence: f,
                }) => {
                    answered = true;
                    holders.extend(theirs);
                    fence = fence.max(f);
                }
                Ok(Freed::Kept(why)) => return Ok(Freed::Kept(why)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let (false, Some(e)) = (answered, first_error) {
            return Err(e);
        }
        // The holder as the first server that knows it tells; else as any server tells.
        let holder = holders
            .iter()
            .find(|h| h.is_known())
            .or(holders.first())
            .cloned();
        Ok(Freed::Released {
            holders: holder.into_iter().collect(),
            fence,
        })
    }

    /// Every server's history, each run once (the release writes it on every server it
    /// reaches); what an unreachable server kept is missing, never invented.
    async fn history(&self, limit: usize) -> Result<History, BackendError> {
        let answers = join_all(self.locks.iter().map(|l| l.history_here(limit))).await;
        let first_error = answers.iter().find_map(|a| a.as_ref().err()).cloned();
        let lists: Vec<History> = answers.into_iter().filter_map(Result::ok).collect();
        match (lists.is_empty(), first_error) {
            (true, Some(e)) => Err(e),
            _ => Ok(merged(lists, limit)),
        }
    }

    async fn checks(&self) -> Vec<Check> {
        let nodes: Vec<&Node> = self.locks.iter().map(|l| l.node()).collect();
        crate::redis::doctor::check_servers(&nodes, self.locks[0].name()).await
    }
}

/// Release messages from any of several servers.
pub struct AnyOf<W>(Vec<W>);

#[async_trait::async_trait(?Send)]
impl<W: Wakeups> Wakeups for AnyOf<W> {
    async fn next(&mut self) -> Result<Wakeup, BackendError> {
        loop {
            if self.0.is_empty() {
                return Err(BackendError::Transient("lost every subscription".into()));
            }
            let (result, index) = {
                let waits = self.0.iter_mut().map(|w| Box::pin(w.next()));
                let (result, index, _) = select_all(waits).await;
                (result, index)
            };
            match result {
                // Redlock keeps no queue: every release is for anyone to try.
                Ok(_) => return Ok(Wakeup::Anyone),
                Err(e) => {
                    tracing::info!("{e}; still listening on {} server(s)", self.0.len() - 1);
                    self.0.remove(index);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
