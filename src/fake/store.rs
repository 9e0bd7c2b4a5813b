//! The fake backend's store: one small state file, a JSON object, changed only under an
//! exclusive `flock` of the file beside it (`STORE.lock`) and replaced whole (a temporary file
//! renamed over it), so that a process SIGKILLed while it writes leaves the last state whole.
//! What it keeps, per NAME: the lock's key with its holder and an expiry on the wall clock (a
//! lease, as a server keeps one), the fence counter, the waiters (each with an expiry of its
//! own), and the history (the newest last, at most `KEPT`). Every run of the conformance suite
//! on the fake shares it between real processes, as a server would be shared.
//!
//! The file is opened as a file another user could have written is: never through a link,
//! never blocking (a FIFO in its place is refused), and read with a size bound.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::backend::{BackendError, KEPT, Run, SCANNED, wall_clock_ms};

/// The most of the state file a run reads: past it, the file is no store of ours.
const MAX_STATE: u64 = 1 << 20;

/// The store a `fake:///PATH` URL names.
#[derive(Clone, Debug)]
pub struct Store {
    pub path: PathBuf,
    lock: PathBuf,
}

/// The lock's key, while someone holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    pub token: String,
    /// When it lapses, ms since the Unix epoch on the wall clock.
    pub expires_ms: u64,
    pub host: String,
    pub pid: u32,
    pub command: String,
    pub since_ms: u64,
    pub fence: u64,
}

/// The state, read under the lock; written back by [`Store::change`].
#[derive(Debug, Default)]
pub struct State(Map<String, Value>);

impl Store {
    /// The store of `fake:///PATH` (an absolute path); why not, in one line.
    pub fn of(url: &str) -> Result<Store, String> {
        let path = url
            .get(.."fake://".len())
            .filter(|s| s.eq_ignore_ascii_case("fake://"))
            .map(|_| &url["fake://".len()..])
            .filter(|path| path.starts_with('/') && path.len() > 1 && !path.contains(['?', '#']))
            .ok_or_else(|| {
                crate::text::message!(
                    "{} is not a usable fake:// URL: write fake:///absolute/path",
                    crate::endpoints::printable(url)
                )
            })?;
        let mut lock = PathBuf::from(path).into_os_string();
        lock.push(".lock");
        Ok(Store {
            path: PathBuf::from(path),
            lock: PathBuf::from(lock),
        })
    }

    /// Reads the state under the lock, lets `change` change it, and writes it back when it
    /// says so; what `change` answers.
    pub fn change<T>(
        &self,
        change: impl FnOnce(&mut State) -> (T, bool),
    ) -> Result<T, BackendError> {
        let lock = self.locked()?;
        let mut state = self.read()?;
        let (answer, changed) = change(&mut state);
        if changed {
            self.write(&state)?;
        }
        drop(lock);
        Ok(answer)
    }

    /// Reads the state under the lock, changing nothing.
    pub fn read_locked(&self) -> Result<State, BackendError> {
        let lock = self.locked()?;
        let state = self.read();
        drop(lock);
        state
    }

    /// The lock file, locked exclusively (released when it is dropped).
    fn locked(&self) -> Result<File, BackendError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&self.lock)
            .and_then(|file| regular(&self.lock, file))
            .map_err(|e| self.unreached(&self.lock, &e))?;
        loop {
            // SAFETY: flock on a descriptor `file` keeps open; no memory is passed.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(file);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(self.unreached(&self.lock, &e));
            }
        }
    }

    /// The state file's object; none yet is an empty one.
    fn read(&self) -> Result<State, BackendError> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&self.path);
        let file = match file {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(State::default()),
            other => other
                .and_then(|file| regular(&self.path, file))
                .map_err(|e| self.unreached(&self.path, &e))?,
        };
        let mut text = String::new();
        file.take(MAX_STATE + 1)
            .read_to_string(&mut text)
            .map_err(|e| self.unreached(&self.path, &e))?;
        if text.len() as u64 > MAX_STATE {
            return Err(self.malformed("larger than 1 MiB"));
        }
        match serde_json::from_str(&text) {
            Ok(Value::Object(map)) => Ok(State(map)),
            _ => Err(self.malformed("not a JSON object")),
        }
    }

    /// Replaces the state file with `state`, through a temporary file renamed over it.
    fn write(&self, state: &State) -> Result<(), BackendError> {
        let mut temporary = self.path.clone().into_os_string();
        temporary.push(format!(".{}.tmp", crate::backend::new_token()));
        let temporary = PathBuf::from(temporary);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temporary)
            .and_then(|mut file| {
                file.write_all(Value::Object(state.0.clone()).to_string().as_bytes())
            })
            .and_then(|()| std::fs::rename(&temporary, &self.path));
        written.map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            BackendError::Refused(crate::text::message!(
                "cannot write the fake store {}: {e}",
                self.path.display()
            ))
        })
    }

    fn unreached(&self, path: &Path, e: &io::Error) -> BackendError {
        BackendError::Transient(crate::text::message!(
            "cannot open the fake store {}: {e}",
            path.display()
        ))
        .unsent()
    }

    fn malformed(&self, why: &str) -> BackendError {
        BackendError::Transient(crate::text::message!(
            "the fake store {} is no store of locked-run's: {why}",
            self.path.display()
        ))
        .unsent()
    }
}

/// Whether a waiter's place holds: not lapsed, and its process still there.
fn live(place: &Value) -> bool {
    let until = place.get("until_ms").and_then(Value::as_u64).unwrap_or(0);
    let pid = place.get("pid").and_then(Value::as_i64).unwrap_or(0);
    // SAFETY: kill with signal 0 sends nothing; it only asks whether the process exists (one
    // of another user's answers EPERM).
    let there = pid > 0
        && (unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
            || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM));
    until > wall_clock_ms() && there
}

/// `file`, if it is a regular file.
fn regular(path: &Path, file: File) -> io::Result<File> {
    match file.metadata()?.is_file() {
        true => Ok(file),
        false => Err(io::Error::other(format!(
            "{}: not a regular file",
            path.file_name().unwrap_or_default().to_string_lossy()
        ))),
    }
}

impl State {
    /// The object kept for `name` under `what` (`locks`, `fences`, `waiters`, `history`).
    fn of(&self, what: &str, name: &str) -> Option<&Value> {
        self.0.get(what)?.get(name)
    }

    fn set(&mut self, what: &str, name: &str, value: Option<Value>) {
        let map = self
            .0
            .entry(what)
            .or_insert_with(|| Value::Object(Map::new()));
        let Some(map) = map.as_object_mut() else {
            return;
        };
        match value {
            Some(value) => {
                map.insert(name.to_owned(), value);
            }
            None => {
                map.remove(name);
            }
        }
    }

    /// The lock's key, unless it lapsed.
    pub fn key(&self, name: &str) -> Option<Key> {
        let key = self.of("locks", name)?;
        let text = |field: &str| key.get(field)?.as_str().map(str::to_owned);
        let number = |field: &str| key.get(field)?.as_u64();
        let key = Key {
            token: text("token")?,
            expires_ms: number("expires_ms")?,
            host: text("host").unwrap_or_default(),
            pid: number("pid").unwrap_or(0) as u32,
            command: text("command").unwrap_or_default(),
            since_ms: number("since_ms").unwrap_or(0),
            fence: number("fence").unwrap_or(0),
        };
        (key.expires_ms > wall_clock_ms()).then_some(key)
    }

    pub fn set_key(&mut self, name: &str, key: Option<&Key>) {
        let value = key.map(|k| {
            json!({
                "token": k.token, "expires_ms": k.expires_ms, "host": k.host, "pid": k.pid,
                "command": k.command, "since_ms": k.since_ms, "fence": k.fence,
            })
        });
        self.set("locks", name, value);
    }

    /// The last fence issued.
    pub fn fence(&self, name: &str) -> Option<u64> {
        self.of("fences", name)?.as_u64()
    }

    /// Raises the fence; the new one.
    pub fn next_fence(&mut self, name: &str) -> u64 {
        let next = self.fence(name).unwrap_or(0) + 1;
        self.set("fences", name, Some(next.into()));
        next
    }

    /// The waiters whose places have not lapsed, by token: each place lasts until its expiry,
    /// or until its process is gone (a server sees a client's connection close; the fake, on
    /// one host, sees its process end).
    pub fn waiters(&self, name: &str) -> Vec<String> {
        let Some(Value::Object(waiters)) = self.of("waiters", name) else {
            return Vec::new();
        };
        waiters
            .iter()
            .filter(|(_, place)| live(place))
            .map(|(token, _)| token.clone())
            .collect()
    }

    /// Keeps `token`'s place, this process's, until `until_ms` (none: it leaves), dropping
    /// the places that lapsed.
    pub fn wait(&mut self, name: &str, token: &str, until_ms: Option<u64>) {
        let mut waiters = match self.of("waiters", name) {
            Some(Value::Object(waiters)) => waiters.clone(),
            _ => Map::new(),
        };
        waiters.retain(|_, place| live(place));
        match until_ms {
            Some(until) => {
                let place = json!({"until_ms": until, "pid": std::process::id()});
                waiters.insert(token.to_owned(), place)
            }
            None => waiters.remove(token),
        };
        self.set("waiters", name, Some(Value::Object(waiters)));
    }

    /// The history's records, the newest last.
    pub fn history(&self, name: &str) -> Vec<String> {
        let Some(Value::Array(records)) = self.of("history", name) else {
            return Vec::new();
        };
        records
            .iter()
            .filter_map(|r| r.as_str().map(str::to_owned))
            .collect()
    }

    /// Adds a record as the newest, keeping the newest [`KEPT`] runs (what is no run between
    /// them counts for nothing, up to [`SCANNED`] records in all).
    pub fn remember(&mut self, name: &str, record: String) {
        let mut records = self.history(name);
        records.push(record);
        let mut runs = 0;
        let mut keep = 0;
        for record in records.iter().rev().take(SCANNED) {
            if runs == KEPT {
                break;
            }
            keep += 1;
            runs += usize::from(Run::from_line(record).is_some());
        }
        records.drain(..records.len() - keep);
        let records = records.into_iter().map(Value::String).collect();
        self.set("history", name, Some(Value::Array(records)));
    }
}
