//! Redis URLs: what each scheme names (one server, the sentinels of a primary, the seeds of a
//! Cluster), parsed once and every part checked before anything connects; every message shows
//! the URL as `endpoints::printable` does, without its password.
//!
//! - `redis://[user[:password]@]host[:port][/db]`, `rediss://...` (TLS);
//! - `redis+unix:///path[?db=N&user=U&pass=P]`;
//! - `redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER[/DB]`: the primary
//!   is asked of the sentinels (port 26379 by default) at every new connection, so after a
//!   failover the next attempt reaches the new primary;
//! - `redis+cluster://[user[:password]@]host[:port][,host[:port]...]`: seed nodes of a Redis
//!   Cluster, asked which node owns the lock's hash slot;
//! - `rediss+sentinel://...` and `rediss+cluster://...`: the same over TLS at every hop (the
//!   sentinels and the primary they name; the seeds and every node they lead to).

use std::path::PathBuf;

use percent_encoding::percent_decode_str;

use super::cluster::Cluster;
use super::resp::Addr;
use super::sentinel::Sentinel;
use crate::endpoints::{TlsOptions, printable};
use refusals::{bad_port, bad_url, port_out_of_range};

/// What a URL names: where the server is found, as whom, in which database.
pub struct Target {
    /// The URL without its password, for messages.
    pub address: String,
    pub user: Option<String>,
    pub password: Option<String>,
    /// The password is the URL's own (not the default one given for URLs that carry none).
    pub password_in_url: bool,
    pub db: i64,
    pub topology: Topology,
}

/// How the server of a URL is found.
pub enum Topology {
    /// One server: TCP (with TLS for `rediss://`) or a Unix socket.
    Direct {
        addr: Addr,
        tls: Option<tokio_rustls::TlsConnector>,
    },
    /// The primary the sentinels name, asked at every new connection.
    Sentinel(Sentinel),
    /// The Cluster node that owns the lock's slot.
    Cluster(Cluster),
}

impl Topology {
    /// `host:port` (or the socket path) this URL names directly (for a sentinel or cluster URL,
    /// its first host), to compare with what servers say of their replicas.
    pub fn endpoint(&self) -> String {
        match self {
            Topology::Direct { addr, .. } => addr.to_string(),
            Topology::Sentinel(s) => s.first_host(),
            Topology::Cluster(c) => c.first_seed(),
        }
    }

    /// Whether both name the same server (Redlock must not count one twice).
    pub fn same(&self, other: &Topology) -> bool {
        match (self, other) {
            (Topology::Direct { addr: a, .. }, Topology::Direct { addr: b, .. }) => a == b,
            (Topology::Sentinel(a), Topology::Sentinel(b)) => a == b,
            (Topology::Cluster(a), Topology::Cluster(b)) => a.seeds() == b.seeds(),
            _ => false,
        }
    }
}

/// Parses and checks `url`. A password missing from the URL is `default_password`
/// (`--password-file`, `REDISCLI_AUTH`); `tls` is the TLS set-up for `rediss://` (built once
/// for all URLs; without one, the system's CAs). Errors never show the password.
pub fn parse(
    url: &str,
    default_password: Option<&str>,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Result<Target, String> {
    if multi_scheme(url).is_some() {
        return parse_multi(url, default_password, tls);
    }
    let parsed = ::url::Url::parse(url).map_err(|e| match e {
        ::url::ParseError::InvalidPort => bad_port(url),
        ::url::ParseError::EmptyHost => crate::text::message!("{} has no host", printable(url)),
        _ => bad_url(url),
    })?;
    let address = printable(url);
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let query = |names: &[&str]| {
        parsed
            .query_pairs()
            .find(|(k, _)| names.contains(&k.as_ref()))
            .map(|(_, v)| v.into_owned())
    };
    let secure = parsed.scheme() == "rediss";
    let (addr, mut user, mut password, db) = match parsed.scheme() {
        "redis" | "rediss" => {
            let host = match parsed.host() {
                Some(::url::Host::Domain(d)) if !d.is_empty() => d.to_owned(),
                Some(::url::Host::Ipv4(ip)) => ip.to_string(),
                Some(::url::Host::Ipv6(ip)) => ip.to_string(),
                _ => return Err(format!("the Redis URL {address} has no host")),
            };
            if parsed.port() == Some(0) {
                return Err(port_out_of_range(url));
            }
            known_parameters(&parsed, &address, &[])?;
            let db = parsed.path().trim_matches('/');
            let db = if db.is_empty() {
                None
            } else {
                Some(db.to_owned())
            };
            let user = Some(decode(parsed.username())).filter(|u| !u.is_empty());
            let tcp = Addr::Tcp {
                host,
                port: parsed.port().unwrap_or(6379),
            };
            (tcp, user, parsed.password().map(decode), db)
        }
        "redis+unix" => {
            if parsed.path().is_empty() || parsed.path() == "/" {
                return Err(format!("the Redis URL {address} has no socket path"));
            }
            known_parameters(&parsed, &address, &["db", "user", "pass", "password"])?;
            let path = PathBuf::from(decode(parsed.path()));
            (
                Addr::Unix(path),
                query(&["user"]),
                query(&["pass", "password"]),
                query(&["db"]),
            )
        }
        _ => return Err(bad_url(url)),
    };
    let db = match db {
        None => 0,
        Some(db) => database(&db).ok_or_else(|| {
            crate::text::message!(
                "the Redis URL {address} names database {db:?}: a database is a number, 0 or more"
            )
        })?,
    };
    let password_in_url = password.is_some();
    if password.is_none() {
        password = default_password.map(str::to_owned);
    }
    if password.is_none() {
        user = None; // AUTH needs a password; a bare user name means the default user
    }
    let tls = tls_for(secure, tls)?;
    Ok(Target {
        address,
        user,
        password,
        password_in_url,
        db,
        topology: Topology::Direct { addr, tls },
    })
}

/// The TLS set-up of a secure URL: the one given, else the system's CAs.
fn tls_for(
    secure: bool,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Result<Option<tokio_rustls::TlsConnector>, String> {
    match (secure, tls) {
        (false, _) => Ok(None),
        (true, Some(tls)) => Ok(Some(tls.clone())),
        (true, None) => Ok(Some(crate::endpoints::connector(&TlsOptions::default())?)),
    }
}

/// The schemes of URLs that name several hosts, and what they are.
const MULTI_SCHEMES: [(&str, Multi); 4] = [
    (
        "redis+sentinel://",
        Multi {
            cluster: false,
            secure: false,
        },
    ),
    (
        "rediss+sentinel://",
        Multi {
            cluster: false,
            secure: true,
        },
    ),
    (
        "redis+cluster://",
        Multi {
            cluster: true,
            secure: false,
        },
    ),
    (
        "rediss+cluster://",
        Multi {
            cluster: true,
            secure: true,
        },
    ),
];

/// A sentinel or cluster scheme: which, and whether over TLS.
#[derive(Clone, Copy)]
struct Multi {
    cluster: bool,
    secure: bool,
}

fn multi_scheme(url: &str) -> Option<Multi> {
    MULTI_SCHEMES
        .iter()
        .find(|(scheme, _)| url.starts_with(scheme))
        .map(|(_, multi)| *multi)
}

/// A URL that names several hosts: sentinels, or the seeds of a Cluster.
fn parse_multi(
    url: &str,
    default_password: Option<&str>,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Result<Target, String> {
    let Multi {
        cluster: is_cluster,
        secure,
    } = multi_scheme(url).expect("a sentinel or cluster URL");
    let s = if secure { "s" } else { "" };
    let usage = || {
        if is_cluster {
            crate::text::message!(
                "{} is not a cluster URL: use redis{s}+cluster://[user[:password]@]host[:port][,host[:port]...]",
                printable(url)
            )
        } else {
            crate::text::message!(
                "{} is not a sentinel URL: use redis{s}+sentinel://[user[:password]@]host[:port][,host[:port]...]/MASTER[/DB]",
                printable(url)
            )
        }
    };
    let rest = url.split_once("://").map_or("", |(_, rest)| rest);
    let (auth, hosts_part, path) = split_multi(rest);
    if path.unwrap_or(hosts_part).contains(['?', '#']) {
        return Err(format!(
            "{}: sentinel and cluster URLs take no ?parameters",
            printable(url)
        ));
    }
    let path = if is_cluster {
        if path.is_some_and(|p| !p.is_empty()) {
            return Err(format!(
                "{}: a Redis Cluster has only database 0",
                printable(url)
            ));
        }
        "cluster"
    } else {
        path.ok_or_else(usage)?
    };
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let (mut user, mut password) = match auth.map(|a| a.split_once(':').unwrap_or((a, ""))) {
        Some((u, p)) => (
            Some(decode(u)).filter(|u| !u.is_empty()),
            Some(decode(p)).filter(|p| !p.is_empty()),
        ),
        None => (None, None),
    };
    let mut hosts = Vec::new();
    for host in hosts_part.split(',') {
        if host.is_empty() {
            return Err(format!("{}: an empty host in the list", printable(url)));
        }
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port))
                if !name.ends_with(':') && (!name.starts_with('[') || name.ends_with(']')) =>
            {
                let number = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
                match port.parse::<u16>() {
                    Ok(port) if port > 0 => (name, port),
                    _ if number => {
                        return Err(format!(
                            "{}: port {port} is out of range: use 1 to 65535",
                            printable(url)
                        ));
                    }
                    _ if !port.is_empty() && !port.contains(']') => {
                        return Err(format!(
                            "{}: port {port:?} is not a number: write the port in digits, 1 to \
                             65535",
                            printable(url)
                        ));
                    }
                    _ => return Err(usage()),
                }
            }
            _ => (host, if is_cluster { 6379 } else { 26379 }),
        };
        if name.is_empty() || name == "[]" {
            return Err(format!("{}: an empty host in the list", printable(url)));
        }
        hosts.push((
            name.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port,
        ));
    }
    let mut segments = path.split('/');
    let master = segments
        .next()
        .filter(|m| !m.is_empty())
        .ok_or_else(usage)?
        .to_owned();
    let db = match segments.next() {
        None | Some("") => 0,
        Some(db) => database(db).ok_or_else(|| {
            crate::text::message!(
                "{} names database {db:?}: a database is a number, 0 or more",
                printable(url)
            )
        })?,
    };
    if segments.next().is_some() {
        return Err(usage());
    }
    if hosts.is_empty() {
        return Err(usage());
    }
    let password_in_url = password.is_some();
    if password.is_none() {
        password = default_password.map(str::to_owned);
    }
    if password.is_none() {
        user = None;
    }
    let tls = tls_for(secure, tls)?;
    let topology = if is_cluster {
        Topology::Cluster(Cluster::new(hosts).with_tls(tls))
    } else {
        Topology::Sentinel(Sentinel::new(hosts, master).with_tls(tls))
    };
    Ok(Target {
        address: printable(url),
        user,
        password,
        password_in_url,
        db,
        topology,
    })
}

/// A database number as a URL gives it: decimal digits, no sign.
fn database(text: &str) -> Option<i64> {
    (!text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse::<u32>().ok().map(i64::from))
        .flatten()
}

/// Refuses query parameters other than `known`: a misspelt `?db=` must not silently mean
/// database 0.
fn known_parameters(parsed: &::url::Url, address: &str, known: &[&str]) -> Result<(), String> {
    match parsed
        .query_pairs()
        .find(|(k, _)| !known.contains(&k.as_ref()))
    {
        None => Ok(()),
        Some((k, _)) if known.is_empty() => Err(format!(
            "the Redis URL {address} has a parameter ?{k}=, and redis:// takes none \
             (the database goes in the path: redis://host:port/DB)"
        )),
        Some((k, _)) => Err(format!(
            "the Redis URL {address} has an unknown parameter ?{k}= (known: {})",
            known.join(", ")
        )),
    }
}

/// Splits what follows `scheme://` in a sentinel or cluster URL into the user part, the hosts
/// and the path. The user part ends at the last `@`: a password may hold a `/` (a URL should
/// percent-encode it, but secrets get pasted as they are), and it must never be taken for the
/// start of the path, and printed. The hosts end at the first `/` after it.
fn split_multi(rest: &str) -> (Option<&str>, &str, Option<&str>) {
    let (auth, after) = match rest.rsplit_once('@') {
        Some((auth, after)) => (Some(auth), after),
        None => (None, rest),
    };
    match after.split_once('/') {
        Some((hosts, path)) => (auth, hosts, Some(path)),
        None => (auth, after, None),
    }
}

mod refusals;
#[cfg(test)]
mod tests;
