//! A NAME's history in the database: one row per run in `locked_run.history` (its record, the
//! JSON line every backend keeps), written as a transaction of its own sent in the same round
//! trip as the release (after it, so never before the release is confirmed, and never a reason
//! for it to fail), trimmed there to the newest runs and to 30 days after the last one. It
//! commits unflushed (`synchronous_commit = off`): a server crash just after may lose it.
//!
//! Any user of the lock's tables can write rows, so the rows are ordered by the server, never
//! by what a record says: `ended_at` is the server's clock when the row was stored
//! (`clock_timestamp()`), and a row stamped later than the server's clock now (written by
//! hand) is no run's yet: not shown, not counted among the runs kept, and gone once it is more
//! than an hour ahead. A row not shaped as a record (a JSON object of at most [`MAX_RECORD`](crate::backend::MAX_RECORD)
//! bytes) is not counted either, and goes at the next trim: a flood of junk, or of rows dated
//! in the future, can never make a release trim its own run away.

use std::time::Duration;

use tokio::time::Instant;

use super::PgLock;
use super::inspect::never_made;
use super::sql::{self, Commit, Tx};
use crate::backend::{BackendError, History, KEPT, Reader, Run};

/// The transaction that adds `run` to the history of the NAME `n` (an SQL literal).
pub fn record(n: &str, run: &Run, within: Duration) -> Tx {
    let mut tx = Tx::default();
    // History needs no standby's acknowledgement, nor the server's flush: a crash right after
    // may lose the newest rows, never anything the lock decides (and the run's end waits for
    // this answer, so a flush here would lengthen every run).
    sql::prologue(&mut tx, within, Commit::Unflushed);
    tx.push(format!(
        "INSERT INTO locked_run.history (name, token, ended_at, run) \
         VALUES ({n}, {t}, clock_timestamp(), {record}) \
         ON CONFLICT (name, token) DO NOTHING",
        t = sql::text(&run.token),
        record = sql::text(&run.to_line()),
    ));
    tx.push(format!(
        "DELETE FROM locked_run.history WHERE name = {n} AND (ended_at < clock_timestamp() - \
         interval '30 days' OR ended_at > clock_timestamp() + interval '1 hour' OR NOT {RECORD} \
         OR token IN (SELECT token FROM locked_run.history WHERE name = {n} AND {SHOWN} \
         ORDER BY ended_at DESC, token DESC OFFSET {KEPT}))"
    ));
    tx
}

/// Whether a row's `run` is shaped as a record: a JSON object of at most [`MAX_RECORD`](crate::backend::MAX_RECORD) bytes
/// (what the reader then finds in it is its own business).
const RECORD: &str = "(octet_length(run) <= 4096 AND left(run, 1) = '{' AND right(run, 1) = '}')";

/// The rows a reader takes: records, stored no later than now.
const SHOWN: &str = "(ended_at <= clock_timestamp() AND (octet_length(run) <= 4096 AND \
                     left(run, 1) = '{' AND right(run, 1) = '}'))";

impl PgLock {
    /// The NAME's last `limit` runs, newest first as the server stored them: a row that is no
    /// record (larger than [`MAX_RECORD`](crate::backend::MAX_RECORD), say: any user of the lock's tables can write one),
    /// or dated later than now, never leaves the server, only their count.
    pub(super) async fn history_here(&self, limit: usize) -> Result<History, BackendError> {
        if limit == 0 {
            return Ok(History::default());
        }
        let mut tx = Tx::default();
        let at = tx.push(format!(
            "SELECT run FROM locked_run.history WHERE name = {} AND {SHOWN} \
             ORDER BY ended_at DESC, token DESC LIMIT {}",
            self.n,
            limit.min(KEPT)
        ));
        let unshown = tx.push(format!(
            "SELECT count(*) FROM locked_run.history WHERE name = {} AND NOT {SHOWN}",
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
            .get(unshown)
            .and_then(|rows| rows.first()?.first()?.as_deref()?.parse().ok());
        reader.skipped(count.unwrap_or(0));
        Ok(reader.finish(KEPT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MAX_RECORD;

    /// What the server takes for a record is what a reader takes.
    #[test]
    fn a_record_is_as_large_as_a_reader_takes() {
        let bound = format!("octet_length(run) <= {MAX_RECORD} ");
        assert!(RECORD.contains(&bound) && SHOWN.contains(&bound));
    }
}
