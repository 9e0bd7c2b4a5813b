//! A hostile local user in the metrics directory every run of a pass writes to (sticky and
//! writable by every user, as `/tmp` is): it holds a NAME's metrics lock for longer than a run
//! may wait for it, swaps the lock file for fresh files of its own in a loop, and puts a FIFO,
//! a link to `/dev/zero`, a sparse file of gigabytes or a megabyte of another program's samples
//! where the file goes (where there is none: the harness, as root, removes the runs' file first,
//! as a cleaning job would). The checks: no wrapper held up past its command's end beyond the
//! few seconds a run waits for that lock; and every NAME's counters add up to the runs that
//! wrote them since the last time the file was replaced, but for runs that said they could not
//! count (written without the lock, or not at all).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::backend::Fault;
use crate::client::Wrapper;
use crate::history::{History, Violation};
use crate::nemesis::FaultEvent;
use crate::plan::KILL_AFTER_MS;
use crate::rng::Rng;

/// The hostile user (nobody), played when the harness runs as root; else this user plays it.
const NOBODY: u32 = 65534;

/// How long a run waits for the metrics lock (src/metrics.rs's LOCK_WAIT).
const LOCK_WAIT_MS: u64 = 3000;

/// What an act's description says when it replaced the NAME's file: the counters start again.
const RESETS: &str = "[the file replaced]";

/// The metrics directory every run of a pass writes to (`LOCKED_RUN_METRICS_DIR`), shared
/// with the hostile user.
pub struct Neighbour {
    dir: tempfile::TempDir,
    names: Vec<&'static str>,
}

impl Neighbour {
    pub fn start(names: &[(&'static str, u32)]) -> Neighbour {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        Neighbour {
            dir,
            names: names.iter().map(|(n, _)| *n).collect(),
        }
    }

    pub fn metrics_dir(&self) -> &Path {
        self.dir.path()
    }

    /// One hostile act on one NAME's metrics files, drawn from `rng`; returns once it is over
    /// (a held lock: once let go). Says what it did, and [`RESETS`] when it replaced the file.
    pub fn act(&self, rng: &mut Rng) -> String {
        let name = self.names[rng.range(0, self.names.len() as u64 - 1) as usize];
        let (prom, lock) = (
            format!("locked_run_{name}.prom"),
            format!(".locked_run_{name}.lock"),
        );
        // Longer than a run waits for the lock (3 s) plus what its end may take besides: a run
        // that waited for as long as it is held would outlive its command past the bound.
        let hold = Duration::from_millis(rng.range(500, 12_000)).as_secs_f64();
        let junk = "i=0; while [ $i -lt 40000 ]; do echo \"locked_run_runs_total{a=\\\"$i\\\"} 1\"; \
                    i=$((i+1)); done";
        let (clear, script, resets) = match rng.weighted(&[25, 10, 10, 10, 10, 10, 10, 15]) {
            0 => (None, format!("exec flock -o {lock} sleep {hold}"), false),
            1 => (Some(&prom), format!("mkfifo {prom}"), true),
            2 => (Some(&prom), format!("ln -s /dev/zero {prom}"), true),
            3 => (Some(&prom), format!("truncate -s 2G {prom}"), true),
            4 => (
                Some(&prom),
                format!("{junk} > {prom}.new; mv {prom}.new {prom}"),
                true,
            ),
            5 => (
                Some(&lock),
                format!("mkfifo {lock}; sleep {hold}; rm -f {lock}"),
                false,
            ),
            6 => (
                Some(&lock),
                format!("ln -s /dev/zero {lock}; sleep {hold}; rm -f {lock}"),
                false,
            ),
            // Its own lock files, renamed over the path in a loop: runs that trusted them
            // would lock different files and lose counts without a word.
            _ => (
                Some(&lock),
                format!(
                    "end=$(($(date +%s) + {})); while [ $(date +%s) -lt $end ]; do \
                     : > {lock}.n; mv {lock}.n {lock}; done; rm -f {lock}",
                    hold.ceil() as u64
                ),
                false,
            ),
        };
        if let Some(file) = clear {
            // The runs' file is the runs' user's: the hostile user may not remove it here.
            let _ = std::fs::remove_file(self.dir.path().join(file));
        }
        let done = as_neighbour(self.dir.path(), &script);
        format!(
            "{name}: {script} ({}){}",
            if done { "done" } else { "failed" },
            if resets {
                format!(" {RESETS}")
            } else {
                String::new()
            }
        )
    }
}

/// Runs `script` with `sh` in `dir` as the hostile user (nobody, as root); whether it succeeded.
fn as_neighbour(dir: &Path, script: &str) -> bool {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("sh");
    cmd.args(["-c", script])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if crate::hostile::can_name_hosts() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    cmd.status().is_ok_and(|s| s.success())
}

/// How long after its command's end a wrapper may live, its metrics lock held by another
/// user: the few seconds it waits for that lock, the sweep of what its command left (a
/// settle, the kill signal, SIGKILL K later), the release, and a margin for two loaded cores.
const AFTER_COMMAND_MS: u64 = LOCK_WAIT_MS + 100 + KILL_AFTER_MS + 2500;

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
            .filter(|f| f.fault != Fault::Neighbour)
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

/// Whether `w` said it could not count its run with the others' (NAME `name`): written without
/// the lock (a run ending at the same moment may lose a count), not written, or started again.
fn said_it_could_not_count(w: &Wrapper, name: &str) -> bool {
    let text = std::fs::read_to_string(&w.stderr).unwrap_or_default();
    text.lines().any(|l| {
        l.contains(&format!(
            "the metrics of lock {name} are written without it"
        )) || l.contains(&format!("cannot write the metrics of lock {name}"))
            || l.contains(&format!("the metrics of lock {name} start again"))
    })
}

/// Whether `w` died of the SIGTERM it was sent before it had handlers for it: SIGTERM's
/// default action ended it as it started (within a few milliseconds of its spawn, before its
/// first lock attempt), so it neither ran nor ended by itself, and counted nothing. Its status
/// (-15) is also that of a run whose command the forwarded SIGTERM killed (`locked-run` then
/// ends itself by the command's signal, once counted); but such a run took the lock first, and
/// its log says so (an `acquired` line), while a SIGTERM that comes after the handlers are in
/// and before the lock is taken ends the wait with 143, never -15.
fn killed_at_its_start(w: &Wrapper) -> bool {
    if w.sent.map(|(sig, _)| sig) != Some(libc::SIGTERM) || w.status != -i64::from(libc::SIGTERM) {
        return false;
    }
    let text = std::fs::read_to_string(&w.stderr).unwrap_or_default();
    !text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .any(|l| l["lock"] == w.plan.name && l["event"] == "acquired")
}

/// `locked_run_runs_total`'s samples for NAME in its file, added up (all of them, wherever
/// in the file: a run that read only its first MiB lost the ones after); none when the file is
/// not a regular file of samples (the neighbour's last act left something else there, or a
/// sparse file of gigabytes).
fn counted(dir: &Path, name: &str) -> Option<f64> {
    let path = dir.join(format!("locked_run_{name}.prom"));
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() || meta.len() > 16 << 20 {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let prefix = format!("locked_run_runs_total{{name=\"{name}\",");
    Some(
        text.lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum(),
    )
}

/// Every NAME's counters add up to the runs that wrote them since the neighbour last replaced
/// its file: at least the runs spawned after that that ended by themselves (not SIGKILLed, not
/// hung, not killed by a SIGTERM as they started: [`killed_at_its_start`]), at most every run
/// that ended after it began. Fewer is a violation but for two counts for each of those runs
/// that said it could not count with the others (it wrote without the lock: a run ending beside
/// it may lose a count). The inner NAME of nested runs is left out: a nested run may be killed
/// with its outer run before it counts.
pub fn check_counts(
    h: &History,
    dir: &Path,
    faults: &[FaultEvent],
    nested: bool,
    out: &mut Vec<Violation>,
) {
    for (name, _) in &h.names {
        if nested && *name == "a" {
            continue;
        }
        let Some(sum) = counted(dir, name) else {
            continue;
        };
        let reset = faults
            .iter()
            .filter(|f| f.fault == Fault::Neighbour)
            .filter(|f| f.what.starts_with(&format!("{name}: ")) && f.what.contains(RESETS))
            .max_by_key(|f| f.ended);
        let (began, ended) = reset.map_or((0, 0), |f| (f.began, f.ended));
        let runs: Vec<&Wrapper> = h
            .wrappers
            .values()
            .filter(|w| w.plan.name == *name && w.ended > began)
            .collect();
        let whole = |w: &&&Wrapper| {
            w.spawned > ended
                && !w.hung
                && w.status != -9
                && w.sent.is_none_or(|(sig, _)| sig != libc::SIGKILL)
                && !killed_at_its_start(w)
        };
        let least = runs.iter().filter(whole).count() as f64;
        let most = runs.len() as f64;
        let said = runs
            .iter()
            .filter(|w| said_it_could_not_count(w, name))
            .count() as f64;
        let detail = format!(
            "{sum} runs counted; {least} to {most} ran and wrote since the file was last \
             replaced (at {:.3}s), {said} of them said they could not count with the others",
            began as f64 / 1e9
        );
        if sum > most || sum + 2.0 * said < least {
            out.push(Violation {
                invariant: "metrics counters do not add up to the runs",
                name: (*name).to_owned(),
                detail,
                excused: None,
            });
        } else if sum < least {
            out.push(Violation {
                invariant: "metrics counters do not add up to the runs",
                name: (*name).to_owned(),
                detail,
                excused: Some("runs that said they could not count".into()),
            });
        }
    }
}
