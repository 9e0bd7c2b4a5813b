//! Processes a test starts: the binary under test with no inherited settings, each under a
//! hard timeout, and waits on their evidence (an exit seen through a pidfd, a file's content).

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::cmd::lr;
use super::{BIN, path_str};

/// A hard limit for any single process a test starts.
pub const HARD_TIMEOUT: Duration = Duration::from_secs(60);

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid this test started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// A `locked-run` command with no inherited LOCKED_RUN_* settings.
pub fn locked_run() -> Command {
    without_our_settings(BIN)
}

/// `program` (`locked-run`, or a tracer that runs it) with no inherited LOCKED_RUN_* settings,
/// no REDISCLI_AUTH and no CI (a wait would say how it goes: tests that want it set it), its
/// stdin empty.
pub fn without_our_settings(program: &str) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("LOCKED_RUN") || key == "REDISCLI_AUTH" || key == "CI"
        {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null());
    // A test process started in the background of a script (`cargo test &`) has SIGINT and
    // SIGQUIT ignored, and would pass that on: the runs the tests make start with the
    // defaults, as from a terminal or a CI runner (a test that wants one ignored says so in a
    // hook of its own, which runs after this one).
    // SAFETY: signal(2) only, between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            for signal in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP, libc::SIGTERM] {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
}

/// What a finished process left.
#[derive(Debug)]
pub struct Output {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Output {
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// A started process whose output is collected in the background.
pub struct Running {
    pub child: Child,
    pub started: Instant,
    out: mpsc::Receiver<(bool, String)>,
}

pub fn spawn(mut cmd: Command) -> Running {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let (tx, rx) = mpsc::channel();
    for (is_err, mut pipe) in [
        (
            false,
            Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>,
        ),
        (true, Box::new(child.stderr.take().unwrap())),
    ] {
        let tx = tx.clone();
        thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            let _ = tx.send((is_err, text));
        });
    }
    Running {
        child,
        started: Instant::now(),
        out: rx,
    }
}

impl Running {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits for the exit (at most `timeout`, else the process is killed and the test fails).
    pub fn wait_for(mut self, timeout: Duration) -> Output {
        let status = wait_timeout(&mut self.child, timeout).unwrap_or_else(|| {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!(
                "process {} still running after {timeout:?}",
                self.child.id()
            );
        });
        let elapsed = self.started.elapsed();
        let (mut stdout, mut stderr) = (String::new(), String::new());
        for _ in 0..2 {
            match self.out.recv_timeout(Duration::from_secs(10)) {
                Ok((true, text)) => stderr = text,
                Ok((false, text)) => stdout = text,
                Err(_) => panic!(
                    "output pipes of {} still open 10s after its exit",
                    self.child.id()
                ),
            }
        }
        Output {
            status,
            stdout,
            stderr,
            elapsed,
        }
    }

    pub fn wait(self) -> Output {
        self.wait_for(HARD_TIMEOUT)
    }
}

/// A process a test started and did not wait for (the test failed first, say) is not left
/// running: SIGTERM (`locked-run` passes it on to its job and releases), SIGKILL 5 s later.
impl Drop for Running {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        signal(self.pid(), libc::SIGTERM);
        if wait_timeout(&mut self.child, Duration::from_secs(5)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs to completion under the hard timeout.
pub fn run(cmd: Command) -> Output {
    spawn(cmd).wait()
}

/// Runs `locked-run ARGS...` to completion (`lr().args(ARGS).run()`).
pub fn run_args(args: &[&str]) -> Output {
    lr().args(args).run()
}

/// Waits for `child` to exit, up to `timeout`, without polling: a pidfd becomes readable when
/// the process exits.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    if !wait_pid_exit(child.id() as i32, timeout) {
        return None;
    }
    Some(child.wait().expect("wait"))
}

/// Blocks until process `pid` (not necessarily our child) has exited, up to `timeout`; true if
/// it did. The instant this returns is the exit's evidence.
pub fn wait_pid_exit(pid: i32, timeout: Duration) -> bool {
    // SAFETY: pidfd_open(2) returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return true; // already gone (and reaped)
    }
    // SAFETY: fd is a fresh descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n > 0 {
            return true;
        }
        if n == 0 {
            return false;
        }
    }
}

/// Waits until `path` holds content for which `ready` is true, re-reading it every few ms, up
/// to `timeout`: the file is the child's own evidence of where it is.
pub fn wait_for_file(path: &Path, timeout: Duration, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if ready(&text) {
                return text;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} not ready after {timeout:?}",
            path.display()
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until a condition on Redis (or anything else) holds, re-checking every few ms.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ready() {
        assert!(
            Instant::now() < deadline,
            "{what}: not true after {timeout:?}"
        );
        thread::sleep(Duration::from_millis(5));
    }
}

/// Whether a process exists (a zombie counts as gone).
pub fn alive(pid: i32) -> bool {
    let running = |stat: &str| {
        let state = stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start().chars().next());
        !matches!(state, Some(Some('Z')) | Some(Some('X')))
    };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) if running(&stat) => true,
        // A zombie first thread whose process lives on in another (`pthread_exit` in main).
        Ok(_) => std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
            tasks.flatten().any(|task| {
                std::fs::read_to_string(task.path().join("stat")).is_ok_and(|s| running(&s))
            })
        }),
        Err(_) => false,
    }
}

/// Starts `locked-run -u URL EXTRA job sh -c '<record pid> ; CHILD'` and returns it with the
/// pid of its child (the shell, which `exec`s into whatever CHILD runs last).
pub fn start_job(url: &str, dir: &Path, extra: &[&str], child: &str) -> (Running, i32) {
    let pid_file = dir.join("pid");
    let running = lr()
        .url(url)
        .args(extra)
        .name("job")
        .sh(&format!(
            "echo $$ > {p}.tmp; mv {p}.tmp {p}; {child}",
            p = path_str(&pid_file)
        ))
        .spawn();
    let pid = wait_for_file(&pid_file, Duration::from_secs(10), |t| t.ends_with('\n'))
        .trim()
        .parse()
        .unwrap();
    (running, pid)
}

/// A process of this user's holding an exclusive flock on `path` (made if missing) until it is
/// killed; returns once the kernel lists the lock. (flock(1) would leave its command holding
/// the lock too.)
pub fn holding_flock(path: &Path) -> Running {
    let mut holding = without_our_settings("perl");
    holding
        .args([
            "-e",
            "open(F, '>>', $ARGV[0]) or die; flock(F, 2) or die; sleep 60",
        ])
        .arg(path);
    let held = spawn(holding);
    wait_until("the lock is taken", Duration::from_secs(10), || {
        std::fs::read_to_string("/proc/locks")
            .is_ok_and(|l| l.contains(&format!(" {} ", held.pid())))
    });
    held
}

/// Whether process `pid` has a file whose name ends with `name` open (a descriptor in /proc).
pub fn has_open(pid: i32, name: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.ends_with(name)))
    })
}

/// Whether process `pid`'s main thread is asleep in nanosleep or clock_nanosleep (a timed
/// sleep, not a wait on a descriptor).
pub fn asleep(pid: i32) -> bool {
    let call = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
    let number: i64 = call
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1);
    number == libc::SYS_nanosleep || number == libc::SYS_clock_nanosleep
}
