//! A client: a thread that runs real `locked-run` processes in a loop until the pass's deadline,
//! each as its seeded plan says, sends its wrapper the plan's process fault, and records the
//! wrapper's spawn and exit instants and status. Every wrapper has a hard timeout (killed and
//! recorded as hung past it) and is killed if the client is dropped before reaping it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::child::{mono_ns, status_number};
use crate::plan::{Plan, ProcFault};
use crate::rng::Rng;
use crate::support::{signal, wait_pid_exit};

/// Beyond its plan's bound, a wrapper is hung: killed, and a violation.
const HUNG_MARGIN: Duration = Duration::from_secs(20);
/// A client stops after this many runs, whatever the time left.
const MAX_RUNS: u64 = 5000;
/// The address space a wrapper (and what it starts) may take: far above what one needs, far
/// below the machine's memory.
const ADDRESS_SPACE: u64 = 2 << 30;

/// What every client of one pass shares.
pub struct Pass {
    pub bin: String,
    pub history: String,
    pub db: String,
    pub url_args: Vec<String>,
    pub scratch: PathBuf,
    pub deadline: Instant,
    pub names: Vec<(&'static str, u32)>,
    pub nested_mix: bool,
    /// strace is installed: runs drawn as held up are (see `Plan::held_ms`).
    pub strace: bool,
    /// The metrics directory every run writes to, shared with a hostile user (`hostile.rs`).
    pub metrics: PathBuf,
}

/// One wrapper, as the harness saw it.
#[derive(Clone, Debug)]
pub struct Wrapper {
    pub plan: Plan,
    pub pid: i32,
    pub spawned: u64,
    pub ended: u64,
    /// The exit code, or minus the signal that ended it.
    pub status: i64,
    /// The signal the client sent it, and when.
    pub sent: Option<(i32, u64)>,
    pub stopped_ms: u64,
    pub hung: bool,
    pub stderr: PathBuf,
    /// The wrapper's peak resident memory (and of what it reaped), in KiB.
    pub max_rss_kb: u64,
}

impl Wrapper {
    pub fn faulted(&self) -> bool {
        self.sent.is_some() || self.hung
    }

    /// The wrapper's last lines on stderr, for a violation's evidence.
    pub fn stderr_tail(&self) -> String {
        self.stderr_last(3)
    }

    /// The wrapper's last `n` lines on stderr.
    pub fn stderr_last(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join(" | ")
    }
}

/// A spawned wrapper, SIGKILLed and reaped if dropped while running.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            signal(self.0.id() as i32, libc::SIGCONT);
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Runs client `index`'s loop; returns its wrappers in order.
pub fn client(pass: &Pass, seed: u64, index: u64) -> Vec<Wrapper> {
    let mut rng = Rng::stream(seed, index + 1);
    let mut done = Vec::new();
    let mut seq = 0;
    while Instant::now() < pass.deadline && seq < MAX_RUNS {
        let run = (index + 1) * 1_000_000 + seq * 10;
        seq += 1;
        let plan = Plan::draw(&mut rng, run, &pass.names, pass.nested_mix);
        let wrapper = execute(pass, plan);
        if wrapper.status == 69 {
            std::thread::sleep(Duration::from_millis(wrapper.plan.backoff_ms));
        }
        done.push(wrapper);
    }
    done
}

fn execute(pass: &Pass, mut plan: Plan) -> Wrapper {
    let self_exe = std::env::current_exe().unwrap().display().to_string();
    let stderr = pass.scratch.join(format!("stderr.{}", plan.run));
    if !pass.strace {
        plan.held_ms = None;
    }
    // Without -f only the wrapper's main thread is traced: its prctl(PR_SET_CHILD_SUBREAPER)
    // is the one held up; strace exits with the wrapper's status.
    let mut cmd = match plan.held_ms {
        Some(ms) => {
            let mut strace = Command::new("strace");
            strace
                .args(["-qq", "-o", "/dev/null", "-e", "trace=prctl", "-e"])
                .arg(format!("inject=prctl:delay_enter={}", ms * 1000))
                .arg(&pass.bin);
            strace
        }
        None => Command::new(&pass.bin),
    };
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKED_RUN") || key == "REDISCLI_AUTH" || key == "CI"
        {
            cmd.env_remove(key);
        }
    }
    // Every run (and nested run) writes its metrics where the hostile user lurks.
    cmd.env("LOCKED_RUN_METRICS_DIR", &pass.metrics);
    // A wrapper that reads without bound (a build before issue 43's, say, reading a link to
    // /dev/zero) fails an allocation here rather than take the machine's memory from the
    // other passes: the memory check still sees it pass its own bound.
    crate::support::hostile::cap_address_space(&mut cmd, ADDRESS_SPACE);
    if let (Some(i), true) = (plan.hostile_host, crate::hostile::can_name_hosts()) {
        crate::hostile::on_host_named(&mut cmd, i);
    }
    cmd.args(&pass.url_args)
        .args(plan.wrapper_args())
        .arg(&self_exe)
        .args(plan.child_args(&pass.history, &pass.db, &pass.bin, &pass.url_args))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap());
    let spawned = mono_ns();
    let started = Instant::now();
    let child = Spawned(cmd.spawn().expect("spawn locked-run"));
    let pid = child.0.id() as i32;
    let hard = Duration::from_millis(plan.bound_ms()) + HUNG_MARGIN;
    let (mut sent, mut stopped_ms) = (None, plan.held_ms.unwrap_or(0));
    let (sig, after) = match plan.fault {
        ProcFault::None => (0, 0),
        ProcFault::Kill { after } => (libc::SIGKILL, after),
        ProcFault::Term { after } => (libc::SIGTERM, after),
        ProcFault::Stop { after, .. } => (libc::SIGSTOP, after),
    };
    // The pid is ours and not yet reaped, so it cannot name another process.
    if sig != 0 && !wait_pid_exit(pid, Duration::from_millis(after)) {
        sent = Some((sig, mono_ns()));
        signal(pid, sig);
        if let ProcFault::Stop { for_, .. } = plan.fault {
            std::thread::sleep(Duration::from_millis(for_));
            signal(pid, libc::SIGCONT);
            stopped_ms = for_;
        }
    }
    let left = hard.saturating_sub(started.elapsed());
    let hung = !wait_pid_exit(pid, left);
    if hung {
        // Under strace the wrapper is strace's child: killed first, or it would outlive its
        // tracer, hung for ever.
        if plan.held_ms.is_some() {
            for traced in children(pid) {
                signal(traced, libc::SIGKILL);
            }
        }
        signal(pid, libc::SIGKILL);
    }
    let ended = mono_ns();
    let (status, max_rss_kb) = reap(pid);
    // Reaped: its pid may be another's from now on, which the guard's drop must not touch.
    std::mem::forget(child);
    let status = status_number(status);
    Wrapper {
        plan,
        pid,
        spawned,
        ended,
        status,
        sent,
        stopped_ms,
        hung,
        stderr,
        max_rss_kb,
    }
}

/// The children of process `pid`, as its threads list them in /proc.
fn children(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// Reaps our child `pid` (it has exited), with its status and peak resident memory in KiB.
fn reap(pid: i32) -> (std::process::ExitStatus, u64) {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    // SAFETY: rusage is plain data, filled by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: wait4 on our own child with valid pointers.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            return (
                std::process::ExitStatus::from_raw(status),
                usage.ru_maxrss.max(0) as u64,
            );
        }
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EINTR), "wait4 {pid}: {e}");
    }
}
