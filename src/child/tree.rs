//! The job's processes, from `/proc`: every descendant of `locked-run` still in the job's
//! session (a process that called `setsid` is let go), and their groups and states.

use nix::unistd::Pid;

/// A process of the job, from /proc.
#[derive(Clone, Copy, Debug)]
pub struct Process {
    pub pid: Pid,
    pub pgid: Pid,
    pub zombie: bool,
    /// A nested `locked-run`'s watcher (named as one, and blocking every signal it can):
    /// waited for, never killed (see [`Process::killable`]).
    pub watcher: bool,
}

impl Process {
    /// Whether a kill of the job is sent to this process. A `locked-run` the job runs itself
    /// puts its own job in a session of its own, out of reach of our kills; should that
    /// `locked-run` die of our SIGKILL, its watcher is what kills its job, so the watcher is
    /// left to do so (it blocks every other signal anyway) and waited for like the rest.
    pub fn killable(&self) -> bool {
        !self.zombie && !self.watcher
    }
}

/// Our descendants in `session` (the job's): the job, and what it left behind. A process that
/// called `setsid` (a daemon meant to outlive the job) is let go, and so are its children, which
/// are in its new session; but the walk goes on below it, since a process that moved to a new
/// session leaves behind, in the job's, the children it had already forked. As a subreaper we
/// are the ancestor of every process of the job's session, orphans included.
pub fn job_processes(session: Option<Pid>) -> Vec<Process> {
    let me = nix::unistd::getpid();
    let mut job = Vec::new();
    let watcher = crate::watcher::running();
    let mut frontier: Vec<Pid> = children(me)
        .into_iter()
        .filter(|&pid| Some(pid) != watcher)
        .collect();
    while let Some(pid) = frontier.pop() {
        let Some((process, _, sid)) = stat(pid) else {
            continue;
        };
        if sid == session {
            job.push(process);
        }
        if !process.zombie {
            frontier.extend(children(pid));
        }
    }
    job
}

/// "1234 (sleep), 1240 (backupd)": the job's live processes, for the line that says what the
/// sweep stops.
pub fn describe(processes: &[Process]) -> String {
    let named: Vec<String> = processes
        .iter()
        .filter(|p| !p.zombie)
        .map(|p| {
            let comm = std::fs::read_to_string(format!("/proc/{}/comm", p.pid)).unwrap_or_default();
            match comm.trim() {
                "" => p.pid.to_string(),
                name => format!("{} ({name})", p.pid),
            }
        })
        .collect();
    named.join(", ")
}

/// The children of `pid`, from `/proc/PID/task/*/children` (one file per thread: orphans are
/// re-parented to whichever of our threads).
fn children(pid: Pid) -> Vec<Pid> {
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => found.extend(
                list.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .map(Pid::from_raw),
            ),
            // A kernel without CONFIG_PROC_CHILDREN: find them by their parent instead.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return children_by_scan(pid),
            Err(_) => {}
        }
    }
    found
}

fn children_by_scan(parent: Pid) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .map(Pid::from_raw)
        .filter(|&pid| stat(pid).is_some_and(|(_, p, _)| p == parent))
        .collect()
}

/// A process's parent, group, session and zombie state.
fn stat(pid: Pid) -> Option<(Process, Pid, Option<Pid>)> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: parse after the last ')'.
    let close = stat.iter().rposition(|&b| b == b')')?;
    let open = stat.iter().position(|&b| b == b'(')?;
    let named = stat.get(open + 1..close) == Some(crate::watcher::NAME.to_bytes());
    let rest = String::from_utf8_lossy(&stat[close + 1..]);
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let mut number = || fields.next()?.parse::<i32>().ok().map(Pid::from_raw);
    let (parent, pgid, session) = (number()?, number()?, number()?);
    Some((
        Process {
            pid,
            pgid,
            zombie: (state == "Z" || state == "X") && !live_thread(pid),
            watcher: named && blocks_every_signal(pid),
        },
        parent,
        Some(session),
    ))
}

/// Whether a process whose first thread is a zombie still has a thread that runs: its main
/// thread called `pthread_exit` while others go on. Such a process is alive, and a kill of its
/// pid reaches every thread.
fn live_thread(pid: Pid) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|task| {
        std::fs::read(task.path().join("stat")).is_ok_and(|stat| {
            let state = stat
                .iter()
                .rposition(|&b| b == b')')
                .and_then(|close| stat.get(close + 2));
            !matches!(state, Some(b'Z' | b'X') | None)
        })
    })
}

/// Whether `pid` blocks every signal it can (all but SIGKILL and SIGSTOP), as a watcher does
/// from its first instruction: a name alone proves nothing (`locked-run-watchdog` is cut to a
/// watcher's by the kernel), and a watcher of another build of `locked-run` (one a package
/// upgrade put in place during a long job) runs another program file.
fn blocks_every_signal(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("SigBlk:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .is_some_and(crate::watcher::blocks_every_signal)
    })
}
