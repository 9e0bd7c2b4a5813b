//! What the operators' commands read of a lock in the database, and `release --force`: the
//! fence, the live holders (the soonest to end first) and waiters in one statement; the forced
//! delete of every holder's row (or one, by token), never the fence, waking the waiters whose
//! turn it is. A database where no run ever took a lock (no tables yet) reads as free.

use std::time::Duration;

use tokio::time::Instant;

use super::PgLock;
use super::client;
use super::conn::Row;
use super::sql::{self, Commit, Tx};
use crate::backend::{BackendError, Busy, Expiry, Freed, Holder, Report, Slot};

impl PgLock {
    pub(super) async fn report(&self) -> Result<Report, BackendError> {
        let mut tx = Tx::default();
        let at = sql::inspect(&mut tx, &self.n);
        let deadline = Instant::now() + self.client.connect_timeout;
        let sets = match self.client.exec(&tx, deadline, false).await {
            Ok(sets) => sets,
            // Never taken here: free, and nobody waits.
            Err(e) if never_made(&e) => {
                return Ok(Report {
                    waiters: Some(0),
                    ..Report::default()
                });
            }
            Err(e) => return Err(e),
        };
        let rows = sets.get(at).cloned().unwrap_or_default();
        let number = |row: &Row, i: usize| -> Option<i64> { row.get(i)?.as_deref()?.parse().ok() };
        let fence = rows.first().and_then(|r| number(r, 0)).map(|f| f as u64);
        let waiters = rows.first().and_then(|r| number(r, 1)).map(|w| w as u64);
        let holders: Vec<(Slot, String, u32)> = rows
            .iter()
            .filter(|row| row.get(2).is_some_and(Option::is_some))
            .map(|row| {
                let text = |i: usize| row.get(i).cloned().flatten();
                let holder = Holder {
                    host: text(5),
                    pid: number(row, 6).and_then(|p| u32::try_from(p).ok()),
                    command: text(7),
                    since_ms: number(row, 8).and_then(|s| u64::try_from(s).ok()),
                    fence: number(row, 9).and_then(|f| u64::try_from(f).ok()),
                };
                let expiry = match number(row, 10) {
                    Some(left) => Expiry::In(Duration::from_millis(left.max(0) as u64)),
                    None => Expiry::Never,
                };
                let kind = text(3).unwrap_or_default();
                let limit = number(row, 4).unwrap_or(1).max(1) as u32;
                let slot = Slot {
                    token: text(2),
                    busy: Busy { holder, expiry },
                };
                (slot, kind, limit)
            })
            .collect();
        let Some((first, kind, limit)) = holders.first().cloned() else {
            return Ok(Report {
                fence,
                waiters,
                ..Report::default()
            });
        };
        Ok(Report {
            fence,
            held: Some(first.busy.clone()),
            value: first.token.clone(),
            waiters,
            limit: (kind != "shared").then_some(if kind == "holders" { limit } else { 1 }),
            shared: kind == "shared",
            holders: holders.into_iter().map(|(slot, _, _)| slot).collect(),
            ..Report::default()
        })
    }

    /// Deletes every holder's row (`token`: that one alone), never the fence, and wakes the
    /// waiters whose turn it is; says whom the lock was taken from.
    pub(super) async fn force(&self, token: Option<&str>) -> Result<Freed, BackendError> {
        let timeout = self.client.connect_timeout;
        let mut tx = Tx::default();
        sql::prologue(&mut tx, timeout, Commit::Standby);
        sql::lock(&mut tx, &self.n);
        let released = sql::force(&mut tx, &self.n, token);
        sql::expire(&mut tx, &self.n);
        sql::wake(&mut tx, &self.n, 1);
        let at = sql::fence(&mut tx, &self.n);
        let sets = match self.client.exec(&tx, Instant::now() + timeout, false).await {
            Ok(sets) => sets,
            Err(e) if never_made(&e) => {
                return Ok(Freed::Released {
                    holders: Vec::new(),
                    fence: None,
                });
            }
            Err(e) => return Err(e),
        };
        let holders = sets
            .get(released)
            .map(|rows| {
                rows.iter()
                    .map(|row| {
                        let text = |i: usize| row.get(i).cloned().flatten();
                        let number = |i: usize| text(i).and_then(|t| t.parse::<u64>().ok());
                        Holder {
                            host: text(1),
                            pid: number(2).and_then(|p| u32::try_from(p).ok()),
                            command: text(3),
                            since_ms: number(4),
                            fence: number(5),
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        let fence = client::first(&sets[at..]).and_then(|f| f.parse().ok());
        Ok(Freed::Released { holders, fence })
    }
}

/// The tables were never made: nothing was ever held.
pub fn never_made(e: &BackendError) -> bool {
    e.to_string()
        .starts_with("the tables of locked-run are missing")
}
