//! Where passwords come from, and where they are said to come from: the URL, a file an option
//! names, or the environment; the sentinels' own credentials. Every backend reads its passwords
//! through here, and every line that speaks of a password names its source, never the password.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where a password came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordFrom {
    /// The URL's user part (from `--url` or `LOCKED_RUN_URL`).
    Url,
    /// The first line of a file an option names (`--password-file`, `--sentinel-password-file`).
    File { option: &'static str, path: PathBuf },
    /// An environment variable (`REDISCLI_AUTH`, `LOCKED_RUN_SENTINEL_AUTH`).
    Env(&'static str),
}

impl fmt::Display for PasswordFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PasswordFrom::Url => f.write_str("the URL"),
            PasswordFrom::File { option, path } => write!(f, "{option} {}", path.display()),
            PasswordFrom::Env(variable) => f.write_str(variable),
        }
    }
}

/// The sentinels' own credentials (`LOCKED_RUN_SENTINEL_AUTH`, `--sentinel-password-file`):
/// `password` or `user:password`. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelAuth {
    pub user: Option<String>,
    pub password: String,
    /// Where it came from, for the line that says it was refused.
    pub from: PasswordFrom,
}

impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl SentinelAuth {
    /// `password`, or `user:password` (split at the first `:`, so a password holding a `:`
    /// is given as `default:pass:word`). `None` when empty.
    pub fn parse(text: &str) -> Option<SentinelAuth> {
        let text = text.trim_end_matches(['\r', '\n']);
        match text.split_once(':') {
            Some((user, password)) if !password.is_empty() => Some(SentinelAuth {
                user: Some(user.to_owned()).filter(|u| !u.is_empty()),
                password: password.to_owned(),
                from: PasswordFrom::Env("LOCKED_RUN_SENTINEL_AUTH"),
            }),
            Some(_) => None,
            None if text.is_empty() => None,
            None => Some(SentinelAuth {
                user: None,
                password: text.to_owned(),
                from: PasswordFrom::Env("LOCKED_RUN_SENTINEL_AUTH"),
            }),
        }
    }

    /// The same credentials, said to come from `from` (a file rather than the environment).
    pub fn from(self, from: PasswordFrom) -> SentinelAuth {
        SentinelAuth { from, ..self }
    }
}

/// Why a secret's file gave no secret.
#[derive(Debug)]
pub enum NoSecret {
    Unreadable(std::io::Error),
    Empty,
}

/// The first line of a secret's file (`--password-file FILE`). The caller says which option
/// named it, in words an operator can search for; never a line of it.
pub fn first_line(path: &Path) -> Result<String, NoSecret> {
    let text = std::fs::read_to_string(path).map_err(NoSecret::Unreadable)?;
    match text.lines().next().unwrap_or("") {
        "" => Err(NoSecret::Empty),
        line => Ok(line.to_owned()),
    }
}

/// A password an environment variable holds (`REDISCLI_AUTH`, as `redis-cli` takes it), if it
/// is set and not empty.
pub fn from_env(variable: &'static str) -> Option<(String, PasswordFrom)> {
    std::env::var(variable)
        .ok()
        .filter(|p| !p.is_empty())
        .map(|p| (p, PasswordFrom::Env(variable)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_credentials_are_a_password_or_a_user_and_a_password() {
        let auth = SentinelAuth::parse("watcher:s3cret\n").unwrap();
        assert_eq!(auth.user.as_deref(), Some("watcher"));
        assert_eq!(auth.password, "s3cret");
        assert!(!format!("{auth:?}").contains("s3cret"));
        let auth = SentinelAuth::parse("s3cret").unwrap();
        assert_eq!((auth.user, auth.password.as_str()), (None, "s3cret"));
        let auth = SentinelAuth::parse("default:pa:ss").unwrap();
        assert_eq!(auth.password, "pa:ss");
        assert!(SentinelAuth::parse("").is_none());
        assert!(SentinelAuth::parse("watcher:").is_none());
    }

    #[test]
    fn a_secrets_file_gives_its_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "hunter2\nsecond line\n").unwrap();
        assert_eq!(first_line(&path).unwrap(), "hunter2");
        std::fs::write(&path, "").unwrap();
        assert!(matches!(first_line(&path), Err(NoSecret::Empty)));
        let from = PasswordFrom::File {
            option: "--password-file",
            path: path.clone(),
        };
        assert_eq!(
            from.to_string(),
            format!("--password-file {}", path.display())
        );
    }
}
