//! The `file://` backend of the harness: a directory of this host, sticky and writable by every
//! user as `/tmp` is, shared with another user (nobody, uid 65534) who is hostile. Before the
//! pass that user makes NAME `b`'s lock file (0666, its own); the nemesis then has it swap the
//! files of `b` it owns, again and again, for fresh ones, as an owner may in a sticky directory: a run
//! that trusted such a file could hold `b` beside another run that opened the new one. The
//! process faults apply as on every backend.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use crate::backend::{Backend, Fault};
use crate::hostile::Junk;
use crate::rng::Rng;

/// The hostile user.
const NOBODY: u32 = 65534;

pub struct Files {
    dir: tempfile::TempDir,
    /// Whether the hostile user could be played (the harness runs as root).
    hostile: bool,
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
        Files { dir, hostile }
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
            true => vec![(Fault::ForeignSwap, 4)],
            false => Vec::new(),
        }
    }

    fn servers(&self) -> usize {
        1
    }

    /// The hostile user renames every file of `b` it owns away and makes a fresh one in its
    /// place (a file of root's it may not rename: the sticky bit).
    fn inject(&self, _: Fault, _: usize, _: &mut Rng) -> String {
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

    /// A line appended to `DIR/NAME.history` by another writer of the directory.
    fn plant_history(&self, name: &str, junk: &Junk, token: &str) -> Result<(), String> {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join(format!("{name}.history")))
            .map_err(|e| e.to_string())?;
        writeln!(file, "{}", junk.record(token)).map_err(|e| e.to_string())
    }
}
