//! Lock names: what every backend accepts as a NAME. The keys and file names derived from a
//! NAME live with their backend (`redis::keys`, `file::files`).
//!
//! A NAME becomes part of keys (`lock:{NAME}`) whose braces are a Redis Cluster hash tag, so a
//! NAME with a brace would silently move the keys to another slot; whitespace and control
//! characters would make logs and `redis-cli` sessions ambiguous. Such names are refused, never
//! rewritten.

use std::fmt;

/// The longest NAME accepted, in bytes.
pub const MAX_LEN: usize = 200;

/// Subcommand names: a lock with one of these names is run as `locked-run run NAME -- ...`.
pub const RESERVED: &[&str] = &["run", "status", "release", "doctor", "history", "help"];

/// A validated lock name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockName(String);

impl LockName {
    pub fn new(name: &str) -> Result<Self, String> {
        if name.is_empty() {
            return Err("the lock NAME is empty".into());
        }
        if name.len() > MAX_LEN {
            return Err(format!(
                "the lock NAME is {} bytes long; at most {MAX_LEN} are allowed",
                name.len()
            ));
        }
        if let Some(c) = name
            .chars()
            .find(|&c| c == '{' || c == '}' || c.is_whitespace() || c.is_control())
        {
            let what = match c {
                '{' | '}' => "a brace (braces are the Redis Cluster hash tag of the keys)",
                c if c.is_control() => "a control character",
                _ => "whitespace",
            };
            return Err(format!(
                "the lock NAME {name:?} contains {what}; use letters, digits and punctuation such as . - _ : /"
            ));
        }
        Ok(LockName(name.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LockName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for ok in [
            "nightly-backup",
            "db.migrate",
            "a",
            "team/job:1",
            "ünïcode",
            &"x".repeat(200),
        ] {
            assert!(LockName::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_what_would_change_the_key() {
        for bad in [
            "",
            "a{b",
            "a}b",
            "{x}",
            "a b",
            "tab\there",
            "nl\n",
            "bell\x07",
            "nbsp\u{a0}x",
        ] {
            let err = LockName::new(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad:?}");
        }
        assert!(
            LockName::new(&"x".repeat(201))
                .unwrap_err()
                .contains("201 bytes")
        );
    }
}
