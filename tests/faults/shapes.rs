//! The job's other shapes: a process the recording child starts beside itself that leaves its
//! process group the ways real jobs' processes do (under coreutils `timeout`, from a `set -m`
//! shell, by calling `setpgid` itself, in a group of its own with its main thread ended while
//! another runs on, or named as a nested run's watcher is), or the job's session (`setsid`: a
//! daemon meant to live). The process is the test binary again (`--fault-grandchild`), which records `gstart`,
//! `gend` or `gterm`, and, through an observer of its own, `gdead`, like the command itself; the
//! checker holds it to the command's rules (nothing of a job alive beside the next holder's
//! command, nothing alive once its wrapper ended) unless it is a daemon, which must end by
//! itself.
//!
//! argv: `--fault-grandchild HISTORY RUN NAME FENCE MODE SLEEP_MS`, MODE `plain`, `setpgid`,
//! `leaderless`, `named` or `daemon`.

use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use crate::child::{fork_observer, install_handlers, mono_ns, open_history, record};

/// Starts the process of `shape` (a [`crate::plan::Shape`] by name) for the command `ident`
/// ("RUN NAME FENCE"), not waited for: what outlives the command is left behind for the sweep.
pub fn start(shape: &str, sleep_ms: &str, history: &str, ident: &str) {
    let exe = std::env::current_exe().unwrap();
    let mut parts = ident.split(' ');
    let (run, name, fence) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let grandchild = |mode: &str| -> Vec<String> {
        [
            exe.display().to_string(),
            "--fault-grandchild".into(),
            history.into(),
            run.into(),
            name.into(),
            fence.into(),
            mode.into(),
            sleep_ms.into(),
        ]
        .to_vec()
    };
    let mut cmd = match shape {
        "Timeout" => {
            let mut cmd = Command::new("timeout");
            cmd.arg("60").args(grandchild("plain"));
            cmd
        }
        "SetM" => {
            let mut cmd = Command::new("bash");
            cmd.args(["-c", "set -m; \"$@\" & wait", "bash"])
                .args(grandchild("plain"));
            cmd
        }
        "SetPgid" | "Leaderless" | "Named" => {
            let argv = grandchild(&shape.to_lowercase());
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..]);
            cmd
        }
        "Daemon" => {
            let argv = grandchild("daemon");
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..]);
            cmd
        }
        other => panic!("unknown shape {other}"),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Not waited for: a process the command leaves behind is the job's to sweep.
    let _ = cmd.spawn();
}

/// The grandchild's main: see the file's header for argv.
pub fn main(args: &[String]) -> ExitCode {
    let (history, mode) = (&args[0], args[4].as_str());
    let ident = format!("{} {} {}", args[1], args[2], args[3]);
    let sleep_ms: u64 = args[5].parse().unwrap();
    // SAFETY: plain system calls on this process.
    let left = unsafe {
        match mode {
            "setpgid" => libc::setpgid(0, 0) == 0,
            "leaderless" => libc::setpgid(0, 0) == 0,
            "named" => {
                libc::setpgid(0, 0) == 0
                    && libc::prctl(libc::PR_SET_NAME, c"locked-run-watc".as_ptr(), 0, 0, 0) == 0
            }
            "daemon" => libc::setsid() > 0,
            _ => true,
        }
    };
    if !left {
        return ExitCode::FAILURE;
    }
    let fd = open_history(history);
    let pid = std::process::id();
    // Recorded only once its death will be: a kill that took the observer first took this
    // process too, before it counted as started.
    if !fork_observer(fd, &ident, "g") {
        return ExitCode::FAILURE;
    }
    install_handlers(fd, &ident, "g");
    record(fd, &format!("gstart {ident} {} {pid} {mode}", mono_ns()));
    let run = move || {
        std::thread::sleep(Duration::from_millis(sleep_ms));
        record(fd, &format!("gend {ident} {} {pid} 0", mono_ns()));
    };
    if mode != "leaderless" {
        run();
        return ExitCode::SUCCESS;
    }
    std::thread::spawn(move || {
        run();
        std::process::exit(0)
    });
    // The exit system call ends the calling thread only (exit_group ends the process).
    // SAFETY: this thread holds no lock and owns nothing another thread needs.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    unreachable!("the exit system call returned")
}
