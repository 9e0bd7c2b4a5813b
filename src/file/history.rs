//! A NAME's history on this host: `DIR/STEM.history`, one line (the run's record) per run,
//! appended under the lock as it is let go, the oldest dropped once it holds twice what is
//! kept. Opened as every file of the backend is (no link followed, no other user's file in a
//! sticky directory); a history that cannot be written is a warning, never a failed release.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use super::files::{Paths, open_existing, plain_file, refused};
use crate::backend::{BackendError, KEPT, Run, newest_first};

impl Paths {
    /// `STEM.history`.
    pub fn history(&self) -> PathBuf {
        self.dir.join(format!("{}.history", self.stem))
    }
}

/// Appends `run`'s record, in one `write` (O_APPEND: holders that share the lock append whole
/// lines beside each other). With `alone` (the lock held exclusively), a history past twice
/// what is kept is cut to the newest [`KEPT`] runs, through a file renamed over it.
pub fn append(paths: &Paths, run: &Run, alone: bool) -> Result<(), BackendError> {
    let path = paths.history();
    let line = format!("{}\n", run.to_line());
    let mut file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(super::files::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .and_then(|file| plain_file(&path, file))
        .map_err(|e| refused(&path, "open", &e))?;
    file.write_all(line.as_bytes())
        .map_err(|e| refused(&path, "write", &e))?;
    let long = file
        .metadata()
        .is_ok_and(|m| m.len() > 2 * KEPT as u64 * line.len() as u64);
    if alone && long {
        trim(paths).map_err(|e| refused(&path, "trim", &e))?;
    }
    Ok(())
}

/// Keeps the newest [`KEPT`] lines.
fn trim(paths: &Paths) -> io::Result<()> {
    let lines = lines(&open_existing(&paths.history(), false)?);
    let keep = &lines[lines.len().saturating_sub(KEPT)..];
    let tmp = paths.temporary("history");
    let mut out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(super::files::FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    let written = keep
        .iter()
        .try_for_each(|line| writeln!(out, "{line}"))
        .and_then(|()| fs::rename(&tmp, paths.history()));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

fn lines(file: &File) -> Vec<String> {
    BufReader::new(file).lines().map_while(Result::ok).collect()
}

/// The NAME's last `limit` runs, newest first; none when it has no history yet.
pub fn read(paths: &Paths, limit: usize) -> Result<Vec<Run>, BackendError> {
    let path = paths.history();
    let file = match open_existing(&path, false) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(refused(&path, "read", &e)),
    };
    let runs = lines(&file)
        .iter()
        .filter_map(|line| Run::from_line(line))
        .collect();
    Ok(newest_first(runs, limit))
}
