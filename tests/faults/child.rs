//! The recording child: the command every run executes (the test binary re-executed with
//! `--fault-child`). It appends `start`, `end` and on a signal `term` records (NAME, fence,
//! CLOCK_MONOTONIC ns, pid, run id) to the history with one O_APPEND write() each, sleeps its
//! drawn duration, makes a fenced write to SQLite, and may run a nested `locked-run` first, and
//! start a process of a shape of its own beside itself (`shapes.rs`). An observer it forks
//! records `dead` when it is gone, even by SIGKILL.
//!
//! argv: `--fault-child HISTORY DB RUN NAME SLEEP_MS [--shape SHAPE MS] [--nest INNER_RUN
//! INNER_NAME INNER_SLEEP_MS LOCKED_RUN_BIN INNER_ARGS...]`; the inner run is `LOCKED_RUN_BIN INNER_ARGS... -- <this child
//! for INNER_RUN>`, in this child's environment: whatever the outer run put there is inherited,
//! which is what the nested mix tests (an inner run takes its own lock on its own terms).

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, ExitCode, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// CLOCK_MONOTONIC in ns: the one clock of the whole history (harness, children, observers).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the SIGTERM/SIGINT/SIGHUP handler needs, made before it is installed: the history's
/// descriptor and the record around the instant and the signal number.
struct OnSignal {
    fd: i32,
    head: Vec<u8>,
    pid: Vec<u8>,
}

static ON_SIGNAL: OnceLock<OnSignal> = OnceLock::new();

/// Appends decimal `n` to `buf` at `at`, without allocating (the signal handler uses it).
fn put_decimal(buf: &mut [u8], at: &mut usize, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in (0..len).rev() {
        buf[*at] = digits[i];
        *at += 1;
    }
}

fn put_bytes(buf: &mut [u8], at: &mut usize, bytes: &[u8]) {
    buf[*at..*at + bytes.len()].copy_from_slice(bytes);
    *at += bytes.len();
}

/// Writes `term RUN NAME FENCE T PID SIGNO` and exits 128 + SIGNO. Only async-signal-safe
/// calls: clock_gettime, write, _exit; no allocation.
extern "C" fn on_signal(signo: libc::c_int) {
    if let Some(s) = ON_SIGNAL.get() {
        let mut buf = [0u8; 512];
        let mut at = 0;
        put_bytes(&mut buf, &mut at, &s.head);
        put_decimal(&mut buf, &mut at, mono_ns());
        put_bytes(&mut buf, &mut at, &s.pid);
        put_decimal(&mut buf, &mut at, signo as u64);
        put_bytes(&mut buf, &mut at, b"\n");
        // SAFETY: write(2) of our own buffer to a descriptor that stays open.
        unsafe { libc::write(s.fd, buf.as_ptr().cast(), at) };
    }
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(128 + signo) };
}

/// One record, in one write(2) (O_APPEND makes it land whole, after every other).
pub fn record(fd: i32, line: &str) {
    let line = format!("{line}\n");
    // SAFETY: write(2) of a buffer we own.
    let n = unsafe { libc::write(fd, line.as_ptr().cast(), line.len()) };
    assert_eq!(n as usize, line.len(), "a history record written whole");
}

/// Forks the observer: in a session of its own (the job's kills do not reach it), it blocks on
/// a pipe whose only write end this process holds (close-on-exec, so sqlite3 and an inner run
/// never hold it), and records `{prefix}dead` on end of file: this process is gone, however.
/// False when the observer died before it was out of the job's session (a kill came first):
/// then nothing will record this process's death.
pub fn fork_observer(fd: i32, ident: &str, prefix: &str) -> bool {
    let (mut ends, mut ready) = ([0i32; 2], [0i32; 2]);
    // SAFETY: pipe2 fills two descriptors.
    let made = unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(made, 0);
    // SAFETY: as above.
    let made = unsafe { libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(made, 0);
    let dead_head = format!("{prefix}dead {ident} ");
    let child = std::process::id();
    // Signals are blocked across the fork, so a group signal cannot reach the observer before
    // it has left the group.
    // SAFETY: plain signal-mask and fork calls; this process has one thread here.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, &mut old);
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            libc::setsid();
            libc::close(ends[1]);
            // Out of the job's group now: the command may go on (a group kill before this
            // point would have taken the observer along, and the death gone unrecorded).
            libc::write(ready[1], b"r".as_ptr().cast(), 1);
            libc::close(ready[1]);
            libc::close(ready[0]);
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
            for std_fd in 0..3 {
                libc::dup2(null, std_fd);
            }
            let mut byte = 0u8;
            loop {
                let n = libc::read(ends[0], (&mut byte as *mut u8).cast(), 1);
                if n < 0 && *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                break;
            }
            record(fd, &format!("{dead_head}{} {child} -", mono_ns()));
            libc::_exit(0);
        }
        libc::close(ends[0]);
        libc::close(ready[1]);
        let mut byte = 0u8;
        let mut n = libc::read(ready[0], (&mut byte as *mut u8).cast(), 1);
        while n < 0 && *libc::__errno_location() == libc::EINTR {
            n = libc::read(ready[0], (&mut byte as *mut u8).cast(), 1);
        }
        libc::close(ready[0]);
        libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        n == 1
    }
}

/// Records `{prefix}term` and exits on SIGTERM, SIGINT and SIGHUP.
pub fn install_handlers(fd: i32, ident: &str, prefix: &str) {
    let _ = ON_SIGNAL.set(OnSignal {
        fd,
        head: format!("{prefix}term {ident} ").into_bytes(),
        pid: format!(" {} ", std::process::id()).into_bytes(),
    });
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a handler that only makes async-signal-safe calls.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// The fenced write: the row of NAME takes our fence only if its fence is lower, and how many
/// rows that changed is recorded in the same transaction (0: a stale holder wrote).
fn fenced_write(db: &str, run: u64, name: &str, fence: u64) -> i32 {
    let script = format!(
        ".timeout 5000\nPRAGMA synchronous=OFF;\nBEGIN IMMEDIATE;\n\
         UPDATE fenced SET fence={fence}, writer={run} WHERE name='{name}' AND fence < {fence};\n\
         INSERT INTO writes(run, name, fence, changed)\n\
         VALUES ({run}, '{name}', {fence}, changes());\n\
         COMMIT;\n"
    );
    let Ok(mut sqlite) = Command::new("sqlite3")
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
    else {
        return -1;
    };
    let _ = sqlite.stdin.take().unwrap().write_all(script.as_bytes());
    match sqlite.wait() {
        Ok(status) => status.code().unwrap_or(-1),
        Err(_) => -1,
    }
}

/// The history, opened for appending whole records.
pub fn open_history(history: &str) -> i32 {
    let path = CString::new(std::path::Path::new(history).as_os_str().as_bytes()).unwrap();
    // SAFETY: open(2) with a valid path; the descriptor is ours until exit.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_WRONLY | libc::O_APPEND | libc::O_CLOEXEC,
        )
    };
    assert!(fd >= 0, "open the history {history}");
    fd
}

/// The status of a finished process as the history says it: its code, or minus the signal.
pub fn status_number(status: std::process::ExitStatus) -> i64 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as i64,
        (None, Some(sig)) => -(sig as i64),
        _ => -1000,
    }
}

/// The child's main: see the file's header for argv.
pub fn main(args: &[String]) -> ExitCode {
    let (history, db, run, name) = (
        &args[0],
        &args[1],
        args[2].parse::<u64>().unwrap(),
        &args[3],
    );
    let sleep_ms: u64 = args[4].parse().unwrap();
    let fence: u64 = std::env::var("LOCKED_RUN_FENCE")
        .ok()
        .and_then(|f| f.parse().ok())
        .unwrap_or(0);
    // `--holders` as the command saw it, and `s` after it when it runs `--shared`.
    let mut holders = std::env::var("LOCKED_RUN_HOLDERS").unwrap_or_else(|_| "-".into());
    if std::env::var("LOCKED_RUN_SHARED").as_deref() == Ok("1") {
        holders.push('s');
    }
    let fd = open_history(history);
    let ident = format!("{run} {name} {fence}");
    let pid = std::process::id();
    fork_observer(fd, &ident, "");
    install_handlers(fd, &ident, "");
    record(fd, &format!("start {ident} {} {pid} {holders}", mono_ns()));
    let mut rest = &args[5..];
    if rest.first().map(String::as_str) == Some("--shape") {
        crate::shapes::start(&rest[1], &rest[2], history, &ident);
        rest = &rest[3..];
    }
    if rest.first().map(String::as_str) == Some("--nest") {
        let (inner_run, inner_name, inner_sleep) = (&rest[1], &rest[2], &rest[3]);
        let mut inner = Command::new(&rest[4]);
        inner
            .args(&rest[5..])
            .arg("--")
            .arg(std::env::current_exe().unwrap())
            .args([
                "--fault-child",
                history,
                db,
                inner_run,
                inner_name,
                inner_sleep,
            ])
            .stdin(Stdio::null());
        let status = match inner.spawn() {
            Ok(mut child) => {
                record(
                    fd,
                    &format!("inner-spawn {ident} {} {pid} {}", mono_ns(), child.id()),
                );
                child.wait().map(status_number).unwrap_or(-1000)
            }
            Err(_) => -1001,
        };
        record(
            fd,
            &format!("inner-exit {ident} {} {pid} {status}", mono_ns()),
        );
    }
    std::thread::sleep(Duration::from_millis(sleep_ms));
    let wrote = fenced_write(db, run, name, fence);
    record(fd, &format!("wrote {ident} {} {pid} {wrote}", mono_ns()));
    record(fd, &format!("end {ident} {} {pid} 0", mono_ns()));
    ExitCode::SUCCESS
}
