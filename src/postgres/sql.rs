//! The SQL of the lock: each operation one transaction, sent as one simple-protocol string (one
//! round trip; a multi-statement string is one implicit transaction, rolled back whole on any
//! error, so no session is ever left inside an aborted block, also behind PgBouncer). Values
//! are written as escaped literals ([`text`]), never spliced raw.
//!
//! Every transaction that changes who holds or waits starts the same way ([`prologue`] and
//! [`lock`]): its own `statement_timeout` and `lock_timeout` (the attempt's deadline),
//! `synchronous_commit = on`, then the NAME's fence row created if absent and locked
//! (`SELECT ... FOR UPDATE`): grants, give-backs, releases and forced releases of one NAME run
//! one after the other, and each statement after the lock reads a snapshot taken after the
//! previous holder of the lock committed (READ COMMITTED takes one per statement: this is why
//! the lock is a statement of its own, before any read that decides). Expired rows are then
//! deleted ([`expire`]): a DELETE that meets a row a renewal is updating waits for it, and
//! re-checks the row's expiry after it (so a renewed row stays); every row that is left counts
//! as a holder, whatever the clock says by the time the decision reads it. A renewal is one
//! UPDATE that extends the row only while it has not expired: no row means the lease is lost.
//! How-it-works gives the whole argument.
//!
//! Decisions pass from one statement to the next in transaction-local settings
//! (`locked_run.verdict`, `locked_run.ours`): every later statement acts only on the verdict.

use std::time::Duration;

/// A holder row's kind: `exclusive` (also another program's row), `shared`, or `holders` (N > 1).
pub const KIND: &str = "(CASE WHEN h.mode = 'shared' THEN 'shared' \
     WHEN h.mode = 'holders' AND h.holders > 1 THEN 'holders' ELSE 'exclusive' END)";

/// `value` as an SQL string literal: an `E''` string, whose meaning does not depend on
/// `standard_conforming_strings`, with quotes and backslashes escaped (a NUL, which no text
/// may hold, becomes `?`).
pub fn text(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 4);
    out.push_str("E'");
    for c in value.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            '\0' => out.push('?'),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A duration as an SQL interval: a typed literal, which no operator of anyone's can change.
pub fn interval(d: Duration) -> String {
    format!("interval '{} milliseconds'", d.as_millis().max(1))
}

/// Milliseconds from now until the timestamptz `t` (negative once past), as bigint; for
/// `infinity` (any user of the tables may write one, and its cast would fail every query that
/// reads it) the largest bigint, for `-infinity` the smallest but one.
fn ms_until(t: &str) -> String {
    format!(
        "(CASE WHEN {t} = 'infinity' THEN 9223372036854775807 WHEN {t} = '-infinity' THEN \
         -9223372036854775807 ELSE extract(epoch FROM ({t} - clock_timestamp())) * 1000 END)::bigint"
    )
}

/// The timestamptz `t` in ms since the epoch. One that no date shows (`infinity`, or before
/// 1970: any user of the tables may write one, and the cast of `infinity` would fail every
/// query that reads it) is `i64::MAX`, which reads as a time not known (`since ?`).
fn epoch_ms(t: &str) -> String {
    format!(
        "(CASE WHEN {t} IS NULL THEN NULL WHEN isfinite({t}) AND {t} >= 'epoch' THEN \
         extract(epoch FROM {t}) * 1000 ELSE 9223372036854775807 END)::bigint"
    )
}

/// The notification channel of a waiter's token: `lr_` and its hex digits (at most 63 bytes).
pub fn channel(token: &str) -> String {
    let digits: String = token.chars().filter(char::is_ascii_alphanumeric).collect();
    format!("lr_{}", &digits[..digits.len().min(60)])
}

/// The channel expression for the token column `column`, as [`channel`] makes it.
fn channel_of(column: &str) -> String {
    format!("'lr_' || left(regexp_replace({column}, '[^a-zA-Z0-9]', '', 'g'), 60)")
}

/// A transaction being written: its statements, each of which answers one result.
#[derive(Default)]
pub struct Tx {
    pub statements: Vec<String>,
}

impl Tx {
    /// Adds a statement; its index among the results.
    pub fn push(&mut self, statement: impl Into<String>) -> usize {
        self.statements.push(statement.into());
        self.statements.len() - 1
    }

    pub fn sql(&self) -> String {
        let mut sql = self.statements.join(";\n");
        sql.push(';');
        sql
    }
}

/// When a transaction's commit counts (its `synchronous_commit`).
#[derive(Clone, Copy)]
pub enum Commit {
    /// Once a synchronous standby has it too: who holds or waits (`on`).
    Standby,
    /// Once this server has flushed it (`local`).
    Local,
    /// At once, flushed soon after (`off`): a server crash may lose the last moments' commits,
    /// which only the history may afford (its rows are records, never a decision).
    Unflushed,
}

/// The settings of a transaction that has `within` to finish, whose commit counts as `commit`
/// says.
pub fn prologue(tx: &mut Tx, within: Duration, commit: Commit) {
    let ms = within.as_millis().max(1);
    tx.push(format!("SET LOCAL statement_timeout = {ms}"));
    tx.push(format!("SET LOCAL lock_timeout = {ms}"));
    let commit = match commit {
        Commit::Standby => "on",
        Commit::Local => "local",
        Commit::Unflushed => "off",
    };
    tx.push(format!("SET LOCAL synchronous_commit = {commit}"));
}

/// The NAME's fence row, made if absent (a concurrent first insert waits for the other's
/// commit), then locked for the rest of the transaction.
pub fn lock(tx: &mut Tx, n: &str) {
    tx.push(format!(
        "INSERT INTO locked_run.fence (name, fence) VALUES ({n}, 0) ON CONFLICT (name) DO NOTHING"
    ));
    tx.push(format!(
        "SELECT 1 FROM locked_run.fence WHERE name = {n} FOR UPDATE"
    ));
}

/// Deletes the holders whose lease ended and the queue places whose keep-alive did.
pub fn expire(tx: &mut Tx, n: &str) {
    tx.push(format!(
        "DELETE FROM locked_run.holder WHERE name = {n} AND expires_at <= clock_timestamp()"
    ));
    tx.push(format!(
        "DELETE FROM locked_run.queue WHERE name = {n} AND alive_until <= clock_timestamp()"
    ));
}

/// Notifies the waiters whose turn it is now, each on its own channel with its token: the
/// shared waiters at the head of the queue while no exclusive run holds; else, of `free`
/// places (the holders' N less those held; `limit` when nobody holds), the first `free`
/// waiters and every `--no-fair` waiter before the `free`-th fair one. At most 1000.
pub fn wake(tx: &mut Tx, n: &str, limit: u32) -> usize {
    tx.push(format!(
        "WITH h AS (SELECT count(*) AS held, count(*) FILTER (WHERE {KIND} <> 'shared') AS not_shared, \
           max(h.holders) FILTER (WHERE {KIND} = 'holders') AS cap \
           FROM locked_run.holder h WHERE h.name = {n}), \
         f AS (SELECT CASE WHEN held = 0 THEN {limit} WHEN cap IS NOT NULL THEN cap - held ELSE 0 END AS free, \
           not_shared FROM h), \
         q AS (SELECT token, racer, row_number() OVER w AS rank, \
           count(*) FILTER (WHERE NOT racer) OVER w - CASE WHEN racer THEN 0 ELSE 1 END AS fair_before, \
           bool_and(mode = 'shared') OVER w AS shared_head \
           FROM locked_run.queue WHERE name = {n} AND alive_until > clock_timestamp() \
           WINDOW w AS (ORDER BY place ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)) \
         SELECT pg_notify({channel}, q.token) FROM q, f \
         WHERE q.rank <= 1000 AND ((f.not_shared = 0 AND q.shared_head) \
           OR (f.free > 0 AND (q.rank <= f.free OR (q.racer AND q.fair_before < f.free))))",
        limit = limit.max(1),
        channel = channel_of("q.token"),
    ))
}

/// What a run asks for in an attempt.
pub struct Ask<'a> {
    pub n: &'a str,
    pub token: &'a str,
    /// `exclusive`, `shared` or `holders`.
    pub mode: &'a str,
    pub holders: u32,
    /// `queue` (a fair waiter), `race` (`--no-fair`) or `peek` (`-n`: never queues).
    pub how: &'a str,
    pub ttl: Duration,
    pub keep_alive: Duration,
    pub host: &'a str,
    pub pid: u32,
    pub command: &'a str,
}

/// The queue places before the asking token's (all of them while it has none).
fn before(n: &str, t: &str) -> String {
    format!(
        "place < coalesce((SELECT place FROM locked_run.queue WHERE name = {n} AND token = {t}), \
         9223372036854775807)"
    )
}

/// The holder rows whose mode the asking mode does not match.
fn theirs(ask: &Ask) -> String {
    match ask.mode {
        "holders" => format!("NOT ({KIND} = 'holders' AND h.holders = {})", ask.holders),
        _ => format!("{KIND} = 'holders'"),
    }
}

/// The grant: decides (buried, ours, mismatch, grant, busy), acts on the verdict, and answers
/// one row, the verdict and the fence held after it ([`super::grant`] reads it; an attempt
/// not granted reads the rest by [`report`]). The index of that row's result.
pub fn grant(tx: &mut Tx, ask: &Ask) -> usize {
    let (n, t) = (ask.n, text(ask.token));
    let nh = ask.holders;
    let ttl = interval(ask.ttl);
    let before = before(n, &t);
    let mismatch = match ask.mode {
        "holders" => "h.other > 0",
        _ => "h.semaphore > 0",
    };
    let admit = match (ask.mode, ask.how) {
        ("shared", "peek") => "h.not_shared = 0 AND q.exclusive_waiting = 0".to_owned(),
        ("shared", _) => "h.not_shared = 0 AND q.exclusive_ahead = 0".to_owned(),
        (mode, how) => {
            let free = match mode {
                "holders" => format!("({nh} - h.held)"),
                _ => "(CASE WHEN h.held = 0 THEN 1 ELSE 0 END)".to_owned(),
            };
            match how {
                "peek" => format!("{free} > 0 AND q.waiting = 0"),
                "race" => format!("{free} > 0 AND q.fair_ahead < {free}"),
                _ => format!("{free} > 0 AND q.ahead < {free}"),
            }
        }
    };
    tx.push(format!(
        "WITH h AS (SELECT count(*) AS held, \
           count(*) FILTER (WHERE {KIND} <> 'shared') AS not_shared, \
           count(*) FILTER (WHERE {KIND} = 'holders') AS semaphore, \
           count(*) FILTER (WHERE NOT ({KIND} = 'holders' AND h.holders = {nh})) AS other \
           FROM locked_run.holder h WHERE h.name = {n}), \
         q AS (SELECT count(*) AS waiting, \
           count(*) FILTER (WHERE mode <> 'shared') AS exclusive_waiting, \
           count(*) FILTER (WHERE {before}) AS ahead, \
           count(*) FILTER (WHERE {before} AND NOT racer) AS fair_ahead, \
           count(*) FILTER (WHERE {before} AND mode <> 'shared') AS exclusive_ahead \
           FROM locked_run.queue WHERE name = {n} AND token <> {t}) \
         SELECT set_config('locked_run.verdict', CASE \
           WHEN EXISTS (SELECT FROM locked_run.buried WHERE name = {n} AND token = {t} \
             AND until > clock_timestamp()) THEN 'buried' \
           WHEN EXISTS (SELECT FROM locked_run.holder WHERE name = {n} AND token = {t}) THEN 'ours' \
           WHEN {mismatch} THEN 'mismatch' \
           WHEN {admit} THEN 'grant' \
           ELSE 'busy' END, true) FROM h, q"
    ));
    let verdict = "current_setting('locked_run.verdict')";
    tx.push(format!(
        "UPDATE locked_run.holder SET expires_at = clock_timestamp() + {ttl} \
         WHERE name = {n} AND token = {t} AND {verdict} = 'ours'"
    ));
    tx.push(format!(
        "UPDATE locked_run.fence SET fence = fence + 1 WHERE name = {n} AND {verdict} = 'grant'"
    ));
    tx.push(format!(
        "INSERT INTO locked_run.holder \
         (name, token, mode, holders, fence, host, pid, command, since, expires_at) \
         SELECT {n}, {t}, {mode}, {nh}, fence, {host}, {pid}, {command}, clock_timestamp(), \
         clock_timestamp() + {ttl} FROM locked_run.fence WHERE name = {n} AND {verdict} = 'grant'",
        mode = text(ask.mode),
        host = text(ask.host),
        pid = ask.pid,
        command = text(ask.command),
    ));
    tx.push(format!(
        "DELETE FROM locked_run.queue WHERE name = {n} AND token = {t} \
         AND {verdict} IN ('grant', 'ours')"
    ));
    if ask.how != "peek" {
        tx.push(format!(
            "INSERT INTO locked_run.queue (name, token, place, mode, racer, alive_until) \
             SELECT {n}, {t}, coalesce((SELECT max(place) FROM locked_run.queue WHERE name = {n}), 0) + 1, \
             {mode}, {racer}, clock_timestamp() + {keep} WHERE {verdict} = 'busy' \
             ON CONFLICT (name, token) DO UPDATE SET alive_until = EXCLUDED.alive_until",
            mode = text(ask.mode),
            racer = ask.how == "race",
            keep = interval(ask.keep_alive),
        ));
    }
    // What grants nothing need not wait for a standby.
    tx.push(format!(
        "SELECT set_config('synchronous_commit', \
         CASE WHEN {verdict} IN ('grant', 'ours') THEN 'on' ELSE 'local' END, true)"
    ));
    tx.push(format!(
        "SELECT {verdict}, (SELECT fence FROM locked_run.holder WHERE name = {n} AND token = {t})"
    ))
}

/// What an attempt that was not granted (`verdict`) reports, read after it committed: who
/// holds (the other mode's holders for a mismatch; else the one whose lease ends first, an
/// exclusive one before shared ones) and until when, whether the token keeps a queue place,
/// how many places are before it, when the head's keep-alive ends, and how many hold. The
/// grant leaves this out of its own transaction: planned afresh on each new connection, it
/// cost an uncontended run more than the decision itself. The index of its one row.
pub fn report(tx: &mut Tx, ask: &Ask, verdict: &str) -> usize {
    let (n, t) = (ask.n, text(ask.token));
    let before = before(n, &t);
    let theirs = theirs(ask);
    tx.push(format!(
        "SELECT {verdict}, NULL, \
           (SELECT {KIND} || ' ' || h.holders FROM locked_run.holder h WHERE h.name = {n} AND {theirs} LIMIT 1), \
           b.host, b.pid, b.command, {since}, b.fence, {left}, \
           EXISTS (SELECT FROM locked_run.queue WHERE name = {n} AND token = {t}), \
           (SELECT count(*) FROM locked_run.queue WHERE name = {n} AND token <> {t} AND {before}), \
           (SELECT {head} FROM locked_run.queue WHERE name = {n} ORDER BY place LIMIT 1), \
           (SELECT count(*) FROM locked_run.holder WHERE name = {n}), \
           (SELECT count(*) FROM locked_run.holder h WHERE h.name = {n} AND {KIND} <> 'shared') \
         FROM (SELECT 1) AS one LEFT JOIN LATERAL (SELECT * FROM locked_run.holder h WHERE h.name = {n} \
           ORDER BY ({KIND} = 'shared'), h.expires_at NULLS LAST LIMIT 1) AS b ON true",
        verdict = text(verdict),
        since = epoch_ms("b.since"),
        left = ms_until("b.expires_at"),
        head = ms_until("alive_until"),
    ))
}

/// The renewal: one UPDATE, extending the row only while it has not expired.
pub fn renew(tx: &mut Tx, n: &str, token: &str, ttl: Duration) -> usize {
    tx.push(format!(
        "UPDATE locked_run.holder SET expires_at = clock_timestamp() + {ttl} \
         WHERE name = {n} AND token = {t} AND expires_at > clock_timestamp() RETURNING fence",
        ttl = interval(ttl),
        t = text(token),
    ))
}

/// Buries `token` for `bury`: an attempt of it that lands later takes nothing.
pub fn bury(tx: &mut Tx, n: &str, token: &str, bury: Duration) {
    tx.push(format!(
        "INSERT INTO locked_run.buried (name, token, until) \
         VALUES ({n}, {t}, clock_timestamp() + {bury}) \
         ON CONFLICT (name, token) DO UPDATE SET until = EXCLUDED.until",
        t = text(token),
        bury = interval(bury),
    ));
    tx.push(format!(
        "DELETE FROM locked_run.buried WHERE name = {n} AND until <= clock_timestamp()"
    ));
}

/// Lets our row go (or, with `keep`, leaves it until then: `--min-hold`), noting in
/// `locked_run.ours` whether it was still a live lease of ours.
pub fn let_go(tx: &mut Tx, n: &str, token: &str, keep: Option<Duration>) {
    let t = text(token);
    let change = match keep {
        Some(keep) => format!(
            "UPDATE locked_run.holder SET expires_at = clock_timestamp() + {keep} \
             WHERE name = {n} AND token = {t} AND expires_at > clock_timestamp() RETURNING true AS live",
            keep = interval(keep)
        ),
        None => format!(
            "DELETE FROM locked_run.holder WHERE name = {n} AND token = {t} \
             RETURNING expires_at > clock_timestamp() AS live"
        ),
    };
    tx.push(format!(
        "WITH d AS ({change}) \
         SELECT set_config('locked_run.ours', coalesce(bool_or(live), false)::text, true) FROM d"
    ));
}

/// Leaves the queue.
pub fn leave_queue(tx: &mut Tx, n: &str, token: &str) {
    tx.push(format!(
        "DELETE FROM locked_run.queue WHERE name = {n} AND token = {t}",
        t = text(token)
    ));
}

/// The answer of a release or a give-back: whether the lease was ours.
pub fn ours(tx: &mut Tx) -> usize {
    tx.push("SELECT current_setting('locked_run.ours')")
}

/// `release --force`: deletes every holder (or the one with `token`), answering the live ones
/// it took the lock from.
pub fn force(tx: &mut Tx, n: &str, token: Option<&str>) -> usize {
    let which = token.map_or_else(String::new, |t| format!(" AND h.token = {}", text(t)));
    tx.push(format!(
        "WITH d AS (DELETE FROM locked_run.holder h WHERE h.name = {n}{which} RETURNING h.*) \
         SELECT d.token, d.host, d.pid, d.command, {since}, d.fence FROM d \
         WHERE d.expires_at IS NULL OR d.expires_at > clock_timestamp() ORDER BY d.fence",
        since = epoch_ms("d.since"),
    ))
}

/// The last fence issued.
pub fn fence(tx: &mut Tx, n: &str) -> usize {
    tx.push(format!(
        "SELECT fence FROM locked_run.fence WHERE name = {n}"
    ))
}

/// What `status` reads, in one statement (one snapshot): the fence, the live waiters, and a
/// row per live holder, the soonest to end first (one row of NULLs when free).
pub fn inspect(tx: &mut Tx, n: &str) -> usize {
    tx.push(format!(
        "SELECT f.fence, (SELECT count(*) FROM locked_run.queue q WHERE q.name = k.name \
           AND q.alive_until > clock_timestamp()), \
           h.token, h.kind, h.holders, h.host, h.pid, h.command, {since}, h.fence, {left} \
         FROM (SELECT {n}::text AS name) AS k \
         LEFT JOIN locked_run.fence f ON f.name = k.name \
         LEFT JOIN LATERAL (SELECT h.*, {KIND} AS kind FROM locked_run.holder h \
           WHERE h.name = k.name AND (h.expires_at IS NULL OR h.expires_at > clock_timestamp()) \
           ORDER BY h.expires_at NULLS LAST LIMIT 1000) AS h ON true",
        since = epoch_ms("h.since"),
        left = ms_until("h.expires_at"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_literal_cannot_end_early() {
        assert_eq!(text("job"), "E'job'");
        assert_eq!(text(r"a'b\c"), r"E'a''b\\c'");
        assert_eq!(text("x\0y"), "E'x?y'");
    }

    #[test]
    fn a_waiters_channel_is_a_short_identifier() {
        let c = channel("3f2b8c1e-0d5a-4c77-9e2f-6a1b2c3d4e5f");
        assert_eq!(c, "lr_3f2b8c1e0d5a4c779e2f6a1b2c3d4e5f");
        assert!(channel(&"x".repeat(200)).len() <= 63);
    }
}
