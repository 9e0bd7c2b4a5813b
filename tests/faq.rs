//! docs/faq.md against the code: every error line `locked-run` can print has an entry, keyed by
//! the line's fixed opening words, and every entry is still a line the code can print.
//!
//! The messages are found in the source, by the markers every error line is built with: the
//! string given to `Failure::usage/unavailable/new`, `BackendError::Transient/Refused`,
//! `tracing::error!/warn!`, `Err(...)`, `message!` (a `format!` for a message built apart
//! from its constructor), or `says!` (a line a backend's declaration says whole). A message's key is its text up to the end of its first clause (the
//! first `:`, `;`, `,`, `(` or `. ` after its first word), each `{placeholder}` written `…`:
//! `"Redis at {address} refused: {error}"` is `## Redis at … refused`. Clap's own lines are
//! listed below, as the code does not spell them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What every message is given to, up to the string it starts with.
const MARKERS: [&str; 10] = [
    "Failure::usage(",
    "Failure::unavailable(",
    "Failure::new(",
    "BackendError::Transient(",
    "BackendError::Refused(",
    "tracing::error!(",
    "tracing::warn!(",
    "Err(",
    "message!(",
    "says!(",
];

/// The lines clap prints for `locked-run` (through `cli::one_line`), as keys.
const CLAP_KEYS: [&str; 5] = [
    "invalid value … for …",
    "unexpected argument … found",
    "the argument … cannot be used with …",
    "the following required arguments were not provided",
    "a value is required for … but none was supplied",
];

#[test]
fn every_error_line_has_an_faq_entry_and_every_entry_a_line() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let messages = messages_in(&root.join("src"));
    assert!(
        messages.len() > 50,
        "the scan found only {} messages: did the markers change?",
        messages.len()
    );
    let faq = std::fs::read_to_string(root.join("docs/faq.md")).unwrap();
    let headings: Vec<&str> = faq.lines().filter_map(|l| l.strip_prefix("## ")).collect();
    let missing: Vec<String> = messages
        .iter()
        .filter(|(key, _)| !headings.contains(&key.as_str()))
        .map(|(key, at)| format!("## {key}\n(from {at})"))
        .chain(
            CLAP_KEYS
                .iter()
                .filter(|key| !headings.contains(key))
                .map(|key| format!("## {key}\n(from clap)")),
        )
        .collect();
    assert!(
        missing.is_empty(),
        "docs/faq.md has no entry for these lines (add one: cause and fix):\n\n{}",
        missing.join("\n\n")
    );
    let stale: Vec<&&str> = headings
        .iter()
        .filter(|h| !messages.contains_key(**h) && !CLAP_KEYS.contains(h))
        .collect();
    assert!(
        stale.is_empty(),
        "docs/faq.md has entries for lines the code no longer prints: {stale:?}"
    );
}

/// A heading with parts that change (`## cannot … …`) cannot be found by searching the words
/// of a line as printed (`cannot open /var/lib/...`): under each, one or more whole example
/// lines (`- ``locked-run: ...```), each a line the heading describes. See issue 39.
#[test]
fn every_heading_with_changing_parts_shows_whole_lines() {
    let faq =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/faq.md")).unwrap();
    let lines: Vec<&str> = faq.lines().collect();
    let mut wrong = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(heading) = line.strip_prefix("## ").filter(|h| h.contains('…')) else {
            continue;
        };
        let examples: Vec<&str> = lines[i + 1..]
            .iter()
            .map_while(|l| l.strip_prefix("- ``")?.strip_suffix("``"))
            .map(str::trim)
            .collect();
        if examples.is_empty() {
            wrong.push(format!("## {heading}: no example line under it"));
        }
        for example in examples {
            // A line as printed: `locked-run: ...` on stderr, or one of doctor's on stdout.
            let printed = ["locked-run: ", "OK ", "WARN ", "FAIL "]
                .iter()
                .any(|start| example.starts_with(start));
            if !printed || !described_by(heading, example) {
                wrong.push(format!(
                    "## {heading}: the example is not such a line: {example}"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/faq.md (an example is `- ``locked-run: the whole line``` right under the \
         heading, or `- ``WARN  the whole doctor line```):\n{}",
        wrong.join("\n")
    );
}

/// Whether `line` holds a line that `heading` describes: its fixed words in order, each `…`
/// standing for at least one character.
fn described_by(heading: &str, line: &str) -> bool {
    let parts: Vec<&str> = heading.split('…').collect();
    (0..line.len())
        .filter(|&start| line.is_char_boundary(start))
        .any(|start| {
            let mut rest = &line[start..];
            let Some(after) = rest.strip_prefix(parts[0]) else {
                return false;
            };
            rest = after;
            parts[1..].iter().all(|part| {
                // `…` is at least one character, then the next fixed words.
                let Some(c) = rest.chars().next() else {
                    return false;
                };
                match rest[c.len_utf8()..].find(part) {
                    Some(at) => {
                        rest = &rest[c.len_utf8() + at + part.len()..];
                        true
                    }
                    None => false,
                }
            })
        })
}

#[test]
fn an_example_line_is_matched_by_its_heading() {
    assert!(described_by(
        "cannot … …",
        "locked-run: cannot open /x/y.lock: Permission denied"
    ));
    assert!(described_by(
        "…: an unclosed [",
        "locked-run: etcd://[::1 is not a usable etcd URL (\"[::1\": an unclosed [)"
    ));
    assert!(!described_by(
        "cannot reach Redis at …",
        "locked-run: cannot reach Redis at"
    ));
    assert!(!described_by(
        "lock … is held by …",
        "locked-run: lock x was lost"
    ));
}

#[test]
fn keys_are_the_fixed_opening_words() {
    assert_eq!(
        key("Redis at {address} refused: {error}{hint}"),
        "Redis at … refused"
    );
    assert_eq!(
        key("{shown}: command not found on PATH; nothing"),
        "…: command not found on PATH"
    );
    assert_eq!(
        key("an etcd:// URL names a whole cluster: give"),
        "an etcd:// URL names a whole cluster"
    );
    assert_eq!(key("{{braces}} stay"), "{braces} stay");
    assert_eq!(
        key("{e}"),
        "…",
        "no words: a wrapper of another message, left out"
    );
    assert_eq!(key("{error}; nothing was run"), "…", "a wrapper too");
    assert_eq!(
        key("{shown}: {why}; nothing was locked"),
        "…: …; nothing was locked"
    );
}

/// Every message in the Rust files under `dir` (test modules left out), by key, with where
/// the first one is.
fn messages_in(dir: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for path in rust_files(dir) {
        let text = std::fs::read_to_string(&path).unwrap();
        for literal in literals_after_markers(&without_test_modules(&text)) {
            let key = key(&literal);
            if key.chars().any(char::is_alphabetic) {
                found
                    .entry(key)
                    .or_insert_with(|| path.display().to_string());
            }
        }
    }
    found
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        // The fake backend is the tests' own, never built into what ships.
        if path.is_dir() && name != "tests" && name != "fake" {
            files.extend(rust_files(&path));
        } else if name.ends_with(".rs") && !name.ends_with("tests.rs") && !name.starts_with("fake")
        {
            files.push(path);
        }
    }
    files
}

/// `text` without its inline test modules (`#[cfg(test)] mod tests { ... }`): their strings
/// are a test's, not lines `locked-run` prints.
fn without_test_modules(text: &str) -> String {
    let mut code = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]\nmod ") {
        code.push_str(&rest[..at]);
        let module = &rest[at..];
        let header_end = module.find([';', '{']).unwrap_or(module.len());
        if module[header_end..].starts_with(';') {
            code.push_str(&module[..=header_end]);
            rest = &module[header_end + 1..];
            continue;
        }
        let mut depth = 0;
        let mut end = module.len();
        for (i, c) in module[header_end..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => continue,
            }
            if depth == 0 {
                end = header_end + i + 1;
                break;
            }
        }
        rest = &module[end..];
    }
    code.push_str(rest);
    code
}

/// The string each marker's call starts with (through a `format!(`), decoded.
fn literals_after_markers(code: &str) -> Vec<String> {
    let mut literals = Vec::new();
    for marker in MARKERS {
        for (at, _) in code.match_indices(marker) {
            let mut rest = &code[at + marker.len()..];
            if marker == "Failure::new(" {
                // The status comes first.
                rest = rest.split_once(',').map_or("", |(_, r)| r);
            }
            let rest = rest.trim_start();
            let rest = rest.strip_prefix("format!(").unwrap_or(rest).trim_start();
            if let Some(literal) = rest.strip_prefix('"') {
                literals.push(decode(literal));
            }
        }
    }
    literals
}

/// A Rust string literal's text up to its closing quote, a `\` at a line's end joining the
/// next line without its indentation.
fn decode(literal: &str) -> String {
    let mut text = String::new();
    let mut chars = literal.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' => break,
            '\\' => match chars.next() {
                Some('\n') => while chars.next_if(|c| c.is_whitespace()).is_some() {},
                Some('n') => text.push('\n'),
                Some('t') => text.push('\t'),
                Some(other) => text.push(other),
                None => break,
            },
            c => text.push(c),
        }
    }
    text
}

/// The fixed opening words of a message's text: up to the end of its first clause (a `:` that
/// begins no `://`, `;`, `,`, `(`, or `. `) after its first word, placeholders as `…`.
fn key(text: &str) -> String {
    let mut words = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                words.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                words.push('}');
            }
            '{' => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                words.push('…');
            }
            // A message that opens with another message (`{error}; nothing was run`) wraps
            // it: its opening words are the other's.
            ';' if words.trim() == "…" => return "…".to_owned(),
            ':' | ';' | ',' | '(' | '.' if words.chars().any(char::is_alphabetic) => {
                let ends = match c {
                    ':' => chars.peek() != Some(&'/'),
                    '.' => chars.peek().is_none_or(|n| *n == ' '),
                    _ => true,
                };
                if ends {
                    break;
                }
                words.push(c);
            }
            c => words.push(c),
        }
    }
    words.trim().to_owned()
}
