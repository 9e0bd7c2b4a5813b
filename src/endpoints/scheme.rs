//! URLs as the door takes them: the scheme a backend declares for its URLs, one URL classified
//! by it ([`Endpoint`]), and the URL as it may be printed, without its password, wherever it is
//! written (the user part, a `pass`/`password` parameter): [`printable`], the one function
//! every message shows a URL through. Each backend parses its own URLs in full; which backend
//! and scheme a URL names is told once, at the door, from the registry's declarations.

/// A URL scheme, as the backend whose URLs start with it declares it.
#[derive(Debug, PartialEq, Eq)]
pub struct Scheme {
    /// As written before `://`, in lower case (a URL's scheme is compared without case).
    pub name: &'static str,
    /// The form the line that refuses an unknown scheme shows it in; empty for another name
    /// of a scheme shown already (`postgresql`).
    pub form: &'static str,
    /// It speaks TLS: the `--tls-*` files apply to it.
    pub tls: bool,
    /// Its URLs name sentinels, which may have a password of their own
    /// (`--sentinel-password-file`, `LOCKED_RUN_SENTINEL_AUTH`).
    pub sentinels: bool,
    /// Its URLs name a path on this host, with an empty host (`redis+unix:///path`).
    pub path: bool,
    /// It may be written without `//` (`file:/DIR`, as `file:///DIR`).
    pub bare: bool,
}

impl Scheme {
    /// A scheme with no property but its name and form.
    pub const fn plain(name: &'static str, form: &'static str) -> Scheme {
        Scheme {
            name,
            form,
            tls: false,
            sentinels: false,
            path: false,
            bare: false,
        }
    }

    /// Whether `url` is written with this scheme (`scheme://`, or `scheme:` for a bare one).
    pub fn starts(&self, url: &str) -> bool {
        let Some(rest) = url
            .get(..self.name.len())
            .filter(|s| s.eq_ignore_ascii_case(self.name))
            .map(|_| &url[self.name.len()..])
        else {
            return false;
        };
        rest.starts_with("://") || (self.bare && rest.starts_with(':'))
    }
}

/// One URL, classified at the door: the scheme it is written with, as its backend declares it.
/// Only its backend parses the URL, once; a message shows it through [`printable`].
pub struct Endpoint {
    url: String,
    scheme: &'static Scheme,
}

impl Endpoint {
    pub fn new(url: String, scheme: &'static Scheme) -> Endpoint {
        Endpoint { url, scheme }
    }

    /// The URL as given, for its backend to parse (never to print as it is).
    pub fn url(&self) -> &str {
        &self.url
    }

    pub fn scheme(&self) -> &'static Scheme {
        self.scheme
    }
}

/// Shows the URL without its password, even in a debug print.
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&printable(&self.url))
    }
}

/// The line for a URL whose scheme is one of ours but whose `//` is missing or short
/// (`redis:/127.0.0.1`, `postgres:db1/locks`): read as it is, it would be a URL with no host,
/// or no URL at all, and the line would say so without saying why. `None` for any other URL,
/// and for a scheme that may be written bare (`file:/DIR`, which names the directory as
/// `file:///DIR` does). `schemes`: every scheme a backend declares.
pub fn missing_slashes<'a>(
    url: &str,
    mut schemes: impl Iterator<Item = &'a Scheme>,
) -> Option<String> {
    if url.contains("://") {
        return None;
    }
    let (scheme, rest) = url.split_once(':')?;
    let declared = schemes.find(|s| s.name.eq_ignore_ascii_case(scheme))?;
    if declared.bare {
        return None;
    }
    let slashes = &rest[..rest.len() - rest.trim_start_matches('/').len()];
    let rest = rest.trim_start_matches('/');
    // `redis:6379` is a host named redis and its port, not a URL short of its `//`.
    let first = rest.split(['/', '?']).next().unwrap_or_default();
    if slashes.is_empty() && !first.is_empty() && first.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // A socket's path keeps its own leading `/` after the empty host.
    let root = if declared.path { "/" } else { "" };
    let fixed = printable(&format!("{scheme}://{root}{rest}"));
    let written = fixed.replacen("://", &format!(":{slashes}"), 1);
    let written = written.replacen(
        &format!(":{slashes}/"),
        &format!(":{slashes}"),
        (root == "/") as usize,
    );
    Some(crate::text::message!(
        "{written} has no // after {scheme}: write {fixed}"
    ))
}

/// `url` as it may be printed: its password taken out of the user part and of the query
/// (`pass`, `password`). A URL of one host is read as a URL; one that lists several hosts
/// (sentinels, a Cluster's seeds, etcd's members, PostgreSQL's hosts) is cut by hand, its user
/// part ending at the last `@` (a password may hold a `/`, and must never be taken for the path).
pub fn printable(url: &str) -> String {
    let shown = printable_as_read(url);
    // A user part read as the path (a slash too many: `redis:///:PASSWORD@host`), where no
    // password was found to take out: what follows the authority holds an `@`.
    let beyond = shown
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('/'))
        .is_some_and(|(_, path)| path.contains('@'));
    match beyond {
        true => "(a URL with credentials, not shown)".to_owned(),
        false => shown,
    }
}

fn printable_as_read(url: &str) -> String {
    // The url crate ends the user part at a `?` or `#`: a password holding one would be
    // read as a host, a port and a query, and printed.
    let plain = url.split_once("://").is_some_and(|(_, rest)| {
        let (auth, hosts, _) = authority(rest);
        !hosts.contains(',') && !auth.is_some_and(|a| a.contains(['?', '#']))
    });
    if plain {
        if let Ok(parsed) = ::url::Url::parse(url) {
            return redact(&parsed);
        }
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        // No URL, or not one of ours: where it may hold a password, none of it is shown.
        return match url.contains('@') {
            true => "(a URL with credentials, not shown)".to_owned(),
            false => format!("{url:?}"),
        };
    };
    let (auth, hosts, tail) = authority(rest);
    let user = auth.map(|auth| auth.split_once(':').map_or(auth, |(user, _)| user));
    let tail = match tail.split_once('?') {
        Some((path, query)) => match without_passwords(query) {
            query if query.is_empty() => path.to_owned(),
            query => format!("{path}?{query}"),
        },
        None => tail.to_owned(),
    };
    match user.filter(|u| !u.is_empty()) {
        Some(user) => format!("{scheme}://{user}@{hosts}{tail}"),
        None => format!("{scheme}://{hosts}{tail}"),
    }
}

/// Whether `url` carries a password (in its user part or a `pass`/`password` parameter).
pub fn has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let (auth, _, tail) = authority(rest);
    let in_user = auth.is_some_and(|a| a.split_once(':').is_some_and(|(_, p)| !p.is_empty()));
    let in_query = tail
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|pair| secret(pair.split('=').next())));
    in_user || in_query
}

/// What follows `scheme://`, cut into the user part, the hosts, and the rest (path and query,
/// with their leading `/` or `?`). The user part ends at the last `@` before the first `/`
/// that follows an `@`: a password may hold a `/`, `?` or `#` that its writer did not encode
/// (libpq reads a `?` there as part of it too). A URL whose authority is empty
/// (`redis+unix:///run/redis.sock`) has none.
pub fn authority(rest: &str) -> (Option<&str>, &str, &str) {
    let end = match rest.find('@').filter(|_| !rest.starts_with('/')) {
        Some(first) => rest[first..].find('/').map_or(rest.len(), |i| first + i),
        None => 0,
    };
    let (auth, after) = match rest[..end].rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let hosts_end = after.find(['/', '?']).unwrap_or(after.len());
    (auth, &after[..hosts_end], &after[hosts_end..])
}

/// A query without its `pass`, `password` and `sslpassword` parameters (in any case: a
/// parameter a store refuses by name is still a secret its writer meant).
fn without_passwords(query: &str) -> String {
    query
        .split('&')
        .filter(|pair| !secret(pair.split('=').next()))
        .collect::<Vec<_>>()
        .join("&")
}

/// Whether a query parameter's name says it holds a secret.
fn secret(key: Option<&str>) -> bool {
    key.is_some_and(|key| {
        ["pass", "password", "sslpassword"]
            .iter()
            .any(|s| key.eq_ignore_ascii_case(s))
    })
}

/// A parsed URL with any password removed, so it can be printed.
fn redact(url: &::url::Url) -> String {
    let mut url = url.clone();
    if url.password().is_some() {
        let _ = url.set_password(None);
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .filter(|(k, _)| !secret(Some(k)))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if pairs.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_password_is_ever_printed() {
        for (url, shown) in [
            ("redis://:pw@h:6379/2", "redis://h:6379/2"),
            (
                "redis://u:pw@h:6379?password=pw&x=1",
                "redis://u@h:6379?x=1",
            ),
            (
                "rediss+sentinel://u:p/w@s1:26379,s2:26379/m",
                "rediss+sentinel://u@s1:26379,s2:26379/m",
            ),
            ("etcd://u:pw@h:1,g:2", "etcd://u@h:1,g:2"),
            ("etcd://u:pw@h:2379", "etcd://u@h:2379"),
            (
                "postgres://app:pw@a:5432,b:5432/db?sslmode=require&password=pw",
                "postgres://app@a:5432,b:5432/db?sslmode=require",
            ),
            ("file:///var/lib/locks", "file:///var/lib/locks"),
            // A `?` in a password its writer did not encode (libpq takes it as the password's).
            ("postgres://u:p?w@h/db", "postgres://u@h/db"),
            ("postgres://u:12?pw@h/db", "postgres://u@h/db"),
            // A secret parameter whatever its case, also one the store refuses by name.
            (
                "postgres://u@h/db?sslmode=require&Password=pw",
                "postgres://u@h/db?sslmode=require",
            ),
            (
                "redis+unix:///run/r.sock?password=pw",
                "redis+unix:///run/r.sock",
            ),
        ] {
            assert_eq!(printable(url), shown, "{url}");
            assert!(!printable(url).contains("pw"), "{url}");
        }
        // Not a URL, but it may hold a password all the same.
        assert_eq!(
            printable("app:pw@h:6379"),
            "(a URL with credentials, not shown)"
        );
        assert_eq!(printable("h:6379"), "\"h:6379\"");
        assert!(has_password("redis://:pw@h"));
        assert!(has_password("redis://h?password=pw"));
        assert!(has_password("postgres://a:pw@h1,h2/db"));
        assert!(!has_password("etcd://u@h"));
        assert!(!has_password("file:///x"));
    }
}
