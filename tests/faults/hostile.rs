//! What other users and other hosts may write where the runs look, as a nemesis of its own
//! (the metrics directory's hostile user is `neighbour.rs`'s, the `file://` lock directory's
//! `files.rs`'s): another user of a lock writing junk into its history on every backend
//! (records of a megabyte, lines that are no record or end in none, records whose host name
//! is escape sequences or whose fence is past `i64::MAX`) or a `since` past year 9999 into its
//! holder's metadata, and runs on hosts with hostile names (a UTS namespace of their own, as
//! root). The checks: no raw control character in what `status` and `history` print, nor in
//! what the wrappers themselves said on stderr; no crash (status 101) of `status` or
//! `history`; and no run missing from its NAME's history while runs before it are there,
//! while the pass runs and once it is over, when `history` must also still answer.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::backend::{Backend, Fault};
use crate::child::mono_ns;
use crate::history::{History, Violation};
use crate::rng::Rng;

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
    crate::support::hostile::can_name_hosts()
}

/// Makes `cmd` run in a UTS namespace of its own whose host name is `HOSTS[i]`.
pub fn on_host_named(cmd: &mut Command, i: usize) {
    crate::support::hostile::on_host_named(cmd, HOSTS[i % HOSTS.len()]);
}

/// What another user of a lock may write into its history (or its holder's metadata).
pub enum Junk {
    /// A record of 1 MB (larger than any reader takes).
    Huge(usize),
    /// A line that is no record.
    Malformed,
    /// A record that reads as one, whose host name is `HOSTS[i]` (and whose fence is 0, below
    /// every fence issued: it moves none).
    HostileHost(usize),
    /// A record whose fence (2^64 - 2) is past `i64::MAX`: no store's, and none to lift a
    /// fence to.
    HugeFence,
    /// The start of a record with no newline after it (`file://`: the next line appended must
    /// not end it).
    NoNewline,
}

impl Junk {
    pub fn draw(rng: &mut Rng) -> Junk {
        match rng.weighted(&[25, 15, 25, 20, 15]) {
            0 => Junk::Huge(1_000_000),
            1 => Junk::Malformed,
            2 => Junk::HostileHost(rng.range(0, HOSTS.len() as u64 - 1) as usize),
            3 => Junk::HugeFence,
            _ => Junk::NoNewline,
        }
    }

    /// The record, as a store keeps it; `token` tells it from every other.
    pub fn record(&self, token: &str) -> String {
        let run = |host: &str, fence: u64| {
            serde_json::json!({
                "host": host, "pid": 1, "user": "mallory", "fence": fence,
                "mode": "exclusive", "started_at": "2026-01-01T00:00:00.000Z",
                "ended_at": "2026-01-01T00:00:01.000Z", "waited_ms": 0, "status": 0,
                "ended": "exit", "token": token,
            })
            .to_string()
        };
        match self {
            Junk::Huge(n) => format!("{{\"host\":\"{}\",\"token\":\"{token}\"}}", "x".repeat(*n)),
            Junk::Malformed => format!("not a record {{ {token}"),
            Junk::HostileHost(i) => run(HOSTS[*i % HOSTS.len()], 0),
            Junk::HugeFence => run("mallory", u64::MAX - 1),
            Junk::NoNewline => format!("{{\"partial\":\"{token}\""),
        }
    }
}

/// A holder's `since` that no date can show (year 3170843), in ms since the epoch.
pub const FAR_SINCE_MS: u64 = 99_999_999_999_999_999;

/// Another user of a NAME of one holder writes a `since` past year 9999 into its holder's
/// metadata (which no date can show: `status`, `-n -v` and every waiter crashed on it).
pub fn plant_far_since(
    backend: &dyn Backend,
    names: &[(&'static str, u32)],
    rng: &mut Rng,
) -> String {
    let ones: Vec<&str> = names
        .iter()
        .filter(|(_, n)| *n == 1)
        .map(|(n, _)| *n)
        .collect();
    let name = ones[rng.range(0, ones.len() as u64 - 1) as usize];
    match backend.plant_far_since(name) {
        Ok(()) => format!("{name}: its holder's since set to {FAR_SINCE_MS} ms"),
        Err(e) => format!("{name}: its holder's since: not written ({e})"),
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
        Junk::HugeFence => "a record of fence 2^64 - 2".to_owned(),
        Junk::NoNewline => "a record cut short, with no newline".to_owned(),
    };
    match backend.plant_history(name, &junk, &token) {
        Ok(()) => format!("{name}: {what}"),
        Err(e) => format!("{name}: {what}: not written ({e})"),
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

/// What one `history --json` showed of NAME, and when it was asked (the monotonic clock): the
/// fences of its records, but for another user's junk (fence 0, or past `i64::MAX`).
pub struct Snapshot {
    pub name: String,
    pub at: u64,
    pub fences: Vec<u64>,
}

/// What `status` and `history` (text and JSON) print of NAME: raw control characters, a crash
/// (status 101: a `since` no date can show made them panic), and, with `settled` (everything
/// stopped, the servers healed), a `history` that did not answer. Also what `history --json`
/// showed, for [`check_history`].
fn read_out(
    bin: &str,
    url_args: &[String],
    name: &str,
    settled: bool,
) -> (Vec<Violation>, Option<Snapshot>) {
    let mut found = Vec::new();
    let mut snapshot = None;
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["history"],
        &["history", "--json", "--limit", "100"],
    ] {
        let at = mono_ns();
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
        if status == Some(101) || stderr.contains("panicked at") {
            found.push(Violation {
                invariant: "status or history crashed",
                name: name.to_owned(),
                detail: format!(
                    "`{}` ended {status:?}: {}",
                    args.join(" "),
                    stderr.chars().take(300).collect::<String>()
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
        if args.len() == 4 && status == Some(0) {
            let runs: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap_or_default();
            let fences = runs
                .iter()
                .filter_map(|r| r["fence"].as_u64())
                .filter(|&f| f > 0 && f <= i64::MAX as u64)
                .collect();
            snapshot = Some(Snapshot {
                name: name.to_owned(),
                at,
                fences,
            });
        }
    }
    (found, snapshot)
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
/// each output checked (see [`read_out`]); what `history --json` showed, kept.
pub fn reader(
    bin: &str,
    url_args: &[String],
    names: &[(&'static str, u32)],
    deadline: Instant,
) -> (Vec<Violation>, Vec<Snapshot>) {
    let mut found = Vec::new();
    let mut snapshots = Vec::new();
    let mut round = 0;
    while Instant::now() < deadline {
        let name = names[round % names.len()].0;
        round += 1;
        let (violations, snapshot) = read_out(bin, url_args, name, false);
        found.extend(violations);
        snapshots.extend(snapshot);
        std::thread::sleep(Duration::from_millis(700));
    }
    (found, snapshots)
}

/// Once everything stopped: every NAME's `status` and `history` print no raw control
/// character, and `history` answers (0 or 1), whatever junk its history holds.
pub fn settled(
    bin: &str,
    url_args: &[String],
    names: &[(&'static str, u32)],
) -> (Vec<Violation>, Vec<Snapshot>) {
    let mut found = Vec::new();
    let mut snapshots = Vec::new();
    for (name, _) in names {
        let (violations, snapshot) = read_out(bin, url_args, name, true);
        found.extend(violations);
        snapshots.extend(snapshot);
    }
    (found, snapshots)
}

/// No run is missing from its NAME's history while an older run is there: a run whose
/// command ended after the wrapper of the oldest run the history showed had ended (so its
/// record came after that run's, in the store's order), and whose own wrapper ended by itself
/// before `history --json` was asked, is in it. Runs that a fault of the store (or a restored
/// copy of the directory) overlapped may be missing: excused. (Another user's line cut short,
/// with no newline, swallowed the next run's record.)
pub fn check_history(h: &History, snapshots: &[Snapshot], out: &mut Vec<Violation>) {
    let ended_by_itself = |w: &crate::client::Wrapper| {
        !w.hung
            && !matches!(w.status, -9 | 69)
            && w.sent.is_none_or(|(sig, _)| sig != libc::SIGKILL)
    };
    for snap in snapshots {
        let Some(&oldest) = snap.fences.last() else {
            continue;
        };
        // When the oldest run shown was certainly done: its wrapper's end.
        let Some(since) = h
            .sections
            .values()
            .filter(|s| s.name == snap.name && s.fence == oldest)
            .filter_map(|s| h.wrapper_of(s.run))
            .map(|w| w.ended)
            .max()
        else {
            continue;
        };
        for s in h.sections.values() {
            if s.name != snap.name || History::is_inner(s.run) || snap.fences.contains(&s.fence) {
                continue;
            }
            let Some(w) = h.wrapper_of(s.run) else {
                continue;
            };
            let after = s.gone().is_some_and(|end| end > since);
            if !after || !ended_by_itself(w) || w.ended >= snap.at {
                continue;
            }
            let faults: Vec<String> = h
                .faults_during(s.start, snap.at)
                .into_iter()
                .filter(|f| {
                    !matches!(
                        f.fault,
                        Fault::Neighbour | Fault::HistoryJunk | Fault::FarSince
                    )
                })
                .map(|f| f.describe())
                .collect();
            out.push(Violation {
                invariant: "a run missing from its history while older runs are there",
                name: snap.name.clone(),
                detail: format!(
                    "run {} (fence {}, status {}) ended {:.3}s; `history` at {:.3}s shows fences \
                     {:?}",
                    s.run,
                    s.fence,
                    w.status,
                    w.ended as f64 / 1e9,
                    snap.at as f64 / 1e9,
                    snap.fences
                ),
                excused: faults.first().map(|f| format!("during a fault: {f}")),
            });
        }
    }
}

/// What the wrappers said on stderr (their own lines, and their commands', which say
/// nothing) has no raw control character, and no line a host name forged.
pub fn check_stderr(h: &History, out: &mut Vec<Violation>) {
    for w in h.wrappers.values() {
        let text =
            String::from_utf8_lossy(&std::fs::read(&w.stderr).unwrap_or_default()).into_owned();
        let raw = raw(&text);
        let forged = text
            .lines()
            .any(|l| l.starts_with("locked-run: error: FAKE"));
        if !raw.is_empty() || forged {
            out.push(Violation {
                invariant: "raw control characters in what a wrapper said",
                name: w.plan.name.to_owned(),
                detail: format!(
                    "run {}: {raw:?} in {:?}",
                    w.plan.run,
                    text.chars().take(600).collect::<String>()
                ),
                excused: None,
            });
        }
    }
}
