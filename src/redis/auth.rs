//! A Redis server's refusal of a password, as the messages speak of it: the line said when a
//! server refuses one, or wants one that was not given, naming where the password came from.
//! An operator who gave a password must learn which one was refused and by whom, not be told
//! to give one; the password itself is never printed.

use std::fmt;
use std::io;

use crate::endpoints::PasswordFrom;

/// The credentials a connection authenticates with, and where the password came from.
#[derive(Clone, Copy, Debug, Default)]
pub struct Credentials<'a> {
    pub user: Option<&'a str>,
    pub password: Option<&'a str>,
    pub from: Option<&'a PasswordFrom>,
}

/// Whose password a server wants: a data node's, or a sentinel's (given apart, or shared with
/// the data nodes). It decides where the line says to put the password.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hop {
    Data,
    Sentinel,
}

/// The line for a server's refusal of the password, or of a client that gave none; `None`
/// when `reply` is another error (the caller says it in its own words). `server` names who
/// refused ("Redis at redis://h:6379", "cluster node h:7000", "sentinel h:26379").
pub fn refusal_line(
    server: &str,
    reply: &str,
    credentials: Credentials,
    hop: Hop,
) -> Option<String> {
    let code = reply.split_whitespace().next().unwrap_or_default();
    // Redis before 6 says "ERR invalid password"; an unauthenticated client that sends a long
    // command gets a protocol error that says "unauthenticated".
    let wrong = code == "WRONGPASS" || reply.starts_with("ERR invalid password");
    let none_given = code == "NOAUTH" || reply.contains("unauthenticated");
    let give = match hop {
        Hop::Data => "give it in LOCKED_RUN_URL, --password-file FILE or REDISCLI_AUTH",
        Hop::Sentinel => {
            "give the sentinels' in LOCKED_RUN_SENTINEL_AUTH or --sentinel-password-file FILE"
        }
    };
    match (credentials.password, credentials.from) {
        (Some(_), Some(from)) if wrong || none_given => {
            let user = credentials
                .user
                .map_or_else(String::new, |user| format!(" (as user {user})"));
            Some(crate::text::message!(
                "the password from {from} was refused (WRONGPASS) by {server}{user}: check it \
                 against the server's requirepass or ACL user"
            ))
        }
        (None, _) if none_given => Some(crate::text::message!(
            "no password was given, and {server} wants one (NOAUTH): {give}"
        )),
        _ => None,
    }
}

/// A refusal said by a hop before the data node (a sentinel, a cluster seed), carried to the
/// caller inside an `io::Error` of kind `PermissionDenied`: retrying will not fix it.
#[derive(Debug)]
pub struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl Refused {
    pub fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, self)
    }

    /// The line a refused-password error carries, if `error` is one.
    pub fn line(error: &io::Error) -> Option<&str> {
        error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Refused>())
            .map(|refused| refused.0.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_password_says_where_it_came_from_and_never_shows_it() {
        let from = PasswordFrom::File {
            option: "--password-file",
            path: "/run/pw".into(),
        };
        let given = Credentials {
            user: None,
            password: Some("hunter2"),
            from: Some(&from),
        };
        let line = refusal_line(
            "Redis at redis://h:6379",
            "WRONGPASS invalid username-password pair or user is disabled.",
            given,
            Hop::Data,
        )
        .unwrap();
        assert!(
            line.starts_with(
                "the password from --password-file /run/pw was refused (WRONGPASS) by Redis at"
            ),
            "{line}"
        );
        assert!(!line.contains("hunter2"));
        let none = refusal_line(
            "sentinel h:26379",
            "NOAUTH Authentication required.",
            Credentials::default(),
            Hop::Sentinel,
        )
        .unwrap();
        assert!(
            none.starts_with("no password was given, and sentinel h:26379 wants one (NOAUTH)"),
            "{none}"
        );
        assert_eq!(
            refusal_line("x", "OOM no memory", given, Hop::Data),
            None,
            "other errors are the caller's to say"
        );
    }
}
