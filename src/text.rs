//! Text for people: durations as messages write them, a line made safe to print, and the
//! [`message!`] macro every message's text is built with apart from its error.

use std::time::Duration;

/// A duration as an operator reads it: `30s`, `1.5s`, `250ms`.
pub fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if ms >= 1000 && ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 {
        format!("{:.1}s", d.as_secs_f64())
    } else if ms > 0 || d.is_zero() {
        format!("{ms}ms")
    } else {
        format!("{}us", d.as_micros())
    }
}

/// The longest text line `locked-run` writes: what a server or another program wrote into a
/// reply or a holder record (quoted in a message) must not flood a terminal or a journal.
const MAX_LINE: usize = 2000;

/// `message` as one line of text: control characters (a newline that would forge a second
/// line, a terminal's escape sequences) escaped, and cut at [`MAX_LINE`] characters.
pub fn printable(message: &str) -> String {
    let mut line = String::with_capacity(message.len().min(MAX_LINE));
    for (count, c) in message.chars().enumerate() {
        if count == MAX_LINE {
            line.push_str("... (cut)");
            break;
        }
        match c.is_control() {
            true => line.extend(c.escape_default()),
            false => line.push(c),
        }
    }
    line
}

/// `format!` for the text of an error line built apart from the `Failure` (or `BackendError`)
/// that will carry it, in a helper that returns a `String`. It exists so that such a line can
/// be found: it formats exactly as `format!` does. The FAQ test
/// (tests/faq.rs) finds every message by the constructors it is given to and by this macro,
/// and docs/faq.md must have an entry for each: a message written with a bare `format!` away
/// from its constructor would escape it.
macro_rules! message {
    ($($arg:tt)*) => {
        format!($($arg)*)
    };
}

pub(crate) use message;

#[cfg(test)]
mod printable_tests {
    use super::printable;

    #[test]
    fn a_message_stays_one_short_line_of_text() {
        assert_eq!(
            printable("held by web-1\nlocked-run: FAKE\u{1b}[31m"),
            "held by web-1\\nlocked-run: FAKE\\u{1b}[31m"
        );
        let long = "x".repeat(10_000);
        assert!(printable(&long).len() < 2100);
    }
}
