//! The signals `locked-run` handles: forwarded to the child's group while it runs, ending the
//! wait before it starts, and SIGCHLD for reaping what the child leaves behind.
//!
//! Handlers are installed before the first lock attempt and before the spawn, so no signal
//! falls between the two. A signal that was ignored when `locked-run` started (`nohup`, a
//! shell's background job) is left ignored, and the child inherits that. Handlers (unlike
//! ignored dispositions) are reset to the default by `exec`, so the child starts clean.

use std::io;

use futures_util::StreamExt;
use nix::sys::signal::Signal;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::low_level::siginfo::Cause;
use signal_hook_tokio::SignalsInfo;

/// Forwarded to the child's process group.
pub const FORWARDED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
];

/// End a wait for the lock (status 128 + N, nothing run, nothing held).
pub const ENDS_WAIT: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// One signal received by `locked-run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    pub signal: Signal,
    /// Sent by the kernel rather than by a process: a terminal's Ctrl-C, Ctrl-\ or hang-up,
    /// which already reached every process of the foreground group.
    pub from_kernel: bool,
}

/// The handled signals, as one async stream (one self-pipe for all of them).
pub struct Signals {
    handled: SignalsInfo<WithOrigin>,
}

/// What woke the supervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Signal(Incoming),
    /// SIGCHLD: a child changed state (the command, or an orphan inherited as subreaper).
    ChildChanged,
}

impl Signals {
    pub fn install() -> io::Result<Signals> {
        let wanted: Vec<i32> = FORWARDED
            .iter()
            .filter(|&&s| !ignored_at_start(s))
            .map(|&s| s as i32)
            .chain([libc::SIGCHLD])
            .collect();
        Ok(Signals {
            handled: SignalsInfo::<WithOrigin>::new(wanted)?,
        })
    }

    /// The next forwarded-kind signal, or a child's change of state.
    pub async fn next_event(&mut self) -> Event {
        loop {
            let Some(origin) = self.handled.next().await else {
                return std::future::pending().await;
            };
            if origin.signal == libc::SIGCHLD {
                return Event::ChildChanged;
            }
            if let Ok(signal) = Signal::try_from(origin.signal) {
                return Event::Signal(Incoming {
                    signal,
                    from_kernel: matches!(origin.cause, Cause::Kernel),
                });
            }
        }
    }

    /// The next signal that ends a wait; others (USR1, USR2) are noted and ignored.
    pub async fn next_ending_wait(&mut self) -> Signal {
        loop {
            if let Event::Signal(incoming) = self.next_event().await {
                if ENDS_WAIT.contains(&incoming.signal) {
                    return incoming.signal;
                }
                tracing::info!("ignoring {} while waiting for the lock", incoming.signal);
            }
        }
    }
}

/// Whether `signal` was set to SIG_IGN by whoever started us.
fn ignored_at_start(signal: Signal) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: a null new action only reads the current one into `old`.
    let rc = unsafe { libc::sigaction(signal as i32, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: sigaction filled `old` when it returned 0.
    rc == 0 && unsafe { old.assume_init() }.sa_sigaction == libc::SIG_IGN
}
