//! The values options take: durations (a unit required) and signals (only those that end a
//! process).

use std::time::Duration;

use nix::sys::signal::Signal;

use crate::lease::{MIN_RENEW, MIN_TTL};
use crate::text::{message, show};

/// A humantime duration; a bare number is refused with a hint, never guessed. The options
/// that take one accept a leading `-`, so that `-w -1s` is refused here, in words, rather than
/// by clap's tip to write `-- -1s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    duration(s, Floor::Any)
}

/// [`parse_duration`], longer than zero: a time limit that has always run out.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    duration(s, Floor::Positive)
}

/// `--ttl`: a duration whose bare-number hint names only what a lease may be.
pub fn parse_ttl(s: &str) -> Result<Duration, String> {
    duration(s, Floor::AtLeast(MIN_TTL))
}

/// `--renew-every`: a duration whose bare-number hint names only what R may be.
pub fn parse_renew_every(s: &str) -> Result<Duration, String> {
    duration(s, Floor::AtLeast(MIN_RENEW))
}

/// The least duration an option takes, so that a hint never suggests one it refuses next.
#[derive(Clone, Copy)]
enum Floor {
    Any,
    /// Longer than zero.
    Positive,
    /// At least this (the lease's own bounds; [`crate::lease::Timings::new`] refuses less).
    AtLeast(Duration),
}

impl Floor {
    fn takes(self, d: Duration) -> bool {
        match self {
            Floor::Any => true,
            Floor::Positive => !d.is_zero(),
            Floor::AtLeast(least) => d >= least,
        }
    }
}

const EXAMPLES: &str = "e.g. 500ms, 30s, 2m or 1h";

fn duration(s: &str, floor: Floor) -> Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err(format!("a duration is never negative: write {EXAMPLES}"));
    }
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(no_unit(t, floor));
    }
    let d = humantime::parse_duration(t).map_err(|e| not_a_duration(t, e))?;
    match floor {
        Floor::Positive if d.is_zero() => Err("must be longer than 0s".into()),
        _ => Ok(d),
    }
}

/// The line for a bare number: the units that make it a duration this option takes. Where
/// neither does (`--ttl 0`), what the least is, rather than `0s`, which would only be refused
/// next.
fn no_unit(t: &str, floor: Floor) -> String {
    let as_unit = |unit: &str| {
        let text = message!("{t}{unit}");
        humantime::parse_duration(&text)
            .ok()
            .filter(|d| floor.takes(*d))
            .map(|_| text)
    };
    match (as_unit("s"), as_unit("ms")) {
        (Some(s), Some(ms)) => {
            message!("{t:?} has no unit: write {s} for seconds or {ms} for milliseconds")
        }
        (Some(s), None) => message!("{t:?} has no unit: write {s} for seconds"),
        (None, Some(ms)) => message!("{t:?} has no unit: write {ms} for milliseconds"),
        (None, None) => {
            let least = match floor {
                Floor::AtLeast(least) => format!("at least {}", show(least)),
                _ => "more than 0s".to_owned(),
            };
            message!("{t:?} has no unit, and this option takes {least}: write {EXAMPLES}")
        }
    }
}

/// The line for what humantime could not read, in words rather than the parser's ("expected
/// number at 0").
fn not_a_duration(t: &str, e: humantime::DurationError) -> String {
    use humantime::DurationError as E;
    match e {
        E::Empty => message!("an empty value is not a duration: write {EXAMPLES}"),
        E::UnknownUnit { unit, value, .. } if unit.is_empty() => message!(
            "{t:?} has a number without a unit ({value}): every number needs one, as in \
             {value}s or {value}ms"
        ),
        E::UnknownUnit { unit, .. } => {
            message!("{t:?} has a unit {unit:?} that is not one: use ms, s, m or h ({EXAMPLES})")
        }
        E::NumberOverflow => message!("{t:?} is longer than any duration can be: write {EXAMPLES}"),
        _ => message!("{t:?} is not a duration: write a number and a unit, {EXAMPLES}"),
    }
}

/// `-s/--kill-signal`'s parser: [`parse_signal`], which also takes `SIGTERM`, `15` and every
/// other signal that ends a process, with the usual names listed for shell completion (which
/// otherwise offers file names). The list is hidden from `--help`, which says what is taken.
#[derive(Clone, Copy, Debug)]
pub(super) struct SignalParser;

impl clap::builder::TypedValueParser for SignalParser {
    type Value = Signal;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Signal, clap::Error> {
        // A function's errors, as clap words them for any `value_parser = fn`.
        parse_signal.parse_ref(cmd, arg, value)
    }

    fn possible_values(
        &self,
    ) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        use clap::builder::PossibleValue;
        Some(Box::new(
            [
                PossibleValue::new("TERM").help("the default"),
                PossibleValue::new("INT").help("as Ctrl-C"),
                PossibleValue::new("HUP"),
                PossibleValue::new("QUIT"),
                PossibleValue::new("USR1"),
                PossibleValue::new("USR2"),
                PossibleValue::new("KILL").help("no grace: the command cannot clean up"),
            ]
            .into_iter(),
        ))
    }
}

/// `TERM`, `SIGTERM`, `term` or `15`; only signals whose default action ends a process.
pub fn parse_signal(s: &str) -> Result<Signal, String> {
    let signal = match s.parse::<i32>() {
        Ok(n) => Signal::try_from(n).map_err(|_| format!("{n} is not a signal number"))?,
        Err(_) => {
            let upper = s.to_ascii_uppercase();
            let full = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            full.parse::<Signal>().map_err(|_| {
                format!("unknown signal {s:?}: use a name such as TERM, INT or HUP, or a number")
            })?
        }
    };
    use Signal::*;
    if matches!(
        signal,
        SIGSTOP | SIGTSTP | SIGTTIN | SIGTTOU | SIGCONT | SIGCHLD | SIGURG | SIGWINCH
    ) {
        return Err(format!(
            "{signal} does not end a process; use TERM, INT, HUP, QUIT or KILL"
        ));
    }
    Ok(signal)
}
