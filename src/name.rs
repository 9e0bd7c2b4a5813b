//! Lock names, and the Redis keys and host-local file names derived from them.
//!
//! A NAME becomes part of keys (`lock:{NAME}`) whose braces are a Redis Cluster hash tag, so a
//! NAME with a brace would silently move the keys to another slot; whitespace and control
//! characters would make logs and `redis-cli` sessions ambiguous. Such names are refused, never
//! rewritten.

use std::fmt;

/// The longest NAME accepted, in bytes.
pub const MAX_LEN: usize = 200;

/// Subcommand names: a lock with one of these names is run as `locked-run run NAME -- ...`.
pub const RESERVED: &[&str] = &["run", "status", "release", "doctor", "help"];

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

    /// The key that holds the owner's value (the seed's layout, kept for interoperability).
    pub fn lock_key(&self) -> String {
        format!("lock:{{{}}}", self.0)
    }

    /// The fencing counter.
    pub fn fence_key(&self) -> String {
        format!("fence:{{{}}}", self.0)
    }

    /// The holder's metadata (host, pid, command, since, fence), with the lock's expiry.
    pub fn holder_key(&self) -> String {
        format!("holder:{{{}}}", self.0)
    }

    /// The holders of a semaphore (`--holders N`): a sorted set of tokens, by lease end.
    pub fn holders_key(&self) -> String {
        format!("holders:{{{}}}", self.0)
    }

    /// The semaphore's N and each holder's metadata.
    pub fn holders_meta_key(&self) -> String {
        format!("holders-meta:{{{}}}", self.0)
    }

    /// Fair waiting's queue: waiters' tokens, by arrival.
    pub fn queue_key(&self) -> String {
        format!("queue:{{{}}}", self.0)
    }

    /// The same tokens, by the end of each one's keep-alive.
    pub fn queue_alive_key(&self) -> String {
        format!("queue-alive:{{{}}}", self.0)
    }

    /// Tokens given back, buried for a while so that a late attempt of theirs is refused.
    pub fn gone_key(&self) -> String {
        format!("gone:{{{}}}", self.0)
    }

    /// The channel a release is published on, in the same hash slot as the keys.
    pub fn channel(&self) -> String {
        format!("released:{{{}}}", self.0)
    }

    /// The stem of the host-local backend's files (`STEM.lock`, `STEM.fence`): no NAME reaches
    /// outside the directory or shares a file with another NAME. `%`, `/` and a leading `.`
    /// are percent-encoded (so `..` and hidden files are impossible, and the temporary
    /// `.STEM.fence.tmp` never collides with a stem); a stem that would be longer than
    /// [`MAX_STEM`] bytes keeps its first part and ends in `%~` and a SHA-256 of the whole NAME
    /// (`%~` never comes out of the encoding, so a shortened stem cannot equal a plain one).
    pub fn file_stem(&self) -> String {
        let mut stem = String::with_capacity(self.0.len());
        for (i, c) in self.0.char_indices() {
            match c {
                '%' => stem.push_str("%25"),
                '/' => stem.push_str("%2F"),
                '.' if i == 0 => stem.push_str("%2E"),
                c => stem.push(c),
            }
        }
        if stem.len() <= MAX_STEM {
            return stem;
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, self.0.as_bytes());
        let hex: String = digest.as_ref()[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut cut = MAX_STEM - 2 - hex.len();
        // Not inside a character, nor inside a %XX triplet.
        while !stem.is_char_boundary(cut) || stem[..cut].ends_with('%') || {
            let before = &stem.as_bytes()[..cut];
            before.len() >= 2 && before[before.len() - 2] == b'%'
        } {
            cut -= 1;
        }
        format!("{}%~{hex}", &stem[..cut])
    }
}

/// The longest file stem of the host-local backend, in bytes: with `.` and `.fence.tmp` it
/// stays well under the 255 bytes a file name may have.
pub const MAX_STEM: usize = 200;

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

    #[test]
    fn keys_share_one_hash_tag() {
        let n = LockName::new("job").unwrap();
        assert_eq!(n.lock_key(), "lock:{job}");
        assert_eq!(n.fence_key(), "fence:{job}");
        assert_eq!(n.holder_key(), "holder:{job}");
        assert_eq!(n.channel(), "released:{job}");
    }

    #[test]
    fn file_stems_stay_inside_the_directory_and_apart() {
        let stem = |n: &str| LockName::new(n).unwrap().file_stem();
        assert_eq!(stem("db.migrate-v2"), "db.migrate-v2");
        assert_eq!(stem("team/job"), "team%2Fjob");
        assert_eq!(stem(".."), "%2E.");
        assert_eq!(stem(".hidden"), "%2Ehidden");
        assert_eq!(stem("a.b"), "a.b");
        assert_eq!(stem("100%"), "100%25");
        // The encoding is injective: the encoded form of one name is another name.
        assert_ne!(stem("team%2Fjob"), stem("team/job"));
        assert_ne!(stem("%2E."), stem(".."));
        assert_eq!(stem(&"x".repeat(200)), "x".repeat(200));

        let long = "/".repeat(200);
        let short = stem(&long);
        assert!(short.len() <= MAX_STEM, "{}", short.len());
        assert!(short.contains("%~"), "{short}");
        assert!(!short.contains('/'));
        let mut other = "/".repeat(199);
        other.push('a');
        assert_ne!(
            stem(&other),
            short,
            "names with one prefix get different hashes"
        );
        let odd = format!("x{}", "/".repeat(199));
        let s = stem(&odd);
        assert!(s.len() <= MAX_STEM);
        let (head, _) = s.split_once("%~").unwrap();
        assert!(head.ends_with("%2F"), "cut on a triplet's boundary: {head}");
        let wide = "é/".repeat(66);
        assert!(stem(&wide).len() <= MAX_STEM);
    }
}
