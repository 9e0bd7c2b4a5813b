//! Text for people: durations as messages write them, the one printable form of text that came
//! from elsewhere (and JSON escaped the same way), the lines the subcommands print, and the
//! [`message!`] macro every message's text is built with apart from its error.

use std::io::Write as _;
use std::time::Duration;

use serde::Serialize as _;

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

/// The longest text `locked-run` prints of one thing another party wrote (a host or program
/// name, a server's error, a record): it must not flood a terminal or a journal.
const MAX_LINE: usize = 2000;

/// Whether `c` is shown escaped: the control characters (C0, DEL and C1, among them ESC and
/// CSI, which start a terminal's escape sequences, and the newline that would forge a second
/// line), the line and paragraph separators, and the bidirectional overrides and isolates that
/// make a terminal show text in another order than it is.
fn escaped(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{2028}' | '\u{2029}' | '\u{202a}'
                ..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with every character of [`escaped`] (and, with `backslash`, the backslash itself)
/// written as Rust writes it (`\n`, `\u{1b}`, `\\`), cut after `max` characters.
fn escape(text: &str, max: usize, backslash: bool) -> String {
    let mut line = String::with_capacity(text.len().min(max));
    for (count, c) in text.chars().enumerate() {
        if count == max {
            line.push_str("... (cut)");
            break;
        }
        match escaped(c) || (backslash && c == '\\') {
            true => line.extend(c.escape_default()),
            false => line.push(c),
        }
    }
    line
}

/// The printable form of text from elsewhere (a host, program or user name, a server's error
/// text, a history record, a file in a shared directory): one line, with no control
/// character, escape sequence or bidirectional override left raw, and at most [`MAX_LINE`]
/// characters. The backslash is escaped too (`\\`), so that a name holding the six characters
/// `\u{1b}` never reads as one whose ESC was escaped. Every such text `locked-run` prints goes
/// through this once, where it is put into a line, on stdout and stderr.
pub fn printable(text: &str) -> String {
    escape(text, MAX_LINE, true)
}

/// A whole line as it is printed: what it quotes from elsewhere went through [`printable`]
/// already, so its backslashes are left as they are (escaping them again would make an escaped
/// ESC read as a name's backslash); any control character still in it is escaped all the same,
/// and it is cut after [`MAX_LINE`] characters. Log lines, failure lines and the waiting line
/// go through this.
pub fn line_form(text: &str) -> String {
    escape(text, MAX_LINE, false)
}

/// `text` raw, cut as a printed line is (after [`MAX_LINE`] characters, saying so): what a JSON
/// log line carries of a message, which JSON escapes.
pub fn bounded(text: &str) -> String {
    match text.chars().nth(MAX_LINE) {
        None => text.to_owned(),
        Some(_) => format!("{}... (cut)", cut(text, MAX_LINE)),
    }
}

/// `text` cut to at most `max` characters: what a writer keeps of a field it stores (a host or
/// program name), raw, so that every store keeps the same text and only printing escapes it.
pub fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The most characters of a name (host, program) a holder's metadata keeps.
pub const MAX_NAME: usize = 255;

/// Writes `line` on stdout as one line in the printable form (what it quotes from elsewhere was
/// cut already, each part by [`printable`]; a newline in it is shown escaped, so a text of
/// several lines is several calls). A reader that went away (`| head -1`) changes nothing:
/// what could not be written is dropped, and the status stands.
pub fn say(line: std::fmt::Arguments<'_>) {
    let line = escape(&line.to_string(), usize::MAX, false);
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// `println!` for the subcommands' output: [`say`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::text::say(format_args!($($arg)*))
    };
}

pub(crate) use out;

/// `value` as one line of JSON, escaped by construction: beside what JSON itself escapes (the
/// C0 controls, `"` and `\`), every other character of [`escaped`] (DEL, the C1 controls, the
/// bidirectional overrides) is written `\uXXXX`, so that no JSON `locked-run` prints can
/// carry a terminal's escape sequence raw, whatever a store held.
pub fn json(value: &serde_json::Value) -> String {
    let mut out = Vec::new();
    let mut writer = serde_json::Serializer::with_formatter(&mut out, Escaping);
    // Writing a `Value` into memory cannot fail.
    let _ = value.serialize(&mut writer);
    String::from_utf8(out).unwrap_or_default()
}

/// serde_json's compact formatter, with [`escaped`]'s characters escaped too.
struct Escaping;

impl serde_json::ser::Formatter for Escaping {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut from = 0;
        for (at, c) in fragment.char_indices().filter(|(_, c)| escaped(*c)) {
            writer.write_all(&fragment.as_bytes()[from..at])?;
            write!(writer, "\\u{:04x}", u32::from(c))?;
            from = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[from..])
    }
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
    use super::{json, line_form, printable};

    #[test]
    fn a_message_stays_one_short_line_of_text() {
        assert_eq!(
            printable("held by web-1\nlocked-run: FAKE\u{1b}[31m"),
            "held by web-1\\nlocked-run: FAKE\\u{1b}[31m"
        );
        let long = "x".repeat(10_000);
        assert!(printable(&long).len() < 2100);
    }

    /// Issue 43: a host name set in a UTS namespace reached the terminal raw. What a terminal
    /// acts on (ESC, BEL, CSI as the C1 control U+009B, DEL) and what reorders a line (a
    /// bidirectional override) is shown escaped, in text and in JSON alike.
    #[test]
    fn what_a_terminal_would_act_on_is_escaped_in_text_and_json() {
        let host = "w\u{1b}]0;PWNED\u{7}\u{1b}[2K\r\u{9b}31m\u{7f}\u{202e}x\u{85}é";
        assert_eq!(
            printable(host),
            "w\\u{1b}]0;PWNED\\u{7}\\u{1b}[2K\\r\\u{9b}31m\\u{7f}\\u{202e}x\\u{85}é"
        );
        let line = json(&serde_json::json!({ "host": host }));
        assert_eq!(
            line,
            "{\"host\":\"w\\u001b]0;PWNED\\u0007\\u001b[2K\\r\\u009b31m\\u007f\\u202ex\\u0085é\"}"
        );
        assert!(!line.chars().any(|c| c.is_control()));
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["host"], host, "escaped, not changed");
    }

    /// Issue 43's review: a name holding the six characters `\u{1b}` read exactly as one whose
    /// ESC was escaped. The printable form escapes the backslash too; a whole line, whose
    /// fields went through it already, escapes only what is still raw.
    #[test]
    fn a_backslash_in_a_name_never_reads_as_an_escape() {
        let literal = "w\\u{1b}]0;x";
        let real = "w\u{1b}]0;x";
        assert_eq!(printable(literal), "w\\\\u{1b}]0;x");
        assert_eq!(printable(real), "w\\u{1b}]0;x");
        assert_ne!(printable(literal), printable(real));
        let line = format!("held by {}", printable(real));
        assert_eq!(line_form(&line), line, "escaped once, not twice");
        assert_eq!(line_form("a\u{1b}b"), "a\\u{1b}b");
        assert!(line_form(&"x".repeat(10_000)).len() < 2100);
    }
}
