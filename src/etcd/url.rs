//! `etcd://[user[:password]@]host[:port][,host[:port]...]` (`etcds://` over TLS): the endpoints
//! of one etcd cluster, and the user whose password is never printed.

use std::fmt;

use percent_encoding::percent_decode_str;

use crate::endpoints::PasswordFrom;

/// etcd's client port.
pub const DEFAULT_PORT: u16 = 2379;

/// One member's client address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// A name or an address; an IPv6 address without its brackets.
    pub host: String,
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.host.contains(':') {
            true => write!(f, "[{}]:{}", self.host, self.port),
            false => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

/// A parsed `etcd://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUrl {
    pub tls: bool,
    pub endpoints: Vec<Endpoint>,
    pub user: Option<String>,
    pub password: Option<String>,
    /// Where the password came from, for the line that says etcd refused it.
    pub password_from: Option<PasswordFrom>,
}

impl fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password, even in a debug print.
        write!(f, "{self}")
    }
}

impl fmt::Display for EtcdUrl {
    /// The URL without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.tls { "etcds://" } else { "etcd://" })?;
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        let hosts: Vec<String> = self.endpoints.iter().map(Endpoint::to_string).collect();
        f.write_str(&hosts.join(","))
    }
}

/// Parses an `etcd://` or `etcds://` URL; the error is a usage message that never shows a
/// password.
pub fn parse(url: &str) -> Result<EtcdUrl, String> {
    let (tls, rest) = match (url.strip_prefix("etcd://"), url.strip_prefix("etcds://")) {
        (Some(rest), _) => (false, rest),
        (_, Some(rest)) => (true, rest),
        _ => return Err(format!("{} is not an etcd:// URL", printable(url))),
    };
    let bad = |why: &str| {
        crate::text::message!(
            "{} is not a usable etcd URL ({why}): use etcd://[user@]host[:port][,host[:port]...], \
             or etcds:// for TLS",
            printable(url)
        )
    };
    // The user part ends at the last `@`: a password may hold any character.
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (Some(auth), hosts),
        None => (None, rest),
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    if hosts.contains(['/', '?', '#']) {
        return Err(bad("no path or parameters after the hosts"));
    }
    let endpoints = hosts
        .split(',')
        .map(endpoint)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|why| bad(&why))?;
    let (user, password) = match auth {
        None => (None, None),
        Some(auth) => {
            let (user, password) = match auth.split_once(':') {
                Some((user, password)) => (user, Some(decode(password))),
                None => (auth, None),
            };
            if user.is_empty() {
                return Err(bad(
                    "etcd needs a user name with a password: etcd://USER@host",
                ));
            }
            (Some(decode(user)), password.filter(|p| !p.is_empty()))
        }
    };
    Ok(EtcdUrl {
        tls,
        endpoints,
        user,
        password_from: password.as_ref().map(|_| PasswordFrom::Url),
        password,
    })
}

fn endpoint(text: &str) -> Result<Endpoint, String> {
    let (host, port) = match text.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| crate::text::message!("{text:?}: an unclosed ["))?;
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(format!("{text:?}: no port after ]")),
                },
            }
        }
        None => match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        },
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(format!("{text:?}: no host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| crate::text::message!("{text:?}: a port is 1 to 65535"))?,
    };
    Ok(Endpoint {
        host: host.to_owned(),
        port,
    })
}

fn decode(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// An `etcd://` URL as it may be printed: without its password.
pub fn printable(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return format!("{url:?}");
    };
    match rest.rsplit_once('@') {
        Some((auth, hosts)) => match auth.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}@{hosts}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_user_and_password() {
        let u = parse("etcd://app:s%40cret:x@10.0.0.1,[::1]:2380,db.example:23790/").unwrap();
        assert!(!u.tls);
        assert_eq!(u.user.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("s@cret:x"));
        let shown: Vec<String> = u.endpoints.iter().map(Endpoint::to_string).collect();
        assert_eq!(shown, ["10.0.0.1:2379", "[::1]:2380", "db.example:23790"]);
        assert_eq!(
            u.to_string(),
            "etcd://app@10.0.0.1:2379,[::1]:2380,db.example:23790"
        );
        assert_eq!(
            format!("{u:?}"),
            u.to_string(),
            "no password in a debug print"
        );
        let t = parse("etcds://h").unwrap();
        assert!(t.tls && t.user.is_none() && t.endpoints[0].port == 2379);
    }

    #[test]
    fn bad_urls_are_refused_without_their_password() {
        for url in [
            "etcd://",
            "etcd://h:0",
            "etcd://h:x",
            "etcd://h/prefix",
            "etcd://:pw@h",
            "etcd://h,",
            "etcd://[::1",
        ] {
            let e = parse(url).unwrap_err();
            assert!(!e.contains("pw"), "{e}");
        }
        assert_eq!(printable("etcd://u:pw@h:1,g:2"), "etcd://u@h:1,g:2");
    }
}
