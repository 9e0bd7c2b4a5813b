//! What a Redis URL that cannot be used is called, in one line: a port out of range or not a
//! number, a URL that does not parse; never with its password. (A scheme no backend takes is
//! refused at the door, which names every form.)

use crate::endpoints::printable;

pub(super) fn port_out_of_range(url: &str) -> String {
    crate::text::message!("{} has a port out of range: use 1 to 65535", printable(url))
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
            printable(url)
        );
    }
    port_out_of_range(url)
}

pub(super) fn bad_url(url: &str) -> String {
    crate::text::message!(
        "{} is not a supported Redis URL: use redis://[user[:password]@]host[:port][/db], \
         rediss:// (TLS) or redis+unix:///path/to/socket",
        printable(url)
    )
}
