//! What a Redis URL that cannot be used is called, in one line: a port out of range or not a
//! number, an unknown scheme (answered with every form `locked-run` takes, not Redis's only),
//! a URL that does not parse; never with its password.

use super::redact;

pub(super) fn port_out_of_range(url: &str) -> String {
    crate::text::message!("{} has a port out of range: use 1 to 65535", shown(url))
}

/// A port the URL parser refused: out of range, or not a number at all (`:6379x`, a typo
/// that "out of range" would misname).
pub(super) fn bad_port(url: &str) -> String {
    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let port = host_port
        .rsplit_once(':')
        .filter(|(host, _)| !host.starts_with('[') || host.ends_with(']'))
        .map_or("", |(_, port)| port);
    if !port.is_empty() && !port.bytes().all(|b| b.is_ascii_digit()) {
        return crate::text::message!(
            "{} has a port that is not a number ({port:?}): write the port in digits, 1 to 65535",
            shown(url)
        );
    }
    port_out_of_range(url)
}

/// Every URL form `locked-run` takes, for the line that refuses an unknown scheme: a typo in
/// `file://` must not be answered with Redis forms only.
pub const URL_FORMS: &str = "redis://[user@]host[:port][/db], rediss:// (TLS), \
     redis+unix:///path, redis+sentinel://host:port[,...]/MASTER, rediss+sentinel://, \
     redis+cluster://host:port[,...], rediss+cluster://, file:///DIR (this host only), \
     etcd://host:port[,...], etcds:// (TLS) or postgres://[user@]host[:port][,...]/DB";

/// The schemes of [`URL_FORMS`], as a URL starts.
const SCHEMES: [&str; 10] = [
    "redis://",
    "rediss://",
    "redis+unix://",
    "redis+sentinel://",
    "rediss+sentinel://",
    "redis+cluster://",
    "rediss+cluster://",
    "file:",
    "etcd://",
    "etcds://",
];
/// A URL that may not parse, as it may be printed: without a password.
pub(super) fn shown(url: &str) -> String {
    match ::url::Url::parse(url) {
        Ok(parsed) => redact(&parsed),
        Err(_) if url.contains('@') => "(a URL with credentials, not shown)".to_owned(),
        Err(_) => format!("{url:?}"),
    }
}

pub(super) fn bad_url(url: &str) -> String {
    if url.starts_with("file://") {
        return "file:// names the host-local backend (a directory of this host), not a Redis server"
            .into();
    }
    if !SCHEMES.iter().any(|scheme| url.starts_with(scheme)) {
        return match url.split_once("://") {
            Some((scheme, _)) => crate::text::message!(
                "unknown URL scheme {scheme:?} in {}: use {URL_FORMS}",
                shown(url)
            ),
            None => crate::text::message!(
                "{} is not a URL (no scheme://): use {URL_FORMS}",
                shown(url)
            ),
        };
    }
    crate::text::message!(
        "{} is not a supported Redis URL: use redis://[user[:password]@]host[:port][/db], \
         rediss:// (TLS) or redis+unix:///path/to/socket",
        shown(url)
    )
}
