//! `postgres://` and `postgresql://` URLs as libpq reads them: `[user[:password]@][host][:port]
//! [,host[:port]...][/dbname][?param=value&...]`, with the parameters that matter to a lock
//! (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, `connect_timeout`, `application_name`,
//! `target_session_attrs`, and `host`, `port`, `user`, `password`, `dbname` given as
//! parameters). A parameter libpq knows but a lock has no use for is refused by name rather
//! than silently ignored; so is one libpq does not know.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::percent_decode_str;

/// PostgreSQL's port.
pub const DEFAULT_PORT: u16 = 5432;

/// Where libpq (Debian's) looks for the server's socket when a URL names no host.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// libpq's `sslmode`, the values a lock accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    /// libpq's default: TLS when the server offers it, unverified.
    Prefer,
    /// TLS, unverified (verified as `VerifyCa` when a CA is given, as libpq does).
    Require,
    /// TLS, the server's certificate chain verified, not its name.
    VerifyCa,
    /// TLS, the chain and the host name verified.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn word(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A server to try: a host name or address and port, or a socket directory of this host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    Tcp(String, u16),
    /// The directory holding `.s.PGSQL.PORT`.
    Unix(PathBuf, u16),
}

impl Host {
    /// The name `~/.pgpass` lines match (`localhost` for a socket, as libpq does).
    pub fn pgpass_name(&self) -> &str {
        match self {
            Host::Tcp(host, _) => host,
            Host::Unix(..) => "localhost",
        }
    }

    pub fn port(&self) -> u16 {
        match self {
            Host::Tcp(_, port) | Host::Unix(_, port) => *port,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Tcp(host, port) if host.contains(':') => write!(f, "[{host}]:{port}"),
            Host::Tcp(host, port) => write!(f, "{host}:{port}"),
            Host::Unix(dir, port) => write!(f, "{}/.s.PGSQL.{port}", dir.display()),
        }
    }
}

/// A parsed PostgreSQL URL. Never printed with its password.
#[derive(Clone, PartialEq, Eq)]
pub struct PgUrl {
    /// As given, without its password: for messages.
    pub shown: String,
    pub hosts: Vec<Host>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub dbname: Option<String>,
    pub sslmode: Option<SslMode>,
    pub sslrootcert: Option<PathBuf>,
    pub sslcert: Option<PathBuf>,
    pub sslkey: Option<PathBuf>,
    pub connect_timeout: Option<Duration>,
    pub application_name: Option<String>,
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password, even in a debug print.
        f.write_str(&self.shown)
    }
}

fn decode(text: &str) -> String {
    percent_decode_str(text).decode_utf8_lossy().into_owned()
}

/// Parses a `postgres://` or `postgresql://` URL; the error is a usage message that never shows
/// the password.
pub fn parse(url: &str) -> Result<PgUrl, String> {
    let shown = crate::endpoints::printable(url);
    let bad = |why: String| {
        crate::text::message!(
            "{shown} is not a usable PostgreSQL URL ({why}): use \
             postgres://[user@]host[:port][,host[:port]...]/dbname[?sslmode=verify-full&...]"
        )
    };
    let rest = ["postgres://", "postgresql://"]
        .iter()
        .find_map(|scheme| {
            url.get(..scheme.len())
                .filter(|s| s.eq_ignore_ascii_case(scheme))
                .map(|_| &url[scheme.len()..])
        })
        .ok_or_else(|| bad("not a postgres:// URL".into()))?;
    // The user part ends at the last `@` before the path, as libpq reads it: a password may
    // hold a `?` its writer did not encode.
    let (auth, hosts, tail) = crate::endpoints::authority(rest);
    let (path, query) = match tail.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (tail, None),
    };
    let path = path.strip_prefix('/');
    let mut parsed = PgUrl {
        shown: shown.clone(),
        hosts: Vec::new(),
        user: None,
        password: None,
        dbname: path.filter(|p| !p.is_empty()).map(decode),
        sslmode: None,
        sslrootcert: None,
        sslcert: None,
        sslkey: None,
        connect_timeout: None,
        application_name: None,
    };
    if let Some(auth) = auth {
        let (user, password) = match auth.split_once(':') {
            Some((user, password)) => (user, Some(password)),
            None => (auth, None),
        };
        parsed.user = Some(decode(user)).filter(|u| !u.is_empty());
        parsed.password = password.map(decode).filter(|p| !p.is_empty());
    }
    let mut host_param = None;
    let mut port_param = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(value);
        match key {
            "sslmode" => {
                parsed.sslmode = Some(SslMode::parse(&value).ok_or_else(|| {
                    bad(crate::text::message!(
                        "sslmode={value}: give disable, prefer, require, verify-ca or verify-full"
                    ))
                })?)
            }
            "sslrootcert" => parsed.sslrootcert = Some(PathBuf::from(value)),
            "sslcert" => parsed.sslcert = Some(PathBuf::from(value)),
            "sslkey" => parsed.sslkey = Some(PathBuf::from(value)),
            "connect_timeout" => {
                let secs: u64 = value.parse().map_err(|_| {
                    bad(crate::text::message!(
                        "connect_timeout={value} is not a whole number of seconds"
                    ))
                })?;
                // libpq: 0 (or none) waits for ever; a lock never does, and keeps its own.
                parsed.connect_timeout = (secs > 0).then(|| Duration::from_secs(secs.max(2)));
            }
            "application_name" | "fallback_application_name" => {
                parsed.application_name = Some(value)
            }
            // A lock is only ever granted by a primary, whatever is asked here.
            "target_session_attrs" => match value.as_str() {
                "read-write" | "primary" | "any" | "prefer-standby" => {}
                other => {
                    return Err(bad(crate::text::message!(
                        "target_session_attrs={other}: a lock is granted by a primary only"
                    )));
                }
            },
            "user" => parsed.user = Some(value),
            "password" => parsed.password = Some(value).filter(|p| !p.is_empty()),
            "dbname" => parsed.dbname = Some(value),
            "host" => host_param = Some(value),
            "port" => port_param = Some(value),
            other => {
                return Err(bad(crate::text::message!(
                    "the parameter {other} is not one locked-run reads"
                )));
            }
        }
    }
    // The URL's own hosts are decoded each once its port is split off: a socket directory
    // is written percent-encoded, and its `:PORT` after it.
    parsed.hosts = match host_param {
        Some(param) => parse_hosts(&param, port_param.as_deref(), false),
        None => parse_hosts(hosts, port_param.as_deref(), true),
    }
    .map_err(bad)?;
    Ok(parsed)
}

/// `h1:p1,h2:p2` (a host may be `[v6]`, or a socket directory starting with `/`); `ports`,
/// from a `port=` parameter, gives one port for all or one per host.
fn parse_hosts(text: &str, ports: Option<&str>, encoded: bool) -> Result<Vec<Host>, String> {
    let ports: Vec<&str> = ports.map(|p| p.split(',').collect()).unwrap_or_default();
    let port_of = |i: usize, own: Option<&str>| -> Result<u16, String> {
        let given = own.or_else(|| match ports.len() {
            0 => None,
            1 => Some(ports[0]),
            _ => ports.get(i).copied(),
        });
        match given.filter(|p| !p.is_empty()) {
            None => Ok(DEFAULT_PORT),
            Some(p) => p
                .parse()
                .ok()
                .filter(|&p: &u16| p > 0)
                .ok_or_else(|| crate::text::message!("{p} is not a port")),
        }
    };
    if text.is_empty() {
        // No host: the server's socket in libpq's directory, else TCP on this host.
        let port = port_of(0, None)?;
        return Ok(vec![
            match std::path::Path::new(DEFAULT_SOCKET_DIR).is_dir() {
                true => Host::Unix(DEFAULT_SOCKET_DIR.into(), port),
                false => Host::Tcp("localhost".into(), port),
            },
        ]);
    }
    let mut hosts = Vec::new();
    for (i, part) in text.split(',').enumerate() {
        if encoded && (part.starts_with("%2F") || part.starts_with("%2f")) {
            let (dir, port) = match part.rsplit_once(':') {
                Some((dir, port)) => (dir, Some(port)),
                None => (part, None),
            };
            hosts.push(Host::Unix(PathBuf::from(decode(dir)), port_of(i, port)?));
            continue;
        }
        if part.starts_with('/') {
            hosts.push(Host::Unix(PathBuf::from(part), port_of(i, None)?));
            continue;
        }
        let (host, port) = if let Some(v6) = part.strip_prefix('[') {
            let (host, tail) = v6
                .split_once(']')
                .ok_or_else(|| format!("{part}: an IPv6 address without its closing ]"))?;
            (host, tail.strip_prefix(':'))
        } else {
            match part.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (part, None),
            }
        };
        if host.is_empty() {
            return Err(crate::text::message!("an empty host in {text}"));
        }
        let host = match encoded {
            true => decode(host),
            false => host.to_owned(),
        };
        hosts.push(Host::Tcp(host, port_of(i, port)?));
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpq_url_forms() {
        let u = parse("postgres://app:s3cret@db1:5433,db2,[::1]:6000/locks?sslmode=verify-full&application_name=cron").unwrap();
        assert_eq!(
            u.hosts,
            [
                Host::Tcp("db1".into(), 5433),
                Host::Tcp("db2".into(), 5432),
                Host::Tcp("::1".into(), 6000)
            ]
        );
        assert_eq!(u.user.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("s3cret"));
        assert_eq!(u.dbname.as_deref(), Some("locks"));
        assert_eq!(u.sslmode, Some(SslMode::VerifyFull));
        assert_eq!(u.application_name.as_deref(), Some("cron"));
        assert!(!format!("{u:?}").contains("s3cret"));
        let u = parse("postgresql://app@/locks?host=/run/pg&port=5444").unwrap();
        assert_eq!(u.hosts, [Host::Unix("/run/pg".into(), 5444)]);
        let u = parse("postgres://a%40b:p%2Fw@h/d%20b").unwrap();
        assert_eq!(u.user.as_deref(), Some("a@b"));
        assert_eq!(u.password.as_deref(), Some("p/w"));
        assert_eq!(u.dbname.as_deref(), Some("d b"));
        let u = parse("postgresql://postgres@%2Frun%2Fpg:5444/db").unwrap();
        assert_eq!(u.hosts, [Host::Unix("/run/pg".into(), 5444)]);
        let u = parse("postgres://h?connect_timeout=1").unwrap();
        assert_eq!(u.connect_timeout, Some(Duration::from_secs(2)));
        // A `?` in a password, not encoded: libpq reads it as the password's, and so do we.
        let u = parse("postgres://pw:pa?ss@h/postgres?sslmode=disable").unwrap();
        assert_eq!(u.user.as_deref(), Some("pw"));
        assert_eq!(u.password.as_deref(), Some("pa?ss"));
        assert_eq!(u.hosts, [Host::Tcp("h".into(), 5432)]);
        assert_eq!(u.sslmode, Some(SslMode::Disable));
    }

    #[test]
    fn what_a_lock_cannot_use_is_refused_by_name() {
        for (url, why) in [
            ("postgres://h/db?sslmode=allow", "sslmode=allow"),
            ("postgres://h/db?gssencmode=prefer", "gssencmode"),
            ("postgres://h:99999/db", "99999 is not a port"),
            (
                "postgres://u:pw@h/db?target_session_attrs=standby",
                "standby",
            ),
            ("postgres://[::1/db", "closing ]"),
            // A refused parameter's line shows none of the secrets beside it.
            (
                "postgres://u:pw@h/db?Password=pw&sslmode=require",
                "the parameter Password",
            ),
            ("postgres://u:p?w@h/db?x=1", "the parameter x"),
        ] {
            let e = parse(url).unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
            assert!(!e.contains("pw") && !e.contains("p?w"), "{e}");
        }
    }
}
