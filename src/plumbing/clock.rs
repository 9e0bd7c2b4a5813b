//! The clocks deadlines are kept on. Deadlines never come from the wall clock: they are read
//! on `CLOCK_BOOTTIME`, which keeps counting while the machine is suspended (as a server's TTL
//! does) and never moves when the wall clock is set, and slept on a timer of that clock, which
//! fires as soon as a suspended machine resumes. Every sleep of the lease clock, the waiter and
//! the supervisor goes through [`Clock`], so paused-time tests can stand in for it.

use std::future::Future;
use std::time::Duration;

use nix::sys::timerfd::TimerFd;

/// The clock the lease is measured on: readings, and sleeps until a reading.
///
/// Readings are durations since an arbitrary origin. Production reads `CLOCK_BOOTTIME`, which,
/// unlike `CLOCK_MONOTONIC`, keeps counting while the machine is suspended, as the server's TTL
/// does; neither moves when the wall clock is set.
pub trait Clock {
    fn now(&self) -> Duration;

    /// Resolves once the clock reads `deadline` (at once if it already does).
    fn sleep_until(&self, deadline: Duration) -> impl Future<Output = ()>;
}

/// `CLOCK_BOOTTIME`.
#[derive(Clone, Copy, Debug, Default)]
pub struct BootClock;

/// `CLOCK_BOOTTIME` in ns (there on every Linux since 2.6.39), by the system call itself, for
/// the clones that share our memory (the command's child before its exec, the watcher): the
/// very clock the lease clock reads. Not through libc's `clock_gettime`, which a preloaded
/// library may stand in for (libfaketime does): one that allocates, run in a clone that
/// shares our heap without being a thread of ours, corrupted it ("corrupted double-linked
/// list", an abort, in the chaos suite's clock scenario).
pub fn boot_ns() -> u64 {
    // SAFETY: the system call fills the timespec we pass, and touches nothing else.
    unsafe {
        let mut now: libc::timespec = std::mem::zeroed();
        libc::syscall(
            libc::SYS_clock_gettime,
            libc::CLOCK_BOOTTIME,
            &mut now as *mut libc::timespec,
        );
        timespec_ns(&now)
    }
}

/// `CLOCK_BOOTTIME` in ns for this process's own threads: through libc (the vDSO, no system
/// call), the same clock as [`boot_ns`].
fn boot_ns_here() -> u64 {
    // SAFETY: clock_gettime fills the timespec we pass.
    unsafe {
        let mut now: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now);
        timespec_ns(&now)
    }
}

fn timespec_ns(t: &libc::timespec) -> u64 {
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// A [`boot_ns`] reading from a `CLOCK_BOOTTIME` instant, for the clones above (0: none; a
/// given instant is never 0).
pub fn boot_ns_at(at: Option<Duration>) -> u64 {
    at.map_or(0, |d| d.as_nanos().clamp(1, u64::MAX.into()) as u64)
}

impl Clock for BootClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(boot_ns_here())
    }

    /// On a `CLOCK_BOOTTIME` timerfd: tokio's timers run on `CLOCK_MONOTONIC`, which stands
    /// still during a suspend, so a deadline that passed while the machine slept would only be
    /// seen at the next monotonic wake-up. This one fires as soon as the machine resumes.
    async fn sleep_until(&self, deadline: Duration) {
        match boot_timer(deadline) {
            Ok(timer) => {
                if let Ok(mut ready) = timer.readable().await {
                    ready.clear_ready();
                    return;
                }
            }
            Err(e) => tracing::debug!("no CLOCK_BOOTTIME timer ({e}); using a monotonic one"),
        }
        tokio::time::sleep(deadline.saturating_sub(self.now())).await;
    }
}

/// A timerfd, as tokio's `AsyncFd` wants it (`AsRawFd`).
struct BootTimer(TimerFd);

impl std::os::fd::AsRawFd for BootTimer {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsFd;
        self.0.as_fd().as_raw_fd()
    }
}

fn boot_timer(deadline: Duration) -> std::io::Result<tokio::io::unix::AsyncFd<BootTimer>> {
    use nix::sys::time::TimeSpec;
    use nix::sys::timerfd::{ClockId, Expiration, TimerFlags, TimerSetTimeFlags};
    let timer = TimerFd::new(
        ClockId::CLOCK_BOOTTIME,
        TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
    )?;
    // An all-zero expiry would disarm the timer instead of firing it.
    let at = TimeSpec::from_duration(deadline.max(Duration::from_nanos(1)));
    timer.set(
        Expiration::OneShot(at),
        TimerSetTimeFlags::TFD_TIMER_ABSTIME,
    )?;
    // SAFETY: the AsyncFd owns the TimerFd, which keeps its one descriptor open until dropped.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(
            BootTimer(timer),
            tokio::io::Interest::READABLE,
        )
    }
    .map_err(|e| e.into_parts().1)
}
