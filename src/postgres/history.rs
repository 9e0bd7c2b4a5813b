//! A NAME's history in the database: one row per run in `locked_run.history` (its record, the
//! JSON line every backend keeps), written as a transaction of its own sent in the same round
//! trip as the release (after it, so never before the release is confirmed, and never a reason
//! for it to fail), trimmed there to the newest runs and to 30 days after the last one. It
//! commits unflushed (`synchronous_commit = off`): a server crash just after may lose it.

use std::time::Duration;

use tokio::time::Instant;

use super::PgLock;
use super::inspect::never_made;
use super::sql::{self, Commit, Tx};
use crate::backend::{BackendError, History, KEPT, MAX_RECORD, Reader, Run};

/// The transaction that adds `run` to the history of the NAME `n` (an SQL literal).
pub fn record(n: &str, run: &Run, within: Duration) -> Tx {
    let mut tx = Tx::default();
    // History needs no standby's acknowledgement, nor the server's flush: a crash right after
    // may lose the newest rows, never anything the lock decides (and the run's end waits for
    // this answer, so a flush here would lengthen every run).
    sql::prologue(&mut tx, within, Commit::Unflushed);
    tx.push(format!(
        "INSERT INTO locked_run.history (name, token, ended_at, run) \
         VALUES ({n}, {t}, to_timestamp({ended} / 1000.0), {record}) \
         ON CONFLICT (name, token) DO NOTHING",
        t = sql::text(&run.token),
        ended = run.ended_ms,
        record = sql::text(&run.to_line()),
    ));
    tx.push(format!(
        "DELETE FROM locked_run.history WHERE name = {n} AND (ended_at < clock_timestamp() - \
         interval '30 days' OR token IN (SELECT token FROM locked_run.history WHERE name = {n} \
         ORDER BY ended_at DESC, token DESC OFFSET {KEPT}))"
    ));
    tx
}

impl PgLock {
    /// The NAME's last `limit` runs, newest first: a row larger than [`MAX_RECORD`] never
    /// leaves the server (any user of the lock's tables can write one), only their count.
    pub(super) async fn history_here(&self, limit: usize) -> Result<History, BackendError> {
        if limit == 0 {
            return Ok(History::default());
        }
        let mut tx = Tx::default();
        let at = tx.push(format!(
            "SELECT run FROM locked_run.history WHERE name = {} AND octet_length(run) <= \
             {MAX_RECORD} ORDER BY ended_at DESC, token DESC LIMIT {}",
            self.n,
            limit.min(KEPT)
        ));
        let larger = tx.push(format!(
            "SELECT count(*) FROM locked_run.history WHERE name = {} AND octet_length(run) > \
             {MAX_RECORD}",
            self.n
        ));
        let deadline = Instant::now() + self.client.connect_timeout;
        let sets = match self.client.exec(&tx, deadline, false).await {
            Ok(sets) => sets,
            Err(e) if never_made(&e) => return Ok(History::default()),
            Err(e) => return Err(e),
        };
        let mut reader = Reader::new();
        for row in sets.get(at).into_iter().flatten() {
            match row.first() {
                Some(Some(run)) => reader.take(run.as_bytes()),
                _ => reader.skipped(1),
            }
        }
        let count = sets
            .get(larger)
            .and_then(|rows| rows.first()?.first()?.as_deref()?.parse().ok());
        reader.skipped(count.unwrap_or(0));
        Ok(reader.finish(KEPT))
    }
}
