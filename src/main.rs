//! The `locked-run` binary: parse, run, turn the outcome into an exit status.
//!
//! Its own C `main` rather than Rust's start of a program, which reads `/proc/self/maps` (to
//! place the main thread's stack guard) and sets up a signal stack, some 0.1 ms of the 2 ms an
//! uncontended run takes. What that start does that matters here is done below: SIGPIPE
//! ignored (a write to a closed pipe fails with EPIPE instead of killing the run), descriptors
//! 0 to 2 open (on /dev/null when closed, so that no file this run opens takes their place and
//! gets what is meant for stdout or stderr), the arguments (taken from `main`'s own, which
//! every C library passes), stdout flushed at the end. A stack overflow ends the process by
//! SIGSEGV, without Rust's line about it. The unit-test build keeps the test harness's `main`.
#![cfg_attr(not(test), no_main)]

use std::ffi::{CStr, OsString};
use std::os::unix::ffi::OsStrExt;

use clap::Parser;
use locked_run::internals::{Cli, one_line, shared_options_after_subcommand};

#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: sets a disposition of this process's before anything else runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    standard_descriptors_open();
    // SAFETY: the C library's `argv`: `argc` pointers to NUL-terminated strings.
    let args = unsafe { arguments(argc, argv) };
    let status = run(args);
    let _ = std::io::Write::flush(&mut std::io::stdout());
    status.into()
}

/// `argv`'s `argc` strings, as they are (no UTF-8 asked of them).
///
/// # Safety
/// `argv` holds `argc` valid pointers to NUL-terminated strings (as `main` is given them).
#[cfg_attr(test, allow(dead_code))]
unsafe fn arguments(argc: libc::c_int, argv: *const *const libc::c_char) -> Vec<OsString> {
    (0..argc.max(0) as usize)
        // SAFETY: within the `argc` pointers the caller vouches for.
        .map(|i| unsafe { CStr::from_ptr(*argv.add(i)) })
        .map(|arg| std::ffi::OsStr::from_bytes(arg.to_bytes()).to_os_string())
        .collect()
}

#[cfg_attr(test, allow(dead_code))]
fn run(args: Vec<OsString>) -> u8 {
    let args = shared_options_after_subcommand(args);
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            locked_run::internals::write_last(&format!("locked-run: {}", one_line(&e)));
            return locked_run::internals::USAGE;
        }
        Err(e) => {
            // --help, --version
            let _ = e.print();
            return 0;
        }
    };
    locked_run::internals::execute(cli).finish()
}

/// Opens /dev/null on each of descriptors 0, 1 and 2 that is closed, lowest first (as Rust's
/// start does): the lowest free descriptor is the one closed. Should neither work, the run
/// ends here: a lock file opened as descriptor 2 would take the run's error lines.
#[cfg_attr(test, allow(dead_code))]
fn standard_descriptors_open() {
    for fd in 0..=2 {
        // SAFETY: F_GETFD on a number, and open of a constant path: no memory of ours is
        // touched but the C string's.
        unsafe {
            let closed =
                libc::fcntl(fd, libc::F_GETFD) == -1 && *libc::__errno_location() == libc::EBADF;
            if closed && libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) != fd {
                libc::abort();
            }
        }
    }
}
