//! What happened: one run of a NAME that took the lock, as every backend's history keeps it
//! (host, pid, user, fence, mode, when it took and let go of the lock, how long it waited, how
//! it ended), the one record format every store keeps it in (a JSON object of at most
//! [`MAX_RECORD`] bytes), and the one reader of what a store gives back ([`Reader`]): any user
//! of a lock can write its history, so a record larger than that, or not one of ours, is
//! skipped and counted, never a reason for a read to fail.

use std::time::UNIX_EPOCH;

use serde_json::{Value, json};

/// The largest fence any store issues (`i64::MAX`: Redis's `INCR`, PostgreSQL's bigint,
/// etcd's revision, and what a consumer keeps in a signed 64-bit number): a record that shows
/// a larger one is no record of a run.
pub const MAX_FENCE: u64 = i64::MAX as u64;

/// How many runs of one NAME a history keeps.
pub const KEPT: usize = 100;

/// The largest record a history keeps, in bytes: a writer cuts its own fields to fit (see
/// [`Run::to_line`]), and a reader skips what is larger.
pub const MAX_RECORD: usize = 4096;

/// The most records one read of a history looks at, kept and skipped together: a store that
/// another user filled with records past [`KEPT`] is read that far and no further.
pub const SCANNED: usize = 10 * KEPT;

/// Says that a release went through but its run could not be added to the history (`failed`:
/// why). Only after the release was confirmed: one that failed says so itself, and a history
/// is never a reason for a release to fail.
pub fn unrecorded<T, E: std::fmt::Display>(
    name: &crate::name::LockName,
    released: &Result<bool, super::BackendError>,
    failed: Result<T, E>,
) {
    if let (Ok(_), Err(e)) = (released, failed) {
        tracing::warn!(
            "could not add this run to lock {name}'s history ({e}); the lock is released"
        );
    }
}

/// How a run that took the lock ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The command exited with the run's status.
    Exit,
    /// The command was ended by this signal (the run's status is 128 + N).
    Signal(i32),
    /// The lease was lost and `locked-run` stopped the command (76).
    Lost,
    /// `--max-run` ran out and `locked-run` stopped the command (124).
    MaxRun,
}

impl Ended {
    /// The word `history --json` says: `exit`, `signal`, `lost`, `max-run`.
    pub fn word(self) -> &'static str {
        match self {
            Ended::Exit => "exit",
            Ended::Signal(_) => "signal",
            Ended::Lost => "lost",
            Ended::MaxRun => "max-run",
        }
    }
}

/// One run that took the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    /// The run's token: the same run seen by several stores (Redlock's servers) is one run.
    pub token: String,
    pub host: String,
    pub pid: u32,
    pub user: String,
    pub fence: u64,
    /// `exclusive`, `shared`, or `holders N`.
    pub mode: String,
    /// When the lock was taken and let go, ms since the Unix epoch (this host's wall clock:
    /// for people to read, never for a deadline).
    pub started_ms: u64,
    pub ended_ms: u64,
    pub waited_ms: u64,
    /// The exit status `locked-run` returned.
    pub status: i32,
    pub ended: Ended,
}

/// `ms` since the epoch as RFC 3339, UTC, to the millisecond (the last instant it can write
/// for anything later: only a wall clock set past year 9999 would give one).
pub fn rfc3339(ms: u64) -> String {
    let t = super::showable(ms.min(super::LAST_SHOWABLE_MS)).unwrap_or(UNIX_EPOCH);
    humantime::format_rfc3339_millis(t).to_string()
}

fn parse_rfc3339(text: &str) -> Option<u64> {
    let t = humantime::parse_rfc3339(text).ok()?;
    Some(t.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64)
}

impl Run {
    /// The record as `history --json` prints it, and as Redis, etcd and `file://` keep it (with
    /// the token, which pairs one run's records across Redlock's servers).
    pub fn to_json(&self) -> Value {
        let mut object = json!({
            "host": self.host,
            "pid": self.pid,
            "user": self.user,
            "fence": self.fence,
            "mode": self.mode,
            "started_at": rfc3339(self.started_ms),
            "ended_at": rfc3339(self.ended_ms),
            "waited_ms": self.waited_ms,
            "status": self.status,
            "ended": self.ended.word(),
            "token": self.token,
        });
        if let Ended::Signal(n) = self.ended {
            object["signal"] = json!(n);
        }
        object
    }

    /// A record back from a store; `None` when it is not one (another program's, or damaged):
    /// among them one whose numbers are out of their range (a pid past `u32`, a status or a
    /// signal past `i32`, a fence past `i64::MAX`, the fence range of every store), which is
    /// skipped whole, never cut to a number that means something else.
    pub fn from_json(value: &Value) -> Option<Run> {
        let text = |key: &str| value.get(key)?.as_str().map(str::to_owned);
        let number = |key: &str| value.get(key)?.as_u64();
        let int = |key: &str| i32::try_from(value.get(key)?.as_i64()?).ok();
        let ended = match value.get("ended")?.as_str()? {
            "exit" => Ended::Exit,
            "signal" => Ended::Signal(int("signal")?),
            "lost" => Ended::Lost,
            "max-run" => Ended::MaxRun,
            _ => return None,
        };
        Some(Run {
            token: text("token")?,
            host: text("host")?,
            pid: u32::try_from(number("pid")?).ok()?,
            user: text("user")?,
            fence: number("fence").filter(|&f| f <= MAX_FENCE)?,
            mode: text("mode")?,
            started_ms: parse_rfc3339(&text("started_at")?)?,
            ended_ms: parse_rfc3339(&text("ended_at")?)?,
            waited_ms: number("waited_ms")?,
            status: int("status")?,
            ended,
        })
    }

    /// The record as one line of JSON, at most [`MAX_RECORD`] bytes: the fields that are text
    /// cut to fit (a host or user name of hundreds of characters, escaped six bytes a
    /// character, would pass it whole).
    pub fn to_line(&self) -> String {
        let cut = |text: &str, max: usize| text.chars().take(max).collect::<String>();
        let bounded = Run {
            token: cut(&self.token, 256),
            host: cut(&self.host, 128),
            user: cut(&self.user, 128),
            mode: cut(&self.mode, 64),
            ..self.clone()
        };
        // Each text field is at most 6 bytes a character once escaped: 576 * 6 bytes and the
        // numbers' 300 fit in MAX_RECORD.
        bounded.to_json().to_string()
    }

    /// A record from one line of JSON; `None` when it is larger than [`MAX_RECORD`] or not one.
    pub fn from_line(line: &str) -> Option<Run> {
        if line.len() > MAX_RECORD {
            return None;
        }
        Run::from_json(&serde_json::from_str(line).ok()?)
    }
}

/// What a read of a NAME's history found: its runs, newest first, and how many records it
/// skipped (larger than [`MAX_RECORD`], or not records of a run).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub runs: Vec<Run>,
    pub skipped: usize,
}

/// The one reader of a history, for every store: raw records in, newest first as the store
/// orders them (its own order: a list's, a file's lines', the rows' server-set stamp; never a
/// field the record's writer chose, which any user of the lock may set to anything), the runs
/// and the count of what it skipped out. A store that skips records itself (Redis,
/// PostgreSQL: so that no reply carries them) adds its count with [`Reader::skipped`].
#[derive(Debug, Default)]
pub struct Reader {
    runs: Vec<Run>,
    skipped: usize,
}

impl Reader {
    pub fn new() -> Reader {
        Reader::default()
    }

    /// Reads one raw record: a run, or one more skipped.
    pub fn take(&mut self, raw: &[u8]) {
        let run = std::str::from_utf8(raw).ok().and_then(Run::from_line);
        match run {
            Some(run) => self.runs.push(run),
            None => self.skipped += 1,
        }
    }

    /// Counts `n` records the store skipped before they were sent.
    pub fn skipped(&mut self, n: usize) {
        self.skipped += n;
    }

    /// How many runs it has read so far.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// The first `limit` runs taken (the newest), and the count of what was skipped.
    pub fn finish(mut self, limit: usize) -> History {
        self.runs.truncate(limit);
        History {
            runs: self.runs,
            skipped: self.skipped,
        }
    }
}

/// Histories of several stores (Redlock's servers) as one: each run once (by its token),
/// newest first, at most `limit`; what each skipped, added up. No store's order is broken:
/// a run comes before another whenever some store has it first (a run that one server missed
/// still sits between its neighbours); where the stores leave the order open (each has a run
/// the other missed), the larger fence goes first. Should the stores disagree (records
/// written by hand), the first store's head goes first.
pub fn merged(histories: impl IntoIterator<Item = History>, limit: usize) -> History {
    use std::collections::{HashMap, HashSet};
    let mut lists: Vec<Vec<Run>> = Vec::new();
    let mut skipped = 0;
    for history in histories {
        skipped += history.skipped;
        lists.push(history.runs);
    }
    // Where each run stands in each store's list.
    let mut places: HashMap<String, Vec<(usize, usize)>> = HashMap::new();
    for (l, list) in lists.iter().enumerate() {
        for (i, run) in list.iter().enumerate() {
            places.entry(run.token.clone()).or_default().push((l, i));
        }
    }
    let mut heads = vec![0; lists.len()];
    let mut taken: HashSet<String> = HashSet::new();
    let mut runs: Vec<Run> = Vec::new();
    while runs.len() < limit {
        for (l, list) in lists.iter().enumerate() {
            while list.get(heads[l]).is_some_and(|r| taken.contains(&r.token)) {
                heads[l] += 1;
            }
        }
        let front = |l: usize| lists[l].get(heads[l]);
        // A head that no store has below a run not yet taken: nothing must come before it.
        let first_everywhere = |run: &Run| places[&run.token].iter().all(|&(l, i)| i <= heads[l]);
        let free = (0..lists.len())
            .filter_map(front)
            .filter(|run| first_everywhere(run))
            .max_by_key(|run| run.fence);
        let Some(next) = free.or_else(|| (0..lists.len()).find_map(front)) else {
            break;
        };
        taken.insert(next.token.clone());
        runs.push(next.clone());
    }
    History { runs, skipped }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(token: &str, ended_ms: u64) -> Run {
        Run {
            token: token.into(),
            host: "web-1".into(),
            pid: 4242,
            user: "backup".into(),
            fence: ended_ms / 1000,
            mode: "exclusive".into(),
            started_ms: ended_ms.saturating_sub(1500),
            ended_ms,
            waited_ms: 12,
            status: 143,
            ended: Ended::Signal(15),
        }
    }

    #[test]
    fn a_record_reads_back_as_it_was_written() {
        let r = run("t1", 1_764_673_200_123);
        let line = r.to_line();
        assert!(
            line.contains("\"ended_at\":\"2025-12-02T11:00:00.123Z\""),
            "{line}"
        );
        assert_eq!(Run::from_line(&line), Some(r));
        assert_eq!(Run::from_line("not json"), None);
        assert_eq!(Run::from_line("{\"host\":\"x\"}"), None);
    }

    fn history(runs: Vec<Run>, skipped: usize) -> History {
        History { runs, skipped }
    }

    fn tokens(history: History) -> Vec<String> {
        history.runs.into_iter().map(|r| r.token).collect()
    }

    #[test]
    fn histories_of_several_stores_count_each_run_once_newest_first() {
        let a = history(vec![run("t2", 3_000_000), run("t1", 1_000_000)], 1);
        let b = history(vec![run("t2", 3_000_000), run("t3", 2_000_000)], 2);
        let both = merged([a, b], 10);
        assert_eq!(both.skipped, 3);
        assert_eq!(tokens(both), ["t2", "t3", "t1"]);
        let one = history(vec![run("t2", 2), run("t1", 1)], 0);
        assert_eq!(merged([one], 1).runs[0].token, "t2");
    }

    /// Issue 43's review: a history is ordered by its store, never by a field the record's
    /// writer chose. A server that missed some runs (unreachable at their release) breaks no
    /// other server's order, whatever the records say of their times and fences.
    #[test]
    fn several_stores_keep_each_stores_order() {
        let mut r: Vec<Run> = (1..=5).map(|i| run(&format!("r{i}"), i * 1000)).collect();
        // Forged times and fences: neither moves a run.
        r[4].ended_ms = 1;
        r[4].fence = 0;
        r[0].ended_ms = 253_402_300_799_999;
        r[0].fence = 1 << 40;
        let newest_first = |ids: &[usize]| ids.iter().map(|&i| r[i - 1].clone()).collect();
        let a = history(newest_first(&[5, 4, 3, 2, 1]), 0);
        let b = history(newest_first(&[3, 2, 1]), 0);
        let c = history(newest_first(&[5, 3, 1]), 0);
        assert_eq!(
            tokens(merged([b, a, c], 10)),
            ["r5", "r4", "r3", "r2", "r1"]
        );
    }

    /// Issue 43's review: a run's record is read in its store's order; one that claims a
    /// later end (year 9999) does not go first, and numbers out of their range make a record
    /// no record (a pid of 2^32 + 1 read as pid 1, a status of 2^40 as "exit 0").
    #[test]
    fn the_reader_keeps_the_stores_order_and_skips_numbers_out_of_range() {
        let mut forged = run("forged", 253_402_300_799_999);
        forged.fence = 1 << 40;
        let records = [run("t2", 2_000_000), forged, run("t1", 1_000_000)];
        let mut reader = Reader::new();
        for r in &records {
            reader.take(r.to_line().as_bytes());
        }
        assert_eq!(tokens(reader.finish(10)), ["t2", "forged", "t1"]);
        let good: Value = serde_json::from_str(&run("t", 1).to_line()).unwrap();
        let with = |key: &str, value: Value| {
            let mut v = good.clone();
            v[key] = value;
            v
        };
        assert!(Run::from_json(&good).is_some());
        assert!(Run::from_json(&with("fence", json!(i64::MAX))).is_some());
        for (key, value) in [
            ("pid", json!(4_294_967_297u64)),
            ("status", json!(1u64 << 40)),
            ("status", json!(-(1i64 << 40))),
            ("signal", json!(1u64 << 40)),
            ("fence", json!(i64::MAX as u64 + 1)),
            ("fence", json!(u64::MAX - 1)),
            ("fence", json!(-1)),
        ] {
            assert_eq!(
                Run::from_json(&with(key, value.clone())),
                None,
                "{key} {value}"
            );
        }
    }

    /// Issue 43: any user of a lock can write its history; a record of 1 MB, one that is not
    /// JSON and one of another program's are skipped and counted, the runs beside them read.
    #[test]
    fn the_reader_skips_what_is_too_large_or_not_a_record_and_counts_it() {
        let good = run("t1", 1_000_000).to_line();
        let huge = format!("{{\"host\":\"{}\"}}", "x".repeat(1 << 20));
        let raw: Vec<&[u8]> = vec![
            good.as_bytes(),
            huge.as_bytes(),
            b"not json",
            b"{\"host\":\"x\"}",
            &[0xff, 0xfe],
        ];
        let mut reader = Reader::new();
        for record in raw {
            reader.take(record);
        }
        let read = reader.finish(10);
        assert_eq!(read.runs, [run("t1", 1_000_000)]);
        assert_eq!(read.skipped, 4);
        // A record of exactly the bound is read; one byte more is skipped.
        let padded = |n: usize| {
            let mut r = run("t2", 2_000_000);
            r.mode = String::new();
            let base = r.to_json().to_string().len();
            r.mode = "m".repeat(n - base);
            r.to_json().to_string()
        };
        assert!(Run::from_line(&padded(MAX_RECORD)).is_some());
        assert!(Run::from_line(&padded(MAX_RECORD + 1)).is_none());
    }

    /// Issue 43: the writer cuts its own fields, so that its record is never one a reader
    /// skips, whatever its host and user names hold.
    #[test]
    fn a_record_with_the_longest_fields_fits_the_bound() {
        // The last millisecond of year 9999: the latest instant RFC 3339 writes.
        let mut r = run(&"t".repeat(5000), 253_402_300_799_999);
        r.host = "\u{1b}".repeat(5000);
        r.user = "\u{7}".repeat(5000);
        r.mode = "\u{1}".repeat(5000);
        r.pid = u32::MAX;
        r.fence = MAX_FENCE;
        r.waited_ms = u64::MAX;
        r.status = i32::MIN;
        r.ended = Ended::Signal(i32::MAX);
        let line = r.to_line();
        assert!(line.len() <= MAX_RECORD, "{}", line.len());
        let back = Run::from_line(&line).unwrap();
        assert_eq!(back.host.chars().count(), 128);
    }
}
