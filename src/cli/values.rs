//! The values options take: durations (a unit required), signals (only those that end a
//! process), `LOCKED_RUN_URL`'s list of URLs, and words quoted for a shell.

use std::time::Duration;

use nix::sys::signal::Signal;

/// `word` as one word of a shell command line: as it is when it holds nothing a shell reads
/// specially, else in single quotes.
pub(super) fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_@%+=:,./-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Splits `LOCKED_RUN_URL`: whitespace separates, and so does a comma directly followed by
/// `scheme://` (a comma elsewhere may belong to a password or a path). A piece that starts
/// with no scheme means the split went wrong (a password holding a space): an error that
/// shows no piece, since any of them may hold part of a password.
pub fn split_urls_checked(value: &str) -> Result<Vec<String>, String> {
    let urls = split_urls(value);
    if urls.iter().any(|u| !starts_with_scheme(u)) {
        return Err(
            "LOCKED_RUN_URL holds a piece that is not a URL (not shown: it may be part of a \
             password); URLs are separated by whitespace, so a space in a password is written \
             %20"
            .into(),
        );
    }
    Ok(urls)
}

/// [`split_urls_checked`] without the check.
pub fn split_urls(value: &str) -> Vec<String> {
    let mut urls = Vec::new();
    for word in value.split_whitespace() {
        let mut start = 0;
        for (i, _) in word.match_indices(',') {
            if starts_with_scheme(&word[i + 1..]) {
                urls.push(&word[start..i]);
                start = i + 1;
            }
        }
        urls.push(&word[start..]);
    }
    urls.into_iter()
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

fn starts_with_scheme(s: &str) -> bool {
    let Some((scheme, _)) = s.split_once("://") else {
        return false;
    };
    let mut chars = scheme.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

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
