//! The watcher's waits, made by the system calls themselves rather than through libc's
//! wrappers. The watcher is a clone that shares the wrapper's memory without being one of its
//! threads (no thread-local state, no lock of libc's of its own), and a preloaded library may
//! stand in for `poll` and `nanosleep` (libfaketime does, to scale sleeps): one that
//! allocates or takes a lock there can corrupt the wrapper's heap or deadlock it.

/// Waits until `fd` is readable, or `timeout_ms` passes (negative: no timeout); as `poll` on
/// one descriptor: above 0 when readable, 0 on the timeout, below 0 on an error.
pub fn wait_readable(fd: i32, timeout_ms: i32) -> i64 {
    let mut one = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let timeout = libc::timespec {
        tv_sec: libc::time_t::from(timeout_ms.max(0) / 1000),
        tv_nsec: libc::c_long::from(timeout_ms.max(0) % 1000) * 1_000_000,
    };
    let timeout_ptr: *const libc::timespec = match timeout_ms < 0 {
        true => std::ptr::null(),
        false => &timeout,
    };
    // SAFETY: one pollfd and a timespec of this frame (or none); no signal mask is changed.
    unsafe {
        libc::syscall(
            libc::SYS_ppoll,
            &mut one as *mut libc::pollfd,
            1 as libc::nfds_t,
            timeout_ptr,
            std::ptr::null::<libc::sigset_t>(),
            0usize,
        )
    }
}

/// Sleeps `ms` milliseconds (less than a second) on the monotonic clock.
pub fn nap_ms(ms: u32) {
    let nap = libc::timespec {
        tv_sec: 0,
        tv_nsec: libc::c_long::from(ms.min(999)) * 1_000_000,
    };
    // SAFETY: a timespec of this frame; no remainder is asked for.
    unsafe {
        libc::syscall(
            libc::SYS_clock_nanosleep,
            libc::CLOCK_MONOTONIC,
            0,
            &nap as *const libc::timespec,
            std::ptr::null_mut::<libc::timespec>(),
        );
    }
}
