//! The `file://` backend of the harness: a directory of this host, sticky and writable by every
//! user as `/tmp` is, shared with another user (nobody, uid 65534) who is hostile. Before the
//! pass that user makes NAME `b`'s lock file (0666, its own); the nemesis then has it swap the
//! files of `b` it owns, again and again, for fresh ones, as an owner may in a sticky directory: a run
//! that trusted such a file could hold `b` beside another run that opened the new one. The
//! nemesis also copies the directory's counters and histories (`cp -a`) and later restores the
//! copy over them, the same copy three times before it takes another, as an operator restoring
//! a backup would: a fence issued since the copy must never be issued again. The process
//! faults apply as on every backend.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use crate::backend::{Backend, Fault};
use crate::hostile::Junk;
use crate::rng::Rng;

/// The hostile user.
const NOBODY: u32 = 65534;

pub struct Files {
    dir: tempfile::TempDir,
    /// Whether the hostile user could be played (the harness runs as root).
    hostile: bool,
    /// Where the copy of the counters and histories is kept, and how often it was restored.
    backup: tempfile::TempDir,
    restored: Mutex<Option<u32>>,
}

impl Files {
    pub fn start() -> Files {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: geteuid has no preconditions.
        let hostile = unsafe { libc::geteuid() } == 0;
        if hostile {
            chmod(dir.path(), 0o1777);
            as_nobody(dir.path(), "umask 0; : > b.lock");
        }
        Files {
            dir,
            hostile,
            backup: tempfile::tempdir().unwrap(),
            restored: Mutex::new(None),
        }
    }

    /// Copies the counters and histories (`cp -a`: contents, owners, extended attributes),
    /// or restores the copy over them: in place (the same inodes) or anew (removed first).
    /// The lock files stay: a run holding one must keep it.
    fn copy_or_restore(&self, rng: &mut Rng) -> String {
        let mut restored = self.restored.lock().unwrap();
        let (dir, backup) = (self.dir.path().display(), self.backup.path().display());
        let files = "ls | grep -E '\\.(fence|history)$'";
        let (script, what) = match *restored {
            Some(n) if n < 3 => {
                let anew = rng.chance(50);
                *restored = Some(n + 1);
                let script = match anew {
                    true => format!(
                        "cd {backup} && for f in $({files}); do rm -f {dir}/$f; cp -a $f {dir}/$f; done"
                    ),
                    false => {
                        format!("cd {backup} && for f in $({files}); do cp -a $f {dir}/$f; done")
                    }
                };
                (
                    script,
                    format!(
                        "restored ({}, time {})",
                        if anew { "anew" } else { "in place" },
                        n + 1
                    ),
                )
            }
            _ => {
                *restored = Some(0);
                (
                    format!(
                        "rm -f {backup}/*; cd {dir} && for f in $({files}); do cp -a $f {backup}/$f; done"
                    ),
                    "copied".to_owned(),
                )
            }
        };
        let done = Command::new("sh")
            .args(["-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        format!("{what}: {}", if done { "done" } else { "failed" })
    }
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `script` with `sh` in `dir` as the hostile user; what it says goes nowhere.
fn as_nobody(dir: &Path, script: &str) -> bool {
    Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Backend for Files {
    fn label(&self) -> &'static str {
        "file"
    }

    fn url_args(&self) -> Vec<String> {
        vec!["-u".into(), format!("file://{}", self.dir.path().display())]
    }

    fn holders_ok(&self) -> bool {
        true
    }

    fn fair_order(&self) -> bool {
        // Waiters queue in arrival order (src/file/queue.rs), both modes alike.
        true
    }

    fn faults(&self) -> Vec<(Fault, u64)> {
        match self.hostile {
            true => vec![(Fault::ForeignSwap, 4), (Fault::Restore, 8)],
            false => vec![(Fault::Restore, 8)],
        }
    }

    fn servers(&self) -> usize {
        1
    }

    /// The hostile user renames every file of `b` it owns away and makes a fresh one in its
    /// place (a file of root's it may not rename: the sticky bit); or a copy of the counters
    /// and histories is made, or restored.
    fn inject(&self, fault: Fault, _: usize, rng: &mut Rng) -> String {
        if fault == Fault::Restore {
            return self.copy_or_restore(rng);
        }
        let swapped = as_nobody(
            self.dir.path(),
            "umask 0; n=0; for f in b.lock b.fence; do \
             [ -O \"$f\" ] && mv \"$f\" \"$f.old.$$\" && : > \"$f\" && n=$((n+1)); done; \
             rm -f b.*.old.*; [ $n -gt 0 ]",
        );
        format!("swapped: {swapped}")
    }

    fn heal(&self) {}

    /// Every lock file (`NAME.lock`, slots `NAME.lock.I`) must be free: `flock -n` takes it.
    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for entry in std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_lock = name.ends_with(".lock")
                || name
                    .rsplit_once(".lock.")
                    .is_some_and(|(_, i)| i.chars().all(|c| c.is_ascii_digit()));
            if !is_lock {
                continue;
            }
            let free = Command::new("flock")
                .args(["-n", "-x"])
                .arg(entry.path())
                .arg("true")
                .status()
                .is_ok_and(|s| s.success());
            if !free {
                left.push(format!("{name} still locked (flock -n failed)"));
            }
        }
        left
    }

    /// A line appended to `DIR/NAME.history` by another writer of the directory (one cut
    /// short: with no newline).
    fn plant_history(&self, name: &str, junk: &Junk, token: &str) -> Result<(), String> {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join(format!("{name}.history")))
            .map_err(|e| e.to_string())?;
        let end = match junk {
            Junk::NoNewline => "",
            _ => "\n",
        };
        write!(file, "{}{end}", junk.record(token)).map_err(|e| e.to_string())
    }

    /// A `since_ms=` line after the holder's lines of `NAME.lock` (the last one read counts),
    /// while a run holds it: the next holder writes the file afresh.
    fn plant_far_since(&self, name: &str) -> Result<(), String> {
        use std::io::Write as _;
        let path = self.dir.path().join(format!("{name}.lock"));
        let held = std::fs::metadata(&path).is_ok_and(|m| m.len() > 0);
        if !held {
            return Ok(());
        }
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| e.to_string())?;
        writeln!(file, "since_ms={}", crate::hostile::FAR_SINCE_MS).map_err(|e| e.to_string())
    }
}
