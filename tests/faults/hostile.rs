//! What other users and other hosts may write where the runs look, as a nemesis of its own:
//! a hostile local user beside the files the runs use (the metrics directory every run
//! writes to, where it holds a NAME's metrics lock for seconds or swaps its files for a FIFO,
//! a link to `/dev/zero` or a sparse file of gigabytes; the `file://` lock directory's own
//! hostile user is `files.rs`'s), another user of a lock writing junk into its history on
//! every backend (records of a megabyte, lines that are no record, records whose host name is
//! escape sequences), and runs on hosts with hostile names (a UTS namespace of their own, as
//! root). The checks: no wrapper held up past its command's end beyond the metrics lock's few
//! seconds, and no raw control character in what `status` and `history` print, while the
//! pass runs and once it is over, when `history` must also still answer.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::history::{History, Violation};
use crate::plan::KILL_AFTER_MS;
use crate::rng::Rng;

/// The hostile user (nobody), played when the harness runs as root; else this user plays it.
const NOBODY: u32 = 65534;

/// Host names a run may have (each at most 64 bytes): a window title set and a line erased
/// with a forged history row written over it, CSI as the C1 control U+009B, a newline that
/// forges a `locked-run:` line, and a bidirectional override.
pub const HOSTS: [&str; 4] = [
    "w\u{1b}]0;PWNED\u{7}\u{1b}[2K\r2026-01-01  exit 0  fence 999",
    "c1\u{9b}31mred\u{9b}0m\u{7f}",
    "web-1\nlocked-run: error: FAKE",
    "\u{202e}1-bew",
];

/// Whether the harness can give a run a host name of its own (a UTS namespace needs root).
pub fn can_name_hosts() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Makes `cmd` run in a UTS namespace of its own whose host name is `HOSTS[i]`.
pub fn on_host_named(cmd: &mut Command, i: usize) {
    let name = HOSTS[i % HOSTS.len()];
    // SAFETY: unshare(2) and sethostname(2) only, both async-signal-safe, between fork and
    // exec; `name` is static.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWUTS) != 0
                || libc::sethostname(name.as_ptr().cast(), name.len()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The metrics directory every run of a pass writes to (`LOCKED_RUN_METRICS_DIR`), shared
/// with the hostile user: writable by all and not sticky, so that user may replace any file
/// in it at any time.
pub struct Neighbour {
    dir: tempfile::TempDir,
    names: Vec<&'static str>,
}

impl Neighbour {
    pub fn start(names: &[(&'static str, u32)]) -> Neighbour {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        Neighbour {
            dir,
            names: names.iter().map(|(n, _)| *n).collect(),
        }
    }

    pub fn metrics_dir(&self) -> &Path {
        self.dir.path()
    }

    /// One hostile act on one NAME's metrics files, drawn from `rng`; returns once it is over
    /// (a held lock: once let go). Says what it did.
    pub fn act(&self, rng: &mut Rng) -> String {
        let name = self.names[rng.range(0, self.names.len() as u64 - 1) as usize];
        let (prom, lock) = (
            format!("locked_run_{name}.prom"),
            format!(".locked_run_{name}.lock"),
        );
        let hold = Duration::from_millis(rng.range(500, 6000));
        let script = match rng.weighted(&[30, 15, 15, 10, 15, 15]) {
            0 => format!("exec flock -o {lock} sleep {}", hold.as_secs_f64()),
            1 => format!("rm -f {prom}; mkfifo {prom}"),
            2 => format!("rm -f {prom}; ln -s /dev/zero {prom}"),
            3 => format!("rm -f {prom}; truncate -s 2G {prom}"),
            4 => format!(
                "rm -f {lock}; mkfifo {lock}; sleep {}; rm -f {lock}",
                hold.as_secs_f64()
            ),
            _ => format!(
                "rm -f {lock}; ln -s /dev/zero {lock}; sleep {}; rm -f {lock}",
                hold.as_secs_f64()
            ),
        };
        let done = as_neighbour(self.dir.path(), &script);
        format!(
            "{name}: {script} ({})",
            if done { "done" } else { "failed" }
        )
    }
}

/// Runs `script` with `sh` in `dir` as the hostile user (nobody, as root); whether it succeeded.
fn as_neighbour(dir: &Path, script: &str) -> bool {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if can_name_hosts() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    cmd.status().is_ok_and(|s| s.success())
}

/// What another user of a lock may write into its history.
pub enum Junk {
    /// A record of 1 MB (larger than any reader takes).
    Huge(usize),
    /// A line that is no record.
    Malformed,
    /// A record that reads as one, whose host name is `HOSTS[i]` (and whose fence is 0, below
    /// every fence issued: it moves none).
    HostileHost(usize),
}

impl Junk {
    pub fn draw(rng: &mut Rng) -> Junk {
        match rng.weighted(&[40, 20, 40]) {
            0 => Junk::Huge(1_000_000),
            1 => Junk::Malformed,
            _ => Junk::HostileHost(rng.range(0, HOSTS.len() as u64 - 1) as usize),
        }
    }

    /// The record, as a store keeps it; `token` tells it from every other.
    pub fn record(&self, token: &str) -> String {
        match self {
            Junk::Huge(n) => format!("{{\"host\":\"{}\",\"token\":\"{token}\"}}", "x".repeat(*n)),
            Junk::Malformed => format!("not a record {{ {token}"),
            Junk::HostileHost(i) => serde_json::json!({
                "host": HOSTS[*i % HOSTS.len()], "pid": 1, "user": "mallory", "fence": 0,
                "mode": "exclusive", "started_at": "2026-01-01T00:00:00.000Z",
                "ended_at": "2026-01-01T00:00:01.000Z", "waited_ms": 0, "status": 0,
                "ended": "exit", "token": token,
            })
            .to_string(),
        }
    }
}

/// Another user of NAME writes junk into its history, through the backend's own store.
pub fn plant_junk(backend: &dyn Backend, names: &[(&'static str, u32)], rng: &mut Rng) -> String {
    let name = names[rng.range(0, names.len() as u64 - 1) as usize].0;
    let junk = Junk::draw(rng);
    let token = format!("junk-{}", rng.next_u64());
    let what = match &junk {
        Junk::Huge(n) => format!("a record of {n} bytes"),
        Junk::Malformed => "a line that is no record".to_owned(),
        Junk::HostileHost(i) => format!("a record from host {:?}", HOSTS[*i]),
    };
    match backend.plant_history(name, &junk, &token) {
        Ok(()) => format!("{name}: {what}"),
        Err(e) => format!("{name}: {what}: not written ({e})"),
    }
}

/// How long after its command's end a wrapper may live, its metrics lock held by another
/// user: the few seconds it waits for that lock (3 s), the sweep of what its command left
/// (a settle, the kill signal, SIGKILL K later), the release, and a margin for two loaded
/// cores.
const AFTER_COMMAND_MS: u64 = 3000 + 100 + KILL_AFTER_MS + 2500;

/// No wrapper outlived its command by more than [`AFTER_COMMAND_MS`] (and its own SIGSTOP),
/// unless a fault of the servers or the network overlapped its end (a release that retried):
/// nothing the neighbour planted in the metrics directory may hold a run up.
pub fn check_ends(h: &History, out: &mut Vec<Violation>) {
    for w in h.wrappers.values() {
        let Some(s) = h.sections.get(&w.plan.run) else {
            continue;
        };
        let Some(end) = s.gone() else { continue };
        if w.faulted() {
            continue;
        }
        let lag = w.ended.saturating_sub(end);
        if lag <= (AFTER_COMMAND_MS + w.stopped_ms) * 1_000_000 {
            continue;
        }
        let faults: Vec<String> = h
            .faults_during(end, w.ended)
            .into_iter()
            .filter(|f| f.fault != crate::backend::Fault::Neighbour)
            .map(|f| f.describe())
            .collect();
        out.push(Violation {
            invariant: "a wrapper outlived its command's end by more than a few seconds",
            name: w.plan.name.to_owned(),
            detail: format!(
                "run {} (pid {}, status {}) ended {:.3}s after its command; stderr: {}",
                w.plan.run,
                w.pid,
                w.status,
                lag as f64 / 1e9,
                w.stderr_last(4)
            ),
            excused: faults.first().map(|f| format!("during a fault: {f}")),
        });
    }
}

/// The characters of `text` a terminal would act on: every control character but the newline
/// that ends a line, and the bidirectional overrides.
fn raw(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

/// What `status` and `history` (text and JSON) print of NAME: raw control characters, and, with
/// `settled` (everything stopped, the servers healed), a `history` that did not answer.
fn read_out(bin: &str, url_args: &[String], name: &str, settled: bool) -> Vec<Violation> {
    let mut found = Vec::new();
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["history"],
        &["history", "--json"],
    ] {
        let Some((status, stdout, stderr)) = output(bin, url_args, args, name) else {
            continue;
        };
        let raw: Vec<char> = [raw(&stdout), raw(&stderr)].concat();
        if !raw.is_empty() {
            found.push(Violation {
                invariant: "raw control characters in what status or history printed",
                name: name.to_owned(),
                detail: format!(
                    "`{}` printed {raw:?}: {stdout:?} {stderr:?}",
                    args.join(" ")
                ),
                excused: None,
            });
        }
        let failed = args[0] == "history" && !matches!(status, Some(0 | 1));
        if settled && failed {
            found.push(Violation {
                invariant: "history unreadable once everything stopped",
                name: name.to_owned(),
                detail: format!("`{}` ended {status:?}: {stderr:?}", args.join(" ")),
                excused: None,
            });
        }
    }
    found
}

/// `locked-run ARGS ... NAME` under a hard timeout of 10 s: its status and outputs.
fn output(
    bin: &str,
    url_args: &[String],
    args: &[&str],
    name: &str,
) -> Option<(Option<i32>, String, String)> {
    let mut cmd = Command::new(bin);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKED_RUN") {
            cmd.env_remove(key);
        }
    }
    let child = cmd
        .args(args)
        .args(["--connect-timeout", "1s"])
        .args(url_args)
        .arg(name)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let pid = child.id() as i32;
    if !crate::support::wait_pid_exit(pid, Duration::from_secs(10)) {
        crate::support::signal(pid, libc::SIGKILL);
    }
    let out = child.wait_with_output().ok()?;
    Some((
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// While the pass runs: every NAME's `status` and `history` read in turn, about once a second,
/// each output checked for raw control characters.
pub fn reader(
    bin: &str,
    url_args: &[String],
    names: &[(&'static str, u32)],
    deadline: Instant,
) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut round = 0;
    while Instant::now() < deadline {
        let name = names[round % names.len()].0;
        round += 1;
        found.extend(read_out(bin, url_args, name, false));
        std::thread::sleep(Duration::from_millis(700));
    }
    found
}

/// Once everything stopped: every NAME's `status` and `history` print no raw control
/// character, and `history` answers (0 or 1), whatever junk its history holds.
pub fn settled(bin: &str, url_args: &[String], names: &[(&'static str, u32)]) -> Vec<Violation> {
    names
        .iter()
        .flat_map(|(name, _)| read_out(bin, url_args, name, true))
        .collect()
}
