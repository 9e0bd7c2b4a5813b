//! The values options take: durations (a unit required) and signals (only those that end a
//! process).

use std::time::Duration;

use nix::sys::signal::Signal;

/// A humantime duration; a bare number is refused with a hint, never guessed. The options
/// that take one accept a leading `-`, so that `-w -1s` is refused here, in words, rather than
/// by clap's tip to write `-- -1s`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.starts_with('-') {
        return Err("a duration is never negative: write e.g. 500ms, 30s, 2m or 1h".into());
    }
    if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "{t:?} has no unit: write {t}s for seconds or {t}ms for milliseconds"
        ));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("{t:?} is not a duration ({e}); write e.g. 500ms, 30s, 2m or 1h"))
}

/// [`parse_duration`], longer than zero: a time limit that has always run out.
pub fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    parse_duration(s).and_then(|d| match d.is_zero() {
        true => Err("must be longer than 0s".into()),
        false => Ok(d),
    })
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
