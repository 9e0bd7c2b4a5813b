//! One acquisition attempt: the grant transaction (`sql::grant`), with the waiter's `LISTEN`
//! committed in it when the connection does not listen yet (the release that would hand it the
//! lock takes the fence lock after it, so cannot commit unheard in between), and its one row,
//! the verdict and the fence, read back as an [`Attempt`]; an attempt not granted then reads
//! who holds and who waits (`sql::report`), in a round trip of its own.

use std::time::Duration;

use tokio::time::Instant;

use super::PgLock;
use super::conn::Row;
use super::schema::quote_ident;
use super::sql::{self, Ask, Commit, Tx};
use crate::backend::{Attempt, BackendError, Busy, Expiry, Holder, KEEP_ALIVE, Mode};
use crate::lease::Timings;

impl PgLock {
    pub(super) async fn attempt(
        &self,
        timings: &Timings,
        listen: bool,
    ) -> Result<Attempt, BackendError> {
        // A grant that takes half the lease to arrive is worth little.
        let within = self.client.connect_timeout.min(timings.ttl / 2);
        let deadline = Instant::now() + within;
        let token = self.token_now();
        let how = match (listen, self.fair) {
            (false, _) => "peek",
            (true, true) => "queue",
            (true, false) => "race",
        };
        let conn = self.client.connection(deadline).await?;
        let mut tx = Tx::default();
        sql::prologue(
            &mut tx,
            deadline.saturating_duration_since(Instant::now()),
            Commit::Standby,
        );
        let channel = sql::channel(&token);
        let listening = conn.listening.borrow().clone();
        let listen_now = listen && listening.as_deref() != Some(channel.as_str());
        if listen_now {
            if let Some(old) = &listening {
                tx.push(format!("UNLISTEN {}", quote_ident(old)));
            }
            tx.push(format!("LISTEN {}", quote_ident(&channel)));
        }
        sql::lock(&mut tx, &self.n);
        sql::expire(&mut tx, &self.n);
        let ask = Ask {
            n: &self.n,
            token: &token,
            mode: self.mode_word(),
            holders: self.mode.holders(),
            how,
            ttl: timings.ttl,
            keep_alive: KEEP_ALIVE,
            host: &self.host,
            pid: std::process::id(),
            command: &self.command,
        };
        let at = sql::grant(&mut tx, &ask);
        // Set before the request leaves: a run interrupted before the reply may hold a place.
        let queued_before = self.queued.replace(listen);
        let sets = match self.client.exec(&tx, deadline, true).await {
            Ok(sets) => sets,
            Err(e) => {
                if e.is_unsent() {
                    self.queued.set(queued_before);
                }
                return Err(e);
            }
        };
        if listen_now {
            if let Some(conn) = self.client.current() {
                *conn.listening.borrow_mut() = Some(channel);
            }
        }
        if listen {
            self.covered.set(true);
        }
        let row = sets
            .get(at)
            .and_then(|rows| rows.first())
            .ok_or_else(|| self.unexpected("no answer row"))?;
        let reply = Reply(row);
        match reply.text(0) {
            Some("grant" | "ours") => self.queued.set(false),
            Some(verdict @ ("busy" | "mismatch")) => {
                let mut tx = Tx::default();
                let within = deadline.saturating_duration_since(Instant::now());
                sql::prologue(&mut tx, within, Commit::Local);
                let at = sql::report(&mut tx, &ask, verdict);
                let sets = self.client.exec(&tx, deadline, false).await?;
                let row = sets
                    .get(at)
                    .and_then(|rows| rows.first())
                    .ok_or_else(|| self.unexpected("no report row"))?;
                let report = Reply(row);
                self.queued.set(report.flag(9));
                return self.answer(&report);
            }
            _ => {}
        }
        self.answer(&reply)
    }

    fn answer(&self, reply: &Reply) -> Result<Attempt, BackendError> {
        match reply.text(0) {
            Some("grant" | "ours") => Ok(Attempt::Acquired {
                fence: reply.number(1).ok_or_else(|| self.unexpected("no fence"))? as u64,
            }),
            Some("mismatch") => Ok(Attempt::Mismatch {
                theirs: theirs(reply.text(2).unwrap_or("exclusive 1")),
            }),
            Some("busy") => Ok(Attempt::Busy(self.busy(reply))),
            // Every give-back is followed by a fresh token: only a bug, or another program
            // reusing the token, gets here. Say so, rather than wait.
            Some("buried") => Err(BackendError::Refused(crate::text::message!(
                "PostgreSQL at {} refused lock {}: its token was already given back",
                self.client.shown(),
                self.name
            ))),
            other => Err(self.unexpected(&format!("the verdict {other:?}"))),
        }
    }

    /// Who holds it, and until when; or, when a place is free but others came first, how many.
    fn busy(&self, reply: &Reply) -> Busy {
        let held = reply.number(12).unwrap_or(0);
        let free = match self.mode {
            Mode::Holders(n) => held < i64::from(n),
            Mode::Exclusive | Mode::Shared => held == 0,
        };
        if free {
            let retry_in = reply.number(11).unwrap_or(0).max(0) as u64;
            return Busy {
                holder: Holder::default(),
                expiry: Expiry::Queued {
                    ahead: reply.number(10).unwrap_or(0) as u32,
                    retry_in: Duration::from_millis(retry_in),
                },
            };
        }
        let holder = Holder {
            host: reply.text(3).map(str::to_owned),
            pid: reply.number(4).and_then(|p| u32::try_from(p).ok()),
            command: reply.text(5).map(str::to_owned),
            since_ms: reply.number(6).and_then(|s| u64::try_from(s).ok()),
            fence: reply.number(7).and_then(|f| u64::try_from(f).ok()),
        };
        let expiry = match reply.number(8) {
            Some(left) => Expiry::In(Duration::from_millis(left.max(0) as u64)),
            None => Expiry::Never,
        };
        Busy { holder, expiry }
    }

    fn unexpected(&self, what: &str) -> BackendError {
        BackendError::Refused(crate::text::message!(
            "PostgreSQL at {} gave an unexpected answer to the lock's transaction: {what}",
            self.client.shown()
        ))
    }
}

/// The mode of the holders a run's mode does not match: `holders 3`, `shared 1`, `exclusive 1`.
fn theirs(kind: &str) -> Mode {
    match kind.split_once(' ') {
        Some(("holders", n)) => Mode::of_holders(n.parse().unwrap_or(1)),
        Some(("shared", _)) => Mode::Shared,
        _ => Mode::Exclusive,
    }
}

/// The grant's answer row.
struct Reply<'a>(&'a Row);

impl Reply<'_> {
    fn text(&self, i: usize) -> Option<&str> {
        self.0.get(i)?.as_deref()
    }

    fn number(&self, i: usize) -> Option<i64> {
        self.text(i)?.parse().ok()
    }

    fn flag(&self, i: usize) -> bool {
        self.text(i) == Some("t")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_other_mode_is_read_from_its_kind() {
        assert_eq!(theirs("holders 3"), Mode::Holders(3));
        assert_eq!(theirs("shared 1"), Mode::Shared);
        assert_eq!(theirs("exclusive 1"), Mode::Exclusive);
    }
}
