//! A NAME's history on this host: `DIR/STEM.history`, one line (the run's record) per run,
//! appended under the lock as it is let go, the oldest dropped once it holds twice what is
//! kept. Opened as every file of the backend is (no link followed, no other user's file in a
//! sticky directory); a history that cannot be written is a warning, never a failed release.
//! Any writer of DIR can append to it, so only its last [`TAIL`] bytes are ever read, by a
//! release's trim and by `history` alike: a line of 400 MB costs neither more than that.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use super::files::{Paths, open_existing, plain_file, refused};
use crate::backend::{BackendError, History, KEPT, MAX_FENCE, MAX_RECORD, Reader, Run};

/// The most of `STEM.history` that is read: its last 1 MiB (some 3 000 records of ours).
pub const TAIL: u64 = 1 << 20;

impl Paths {
    /// `STEM.history`.
    pub fn history(&self) -> PathBuf {
        self.dir.join(format!("{}.history", self.stem))
    }
}

/// Appends `run`'s record, in one `write` (O_APPEND: holders that share the lock append whole
/// lines beside each other), on a line of its own: after a file whose last byte is no newline
/// (another writer's line cut short), a newline first, or the record would end that line and
/// be read as part of it. With `may_trim` (no other run appends meanwhile: the lock held
/// exclusively, or the flock on DIR that holders sharing it append under), a history past
/// twice what is kept (or past [`TAIL`]) is cut to the newest [`KEPT`] runs, through a file
/// renamed over it.
pub fn append(paths: &Paths, run: &Run, may_trim: bool) -> Result<(), BackendError> {
    let path = paths.history();
    let mut line = format!("{}\n", run.to_line());
    // Read too: `ends_a_line` reads the last byte (on a file opened only to append, the read
    // fails and every record got an empty line before it).
    let mut file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .mode(super::files::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .and_then(|file| plain_file(&path, file))
        .map_err(|e| refused(&path, "open", &e))?;
    if !ends_a_line(&file) {
        line.insert(0, '\n');
    }
    file.write_all(line.as_bytes())
        .map_err(|e| refused(&path, "write", &e))?;
    let long = file
        .metadata()
        .is_ok_and(|m| m.len() > TAIL.min(2 * KEPT as u64 * line.len() as u64));
    if may_trim && long {
        trim(paths).map_err(|e| refused(&path, "trim", &e))?;
    }
    Ok(())
}

/// Whether `file` is empty or ends with a newline (one `pread` of its last byte). Another
/// holder appending between this and the write leaves an empty line at worst, which no
/// reader counts.
fn ends_a_line(file: &File) -> bool {
    let len = file.metadata().map_or(0, |m| m.len());
    let mut last = [b'\n'];
    len == 0 || (file.read_at(&mut last, len - 1).is_ok() && last[0] == b'\n')
}

/// Keeps the newest [`KEPT`] records of the file's tail; what is not a record goes. So does
/// what a trim killed mid-way (SIGKILL) left behind a minute or more ago.
fn trim(paths: &Paths) -> io::Result<()> {
    super::files::remove_stale(&paths.dir, &format!(".{}.history.", paths.stem), ".tmp");
    let tail = tail(&open_existing(&paths.history(), false)?)?;
    let records: Vec<&[u8]> = tail
        .lines
        .iter()
        .map(Vec::as_slice)
        .filter(|line| std::str::from_utf8(line).is_ok_and(|l| Run::from_line(l).is_some()))
        .collect();
    let keep = &records[records.len().saturating_sub(KEPT)..];
    let tmp = paths.temporary("history");
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(super::files::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = keep
        .iter()
        .try_for_each(|line| out.write_all(line).and_then(|()| out.write_all(b"\n")))
        .and_then(|()| fs::rename(&tmp, paths.history()));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// The whole lines of a file's last [`TAIL`] bytes, oldest first, and how many bytes of a line
/// that began before them were left out.
struct Tail {
    lines: Vec<Vec<u8>>,
    cut: usize,
}

fn tail(file: &File) -> io::Result<Tail> {
    tail_of(file, TAIL)
}

/// [`tail`] of the last `size` bytes: one `pread` (a file that grows meanwhile is still read no
/// further than its length was).
fn tail_of(file: &File, size: u64) -> io::Result<Tail> {
    let len = file.metadata()?.len();
    let from = len.saturating_sub(size);
    let mut bytes = vec![0; (len - from) as usize];
    let mut got = 0;
    while got < bytes.len() {
        match file.read_at(&mut bytes[got..], from + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    bytes.truncate(got);
    let mut lines: Vec<Vec<u8>> = bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec).collect();
    // What follows the last newline is a line still being written, or nothing.
    lines.pop();
    let cut = match from {
        0 => 0,
        _ if lines.is_empty() => 0,
        _ => lines.remove(0).len(),
    };
    // An empty line is nothing (see `ends_a_line`), not a record to skip.
    lines.retain(|line| !line.is_empty());
    Ok(Tail { lines, cut })
}

/// The NAME's last `limit` runs, newest first (the last line first), from the file's last [`TAIL`] bytes; none when
/// it has no history yet. A line cut by the start of the tail counts as skipped when what is
/// left of it is already larger than a record may be.
pub fn read(paths: &Paths, limit: usize) -> Result<History, BackendError> {
    let path = paths.history();
    let file = match open_existing(&path, false) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(History::default()),
        Err(e) => return Err(refused(&path, "read", &e)),
    };
    let tail = tail(&file).map_err(|e| refused(&path, "read", &e))?;
    let mut reader = Reader::new();
    if tail.cut > MAX_RECORD {
        reader.skipped(1);
    }
    // Newest first: the file's own order (each run appends), whatever a line says of itself.
    for line in tail.lines.iter().rev() {
        reader.take(line);
    }
    Ok(reader.finish(limit))
}

/// The largest fence NAME's history shows (its tail's), if any: no fence is issued below it.
pub fn largest_fence(paths: &Paths) -> Result<Option<u64>, BackendError> {
    Ok(read(paths, usize::MAX)?.runs.iter().map(|r| r.fence).max())
}

/// The largest fence of the history's newest records (its last [`MAX_RECORD`] bytes: the runs
/// just before this one, as each appends its record before it lets go), read at every fence
/// a run is given; none when there is no history, or it cannot be read.
pub fn newest_fence(paths: &Paths) -> Option<u64> {
    let file = open_existing(&paths.history(), false).ok()?;
    let tail = tail_of(&file, MAX_RECORD as u64).ok()?;
    tail.lines.iter().filter_map(|line| fence_of(line)).max()
}

/// The fence a line of the history names: a JSON object's `fence`, a number no larger than
/// [`MAX_FENCE`], its other fields passed over unread (read at every grant: a whole record's
/// dates and texts cost the handoff a few microseconds each, some sixteen records deep). A
/// line that names a fence but is no whole record counts too: a floor only ever errs upward,
/// and any writer of DIR can append a whole record with any fence as well.
fn fence_of(line: &[u8]) -> Option<u64> {
    use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};

    struct Fence;
    impl<'de> Visitor<'de> for Fence {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a record")
        }

        fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Option<u64>, M::Error> {
            let mut fence = None;
            while let Some(key) = map.next_key::<&str>()? {
                match key {
                    "fence" => fence = Some(map.next_value::<u64>()?),
                    _ => drop(map.next_value::<IgnoredAny>()?),
                }
            }
            Ok(fence.filter(|&f| f <= MAX_FENCE))
        }
    }

    if line.len() > MAX_RECORD {
        return None;
    }
    let mut json = serde_json::Deserializer::from_slice(line);
    let fence = json.deserialize_map(Fence).ok()?;
    json.end().ok()?;
    fence
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Ended;
    use crate::name::LockName;

    fn run(fence: u64) -> Run {
        Run {
            token: format!("t{fence}"),
            host: "web-1".into(),
            pid: 1,
            user: "u".into(),
            fence,
            mode: "exclusive".into(),
            started_ms: fence * 1000,
            ended_ms: fence * 1000 + 1,
            waited_ms: 0,
            status: 0,
            ended: Ended::Exit,
        }
    }

    /// The fence of a record's line, read without the rest of it; what names no fence in
    /// range, or is no one JSON object, names none.
    #[test]
    fn a_lines_fence_is_read_alone() {
        let line = run(7).to_line();
        assert_eq!(fence_of(line.as_bytes()), Some(7));
        let line = Run {
            fence: MAX_FENCE,
            ..run(7)
        }
        .to_line();
        assert_eq!(fence_of(line.as_bytes()), Some(MAX_FENCE));
        for junk in [
            r#"{"fence":9223372036854775808}"#.to_owned(),
            r#"{"fence":-1}"#.to_owned(),
            r#"{"fence":1.5}"#.to_owned(),
            r#"{"fence":"7"}"#.to_owned(),
            r#"{"host":"x"}"#.to_owned(),
            r#"[7]"#.to_owned(),
            format!("{} trailing", run(7).to_line()),
            "not a record".to_owned(),
            format!(r#"{{"fence":7,"host":"{}"}}"#, "x".repeat(MAX_RECORD)),
        ] {
            assert_eq!(fence_of(junk.as_bytes()), None, "{junk:.60}");
        }
        // Every key of a record is read past, whatever it holds.
        let nested = r#"{"host":{"a":[1,{"fence":99}]},"fence":3,"user":"u\"v"}"#;
        assert_eq!(fence_of(nested.as_bytes()), Some(3));
    }

    /// Issue 43: a line of megabytes appended by another writer of DIR costs a release and
    /// `history` no more than the last [`TAIL`] bytes, and the trim drops it.
    #[test]
    fn only_the_tail_is_read_and_the_trim_drops_a_huge_line() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::new(dir.path(), &LockName::new("job").unwrap());
        append(&paths, &run(1), true).unwrap();
        let huge = vec![b'x'; 3 * TAIL as usize];
        let mut file = OpenOptions::new()
            .append(true)
            .open(paths.history())
            .unwrap();
        file.write_all(&huge).unwrap();
        file.write_all(b"\nnot a record\n").unwrap();
        append(&paths, &run(2), false).unwrap();
        let read_back = read(&paths, 10).unwrap();
        assert_eq!(read_back.runs, [run(2)], "the old run is past the tail");
        assert_eq!(
            read_back.skipped, 2,
            "the huge line's end and the junk line"
        );
        // A release that holds the lock alone trims: the newest records, nothing else.
        append(&paths, &run(3), true).unwrap();
        let len = fs::metadata(paths.history()).unwrap().len();
        assert!(len < 2 * MAX_RECORD as u64, "{len}");
        let read_back = read(&paths, 10).unwrap();
        assert_eq!(read_back.runs, [run(3), run(2)]);
        assert_eq!(read_back.skipped, 0);
        assert_eq!(largest_fence(&paths).unwrap(), Some(3));
    }
}
