//! How a run ends, as a pure function of what happened: the stop under way (if any), the
//! command's status, and whether the lock was still ours at the release. It decides the exit
//! and words the one line a stop owes the user, without naming a backend.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::lease::Why;
use crate::name::LockName;
use crate::plumbing::exit::{Exit, Failure};
use crate::text::show;

use super::stop::{Cause, Stopping};

/// What the ending's words need besides the outcome.
pub struct Context<'a> {
    pub name: &'a LockName,
    pub kill_signal: Signal,
    pub max_run: Option<Duration>,
    /// The last renewal error, when the lease could not be renewed.
    pub last_error: Option<&'a str>,
}

/// The exit of a run whose command ended with `status`.
pub fn ending(
    stopping: Option<Stopping>,
    status: ExitStatus,
    still_ours: Option<bool>,
    cx: &Context<'_>,
) -> Result<Exit, Failure> {
    let name = cx.name;
    let ended = ended(&status);
    match stopping.map(|s| (s.cause, s.first_signal)) {
        Some((Cause::MaxRun, _)) => Err(Failure::new(
            Exit::TimedOut,
            format!(
                "the command ran longer than --max-run {}; stopped it with {} (it {ended}){}",
                cx.max_run.map(show).unwrap_or_default(),
                cx.kill_signal,
                match still_ours {
                    Some(true) => format!("; lock {name} is released"),
                    _ => String::new(),
                }
            ),
        )),
        Some((Cause::Lost(why), first)) => {
            let cause = match why {
                Why::Expiring => format!(
                    "the lease could not be renewed ({})",
                    cx.last_error.unwrap_or("no answer")
                ),
                Why::NotOwner => {
                    "the server says it is no longer ours (expired, deleted or taken over)".into()
                }
                Why::Late => "locked-run was paused or suspended past the end of its lease".into(),
            };
            Err(Failure::new(
                Exit::Lost,
                format!(
                    "lost the lock {name} while the command ran: {cause}; stopped it with \
                     {first} (it {ended}); its work may be incomplete"
                ),
            ))
        }
        None => {
            if still_ours == Some(false) {
                tracing::warn!(
                    "lock {name} was no longer ours when the command ended (deleted or taken \
                     over by another program?)"
                );
            }
            Ok(match status.signal() {
                Some(sig) => Exit::ChildSignal(sig),
                None => Exit::Child(status.code().unwrap_or(1) as u8),
            })
        }
    }
}

/// "exited with status 3", "was ended by SIGTERM".
pub fn ended(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!(
            "was ended by {}",
            Signal::try_from(sig).map_or_else(|_| format!("signal {sig}"), |s| s.to_string())
        ),
        _ => "ended".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx(name: &LockName) -> Context<'_> {
        Context {
            name,
            kill_signal: Signal::SIGTERM,
            max_run: Some(Duration::from_secs(5)),
            last_error: Some("no answer within 2.5s"),
        }
    }

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn killed(sig: Signal) -> ExitStatus {
        ExitStatus::from_raw(sig as i32)
    }

    #[test]
    fn a_command_that_ran_to_its_end_gives_its_own_status() {
        let name = LockName::new("job").unwrap();
        assert_eq!(
            ending(None, exited(3), Some(true), &cx(&name)),
            Ok(Exit::Child(3))
        );
        assert_eq!(
            ending(None, killed(Signal::SIGINT), Some(true), &cx(&name)),
            Ok(Exit::ChildSignal(libc::SIGINT))
        );
    }

    #[test]
    fn whichever_stop_began_first_explains_the_ending() {
        let name = LockName::new("job").unwrap();
        let max_run = Stopping {
            cause: Cause::MaxRun,
            first_signal: Signal::SIGTERM,
        };
        let failure = ending(Some(max_run), killed(Signal::SIGTERM), None, &cx(&name)).unwrap_err();
        assert_eq!(failure.exit, Exit::TimedOut);
        assert!(
            failure.message.contains("--max-run 5s"),
            "{}",
            failure.message
        );
        assert!(
            !failure.message.contains("released"),
            "a release that failed is not said to have happened: {}",
            failure.message
        );
        let released = ending(Some(max_run), exited(0), Some(true), &cx(&name)).unwrap_err();
        assert!(released.message.ends_with("; lock job is released"));

        let lost = Stopping {
            cause: Cause::Lost(Why::Expiring),
            first_signal: Signal::SIGTERM,
        };
        let failure = ending(Some(lost), exited(0), Some(false), &cx(&name)).unwrap_err();
        assert_eq!(
            failure.exit,
            Exit::Lost,
            "76 whatever the command then returned"
        );
        assert_eq!(
            failure.message,
            "lost the lock job while the command ran: the lease could not be renewed (no answer \
             within 2.5s); stopped it with SIGTERM (it exited with status 0); its work may be \
             incomplete"
        );
    }

    #[test]
    fn a_late_wake_up_says_the_wrapper_was_paused() {
        let name = LockName::new("job").unwrap();
        let late = Stopping {
            cause: Cause::Lost(Why::Late),
            first_signal: Signal::SIGKILL,
        };
        let failure = ending(Some(late), killed(Signal::SIGKILL), None, &cx(&name)).unwrap_err();
        assert!(
            failure.message.contains("paused or suspended"),
            "{}",
            failure.message
        );
        assert!(
            failure
                .message
                .contains("stopped it with SIGKILL (it was ended by SIGKILL)")
        );
    }
}
